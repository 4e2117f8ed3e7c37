//! Root tests of `tcp_listeners_at`, the agent's check that ztunnel listens in a pod: the
//! kernel's listener lookup must find every way a listener can be bound that takes
//! connections to loopback or to the pod's address, and nothing else; and agree with the
//! listener dump (`listening_tcp_ports`) wherever it finds one.
//!
//! Each case runs in its own anonymous network namespace (gone when its fd closes, also on
//! a panic). Fails under `CI=true` without the privilege.

// Unix only: namespaces.
#![cfg(unix)]
// Test helpers outside #[test] fns: a panic is how they report failure.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::Command;

use ambit_netns::NetnsFd;
use ambit_redirect::{listening_tcp_ports, tcp_listeners_at};
use socket2::{Domain, Socket, Type};

const PORT: u16 = 15008;
/// The pod's address (on `lo` here), and another local address that is not the pod's.
const POD: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 5);
const OTHER: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 9);

fn listen(addr: SocketAddr, v6only: bool) -> Socket {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None).unwrap();
    if addr.is_ipv6() {
        s.set_only_v6(v6only).unwrap();
    }
    s.bind(&addr.into()).unwrap();
    s.listen(16).unwrap();
    s
}

#[test]
fn the_listener_lookup_finds_what_takes_connections_to_the_pod() {
    if !ambit_netns::testing::netns_capable_or_skip(
        "the_listener_lookup_finds_what_takes_connections_to_the_pod",
    ) {
        return;
    }
    let v4 = |a: Ipv4Addr| SocketAddr::new(IpAddr::V4(a), PORT);
    let v6 = |a: Ipv6Addr| SocketAddr::new(IpAddr::V6(a), PORT);
    // (what, listener if any, v6only, found)
    let cases: [(&str, Option<SocketAddr>, bool, bool); 9] = [
        ("nothing", None, false, false),
        ("0.0.0.0", Some(v4(Ipv4Addr::UNSPECIFIED)), false, true),
        ("127.0.0.1", Some(v4(Ipv4Addr::LOCALHOST)), false, true),
        ("the pod's address", Some(v4(POD)), false, true),
        (
            "[::] dual-stack",
            Some(v6(Ipv6Addr::UNSPECIFIED)),
            false,
            true,
        ),
        ("[::] v6only", Some(v6(Ipv6Addr::UNSPECIFIED)), true, true),
        ("[::1]", Some(v6(Ipv6Addr::LOCALHOST)), true, true),
        ("another address", Some(v4(OTHER)), false, false),
        (
            "another port",
            Some(SocketAddr::new(IpAddr::V4(POD), PORT + 1)),
            false,
            false,
        ),
    ];
    for (what, bind, v6only, found) in cases {
        let ns = NetnsFd::create_anonymous().unwrap();
        for argv in [
            vec!["ip", "link", "set", "lo", "up"],
            vec!["ip", "addr", "add", "10.77.0.5/32", "dev", "lo"],
            vec!["ip", "addr", "add", "10.77.0.9/32", "dev", "lo"],
        ] {
            let mut c = Command::new(argv[0]);
            c.args(&argv[1..]);
            ambit_netns::set_command_netns(&mut c, &ns).unwrap();
            assert!(c.status().unwrap().success(), "{what}: {argv:?}");
        }
        let addrs = [
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
            IpAddr::V4(POD),
        ];
        let (got, dumped) = ambit_netns::in_netns(&ns, || {
            let _listener = bind.map(|a| listen(a, v6only));
            let got = tcp_listeners_at(&[PORT], &addrs).unwrap();
            (got, listening_tcp_ports().unwrap())
        })
        .unwrap();
        assert_eq!(got, found, "{what}");
        if got {
            assert!(dumped.contains(&PORT), "{what}: not in the dump {dumped:?}");
        }
    }
}

/// Every port must be found: one missing of three is not listening.
#[test]
fn one_missing_port_of_several_is_not_listening() {
    if !ambit_netns::testing::netns_capable_or_skip("one_missing_port_of_several_is_not_listening")
    {
        return;
    }
    let ns = NetnsFd::create_anonymous().unwrap();
    let mut c = Command::new("ip");
    c.args(["link", "set", "lo", "up"]);
    ambit_netns::set_command_netns(&mut c, &ns).unwrap();
    assert!(c.status().unwrap().success());
    let lo = [IpAddr::V4(Ipv4Addr::LOCALHOST)];
    ambit_netns::in_netns(&ns, || {
        let any = |p| SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), p);
        let _a = listen(any(15001), false);
        let _b = listen(any(15006), false);
        assert!(!tcp_listeners_at(&[15001, 15006, 15008], &lo).unwrap());
        let _c = listen(any(15008), false);
        assert!(tcp_listeners_at(&[15001, 15006, 15008], &lo).unwrap());
    })
    .unwrap();
}
