//! The drills: one fault each, injected into the running drill mesh. Each returns when its
//! fault is injected and the faulty component is back (or reports why not); the runner in
//! `drills.rs` then waits for the load to settle and counts connections and bypass packets.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::Ctx;
use crate::embedded::{ambit, apply, component_pid, kill9, stdout};
use crate::load;
use crate::mesh::{
    Layout, certificates, guard_policy, health, in_netns, istio_rules, now, unprotected, within,
};

/// What a drill reports to the runner.
#[derive(Debug, Default)]
pub struct Injected {
    /// When the fault happened (epoch s).
    pub t0: f64,
    /// When the faulty part was observed back (epoch s).
    pub back_at: Option<f64>,
    pub notes: Vec<String>,
    /// New connections of the drill's own (beyond the load clients'): attempted, failed.
    pub extra: (u64, u64),
    /// Expectations the drill itself checks (a non-empty list fails it).
    pub problems: Vec<String>,
}

/// One drill of the table.
pub struct Drill {
    pub name: &'static str,
    /// Whether new connections may fail while it runs (the data path itself is down).
    pub may_fail: bool,
    /// A failure this drill finds today and that is reported, not fixed yet: the drill still
    /// measures and shows it (FAIL in the table), the run does not fail on it, and it fails
    /// once the drill passes (so the entry is removed with the fix).
    pub known: Option<&'static str>,
    pub run: fn(&mut Ctx) -> Injected,
}

/// In the order they run. The mesh asks for 200 s certificates (renewed every 100 s, so a
/// 30 s outage can never let one lapse); the hand-offs renew every certificate, and the CA
/// drill comes 75 to 90 s later on a busy machine, so the next renewal is near (when it has
/// passed, the drill waits for the one after, up to 100 s more). The pod churn last.
pub const DRILLS: &[Drill] = &[
    Drill {
        name: "baseline (no fault, 5 s)",
        may_fail: false,
        known: None,
        run: baseline,
    },
    Drill {
        name: "agent SIGKILL, supervisor restart",
        may_fail: false,
        known: None,
        run: agent_sigkill,
    },
    Drill {
        name: "ztunnel SIGKILL, supervisor restart",
        may_fail: true,
        known: None,
        run: ztunnel_sigkill,
    },
    Drill {
        name: "ztunnel hand-off under load, both nodes",
        may_fail: false,
        known: None,
        run: handoff,
    },
    Drill {
        name: "in-pod nat table flushed (client c3)",
        may_fail: true,
        known: None,
        run: flush_nat,
    },
    Drill {
        name: "in-pod mangle table flushed (server a2)",
        may_fail: true,
        known: None,
        run: flush_mangle,
    },
    Drill {
        name: "in-pod ruleset flushed, all tables (server a1)",
        may_fail: true,
        known: None,
        run: flush_all,
    },
    Drill {
        name: "pod netns re-created, same pod (server a2)",
        may_fail: true,
        known: None,
        run: recreate_netns,
    },
    Drill {
        name: "control plane down 30 s",
        may_fail: false,
        known: None,
        run: control_down,
    },
    Drill {
        name: "policy ALLOW to DENY, open connections",
        may_fail: false,
        known: None,
        run: policy_to_deny,
    },
    Drill {
        name: "CA down 30 s through a renewal",
        may_fail: false,
        known: None,
        run: ca_through_renewal,
    },
    Drill {
        name: "200 pods created and deleted",
        may_fail: false,
        known: None,
        run: pod_churn,
    },
];

fn baseline(_: &mut Ctx) -> Injected {
    let t0 = now();
    std::thread::sleep(Duration::from_secs(5));
    Injected {
        t0,
        back_at: Some(t0),
        ..Injected::default()
    }
}

/// Waits for `component` on `node` to run and be ready with one more restart counted.
fn supervised_back(run: &Path, component: &str, node: &str, before: u64, inj: &mut Injected) {
    match within(Duration::from_secs(60), || {
        let h = health(run, component, node);
        h.running && h.ready && h.restarts == before + 1
    }) {
        Some(_) => inj.back_at = Some(now()),
        None => inj.problems.push(format!(
            "{component} on {node} not back with restarts {} within 60 s: {:?}",
            before + 1,
            health(run, component, node)
        )),
    }
}

