//! Root tests: rules applied, verified, repaired and deleted inside throwaway network
//! namespaces (`amr*`). Nothing here touches the caller's own namespace: every command goes
//! through a runner bound to a namespace created by the test and deleted on drop.
//!
//! Without root these tests print "skip" and pass, unless `CI=true`, where they fail.

#![cfg(unix)]
// Test helpers outside #[test] fns: a panic is how they report failure.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use ambit_redirect::config::{Backend, Family, HostRulesConfig, PodRedirectConfig};
use ambit_redirect::iptables::save::Saved;
use ambit_redirect::iptables::{self, Table};
use ambit_redirect::netlink::NetlinkItem;
use ambit_redirect::{ApplyOutcome, Finding, HostRules, InPod, Nsenter, ProbeSet};

#[path = "support/testns.rs"]
mod testns;

use testns::{TestNs, root_or_skip};

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

fn cases() -> Vec<(Backend, Variant)> {
    let variants = [
        Variant::Default,
        Variant::Ipv4Only,
        Variant::DnsOff,
        Variant::Ingress,
        Variant::VirtualIfaces,
    ];
    [Backend::Iptables, Backend::Nftables]
        .into_iter()
        .flat_map(|b| variants.into_iter().map(move |v| (b, v)))
        .collect()
}

/// What the kernel holds, in a comparable form: per-chain rule counts of our chains
/// (iptables, both families) or of our nft tables, plus the netlink state.
fn snapshot(ns: &TestNs, backend: Backend) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    match backend {
        Backend::Iptables => {
            for (bin, fam) in [("iptables-save", "v4"), ("ip6tables-save", "v6")] {
                for ((t, c), n) in Saved::parse(&ns.sh(&[bin])).counts() {
                    m.insert(format!("{fam} {t}/{c}"), n);
                }
            }
        }
        Backend::Nftables => {
            let text = ns.sh(&["nft", "list", "ruleset"]);
            let mut chain = String::new();
            for line in text.lines().map(str::trim) {
                if let Some(rest) = line.strip_prefix("table ") {
                    chain = rest.trim_end_matches(" {").to_owned();
                } else if let Some(rest) = line.strip_prefix("chain ") {
                    chain = format!("{chain}/{}", rest.trim_end_matches(" {"));
                    m.insert(chain.clone(), 0);
                } else if !line.is_empty()
                    && line != "}"
                    && !line.starts_with("type ")
                    && m.contains_key(&chain)
                {
                    *m.get_mut(&chain).unwrap() += 1;
                }
            }
        }
    }
    m.insert(
        "ip rule".into(),
        ns.listing(&["ip", "rule", "show", "pref", "32764"])
            .lines()
            .count(),
    );
    m.insert(
        "ip -6 rule".into(),
        ns.listing(&["ip", "-6", "rule", "show", "pref", "32764"])
            .lines()
            .count(),
    );
    m.insert(
        "route 100".into(),
        ns.listing(&["ip", "route", "show", "table", "100"])
            .lines()
            .count(),
    );
    m.insert(
        "route6 100".into(),
        ns.listing(&["ip", "-6", "route", "show", "table", "100"])
            .lines()
            .count(),
    );
    m
}

fn assert_clean(pod: &InPod, ns: &TestNs, ctx: &str) {
    let report = pod.verify(&ns.runner()).unwrap();
    assert!(report.is_clean(), "{ctx}: {:#?}", report.findings);
}

