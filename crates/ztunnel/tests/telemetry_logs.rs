//! Access-log records and the reloadable log filter, observed as the JSON lines a
//! subscriber writes.

// Test helpers panic on purpose: a failed step is a failed test.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use ambit_ztunnel::config::LogFormat;
use ambit_ztunnel::telemetry::{
    self, AccessLog, ConnectionLog, Direction, Metrics, Reporter, TrafficLabels,
};
use serde_json::Value;

#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buf {
    /// Takes the JSON records written so far.
    fn take(&self) -> Vec<Value> {
        let raw = std::mem::take(&mut *self.0.lock().unwrap());
        String::from_utf8(raw)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn outbound() -> ConnectionLog {
    let mut info = ConnectionLog::new(
        Direction::Outbound,
        addr("10.0.0.1:40000"),
        addr("10.0.0.2:15008"),
    );
    info.names.src_workload = Some("sleep".into());
    info.names.src_namespace = Some("default".into());
    info.names.dst_hbone_addr = Some("10.0.0.2:8080".into());
    info.names.dst_service = Some("echo.default.svc.cluster.local".into());
    info.names.dst_identity = Some("spiffe://cluster.local/ns/default/sa/echo".into());
    info
}

#[test]
fn access_log_records_and_runtime_levels() {
    let buf = Buf::default();
    let w = buf.clone();
    let (dispatch, log) =
        telemetry::logging::subscriber(LogFormat::Json, "info", move || w.clone()).unwrap();
    let metrics = Metrics::new("test");

    tracing::dispatcher::with_default(&dispatch, || {
        // Complete: INFO, bytes from the guard in access-log direction (sent = client → server).
        let guard = metrics.connection_opened(TrafficLabels::new(Reporter::Source));
        guard.add_received(7);
        guard.add_sent(3);
        AccessLog::opened(outbound()).complete_with(&guard, None);
        AccessLog::opened(outbound()).complete(0, 0, Some(&"connection reset by peer"));
        telemetry::connection_failed(
            addr("10.0.0.1:40001"),
            addr("10.0.0.3:80"),
            Direction::Inbound,
            &"policy rejection",
        );
        // Forced off whatever the filter says.
        tracing::error!(target: "hickory_server", "noise");
    });

    let records = buf.take();
    struct Want {
        level: &'static str,
        message: &'static str,
        fields: &'static [(&'static str, Value)],
        absent: &'static [&'static str],
    }
    let wants = [
        Want {
            level: "info",
            message: "connection complete",
            fields: &[],
            absent: &["error", "src.identity", "src.cluster"],
        },
        Want {
            level: "error",
            message: "connection complete",
            fields: &[],
            absent: &[],
        },
        Want {
            level: "warn",
            message: "connection failed",
            fields: &[],
            absent: &["src.workload", "bytes_sent"],
        },
    ];
    assert_eq!(records.len(), wants.len(), "{records:#?}");
    for (rec, want) in records.iter().zip(&wants) {
        assert_eq!(rec["level"], want.level, "{rec}");
        assert_eq!(rec["scope"], "access", "{rec}");
        assert_eq!(rec["message"], want.message, "{rec}");
        for (k, v) in want.fields {
            assert_eq!(&rec[k], v, "{k} in {rec}");
        }
        for k in want.absent {
            assert!(rec.get(*k).is_none(), "{k} should be absent in {rec}");
        }
    }
    let complete = &records[0];
    for (k, v) in [
        ("src.addr", "10.0.0.1:40000"),
        ("src.workload", "sleep"),
        ("src.namespace", "default"),
        ("dst.addr", "10.0.0.2:15008"),
        ("dst.hbone_addr", "10.0.0.2:8080"),
        ("dst.service", "echo.default.svc.cluster.local"),
        ("dst.identity", "spiffe://cluster.local/ns/default/sa/echo"),
        ("direction", "outbound"),
    ] {
        assert_eq!(complete[k], v, "{k}");
    }
    assert_eq!(complete["bytes_sent"], 7);
    assert_eq!(complete["bytes_recv"], 3);
    let duration = complete["duration"].as_str().unwrap();
    assert!(
        duration.ends_with("ms") && duration[..duration.len() - 2].parse::<u64>().is_ok(),
        "{duration}"
    );
    assert_eq!(records[1]["error"], "connection reset by peer");
    assert_eq!(records[2]["error"], "policy rejection");
    assert_eq!(records[2]["direction"], "inbound");

    // "connection opened" is DEBUG: visible only once the filter allows it, and the
    // hickory server stays silent even at trace.
    log.set("info,access=debug,hickory_server=trace").unwrap();
    tracing::dispatcher::with_default(&dispatch, || {
        let _open = AccessLog::opened(outbound());
        tracing::error!(target: "hickory_server", "noise");
    });
    let records = buf.take();
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0]["level"], "debug");
    assert_eq!(records[0]["message"], "connection opened");

    log.reset().unwrap();
    assert_eq!(log.current(), "info");
    tracing::dispatcher::with_default(&dispatch, || {
        let _open = AccessLog::opened(outbound());
    });
    assert!(buf.take().is_empty());
    assert!(log.set("info,access=loud").is_err());
    assert_eq!(log.current(), "info", "a rejected filter changes nothing");
}
