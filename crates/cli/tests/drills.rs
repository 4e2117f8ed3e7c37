//! The fault drills (issue 12): the embedded mesh under a bypass sentinel (packet captures on
//! the node-to-node link and on every pod's interface, `drills/sentinel.rs`) and a load of
//! new connections between enrolled pods (`drills/load.rs`), one fault at a time
//! (`drills/faults.rs`): agent and ztunnel SIGKILL (restarted by `ambit up`'s supervisor),
//! a ztunnel hand-off, in-pod rules flushed, a pod's netns re-created, the control plane
//! down, the CA down through a certificate renewal, a policy change to DENY with open
//! connections, 200 pods created and deleted. Every drill reports bypass packets (must be
//! 0), new connections attempted / failed and the time to recover; the table is printed at
//! the end (run with `--nocapture` to see it) and written to
//! `$CARGO_TARGET_TMPDIR/drills.md`, the components' logs to `$CARGO_TARGET_TMPDIR/drills-logs/`;
//! `docs/reliability.md` records a run. `AMBIT_DRILLS=WORD,…` runs only the drills whose names
//! contain one of the words.
//!
//! One mesh for all drills; every wait is bounded. Needs root (network namespaces),
//! `tcpdump` and `nsenter`.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[path = "support/embedded.rs"]
mod embedded;
#[path = "drills/faults.rs"]
mod faults;
#[path = "drills/load.rs"]
mod load;
#[path = "drills/mesh.rs"]
mod mesh;
#[path = "drills/sentinel.rs"]
mod sentinel;

use embedded::{Up, ambit, logs};
use mesh::{Layout, now, within};
use sentinel::{Point, Sentinel};

/// How long the load must run clean after the last failure for a drill to count as
/// recovered.
pub const SETTLE: f64 = 2.0;
/// The longest a drill may take to recover.
const RECOVERY_LIMIT: Duration = Duration::from_secs(90);

/// What the drills share.
#[derive(Debug)]
pub struct Ctx {
    pub run: PathBuf,
    pub layout: Layout,
    /// Every address an enrolled pod had during the run.
    pub enrolled: HashSet<Ipv4Addr>,
    /// The load clients' working directories.
    pub clients: Vec<PathBuf>,
    pub targets: Vec<String>,
    pub sentinel: Sentinel,
}

impl Ctx {
    fn attempts(&self) -> Vec<load::Attempt> {
        self.clients
            .iter()
            .flat_map(|w| load::attempts(w))
            .collect()
    }

    /// When the load recovered from whatever failed since `t0`: the start of the first
    /// attempt after the last failure, once the load ran clean for [`SETTLE`] after it and
    /// every target answered; `t0` itself when nothing ended in a failure after `t0` (and
    /// the load runs).
    fn recovered_since(&self, t0: f64) -> Option<f64> {
        let all = self.attempts();
        let since: Vec<&load::Attempt> = all.iter().filter(|a| a.start >= t0).collect();
        // A connection open when the fault hit and failing because of it counts too.
        let last_fail = all
            .iter()
            .filter(|a| a.end >= t0 && !a.ok)
            .map(|a| a.end)
            .fold(None, |m: Option<f64>, e| Some(m.map_or(e, |m| m.max(e))));
        let after = last_fail.unwrap_or(t0);
        let clean: Vec<&&load::Attempt> = since.iter().filter(|a| a.start >= after).collect();
        let every_target = self
            .targets
            .iter()
            .all(|t| clean.iter().any(|a| &a.target == t));
        let ran = clean.iter().map(|a| a.end).fold(after, f64::max) - after;
        (every_target && ran >= SETTLE).then(|| {
            if last_fail.is_none() {
                t0
            } else {
                clean.iter().map(|a| a.start).fold(f64::MAX, f64::min)
            }
        })
    }
}

/// One row of the table.
struct Row {
    name: &'static str,
    bypass: usize,
    attempted: u64,
    failed: u64,
    recovery: Option<f64>,
    pass: bool,
    /// The drill's known failure, when it has one.
    known: Option<&'static str>,
    /// The sentinel's window `[from, to]`.
    window: (f64, f64),
    notes: Vec<String>,
}

