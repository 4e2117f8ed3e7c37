//! End to end: real `ambit ztunnel` processes (dedicated mode) in pod network namespaces on two
//! nodes, with the in-pod redirection rules, a real CA, and the local config file as the
//! source of workloads and policies. Needs root (network namespaces); fails under CI=true
//! without it.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

#[path = "support/mesh.rs"]
mod mesh;

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use ambit_netns::SocketFactory;

use mesh::{
    APP_PORT, Mesh, VIP, closed_within, connect_from, counter, eventually_blocking, exchange, id,
};

fn capable(test: &str) -> bool {
    ambit_netns::testing::netns_capable_or_skip(test)
}

const SECS: Duration = Duration::from_secs(20);

fn standard_mesh() -> Mesh {
    let m = Mesh::start(&[
        ("node1", "client", true),
        ("node2", "server", true),
        ("node1", "plain", false),
    ]);
    m.start_app("server", APP_PORT);
    m
}

/// Connects from `from` to `dst` and runs one exchange; `Ok(greeting+echo)` or the error.
fn try_exchange(m: &Mesh, from: &str, dst: SocketAddr, line: &str) -> Result<String, String> {
    let mut s = connect_from(m.pod_ns(from), dst).map_err(|e| e.to_string())?;
    exchange(&mut s, line).map_err(|e| e.to_string())
}

#[test]
fn hbone_across_nodes_is_encrypted_and_carries_identity() {
    if !capable("hbone_across_nodes_is_encrypted_and_carries_identity") {
        return;
    }
    let m = standard_mesh();
    let client_ip = m.topo.pod("client").ip();

    // Capture everything on node2 while the client talks to the server.
    let pcap = m.path("node2.pcap");
    let tcpdump_err = m.path("tcpdump.err");
    let mut tcpdump = m
        .topo
        .command("node2", "tcpdump")
        .unwrap()
        .args(["-i", "any", "-U", "--immediate-mode", "-n", "-w"])
        .arg(&pcap)
        .arg("tcp")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&tcpdump_err).unwrap())
        .spawn()
        .expect("tcpdump");
    eventually_blocking("tcpdump listening", SECS, || {
        std::fs::read_to_string(&tcpdump_err)
            .ok()?
            .contains("listening on")
            .then_some(())
    });

    let marker = format!("AMBIT-PLAINTEXT-MARKER-{}", std::process::id());
    let reply = eventually_blocking("client reaches server", SECS, || {
        try_exchange(&m, "client", m.pod_addr("server", APP_PORT), &marker).ok()
    });
    assert!(
        reply.starts_with(&format!("hello {client_ip}\n")),
        "server saw {reply:?}"
    );
    assert!(reply.contains(&marker), "echo missing: {reply:?}");

    eventually_blocking("tcpdump wrote the packets", SECS, || {
        (std::fs::metadata(&pcap).ok()?.len() > 500).then_some(())
    });
    let _ = std::process::Command::new("kill")
        .arg("-INT")
        .arg(tcpdump.id().to_string())
        .status();
    let _ = tcpdump.wait();
    let pcap_len = std::fs::metadata(&pcap).map(|m| m.len()).unwrap_or(0);
    assert!(
        pcap_len > 500,
        "the capture saw the HBONE traffic ({pcap_len} bytes); tcpdump: {}\nclient log:\n{}\nserver log:\n{}",
        std::fs::read_to_string(&tcpdump_err).unwrap_or_default(),
        m.ztunnel_log("client"),
        m.ztunnel_log("server")
    );
    assert!(
        !mesh::file_contains(&pcap, marker.as_bytes()),
        "plaintext payload visible on the node link"
    );

    // The server side saw the client's SPIFFE identity (metrics and access log).
    let principal = format!("source_principal=\"{}\"", id("client"));
    eventually_blocking(
        "destination metrics with the client principal",
        SECS,
        || {
            let text = m.metrics("server");
            (counter(
                &text,
                "istio_tcp_connections_opened_total",
                &["reporter=\"destination\"", &principal],
            ) >= 1.0)
                .then_some(())
        },
    );
    eventually_blocking("source metrics in the client ztunnel", SECS, || {
        let text = m.metrics("client");
        let opened = counter(
            &text,
            "istio_tcp_connections_opened_total",
            &["reporter=\"source\""],
        );
        let sent = counter(
            &text,
            "istio_tcp_sent_bytes_total",
            &["reporter=\"source\""],
        );
        (opened >= 1.0 && sent > 0.0).then_some(())
    });
    // Byte counters move while a connection is still open.
    let mut open = connect_from(m.pod_ns("client"), m.pod_addr("server", APP_PORT)).unwrap();
    exchange(&mut open, "live-bytes").unwrap();
    eventually_blocking("live byte counters", SECS, || {
        let text = m.metrics("server");
        let open_conns = counter(
            &text,
            "istio_tcp_sockets_open",
            &["reporter=\"destination\""],
        );
        let received = counter(
            &text,
            "istio_tcp_received_bytes_total",
            &["reporter=\"destination\""],
        );
        (open_conns >= 1.0 && received > 0.0).then_some(())
    });
    drop(open);
    eventually_blocking("server access log names the client identity", SECS, || {
        m.ztunnel_log("server")
            .contains(&id("client").to_string())
            .then_some(())
    });
}

