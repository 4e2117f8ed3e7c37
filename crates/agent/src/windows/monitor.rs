//! What the Windows agent's health and metrics servers ([`crate::monitoring`], the Linux
//! agent's, on the same addresses and paths) read: readiness and the metrics, published by
//! the daemon loop ([`super::daemon::Daemon::with_monitor`]) after every event and step, and
//! by the agent for its ZDS pipe.
//!
//! Readiness (`/readyz` 200): the pod source's initial sync is done (every pod of the node
//! has been seen, so the pods that already run are being captured) *and* the ZDS pipe server
//! is listening (ztunnel can connect and be told about them). The Linux agent's other half,
//! the CNI installer's last pass, has no Windows twin: no CNI plugin is installed there.
//! Readiness does not wait for every pod to be enrolled (a pod that cannot be captured is
//! retried and reported per pod, as on Linux).
//!
//! Metrics: the Linux agent's names (`crate::daemon::metrics`) for what the Windows agent
//! also does, with the same help text and meaning:
//!
//! | metric | from |
//! |---|---|
//! | `ztunnel_connected` | the ZDS server's live connections |
//! | `ambit_enrolled_unprotected_pods` | enrolled pods left unprotected by the last completed verification pass ([`VerifyCounters::unprotected`]) |
//! | `ambit_pod_repairs_total` | repairs by verification ([`VerifyCounters::repairs`]: an endpoint whose policies were re-applied, a pod captured again) |
//! | `nodeagent_reconcile_events_total{type}` | pod events from the watch: `add` (a pod first seen), `update`, `delete` ([`PodEventCounts`]) |
//!
//! Not exported: the Linux agent's installer and plugin metrics (`istio_cni_install_ready`,
//! `istio_cni_installs_total`, `istio_cni_plugin_requests_total`: nothing on Windows
//! installs a plugin or answers one) and the count of verification passes, which the Linux
//! agent does not export either ([`VerifyCounters::passes`] stays in the daemon).

use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::daemon::{PodEventCounts, VerifyCounters};
use crate::monitoring::Monitored;

/// `type` label of `nodeagent_reconcile_events_total` (the Linux agent's).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabel {
    r#type: &'static str,
}

/// The Windows agent's readiness and metrics; shared (in an `Arc`) by the daemon loop, the
/// agent and the servers.
#[derive(Debug)]
pub struct WindowsMonitor {
    synced: AtomicBool,
    zds_listening: AtomicBool,
    ztunnel_connected: Gauge,
    unprotected: Gauge,
    repairs: Counter,
    reconcile_events: Family<TypeLabel, Counter>,
    registry: Registry,
}

impl Default for WindowsMonitor {
    fn default() -> Self {
        Self::new()
    }
}

impl WindowsMonitor {
    /// Not ready, every metric zero.
    pub fn new() -> Self {
        let ztunnel_connected = Gauge::default();
        let unprotected = Gauge::default();
        let repairs = Counter::default();
        let reconcile_events = Family::default();
        let mut r = Registry::default();
        // Names and help as the Linux agent registers them (a test compares them).
        r.register(
            "nodeagent_reconcile_events",
            "Pod events handled by type",
            reconcile_events.clone(),
        );
        r.register(
            "ztunnel_connected",
            "Number of ZDS connections",
            ztunnel_connected.clone(),
        );
        r.register(
            "ambit_enrolled_unprotected_pods",
            "Enrolled pods that were not protected after the last verification",
            unprotected.clone(),
        );
        r.register(
            "ambit_pod_repairs",
            "Repairs done by the verification loop",
            repairs.clone(),
        );
        Self {
            synced: AtomicBool::new(false),
            zds_listening: AtomicBool::new(false),
            ztunnel_connected,
            unprotected,
            repairs,
            reconcile_events,
            registry: r,
        }
    }

    /// The `ztunnel_connected` gauge, for the ZDS server to keep
    /// ([`crate::zds::ZdsServer::new`]).
    pub fn ztunnel_gauge(&self) -> Gauge {
        self.ztunnel_connected.clone()
    }

