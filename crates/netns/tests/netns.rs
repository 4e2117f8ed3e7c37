//! Behaviour of namespace descriptors, `in_netns`, namespace threads, commands and the
//! socket factory. Tests that need privileges go through `netns_capable_or_skip`.

#![cfg(target_os = "linux")]

use std::{
    io::{ErrorKind, Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    panic::{AssertUnwindSafe, catch_unwind},
    process::Command,
    time::Duration,
};

use ambit_netns::{
    DefaultSocketFactory, NetnsError, NetnsFd, NetnsSocketFactory, SocketFactory, SocketOptions,
    Transparent, connect_tcp, in_netns, run_in_netns_thread, set_command_netns,
    testing::netns_capable_or_skip,
};
use socket2::Socket;

/// A fresh namespace with `lo` up, so loopback sockets work in it. It disappears when
/// the descriptor drops: nothing to clean up.
fn namespace_with_lo() -> NetnsFd {
    let ns = NetnsFd::create_anonymous().expect("create namespace");
    let mut cmd = Command::new("ip");
    cmd.args(["link", "set", "lo", "up"]);
    set_command_netns(&mut cmd, &ns).expect("set netns");
    let status = cmd.status().expect("run ip");
    assert!(status.success(), "ip link set lo up failed: {status}");
    ns
}

fn interface_names() -> Vec<String> {
    nix::net::if_::if_nameindex()
        .expect("if_nameindex")
        .iter()
        .map(|i| i.name().to_string_lossy().into_owned())
        .collect()
}

fn current_id() -> ambit_netns::NetnsId {
    NetnsFd::current_thread().expect("current netns").identity()
}

type ErrorCheck = fn(&NetnsError) -> bool;

#[test]
fn open_rejects_what_is_not_a_network_namespace() {
    let file = tempfile::NamedTempFile::new().expect("tempfile");
    let cases: [(&str, std::path::PathBuf, ErrorCheck); 3] = [
        ("regular file", file.path().to_owned(), |e| {
            matches!(e, NetnsError::NotNetns { .. })
        }),
        ("uts namespace", "/proc/self/ns/uts".into(), |e| {
            matches!(e, NetnsError::NotNetns { .. })
        }),
        ("missing path", "/nonexistent/ambit/netns".into(), |e| {
            matches!(e, NetnsError::Open { .. })
        }),
    ];
    for (name, path, expected) in cases {
        let err = NetnsFd::open(&path).expect_err(name);
        assert!(expected(&err), "{name}: unexpected error {err:?}");
    }
    let fd = std::os::fd::OwnedFd::from(file.reopen().expect("reopen"));
    assert!(matches!(
        NetnsFd::from_owned_fd(fd),
        Err(NetnsError::NotNetns { .. })
    ));
}

#[test]
fn identity_is_stable_per_namespace_and_differs_between_namespaces() {
    let a = NetnsFd::current_thread().expect("current");
    let b = NetnsFd::open("/proc/self/ns/net").expect("self");
    let c = NetnsFd::from_pid(std::process::id()).expect("pid");
    assert_eq!(a.identity(), b.identity());
    assert_eq!(a.identity(), c.identity());
    assert!(a.same_namespace(&a.try_clone().expect("clone")));
    let fd = a.try_clone().expect("clone").into_owned_fd();
    assert_eq!(
        NetnsFd::from_owned_fd(fd).expect("from fd").identity(),
        a.identity()
    );

    if !netns_capable_or_skip("identity_is_stable_per_namespace_and_differs_between_namespaces") {
        return;
    }
    let x = NetnsFd::create_anonymous().expect("x");
    let y = NetnsFd::create_anonymous().expect("y");
    assert_ne!(x.identity(), y.identity());
    assert_ne!(x.identity(), a.identity());
    assert_eq!(x.identity(), x.try_clone().expect("clone").identity());
}

#[test]
fn in_netns_switches_the_thread_and_restores_it() {
    if !netns_capable_or_skip("in_netns_switches_the_thread_and_restores_it") {
        return;
    }
    let before = current_id();
    let ns = NetnsFd::create_anonymous().expect("ns");
    let inner = NetnsFd::create_anonymous().expect("inner");
    let (seen_id, seen_ifaces, nested_id, after_nested) = in_netns(&ns, || {
        let nested = in_netns(&inner, current_id).expect("nested");
        (current_id(), interface_names(), nested, current_id())
    })
    .expect("in_netns");
    assert_eq!(seen_id, ns.identity());
    assert_eq!(seen_ifaces, vec!["lo".to_string()]);
    assert_eq!(nested_id, inner.identity());
    assert_eq!(
        after_nested,
        ns.identity(),
        "nested call restores the outer"
    );
    assert_eq!(current_id(), before);
}

#[test]
fn repeated_and_nested_calls_always_come_back_to_the_right_namespace() {
    if !netns_capable_or_skip("repeated_and_nested_calls_always_come_back_to_the_right_namespace") {
        return;
    }
    let before = current_id();
    let a = NetnsFd::create_anonymous().expect("a");
    let b = NetnsFd::create_anonymous().expect("b");
    let here = NetnsFd::current_thread().expect("here");
    // The thread remembers where it came back to between calls; every sequence must still
    // see the right namespace inside and end where it started.
    let checks: &[(&str, &dyn Fn() -> bool)] = &[
        ("a", &|| in_netns(&a, current_id).unwrap() == a.identity()),
        ("b", &|| in_netns(&b, current_id).unwrap() == b.identity()),
        ("own namespace", &|| {
            in_netns(&here, current_id).unwrap() == before
        }),
        ("a then b inside", &|| {
            in_netns(&a, || {
                let inner = in_netns(&b, current_id).unwrap();
                inner == b.identity() && current_id() == a.identity()
            })
            .unwrap()
        }),
        ("a inside a", &|| {
            in_netns(&a, || in_netns(&a, current_id).unwrap() == a.identity()).unwrap()
        }),
        ("b after a panic in a", &|| {
            let _ = catch_unwind(AssertUnwindSafe(|| in_netns(&a, || panic!("boom"))));
            current_id() == before && in_netns(&b, current_id).unwrap() == b.identity()
        }),
    ];
    for round in 0..3 {
        for (what, check) in checks {
            assert!(check(), "round {round}: {what}");
            assert_eq!(current_id(), before, "round {round}: after {what}");
        }
    }
    // A thread that lives in `a` comes back to `a`, not to where this thread is.
    let a_id = a.identity();
    let b2 = NetnsFd::create_anonymous().expect("b2");
    let b2_id = b2.identity();
    let seen = ambit_netns::spawn_in_netns_thread(a, "ns-a", move || {
        let first = in_netns(&b2, current_id).unwrap();
        let after_first = current_id();
        let second = in_netns(&b2, current_id).unwrap();
        (first, after_first, second, current_id())
    })
    .expect("spawn")
    .join()
    .expect("join")
    .expect("enter");
    assert_eq!(seen, (b2_id, a_id, b2_id, a_id));
}

#[test]
fn in_netns_restores_the_thread_after_a_panic() {
    if !netns_capable_or_skip("in_netns_restores_the_thread_after_a_panic") {
        return;
    }
    let before = current_id();
    let ns = NetnsFd::create_anonymous().expect("ns");
    let result = catch_unwind(AssertUnwindSafe(|| {
        in_netns(&ns, || {
            assert_eq!(current_id(), ns.identity());
            panic!("boom inside the namespace");
        })
    }));
    assert!(result.is_err(), "the panic propagates");
    assert_eq!(current_id(), before);
}

#[test]
fn namespace_threads_enter_without_touching_the_caller() {
    if !netns_capable_or_skip("namespace_threads_enter_without_touching_the_caller") {
        return;
    }
    let before = current_id();
    let ns = NetnsFd::create_anonymous().expect("ns");
    let seen = run_in_netns_thread(&ns, current_id).expect("run");
    assert_eq!(seen, ns.identity());
    assert_eq!(current_id(), before);

    let panicked = catch_unwind(|| run_in_netns_thread(&ns, || panic!("thread boom")));
    assert!(panicked.is_err(), "panics reach the caller");

    let handle =
        ambit_netns::spawn_in_netns_thread(ns.try_clone().expect("clone"), "t", current_id)
            .expect("spawn");
    assert_eq!(
        handle.join().expect("join").expect("entered"),
        ns.identity()
    );
}

#[test]
fn commands_start_inside_the_namespace() {
    if !netns_capable_or_skip("commands_start_inside_the_namespace") {
        return;
    }
    let ns = NetnsFd::create_anonymous().expect("ns");
    let mut cmd = Command::new("readlink");
    cmd.arg("/proc/self/ns/net");
    let short_lived = ns.try_clone().expect("clone");
    set_command_netns(&mut cmd, &short_lived).expect("set netns");
    drop(short_lived); // the command keeps its own descriptor
    let out = cmd.output().expect("readlink");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("net:[{}]", ns.identity().ino)
    );
}