#[test]
fn service_vip_and_passthrough() {
    if !capable("service_vip_and_passthrough") {
        return;
    }
    let m = standard_mesh();
    let client_ip = m.topo.pod("client").ip();
    // VIP 10.96.0.10:80 → server:8080 over HBONE.
    let reply = eventually_blocking("VIP reaches the endpoint", SECS, || {
        try_exchange(&m, "client", SocketAddr::from((VIP, 80)), "via-vip").ok()
    });
    assert!(
        reply.starts_with(&format!("hello {client_ip}\n")),
        "{reply:?}"
    );
    // An address the mesh does not know: passed through as plain TCP.
    let node2 = m.topo.node("node2");
    let outside = SocketAddr::from((node2.ip(), 9999));
    m.start_app_in(node2.netns(), outside);
    let reply = eventually_blocking("passthrough reaches the outside server", SECS, || {
        try_exchange(&m, "client", outside, "passthrough").ok()
    });
    assert!(
        reply.starts_with(&format!("hello {client_ip}\n")),
        "{reply:?}"
    );
    let text = m.metrics("client");
    assert!(
        text.contains("destination_service=\"echo.default.svc.cluster.local\""),
        "{text}"
    );
}

const ALLOW_CLIENT_ONLY: &str = "- name: allow-client\n  namespace: default\n  scope: Namespace\n  action: Allow\n  rules: [[[ {principals: [!Exact cluster.local/ns/default/sa/client]} ]]]\n";
const DENY_CLIENT: &str = "- name: deny-client\n  namespace: default\n  scope: Namespace\n  action: Deny\n  rules: [[[ {principals: [!Exact cluster.local/ns/default/sa/client]} ]]]\n";

#[test]
fn authorization_allow_deny_and_live_policy_change() {
    if !capable("authorization_allow_deny_and_live_policy_change") {
        return;
    }
    let m = standard_mesh();
    let server = m.pod_addr("server", APP_PORT);
    eventually_blocking("baseline traffic", SECS, || {
        try_exchange(&m, "client", server, "x").ok()
    });
    // The uncaptured pod reaches the server in plaintext through 15006 while no policy exists.
    eventually_blocking("plaintext allowed without policies", SECS, || {
        try_exchange(&m, "plain", server, "x").ok()
    });

    // An open connection, then a policy that denies it: the connection is closed.
    let mut open = connect_from(m.pod_ns("client"), server).unwrap();
    exchange(&mut open, "before").unwrap();

    // (policies, client allowed, plaintext allowed)
    let cases: &[(&[&str], bool, bool)] = &[
        (&[ALLOW_CLIENT_ONLY], true, false),
        (&[DENY_CLIENT], false, true),
        (&[], true, true),
    ];
    for (i, (policies, client_ok, plain_ok)) in cases.iter().enumerate() {
        m.write_config(policies);
        eventually_blocking(
            &format!("case {i}: client allowed={client_ok}"),
            SECS,
            || (try_exchange(&m, "client", server, "x").is_ok() == *client_ok).then_some(()),
        );
        eventually_blocking(
            &format!("case {i}: plaintext allowed={plain_ok}"),
            SECS,
            || (try_exchange(&m, "plain", server, "x").is_ok() == *plain_ok).then_some(()),
        );
        if i == 1 {
            assert!(
                closed_within(&mut open, Duration::from_secs(10)),
                "the open connection survived a policy that denies it"
            );
            // The first refused exchange above may be one the server admitted just before the
            // policy and then cut when it re-checked its connections ("tunnel side failed
            // while copying"); new connections from now on must be refused with a 401.
            eventually_blocking("a new connection refused with a 401", SECS, || {
                let refused = try_exchange(&m, "client", server, "x").is_err();
                (refused && m.ztunnel_log("client").contains("401")).then_some(())
            });
        }
    }
}