fn run_drill(ctx: &mut Ctx, drill: &faults::Drill) -> Row {
    let from = now();
    eprintln!("drill: {}", drill.name);
    let inj = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (drill.run)(ctx))) {
        Ok(inj) => inj,
        Err(e) => faults::Injected {
            t0: from,
            problems: vec![format!(
                "drill panicked: {}",
                e.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default()
            )],
            ..faults::Injected::default()
        },
    };
    let t0 = if inj.t0 > 0.0 { inj.t0 } else { from };
    let mut recovered = None;
    let _ = within(RECOVERY_LIMIT, || {
        recovered = ctx.recovered_since(t0);
        recovered.is_some()
    });
    let to = now();
    let window: Vec<load::Attempt> = ctx
        .attempts()
        .into_iter()
        .filter(|a| a.start >= from && a.start <= to)
        .collect();
    let failed: Vec<&load::Attempt> = window.iter().filter(|a| !a.ok).collect();
    let bypass = ctx
        .sentinel
        .bypasses(&ctx.enrolled, mesh::is_service, from, to);
    let recovery = match (recovered, inj.back_at) {
        (Some(r), Some(b)) => Some(r.max(b) - t0),
        _ => None,
    };
    let mut notes = inj.notes;
    let mut problems = inj.problems;
    if recovered.is_none() {
        problems.push(format!("load not recovered within {RECOVERY_LIMIT:?}"));
    }
    if !failed.is_empty() {
        // Each kind of failure: how many, and when the first one started (from the fault).
        let mut kinds: std::collections::BTreeMap<String, (usize, f64)> = Default::default();
        for a in &failed {
            let k = kinds
                .entry(format!("{} {}", a.target, a.detail))
                .or_insert((0, f64::MAX));
            k.0 += 1;
            k.1 = k.1.min(a.start - t0);
        }
        let kinds: Vec<String> = kinds
            .iter()
            .map(|(k, (n, at))| format!("{k} ×{n} from {at:+.1} s"))
            .collect();
        notes.push(format!("failures: {}", kinds.join(", ")));
        if !drill.may_fail {
            problems.push(format!("{} new connections failed", failed.len()));
        }
    }
    if !bypass.is_empty() {
        let sample: Vec<String> = bypass
            .iter()
            .take(3)
            .map(|p| format!("[{}] {}", p.point, p.line))
            .collect();
        let payload: u64 = bypass.iter().map(|p| p.payload).sum();
        let with: usize = bypass.iter().filter(|p| p.payload > 0).count();
        problems.push(format!(
            "{} bypass packets ({with} with payload, {payload} bytes), e.g. {sample:?}",
            bypass.len()
        ));
    }
    notes.extend(problems.iter().map(|p| format!("FAILED: {p}")));
    if let (false, Some(known)) = (problems.is_empty(), drill.known) {
        notes.push(known.to_owned());
    }
    let row = Row {
        name: drill.name,
        bypass: bypass.len(),
        attempted: window.len() as u64 + inj.extra.0,
        failed: failed.len() as u64 + inj.extra.1,
        recovery,
        pass: problems.is_empty(),
        known: drill.known,
        window: (from, to),
        notes,
    };
    eprintln!(
        "  {} bypass, {}/{} failed, {}",
        row.bypass,
        row.failed,
        row.attempted,
        if row.pass { "ok" } else { "FAILED" }
    );
    row
}

fn table(rows: &[Row], header: &str) -> String {
    let mut out = format!(
        "{header}\n\n| drill | bypass packets | new connections failed / attempted | time to recover | result | notes |\n|---|---|---|---|---|---|\n"
    );
    for r in rows {
        out += &format!(
            "| {} | {} | {} / {} | {} | {} | {} |\n",
            r.name,
            r.bypass,
            r.failed,
            r.attempted,
            r.recovery.map_or("-".into(), |s| format!("{s:.1} s")),
            match (r.pass, r.known) {
                (true, _) => "pass",
                (false, None) => "FAIL",
                (false, Some(_)) => "FAIL (known)",
            },
            r.notes.join("; ").replace('|', "/")
        );
    }
    out
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// A tool the drills cannot run without: missing is a failure under `CI=true`.
fn have(tool: &str) -> bool {
    let found = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("CI").ok().as_deref() != Some("true"),
            "drills need {tool} (CI=true)"
        );
        eprintln!("skipping the drills: {tool} not installed");
    }
    found
}