#[test]
fn listener_in_namespace_is_reachable_only_from_inside() {
    if !netns_capable_or_skip("listener_in_namespace_is_reachable_only_from_inside") {
        return;
    }
    let ns = namespace_with_lo();
    let factory = NetnsSocketFactory::new(ns.try_clone().expect("clone"), None);
    let any_port = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));

    // Find a port free in both namespaces, so a root-namespace listener on the same port
    // shows where a connection from the root namespace really lands (no waiting needed).
    let (inner, outer) = (0..20)
        .find_map(|_| {
            let inner = factory
                .new_tcp_listener(any_port, &SocketOptions::default())
                .expect("listener in netns");
            let port = inner.local_addr().expect("addr").port();
            TcpListener::bind((Ipv4Addr::LOCALHOST, port))
                .ok()
                .map(|outer| (inner, outer))
        })
        .expect("a port free in both namespaces");
    let addr = inner.local_addr().expect("addr");

    let from_root = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("root");
    let (_accepted, peer) = outer.accept().expect("root listener gets it");
    assert_eq!(peer, from_root.local_addr().expect("local"));
    assert_eq!(
        inner.accept().map(|_| ()).map_err(|e| e.kind()),
        Err(ErrorKind::WouldBlock),
        "the namespace listener saw a connection from the root namespace"
    );

    let mut from_inside = in_netns(&ns, || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(5))
    })
    .expect("in_netns")
    .expect("connect inside");
    inner.set_nonblocking(false).expect("blocking");
    let (mut conn, _) = inner.accept().expect("namespace listener gets it");
    from_inside.write_all(b"ping").expect("write");
    let mut buf = [0u8; 4];
    conn.read_exact(&mut buf).expect("read");
    assert_eq!(&buf, b"ping");
}

