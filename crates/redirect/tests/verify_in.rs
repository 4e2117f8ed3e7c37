//! Root tests of `InPod::verify_in`, the in-process verification the agent runs every pass:
//! for both backends and every rule variant it must report exactly what the process-based
//! `InPod::verify` reports, on a clean pod and after every kind of drift (a deleted rule
//! in each chain, a foreign rule or chain, a missing routing rule or route, a changed
//! sysctl), and on an unchanged pod it must start no process at all.
//!
//! Each case runs in its own anonymous network namespace (gone when its fd closes, also on
//! a panic); nothing runs in the test's own namespace. Fails under `CI=true` without the
//! privilege.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
// Test helpers outside #[test] fns: a panic is how they report failure.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use ambit_netns::NetnsFd;
use ambit_redirect::config::{Backend, Family, PodRedirectConfig};
use ambit_redirect::iptables::{self, Chain, Table};
use ambit_redirect::nft;
use ambit_redirect::{
    Cmd, CmdOutput, InPod, NetnsRunner, RulesMark, RunError, VerifyMemo, VerifyReport, Visit,
};

/// Runs commands in a namespace held by fd, counting them; `legacy` swaps the iptables
/// tools for their legacy (x_tables) variant.
#[derive(Debug)]
struct Ns {
    fd: NetnsFd,
    legacy: bool,
    commands: AtomicUsize,
}

