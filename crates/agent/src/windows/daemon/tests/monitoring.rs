//! The Windows agent's health and metrics servers ([`crate::monitoring`] over a
//! [`WindowsMonitor`]) on 127.0.0.1:0, fed by a daemon over the fakes: `/readyz` follows the
//! initial sync and the ZDS pipe, `/metrics` the daemon's counters, one change at a time.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;

use super::*;
use crate::monitoring::MonitoringServers;

/// One GET: (status, content type, body).
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let content_type = (head.lines())
        .find_map(|l| l.strip_prefix("content-type: "))
        .unwrap_or_default();
    (status, content_type.to_owned(), body.to_owned())
}

/// A sample's value in the exposition (`name` with its labels, as printed).
fn sample(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// A change to the node or the daemon's input.
#[derive(Debug, Clone, Copy)]
enum Change {
    None,
    PipeListening(bool),
    /// `web` (ambient, one namespace with endpoints 1 and 2) seen by the watch.
    PodSeen,
    /// The initial sync, and `web` enrolled by the step after it.
    SyncedAndEnrolled,
    /// Both policies removed from endpoint 2 out of band, then a pass.
    PoliciesRemovedThenPass,
    /// HNS does not answer for the namespace, then a pass.
    HnsDownThenPass,
    /// HNS answers again, then a pass.
    HnsBackThenPass,
    /// What the ZDS server does when ztunnel connects.
    ZtunnelConnects,
    PodDeleted,
}

struct Case {
    change: Change,
    /// `/readyz`'s status after it.
    ready: u16,
    /// Samples that must read so after it.
    samples: &'static [(&'static str, u64)],
}

const REPAIRS: &str = "ambit_pod_repairs_total";
const UNPROTECTED: &str = "ambit_enrolled_unprotected_pods";
const ADDS: &str = r#"nodeagent_reconcile_events_total{type="add"}"#;
const DELETES: &str = r#"nodeagent_reconcile_events_total{type="delete"}"#;

#[tokio::test]
async fn readyz_follows_the_sync_and_the_pipe_and_metrics_follow_the_daemons_counters() {
    let monitor = Arc::new(WindowsMonitor::new());
    let mut h = Harness::verifying();
    h.d = daemon(
        &h.node,
        &h.zt,
        &h.source,
        Some(Duration::from_millis(PERIOD_MS)),
    )
    .with_monitor(monitor.clone());
    let any = "127.0.0.1:0".parse().unwrap();
    let servers = MonitoringServers::bind(any, any).await.unwrap();
    let (health, metrics) = (servers.health_addr, servers.metrics_addr);
    let (stop, stopped) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let limits = ambit_http::Limits::default();
    servers.spawn(&mut tasks, limits, monitor.clone(), stopped);

    let web = pod("web", true);
    let mut pass = 0;
    let cases = [
        Case {
            change: Change::None,
            ready: 503,
            samples: &[(REPAIRS, 0), (UNPROTECTED, 0), ("ztunnel_connected", 0)],
        },
        Case {
            change: Change::PipeListening(true),
            ready: 503,
            samples: &[],
        },
        Case {
            change: Change::PodSeen,
            ready: 503,
            samples: &[(ADDS, 1)],
        },
        Case {
            change: Change::SyncedAndEnrolled,
            ready: 200,
            samples: &[(ADDS, 1), (REPAIRS, 0)],
        },
        Case {
            change: Change::PipeListening(false),
            ready: 503,
            samples: &[],
        },
        Case {
            change: Change::PipeListening(true),
            ready: 200,
            samples: &[],
        },
        Case {
            change: Change::PoliciesRemovedThenPass,
            ready: 200,
            samples: &[(REPAIRS, 1), (UNPROTECTED, 0)],
        },
        Case {
            change: Change::HnsDownThenPass,
            ready: 200,
            samples: &[(REPAIRS, 1), (UNPROTECTED, 1)],
        },
        Case {
            change: Change::HnsBackThenPass,
            ready: 200,
            samples: &[(REPAIRS, 1), (UNPROTECTED, 0)],
        },
        Case {
            change: Change::ZtunnelConnects,
            ready: 200,
            samples: &[("ztunnel_connected", 1)],
        },
        Case {
            change: Change::PodDeleted,
            ready: 200,
            samples: &[(ADDS, 1), (DELETES, 1), (REPAIRS, 1)],
        },
    ];
    for Case {
        change,
        ready,
        samples,
    } in cases
    {
        match change {
            Change::None => {}
            Change::PipeListening(on) => monitor.set_zds_listening(on),
            Change::PodSeen => {
                h.node.hns_namespace(1, 1, &[1, 2]);
                h.node.script(&web.uid, &[Answer::Captured(hns(1, 1))]);
                h.upsert(web.clone(), 0);
            }
            Change::SyncedAndEnrolled => {
                h.sync();
                h.step(0).await;
                assert_eq!(h.phase("web"), Some(Phase::Enrolled));
            }
            Change::PoliciesRemovedThenPass | Change::HnsDownThenPass | Change::HnsBackThenPass => {
                match change {
                    Change::PoliciesRemovedThenPass => edit_policies(&h.node, 2, Vec::clear),
                    Change::HnsDownThenPass => h.node.state().hns.namespace_fails = u32::MAX,
                    _ => h.node.state().hns.namespace_fails = 0,
                }
                // Each pass is due one period after the previous one ended.
                pass += 1;
                pass_at(&mut h, pass * PERIOD_MS).await;
            }
            Change::ZtunnelConnects => {
                monitor.ztunnel_gauge().set(1);
            }
            Change::PodDeleted => h.delete(&web, pass * PERIOD_MS),
        }
        let what = format!("{change:?}");
        assert_eq!(get(health, "/healthz").await.0, 200, "{what}");
        let (status, _, body) = get(health, "/readyz").await;
        assert_eq!(status, ready, "{what}: {body}");
        let (status, content_type, text) = get(metrics, "/metrics").await;
        assert_eq!(status, 200, "{what}");
        assert!(
            content_type.starts_with("application/openmetrics-text"),
            "{content_type}"
        );
        for &(name, want) in samples {
            assert_eq!(sample(&text, name), Some(want), "{what}: {name} in\n{text}");
        }
    }
    // Each server answers only its own paths, as the Linux agent's.
    for (addr, path) in [(health, "/metrics"), (metrics, "/readyz"), (health, "/")] {
        assert_eq!(get(addr, path).await.0, 404, "{addr}{path}");
    }
    stop.send_replace(true);
    while tasks.join_next().await.is_some() {}
}
