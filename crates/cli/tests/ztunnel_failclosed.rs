//! Fail-closed behaviour of real `ambit ztunnel` processes (dedicated mode, in pod network
//! namespaces, configured by the local-config file): policy is evaluated for the workload a
//! listener serves, whatever else claims its address. Needs root (network namespaces); fails
//! under CI=true without it.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

#[path = "support/mesh.rs"]
mod mesh;

use std::net::SocketAddr;

use ambit_netns::SocketFactory;
use std::time::Duration;

use mesh::{APP_PORT, ConfigExtras, Mesh, connect_from, eventually_blocking, exchange};

fn capable(test: &str) -> bool {
    ambit_netns::testing::netns_capable_or_skip(test)
}

const SECS: Duration = Duration::from_secs(20);

/// Connects from `from` to `dst` and runs one exchange.
fn try_exchange(m: &Mesh, from: &str, dst: SocketAddr) -> Result<String, String> {
    let mut s = connect_from(m.pod_ns(from), dst).map_err(|e| e.to_string())?;
    exchange(&mut s, "x").map_err(|e| e.to_string())
}

/// A selector policy denying the `client` identity, attached to `server` only.
const DENY_CLIENT_SELECTOR: &str = "- name: deny-client\n  namespace: default\n  scope: WorkloadSelector\n  action: Deny\n  rules: [[[ {principals: [!Exact cluster.local/ns/default/sa/client]} ]]]\n";
/// What istiod sends for a STRICT PeerAuthentication (spec §6): deny every connection
/// without a peer identity, attached to the workloads in STRICT mode.
const STATIC_STRICT: &str = "- name: istio_converted_static_strict\n  namespace: istio-system\n  scope: WorkloadSelector\n  action: Deny\n  rules: [[[ {notPrincipals: [!Presence []]} ]]]\n";

/// A second record claiming the server's IP (a WorkloadEntry, or a stale record after IP
/// reuse), listed after the server so it is the last to claim the address.
fn impostor(m: &Mesh) -> String {
    format!(
        "- uid: cluster1/networking.istio.io/WorkloadEntry/default/impostor\n  name: impostor\n  namespace: default\n  serviceAccount: impostor\n  trustDomain: cluster.local\n  workloadIps: [\"{}\"]\n  protocol: HBONE\n  node: node2\n",
        m.topo.pod("server").ip()
    )
}

#[test]
fn policy_is_evaluated_for_the_served_workload() {
    if !capable("policy_is_evaluated_for_the_served_workload") {
        return;
    }
    let m = Mesh::start(&[
        ("node1", "client", true),
        ("node2", "server", true),
        ("node1", "plain", false),
    ]);
    m.start_app("server", APP_PORT);
    let server_ip = m.topo.pod("server").ip();
    let server = m.pod_addr("server", APP_PORT);
    let impostor = impostor(&m);
    eventually_blocking("baseline traffic", SECS, || {
        try_exchange(&m, "client", server).ok()
    });

    struct Case {
        what: &'static str,
        policy: &'static str,
        key: &'static str,
        impostor: bool,
        /// HBONE from the `client` pod through its ztunnel.
        client_ok: bool,
        /// Plaintext from the uncaptured `plain` pod (server's 15006).
        plain_ok: bool,
        /// Status of a CONNECT to the server's own address, sent from the `plain` pod
        /// straight to the server's 15008 with the `client` identity.
        connect: u16,
    }
    let cases = [
        Case {
            what: "selector DENY, no other record",
            policy: DENY_CLIENT_SELECTOR,
            key: "default/deny-client",
            impostor: false,
            client_ok: false,
            plain_ok: true,
            connect: 401,
        },
        Case {
            what: "STRICT, no other record",
            policy: STATIC_STRICT,
            key: "istio-system/istio_converted_static_strict",
            impostor: false,
            client_ok: true,
            plain_ok: false,
            connect: 200,
        },
        // Another record claims the address: whatever its policies, the connection is not
        // evaluated against it; the address does not belong to the served workload, so the
        // request is refused (400 on HBONE, closed on plaintext).
        Case {
            what: "selector DENY, impostor claims the address",
            policy: DENY_CLIENT_SELECTOR,
            key: "default/deny-client",
            impostor: true,
            client_ok: false,
            plain_ok: false,
            connect: 400,
        },
        Case {
            what: "STRICT, impostor claims the address",
            policy: STATIC_STRICT,
            key: "istio-system/istio_converted_static_strict",
            impostor: true,
            client_ok: false,
            plain_ok: false,
            connect: 400,
        },
    ];
    for case in &cases {
        let extras = ConfigExtras {
            server_policies: &[case.key],
            workloads: if case.impostor { &impostor } else { "" },
        };
        m.apply_config(&[case.policy], &extras);
        let what = case.what;
        eventually_blocking(&format!("{what}: CONNECT {}", case.connect), SECS, || {
            let r = m.hbone_request(
                "plain",
                "client",
                "server",
                "CONNECT",
                &format!("{server_ip}:{APP_PORT}"),
            );
            matches!(&r, Ok((status, _)) if *status == case.connect).then_some(())
        });
        eventually_blocking(
            &format!("{what}: client allowed={}", case.client_ok),
            SECS,
            || (try_exchange(&m, "client", server).is_ok() == case.client_ok).then_some(()),
        );
        eventually_blocking(
            &format!("{what}: plaintext allowed={}", case.plain_ok),
            SECS,
            || (try_exchange(&m, "plain", server).is_ok() == case.plain_ok).then_some(()),
        );
    }
}