fn all_protected(run: &Path, inj: &mut Injected) {
    if within(Duration::from_secs(30), || {
        unprotected(run).iter().all(|u| *u == Some(0))
    })
    .is_none()
    {
        inj.problems
            .push(format!("unprotected pods: {:?}", unprotected(run)));
    }
}

fn kill_and_wait(ctx: &mut Ctx, component: &str, role: &str, node: &str) -> Injected {
    let before = health(&ctx.run, component, node).restarts;
    let pid = component_pid(&ctx.run, role, node);
    let mut inj = Injected {
        t0: now(),
        ..Injected::default()
    };
    kill9(pid);
    supervised_back(&ctx.run, component, node, before, &mut inj);
    all_protected(&ctx.run, &mut inj);
    if let Some(back) = inj.back_at {
        inj.notes.push(format!(
            "{component} back (ready, restarts {}) after {:.1} s",
            before + 1,
            back - inj.t0
        ));
    }
    inj
}

fn agent_sigkill(ctx: &mut Ctx) -> Injected {
    kill_and_wait(ctx, "agent", "agent", "node1")
}

fn ztunnel_sigkill(ctx: &mut Ctx) -> Injected {
    kill_and_wait(ctx, "ztunnel", "ztunnel", "node2")
}

/// `ambit restart ztunnel` on each node in turn (`AMBIT_DRILL_HANDOFFS` rounds, default 1).
fn handoff(ctx: &mut Ctx) -> Injected {
    let rounds: usize = std::env::var("AMBIT_DRILL_HANDOFFS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut inj = Injected {
        t0: now(),
        ..Injected::default()
    };
    let mut took = Vec::new();
    for node in (0..rounds).flat_map(|_| ["node2", "node1"]) {
        let start = now();
        let out = ambit(&ctx.run, &["restart", "ztunnel", node]);
        if !out.status.success() {
            inj.problems
                .push(format!("restart ztunnel {node} failed: {out:?}"));
            return inj;
        }
        took.push(format!("{node} {:.1} s", now() - start));
    }
    inj.back_at = Some(now());
    inj.notes.push(format!(
        "hand-offs (`ambit restart ztunnel`): {}",
        took.join(", ")
    ));
    inj
}

/// Flushes `pod`'s rules with `commands` and waits for the agent to put them back.
fn flush(ctx: &mut Ctx, pod: &str, commands: &[&[&str]]) -> Injected {
    let netns = ctx.layout.pod(pod).2.clone();
    let before = istio_rules(&netns);
    let mut inj = Injected::default();
    if before.is_empty() {
        inj.problems.push(format!("{pod} has no rules to flush"));
        return inj;
    }
    inj.t0 = now();
    for c in commands {
        if let Err(e) = in_netns(&netns, c) {
            inj.problems.push(e);
        }
    }
    let gone = before.len() - istio_rules(&netns).len();
    // The agent's fail-closed guard table is owned by its socket: the flush leaves it.
    let guard = in_netns(&netns, &["nft", "list", "table", "inet", "ambit-guard"]).is_ok();
    inj.notes.push(format!(
        "{gone} of {} ambit rules removed in {pod}, guard table {}",
        before.len(),
        if guard { "kept" } else { "absent" }
    ));
    match within(Duration::from_secs(60), || istio_rules(&netns) == before) {
        Some(_) => {
            let back = now();
            inj.back_at = Some(back);
            inj.notes
                .push(format!("agent restored them after {:.1} s", back - inj.t0));
        }
        None => inj.problems.push(format!(
            "rules not restored within 60 s: {:?}",
            istio_rules(&netns)
        )),
    }
    all_protected(&ctx.run, &mut inj);
    inj
}