#[test]
fn peer_identity_is_verified_both_ways() {
    if !capable("peer_identity_is_verified_both_ways") {
        return;
    }
    let m = standard_mesh();
    let hbone = m.pod_addr("server", 15008);
    let ca = m.ca.clone();
    let good = ca.issue(&id("plain"), Duration::from_secs(3600)).unwrap();
    let evil = ca
        .issue(
            &ambit_model::SpiffeId::new("evil.domain", "default", "plain").unwrap(),
            Duration::from_secs(3600),
        )
        .unwrap();
    // (client cert, expected server identity, handshake succeeds)
    let cases = [
        (&good, id("server"), true),
        (&evil, id("server"), false),
        (&good, id("other"), false),
    ];
    let factory = mesh::app_factory(m.pod_ns("plain"));
    eventually_blocking("server ztunnel ready", SECS, || {
        connect_from(m.pod_ns("plain"), hbone).ok()
    });
    for (cert, expected, ok) in cases {
        let config = Arc::new(ambit_tls::client_config(cert, vec![expected.clone()]).unwrap());
        let sock = factory
            .new_tcp_stream_socket(hbone, None, &ambit_netns::SocketOptions::default())
            .unwrap();
        let result = m.rt.block_on(async {
            let sock = tokio::net::TcpSocket::from_std_stream(sock.into());
            let tcp = sock.connect(hbone).await.map_err(|e| e.to_string())?;
            let mut tls = ambit_tls::tokio_rustls::TlsConnector::from(config)
                .connect(ambit_tls::hbone_server_name(), tcp)
                .await
                .map_err(|e| e.to_string())?;
            // The server may only reject the client certificate after the client's finished
            // message: make it answer something.
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
                .await
                .map_err(|e| e.to_string())?;
            let mut buf = [0u8; 9];
            tls.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
            Ok::<_, String>(())
        });
        assert_eq!(
            result.is_ok(),
            ok,
            "cert {} expecting {expected}: {result:?}",
            cert.identity()
        );
    }
    // Garbage instead of TLS is dropped and the server keeps serving.
    let mut junk = connect_from(m.pod_ns("plain"), hbone).unwrap();
    use std::io::Write;
    junk.write_all(&[0x16, 0x03, 0x01, 0xff, 0xff, 1, 2, 3])
        .unwrap();
    junk.write_all(&[0u8; 4096]).unwrap();
    assert!(
        closed_within(&mut junk, Duration::from_secs(15)),
        "garbage TLS not closed"
    );
    eventually_blocking("server still serves", SECS, || {
        try_exchange(&m, "client", m.pod_addr("server", APP_PORT), "after").ok()
    });
}

#[test]
fn sigterm_drains_then_exits() {
    if !capable("sigterm_drains_then_exits") {
        return;
    }
    let mut m = standard_mesh();
    let server = m.pod_addr("server", APP_PORT);
    let mut open = eventually_blocking("connection", SECS, || {
        let mut s = connect_from(m.pod_ns("client"), server).ok()?;
        exchange(&mut s, "one").ok()?;
        Some(s)
    });
    let pid = m.ztunnels["server"].child.id();
    let started = std::time::Instant::now();
    std::process::Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .unwrap();
    // In flight keeps working during the drain.
    let echoed = exchange_line(&mut open, "during-drain");
    assert!(
        echoed.contains("during-drain"),
        "in-flight connection broke at drain start: {echoed:?}"
    );
    let proc = m.ztunnels.get_mut("server").unwrap();
    let status = eventually_blocking("server ztunnel exits", SECS, || {
        proc.child.try_wait().ok().flatten()
    });
    assert!(status.success(), "exit status {status:?}");
    // CONNECTION_TERMINATION_DEADLINE=2s: forced close well before the generous bound.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "drain took {:?}",
        started.elapsed()
    );
    assert!(
        m.ztunnel_log("server").contains("draining"),
        "{}",
        m.ztunnel_log("server")
    );
}