#[test]
fn pod_apply_verify_reapply_delete() {
    if !root_or_skip("pod_apply_verify_reapply_delete") {
        return;
    }
    for (backend, variant) in cases() {
        let ctx = format!("{backend:?}/{variant:?}");
        let ns = TestNs::new();
        let r = ns.runner();
        let pod = InPod::new(backend, config(variant));

        let before = pod.verify(&r).unwrap();
        assert!(
            before.missing().count() > 0,
            "{ctx}: verify on an empty netns"
        );

        assert_eq!(pod.apply(&r).unwrap(), ApplyOutcome::Applied, "{ctx}");
        match backend {
            Backend::Iptables => {
                assert!(
                    ns.sh(&["iptables-save"]).contains("-A ISTIO_OUTPUT"),
                    "{ctx}"
                );
                let v6_capture = ns
                    .sh(&["ip6tables-save", "-t", "nat"])
                    .contains("-A ISTIO_OUTPUT");
                assert_eq!(v6_capture, pod.config.ipv6, "{ctx}: ip6tables capture");
                // IPv4-only: IPv6 is fenced instead (hole 10 of issue 12).
                let v6_fence = ns
                    .sh(&["ip6tables-save", "-t", "mangle"])
                    .contains("-A ISTIO_OUTPUT ! -o lo -j DROP");
                assert_eq!(v6_fence, !pod.config.ipv6, "{ctx}: ip6tables fence");
            }
            Backend::Nftables => {
                let rs = ns.sh(&["nft", "list", "ruleset"]);
                assert!(rs.contains("table inet istio-ambient-nat"), "{ctx}");
                assert_eq!(
                    rs.contains("table inet istio-ambient-raw"),
                    pod.config.dns_capture,
                    "{ctx}"
                );
            }
        }
        assert_clean(&pod, &ns, &ctx);

        let counts = snapshot(&ns, backend);
        let again = pod.apply(&r).unwrap();
        let expect = match backend {
            Backend::Iptables => ApplyOutcome::Unchanged,
            Backend::Nftables => ApplyOutcome::Applied,
        };
        assert_eq!(again, expect, "{ctx}: re-apply");
        assert_eq!(
            snapshot(&ns, backend),
            counts,
            "{ctx}: re-apply changed the rules"
        );
        assert_clean(&pod, &ns, &ctx);

        pod.delete(&r).unwrap();
        for bin in ["iptables-save", "ip6tables-save"] {
            assert!(
                !ns.sh(&[bin]).contains("ISTIO_"),
                "{ctx}: {bin} after delete"
            );
        }
        assert!(
            !ns.sh(&["nft", "list", "ruleset"]).contains("istio-ambient"),
            "{ctx}"
        );
        assert_eq!(
            ns.listing(&["ip", "rule", "show", "pref", "32764"]),
            "",
            "{ctx}"
        );
        assert_eq!(
            ns.listing(&["ip", "-6", "rule", "show", "pref", "32764"]),
            "",
            "{ctx}"
        );
        assert_eq!(
            ns.listing(&["ip", "route", "show", "table", "100"]),
            "",
            "{ctx}"
        );
        assert_eq!(
            ns.listing(&["ip", "-6", "route", "show", "table", "100"]),
            "",
            "{ctx}"
        );
        // Deleting twice is fine (un-enrol of an already clean pod).
        pod.delete(&r).unwrap();
    }
}