/// The client `c3` runs the load only in this drill: the connections it made while its nat
/// table was empty leave conntrack entries that outlive the restored rules (counted here), and
/// a later connection that reuses one of their tuples would leave the pod unredirected in
/// another drill's window.
fn flush_nat(ctx: &mut Ctx) -> Injected {
    let (spare, netns) = (ctx.layout.workdir("c3"), ctx.layout.pod("c3").2.clone());
    load::pause(&spare, false);
    load::start(std::slice::from_ref(&spare), &ctx.targets);
    let from = now();
    let loaded = within(Duration::from_secs(20), || {
        load::attempts(&spare)
            .iter()
            .filter(|a| a.ok && a.start >= from)
            .count()
            >= 10
    });
    let mut inj = if loaded.is_none() {
        Injected {
            problems: vec!["c3's load does not run".into()],
            ..Injected::default()
        }
    } else {
        flush(ctx, "c3", &[&["iptables", "-t", "nat", "-F"]])
    };
    // The load of c3 runs clean again before it stops.
    let back = now();
    if within(Duration::from_secs(30), || {
        load::attempts(&spare)
            .iter()
            .filter(|a| a.start >= back)
            .all(|a| a.ok)
            && load::attempts(&spare)
                .iter()
                .any(|a| a.start >= back + crate::SETTLE)
    })
    .is_none()
    {
        inj.problems
            .push("c3's load not clean after the restore".into());
    }
    let pod_ip = ctx.layout.ip("c3").octets();
    let stale = crate::mesh::unredirected_conntrack(&netns, [pod_ip[0], pod_ip[1]]);
    if !stale.is_empty() {
        inj.problems.push(format!(
            "{} unredirected conntrack entries outlive the restore, e.g. {:?}",
            stale.len(),
            stale.first()
        ));
    }
    load::pause(&spare, true);
    inj
}

fn flush_mangle(ctx: &mut Ctx) -> Injected {
    flush(ctx, "a2", &[&["iptables", "-t", "mangle", "-F"]])
}

fn flush_all(ctx: &mut Ctx) -> Injected {
    flush(ctx, "a1", &[&["nft", "flush", "ruleset"]])
}

fn recreate_netns(ctx: &mut Ctx) -> Injected {
    let ip = ctx.layout.ip("a2");
    let mut inj = Injected {
        t0: now(),
        ..Injected::default()
    };
    let out = ambit(&ctx.run, &["restart", "pod", "drill/a2"]);
    if !out.status.success() {
        inj.problems.push(format!("restart pod failed: {out:?}"));
        return inj;
    }
    inj.back_at = Some(now());
    inj.notes
        .push(format!("sandbox re-created in {:.1} s", now() - inj.t0));
    ctx.layout = Layout::read(&ctx.run);
    ctx.enrolled.extend(ctx.layout.enrolled());
    if ctx.layout.ip("a2") != ip {
        inj.problems
            .push(format!("a2 moved from {ip} to {}", ctx.layout.ip("a2")));
    }
    if istio_rules(&ctx.layout.pod("a2").2).is_empty() {
        inj.problems.push("no rules in the new namespace".into());
    }
    all_protected(&ctx.run, &mut inj);
    inj
}

/// Whether a change made now reaches every ztunnel: a new Service appears in each one's
/// `/config_dump` within 60 s. The time it took.
fn resynced(ctx: &Ctx) -> Option<Duration> {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let name = format!("resync-probe-{n}");
    let svc = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "drill"},
        "spec": {"selector": {"app": "none"}, "clusterIP": format!("10.96.9.{}", n + 1),
                 "ports": [{"port": 9}]}
    });
    if !apply(&ctx.run, "apply", &svc.to_string()).status.success() {
        return None;
    }
    within(Duration::from_secs(60), || {
        let out = ambit(&ctx.run, &["ztunnel-config", "services", "-o", "json"]);
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap_or_default();
        let nodes = v.as_object().map(|o| o.len()).unwrap_or(0);
        nodes == 2
            && v.as_object()
                .into_iter()
                .flatten()
                .all(|(_, list)| list.to_string().contains(&name))
    })
}

