//! The node-local HTTP endpoints over real loopback sockets: metrics (15020), admin (15000)
//! and readiness (15021), and how they stop on drain.

// Test helpers panic on purpose: a failed step is a failed test.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ambit_ztunnel::admin::{AdminError, AdminServer, AdminState, DumpSection};
use ambit_ztunnel::config::LogFormat;
use ambit_ztunnel::drain::{self, DrainMode, DrainOutcome};
use ambit_ztunnel::readiness::{ReadinessServer, Ready};
use ambit_ztunnel::telemetry::{
    self, Metrics, MetricsServer, Reporter, ResponseFlag, TrafficLabels,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LOCAL: &str = "127.0.0.1:0";

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request with `Connection: close`; reads the whole response.
async fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .expect("response in time")
        .unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("complete response");
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Resp {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// Polls until `addr` refuses connections (the server stopped listening).
async fn wait_refused(addr: SocketAddr) {
    let what = format!("{addr} to stop accepting after the drain");
    ambit_testkit::eventually_async(&what, Duration::from_secs(10), || async move {
        tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await;
}

const TRAFFIC_LABELS: [&str; 27] = [
    "reporter",
    "source_workload",
    "source_canonical_service",
    "source_canonical_revision",
    "source_workload_namespace",
    "source_principal",
    "source_app",
    "source_version",
    "source_cluster",
    "destination_service",
    "destination_service_namespace",
    "destination_service_name",
    "destination_workload",
    "destination_canonical_service",
    "destination_canonical_revision",
    "destination_workload_namespace",
    "destination_principal",
    "destination_app",
    "destination_version",
    "destination_cluster",
    "request_protocol",
    "response_flags",
    "connection_security_policy",
    "source_region",
    "source_zone",
    "destination_region",
    "destination_zone",
];

fn series<'a>(body: &'a str, name: &str) -> Vec<&'a str> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .collect()
}

/// Label names of one sample line, in order.
fn label_names(line: &str) -> Vec<&str> {
    let inner = &line[line.find('{').unwrap() + 1..line.rfind('}').unwrap()];
    inner
        .split("\",")
        .map(|kv| kv.split('=').next().unwrap().trim_start_matches(','))
        .collect()
}

#[tokio::test]
async fn metrics_endpoint_serves_live_traffic_counters() {
    let metrics = Metrics::new("1.2.3");
    let (trigger, watcher) = drain::new();
    let server = MetricsServer::bind(LOCAL.parse().unwrap(), metrics.clone()).unwrap();
    let addr = server.local_addr();
    let task = tokio::spawn(server.serve(watcher));

    let mut labels = TrafficLabels::new(Reporter::Source);
    labels.source_workload = "sleep".into();
    labels.source_workload_namespace = "default".into();
    labels.destination_service = "echo.default.svc.cluster.local".into();
    let guard = metrics.connection_opened(labels);
    guard.add_received(100);
    guard.add_sent(42);

    struct Case {
        path: &'static str,
        accept: Option<&'static str>,
        status: u16,
        content_type: &'static str,
        contains: &'static [&'static str],
        absent: &'static [&'static str],
    }
    let cases = [
        Case {
            path: "/metrics",
            accept: None,
            status: 200,
            content_type: "text/plain; version=0.0.4",
            contains: &[
                "# TYPE istio_tcp_received_bytes_total counter",
                r#"istio_build{component="ztunnel",tag="1.2.3"} 1"#,
                r#"istio_tcp_sockets_open{reporter="source"} 1"#,
                "workload_manager_active_proxy_count 0",
                "process_open_fds ",
            ],
            absent: &["# EOF", "# UNIT", "istio_tcp_connections_closed_total{"],
        },
        Case {
            path: "/stats/prometheus",
            accept: Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5"),
            status: 200,
            content_type: "application/openmetrics-text",
            contains: &["# TYPE istio_tcp_received_bytes counter", "# EOF"],
            absent: &[],
        },
        Case {
            path: "/nope",
            accept: None,
            status: 404,
            content_type: "text/plain",
            contains: &[],
            absent: &[],
        },
    ];
    for case in &cases {
        let headers: Vec<(&str, &str)> = case.accept.iter().map(|a| ("Accept", *a)).collect();
        let resp = request(addr, "GET", case.path, &headers).await;
        assert_eq!(resp.status, case.status, "{}", case.path);
        let ct = resp.header("content-type").unwrap_or_default();
        assert!(
            ct.starts_with(case.content_type),
            "{}: content-type {ct}",
            case.path
        );
        for want in case.contains {
            assert!(resp.body.contains(want), "{}: missing {want:?}", case.path);
        }
        for not in case.absent {
            assert!(
                !resp.body.contains(not),
                "{}: unexpected {not:?}",
                case.path
            );
        }
        if case.status == 200 {
            // Bytes are visible while the connection is still open, with the full label set.
            let rx = series(&resp.body, "istio_tcp_received_bytes_total");
            let tx = series(&resp.body, "istio_tcp_sent_bytes_total");
            assert_eq!((rx.len(), tx.len()), (1, 1));
            assert!(
                rx[0].ends_with(" 100") && tx[0].ends_with(" 42"),
                "{rx:?} {tx:?}"
            );
            assert_eq!(label_names(rx[0]), TRAFFIC_LABELS);
            for want in [
                r#"reporter="source""#,
                r#"source_workload="sleep""#,
                r#"destination_service="echo.default.svc.cluster.local""#,
                r#"destination_workload="unknown""#,
                r#"response_flags="-""#,
                r#"request_protocol="tcp""#,
                r#"connection_security_policy="unknown""#,
            ] {
                assert!(rx[0].contains(want), "missing {want} in {}", rx[0]);
            }
        }
    }

    guard.set_failed(ResponseFlag::Connect);
    drop(guard);
    let body = request(addr, "GET", "/metrics", &[]).await.body;
    for (name, flag) in [
        (
            "istio_tcp_connections_opened_total",
            r#"response_flags="-""#,
        ),
        (
            "istio_tcp_connections_closed_total",
            r#"response_flags="CONNECT""#,
        ),
        (
            "istio_tcp_connections_failed_total",
            r#"response_flags="CONNECT""#,
        ),
    ] {
        let s = series(&body, name);
        assert_eq!(s.len(), 1, "{name}");
        assert!(s[0].contains(flag) && s[0].ends_with(" 1"), "{}", s[0]);
    }
    assert!(body.contains(r#"istio_tcp_sockets_open{reporter="source"} 0"#));

    assert_eq!(
        trigger
            .start_drain_and_wait(DrainMode::Graceful, Duration::from_secs(10))
            .await,
        DrainOutcome::Completed
    );
    task.await.unwrap();
    wait_refused(addr).await;
}

#[tokio::test]
async fn admin_endpoints() {
    let quits = Arc::new(AtomicUsize::new(0));
    let q = quits.clone();
    let dump = |section: DumpSection| match section {
        DumpSection::Workloads => serde_json::json!([{"name": "w1"}]),
        _ => serde_json::Value::Null,
    };
    let (_dispatch, log) =
        telemetry::logging::subscriber(LogFormat::Plain, "info", std::io::sink).unwrap();
    let state = AdminState::new(dump, move || {
        q.fetch_add(1, Ordering::SeqCst);
    })
    .with_log_handle(log.clone());
    let server = AdminServer::bind(LOCAL.parse().unwrap(), state).unwrap();
    let addr = server.local_addr();
    let (trigger, watcher) = drain::new();
    let task = tokio::spawn(server.serve(watcher));

    // config_dump: every upstream key.
    let resp = request(addr, "GET", "/config_dump", &[]).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let v: serde_json::Value = serde_json::from_str(&resp.body).unwrap();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "certificates",
            "config",
            "policies",
            "services",
            "stagedServices",
            "staticConfig",
            "version",
            "workloadState",
            "workloads"
        ]
    );
    assert_eq!(v["workloads"][0]["name"], "w1");

    struct Case {
        method: &'static str,
        path: &'static str,
        status: u16,
        body_contains: &'static str,
        log_after: &'static str,
    }
    let cases = [
        Case {
            method: "GET",
            path: "/",
            status: 200,
            body_contains: "/config_dump",
            log_after: "info",
        },
        Case {
            method: "GET",
            path: "/logging",
            status: 405,
            body_contains: "Invalid HTTP method",
            log_after: "info",
        },
        Case {
            method: "POST",
            path: "/logging",
            status: 200,
            body_contains: "current log level is info",
            log_after: "info",
        },
        Case {
            method: "POST",
            path: "/logging?level=debug",
            status: 200,
            body_contains: "is debug",
            log_after: "debug",
        },
        Case {
            method: "POST",
            path: "/logging?level=access:trace",
            status: 200,
            body_contains: "is debug,access=trace",
            log_after: "debug,access=trace",
        },
        Case {
            method: "POST",
            path: "/logging?level=access:bogus",
            status: 400,
            body_contains: "usage",
            log_after: "debug,access=trace",
        },
        Case {
            method: "POST",
            path: "/logging?reset",
            status: 200,
            body_contains: "is info",
            log_after: "info",
        },
        // What `istioctl ztunnel-config log` sends: `level=` without --level, and
        // `level=info&reset` for -r.
        Case {
            method: "POST",
            path: "/logging?level=",
            status: 200,
            body_contains: "current log level is info",
            log_after: "info",
        },
        Case {
            method: "POST",
            path: "/logging?level=warn",
            status: 200,
            body_contains: "is warn",
            log_after: "warn",
        },
        Case {
            method: "POST",
            path: "/logging?level=access:bogus&reset",
            status: 400,
            body_contains: "usage",
            log_after: "warn",
        },
        Case {
            method: "POST",
            path: "/logging?level=info&reset",
            status: 200,
            body_contains: "is info",
            log_after: "info",
        },
        Case {
            method: "POST",
            path: "/logging?level=debug&bogus",
            status: 400,
            body_contains: "usage",
            log_after: "info",
        },
        Case {
            method: "GET",
            path: "/quitquitquit",
            status: 405,
            body_contains: "Invalid HTTP method",
            log_after: "info",
        },
        Case {
            method: "GET",
            path: "/nope",
            status: 404,
            body_contains: "",
            log_after: "info",
        },
    ];
    for case in &cases {
        let resp = request(addr, case.method, case.path, &[]).await;
        assert_eq!(
            resp.status, case.status,
            "{} {}: {}",
            case.method, case.path, resp.body
        );
        assert!(
            resp.body.contains(case.body_contains),
            "{} {}: {}",
            case.method,
            case.path,
            resp.body
        );
        assert_eq!(
            log.current(),
            case.log_after,
            "{} {}",
            case.method,
            case.path
        );
    }
    assert_eq!(quits.load(Ordering::SeqCst), 0, "GET must not shut down");

    let resp = request(addr, "POST", "/quitquitquit", &[]).await;
    assert_eq!(resp.status, 200);
    assert_eq!(quits.load(Ordering::SeqCst), 1);

    // A request head past the bound is refused, not buffered: 431, or a reset when the
    // server closes before reading what the client still had in flight.
    let mut big = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "x".repeat(20 * 1024)
    );
    let _ = big.write_all(head.as_bytes()).await;
    let mut raw = Vec::new();
    match tokio::time::timeout(Duration::from_secs(10), big.read_to_end(&mut raw))
        .await
        .unwrap()
    {
        Ok(_) => assert!(
            raw.starts_with(b"HTTP/1.1 431"),
            "{}",
            String::from_utf8_lossy(&raw)
        ),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset),
    }

    assert_eq!(
        trigger
            .start_drain_and_wait(DrainMode::Graceful, Duration::from_secs(10))
            .await,
        DrainOutcome::Completed
    );
    task.await.unwrap();
    wait_refused(addr).await;
}

