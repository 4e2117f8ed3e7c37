//! The measurement plan and its execution: every measurement runs for every round and
//! every scenario, interleaved (A B A B per measurement), so slow drift of a shared
//! machine spreads over all scenarios instead of biasing one.

use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::load::{self, STOP};
use crate::procstat;
use crate::report::{self, PERCENTILES, Samples};
use crate::scenario::{PodSysctls, Scenario, ScenarioKind};

/// Durations and sizes of one run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Plan {
    /// Rounds per measurement.
    pub rounds: usize,
    /// Throughput window (after warm-up), per stream count.
    #[serde(serialize_with = "secs")]
    pub throughput: Duration,
    /// Throughput warm-up before the window.
    #[serde(serialize_with = "secs")]
    pub warmup: Duration,
    /// Latency run per rate.
    #[serde(serialize_with = "secs")]
    pub latency: Duration,
    /// Request rates for the latency runs.
    pub rates: Vec<u32>,
    /// Connection-rate run.
    #[serde(serialize_with = "secs")]
    pub conn_rate: Duration,
    /// Parallel connection loops (client threads) of the connection-rate runs, one run per
    /// entry.
    pub conn_concurrency: Vec<usize>,
    /// The sustained connection-rate run, once per scenario in a fresh copy of it (zero
    /// skips it).
    #[serde(serialize_with = "secs")]
    pub sustained: Duration,
    /// Its reporting step (completions are counted per step; the slowest is reported).
    #[serde(serialize_with = "secs")]
    pub sustained_step: Duration,
    /// Its parallel connection loops.
    pub sustained_clients: usize,
    /// Connections per second its loops offer together (0: each loop starts the next
    /// connection as soon as one ends).
    pub sustained_rate: u32,
    /// The client's and the server's pod sysctls, in every scenario.
    pub pod_sysctls: PodSysctls,
    /// Idle connections held open for the memory measurement.
    pub idle_conns: usize,
    /// Extra pods enrolled on the server node for the memory-per-pod measurement (in-pod
    /// scenarios; 0 skips it).
    pub enrolled_pods: usize,
    /// How long the server node's agent CPU is sampled with every extra pod enrolled (its
    /// verification pass runs every 10 s by default, so the default window holds three).
    #[serde(serialize_with = "secs")]
    pub agent_cpu: Duration,
    /// Wait after opening them before reading RSS.
    #[serde(serialize_with = "secs")]
    pub settle: Duration,
}

impl Plan {
    /// The default run: about 7 minutes for two scenarios on 2 cores (2.5 of them the
    /// sustained runs), 17 with upstream and both mixed fleets.
    pub fn full() -> Self {
        Self {
            rounds: 3,
            throughput: Duration::from_secs(3),
            warmup: Duration::from_millis(500),
            latency: Duration::from_secs(5),
            rates: vec![1_000, 10_000],
            conn_rate: Duration::from_secs(3),
            conn_concurrency: vec![1, 4],
            // TIME-WAIT is 60 s: after that the sockets closed connections leave behind
            // are at their steady state.
            sustained: Duration::from_secs(75),
            sustained_step: Duration::from_secs(5),
            sustained_clients: 4,
            sustained_rate: 0,
            pod_sysctls: PodSysctls::Tuned,
            idle_conns: 10_000,
            enrolled_pods: 1_000,
            agent_cpu: Duration::from_secs(30),
            settle: Duration::from_secs(1),
        }
    }

    /// A few hundred milliseconds per measurement: checks that everything works.
    pub fn smoke() -> Self {
        Self {
            rounds: 1,
            throughput: Duration::from_millis(300),
            warmup: Duration::from_millis(100),
            latency: Duration::from_millis(400),
            rates: vec![1_000, 10_000],
            conn_rate: Duration::from_millis(300),
            conn_concurrency: vec![1, 4],
            sustained: Duration::from_millis(500),
            sustained_step: Duration::from_millis(100),
            sustained_clients: 4,
            sustained_rate: 0,
            pod_sysctls: PodSysctls::Tuned,
            idle_conns: 200,
            enrolled_pods: 5,
            agent_cpu: Duration::from_secs(1),
            settle: Duration::from_millis(300),
        }
    }

    /// Steps of the sustained run (at least one when it runs at all).
    fn sustained_steps(&self) -> usize {
        if self.sustained.is_zero() || self.sustained_step.is_zero() {
            return 0;
        }
        let steps = self.sustained.as_secs_f64() / self.sustained_step.as_secs_f64();
        (steps.round() as usize).max(1)
    }