/// Writes a line and reads until it comes back (the greeting was read before).
fn exchange_line(s: &mut std::net::TcpStream, line: &str) -> String {
    use std::io::{Read, Write};
    if s.write_all(format!("{line}\n").as_bytes()).is_err() {
        return String::new();
    }
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    while !out.ends_with(b"\n") {
        match s.read(&mut b) {
            Ok(1) => out.push(b[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn hbone_status_codes_match_upstream() {
    if !capable("hbone_status_codes_match_upstream") {
        return;
    }
    let m = standard_mesh();
    let server_ip = m.topo.pod("server").ip();
    let request =
        |method: &str, uri: &str| m.hbone_request("plain", "plain", "server", method, uri);
    eventually_blocking("server ztunnel ready", SECS, || {
        request("CONNECT", &format!("{server_ip}:{APP_PORT}")).ok()
    });
    // (method, authority, status)
    let cases = [
        ("CONNECT", format!("{server_ip}:{APP_PORT}"), 200),
        (
            "CONNECT",
            "echo.default.svc.cluster.local:80".to_string(),
            200,
        ),
        ("GET", format!("http://{server_ip}:{APP_PORT}/"), 400),
        ("CONNECT", format!("198.19.200.200:{APP_PORT}"), 400),
        ("CONNECT", format!("{server_ip}:15001"), 503),
        ("CONNECT", format!("{server_ip}:15008"), 503),
        (
            "CONNECT",
            "nothing.default.svc.cluster.local:80".to_string(),
            503,
        ),
    ];
    for (method, uri, want) in &cases {
        let (status, baggage) = request(method, uri).unwrap();
        assert_eq!(status, *want, "{method} {uri}");
        if status == 200 {
            assert!(
                baggage.contains("k8s.namespace.name=default"),
                "response baggage {baggage:?}"
            );
            assert!(
                baggage.contains("service.name=server-app"),
                "response baggage {baggage:?}"
            );
        }
    }
    let deny_plain = "- name: deny-plain\n  namespace: default\n  scope: Namespace\n  action: Deny\n  rules: [[[ {principals: [!Exact cluster.local/ns/default/sa/plain]} ]]]\n";
    m.write_config(&[deny_plain]);
    eventually_blocking("401 for a denied identity", SECS, || {
        (request("CONNECT", &format!("{server_ip}:{APP_PORT}"))
            .ok()?
            .0
            == 401)
            .then_some(())
    });
}

/// A stand-in upstream resolver: answers every query NOERROR with no records (echoing the
/// question) and reports the query types it saw.
fn fake_resolver(
    m: &Mesh,
    ns: &ambit_topology::Namespace,
    addr: SocketAddr,
) -> std::sync::mpsc::Receiver<u16> {
    let sock = mesh::app_factory(ns)
        .new_udp_socket(addr, &ambit_netns::SocketOptions::default())
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    m.rt.spawn(async move {
        let sock = tokio::net::UdpSocket::from_std(sock).unwrap();
        let mut buf = [0u8; 1500];
        loop {
            let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
                return;
            };
            if n < 12 {
                continue;
            }
            let mut resp = buf[..n].to_vec();
            resp[2] |= 0x80; // QR
            resp[3] = 0x80; // RA, NOERROR
            // Question type follows the QNAME of the (single) question.
            let mut i = 12;
            while i < n && buf[i] != 0 {
                i += usize::from(buf[i]) + 1;
            }
            if i + 2 < n {
                let _ = tx.send(u16::from_be_bytes([buf[i + 1], buf[i + 2]]));
            }
            let _ = sock.send_to(&resp, peer).await;
        }
    });
    rx
}

fn dig(m: &Mesh, pod: &str, args: &[&str]) -> String {
    let mut argv = vec!["dig", "+time=2", "+tries=2"];
    argv.extend_from_slice(args);
    let out = m.topo.exec(pod, &argv).unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn dns_proxy_answers_mesh_names_and_forwards_the_rest() {
    if !capable("dns_proxy_answers_mesh_names_and_forwards_the_rest") {
        return;
    }
    let m = Mesh::start_opts(
        &[("node1", "client", true), ("node2", "server", true)],
        true,
    );
    let node2 = m.topo.node("node2");
    let resolver = SocketAddr::from((node2.ip(), 53));
    let seen = fake_resolver(&m, node2.netns(), resolver);
    let upstream = resolver.ip().to_string();
    let at_upstream = format!("@{upstream}");
    // (dig arguments, expected in the output)
    let cases: &[(&[&str], &str)] = &[
        // Straight to the proxy.
        (
            &[
                "@127.0.0.1",
                "-p",
                "15053",
                "+short",
                "echo.default.svc.cluster.local",
            ],
            "10.96.0.10",
        ),
        // Captured: the pod asks its resolver, the in-pod rules send it to the proxy.
        (
            &[&at_upstream, "+short", "echo.default.svc.cluster.local"],
            "10.96.0.10",
        ),
        // Known name, no IPv6 record: NOERROR with an empty answer.
        (
            &[&at_upstream, "AAAA", "echo.default.svc.cluster.local"],
            "status: NOERROR",
        ),
        // Not ours: forwarded to the upstream resolver, which answers.
        (
            &[&at_upstream, "SRV", "_http._tcp.example.org"],
            "status: NOERROR",
        ),
        (
            &[&at_upstream, "TXT", "unknown.example.org"],
            "status: NOERROR",
        ),
    ];
    for (args, want) in cases {
        let out = eventually_blocking(&format!("dig {args:?}"), SECS, || {
            let out = dig(&m, "client", args);
            out.contains(want).then_some(out)
        });
        assert!(out.contains(want), "{args:?}: {out}");
    }
    let types: Vec<u16> = seen.try_iter().collect();
    assert!(
        types.contains(&33),
        "SRV reached the upstream resolver: {types:?}"
    );
    assert!(
        types.contains(&16),
        "TXT reached the upstream resolver: {types:?}"
    );
    assert!(
        !types.contains(&1),
        "mesh A queries must be answered locally: {types:?}"
    );
    let metrics = m.metrics("client");
    assert!(
        counter(&metrics, "istio_dns_requests_total", &[]) >= 4.0,
        "{metrics}"
    );
    assert!(
        counter(&metrics, "istio_dns_upstream_requests_total", &[]) >= 2.0,
        "{metrics}"
    );
}

#[test]
fn certificate_rotation_keeps_connections() {
    if !capable("certificate_rotation_keeps_connections") {
        return;
    }
    // 4 s certificates: renewed every ~2 s.
    let m = Mesh::start_full(
        &[("node1", "client", true), ("node2", "server", true)],
        false,
        &[("SECRET_TTL", "4s")],
    );
    m.start_app("server", APP_PORT);
    let server = m.pod_addr("server", APP_PORT);
    let mut open = eventually_blocking("connection", SECS, || {
        let mut s = connect_from(m.pod_ns("client"), server).ok()?;
        exchange(&mut s, "first").ok()?;
        Some(s)
    });
    // Wait until both sides renewed at least twice (three issuances each).
    eventually_blocking("certificates renewed", SECS, || {
        let issued = |pod: &str| m.ztunnel_log(pod).matches("certificate issued").count();
        (issued("client") >= 3 && issued("server") >= 3).then_some(())
    });
    let echoed = exchange_line(&mut open, "after-rotation");
    assert!(
        echoed.contains("after-rotation"),
        "connection broke across rotation: {echoed:?}"
    );
    // New connections use the new certificates (the old ones have expired by now).
    eventually_blocking("new connection after rotation", SECS, || {
        try_exchange(&m, "client", server, "new").ok()
    });
}
