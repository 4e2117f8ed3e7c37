//! Open inbound connections and their authorization attributes, so a policy change can close
//! the ones that are now denied (§6: "re-evaluated when policies change").

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ambit_model::authz::Connection;
use ambit_model::names::WorkloadUid;
use tokio::sync::watch;

use crate::state::{AuthzOutcome, ProxyState};

/// Registry of tracked inbound connections.
#[derive(Debug, Default)]
pub struct ConnectionTracker {
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Entry>>,
}

#[derive(Debug)]
struct Entry {
    workload: WorkloadUid,
    attrs: Connection,
    close: watch::Sender<Option<String>>,
}

/// Handle held by a connection task; unregisters on drop.
#[derive(Debug)]
pub struct TrackedConnection {
    id: u64,
    tracker: Arc<ConnectionTracker>,
    closed: watch::Receiver<Option<String>>,
}

impl TrackedConnection {
    /// Completes with the reason once the connection must be closed.
    pub async fn closed(&mut self) -> String {
        loop {
            if let Some(reason) = self.closed.borrow_and_update().clone() {
                return reason;
            }
            if self.closed.changed().await.is_err() {
                // The tracker entry vanished: nothing will ever close us.
                std::future::pending::<()>().await;
            }
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

    pub fn track(self: &Arc<Self>, workload: WorkloadUid, attrs: Connection) -> TrackedConnection {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (close, closed) = watch::channel(None);
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).insert(
            id,
            Entry {
                workload,
                attrs,
                close,
            },
        );
        TrackedConnection {
            id,
            tracker: self.clone(),
            closed,
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
            if entry.close.borrow().is_some() {
                continue;
            }
            let outcome = match state.workload_by_uid(entry.workload.as_str()) {
                Some(w) => state.authorize(&w, &entry.attrs),
                None => AuthzOutcome::Deny("destination workload removed".into()),
            };
            if let AuthzOutcome::Deny(reason) = outcome {
                entry.close.send_replace(Some(format!(
                    "connection closed due to policy change: {reason}"
                )));
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
