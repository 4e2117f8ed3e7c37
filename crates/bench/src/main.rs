//! `ambit-bench`: compares ambient data planes against a no-mesh baseline on one machine.
//!
//! It builds one small network-namespace cluster per scenario (client pod on node 1,
//! server pod on node 2, see [`scenario`]), runs our own load generators and servers
//! ([`load`]) through each for bounded times, interleaving scenarios round by round
//! ([`run`]), and reports medians with ratios to the baseline as a table, JSON and an SVG
//! chart ([`report`], [`svg`]). Proxy memory and CPU come from `/proc` ([`procstat`]).
//!
//! `ambit-bench ztunnel` (hidden) runs the ambit ztunnel from this very binary, exactly as
//! `ambit ztunnel` does (same library, same environment parsing), so the default run needs
//! nothing but this binary; `--ambit-bin` measures a built `ambit` instead. See
//! BENCHMARKS.md.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use ambit_netns::testing;
use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

/// jemalloc, as upstream ztunnel: glibc's malloc trims the data path's large buffers back
/// to the kernel and faults them in again (measured in BENCHMARKS.md, "Profiles").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod idle;
mod inpod;
mod load;
mod procstat;
mod report;
mod roles;
mod run;
mod scenario;
mod svg;

use run::Plan;
use scenario::{PodSysctls, Scenario, ScenarioKind, ZtunnelCmd};

#[derive(Debug, Parser)]
#[command(
    name = "ambit-bench",
    about = "Throughput, latency, connection rate, memory and CPU of ambient data planes vs. no mesh",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    args: Args,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the ambit ztunnel (`ambit ztunnel`).
    #[command(hide = true)]
    Ztunnel,
    /// Run the ambit node agent (`ambit cni-agent --pods DIR`).
    #[command(hide = true)]
    CniAgent {
        #[arg(long)]
        pods: PathBuf,
    },
    /// Run the ambit CNI plugin (`ambit cni-plugin`).
    #[command(hide = true)]
    CniPlugin,
    /// Hold idle connections for the memory measurement.
    #[command(hide = true)]
    IdleConns {
        #[arg(long)]
        dst: std::net::SocketAddr,
        #[arg(long)]
        count: usize,
    },
}

