//! `ambit up`, `down`, `status` and `exec`: the embedded mesh ([`ambit_mesh`]). Flags in,
//! progress and tables out; the orchestration itself lives in the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::out::{progress, say};
use ambit_mesh::{Mesh, RunDir, UpConfig};

/// Where the run directory is unless `--run-dir` says otherwise.
const DEFAULT_RUN_DIR: &str = "/run/ambit";

#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Directory of manifests (Namespace, Pod, Service, PeerAuthentication,
    /// AuthorizationPolicy); every Pod names its node in spec.nodeName.
    dir: PathBuf,
    /// Run directory: state, sockets, generated config and logs.
    #[arg(long, env = "AMBIT_RUN_DIR", default_value = DEFAULT_RUN_DIR)]
    run_dir: PathBuf,
    /// How long each component may take to become ready.
    #[arg(long, default_value = "60", value_name = "SECONDS")]
    timeout: u64,
    /// RUST_LOG of the components.
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Capture pods' DNS into ztunnel's DNS proxy (service names resolve).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    dns_capture: bool,
    /// Run this ztunnel binary on every node instead of `ambit ztunnel` (for example
    /// upstream's, to check interop): no arguments, upstream's environment variables.
    #[arg(long, value_name = "PATH")]
    ztunnel_bin: Option<PathBuf>,
    /// Workload certificate lifetime the ztunnels ask for (their SECRET_TTL; default 24 h):
    /// a short one rehearses renewals, at half of it. At least 60 (the control plane's
    /// shortest).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(60..))]
    cert_ttl: Option<u64>,
}

#[derive(Debug, clap::Args)]
pub struct RunDirArgs {
    /// Run directory of the mesh.
    #[arg(long, env = "AMBIT_RUN_DIR", default_value = DEFAULT_RUN_DIR)]
    pub run_dir: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    run: RunDirArgs,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    output: Output,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    #[command(flatten)]
    run: RunDirArgs,
    /// Pod: NAME, or NAMESPACE/NAME.
    pod: String,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// What children (components, pod processes, exec) inherit from our environment.
fn base_env() -> Vec<(String, String)> {
    ["PATH", "HOME", "LANG", "TERM", "USER"]
        .iter()
        .filter_map(|k| Some((k.to_string(), std::env::var(k).ok()?)))
        .collect()
}

/// SIGINT/SIGTERM set the returned flag (on a small runtime thread of their own).
fn signal_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let set = flag.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            let _ = tx.send(());
            return;
        };
        rt.block_on(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut int), Ok(mut term)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) else {
                let _ = tx.send(());
                return;
            };
            let _ = tx.send(());
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            set.store(true, Ordering::SeqCst);
        });
    });
    // Handlers are installed before the first namespace is created.
    let _ = rx.recv_timeout(Duration::from_secs(5));
    flag
}