    /// What the report says about the sustained run, when there is one.
    pub fn sustained_shape(&self) -> Option<report::SustainedShape> {
        let steps = self.sustained_steps();
        (steps > 0).then_some(report::SustainedShape {
            clients: self.sustained_clients,
            rate: self.sustained_rate,
            secs: self.sustained_step.as_secs_f64() * steps as f64,
            step_secs: self.sustained_step.as_secs_f64(),
        })
    }
}

/// The connection rate over a run longer than TCP's TIME-WAIT, in a *fresh* copy of the
/// scenario (the rounds before leave TIME-WAIT sockets behind). A proxy that preserves the
/// client's address connects from it, and the sockets of closed connections hold ports of
/// that address for 60 s: how the rate holds up once they have piled up is what a server
/// taking short connections from a busy client sees. Failed iterations are counted, and
/// every step's completions are printed.
fn sustained(
    plan: &Plan,
    kind: ScenarioKind,
    rt: &tokio::runtime::Runtime,
) -> Result<Vec<(String, f64)>> {
    let mut fresh =
        Scenario::start(kind, rt.handle(), 0, plan.pod_sysctls).context("fresh scenario")?;
    let s = rt.block_on(load::sustained_connection_rate(
        fresh.client().clone(),
        fresh.echo_addr(),
        plan.sustained_clients,
        plan.sustained_rate,
        plan.sustained_step,
        plan.sustained_steps(),
    ))?;
    fresh.check_alive()?;
    let step = report::fmt_value(plan.sustained_step.as_secs_f64());
    let steps: Vec<String> = s.per_step.iter().map(|n| n.to_string()).collect();
    eprintln!(
        "  {}: connections per {step} s: {}",
        fresh.kind().name(),
        steps.join(" ")
    );
    if let Some(e) = &s.first_error {
        eprintln!(
            "  {}: {} failed connections, the first: {e}",
            fresh.kind().name(),
            s.errors
        );
    }
    let mut out = vec![
        (report::SUSTAINED_RATE.into(), s.rate()),
        (report::SUSTAINED_SLOWEST.into(), s.slowest_step_rate()),
        (report::SUSTAINED_CONN_P99.into(), s.conn_time_p99_us()),
    ];
    // Only when there were any: zero is every healthy scenario's, and no ratio of it.
    if s.errors > 0 {
        out.push((report::SUSTAINED_ERRORS.into(), s.errors as f64));
    }
    Ok(out)
}

/// Proxy memory, idle and with idle connections, in a *fresh* copy of the scenario: the
/// proxies that ran the other measurements keep their allocator high-water mark, which
/// would hide what connections cost (and make later rounds look cheaper than the first).
/// The client ends of the idle connections live in a child process in the client pod
/// (`ambit-bench idle-conns`), so this process holds only the server ends.
fn memory(
    plan: &Plan,
    kind: ScenarioKind,
    rt: &tokio::runtime::Runtime,
) -> Result<Vec<(String, f64)>> {
    let mut fresh =
        Scenario::start(kind, rt.handle(), 0, plan.pod_sysctls).context("fresh scenario")?;
    let pids = fresh.proxy_pids();
    let rss = || -> Result<f64> {
        let kib: u64 = pids
            .iter()
            .map(|p| procstat::rss_kib(*p))
            .sum::<std::io::Result<u64>>()?;
        Ok(kib as f64)
    };
    std::thread::sleep(plan.settle);
    let idle = rss()?;
    let exe = std::env::current_exe()?;
    let mut cmd = fresh.client_command(&exe)?;
    cmd.arg("idle-conns")
        .arg("--dst")
        .arg(fresh.echo_addr().to_string())
        .arg("--count")
        .arg(plan.idle_conns.to_string());
    let holder =
        load::IdleHolder::start(cmd, plan.idle_conns).map_err(|e| e.context(fresh.log_tails()))?;
    std::thread::sleep(plan.settle);
    let with = rss()?;
    fresh.check_alive()?;
    holder.close()?;
    let per_conn = (with - idle) * 1024.0 / plan.idle_conns.max(1) as f64;
    Ok(vec![
        (report::RSS_IDLE.into(), idle),
        (report::RSS_CONNS.into(), with),
        (report::PER_CONN.into(), per_conn),
    ])
}