/// Opens TCP from the uncaptured `plain` pod to the server's 15008 and, when `tls`, completes
/// a TLS handshake with the `client` identity; then sends nothing. Returns whether the server
/// closed the connection within `within`.
fn silent_peer_closed(m: &Mesh, tls: bool, within: Duration) -> Result<bool, String> {
    use tokio::io::AsyncReadExt;
    let hbone = m.pod_addr("server", 15008);
    let cert =
        m.ca.issue(&mesh::id("client"), Duration::from_secs(3600))
            .map_err(|e| e.to_string())?;
    let config = std::sync::Arc::new(
        ambit_tls::client_config(&cert, vec![mesh::id("server")]).map_err(|e| e.to_string())?,
    );
    let sock = mesh::app_factory(m.pod_ns("plain"))
        .new_tcp_stream_socket(hbone, None, &ambit_netns::SocketOptions::default())
        .map_err(|e| e.to_string())?;
    m.rt.block_on(async {
        let tcp = tokio::net::TcpSocket::from_std_stream(sock.into())
            .connect(hbone)
            .await
            .map_err(|e| e.to_string())?;
        let mut buf = [0u8; 512];
        let read_to_close = async {
            if tls {
                let mut s = ambit_tls::tokio_rustls::TlsConnector::from(config)
                    .connect(ambit_tls::hbone_server_name(), tcp)
                    .await
                    .map_err(|e| e.to_string())?;
                // Whatever the server sends (its SETTINGS) until it closes.
                while s.read(&mut buf).await.is_ok_and(|n| n > 0) {}
            } else {
                let mut tcp = tcp;
                while tcp.read(&mut buf).await.is_ok_and(|n| n > 0) {}
            }
            Ok::<_, String>(())
        };
        match tokio::time::timeout(within, read_to_close).await {
            Ok(r) => r.map(|()| true),
            Err(_) => Ok(false),
        }
    })
}

/// Hole: a peer that completes TLS on 15008 and then never sends the HTTP/2 preface held its
/// connection (and the server's task) forever. The server now closes it.
#[test]
fn a_silent_hbone_peer_is_cut_off() {
    if !capable("a_silent_hbone_peer_is_cut_off") {
        return;
    }
    let m = Mesh::start(&[("node1", "plain", false), ("node2", "server", true)]);
    eventually_blocking("the server has its certificate", SECS, || {
        m.hbone_request("plain", "client", "server", "CONNECT", "1.2.3.4:1")
            .ok()
    });
    assert_eq!(
        silent_peer_closed(&m, true, Duration::from_secs(15)),
        Ok(true),
        "a TLS peer that never sent the HTTP/2 preface was not cut off\n{}",
        m.ztunnel_log("server")
    );
}

/// Holes: a CA that never answers stopped certificate renewal for good (the first call hung
/// forever), and every inbound connection waited on it without a deadline. Now each call has
/// a deadline and is retried with backoff, and a connection waits a bounded time.
#[test]
fn a_ca_that_never_answers_is_bounded_and_retried() {
    if !capable("a_ca_that_never_answers_is_bounded_and_retried") {
        return;
    }
    let m = Mesh::start_with_ca(
        &[
            ("node1", "client", true),
            ("node1", "plain", false),
            ("node2", "server", true),
        ],
        false,
        &[],
        false,
    );
    m.start_app("server", APP_PORT);
    let server = m.pod_addr("server", APP_PORT);
    // No certificate: a TCP peer on 15008 is not held forever while the CA hangs.
    assert_eq!(
        silent_peer_closed(&m, false, Duration::from_secs(20)),
        Ok(true),
        "an inbound connection waited on a hanging CA without a deadline\n{}",
        m.ztunnel_log("server")
    );
    // The CA recovers: the hung calls are given up on and retried, and traffic flows.
    m.ca_answers.send_replace(true);
    eventually_blocking(
        "traffic once the CA answers",
        Duration::from_secs(60),
        || try_exchange(&m, "client", server).ok(),
    );
}