pub fn up(args: UpArgs) -> ExitCode {
    let ambit_exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("cannot find the ambit executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Absolute: components start in other working directories.
    let ztunnel_exe = match args.ztunnel_bin.as_deref().map(std::fs::canonicalize) {
        None => None,
        Some(Ok(p)) => Some(p),
        Some(Err(e)) => {
            let path = args
                .ztunnel_bin
                .as_deref()
                .unwrap_or(std::path::Path::new(""));
            eprintln!("ambit up: --ztunnel-bin {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    let cancel = signal_flag();
    let cfg = UpConfig {
        manifests: args.dir.clone(),
        run_dir: args.run_dir.clone(),
        ambit_exe,
        ztunnel_exe,
        base_env: base_env(),
        timeout: Duration::from_secs(args.timeout),
        log_level: args.log_level,
        dns_capture: args.dns_capture,
        cert_ttl: args.cert_ttl.map(Duration::from_secs),
        cancel: cancel.clone(),
    };
    let mesh = match Mesh::up(cfg, &|line| progress(&format!("· {line}"))) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("ambit up: {e}");
            return ExitCode::FAILURE;
        }
    };
    let api = match ambit_mesh::api::ApiServer::bind(mesh.run_dir()) {
        Ok(a) => Some(a),
        Err(e) => {
            progress(&format!(
                "! {e}: `ambit apply` and `ambit delete` are unavailable"
            ));
            None
        }
    };
    summary(&mesh, &args.run_dir);
    let mut mesh = mesh;
    while !cancel.load(Ordering::SeqCst) {
        if let Some(api) = &api {
            api.poll(&mut mesh);
        }
        for event in mesh.supervise() {
            let mark = match event {
                ambit_mesh::supervise::Event::Restarted { .. } => '·',
                _ => '!',
            };
            progress(&format!("{mark} {event}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(api);
    progress("· stopping: removing pods, components and namespaces");
    match mesh.shutdown() {
        Ok(()) => {
            progress("· mesh removed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ambit up: teardown: {e}");
            ExitCode::FAILURE
        }
    }
}

fn summary(mesh: &Mesh, run_dir: &std::path::Path) {
    let st = mesh.state();
    progress("");
    progress(&format!(
        "mesh {} is up: control plane at {}",
        st.prefix,
        st.control_address
            .map(|a| a.to_string())
            .unwrap_or_default()
    ));
    let mut rows = vec![[
        "NAMESPACE".to_string(),
        "POD".into(),
        "NODE".into(),
        "IP".into(),
        "MESH".into(),
    ]];
    for p in &st.pods {
        rows.push([
            p.namespace.clone(),
            p.name.clone(),
            p.node.clone(),
            p.ip.to_string(),
            if p.enrolled {
                "ambient (HBONE)".into()
            } else if p.ambient {
                "ambient (not enrolled)".into()
            } else {
                "-".into()
            },
        ]);
    }
    for v in &st.vms {
        rows.push([
            v.namespace.clone(),
            v.name.clone(),
            "(VM)".into(),
            v.ip.to_string(),
            format!("VM of WorkloadGroup {} (HBONE)", v.group),
        ]);
    }
    table(&rows, progress);
    let rd = if run_dir == std::path::Path::new(DEFAULT_RUN_DIR) {
        String::new()
    } else {
        format!(" --run-dir {}", run_dir.display())
    };
    let example = st.pods.first().map(|p| p.name.as_str()).unwrap_or("POD");
    progress("");
    let hints = [
        [
            format!("  ambit exec{rd} {example} -- CMD..."),
            "run a command in a pod".to_string(),
        ],
        [
            format!("  ambit status{rd} [-o json]"),
            "readiness, enrolment, certificates".into(),
        ],
        [
            format!("  ambit apply{rd} -f FILE"),
            "add or change pods, labels, policies".into(),
        ],
    ];
    table(&hints, progress);
    progress(&format!("  logs in {}", mesh.run_dir().logs().display()));
    progress("  Ctrl-C (or `ambit down`) removes everything.");
    progress("ready");
}

fn table<const N: usize>(rows: &[[String; N]], say: fn(&str)) {
    let mut widths = [0usize; N];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        say(line.join("  ").trim_end());
    }
}

pub fn down(args: RunDirArgs) -> ExitCode {
    let run = RunDir::new(&args.run_dir);
    match ambit_mesh::down(&run, Duration::from_secs(30)) {
        Ok(r) => {
            match r.prefix {
                Some(p) => say(&format!("mesh {p} removed")),
                None => say("no mesh recorded; generated files removed"),
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ambit down: {e}");
            ExitCode::FAILURE
        }
    }
}

pub fn status(args: StatusArgs) -> ExitCode {
    let run = RunDir::new(&args.run.run_dir);
    let st = match ambit_mesh::status(&run) {
        Ok(Some(s)) => s,
        Ok(None) => {
            eprintln!("no mesh in {}", args.run.run_dir.display());
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("ambit status: {e}");
            return ExitCode::FAILURE;
        }
    };
    match args.output {
        Output::Json => match serde_json::to_string_pretty(&st) {
            Ok(s) => say(&s),
            Err(e) => {
                eprintln!("ambit status: {e}");
                return ExitCode::FAILURE;
            }
        },
        Output::Table => {
            let yes = |b: bool| if b { "yes" } else { "no" }.to_string();
            say(&format!(
                "mesh {} ({:?}), orchestrator {}, control plane {} at {} ({} restarts)",
                st.prefix,
                st.phase,
                if st.orchestrator { "running" } else { "gone" },
                if st.control.running {
                    "running"
                } else {
                    "down"
                },
                st.control
                    .address
                    .map(|a| a.to_string())
                    .unwrap_or_default(),
                st.control.restarts
            ));
            say("");
            let mut rows = vec![[
                "NODE".to_string(),
                "IP".into(),
                "ZTUNNEL IP".into(),
                "AGENT READY".into(),
                "ZTUNNEL READY".into(),
                "RESTARTS (agent/ztunnel)".into(),
                "UNPROTECTED PODS".into(),
                "CERTIFICATES (expiry)".into(),
            ]];
            for n in &st.nodes {
                let certs: Vec<String> = n
                    .certificates
                    .iter()
                    .map(|c| {
                        format!(
                            "{} {}",
                            c.identity,
                            c.expires.clone().unwrap_or_else(|| c.state.clone())
                        )
                    })
                    .collect();
                rows.push([
                    n.name.clone(),
                    n.ip.to_string(),
                    n.ztunnel_ip.map_or("-".into(), |ip| ip.to_string()),
                    yes(n.agent.ready),
                    yes(n.ztunnel.ready),
                    format!("{}/{}", n.agent.restarts, n.ztunnel.restarts),
                    n.unprotected_pods.map_or("?".into(), |v| v.to_string()),
                    if certs.is_empty() {
                        "-".into()
                    } else {
                        certs.join("; ")
                    },
                ]);
            }
            table(&rows, say);
            say("");
            let mut rows = vec![[
                "NAMESPACE".to_string(),
                "POD".into(),
                "NODE".into(),
                "IP".into(),
                "AMBIENT".into(),
                "ENROLLED".into(),
                "REDIRECTION".into(),
                "RUNNING".into(),
                "RESTARTS".into(),
            ]];
            for p in &st.pods {
                rows.push([
                    p.namespace.clone(),
                    p.name.clone(),
                    p.node.clone(),
                    p.ip.to_string(),
                    yes(p.ambient),
                    yes(p.enrolled),
                    p.redirection.clone().unwrap_or_else(|| "-".into()),
                    yes(p.running),
                    p.restarts.to_string(),
                ]);
            }
            // VMs in the same columns: NODE is the group, ENROLLED the VM's ztunnel ready.
            for v in &st.vms {
                rows.push([
                    v.namespace.clone(),
                    v.name.clone(),
                    format!("(VM of {})", v.group),
                    v.ip.to_string(),
                    yes(true),
                    yes(v.ztunnel.ready),
                    "vm up".into(),
                    yes(v.running && v.ztunnel.running),
                    format!("{}/{}", v.ztunnel.restarts, v.restarts),
                ]);
            }
            table(&rows, say);
        }
    }
    ExitCode::SUCCESS
}

pub fn exec(args: ExecArgs) -> ExitCode {
    let run = RunDir::new(&args.run.run_dir);
    let mut cmd = match ambit_mesh::exec::command(&run, &args.pod, &args.command, &base_env()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ambit exec: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cmd.status() {
        Ok(s) => match s.code() {
            Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
            None => ExitCode::from(128),
        },
        Err(e) => {
            eprintln!(
                "ambit exec: {}: {e}",
                args.command.first().map(String::as_str).unwrap_or_default()
            );
            ExitCode::from(127)
        }
    }
}
