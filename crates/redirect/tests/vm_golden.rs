//! Golden-file tests of the VM rules (`ambit vm up`, `docs/vm.md`): the rendered text must
//! equal `tests/golden/vm/<name>.golden` byte for byte.
//!
//! `UPDATE_GOLDEN=1 cargo test -p ambit-redirect --test vm_golden` rewrites the files.

// The Linux rules exist on Unix only.
#![cfg(unix)]
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use ambit_redirect::config::Family;
use ambit_redirect::iptables::XtablesCmd;
use ambit_redirect::vm::{
    self, InboundCapture, OutboundCapture, VmRedirectConfig, vm_delete_commands,
};

fn cfg(f: impl FnOnce(&mut VmRedirectConfig)) -> VmRedirectConfig {
    let mut c = VmRedirectConfig::default();
    f(&mut c);
    c
}

/// Listed ports and networks both ways, exclusions, no DNS capture.
fn listed(c: &mut VmRedirectConfig) {
    c.inbound = InboundCapture::Ports(vec![8080, 9090]);
    c.outbound = OutboundCapture::Cidrs(vec![
        "10.96.0.0/12".parse().unwrap(),
        "fd00::/8".parse().unwrap(),
    ]);
    c.outbound_exclude_cidrs = vec![
        "10.96.0.1/32".parse().unwrap(),
        "fd00::1/128".parse().unwrap(),
    ];
    c.outbound_exclude_ports = vec![5432];
    c.dns_capture = false;
    c.exclude_interfaces = vec!["eth9".parse().unwrap()];
}

/// An empty `ISTIO_INBOUND_PORTS` and `ISTIO_SERVICE_CIDR`, IPv4 only.
fn nothing(c: &mut VmRedirectConfig) {
    c.inbound = InboundCapture::None;
    c.outbound = OutboundCapture::None;
    c.ipv6 = false;
}

fn ipt(c: VmRedirectConfig, f: Family) -> String {
    vm::vm_rules(&c, f).render_restore()
}

fn xt(cmds: Vec<XtablesCmd>) -> String {
    cmds.iter().map(|c| c.argv().join(" ") + "\n").collect()
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/vm")
}

fn cases() -> Vec<(&'static str, String)> {
    use Family::{V4, V6};
    let d = VmRedirectConfig::default;
    vec![
        ("iptables_v4_default", ipt(d(), V4)),
        ("iptables_v6_default", ipt(d(), V6)),
        ("iptables_v4_listed", ipt(cfg(listed), V4)),
        ("iptables_v6_listed", ipt(cfg(listed), V6)),
        ("iptables_v4_nothing", ipt(cfg(nothing), V4)),
        ("iptables_v4_delete", xt(vm_delete_commands(V4))),
        ("nft_default", vm::vm_transaction(&d()).render()),
        ("nft_listed", vm::vm_transaction(&cfg(listed)).render()),
        ("nft_nothing", vm::vm_transaction(&cfg(nothing)).render()),
        ("nft_delete", vm::vm_delete_transaction().render()),
    ]
}

#[test]
fn vm_renderers_match_golden_files() {
    let dir = golden_dir();
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut failures = Vec::new();
    for (name, got) in cases() {
        let path = dir.join(format!("{name}.golden"));
        if update {
            std::fs::write(&path, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_default();
        if want != got {
            failures.push(format!("{name}:\n--- want\n{want}--- got\n{got}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every file in `tests/golden/vm` belongs to a case (no stale file after a rename).
#[test]
fn no_orphan_vm_goldens() {
    let names: Vec<String> = cases()
        .into_iter()
        .map(|(n, _)| format!("{n}.golden"))
        .collect();
    for entry in std::fs::read_dir(golden_dir()).unwrap() {
        let file = entry.unwrap().file_name().into_string().unwrap();
        assert!(names.contains(&file), "orphan golden file vm/{file}");
    }
}

/// The v6 rules never name an IPv4 network and the v4 rules never an IPv6 one.
#[test]
fn each_family_gets_only_its_own_networks() {
    let c = cfg(listed);
    let v4 = ipt(c.clone(), Family::V4);
    let v6 = ipt(c, Family::V6);
    assert!(
        v4.contains("10.96.0.0/12") && !v4.contains("fd00::"),
        "{v4}"
    );
    assert!(v6.contains("fd00::/8") && !v6.contains("10.96."), "{v6}");
}