/// Remove one planned rule by hand and add a foreign one: verify names both, apply repairs.
#[test]
fn pod_tamper_verify_repair() {
    if !root_or_skip("pod_tamper_verify_repair") {
        return;
    }
    for (backend, variant) in cases() {
        let ctx = format!("{backend:?}/{variant:?}");
        let ns = TestNs::new();
        let r = ns.runner();
        let pod = InPod::new(backend, config(variant));
        pod.apply(&r).unwrap();

        ns.sh(&["ip", "rule", "del", "pref", "32764"]);
        let report = pod.verify(&r).unwrap();
        assert_eq!(
            report.findings,
            vec![Finding::MissingNetlink(NetlinkItem::Rule(Family::V4))],
            "{ctx}"
        );

        match backend {
            Backend::Iptables => {
                let plan = iptables::pod_rules(&pod.config, Family::V4);
                let victim = plan
                    .rules
                    .iter()
                    .find(|r| r.table == Table::Nat && r.chain.name() == "ISTIO_OUTPUT")
                    .unwrap();
                let mut del = vec!["iptables"];
                let args = victim.delete_args();
                del.extend(args.iter().map(String::as_str));
                ns.sh(&del);
                ns.sh(&[
                    "iptables",
                    "-t",
                    "nat",
                    "-A",
                    "ISTIO_PRERT",
                    "-p",
                    "udp",
                    "-j",
                    "RETURN",
                ]);
                let report = pod.verify(&r).unwrap();
                let missing: Vec<_> = report
                    .findings
                    .iter()
                    .filter_map(|f| match f {
                        Finding::MissingRule { rule, .. } => Some(rule.clone()),
                        _ => None,
                    })
                    .collect();
                assert_eq!(missing, vec![victim.restore_line()], "{ctx}: {report:#?}");
                let extra: Vec<_> = report
                    .findings
                    .iter()
                    .filter_map(|f| match f {
                        Finding::ExtraRule { rule, .. } => Some(rule.clone()),
                        _ => None,
                    })
                    .collect();
                assert_eq!(
                    extra,
                    vec![Some("-A ISTIO_PRERT -p udp -j RETURN".to_owned())],
                    "{ctx}: {report:#?}"
                );
                // A leftover chain of another version, with its jump: reported and swept.
                ns.sh(&["iptables", "-t", "nat", "-N", "ISTIO_OLD"]);
                ns.sh(&["iptables", "-t", "nat", "-A", "OUTPUT", "-j", "ISTIO_OLD"]);
                let report = pod.verify(&r).unwrap();
                assert!(
                    report
                        .findings
                        .iter()
                        .any(|f| matches!(f, Finding::ExtraChain(at) if at.chain == "ISTIO_OLD")),
                    "{ctx}: {report:#?}"
                );
                assert_eq!(pod.apply(&r).unwrap(), ApplyOutcome::Reconciled, "{ctx}");
                assert!(!ns.sh(&["iptables-save"]).contains("ISTIO_OLD"), "{ctx}");
                let filter = ns.sh(&["iptables-save", "-t", "filter"]);
                assert!(
                    !filter.contains("DROP"),
                    "{ctx}: guardrails left behind:\n{filter}"
                );
            }
            Backend::Nftables => {
                let listing = ns.sh(&[
                    "nft",
                    "-a",
                    "list",
                    "chain",
                    "inet",
                    "istio-ambient-nat",
                    "istio-output",
                ]);
                let handle = listing
                    .lines()
                    .filter(|l| l.contains("counter"))
                    .find_map(|l| l.rsplit_once("# handle ").map(|(_, h)| h.trim().to_owned()))
                    .unwrap();
                ns.sh(&[
                    "nft",
                    "delete",
                    "rule",
                    "inet",
                    "istio-ambient-nat",
                    "istio-output",
                    "handle",
                    &handle,
                ]);
                ns.sh(&["nft", "add", "chain", "inet", "istio-ambient-nat", "stray"]);
                let report = pod.verify(&r).unwrap();
                assert!(
                    report.findings.iter().any(|f| matches!(f,
                        Finding::RuleCount { at, expected, found }
                            if at.chain == "istio-output" && found + 1 == *expected)),
                    "{ctx}: {report:#?}"
                );
                assert!(
                    report
                        .findings
                        .iter()
                        .any(|f| matches!(f, Finding::ExtraChain(at) if at.chain == "stray")),
                    "{ctx}: {report:#?}"
                );
                assert_eq!(pod.apply(&r).unwrap(), ApplyOutcome::Applied, "{ctx}");
                // `flush table` keeps chains; a stray chain of ours survives and stays reported.
                ns.sh(&[
                    "nft",
                    "delete",
                    "chain",
                    "inet",
                    "istio-ambient-nat",
                    "stray",
                ]);
            }
        }
        assert_clean(&pod, &ns, &ctx);
    }
}