#[test]
fn drills() {
    if !ambit_netns::testing::netns_capable_or_skip("drills")
        || !["tcpdump", "nsenter", "iptables-save", "nft"]
            .iter()
            .all(|t| have(t))
    {
        return;
    }
    let started = Instant::now();
    let load_before = loadavg();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("manifests");
    mesh::write_manifests(&dir);
    let run = tmp.path().join("run");
    let mut up = Up::start_with(&dir, &run, &["--cert-ttl".as_ref(), "200".as_ref()]);
    up.wait_ready();
    let layout = Layout::read(&run);
    let mut points = vec![Point {
        label: "br0".into(),
        netns: layout.prefix.clone(),
        iface: "br0".into(),
    }];
    for (node, netns) in &layout.nodes {
        points.push(Point {
            label: node.clone(),
            netns: netns.clone(),
            iface: "any".into(),
        });
    }
    let pod_ip = layout.ip("a1").octets();
    let sentinel = Sentinel::start(
        &points,
        &format!("{}.{}.0.0/16", pod_ip[0], pod_ip[1]),
        mesh::SERVICE_NET,
    );
    let targets = vec![
        format!("{}:8080", layout.ip("a1")),
        format!("{}:8080", layout.ip("a2")),
        format!("{}:8080", mesh::SERVICE_VIP),
    ];
    let clients = vec![
        layout.workdir("c1"),
        layout.workdir("c2"),
        layout.workdir("c3"),
    ];
    // c3 is loaded only by its drill.
    load::pause(&clients[2], true);
    let holder = layout.workdir("h1");
    let load_from = now();
    load::start(&clients, &targets);
    load::start(
        std::slice::from_ref(&holder),
        &[format!("{}:8080", layout.ip("g2"))],
    );
    let mut ctx = Ctx {
        run: run.clone(),
        enrolled: layout.enrolled(),
        layout,
        clients: clients.clone(),
        targets,
        sentinel,
    };
    // Enrolment reaches every ztunnel through xDS shortly after `ready`.
    assert!(
        within(Duration::from_secs(30), || ctx
            .recovered_since(load_from)
            .is_some())
        .is_some(),
        "the load does not run: {:?}\n{}",
        ctx.attempts().iter().rev().take(5).collect::<Vec<_>>(),
        logs(&run)
    );
    let run_from = now();
    // `AMBIT_DRILLS=policy,hand-off` runs only the drills whose names contain one of the words.
    let only = std::env::var("AMBIT_DRILLS").unwrap_or_default();
    let rows: Vec<Row> = faults::DRILLS
        .iter()
        .filter(|d| only.is_empty() || only.split(',').any(|w| d.name.contains(w.trim())))
        .map(|d| run_drill(&mut ctx, d))
        .collect();
    let run_to = now();
    let total_bypass = ctx
        .sentinel
        .bypasses(&ctx.enrolled, mesh::is_service, 0.0, f64::MAX);
    // Bypass packets outside the windows of drills with a known bypass.
    let unexplained: Vec<&sentinel::Packet> = total_bypass
        .iter()
        .filter(|p| {
            !rows
                .iter()
                .any(|r| r.known.is_some() && p.at >= r.window.0 && p.at <= r.window.1)
        })
        .collect();
    let all: Vec<load::Attempt> = ctx
        .attempts()
        .into_iter()
        .filter(|a| a.start >= run_from)
        .collect();
    let (attempted, failed) = (all.len(), all.iter().filter(|a| !a.ok).count());
    load::stop(&clients);
    load::stop(&[holder]);
    let capture = ctx.sentinel.finish();
    let out = ambit(&run, &["down"]);
    let _ = up.child.wait();
    // The components' logs stay for a post-mortem (`down` keeps them, the tempdir does not).
    let kept = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("drills-logs");
    let _ = std::fs::remove_dir_all(&kept);
    let _ = std::fs::create_dir_all(&kept);
    for e in std::fs::read_dir(run.join("logs"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let _ = std::fs::copy(e.path(), kept.join(e.file_name()));
    }
    let header = format!(
        "Drills: {} of {} passed ({} known failures); {} bypass packets over the whole run; {failed} of {attempted} load connections failed from the first drill to the last (the time between drills included); {:.0} s from nothing to down ({:.0} s of drills); load average {load_before} before, {} after, {} cores",
        rows.iter().filter(|r| r.pass).count(),
        rows.len(),
        rows.iter().filter(|r| !r.pass && r.known.is_some()).count(),
        total_bypass.len(),
        started.elapsed().as_secs_f64(),
        run_to - run_from,
        loadavg(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let text = table(&rows, &header);
    eprintln!("\n{text}");
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("drills.md");
    let _ = std::fs::write(&path, &text);
    assert!(out.status.success(), "ambit down: {out:?}");
    assert_eq!(capture, Ok(()), "the sentinel was not exact");
    assert!(
        unexplained.is_empty(),
        "bypass packets: {:#?}",
        unexplained.iter().take(10).collect::<Vec<_>>()
    );
    let failed: Vec<&str> = rows
        .iter()
        .filter(|r| !r.pass && r.known.is_none())
        .map(|r| r.name)
        .collect();
    assert!(failed.is_empty(), "failed drills: {failed:?}\n{text}");
    let fixed: Vec<&str> = rows
        .iter()
        .filter(|r| r.pass && r.known.is_some())
        .map(|r| r.name)
        .collect();
    assert!(
        fixed.is_empty(),
        "drills with a known failure passed: remove their `known` entry: {fixed:?}\n{text}"
    );
}