    /// Whether the ZDS pipe server is listening (set once the pipe exists, cleared when its
    /// server stops).
    pub fn set_zds_listening(&self, listening: bool) {
        self.zds_listening.store(listening, Ordering::SeqCst);
    }

    /// The daemon's state after an event or step: whether the source's initial sync is done,
    /// and its counters (totals so far; the exported counters follow them).
    pub fn publish(&self, synced: bool, verify: VerifyCounters, events: PodEventCounts) {
        self.synced.store(synced, Ordering::SeqCst);
        self.unprotected
            .set(i64::try_from(verify.unprotected).unwrap_or(i64::MAX));
        follow(&self.repairs, verify.repairs);
        for (t, total) in [
            ("add", events.add),
            ("update", events.update),
            ("delete", events.delete),
        ] {
            // A type appears once it has happened, as on Linux.
            if total > 0 {
                follow(
                    &self
                        .reconcile_events
                        .get_or_create(&TypeLabel { r#type: t }),
                    total,
                );
            }
        }
    }
}

/// Raises `counter` to `total` (the daemon's counts only grow).
fn follow(counter: &Counter, total: u64) {
    counter.inc_by(total.saturating_sub(counter.get()));
}

impl Monitored for WindowsMonitor {
    fn is_ready(&self) -> bool {
        self.synced.load(Ordering::SeqCst) && self.zds_listening.load(Ordering::SeqCst)
    }

    fn metrics_text(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `# HELP` and `# TYPE` lines: a metric's name, help and type.
    #[cfg(unix)]
    fn declarations(text: &str) -> Vec<String> {
        (text.lines())
            .filter(|l| l.starts_with("# HELP ") || l.starts_with("# TYPE "))
            .map(str::to_owned)
            .collect()
    }

    /// No name of its own: every metric the Windows agent exports is one the Linux agent
    /// exports, with the same help and type.
    #[cfg(unix)]
    #[test]
    fn every_windows_metric_is_a_linux_agent_metric() {
        let windows = declarations(&WindowsMonitor::new().metrics_text());
        let linux = declarations(&crate::daemon::metrics::Metrics::new().encode());
        assert_eq!(windows.len(), 8, "{windows:#?}");
        for d in &windows {
            assert!(linux.contains(d), "{d} not in the Linux agent's {linux:#?}");
        }
    }

    #[test]
    fn counters_follow_the_daemons_totals_and_event_types_appear_once_seen() {
        let m = WindowsMonitor::new();
        let cases = [
            (0, 0, PodEventCounts::default(), "", 0),
            (
                2,
                1,
                PodEventCounts {
                    add: 3,
                    update: 0,
                    delete: 0,
                },
                r#"{type="add"} 3"#,
                1,
            ),
            (
                5,
                0,
                PodEventCounts {
                    add: 3,
                    update: 4,
                    delete: 1,
                },
                r#"{type="delete"} 1"#,
                3,
            ),
        ];
        for (repairs, unprotected, events, line, types) in cases {
            let verify = VerifyCounters {
                passes: 9,
                repairs,
                unprotected,
            };
            m.publish(true, verify, events);
            let text = m.metrics_text();
            let has = |l: &str| text.lines().any(|t| t == l);
            assert!(has(&format!("ambit_pod_repairs_total {repairs}")), "{text}");
            let gauge = format!("ambit_enrolled_unprotected_pods {unprotected}");
            assert!(has(&gauge), "{text}");
            let event_lines = (text.lines())
                .filter(|l| l.starts_with("nodeagent_reconcile_events_total{"))
                .count();
            assert_eq!(event_lines, types, "{text}");
            let event = format!("nodeagent_reconcile_events_total{line}");
            assert!(types == 0 || has(&event), "{event} in {text}");
            assert!(!text.contains("passes"), "passes are not exported: {text}");
        }
    }
}
