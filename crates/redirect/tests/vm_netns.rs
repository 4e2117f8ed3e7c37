//! Root tests of the VM rules ([`ambit_redirect::vm`]) inside throwaway network namespaces:
//! applied, verified, re-applied and deleted with both backends, and the capture paths a VM
//! relies on (SSH and the excluded ports untouched, ztunnel's marked sockets untouched, the
//! rest inbound to 15006 and outbound to 15001).
//!
//! Without root these tests print "skip" and pass, unless `CI=true`, where they fail.

// The Linux rules exist on Unix only.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::print_stdout)]

#[path = "support/testns.rs"]
mod testns;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use ambit_netns::{NetnsFd, NetnsSocketFactory, SocketFactory, SocketOptions, in_netns};
use ambit_redirect::VmRules;
use ambit_redirect::config::Backend;
use ambit_redirect::vm::{self, InboundCapture, OutboundCapture, VmRedirectConfig};
use testns::{TestNs, root_or_skip};

const BACKENDS: [Backend; 2] = [Backend::Iptables, Backend::Nftables];

fn variants() -> Vec<(&'static str, VmRedirectConfig)> {
    let d = VmRedirectConfig::default;
    vec![
        ("default", d()),
        (
            "listed",
            VmRedirectConfig {
                inbound: InboundCapture::Ports(vec![8080]),
                outbound: OutboundCapture::Cidrs(vec!["10.96.0.0/12".parse().unwrap()]),
                outbound_exclude_cidrs: vec!["10.96.0.1".parse().unwrap()],
                outbound_exclude_ports: vec![5432],
                dns_capture: false,
                exclude_interfaces: vec!["eth9".parse().unwrap()],
                ..d()
            },
        ),
        (
            "nothing",
            VmRedirectConfig {
                inbound: InboundCapture::None,
                outbound: OutboundCapture::None,
                ..d()
            },
        ),
    ]
}

#[test]
fn vm_rules_apply_verify_reapply_delete() {
    if !root_or_skip("vm_rules_apply_verify_reapply_delete") {
        return;
    }
    for backend in BACKENDS {
        for (name, config) in variants() {
            let ctx = format!("{backend:?}/{name}");
            let ns = TestNs::new();
            let r = ns.runner();
            vm::delete_all(&r).unwrap();
            assert!(!vm::any_present(&r).unwrap(), "{ctx}: empty namespace");
            let rules = VmRules { backend, config };
            rules.apply(&r).unwrap();
            let report = rules.verify(&r).unwrap();
            assert!(report.is_clean(), "{ctx}: {:#?}", report.findings);
            assert!(vm::any_present(&r).unwrap(), "{ctx}");
            // A second apply (a restart after a crash) replaces, never doubles.
            rules.apply(&r).unwrap();
            let report = rules.verify(&r).unwrap();
            assert!(report.is_clean(), "{ctx}: re-apply: {:#?}", report.findings);

            vm::delete_all(&r).unwrap();
            assert!(!vm::any_present(&r).unwrap(), "{ctx}: rules left");
            for bin in ["iptables-save", "ip6tables-save"] {
                assert!(!ns.sh(&[bin]).contains("ISTIO_VM"), "{ctx}: {bin}");
            }
            assert!(
                !ns.sh(&["nft", "list", "ruleset"]).contains("istio-vm"),
                "{ctx}: nft"
            );
            vm::delete_all(&r).unwrap();
        }
    }
}

/// A jump written twice (a restore run twice by hand) is removed as often as it is found.
#[test]
fn vm_delete_removes_duplicated_jumps() {
    if !root_or_skip("vm_delete_removes_duplicated_jumps") {
        return;
    }
    let ns = TestNs::new();
    let r = ns.runner();
    let rules = VmRules {
        backend: Backend::Iptables,
        config: VmRedirectConfig::default(),
    };
    rules.apply(&r).unwrap();
    for _ in 0..2 {
        ns.sh(&[
            "iptables",
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-j",
            "ISTIO_VM_OUTPUT",
        ]);
    }
    vm::delete_all(&r).unwrap();
    assert!(!vm::any_present(&r).unwrap());
}

/// Listeners on the ports a VM uses; which one a connection reached.
struct Listeners(Vec<(u16, TcpListener)>);

impl Listeners {
    fn bind(ns: &NetnsFd, ip: &str, ports: &[u16]) -> Self {
        Self(
            ports
                .iter()
                .map(|p| {
                    let addr: SocketAddr = format!("{ip}:{p}").parse().unwrap();
                    let l = in_netns(ns, || TcpListener::bind(addr)).unwrap().unwrap();
                    l.set_nonblocking(true).unwrap();
                    (*p, l)
                })
                .collect(),
        )
    }