/// Host rules in a namespace standing in for the node, with its probe set.
#[test]
fn host_rules_apply_verify_delete() {
    if !root_or_skip("host_rules_apply_verify_delete") {
        return;
    }
    for backend in [Backend::Iptables, Backend::Nftables] {
        for ipv6 in [true, false] {
            let ctx = format!("{backend:?} ipv6={ipv6}");
            let ns = TestNs::new();
            // Exercise the nsenter runner too.
            let r = Nsenter { path: ns.path() };
            let host = HostRules {
                backend,
                config: HostRulesConfig {
                    ipv6,
                    kubelet_uid: 1000,
                    ..HostRulesConfig::default()
                },
            };
            let set = ProbeSet::new(r.clone(), backend, ipv6);
            set.ensure().unwrap();
            set.upsert("10.244.1.5".parse().unwrap(), "uid-a").unwrap();
            host.apply(&r).unwrap();
            // Host rules are delete-then-create: applying twice leaves one copy.
            host.apply(&r).unwrap();
            let report = host.verify(&r).unwrap();
            assert!(report.is_clean(), "{ctx}: {:#?}", report.findings);
            match backend {
                Backend::Iptables => {
                    let nat = ns.sh(&["iptables-save", "-t", "nat"]);
                    assert_eq!(nat.matches("-j ISTIO_POSTRT").count(), 1, "{ctx}:\n{nat}");
                    assert!(
                        nat.contains("--match-set istio-inpod-probes-v4 dst"),
                        "{ctx}:\n{nat}"
                    );
                    let nat6 = ns.sh(&["ip6tables-save", "-t", "nat"]);
                    assert_eq!(
                        nat6.contains("istio-inpod-probes-v6"),
                        ipv6,
                        "{ctx}:\n{nat6}"
                    );
                }
                Backend::Nftables => {
                    let t = ns.sh(&["nft", "list", "table", "inet", "istio-ambient-nat"]);
                    assert!(
                        t.contains("skuid 1000 ip daddr @istio-inpod-probes-v4"),
                        "{ctx}:\n{t}"
                    );
                }
            }
            host.delete(&r).unwrap();
            assert!(
                !host.verify(&r).unwrap().is_clean(),
                "{ctx}: verify after delete"
            );
            assert!(!ns.sh(&["iptables-save"]).contains("ISTIO_POSTRT"), "{ctx}");
            // Rule removal keeps the set and its entries.
            let entries = set.list().unwrap();
            assert_eq!(
                entries,
                vec![("10.244.1.5".parse().unwrap(), "uid-a".to_owned())],
                "{ctx}"
            );
            set.destroy().unwrap();
            assert!(set.list().is_err(), "{ctx}: set still listed after destroy");
            assert!(
                !ns.sh(&["nft", "list", "ruleset"]).contains("istio-ambient"),
                "{ctx}"
            );
        }
    }
}

/// Replace-on-upsert, remove-only-by-owner, mapped addresses, prune, flush; sets are per
/// namespace.
#[test]
fn probe_set_semantics() {
    if !root_or_skip("probe_set_semantics") {
        return;
    }
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    for backend in [Backend::Iptables, Backend::Nftables] {
        let ctx = format!("{backend:?}");
        let ns = TestNs::new();
        let other = TestNs::new();
        let set = ProbeSet::new(ns.runner(), backend, true);
        set.ensure().unwrap();
        set.ensure().unwrap();
        let sorted = |mut v: Vec<(IpAddr, String)>| {
            v.sort();
            v
        };

        set.upsert(ip("10.0.0.1"), "pod-a").unwrap();
        set.upsert(ip("10.0.0.1"), "pod-b").unwrap();
        set.upsert(ip("10.0.0.1"), "pod-b").unwrap();
        assert_eq!(
            set.list().unwrap(),
            vec![(ip("10.0.0.1"), "pod-b".into())],
            "{ctx}: replace"
        );

        assert!(
            !set.remove(ip("10.0.0.1"), "pod-a").unwrap(),
            "{ctx}: foreign remove"
        );
        assert_eq!(set.list().unwrap().len(), 1, "{ctx}");
        assert!(
            set.remove(ip("10.0.0.1"), "pod-b").unwrap(),
            "{ctx}: own remove"
        );
        assert!(set.list().unwrap().is_empty(), "{ctx}");
        assert!(
            !set.remove(ip("10.0.0.1"), "pod-b").unwrap(),
            "{ctx}: remove absent"
        );

        set.upsert(ip("::ffff:10.0.0.9"), "pod-m").unwrap();
        set.upsert(ip("fd00::5"), "pod-6").unwrap();
        set.upsert(ip("10.0.0.2"), "pod-k").unwrap();
        assert_eq!(
            sorted(set.list().unwrap()),
            vec![
                (ip("10.0.0.2"), "pod-k".into()),
                (ip("10.0.0.9"), "pod-m".into()),
                (ip("fd00::5"), "pod-6".into()),
            ],
            "{ctx}: mapped v4 stored as v4"
        );

        // Sets are per netns: the sibling namespace sees none of it.
        match backend {
            Backend::Iptables => assert_eq!(other.sh(&["ipset", "list", "-n"]), "", "{ctx}"),
            Backend::Nftables => assert_eq!(other.sh(&["nft", "list", "ruleset"]), "", "{ctx}"),
        }

        let keep: HashSet<IpAddr> = [ip("10.0.0.2")].into();
        assert_eq!(set.prune(&keep).unwrap(), 2, "{ctx}");
        assert_eq!(
            set.list().unwrap(),
            vec![(ip("10.0.0.2"), "pod-k".into())],
            "{ctx}"
        );

        set.flush().unwrap();
        assert!(set.list().unwrap().is_empty(), "{ctx}");

        let v4only = ProbeSet::new(ns.runner(), backend, false);
        assert!(v4only.upsert(ip("fd00::1"), "x").is_err(), "{ctx}");
        assert!(set.upsert(ip("10.0.0.3"), "bad\"uid").is_err(), "{ctx}");
        set.destroy().unwrap();
    }
}