/// Stops the control plane for 30 s; the time it is seen running again.
fn outage(ctx: &Ctx, inj: &mut Injected) -> Option<f64> {
    let out = ambit(&ctx.run, &["stop", "control", "--for", "30"]);
    if !out.status.success() {
        inj.problems.push(format!("stop control failed: {out:?}"));
        return None;
    }
    if health(&ctx.run, "control", "").running {
        inj.problems
            .push("control plane still running after stop".into());
    }
    let back = within(Duration::from_secs(60), || {
        health(&ctx.run, "control", "").running
    })
    .map(|_| now());
    if back.is_none() {
        inj.problems
            .push("control plane not back within 60 s".into());
    }
    back
}

fn control_down(ctx: &mut Ctx) -> Injected {
    let mut inj = Injected {
        t0: now(),
        ..Injected::default()
    };
    let Some(back) = outage(ctx, &mut inj) else {
        return inj;
    };
    inj.notes
        .push(format!("control plane back after {:.1} s", back - inj.t0));
    // Back means reconnected: a change made now reaches every ztunnel.
    match resynced(ctx) {
        Some(_) => {
            let at = now();
            inj.back_at = Some(at);
            inj.notes.push(format!(
                "a change reached both ztunnels {:.1} s after it returned",
                at - back
            ));
        }
        None => inj
            .problems
            .push("a change made after the outage never reached the ztunnels".into()),
    }
    inj
}

fn ca_through_renewal(ctx: &mut Ctx) -> Injected {
    let mut inj = Injected::default();
    // The certificate renewed next (at least 6 s from now).
    let soon = now() + 6.0;
    let Some(cert) = certificates(&ctx.run)
        .into_iter()
        .filter(|c| c.refresh_at() > soon)
        .min_by(|a, b| a.refresh_at().total_cmp(&b.refresh_at()))
    else {
        inj.problems.push("no certificate to renew".into());
        return inj;
    };
    let wait = cert.refresh_at() - 5.0 - now();
    if wait > 150.0 {
        inj.problems
            .push(format!("next renewal only in {wait:.0} s: {cert:?}"));
        return inj;
    }
    // Scheduled: the outage starts 5 s before the renewal is due.
    std::thread::sleep(Duration::from_secs_f64(wait.max(0.0)));
    inj.t0 = now();
    let Some(ca_back) = outage(ctx, &mut inj) else {
        return inj;
    };
    let renewed = within(Duration::from_secs(60), || {
        certificates(&ctx.run).iter().any(|c| {
            c.node == cert.node
                && c.identity == cert.identity
                && c.valid_from > cert.valid_from
                && c.state == "Available"
        })
    });
    match renewed {
        Some(_) => {
            let at = now();
            inj.back_at = Some(at);
            inj.notes.push(format!(
                "{} on {}: renewal due {:.0} s into the outage, renewed {:.1} s after the CA returned, {:.0} s before the old one expired",
                cert.identity,
                cert.node,
                cert.refresh_at() - inj.t0,
                at - ca_back,
                cert.expires - at
            ));
        }
        None => inj.problems.push(format!(
            "{} on {} not renewed within 60 s of the CA's return: {:?}",
            cert.identity,
            cert.node,
            certificates(&ctx.run)
        )),
    }
    if resynced(ctx).is_none() {
        inj.problems
            .push("a change made after the outage never reached the ztunnels".into());
    }
    inj
}

/// The latest event of each holder slot.
fn slots_open(workdir: &Path, after: f64) -> usize {
    let events = load::hold_events(workdir);
    (0..5)
        .filter(|s| {
            events
                .iter()
                .rev()
                .find(|e| e.slot == *s)
                .is_some_and(|e| e.event == "open" && e.at >= after)
        })
        .count()
}