    /// The port of the listener that accepted the connection `connect` makes.
    fn landed(&self, what: &str, connect: impl FnOnce() -> std::io::Result<TcpStream>) -> u16 {
        // Earlier connections still queued would be taken for this one.
        for (_, l) in &self.0 {
            while l.accept().is_ok() {}
        }
        let _stream = connect().unwrap_or_else(|e| panic!("{what}: connect: {e}"));
        ambit_testkit::eventually_blocking(
            &format!("{what}: a listener to accept"),
            Duration::from_secs(2),
            || {
                self.0
                    .iter()
                    .find_map(|(port, l)| l.accept().is_ok().then_some(*port))
            },
        )
    }
}

fn connect_from(ns: &NetnsFd, to: SocketAddr, mark: Option<u32>) -> std::io::Result<TcpStream> {
    let factory = NetnsSocketFactory::new(ns.try_clone().map_err(std::io::Error::other)?, mark);
    let sock = factory
        .new_tcp_stream_socket(to, None, &SocketOptions::default())
        .map_err(std::io::Error::other)?;
    sock.set_nonblocking(false)?;
    sock.connect_timeout(&to.into(), Duration::from_secs(1))?;
    Ok(sock.into())
}

#[test]
fn vm_rules_capture_what_the_bundle_says() {
    if !root_or_skip("vm_rules_capture_what_the_bundle_says") {
        return;
    }
    for backend in BACKENDS {
        let vm_ns = TestNs::new();
        let peer = TestNs::new();
        vm_ns.sh(&[
            "ip", "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", &peer.name,
        ]);
        for (ns, dev, addr) in [
            (&vm_ns, "va", "10.77.1.1/24"),
            (&peer, "vb", "10.77.1.2/24"),
        ] {
            ns.sh(&["ip", "addr", "add", addr, "dev", dev]);
            ns.sh(&["ip", "link", "set", dev, "up"]);
        }
        let (vm_fd, peer_fd) = (
            NetnsFd::open(vm_ns.path()).unwrap(),
            NetnsFd::open(peer.path()).unwrap(),
        );
        let in_vm = Listeners::bind(&vm_fd, "0.0.0.0", &[15001, 15006, 15008, 22, 8080]);
        let in_peer = Listeners::bind(&peer_fd, "10.77.1.2", &[9000, 5432]);
        let vm_addr = |p: u16| -> SocketAddr { format!("10.77.1.1:{p}").parse().unwrap() };
        let peer_addr = |p: u16| -> SocketAddr { format!("10.77.1.2:{p}").parse().unwrap() };
        // Carrier takes a moment: poll the plain path with a deadline.
        ambit_testkit::eventually_blocking(
            &format!("{backend:?}: a path to the VM"),
            Duration::from_secs(5),
            || connect_from(&peer_fd, vm_addr(22), None).is_ok(),
        );

        let rules = VmRules {
            backend,
            config: VmRedirectConfig {
                outbound_exclude_ports: vec![5432],
                ..VmRedirectConfig::default()
            },
        };
        rules.apply(&vm_ns.runner()).unwrap();
        // (what, from, to, SO_MARK, where it must land, the port that must accept)
        let ztunnel = Some(0x539);
        let loopback: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let cases = [
            ("inbound ssh", &peer_fd, vm_addr(22), None, &in_vm, 22),
            ("inbound app", &peer_fd, vm_addr(8080), None, &in_vm, 15006),
            (
                "inbound hbone",
                &peer_fd,
                vm_addr(15008),
                None,
                &in_vm,
                15008,
            ),
            ("outbound app", &vm_fd, peer_addr(9000), None, &in_vm, 15001),
            (
                "outbound excluded port",
                &vm_fd,
                peer_addr(5432),
                None,
                &in_peer,
                5432,
            ),
            (
                "outbound ztunnel",
                &vm_fd,
                peer_addr(9000),
                ztunnel,
                &in_peer,
                9000,
            ),
            ("loopback", &vm_fd, loopback, None, &in_vm, 8080),
        ];
        for (what, from, to, mark, listeners, want) in cases {
            let got = listeners.landed(what, || connect_from(from, to, mark));
            assert_eq!(got, want, "{backend:?}: {what}");
        }

        vm::delete_all(&vm_ns.runner()).unwrap();
        assert_eq!(
            in_vm.landed("after delete", || connect_from(
                &peer_fd,
                vm_addr(8080),
                None
            )),
            8080,
            "{backend:?}: inbound still captured after delete"
        );
    }
}
