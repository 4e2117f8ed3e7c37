//! End-to-end behaviour of built topologies: connectivity between pods and nodes, running
//! commands inside them, dynamic pods, and that nothing of a run survives it (also after
//! a panic or a crash). Needs root; skips (or fails with CI=true) without.

#![cfg(target_os = "linux")]

use std::{
    io::{Read, Write},
    net::{IpAddr, SocketAddr},
    path::Path,
    time::Duration,
};

use ambit_netns::{SocketFactory, SocketOptions, testing::netns_capable_or_skip};
use ambit_topology::{Namespace, Topology, TopologyError, cleanup, leftovers, random_prefix};

const TIMEOUT: Duration = Duration::from_secs(5);

/// Two nodes with two pods each: client and local on node1, server and other on node2.
fn two_by_two() -> Topology {
    Topology::builder()
        .node("node1")
        .pod("node1", "client")
        .pod("node1", "local")
        .pod("node2", "server")
        .pod("node2", "other")
        .build()
        .expect("build topology")
}

/// Connects from `from` to a fresh listener on `to_ip` in `to`, echoes one message and
/// returns the client address the server saw.
fn tcp_round_trip(from: &Namespace, to: &Namespace, to_ip: IpAddr) -> SocketAddr {
    let opts = SocketOptions::default();
    let listener = to
        .socket_factory(None)
        .expect("factory")
        .new_tcp_listener(SocketAddr::new(to_ip, 0), &opts)
        .expect("listen");
    let addr = listener.local_addr().expect("addr");
    let client = from
        .socket_factory(None)
        .expect("factory")
        .new_tcp_stream_socket(addr, None, &opts)
        .expect("client socket");
    client.set_nonblocking(false).expect("blocking");
    client
        .connect_timeout(&addr.into(), TIMEOUT)
        .unwrap_or_else(|e| panic!("{} -> {addr}: {e}", from.name()));
    // The handshake is done, so the connection is already in the backlog.
    listener.set_nonblocking(false).expect("blocking");
    let (mut conn, peer) = listener.accept().expect("accept");
    let mut client = std::net::TcpStream::from(client);
    for s in [&conn, &client] {
        s.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    }
    client.write_all(b"ping").expect("client write");
    let mut buf = [0u8; 4];
    conn.read_exact(&mut buf).expect("server read");
    conn.write_all(&buf).expect("server write");
    client.read_exact(&mut buf).expect("client read");
    assert_eq!(&buf, b"ping");
    peer
}

#[test]
fn pods_and_nodes_reach_each_other() {
    if !netns_capable_or_skip("pods_and_nodes_reach_each_other") {
        return;
    }
    let topo = two_by_two();
    let pod = |n: &str| (topo.pod(n).netns(), IpAddr::from(topo.pod(n).ip()));
    let node = |n: &str| (topo.node(n).netns(), IpAddr::from(topo.node(n).ip()));
    let bridge = (topo.bridge(), IpAddr::from(topo.addressing().bridge_ip()));
    let cases = [
        ("pod -> pod across nodes", pod("client"), pod("server")),
        ("pod -> pod on one node", pod("client"), pod("local")),
        ("pod -> pod back across nodes", pod("other"), pod("local")),
        ("pod -> own node", pod("client"), node("node1")),
        ("pod -> other node", pod("client"), node("node2")),
        ("node -> own pod", node("node1"), pod("client")),
        ("node -> pod on other node", node("node2"), pod("client")),
        ("node -> node", node("node1"), node("node2")),
        ("bridge -> pod", bridge, pod("server")),
    ];
    for (name, (from_ns, from_ip), (to_ns, to_ip)) in cases {
        let peer = tcp_round_trip(from_ns, to_ns, to_ip);
        assert_eq!(peer.ip(), from_ip, "{name}: source address is preserved");
    }
}

