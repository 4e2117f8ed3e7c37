//! Golden-file tests of every renderer: the rendered text must equal
//! `tests/golden/<name>.golden` byte for byte. The spec-listed variants (`spec/cni.md` §3.2,
//! §3.7, §3.8, §3.9) were copied verbatim from the spec into their golden files.
//!
//! `UPDATE_GOLDEN=1 cargo test -p ambit-redirect --test golden` rewrites the files.

#![cfg(unix)]
// Test helpers outside #[test] fns: a panic is how they report failure.
#![allow(clippy::unwrap_used)]

use std::net::IpAddr;
use std::path::PathBuf;

use ambit_redirect::config::{Family, HostRulesConfig, PodRedirectConfig};
use ambit_redirect::iptables::{self, XtablesCmd};
use ambit_redirect::netlink::NetlinkItem;
use ambit_redirect::nft::{self, Op, Transaction};

fn pod(f: impl FnOnce(&mut PodRedirectConfig)) -> PodRedirectConfig {
    let mut c = PodRedirectConfig::default();
    f(&mut c);
    c
}

fn dns_off(c: &mut PodRedirectConfig) {
    c.dns_capture = false;
}
fn ingress(c: &mut PodRedirectConfig) {
    c.ingress_mode = true;
}
fn vifs(c: &mut PodRedirectConfig) {
    c.virtual_interfaces = vec!["tun0".parse().unwrap(), "tap1".parse().unwrap()];
}
fn v4_only(c: &mut PodRedirectConfig) {
    c.ipv6 = false;
}

fn ipt(c: PodRedirectConfig, f: Family) -> String {
    iptables::pod_rules(&c, f).render_restore()
}

fn argv_lines(cmds: impl IntoIterator<Item = Vec<String>>) -> String {
    cmds.into_iter().map(|a| a.join(" ") + "\n").collect()
}

fn xt(cmds: Vec<XtablesCmd>) -> String {
    argv_lines(cmds.iter().map(XtablesCmd::argv))
}

fn host(ipv6: bool) -> HostRulesConfig {
    HostRulesConfig {
        ipv6,
        kubelet_uid: 1000,
        ..HostRulesConfig::default()
    }
}

fn cases() -> Vec<(&'static str, String)> {
    use Family::{V4, V6};
    let p = PodRedirectConfig::default;
    vec![
        // iptables in-pod, §3.2 / §3.3
        ("iptables_v4_default", ipt(p(), V4)),
        ("iptables_v6_default", ipt(p(), V6)),
        ("iptables_v4_dns_off", ipt(pod(dns_off), V4)),
        ("iptables_v6_dns_off", ipt(pod(dns_off), V6)),
        ("iptables_v4_ingress", ipt(pod(ingress), V4)),
        ("iptables_v6_ingress", ipt(pod(ingress), V6)),
        ("iptables_v4_virtual_ifaces", ipt(pod(vifs), V4)),
        ("iptables_v6_virtual_ifaces", ipt(pod(vifs), V6)),
        (
            "iptables_v4_ingress_dns_off",
            ipt(
                pod(|c| {
                    ingress(c);
                    dns_off(c)
                }),
                V4,
            ),
        ),
        (
            "iptables_v4_ingress_virtual_ifaces",
            ipt(
                pod(|c| {
                    ingress(c);
                    vifs(c)
                }),
                V4,
            ),
        ),
        // AMBIENT_IPV6=false on a kernel with IPv6: the v6 restore is the fence
        ("iptables_v6_fence_ipv4_only", ipt(pod(v4_only), V6)),
        ("iptables_v4_delete", xt(iptables::pod_delete_commands(V4))),
        ("iptables_v6_delete", xt(iptables::pod_delete_commands(V6))),
        (
            "iptables_guardrails",
            argv_lines(iptables::guardrail_rules().iter().map(|r| r.add_args())),
        ),
        // nftables in-pod, §3.7
        ("nft_default_ipv6", nft::pod_transaction(&p()).render()),
        (
            "nft_ipv4_only",
            nft::pod_transaction(&pod(v4_only)).render(),
        ),
        ("nft_dns_off", nft::pod_transaction(&pod(dns_off)).render()),
        ("nft_ingress", nft::pod_transaction(&pod(ingress)).render()),
        (
            "nft_virtual_ifaces",
            nft::pod_transaction(&pod(vifs)).render(),
        ),
        (
            "nft_ingress_dns_off_ipv4_only",
            nft::pod_transaction(&pod(|c| {
                ingress(c);
                dns_off(c);
                v4_only(c)
            }))
            .render(),
        ),
        ("nft_delete", nft::pod_delete_transaction().render()),
        // netlink, §3.1
        (
            "netlink_apply",
            argv_lines(NetlinkItem::all(true).into_iter().map(|i| i.add().argv)),
        ),
        (
            "netlink_delete",
            argv_lines(NetlinkItem::all(true).into_iter().map(|i| i.delete().argv)),
        ),
        // host, §3.8 / §3.9
        (
            "host_iptables_v4",
            iptables::host_rules(&host(true), V4).render_restore(),
        ),
        (
            "host_iptables_v6",
            iptables::host_rules(&host(true), V6).render_restore(),
        ),
        (
            "host_iptables_v4_delete",
            xt(iptables::host_delete_commands(V4)),
        ),
        ("host_nft_ipv6", nft::host_transaction(&host(true)).render()),
        (
            "host_nft_ipv4",
            nft::host_transaction(&host(false)).render(),
        ),
        ("host_nft_flush", nft::host_flush_transaction().render()),
        ("host_nft_sets", {
            let mut tx: Transaction = nft::probe_sets_transaction(true);
            let ip: IpAddr = "10.244.1.5".parse().unwrap();
            tx.push(Op::AddElement(
                "istio-ambient-nat",
                "istio-inpod-probes-v4",
                ip,
                "<pod-uid>".into(),
            ));
            tx.render()
        }),
    ]
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

#[test]
fn goldens() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let mut failures = Vec::new();
    for (name, got) in cases() {
        let path = golden_dir().join(format!("{name}.golden"));
        if update {
            std::fs::write(&path, &got).unwrap();
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(want) if want == got => {}
            Ok(want) => failures.push(format!("{name}: mismatch\n--- want\n{want}--- got\n{got}")),
            Err(e) => failures.push(format!("{name}: {e} (run with UPDATE_GOLDEN=1)")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every golden file belongs to a case (no stale files left behind after a rename).
#[test]
fn no_orphan_goldens() {
    let names: Vec<String> = cases()
        .into_iter()
        .map(|(n, _)| format!("{n}.golden"))
        .collect();
    for entry in std::fs::read_dir(golden_dir()).unwrap() {
        let entry = entry.unwrap();
        // Subdirectories (`vm/`) belong to their own test binaries.
        if entry.file_type().unwrap().is_dir() {
            continue;
        }
        let file = entry.file_name().into_string().unwrap();
        assert!(names.contains(&file), "orphan golden file {file}");
    }
}