#[test]
fn socket_options_are_applied() {
    if !netns_capable_or_skip("socket_options_are_applied") {
        return;
    }
    let ns = namespace_with_lo();
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    struct Case {
        name: &'static str,
        factory_mark: Option<u32>,
        opts: SocketOptions,
        mark: u32,
    }
    let cases = [
        Case {
            name: "factory mark",
            factory_mark: Some(0x539),
            opts: SocketOptions::default(),
            mark: 0x539,
        },
        Case {
            name: "options override the factory mark",
            factory_mark: Some(0x539),
            opts: SocketOptions {
                mark: Some(7),
                ..Default::default()
            },
            mark: 7,
        },
        Case {
            name: "no mark, everything else",
            factory_mark: None,
            opts: SocketOptions {
                reuse_port: true,
                transparent: Transparent::Required,
                freebind: true,
                nodelay: true,
                keepalive: Some(ambit_netns::Keepalive {
                    time: Duration::from_secs(30),
                    interval: Duration::from_secs(5),
                    retries: 3,
                }),
                ..Default::default()
            },
            mark: 0,
        },
    ];
    for case in cases {
        let factory = NetnsSocketFactory::new(ns.try_clone().expect("clone"), case.factory_mark);
        let name = case.name;
        let listener: Socket = factory
            .new_tcp_listener(addr, &case.opts)
            .expect(name)
            .into();
        let udp: Socket = factory.new_udp_socket(addr, &case.opts).expect(name).into();
        let stream = factory
            .new_tcp_stream_socket(addr, None, &case.opts)
            .expect(name);
        for (kind, sock) in [("listener", &listener), ("udp", &udp), ("stream", &stream)] {
            assert_eq!(sock.mark().expect("mark"), case.mark, "{name}: {kind}");
            assert_eq!(
                sock.reuse_port().expect("reuseport"),
                case.opts.reuse_port,
                "{name}: {kind}"
            );
            assert_eq!(
                sock.ip_transparent_v4().expect("transparent"),
                case.opts.transparent != Transparent::Off,
                "{name}: {kind}"
            );
            assert_eq!(
                sock.freebind_v4().expect("freebind"),
                case.opts.freebind,
                "{name}: {kind}"
            );
            assert!(sock.nonblocking().expect("nonblocking"), "{name}: {kind}");
        }
        for (kind, sock) in [("listener", &listener), ("stream", &stream)] {
            assert_eq!(sock.tcp_nodelay().expect("nodelay"), case.opts.nodelay);
            assert_eq!(
                sock.keepalive().expect("keepalive"),
                case.opts.keepalive.is_some(),
                "{name}: {kind}"
            );
        }
    }
}