impl Ns {
    fn new(legacy: bool) -> Self {
        let ns = Ns {
            fd: NetnsFd::create_anonymous().unwrap(),
            legacy,
            commands: AtomicUsize::new(0),
        };
        // Pods have lo up; the IPv6 local route needs it.
        ns.sh(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    /// Run in the namespace, require success, return stdout.
    fn sh(&self, argv: &[&str]) -> String {
        self.run_ok(&Cmd::new(argv.iter().copied()))
            .unwrap_or_else(|e| panic!("{e}"))
            .stdout
    }

    fn count(&self) -> usize {
        self.commands.load(Ordering::Relaxed)
    }
}

impl NetnsRunner for Ns {
    fn run(&self, cmd: &Cmd) -> Result<CmdOutput, RunError> {
        self.commands.fetch_add(1, Ordering::Relaxed);
        let mut argv = cmd.argv.clone();
        if self.legacy {
            let tool = &mut argv[0];
            for base in ["iptables", "ip6tables"] {
                for suffix in ["", "-save", "-restore"] {
                    if *tool == format!("{base}{suffix}") {
                        *tool = format!("{base}-legacy{suffix}");
                    }
                }
            }
        }
        let err = |source| RunError::Spawn {
            argv: argv.join(" "),
            source,
        };
        let mut c = Command::new(&argv[0]);
        c.args(&argv[1..])
            .stdin(if cmd.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        ambit_netns::set_command_netns(&mut c, &self.fd).unwrap();
        let mut child = c.spawn().map_err(err)?;
        if let (Some(input), Some(mut pipe)) = (cmd.stdin.as_deref(), child.stdin.take()) {
            use std::io::Write as _;
            pipe.write_all(input.as_bytes()).map_err(err)?;
        }
        let out = child.wait_with_output().map_err(err)?;
        Ok(CmdOutput {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

#[derive(Debug, Clone, Copy)]
enum Variant {
    Default,
    Ipv4Only,
    DnsOff,
    Ingress,
    VirtualIfaces,
}

fn config(v: Variant) -> PodRedirectConfig {
    let mut c = PodRedirectConfig::default();
    match v {
        Variant::Default => {}
        Variant::Ipv4Only => c.ipv6 = false,
        Variant::DnsOff => c.dns_capture = false,
        Variant::Ingress => c.ingress_mode = true,
        Variant::VirtualIfaces => {
            c.virtual_interfaces = vec!["tun0".parse().unwrap(), "tap1".parse().unwrap()]
        }
    }
    c
}

const VARIANTS: [Variant; 5] = [
    Variant::Default,
    Variant::Ipv4Only,
    Variant::DnsOff,
    Variant::Ingress,
    Variant::VirtualIfaces,
];

/// What a drift must be reported as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Something planned is missing: protection is incomplete.
    Missing,
    /// Only something unplanned was added.
    Extra,
    /// Nothing to report (the change removed what the plan no longer requires).
    Clean,
}

impl Expect {
    /// What `report` reports a drift as.
    fn of(report: &VerifyReport) -> Self {
        if report.missing().count() > 0 {
            Expect::Missing
        } else if report.is_clean() {
            Expect::Clean
        } else {
            Expect::Extra
        }
    }
}

/// One change to a pod's kernel state, as the commands that make it.
#[derive(Debug)]
struct Drift {
    what: String,
    commands: Vec<Vec<String>>,
    expect: Expect,
}

fn drift(what: impl Into<String>, expect: Expect, commands: Vec<Vec<String>>) -> Drift {
    Drift {
        what: what.into(),
        commands,
        expect,
    }
}

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|s| (*s).to_owned()).collect()
}

/// Stands for `nft delete rule inet T C handle H` of the chain's first rule, whose handle
/// is only known once the rules are (re)written.
const DELETE_FIRST_NFT_RULE: &str = "delete-first-nft-rule";

/// Runs one drift command; see [`DELETE_FIRST_NFT_RULE`].
fn run_drift(ns: &Ns, command: &[String]) {
    let words: Vec<&str> = command.iter().map(String::as_str).collect();
    if let [DELETE_FIRST_NFT_RULE, table, chain] = words.as_slice() {
        let listing = ns.sh(&["nft", "-a", "list", "chain", "inet", table, chain]);
        let handle = listing
            .lines()
            .filter(|l| !l.trim_start().starts_with("chain ") && !l.contains("type "))
            .find_map(|l| l.rsplit_once("# handle ").map(|(_, h)| h.trim().to_owned()))
            .unwrap_or_else(|| panic!("no rule in {table}/{chain}:\n{listing}"));
        ns.sh(&[
            "nft", "delete", "rule", "inet", table, chain, "handle", &handle,
        ]);
    } else {
        ns.sh(&words);
    }
}

/// Every drift that applies to `pod`.
fn drifts(pod: &InPod) -> Vec<Drift> {
    let mut v = Vec::new();
    match pod.backend {
        Backend::Iptables => {
            // IPv4-only pods get the IPv6 fence rules too, on a kernel with IPv6.
            let families: &[Family] =
                if pod.config.ipv6 || std::path::Path::new("/proc/sys/net/ipv6").exists() {
                    &[Family::V4, Family::V6]
                } else {
                    &[Family::V4]
                };
            for &family in families {
                let plan = iptables::pod_rules(&pod.config, family);
                let mut seen: Vec<(Table, Chain)> = Vec::new();
                for rule in &plan.rules {
                    if seen.contains(&(rule.table, rule.chain)) {
                        continue;
                    }
                    seen.push((rule.table, rule.chain));
                    let mut del = vec![iptables::binary(family).to_owned()];
                    del.extend(rule.delete_args());
                    v.push(drift(
                        format!("{family:?} delete {}", rule.restore_line()),
                        Expect::Missing,
                        vec![del],
                    ));
                }
                let bin = iptables::binary(family);
                let ours = plan.rules.iter().find(|r| !r.chain.is_builtin()).unwrap();
                v.push(drift(
                    format!(
                        "{family:?} foreign rule in {}/{}",
                        ours.table.name(),
                        ours.chain.name()
                    ),
                    Expect::Extra,
                    vec![argv(&[
                        bin,
                        "-t",
                        ours.table.name(),
                        "-A",
                        ours.chain.name(),
                        "-p",
                        "udp",
                        "-j",
                        "RETURN",
                    ])],
                ));
                v.push(drift(
                    format!("{family:?} leftover chain with a jump"),
                    Expect::Extra,
                    vec![
                        argv(&[bin, "-t", "nat", "-N", "ISTIO_OLD"]),
                        argv(&[bin, "-t", "nat", "-A", "OUTPUT", "-j", "ISTIO_OLD"]),
                    ],
                ));
            }
        }
        Backend::Nftables => {
            for table in nft::pod_tables(&pod.config) {
                let table = table.effective();
                for chain in &table.chains {
                    v.push(drift(
                        format!("delete first rule of {}/{}", table.name, chain.name),
                        Expect::Missing,
                        vec![argv(&[DELETE_FIRST_NFT_RULE, table.name, chain.name])],
                    ));
                }
            }
            v.push(drift(
                "stray chain in our nat table",
                Expect::Extra,
                vec![argv(&[
                    "nft",
                    "add",
                    "chain",
                    "inet",
                    "istio-ambient-nat",
                    "stray",
                ])],
            ));
        }
    }
    v.push(drift(
        "ip rule deleted",
        Expect::Missing,
        vec![argv(&["ip", "rule", "del", "pref", "32764"])],
    ));
    v.push(drift(
        "table 100 route deleted",
        Expect::Missing,
        vec![argv(&[
            "ip",
            "route",
            "del",
            "local",
            "0.0.0.0/0",
            "dev",
            "lo",
            "table",
            "100",
        ])],
    ));
    if pod.config.ipv6 {
        v.push(drift(
            "ip -6 rule deleted",
            Expect::Missing,
            vec![argv(&["ip", "-6", "rule", "del", "pref", "32764"])],
        ));
        v.push(drift(
            "table 100 v6 route deleted",
            Expect::Missing,
            vec![argv(&[
                "ip", "-6", "route", "del", "local", "::/0", "dev", "lo", "table", "100",
            ])],
        ));
        // IPv6 off on lo takes the v6 local route with it; then none is expected (read in
        // the test's own namespace, where lo has IPv6, the sysctl would say otherwise)...
        v.push(drift(
            "lo disable_ipv6=1",
            Expect::Clean,
            vec![argv(&["sysctl", "-w", "net.ipv6.conf.lo.disable_ipv6=1"])],
        ));
        // ...and once it is back on, the route is missing.
        v.push(drift(
            "lo disable_ipv6=1 then 0",
            Expect::Missing,
            vec![
                argv(&["sysctl", "-w", "net.ipv6.conf.lo.disable_ipv6=1"]),
                argv(&["sysctl", "-w", "net.ipv6.conf.lo.disable_ipv6=0"]),
            ],
        ));
    }
    v
}

fn assert_same(pod: &InPod, ns: &Ns, memo: &VerifyMemo, ctx: &str) -> VerifyReport {
    let fast = pod.verify_in(&ns.fd, ns, memo).unwrap();
    let reference = pod.verify(ns).unwrap();
    assert_eq!(fast, reference, "{ctx}: verify_in differs from verify");
    // Asked again, with whatever it memoised: still the same.
    let again = pod.verify_in(&ns.fd, ns, memo).unwrap();
    assert_eq!(
        again, reference,
        "{ctx}: verify_in differs on the second call"
    );
    reference
}

/// A clean pod verifies clean and, once its verdict is known, costs no process.
fn assert_clean_and_free(pod: &InPod, ns: &Ns, memo: &VerifyMemo, ctx: &str) {
    let report = assert_same(pod, ns, memo, ctx);
    assert!(report.is_clean(), "{ctx}: {:#?}", report.findings);
    let before = ns.count();
    let report = pod.verify_in(&ns.fd, ns, memo).unwrap();
    assert!(report.is_clean(), "{ctx}: {:#?}", report.findings);
    assert_eq!(
        ns.count(),
        before,
        "{ctx}: an unchanged pod started processes"
    );
}

#[test]
fn verify_in_reports_what_verify_reports_on_every_drift() {
    if !ambit_netns::testing::netns_capable_or_skip(
        "verify_in_reports_what_verify_reports_on_every_drift",
    ) {
        return;
    }
    for backend in [Backend::Iptables, Backend::Nftables] {
        for variant in VARIANTS {
            let pod = InPod::new(backend, config(variant));
            let ctx = format!("{backend:?}/{variant:?}");
            let ns = Ns::new(false);
            let memo = VerifyMemo::default();
            let empty = pod.verify_in(&ns.fd, &ns, &memo).unwrap();
            assert_eq!(empty, pod.verify(&ns).unwrap(), "{ctx}: empty namespace");
            assert!(empty.missing().count() > 0, "{ctx}: empty namespace");
            pod.apply(&ns).unwrap();
            assert_clean_and_free(&pod, &ns, &memo, &ctx);
            // Repaired after a drift, the pod is clean and free again.
            run_drift(&ns, &drifts(&pod)[0].commands[0]);
            pod.apply(&ns).unwrap();
            assert_clean_and_free(&pod, &ns, &memo, &format!("{ctx}, repaired"));
            drop(ns);

            // Each drift in a fresh namespace (cheaper than a reconciling repair), after a
            // clean verdict was memoised: the memo must not hide it.
            for d in drifts(&pod) {
                let ctx = format!("{ctx}: {}", d.what);
                let ns = Ns::new(false);
                let memo = VerifyMemo::default();
                pod.apply(&ns).unwrap();
                assert!(
                    pod.verify_in(&ns.fd, &ns, &memo).unwrap().is_clean(),
                    "{ctx}"
                );
                for c in &d.commands {
                    run_drift(&ns, c);
                }
                let report = assert_same(&pod, &ns, &memo, &ctx);
                assert_eq!(
                    Expect::of(&report),
                    d.expect,
                    "{ctx}: {:#?}",
                    report.findings
                );
            }
        }
    }
}

/// With the legacy iptables variant the rules are not in nf_tables, so no verdict may be
/// reused: every pass runs the tools, and a deleted rule is still found.
#[test]
fn legacy_iptables_is_verified_by_the_tools_every_time() {
    if !ambit_netns::testing::netns_capable_or_skip(
        "legacy_iptables_is_verified_by_the_tools_every_time",
    ) {
        return;
    }
    let pod = InPod::new(Backend::Iptables, config(Variant::Ipv4Only));
    let ns = Ns::new(true);
    pod.apply(&ns).unwrap();
    let memo = VerifyMemo::default();
    for _ in 0..2 {
        let before = ns.count();
        let report = pod.verify_in(&ns.fd, &ns, &memo).unwrap();
        assert!(report.is_clean(), "{:#?}", report.findings);
        assert!(
            ns.count() > before,
            "legacy rules were not checked by the tools"
        );
        assert_eq!(memo.verdicts(), 0);
    }
    assert!(
        !ns.sh(&["iptables-legacy-save"]).is_empty() && ns.sh(&["iptables-nft-save"]).is_empty(),
        "the rules are expected in x_tables only"
    );
    let plan = iptables::pod_rules(&pod.config, Family::V4);
    let victim = plan.rules.last().unwrap();
    let mut del = vec!["iptables"];
    let args = victim.delete_args();
    del.extend(args.iter().map(String::as_str));
    ns.sh(&del);
    let report = pod.verify_in(&ns.fd, &ns, &memo).unwrap();
    assert_eq!(report, pod.verify(&ns).unwrap());
    assert!(report.missing().count() > 0, "{report:#?}");
}

/// One `verify_here` visit to `ns` with the pod's mark, from this thread.
fn visit(pod: &InPod, ns: &Ns, memo: &VerifyMemo, mark: &RulesMark) -> Visit {
    ambit_netns::in_netns(&ns.fd, || pod.verify_here(ns, memo, mark))
        .unwrap()
        .unwrap()
}

/// The agent visits each pod with the pod's `RulesMark`: once a visit found its rules
/// complete, the next ones do not read the rulesets again while the namespace's nf_tables
/// generation stays; any commit there (every drift, and a change with its undo) makes the
/// next visit read and judge them, and routing and the sysctl are read every time. With or
/// without reading, a visit reports exactly what `InPod::verify` reports.
#[test]
fn a_marked_pod_is_read_again_after_any_commit() {
    if !ambit_netns::testing::netns_capable_or_skip("a_marked_pod_is_read_again_after_any_commit") {
        return;
    }
    for backend in [Backend::Iptables, Backend::Nftables] {
        let pod = InPod::new(backend, config(Variant::Default));
        let memo = VerifyMemo::default();
        let ctx = format!("{backend:?}");
        let ns = Ns::new(false);
        pod.apply(&ns).unwrap();
        let mark = RulesMark::default();
        let first = visit(&pod, &ns, &memo, &mark);
        assert!(
            first.report.is_clean() && !first.unchanged,
            "{ctx}: {first:#?}"
        );
        let before = ns.count();
        let again = visit(&pod, &ns, &memo, &mark);
        assert!(
            again.report.is_clean() && again.unchanged,
            "{ctx}: {again:#?}"
        );
        assert_eq!(
            ns.count(),
            before,
            "{ctx}: an unchanged pod started processes"
        );
        bump_generation(&ns);
        let bumped = visit(&pod, &ns, &memo, &mark);
        assert!(
            bumped.report.is_clean() && !bumped.unchanged,
            "{ctx}: after a change and its undo: {bumped:#?}"
        );
        drop(ns);

        for d in drifts(&pod) {
            let ctx = format!("{ctx}: {}", d.what);
            let ns = Ns::new(false);
            pod.apply(&ns).unwrap();
            let mark = RulesMark::default();
            visit(&pod, &ns, &memo, &mark);
            assert!(visit(&pod, &ns, &memo, &mark).unchanged, "{ctx}");
            for c in &d.commands {
                run_drift(&ns, c);
            }
            let found = visit(&pod, &ns, &memo, &mark);
            assert_eq!(found.report, pod.verify(&ns).unwrap(), "{ctx}");
            let kernel_tables = !matches!(d.commands[0][0].as_str(), "ip" | "sysctl");
            assert_eq!(
                found.unchanged, !kernel_tables,
                "{ctx}: read again only after a commit"
            );
            assert_eq!(Expect::of(&found.report), d.expect, "{ctx}: {found:#?}");
            if d.expect == Expect::Missing {
                // Still missing on the next visit: a finding never leaves a mark behind.
                let next = visit(&pod, &ns, &memo, &mark);
                assert_eq!(next.report, found.report, "{ctx}: the next visit");
            }
        }
    }
}

/// Moves `ns`'s nf_tables generation without changing any ruleset: a commit that adds a
/// table and one that deletes it again.
fn bump_generation(ns: &Ns) {
    ns.sh(&["nft", "add", "table", "inet", "verify-in-bump"]);
    ns.sh(&["nft", "delete", "table", "inet", "verify-in-bump"]);
}

/// The agent keeps one memo for all its pods: a verdict the rule tools gave on one pod
/// serves every other pod whose rules read the same, whatever its generation (pods are
/// enrolled, guarded and repaired at different moments), so a node's first pass over
/// freshly enrolled pods costs no process per pod. A pod whose rules differ in any way is
/// still judged by the tools: every drift is found on the second pod while the first one,
/// unchanged, stays free.
#[test]
fn one_verdict_serves_every_pod_with_the_same_rules() {
    if !ambit_netns::testing::netns_capable_or_skip(
        "one_verdict_serves_every_pod_with_the_same_rules",
    ) {
        return;
    }
    for variant in [Variant::Default, Variant::Ipv4Only] {
        let pod = InPod::new(Backend::Iptables, config(variant));
        let ctx = format!("{variant:?}");
        let first = Ns::new(false);
        pod.apply(&first).unwrap();
        let memo = VerifyMemo::default();
        assert_clean_and_free(&pod, &first, &memo, &ctx);
        for d in drifts(&pod) {
            let ctx = format!("{ctx}: {}", d.what);
            let other = Ns::new(false);
            pod.apply(&other).unwrap();
            bump_generation(&other);
            let before = other.count();
            let report = pod.verify_in(&other.fd, &other, &memo).unwrap();
            assert!(report.is_clean(), "{ctx}: {:#?}", report.findings);
            assert_eq!(
                other.count(),
                before,
                "{ctx}: a pod with the same rules as a judged one started processes"
            );
            for c in &d.commands {
                run_drift(&other, c);
            }
            let report = assert_same(&pod, &other, &memo, &ctx);
            assert_eq!(
                Expect::of(&report),
                d.expect,
                "{ctx}: {:#?}",
                report.findings
            );
            let before = first.count();
            assert!(
                pod.verify_in(&first.fd, &first, &memo).unwrap().is_clean(),
                "{ctx}: the unchanged pod"
            );
            assert_eq!(
                first.count(),
                before,
                "{ctx}: the unchanged pod lost its verdict"
            );
        }
    }
}
