//! Open inbound connections and their authorization attributes, so a policy change can close
//! the ones that are now denied (§6: "re-evaluated when policies change").

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ambit_model::Workload;
use ambit_model::authz::Connection;
use tokio::sync::Notify;

use crate::state::{AuthzOutcome, ProxyState};

/// Registry of tracked inbound connections.
#[derive(Debug, Default)]
pub struct ConnectionTracker {
    next_id: AtomicU64,
    /// The map holds pointers only, so its (doubling) table stays small per connection.
    conns: Mutex<HashMap<u64, Arc<Entry>>>,
}

/// One tracked connection, shared by the registry and the connection's handle: a single
/// allocation per connection (a `watch` channel alone cost several hundred bytes, and this
/// is held for the connection's whole life).
#[derive(Debug)]
struct Entry {
    /// The record the connection was authorized against; re-evaluation looks up the
    /// current record by its uid.
    workload: Arc<Workload>,
    attrs: Connection,
    close: CloseSignal,
}

/// Set once with the reason a connection must close.
#[derive(Debug, Default)]
struct CloseSignal {
    reason: Mutex<Option<String>>,
    notify: Notify,
}

impl CloseSignal {
    fn reason(&self) -> Option<String> {
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn is_set(&self) -> bool {
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    fn set(&self, reason: String) {
        *self.reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason);
        self.notify.notify_waiters();
    }
}

/// Handle held by a connection task; unregisters on drop.
#[derive(Debug)]
pub struct TrackedConnection {
    id: u64,
    tracker: Arc<ConnectionTracker>,
    entry: Arc<Entry>,
}

impl TrackedConnection {
    /// Completes with the reason once the connection must be closed.
    pub async fn closed(&mut self) -> String {
        loop {
            // Registered before checking, so a reason set in between is not missed.
            let close = &self.entry.close;
            let notified = close.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if let Some(reason) = close.reason() {
                return reason;
            }
            notified.await;
        }
    }
}

impl Drop for TrackedConnection {
    fn drop(&mut self) {
        self.tracker
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

impl ConnectionTracker {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn track(
        self: &Arc<Self>,
        workload: Arc<Workload>,
        attrs: Connection,
    ) -> TrackedConnection {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(Entry {
            workload,
            attrs,
            close: CloseSignal::default(),
        });
        self.conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, entry.clone());
        TrackedConnection {
            id,
            tracker: self.clone(),
            entry,
        }
    }

    pub fn len(&self) -> usize {
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Re-checks every tracked connection; returns how many were told to close.
    pub fn reevaluate(&self, state: &ProxyState) -> usize {
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        let mut closed = 0;
        for entry in conns.values() {
            if entry.close.is_set() {
                continue;
            }
            let outcome = match state.workload_by_uid(entry.workload.uid.as_str()) {
                Some(w) => state.authorize(&w, &entry.attrs),
                None => AuthzOutcome::Deny("destination workload removed".into()),
            };
            if let AuthzOutcome::Deny(reason) = outcome {
                entry
                    .close
                    .set(format!("connection closed due to policy change: {reason}"));
                closed += 1;
            }
        }
        closed
    }

    /// Watches the state's policy generation and re-evaluates on every change, until the
    /// state is dropped or `stop` fires.
    pub async fn watch_policies(self: Arc<Self>, state: Arc<ProxyState>) {
        let mut changes = state.policy_changes();
        while changes.changed().await.is_ok() {
            let n = self.reevaluate(&state);
            if n > 0 {
                tracing::info!(closed = n, "policy change closed connections");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use ambit_model::{SpiffeId, WorkloadUid};

    use super::*;

    fn conn() -> (Arc<Workload>, Connection) {
        let w = Workload::new(
            WorkloadUid::new("Kubernetes//Pod/default/gone").unwrap(),
            "gone",
            SpiffeId::parse("spiffe://cluster.local/ns/default/sa/default").unwrap(),
        );
        let attrs = Connection {
            src_identity: None,
            src_ip: "10.0.0.2".parse().unwrap(),
            dst_ip: "10.0.0.1".parse().unwrap(),
            dst_port: 80,
        };
        (Arc::new(w), attrs)
    }

    #[tokio::test]
    async fn denied_connections_are_told_why_whether_waiting_already_or_not() {
        let tracker = ConnectionTracker::new();
        let state = ProxyState::new();
        let (w, attrs) = conn();
        let mut waiting = tracker.track(w.clone(), attrs.clone());
        let waiter = tokio::spawn(async move { waiting.closed().await });
        tokio::task::yield_now().await;
        let mut later = tracker.track(w, attrs);
        assert_eq!(tracker.len(), 2);
        // The workload is not in the state: both connections are now denied, once.
        assert_eq!(tracker.reevaluate(&state), 2);
        assert_eq!(tracker.reevaluate(&state), 0);
        let reason = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(reason.contains("destination workload removed"), "{reason}");
        assert_eq!(later.closed().await, reason);
        drop(later);
        assert!(tracker.is_empty());
    }

    #[tokio::test]
    async fn allowed_connections_keep_waiting() {
        let tracker = ConnectionTracker::new();
        let (w, attrs) = conn();
        let mut tracked = tracker.track(w, attrs);
        let closed = tokio::time::timeout(Duration::from_millis(50), tracked.closed()).await;
        assert!(closed.is_err());
    }
}