/// Memory of the server node's ztunnel per enrolled pod, in a fresh in-pod scenario whose
/// server node also knows `plan.enrolled_pods` more pods (bare network namespaces): its
/// RSS with the server pod alone, then after every extra pod was enrolled through the CNI
/// plugin (each ADD returns only once ztunnel acked the pod, i.e. listens in its netns).
/// Then the server node's agent CPU over `plan.agent_cpu`, its own and its children's (the
/// rule tools it runs), as a share of one core.
fn enrolled(
    plan: &Plan,
    kind: ScenarioKind,
    rt: &tokio::runtime::Runtime,
) -> Result<Vec<(String, f64)>> {
    let n = plan.enrolled_pods;
    let mut fresh =
        Scenario::start(kind, rt.handle(), n, plan.pod_sysctls).context("fresh scenario")?;
    let pid = fresh
        .server_proxy_pid()
        .context("no ztunnel on the server node")?;
    std::thread::sleep(plan.settle);
    let before = procstat::rss_kib(pid)? as f64;
    let took = fresh.enrol_extra_pods()?;
    // Certificates of the new identities are fetched in the background after each ack.
    std::thread::sleep(plan.settle);
    let after = procstat::rss_kib(pid)? as f64;
    // The mesh still carries traffic with every pod enrolled.
    rt.block_on(load::wait_path(
        fresh.client(),
        fresh.echo_addr(),
        Duration::from_secs(5),
    ))?;
    fresh.check_alive()?;
    let agent = fresh
        .server_agent_pid()
        .context("no agent on the server node")?;
    let (own0, kids0) = procstat::cpu_seconds_with_children(agent)?;
    let t0 = std::time::Instant::now();
    std::thread::sleep(plan.agent_cpu);
    let (own1, kids1) = procstat::cpu_seconds_with_children(agent)?;
    let window = t0.elapsed().as_secs_f64();
    fresh.check_alive()?;
    let pct = |s: f64| s * 100.0 / window;
    Ok(vec![
        (
            report::AGENT_CPU.into(),
            pct((own1 - own0) + (kids1 - kids0)),
        ),
        (report::AGENT_CHILD_CPU.into(), pct(kids1 - kids0)),
        (report::ENROL_RSS_BEFORE.into(), before),
        (report::ENROL_RSS_AFTER.into(), after),
        (report::PER_POD.into(), (after - before) * 1024.0 / n as f64),
        (
            report::ENROL_MS.into(),
            took.as_secs_f64() * 1000.0 / n as f64,
        ),
    ])
}

/// Durations in the JSON as seconds.
fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// What is measured, in order.
#[derive(Clone, Copy, Debug)]
enum Measurement {
    Throughput,
    Latency(u32),
    ConnRate,
    Sustained,
    Memory,
    Enrolled,
}

impl std::fmt::Display for Measurement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Throughput => write!(f, "throughput"),
            Self::Latency(r) => write!(f, "latency @ {r} req/s"),
            Self::ConnRate => write!(f, "connection rate"),
            Self::Sustained => write!(f, "sustained connection rate"),
            Self::Memory => write!(f, "memory"),
            Self::Enrolled => write!(f, "memory per enrolled pod"),
        }
    }
}

