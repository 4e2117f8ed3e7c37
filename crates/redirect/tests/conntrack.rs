//! Root test: the conntrack cleanup after a repair (`InPod::flush_bypassed_conntrack`)
//! deletes the entries of the pod's flows that went around its flushed rules, and keeps
//! ztunnel's own: a connection from a socket carrying ztunnel's mark that is not HBONE
//! (passthrough to a destination outside the mesh) looks like a bypass in conntrack (not
//! NATed, no connmark) and is told apart only by its socket.
//!
//! Throwaway namespaces (`amr*`) only. Without root this prints "skip" and passes, unless
//! `CI=true`, where it fails.

// Unix only: namespaces and nf_tables.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use ambit_testkit::eventually_blocking_every;

use ambit_contract::marks;
use ambit_netns::{NetnsFd, in_netns};
use ambit_redirect::InPod;
use ambit_redirect::config::{Backend, PodRedirectConfig};

#[path = "support/testns.rs"]
mod testns;

use testns::{TestNs, root_or_skip};

fn connect(ns: &NetnsFd, to: SocketAddr, marked: bool) -> std::io::Result<TcpStream> {
    in_netns(ns, || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        if marked {
            s.set_mark(marks::INPOD_MARK)?;
        }
        s.connect_timeout(&to.into(), Duration::from_millis(500))?;
        Ok(TcpStream::from(s))
    })
    .unwrap()
}

/// The pod's conntrack entries whose original destination port is `port`.
fn entries_to(pod: &TestNs, port: u16) -> Vec<String> {
    pod.sh(&["cat", "/proc/net/nf_conntrack"])
        .lines()
        .filter(|l| l.contains(&format!(" dport={port} ")))
        .map(str::to_owned)
        .collect()
}

#[test]
fn cleanup_keeps_ztunnels_own_flows_and_deletes_the_bypass() {
    if !root_or_skip("cleanup_keeps_ztunnels_own_flows_and_deletes_the_bypass") {
        return;
    }
    for backend in [Backend::Iptables, Backend::Nftables] {
        let (pod, peer) = (TestNs::new(), TestNs::new());
        pod.sh(&[
            "ip", "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", &peer.name,
        ]);
        pod.sh(&["ip", "addr", "add", "10.250.8.1/24", "dev", "va"]);
        pod.sh(&["ip", "link", "set", "va", "up"]);
        peer.sh(&["ip", "addr", "add", "10.250.8.2/24", "dev", "vb"]);
        peer.sh(&["ip", "link", "set", "vb", "up"]);
        let (pod_fd, peer_fd) = (
            NetnsFd::open(pod.path()).unwrap(),
            NetnsFd::open(peer.path()).unwrap(),
        );
        let (app_port, passthrough_port) = (8080, 8443);
        let listeners: Vec<TcpListener> = [app_port, passthrough_port]
            .into_iter()
            .map(|p| {
                let a: SocketAddr = format!("10.250.8.2:{p}").parse().unwrap();
                in_netns(&peer_fd, || TcpListener::bind(a))
                    .unwrap()
                    .unwrap()
            })
            .collect();
        let inpod = InPod::new(backend, PodRedirectConfig::default());
        inpod.apply(&pod.runner()).unwrap();
        // The nat rules go: the app's next connection leaves unredirected.
        let flush: &[&str] = match backend {
            Backend::Iptables => &["iptables", "-t", "nat", "-F"],
            Backend::Nftables => &["nft", "flush", "table", "inet", "istio-ambient-nat"],
        };
        pod.sh(flush);
        let to = |p: u16| format!("10.250.8.2:{p}").parse::<SocketAddr>().unwrap();
        let app = eventually_blocking_every(
            &format!("{backend:?}: a path to the app"),
            Duration::from_secs(5),
            Duration::from_millis(50),
            || format!("{:?}", connect(&pod_fd, to(app_port), false).err()),
            || connect(&pod_fd, to(app_port), false).ok(),
        );
        let ztunnel = connect(&pod_fd, to(passthrough_port), true).unwrap();
        let _accepted: Vec<_> = listeners.iter().map(|l| l.accept().unwrap()).collect();
        assert_eq!(entries_to(&pod, app_port).len(), 1, "{backend:?}");
        assert_eq!(entries_to(&pod, passthrough_port).len(), 1, "{backend:?}");

        // The repair, then the cleanup.
        inpod.apply(&pod.runner()).unwrap();
        let deleted = inpod.flush_bypassed_conntrack(&pod_fd).unwrap();
        assert_eq!(
            entries_to(&pod, app_port),
            Vec::<String>::new(),
            "{backend:?}: the app's plaintext flow survived the cleanup"
        );
        assert_eq!(
            entries_to(&pod, passthrough_port).len(),
            1,
            "{backend:?}: ztunnel's own flow was deleted ({deleted} deleted)"
        );
        assert_eq!(deleted, 1, "{backend:?}");
        drop((app, ztunnel));
    }
}

/// The agent's check that ztunnel listens in a pod reads the pod's listeners over
/// `sock_diag`: exactly the listening ports of that namespace, both families, and neither
/// its connected sockets nor a listener of another namespace.
#[test]
fn listening_ports_are_the_namespaces_listeners_only() {
    if !root_or_skip("listening_ports_are_the_namespaces_listeners_only") {
        return;
    }
    let pod = TestNs::new();
    pod.sh(&["ip", "link", "set", "lo", "up"]);
    let ns = NetnsFd::open(pod.path()).unwrap();
    // Elsewhere (the test's own namespace): must not show.
    let outside = TcpListener::bind("127.0.0.1:0").unwrap();
    let (v4, v6, client, server) = in_netns(&ns, || {
        let v4 = TcpListener::bind("127.0.0.1:0").unwrap();
        let v6 = TcpListener::bind("[::1]:0").unwrap();
        let client = TcpStream::connect(v4.local_addr().unwrap()).unwrap();
        let server = v4.accept().unwrap().0;
        (v4, v6, client, server)
    })
    .unwrap();
    let ports = in_netns(&ns, ambit_redirect::listening_tcp_ports)
        .unwrap()
        .unwrap();
    let want: std::collections::HashSet<u16> = [v4.local_addr(), v6.local_addr()]
        .into_iter()
        .map(|a| a.unwrap().port())
        .collect();
    assert_eq!(ports, want, "client {client:?}, outside {outside:?}");
    assert!(!ports.contains(&client.local_addr().unwrap().port()));
    drop(server);
}
