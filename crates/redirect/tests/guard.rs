//! Root test: the in-pod fail-closed guard (`InPod::guard`). With the redirection rules
//! flushed, a pod's own TCP reaches its peer in plaintext unless the guard is installed;
//! with it, only ztunnel's marked sockets and answers to the kubelet's probe address get
//! out, `nft flush ruleset` leaves the guard in place, and dropping it removes the table.
//!
//! Throwaway namespaces (`amr*`) only. Without root this prints "skip" and passes, unless
//! `CI=true`, where it fails.

#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ambit_contract::marks;
use ambit_netns::{NetnsFd, in_netns};
use ambit_redirect::InPod;
use ambit_redirect::config::{Backend, PodRedirectConfig};

#[path = "support/testns.rs"]
mod testns;

use testns::{TestNs, root_or_skip};

/// Connects from inside `ns`, with the socket mark ztunnel's sockets carry when `marked`.
fn connects(ns: &NetnsFd, to: SocketAddr, marked: bool) -> bool {
    in_netns(ns, || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        if marked {
            s.set_mark(marks::INPOD_MARK)?;
        }
        s.connect_timeout(&to.into(), Duration::from_millis(300))?;
        Ok::<_, std::io::Error>(TcpStream::from(s))
    })
    .unwrap()
    .is_ok()
}

#[test]
fn flushed_rules_fail_closed_only_with_the_guard() {
    if !root_or_skip("flushed_rules_fail_closed_only_with_the_guard") {
        return;
    }
    let probe = PodRedirectConfig::default().probe_snat_v4;
    let peer_addr: SocketAddr = "10.250.7.2:8080".parse().unwrap();
    let probe_addr = SocketAddr::new(probe.into(), 8080);
    let cases: [(Backend, &str, &[&str]); 4] = [
        (Backend::Iptables, "nat", &["iptables", "-t", "nat", "-F"]),
        (Backend::Iptables, "all", &["nft", "flush", "ruleset"]),
        (
            Backend::Nftables,
            "nat",
            &["nft", "flush", "table", "inet", "istio-ambient-nat"],
        ),
        (Backend::Nftables, "all", &["nft", "flush", "ruleset"]),
    ];
    for (backend, flushed, flush) in cases {
        for guarded in [false, true] {
            let ctx = format!("{backend:?}, {flushed} flushed, guard {guarded}");
            let (pod, peer) = (TestNs::new(), TestNs::new());
            pod.sh(&[
                "ip", "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns",
                &peer.name,
            ]);
            pod.sh(&["ip", "addr", "add", "10.250.7.1/24", "dev", "va"]);
            pod.sh(&["ip", "link", "set", "va", "up"]);
            pod.sh(&["ip", "route", "add", &format!("{probe}/32"), "dev", "va"]);
            peer.sh(&["ip", "addr", "add", "10.250.7.2/24", "dev", "vb"]);
            peer.sh(&["ip", "addr", "add", &format!("{probe}/32"), "dev", "vb"]);
            peer.sh(&["ip", "link", "set", "vb", "up"]);
            let (pod_fd, peer_fd) = (
                NetnsFd::open(pod.path()).unwrap(),
                NetnsFd::open(peer.path()).unwrap(),
            );
            let _listeners: Vec<TcpListener> = [peer_addr, probe_addr]
                .into_iter()
                .map(|a| {
                    in_netns(&peer_fd, || TcpListener::bind(a))
                        .unwrap()
                        .unwrap()
                })
                .collect();
            // ztunnel's outbound capture listener in the pod.
            let _outbound = in_netns(&pod_fd, || TcpListener::bind("0.0.0.0:15001"))
                .unwrap()
                .unwrap();

            let inpod = InPod::new(backend, PodRedirectConfig::default());
            inpod.apply(&pod.runner()).unwrap();
            let guard = guarded.then(|| inpod.guard(&pod_fd).unwrap().unwrap());
            // The veth needs a moment for carrier: poll with a deadline.
            let deadline = Instant::now() + Duration::from_secs(5);
            while !connects(&pod_fd, peer_addr, true) {
                assert!(Instant::now() < deadline, "{ctx}: no path for ztunnel");
                std::thread::sleep(Duration::from_millis(50));
            }

            // Rules intact: the app's connection is redirected to the capture listener,
            // which the guard lets through (its first route was the pod's interface).
            assert!(
                connects(&pod_fd, peer_addr, false),
                "{ctx}: the app's redirected connection"
            );

            pod.sh(flush);
            assert_eq!(
                connects(&pod_fd, peer_addr, false),
                !guarded,
                "{ctx}: the app's own connection to a peer"
            );
            assert!(connects(&pod_fd, peer_addr, true), "{ctx}: ztunnel's");
            assert!(
                connects(&pod_fd, probe_addr, false),
                "{ctx}: an answer to the probe address"
            );
            let table = pod.listing(&["nft", "list", "table", "inet", "ambit-guard"]);
            assert_eq!(
                table.contains("hook postrouting"),
                guarded,
                "{ctx}: {table}"
            );

            drop(guard);
            let deadline = Instant::now() + Duration::from_secs(5);
            while !pod
                .listing(&["nft", "list", "table", "inet", "ambit-guard"])
                .is_empty()
            {
                assert!(Instant::now() < deadline, "{ctx}: guard left after drop");
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(
                connects(&pod_fd, peer_addr, false),
                "{ctx}: the guard's drop outlived it"
            );
        }
    }
}

/// Ingress mode leaves inbound unredirected by design, and virtual interfaces forward a
/// VM's traffic: no guard for either.
#[test]
fn ingress_mode_and_virtual_interfaces_have_no_guard() {
    if !root_or_skip("ingress_mode_and_virtual_interfaces_have_no_guard") {
        return;
    }
    let pod = TestNs::new();
    let fd = NetnsFd::open(pod.path()).unwrap();
    let configs = [
        PodRedirectConfig {
            ingress_mode: true,
            ..PodRedirectConfig::default()
        },
        PodRedirectConfig {
            virtual_interfaces: vec!["tap0".parse().unwrap()],
            ..PodRedirectConfig::default()
        },
    ];
    for cfg in configs {
        let inpod = InPod::new(Backend::Iptables, cfg.clone());
        assert!(inpod.guard(&fd).unwrap().is_none(), "{cfg:?}");
    }
}