#[test]
fn addresses_follow_the_plan() {
    if !netns_capable_or_skip("addresses_follow_the_plan") {
        return;
    }
    let topo = two_by_two();
    let cases = [
        (topo.node("node1").ip().to_string(), "198.18.0.2"),
        (topo.node("node2").ip().to_string(), "198.18.0.3"),
        (topo.node("node2").pod_cidr().to_string(), "198.19.2.0/24"),
        (topo.pod("client").ip().to_string(), "198.19.1.2"),
        (topo.pod("local").ip().to_string(), "198.19.1.3"),
        (topo.pod("server").ip().to_string(), "198.19.2.2"),
        (topo.pod("server").gateway().to_string(), "198.19.2.1"),
        (topo.pod("server").node().to_owned(), "node2"),
    ];
    for (got, want) in cases {
        assert_eq!(got, want);
    }
    let prefix = topo.prefix();
    assert_eq!(
        topo.pod("server").netns_name(),
        format!("{prefix}~node2~server")
    );
    assert_eq!(
        topo.node("node1").netns_path(),
        Path::new("/var/run/netns").join(format!("{prefix}~node1"))
    );
}

#[test]
fn commands_run_inside_nodes_and_pods() {
    if !netns_capable_or_skip("commands_run_inside_nodes_and_pods") {
        return;
    }
    let topo = two_by_two();
    for name in ["client", "node2"] {
        let out = topo
            .exec(name, &["ip", "-o", "-4", "addr", "show", "dev", "eth0"])
            .expect("exec");
        assert!(out.status.success(), "{name}: {out:?}");
        let ip = topo
            .get_pod(name)
            .map(|p| p.ip())
            .or_else(|| topo.get_node(name).map(|n| n.ip()))
            .expect("known");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&format!("inet {ip}/")),
            "{name}: {out:?}"
        );
    }

    // `ip netns exec` works on the names, as later tools (ss, dig, iptables) rely on it.
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            topo.pod("server").netns_name(),
            "ip",
            "-o",
            "link",
        ])
        .output()
        .expect("ip netns exec");
    assert!(out.status.success(), "{out:?}");
    let links = String::from_utf8_lossy(&out.stdout);
    assert_eq!(links.lines().count(), 2, "lo and eth0 only: {links}");

    let child = topo.spawn("server", &["sleep", "60"]).expect("spawn");
    let pid = child.id();
    let ns = ambit_netns::NetnsFd::from_pid(pid).expect("child netns");
    assert!(ns.same_namespace(topo.pod("server").netns_fd()));
    drop(child);
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "killed and reaped"
    );

    let inside = topo
        .run_in("client", || {
            ambit_netns::NetnsFd::current_thread().map(|n| n.identity())
        })
        .expect("run_in")
        .expect("current");
    assert_eq!(inside, topo.pod("client").netns_fd().identity());

    assert!(matches!(
        topo.exec::<&str>("client", &[]),
        Err(TopologyError::EmptyCommand)
    ));
    assert!(matches!(
        topo.exec("nobody", &["true"]),
        Err(TopologyError::Unknown(_))
    ));
}

#[test]
fn pods_can_be_added_and_removed_after_build() {
    if !netns_capable_or_skip("pods_can_be_added_and_removed_after_build") {
        return;
    }
    let mut topo = two_by_two();
    let first_ip = topo.add_pod("node2", "late").expect("add").ip();
    assert_eq!(first_ip.to_string(), "198.19.2.4");
    let late_ns = topo.pod("late").netns_name().to_owned();
    let peer = tcp_round_trip(
        topo.pod("client").netns(),
        topo.pod("late").netns(),
        first_ip.into(),
    );
    assert_eq!(peer.ip(), IpAddr::from(topo.pod("client").ip()));

    topo.remove_pod("late").expect("remove");
    assert!(topo.get_pod("late").is_none());
    let left = leftovers(topo.prefix()).expect("leftovers");
    assert!(!left.netns.contains(&late_ns), "{left:?}");

    // The freed address and veth name are reusable right away.
    let again = topo.add_pod("node2", "later").expect("add again").ip();
    assert_eq!(again, first_ip);
    tcp_round_trip(
        topo.node("node1").netns(),
        topo.pod("later").netns(),
        again.into(),
    );

    let cases = [
        ("duplicate", "node1", "client"),
        ("node name", "node1", "node2"),
        ("unknown node", "node9", "x"),
        ("invalid name", "node1", "a/b"),
    ];
    for (name, node, pod) in cases {
        assert!(topo.add_pod(node, pod).is_err(), "{name}");
    }
    assert!(matches!(
        topo.remove_pod("nobody"),
        Err(TopologyError::Unknown(_))
    ));
}