#[test]
fn freebind_allows_binding_an_address_not_on_any_interface() {
    if !netns_capable_or_skip("freebind_allows_binding_an_address_not_on_any_interface") {
        return;
    }
    let ns = namespace_with_lo();
    let addr = SocketAddr::from(([198, 51, 100, 7], 0));
    let cases = [(false, false), (true, true)];
    for (freebind, ok) in cases {
        let factory = NetnsSocketFactory::new(ns.try_clone().expect("clone"), None);
        let opts = SocketOptions {
            freebind,
            ..Default::default()
        };
        assert_eq!(
            factory.new_tcp_listener(addr, &opts).is_ok(),
            ok,
            "freebind={freebind}"
        );
    }
}

#[test]
fn default_factory_creates_sockets_in_the_current_namespace() {
    let listener = DefaultSocketFactory
        .new_tcp_listener(
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            &SocketOptions::default(),
        )
        .expect("listener");
    let addr = listener.local_addr().expect("addr");
    let _client = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    listener.set_nonblocking(false).expect("blocking");
    listener.accept().expect("accept");
}

#[tokio::test]
async fn connect_tcp_from_a_tokio_worker_lands_in_the_namespace() {
    if !netns_capable_or_skip("connect_tcp_from_a_tokio_worker_lands_in_the_namespace") {
        return;
    }
    let ns = namespace_with_lo();
    let factory = NetnsSocketFactory::new(ns, Some(42));
    let std_listener = factory
        .new_tcp_listener(
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            &SocketOptions::default(),
        )
        .expect("listener");
    let addr = std_listener.local_addr().expect("addr");
    let listener = tokio::net::TcpListener::from_std(std_listener).expect("tokio listener");
    let before = current_id();
    let opts = SocketOptions::default();
    let (client, accepted) =
        tokio::join!(connect_tcp(&factory, addr, None, &opts), listener.accept());
    let client = client.expect("connect");
    let (_server, peer) = accepted.expect("accept");
    assert_eq!(peer, client.local_addr().expect("local"));
    assert_eq!(
        current_id(),
        before,
        "the worker thread stays in its namespace"
    );
}