fn policy_to_deny(ctx: &mut Ctx) -> Injected {
    let holder = ctx.layout.workdir("h1");
    let mut inj = Injected::default();
    if within(Duration::from_secs(20), || slots_open(&holder, 0.0) == 5).is_none() {
        inj.problems.push(format!(
            "holder has {} of 5 connections open",
            slots_open(&holder, 0.0)
        ));
        return inj;
    }
    inj.t0 = now();
    let out = apply(&ctx.run, "apply", &guard_policy("DENY"));
    if !out.status.success() {
        inj.problems.push(format!("apply DENY: {out:?}"));
        return inj;
    }
    let closed = |after: f64| {
        let events = load::hold_events(&holder);
        (0..5u32)
            .map(|s| {
                events
                    .iter()
                    .find(|e| e.slot == s && e.at >= after && e.event.starts_with("closed"))
                    .map(|e| e.at)
            })
            .collect::<Option<Vec<f64>>>()
    };
    let _ = within(Duration::from_secs(5), || closed(inj.t0).is_some());
    match closed(inj.t0) {
        Some(at) => {
            let worst = at.iter().copied().fold(0.0, f64::max) - inj.t0;
            let best = at.iter().copied().fold(f64::MAX, f64::min) - inj.t0;
            inj.notes.push(format!(
                "5 open connections closed {:.0} to {:.0} ms after the change",
                best * 1000.0,
                worst * 1000.0
            ));
            if worst > 1.0 {
                inj.problems
                    .push(format!("connections closed only after {worst:.2} s"));
            }
        }
        None => inj
            .problems
            .push("open connections not closed within 5 s".into()),
    }
    // While it denies, the holder's new connections are refused.
    std::thread::sleep(Duration::from_secs(2));
    let reopened = load::hold_events(&holder)
        .iter()
        .filter(|e| e.at >= inj.t0 + 1.0 && e.event == "open")
        .count();
    let tried = load::hold_events(&holder)
        .iter()
        .filter(|e| e.at >= inj.t0 + 1.0)
        .count();
    inj.extra = (tried as u64, 0);
    if reopened > 0 {
        inj.problems
            .push(format!("{reopened} new connections served under DENY"));
    }
    let back = now();
    let out = apply(&ctx.run, "apply", &guard_policy("ALLOW"));
    if !out.status.success() {
        inj.problems.push(format!("apply ALLOW: {out:?}"));
        return inj;
    }
    match within(Duration::from_secs(20), || slots_open(&holder, back) == 5) {
        Some(d) => {
            inj.back_at = Some(now());
            inj.notes.push(format!(
                "{tried} new connections refused under DENY; reopened {:.1} s after ALLOW",
                d.as_secs_f64()
            ));
        }
        None => inj
            .problems
            .push("holder not reconnected after ALLOW".into()),
    }
    inj
}

fn pod_churn(ctx: &mut Ctx) -> Injected {
    let text = crate::mesh::churn_pods(200, ctx.layout.ip("a1"));
    let mut inj = Injected {
        t0: now(),
        ..Injected::default()
    };
    let out = apply(&ctx.run, "apply", &text);
    let created = now();
    if !out.status.success() {
        inj.problems.push(format!(
            "apply 200 pods: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let churn = Layout::read(&ctx.run);
    ctx.enrolled.extend(churn.enrolled());
    let workdirs: Vec<_> = churn
        .pods
        .iter()
        .filter(|p| p.0.starts_with("churn-"))
        .map(|p| p.3.clone())
        .collect();
    all_protected(&ctx.run, &mut inj);
    let first = |w: &Path| std::fs::read_to_string(w.join("first")).ok();
    let _ = within(Duration::from_secs(20), || {
        workdirs.iter().all(|w| first(w).is_some())
    });
    let ok = workdirs
        .iter()
        .filter(|w| first(w).as_deref().map(str::trim) == Some("pong"))
        .count();
    inj.extra = (200, 200 - ok as u64);
    let out = apply(&ctx.run, "delete", &text);
    if !out.status.success() {
        inj.problems.push(format!("delete 200 pods: {out:?}"));
    }
    let deleted = now();
    let left = stdout(&ambit(&ctx.run, &["status"]))
        .lines()
        .filter(|l| l.contains("churn-"))
        .count();
    if left > 0 {
        inj.problems.push(format!("{left} churn pods left"));
    }
    inj.back_at = Some(deleted);
    inj.notes.push(format!(
        "{} pods created in {:.0} s, deleted in {:.0} s; their first connections: {ok} of 200 answered",
        workdirs.len(),
        created - inj.t0,
        deleted - created
    ));
    inj
}