#[test]
fn invalid_descriptions_are_rejected_before_touching_the_system() {
    let cases = [
        (
            "duplicate pod",
            Topology::builder().pod("n1", "a").pod("n2", "a"),
        ),
        ("pod named like a node", Topology::builder().pod("n1", "n1")),
        ("bad pod name", Topology::builder().pod("n1", "a~b")),
        ("bad node name", Topology::builder().node("")),
        ("bad prefix", Topology::builder().prefix("AM-1").node("n1")),
    ];
    for (name, builder) in cases {
        let prefix_free = builder.build();
        assert!(
            matches!(
                prefix_free,
                Err(TopologyError::Duplicate(_) | TopologyError::InvalidName { .. })
            ),
            "{name}: {prefix_free:?}"
        );
    }
}

/// Everything a run created, counted the way an operator would look for it.
fn assert_gone(prefix: &str) {
    let left = leftovers(prefix).expect("leftovers");
    assert!(left.is_empty(), "{prefix}: {left:?}");
    let out = std::process::Command::new("ip")
        .args(["-o", "link"])
        .output()
        .expect("ip link");
    assert!(!String::from_utf8_lossy(&out.stdout).contains(prefix));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!mounts.contains(prefix), "{prefix} still mounted");
}

/// Builds a topology under the given prefix and ends it some way.
type Scenario = fn(&str);

#[test]
fn nothing_survives_drop_panic_or_crash() {
    if !netns_capable_or_skip("nothing_survives_drop_panic_or_crash") {
        return;
    }
    fn build(prefix: &str) -> Topology {
        Topology::builder()
            .prefix(prefix)
            .pod("node1", "a")
            .pod("node2", "b")
            .build()
            .expect("build")
    }
    fn dropped(prefix: &str) {
        drop(build(prefix));
    }
    fn panicked(prefix: &str) {
        let p = prefix.to_owned();
        let joined = std::thread::spawn(move || {
            let _topo = build(&p);
            panic!("test failure midway");
        })
        .join();
        assert!(joined.is_err());
    }
    fn crashed(prefix: &str) {
        // A crash runs no destructor; forgetting the topology simulates that.
        std::mem::forget(build(prefix));
        let left = leftovers(prefix).expect("leftovers");
        assert_eq!(left.netns.len(), 3 + 2, "bridge, 2 nodes, 2 pods: {left:?}");
        assert_eq!(left.mounts.len(), 5, "{left:?}");
        cleanup(prefix).expect("cleanup");
    }
    let cases: [(&str, Scenario); 3] = [
        ("dropped", dropped),
        ("panicked", panicked),
        ("crashed", crashed),
    ];
    for (name, run) in cases {
        let prefix = random_prefix();
        run(&prefix);
        eprintln!("{name}: checking {prefix}");
        assert_gone(&prefix);
    }
}

#[test]
fn a_prefix_in_use_is_refused() {
    if !netns_capable_or_skip("a_prefix_in_use_is_refused") {
        return;
    }
    let topo = Topology::builder().node("n1").build().expect("build");
    let second = Topology::builder().prefix(topo.prefix()).node("n1").build();
    assert!(
        matches!(second, Err(TopologyError::Duplicate(_))),
        "{second:?}"
    );
    // The refused build must not have torn down the first one.
    assert!(
        !leftovers(topo.prefix())
            .expect("leftovers")
            .netns
            .is_empty()
    );
    assert!(cleanup("x").is_err(), "short prefixes are refused");
}