/// A connecting socket bound to an address with port 0 gets its port at connect time
/// (IP_BIND_ADDRESS_NO_PORT: unique per 4-tuple, so source-preserving proxies do not run
/// out of ports); an explicit port is bound at once.
#[tokio::test]
async fn source_bound_sockets_pick_their_port_at_connect() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("listener");
    let remote = listener.local_addr().expect("addr");
    let fixed = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    // (local port asked for, port bound before connect: None = deferred)
    for (asked, bound) in [(0, None), (fixed, Some(fixed))] {
        let local = SocketAddr::from((Ipv4Addr::LOCALHOST, asked));
        let sock = DefaultSocketFactory
            .new_tcp_stream_socket(remote, Some(local), &SocketOptions::default())
            .expect("socket");
        let before = sock
            .local_addr()
            .expect("local")
            .as_socket()
            .expect("inet")
            .port();
        assert_eq!((before != 0).then_some(before), bound, "asked {asked}");
        let stream = tokio::net::TcpSocket::from_std_stream(sock.into())
            .connect(remote)
            .await
            .expect("connect");
        let after = stream.local_addr().expect("local").port();
        assert_ne!(after, 0, "asked {asked}");
        let (_, peer) = listener.accept().expect("accept");
        assert_eq!(peer.port(), after, "asked {asked}");
    }
}

/// What `IP_BIND_ADDRESS_NO_PORT` buys a proxy that connects from its client's address: with
/// every ephemeral port of that address in use (a range of four, each held by a connection
/// to another destination), a socket bound to the address with port 0 still connects,
/// because only its 4-tuple must be unique, while a plain `bind(2)` of the address finds no
/// free port. This keeps ambit's inbound connection rate up when the TIME-WAIT sockets of
/// closed connections hold the client's ports, where upstream's inbound `bind` collapses
/// (BENCHMARKS.md, "Sustained connections").
#[test]
fn a_source_bound_connect_needs_no_port_free_for_every_destination() {
    if !netns_capable_or_skip("a_source_bound_connect_needs_no_port_free_for_every_destination") {
        return;
    }
    let ns = namespace_with_lo();
    in_netns(&ns, || {
        // Per namespace: /proc/sys/net is the opener's namespace.
        std::fs::write("/proc/sys/net/ipv4/ip_local_port_range", "40000 40003")
            .expect("narrowing the port range");
        let range = 40000..=40003;
        // Listeners on fixed ports outside the range, so they take none of it.
        let other = TcpListener::bind((Ipv4Addr::LOCALHOST, 5001)).expect("other listener");
        let app = TcpListener::bind((Ipv4Addr::LOCALHOST, 5002)).expect("app listener");
        let held: Vec<TcpStream> = range
            .clone()
            .map(|_| TcpStream::connect(other.local_addr().unwrap()).expect("holding a port"))
            .collect();
        let mut ports: Vec<u16> = held
            .iter()
            .map(|s| s.local_addr().unwrap().port())
            .collect();
        ports.sort_unstable();
        assert_eq!(
            ports,
            range.clone().collect::<Vec<_>>(),
            "every port is held"
        );
        let client = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let plain = Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket")
            .bind(&client.into())
            .map_err(|e| e.kind());
        assert_eq!(
            plain,
            Err(ErrorKind::AddrInUse),
            "plain bind of the address"
        );
        let sock = DefaultSocketFactory
            .new_tcp_stream_socket(
                app.local_addr().unwrap(),
                Some(client),
                &SocketOptions::default(),
            )
            .expect("source-bound socket");
        sock.set_nonblocking(false).expect("blocking");
        sock.connect_timeout(&app.local_addr().unwrap().into(), Duration::from_secs(5))
            .expect("a source-bound connect with every port held");
        let local = sock.local_addr().unwrap().as_socket().unwrap();
        assert!(range.contains(&local.port()), "shares a held port: {local}");
        let (_, peer) = app.accept().expect("accept");
        assert_eq!(peer, local);
    })
    .expect("in_netns");
}