/// Issue 12, hole 10: a dual-stack pod enrolled with `AMBIENT_IPV6=false` gets no IPv6
/// capture, so its IPv6 would go around ztunnel. The in-pod rules drop every IPv6 packet not
/// on loopback instead (both backends); un-enrolment lifts the fence.
#[test]
fn ipv6_is_fenced_when_enrolment_is_ipv4_only() {
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::time::Duration;

    use ambit_netns::{NetnsFd, in_netns};

    if !root_or_skip("ipv6_is_fenced_when_enrolment_is_ipv4_only") {
        return;
    }
    let connect = |ns: &NetnsFd, to: SocketAddr| {
        in_netns(ns, || {
            TcpStream::connect_timeout(&to, Duration::from_millis(500))
        })
        .unwrap()
        .is_ok()
    };
    for backend in [Backend::Iptables, Backend::Nftables] {
        let pod = TestNs::new();
        let peer = TestNs::new();
        pod.sh(&[
            "ip", "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", &peer.name,
        ]);
        for (ns, dev, addr) in [
            (&pod, "va", "fd00:aa::1/64"),
            (&peer, "vb", "fd00:aa::2/64"),
        ] {
            ns.sh(&["ip", "-6", "addr", "add", addr, "dev", dev, "nodad"]);
            ns.sh(&["ip", "link", "set", dev, "up"]);
        }
        let (pod_fd, peer_fd) = (
            NetnsFd::open(pod.path()).unwrap(),
            NetnsFd::open(peer.path()).unwrap(),
        );
        let remote: SocketAddr = "[fd00:aa::2]:8080".parse().unwrap();
        let local: SocketAddr = "[::1]:8081".parse().unwrap();
        let _remote_listener = in_netns(&peer_fd, || TcpListener::bind(remote))
            .unwrap()
            .unwrap();
        let _local_listener = in_netns(&pod_fd, || TcpListener::bind(local))
            .unwrap()
            .unwrap();
        // The veth needs a moment for carrier: poll with a deadline.
        ambit_testkit::eventually_blocking(
            &format!("{backend:?}: an IPv6 path before enrolment"),
            Duration::from_secs(5),
            || connect(&pod_fd, remote),
        );

        let inpod = InPod::new(
            backend,
            PodRedirectConfig {
                ipv6: false,
                ..PodRedirectConfig::default()
            },
        );
        inpod.apply(&pod.runner()).unwrap();
        assert!(
            !connect(&pod_fd, remote),
            "{backend:?}: IPv6 went around the capture"
        );
        assert!(
            connect(&pod_fd, local),
            "{backend:?}: IPv6 loopback must keep working"
        );
        let report = inpod.verify(&pod.runner()).unwrap();
        assert!(
            report.findings.is_empty(),
            "{backend:?}: {:?}",
            report.findings
        );

        inpod.delete(&pod.runner()).unwrap();
        assert!(
            connect(&pod_fd, remote),
            "{backend:?}: fence left after un-enrolment"
        );
    }
}