#[derive(Debug, clap::Args)]
struct Args {
    /// A few hundred milliseconds per measurement, one round (checks the harness works).
    #[arg(long)]
    smoke: bool,
    /// Rounds per measurement (scenarios interleaved A B A B; medians reported).
    #[arg(long)]
    rounds: Option<usize>,
    /// Scenarios to run, in order: baseline, ambit (in-pod mode: node agent + one shared
    /// ztunnel per node), ambit-dedicated (one dedicated-mode ztunnel per pod), foreign and
    /// foreign-dedicated (the same with the foreign ztunnel), ambit-to-foreign and
    /// foreign-to-ambit (mixed fleets: the client's node runs the first, the server's the
    /// second); "foreign" may be written as --ztunnel-name. Default: baseline and ambit,
    /// plus foreign, ambit-to-foreign and foreign-to-ambit when there is a foreign ztunnel.
    #[arg(long, value_delimiter = ',')]
    scenarios: Vec<String>,
    /// A foreign ztunnel binary for the "foreign" scenarios (default: upstream's reference
    /// binary when it is there): started with no arguments and upstream's environment
    /// variables, LOCAL_XDS_PATH config; in-pod mode gets its pods from our node agent over
    /// ZDS.
    #[arg(long, value_name = "PATH")]
    ztunnel_bin: Option<PathBuf>,
    /// Name of the foreign scenarios in the reports; ratios are also given to the scenario
    /// of this name.
    #[arg(long, default_value = "upstream")]
    ztunnel_name: String,
    /// Do not look for upstream's reference binary (default: AMBIT_UPSTREAM_ZTUNNEL, else
    /// ../shared/reference/upstream-ztunnel/ztunnel beside the workspace).
    #[arg(long, conflicts_with = "ztunnel_bin")]
    no_upstream: bool,
    /// Run this `ambit` binary (`PATH ztunnel`, `PATH cni-agent`, `PATH cni-plugin`)
    /// instead of this binary's built-in copy of the same code.
    #[arg(long, value_name = "PATH")]
    ambit_bin: Option<PathBuf>,
    /// ZTUNNEL_WORKER_THREADS for every proxy (upstream's default is 2).
    #[arg(long, default_value_t = 2)]
    ztunnel_workers: usize,
    /// Request rates of the latency runs (comma separated).
    #[arg(long, value_delimiter = ',')]
    rates: Vec<u32>,
    /// Idle connections held open for the memory measurement (default 10,000; capped by
    /// the open-files limit).
    #[arg(long)]
    idle_conns: Option<usize>,
    /// Extra pods enrolled on the server node for the in-pod memory-per-pod measurement
    /// (default 1,000; 0 skips it).
    #[arg(long)]
    enrolled_pods: Option<usize>,
    /// Seconds the server node's agent CPU is sampled with the extra pods enrolled
    /// (default 30: three verification passes).
    #[arg(long)]
    agent_cpu_secs: Option<f64>,
    /// Seconds per throughput window.
    #[arg(long)]
    throughput_secs: Option<f64>,
    /// Seconds per latency run.
    #[arg(long)]
    latency_secs: Option<f64>,
    /// Seconds per connection-rate run (default 3; longer to profile that phase).
    #[arg(long)]
    conn_rate_secs: Option<f64>,
    /// Seconds of the sustained connection-rate run, once per scenario in a fresh copy of
    /// it (default 75: longer than TCP's 60 s TIME-WAIT, so what the closed connections
    /// hold is at its steady state; 0 skips it).
    #[arg(long)]
    sustained_secs: Option<f64>,
    /// Connections per second the sustained run's 4 client loops offer together, each
    /// with at most one connection in flight (default 0: each loop starts its next
    /// connection as soon as one ends).
    #[arg(long, default_value_t = 0)]
    sustained_rate: u32,
    /// The client's and the server's pod sysctls in every scenario. `default` is what a
    /// Kubernetes pod gets (ports 32768–60999, `tcp_tw_reuse=2`): with it the client runs
    /// out of ports after ~28,000 connections to the server within a minute, so the
    /// connection-rate rounds fail; pair it with a `--sustained-rate` below ~470/s and
    /// short other windows.
    #[arg(long, value_enum, default_value_t = PodSysctls::Tuned)]
    pod_sysctls: PodSysctls,
    /// Write the JSON report here.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Write the SVG chart here.
    #[arg(long, value_name = "PATH")]
    svg: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Every process of a run (this one and the roles it starts, which inherit it) may use
    // as many descriptors as the hard limit allows: 10,000 idle connections need ~10,000
    // in this process and in each ztunnel.
    let nofile = procstat::raise_open_files_limit();
    match cli.command {
        Some(Command::Ztunnel) => return roles::ztunnel(),
        Some(Command::CniAgent { pods }) => return roles::cni_agent(&pods),
        Some(Command::CniPlugin) => return roles::cni_plugin(),
        Some(Command::IdleConns { dst, count }) => return roles::idle_conns(dst, count),
        None => {}
    }
    if let Err(e) = &nofile {
        eprintln!("ambit-bench: cannot raise the open-files limit: {e}");
    }
    match bench(cli.args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ambit-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn plan(args: &Args) -> Result<Plan> {
    let mut plan = if args.smoke {
        Plan::smoke()
    } else {
        Plan::full()
    };
    if let Some(r) = args.rounds {
        plan.rounds = r.max(1);
    }
    if !args.rates.is_empty() {
        plan.rates = args.rates.iter().copied().filter(|r| *r > 0).collect();
    }
    if let Some(n) = args.idle_conns {
        plan.idle_conns = n.max(1);
    }
    if let Some(n) = args.enrolled_pods {
        plan.enrolled_pods = n;
    }
    let secs = |s: f64| std::time::Duration::try_from_secs_f64(s).context("bad duration");
    if let Some(s) = args.throughput_secs {
        plan.throughput = secs(s)?;
    }
    if let Some(s) = args.latency_secs {
        plan.latency = secs(s)?;
    }
    if let Some(s) = args.conn_rate_secs {
        plan.conn_rate = secs(s)?;
    }
    if let Some(s) = args.agent_cpu_secs {
        plan.agent_cpu = secs(s)?;
    }
    if let Some(s) = args.sustained_secs {
        plan.sustained = secs(s)?;
    }
    plan.sustained_rate = args.sustained_rate;
    plan.pod_sysctls = args.pod_sysctls;
    // Each idle connection costs this process one descriptor (the server side; the client
    // side is held by a child process) and each ztunnel about one.
    if let Some(limit) = procstat::open_files_soft_limit() {
        let max = usize::try_from(limit.saturating_sub(1024)).unwrap_or(usize::MAX);
        if plan.idle_conns > max {
            eprintln!(
                "ambit-bench: open-files limit {limit}: {max} idle connections instead of {}",
                plan.idle_conns
            );
            plan.idle_conns = max.max(1);
        }
    }
    Ok(plan)
}

/// The scenarios of a run: `--scenarios`, or the default (baseline and ambit, plus the
/// foreign ztunnel alone and both mixed fleets when there is one).
fn kinds(args: &Args, foreign: Option<&Path>) -> Result<Vec<ScenarioKind>> {
    let foreign_name = &args.ztunnel_name;
    let names: Vec<String> = if args.scenarios.is_empty() {
        let mut v = vec!["baseline".to_string(), "ambit".to_string()];
        if foreign.is_some() {
            v.extend(["foreign", "ambit-to-foreign", "foreign-to-ambit"].map(String::from));
        }
        v
    } else {
        args.scenarios.clone()
    };
    // Absolute: the proxies start in a per-pod or per-node working directory.
    let absolute =
        |p: &Path| std::fs::canonicalize(p).with_context(|| format!("locating {}", p.display()));
    // The program for the ambit roles (`ztunnel`, `cni-agent`, `cni-plugin` subcommands).
    let ambit = match &args.ambit_bin {
        Some(p) => absolute(p)?,
        None => std::env::current_exe().context("locating this binary")?,
    };
    let own = ZtunnelCmd {
        label: "ambit".into(),
        program: ambit.clone(),
        args: vec!["ztunnel".into()],
    };
    let foreign = || -> Result<ZtunnelCmd> {
        match foreign {
            Some(p) => Ok(ZtunnelCmd {
                label: foreign_name.clone(),
                program: absolute(p)?,
                args: Vec::new(),
            }),
            None => bail!(
                "the {foreign_name} scenarios need --ztunnel-bin PATH (or {})",
                testing::UPSTREAM_ZTUNNEL_ENV
            ),
        }
    };
    let workers = args.ztunnel_workers;
    let in_pod = |name: String, client: ZtunnelCmd, server: ZtunnelCmd| ScenarioKind::InPod {
        name,
        ztunnels: [client, server],
        ambit: ambit.clone(),
        workers,
    };
    let dedicated = |name: String, ztunnel: ZtunnelCmd| ScenarioKind::Dedicated {
        name,
        ztunnel,
        workers,
    };
    const KINDS: [&str; 7] = [
        "baseline",
        "ambit",
        "ambit-dedicated",
        "foreign",
        "foreign-dedicated",
        "ambit-to-foreign",
        "foreign-to-ambit",
    ];
    names
        .iter()
        .map(|n| {
            // The foreign ztunnel's scenarios answer to their report names too
            // ("upstream-to-ambit" as well as "foreign-to-ambit").
            let generic = KINDS
                .iter()
                .find(|k| *k == n || k.replace("foreign", foreign_name) == *n)
                .copied()
                .unwrap_or_default();
            let reported = generic.replace("foreign", foreign_name);
            Ok(match generic {
                "baseline" => ScenarioKind::Baseline,
                "ambit" => in_pod(reported, own.clone(), own.clone()),
                "ambit-dedicated" => dedicated(reported, own.clone()),
                "foreign" => in_pod(reported, foreign()?, foreign()?),
                "foreign-dedicated" => dedicated(reported, foreign()?),
                "ambit-to-foreign" => in_pod(reported, own.clone(), foreign()?),
                "foreign-to-ambit" => in_pod(reported, foreign()?, own.clone()),
                _ => bail!(
                    "unknown scenario {n:?} (baseline, ambit, ambit-dedicated, foreign, foreign-dedicated, ambit-to-foreign, foreign-to-ambit; \"foreign\" may be written {foreign_name:?})"
                ),
            })
        })
        .collect()
}

fn bench(args: Args) -> Result<()> {
    let plan = plan(&args)?;
    let foreign = match &args.ztunnel_bin {
        Some(p) => Some(p.clone()),
        None if args.no_upstream => None,
        None => testing::upstream_ztunnel().map_err(anyhow::Error::msg)?,
    };
    match &foreign {
        Some(p) => eprintln!("comparing with {} ({})", args.ztunnel_name, p.display()),
        None if args.no_upstream => {}
        None => eprintln!(
            "no upstream ztunnel at {} (set {} or --ztunnel-bin): running without it",
            testing::upstream_ztunnel_candidates()
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" or "),
            testing::UPSTREAM_ZTUNNEL_ENV
        ),
    }
    let kinds = kinds(&args, foreign.as_deref())?;
    let date = report::now_rfc3339();
    let commit = commit();
    let loadavg_start = loadavg();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench")
        .enable_all()
        .build()?;
    rt.spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("ambit-bench: interrupted, cleaning up");
            load::STOP.store(true, Ordering::Relaxed);
        }
    });
    let mut scenarios = Vec::new();
    for kind in kinds {
        eprintln!("starting scenario {}: {}", kind.name(), kind.describe());
        let name = kind.name().to_string();
        let sc = Scenario::start(kind, rt.handle(), 0, plan.pod_sysctls)
            .with_context(|| format!("starting scenario {name}"))?;
        scenarios.push(sc);
    }
    let samples = run::execute(&plan, &mut scenarios, &rt)?;
    let names: Vec<(String, String)> = scenarios
        .iter()
        .map(|s| (s.kind().name().to_string(), s.kind().describe()))
        .collect();
    // Tear down before writing reports: nothing of ours stays running.
    drop(scenarios);
    // Ratios to upstream divide by the foreign ztunnel's own in-pod scenario.
    let reference = Some(args.ztunnel_name.clone()).filter(|n| names.iter().any(|(s, _)| s == n));
    let scenarios = report::summarize(&names, &samples, reference.as_deref());
    let report = report::Report {
        tool: "ambit-bench",
        date,
        commit,
        mode: if args.smoke { "smoke" } else { "full" },
        rounds: plan.rounds,
        machine: report::Machine {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            loadavg_start,
            loadavg_end: loadavg(),
            cpuidle: idle::policy(std::path::Path::new("/")),
        },
        params: serde_json::to_value(&plan)?,
        upstream: reference.clone(),
        metrics: report::catalogue(
            &plan.rates,
            &plan.conn_concurrency,
            plan.sustained_shape(),
            plan.idle_conns,
            plan.enrolled_pods,
        ),
        aims: report::aims(&scenarios, &plan.rates, &plan.conn_concurrency),
        scenarios,
    };
    print_table(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, svg::chart(&report, &plan.rates))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

#[allow(clippy::print_stdout)]
fn print_table(report: &report::Report) {
    println!(
        "ambit-bench {} run, {}, commit {}, {} round(s), {} CPUs, load {} -> {}",
        report.mode,
        report.date,
        report.commit,
        report.rounds,
        report.machine.cpus,
        report.machine.loadavg_start,
        report.machine.loadavg_end
    );
    println!("  idle CPUs: {}", report.machine.cpuidle);
    for s in &report.scenarios {
        println!("  {}: {}", s.name, s.description);
    }
    println!(
        "medians; N/b = ratio to baseline, N/u = ratio to {}; latency: (+N us) added to the baseline's, N/u = ratio of added latencies\n",
        report.upstream.as_deref().unwrap_or("upstream (not run)")
    );
    print!("{}", report::table(report));
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The commit of the working directory (read-only git query), or "unknown".
fn commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}