/// Whether the kernel has per-socket port ranges (`IP_LOCAL_PORT_RANGE`, Linux 6.3).
/// Without them: a failure under `CI=true`, else a skip message naming `test`.
fn per_socket_port_ranges_or_skip(test: &str) -> bool {
    let sock = Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let mut val: u32 = 0;
    let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
    // SAFETY: a valid socket fd, a u32 and its length.
    let rc = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            libc::IPPROTO_IP,
            51, // IP_LOCAL_PORT_RANGE
            std::ptr::from_mut(&mut val).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        return true;
    }
    let reason = std::io::Error::last_os_error();
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: needs IP_LOCAL_PORT_RANGE (Linux 6.3+, CI=true): {reason}");
    }
    eprintln!("skipping {test}: needs IP_LOCAL_PORT_RANGE (Linux 6.3+): {reason}");
    false
}

/// A source-bound socket's port (and an unbound one's with `sequential_port_search`, a
/// proxy's passthrough connect) is searched over both parities from where the last search
/// to the same destination ended (a per-socket port range), not over the even ports first
/// as a plain `connect(2)`'s is. The even-first search is what walks every TIME-WAIT socket
/// of a busy client address before it finds a port (BENCHMARKS.md, "Kernel-default pod
/// sysctls"); both parities are what shows the factory's sockets leave it.
#[test]
fn port_at_connect_searches_both_parities() {
    let test = "port_at_connect_searches_both_parities";
    if !netns_capable_or_skip(test) || !per_socket_port_ranges_or_skip(test) {
        return;
    }
    let ns = namespace_with_lo();
    in_netns(&ns, || {
        std::fs::write("/proc/sys/net/ipv4/ip_local_port_range", "40000 40007")
            .expect("narrowing the port range");
        // Listeners on fixed ports outside the range; each is one destination.
        let listeners: Vec<TcpListener> = (5001..=5011)
            .map(|p| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).expect("listener"))
            .collect();
        let (plain_dst, factory_dsts) = listeners.split_first().unwrap();
        // Half the range to one destination each time: a plain connect finds only even ports.
        let plain: Vec<TcpStream> = (0..4)
            .map(|_| TcpStream::connect(plain_dst.local_addr().unwrap()).expect("plain connect"))
            .collect();
        let mut ports: Vec<u16> = plain
            .iter()
            .map(|s| s.local_addr().unwrap().port())
            .collect();
        ports.sort_unstable();
        assert_eq!(ports, [40000, 40002, 40004, 40006], "plain connects");
        // The same from the factory, each case to five destinations of its own: all 20
        // ports even would happen about once in a million runs with a search over both
        // parities.
        let client = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let opted_in = SocketOptions {
            sequential_port_search: true,
            ..SocketOptions::default()
        };
        let cases = [
            (
                "source-bound, port 0",
                Some(client),
                SocketOptions::default(),
            ),
            ("not bound, opted in", None, opted_in),
        ];
        let mut held = Vec::new();
        for ((case, local, opts), dsts) in cases.iter().zip(factory_dsts.chunks(5)) {
            let mut odd = 0;
            for dst in dsts {
                let dst = dst.local_addr().unwrap();
                for _ in 0..4 {
                    let sock = DefaultSocketFactory
                        .new_tcp_stream_socket(dst, *local, opts)
                        .expect(case);
                    sock.set_nonblocking(false).expect("blocking");
                    sock.connect_timeout(&dst.into(), Duration::from_secs(5))
                        .expect(case);
                    let port = sock.local_addr().unwrap().as_socket().unwrap().port();
                    assert!((40000..=40007).contains(&port), "{case}: {port}");
                    odd += usize::from(port % 2 == 1);
                    held.push(sock);
                }
            }
            assert!(odd > 0, "{case}: 20 connects, every port even");
        }
    })
    .expect("in_netns");
}