#[test]
fn admin_refuses_non_loopback() {
    for addr in ["0.0.0.0:0", "[::]:0", "10.1.2.3:15000"] {
        let addr: SocketAddr = addr.parse().unwrap();
        let state = AdminState::new(ambit_ztunnel::admin::empty_source, || {});
        match AdminServer::bind(addr, state) {
            Err(AdminError::NotLoopback { addr: a }) => assert_eq!(a, addr),
            other => panic!("{addr}: expected NotLoopback, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn readiness_transitions_from_pending_to_ready() {
    let ready = Ready::new();
    let state = ready.register_task("state manager");
    let proxy = ready.register_task("workload proxy manager");
    let server = ReadinessServer::bind(LOCAL.parse().unwrap(), ready.clone()).unwrap();
    let addr = server.local_addr();
    let (trigger, watcher) = drain::new();
    let task = tokio::spawn(server.serve(watcher));

    let probe = |method: &'static str, path: &'static str| request(addr, method, path, &[]);
    let r = probe("GET", "/healthz/ready").await;
    assert_eq!(
        (r.status, r.body.trim()),
        (
            500,
            "not ready, pending: state manager, workload proxy manager"
        )
    );
    state.mark_ready();
    let r = probe("GET", "/healthz/ready").await;
    assert_eq!(
        (r.status, r.body.trim()),
        (500, "not ready, pending: workload proxy manager")
    );
    drop(proxy);
    for (method, path, status, body) in [
        ("GET", "/healthz/ready", 200, "ready"),
        ("POST", "/healthz/ready", 405, "method not allowed"),
        ("GET", "/healthz/live", 404, "not found"),
    ] {
        let r = probe(method, path).await;
        assert_eq!((r.status, r.body.trim()), (status, body), "{method} {path}");
    }

    assert_eq!(
        trigger
            .start_drain_and_wait(DrainMode::Graceful, Duration::from_secs(10))
            .await,
        DrainOutcome::Completed
    );
    task.await.unwrap();
    wait_refused(addr).await;
}

/// A client that holds a connection open keeps a graceful drain waiting only until the
/// deadline; then the server is forced down.
#[tokio::test]
async fn server_drain_forces_stuck_client_at_deadline() {
    let server = ReadinessServer::bind(LOCAL.parse().unwrap(), Ready::new()).unwrap();
    let addr = server.local_addr();
    let (trigger, watcher) = drain::new();
    let task = tokio::spawn(server.serve(watcher));

    // Half a request: the server is mid-request, so graceful shutdown cannot close it.
    let mut stuck = tokio::net::TcpStream::connect(addr).await.unwrap();
    stuck
        .write_all(b"GET /healthz/ready HTTP/1.1\r\n")
        .await
        .unwrap();
    // Make sure the server accepted it before draining (a full request round-trips).
    assert_eq!(
        request(addr, "GET", "/healthz/ready", &[]).await.status,
        200
    );

    let outcome = trigger
        .start_drain_and_wait(DrainMode::Graceful, Duration::from_millis(200))
        .await;
    assert_eq!(outcome, DrainOutcome::Forced { stuck: 0 });
    task.await.unwrap();
    let mut buf = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(10), stuck.read_to_end(&mut buf))
        .await
        .unwrap();
    assert!(
        matches!(n, Ok(0) | Err(_)),
        "stuck client closed, got {buf:?}"
    );
}