/// Runs `plan` over `scenarios`; returns one sample map per scenario.
pub fn execute(
    plan: &Plan,
    scenarios: &mut [Scenario],
    rt: &tokio::runtime::Runtime,
) -> Result<Vec<Samples>> {
    let mut samples = vec![Samples::new(); scenarios.len()];
    let mut measurements = vec![Measurement::Throughput];
    measurements.extend(plan.rates.iter().map(|r| Measurement::Latency(*r)));
    measurements.push(Measurement::ConnRate);
    if plan.sustained_steps() > 0 {
        measurements.push(Measurement::Sustained);
    }
    measurements.push(Measurement::Memory);
    if plan.enrolled_pods > 0 {
        measurements.push(Measurement::Enrolled);
    }
    for m in measurements {
        // Enrolling 1,000 pods takes ~30 s, the sustained run 75 s: once per run keeps the
        // default run short (memory figures vary little between rounds; the sustained
        // run's steps are its samples).
        let rounds = match m {
            Measurement::Enrolled | Measurement::Sustained => 1,
            _ => plan.rounds,
        };
        for round in 0..rounds {
            for (sc, out) in scenarios.iter_mut().zip(samples.iter_mut()) {
                if STOP.load(Ordering::Relaxed) {
                    bail!("interrupted");
                }
                let name = sc.kind().name().to_string();
                let values = measure(m, plan, sc, rt)
                    .with_context(|| format!("{m}, round {}, scenario {name}", round + 1))?;
                sc.check_alive()
                    .with_context(|| format!("after {m} in scenario {name}"))?;
                if values.is_empty() {
                    continue;
                }
                let shown: Vec<String> = values
                    .iter()
                    .map(|(k, v)| format!("{k}={}", report::fmt_value(*v)))
                    .collect();
                eprintln!(
                    "[{}/{}] {name:>9} {m}: {}",
                    round + 1,
                    rounds,
                    shown.join(" ")
                );
                for (k, v) in values {
                    out.entry(k).or_default().push(v);
                }
                // Let the previous run's connections close before the next one starts.
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    Ok(samples)
}

fn measure(
    m: Measurement,
    plan: &Plan,
    sc: &mut Scenario,
    rt: &tokio::runtime::Runtime,
) -> Result<Vec<(String, f64)>> {
    let pids = sc.proxy_pids();
    let proxied = sc.has_proxies();
    let client = sc.client().clone();
    match m {
        // Latency, memory and enrolment of a mixed fleet are not one implementation's;
        // throughput and connection rate prove it carries traffic both ways.
        Measurement::Latency(_) | Measurement::Memory | Measurement::Enrolled
            if sc.kind().is_mixed() =>
        {
            Ok(Vec::new())
        }
        Measurement::Throughput => {
            let cpu = || procstat::total_cpu_seconds(&pids).unwrap_or(0.0);
            let mut out = Vec::new();
            let (mut bytes, mut cpu_s) = (0u64, 0.0);
            for streams in [1, 4] {
                let t = rt.block_on(load::throughput(
                    &client,
                    sc.discard_addr(),
                    streams,
                    plan.warmup,
                    plan.throughput,
                    &sc.received,
                    cpu,
                ))?;
                bytes += t.bytes;
                cpu_s += t.proxy_cpu;
                out.push((report::throughput_key(streams), t.rate()));
            }
            if proxied {
                out.push((report::CPU_PER_GB.into(), cpu_s / (bytes as f64 / 1e9)));
            }
            Ok(out)
        }
        Measurement::Latency(rate) => {
            let l = load::latency(&client, sc.echo_addr(), rate, plan.latency)?;
            let mut out: Vec<(String, f64)> = PERCENTILES
                .iter()
                .map(|(suffix, _, q)| {
                    let us = l.histogram.value_at_quantile(*q) as f64 / 1000.0;
                    (report::latency_key(rate, suffix), us)
                })
                .collect();
            out.push((report::achieved_key(rate), l.achieved_rate));
            Ok(out)
        }
        Measurement::ConnRate => {
            let mut out = Vec::new();
            let (mut conns, mut cpu_s) = (0u64, 0.0);
            for &concurrency in &plan.conn_concurrency {
                let c0 = procstat::total_cpu_seconds(&pids).unwrap_or(0.0);
                let r = rt.block_on(load::connection_rate(
                    client.clone(),
                    sc.echo_addr(),
                    concurrency,
                    plan.conn_rate,
                ))?;
                cpu_s += procstat::total_cpu_seconds(&pids).unwrap_or(0.0) - c0;
                conns += r.connections;
                out.push((report::conn_rate_key(concurrency), r.rate()));
            }
            if proxied && conns > 0 {
                out.push((report::CPU_PER_CONN.into(), cpu_s * 1e6 / conns as f64));
            }
            Ok(out)
        }
        Measurement::Sustained => sustained(plan, sc.kind().clone(), rt),
        Measurement::Memory if !proxied => Ok(Vec::new()),
        Measurement::Memory => memory(plan, sc.kind().clone(), rt),
        Measurement::Enrolled if !sc.kind().is_in_pod() => Ok(Vec::new()),
        Measurement::Enrolled => enrolled(plan, sc.kind().clone(), rt),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sustained_steps_and_shape() {
        let ms = Duration::from_millis;
        // (length, step, steps, reported seconds)
        let cases = [
            (ms(75_000), ms(5_000), 15, Some(75.0)),
            (ms(500), ms(100), 5, Some(0.5)),
            (ms(74_000), ms(5_000), 15, Some(75.0)),
            (ms(1_000), ms(5_000), 1, Some(5.0)),
            (ms(0), ms(5_000), 0, None),
            (ms(3_000), ms(0), 0, None),
        ];
        for (length, step, steps, secs) in cases {
            let plan = Plan {
                sustained: length,
                sustained_step: step,
                ..Plan::smoke()
            };
            let what = format!("{length:?} by {step:?}");
            assert_eq!(plan.sustained_steps(), steps, "{what}");
            let shape = plan.sustained_shape();
            assert_eq!(shape.map(|s| s.secs), secs, "{what}");
            assert!(shape.is_none_or(|s| s.clients == 4), "{what}");
        }
    }
}
