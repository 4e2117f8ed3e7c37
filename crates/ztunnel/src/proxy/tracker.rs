//! Open inbound connections and their authorization attributes, so a policy change can close
//! the ones that are now denied (§6: "re-evaluated when policies change").
//!
//! Connections are grouped by the workload they were authorized for, and a change re-checks
//! only the groups it can affect ([`Affected`]): a workload update touches its own
//! connections, a namespace or selector policy the workloads it applies to, a global policy
//! or a reload everything. The candidates are collected under the registry's lock (which
//! connection setup also takes) and evaluated after it is released.
//!
//! A connection is registered *before* it is authorized ([`ConnectionTracker::admit`]): a
//! change committed after the authorization's read of the state is then always followed by
//! a re-check that sees the connection, so no connection outlives a policy that denies it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ambit_model::Workload;
use ambit_model::authz::Connection;
use ambit_model::names::WorkloadUid;
use tokio::sync::Notify;

use crate::state::changes::{Affected, Since};
use crate::state::{AuthzOutcome, ProxyState};

type Group = HashMap<u64, Arc<Entry>>;

/// Registry of tracked inbound connections.
#[derive(Debug, Default)]
pub struct ConnectionTracker {
    next_id: AtomicU64,
    /// Destination workload → its connections. The maps hold pointers only, so their
    /// (doubling) tables stay small per connection.
    conns: Mutex<HashMap<WorkloadUid, Group>>,
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
        let mut conns = self.tracker.conns.lock().unwrap_or_else(|p| p.into_inner());
        let uid = &self.entry.workload.uid;
        if let Some(group) = conns.get_mut(uid) {
            group.remove(&self.id);
            if group.is_empty() {
                conns.remove(uid);
            }
        }
    }
}

/// The denial that closes a re-checked connection, if any.
fn recheck(state: &ProxyState, entry: &Entry) -> Option<String> {
    let outcome = match state.workload_by_uid(entry.workload.uid.as_str()) {
        Some(w) => state.authorize(&w, &entry.attrs),
        None => AuthzOutcome::Deny("destination workload removed".into()),
    };
    match outcome {
        AuthzOutcome::Allow => None,
        AuthzOutcome::Deny(reason) => Some(reason),
    }
}

impl ConnectionTracker {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Registers a connection without authorizing it (tests, and [`Self::admit`]).
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
            .entry(entry.workload.uid.clone())
            .or_default()
            .insert(id, entry.clone());
        TrackedConnection {
            id,
            tracker: self.clone(),
            entry,
        }
    }

    /// Registers the connection, then authorizes it against `state`: the tracked handle
    /// when allowed, the denial otherwise (nothing stays registered).
    pub fn admit(
        self: &Arc<Self>,
        state: &ProxyState,
        workload: Arc<Workload>,
        attrs: Connection,
    ) -> Result<TrackedConnection, String> {
        let tracked = self.track(workload, attrs);
        let entry = &tracked.entry;
        match state.authorize(&entry.workload, &entry.attrs) {
            AuthzOutcome::Allow => Ok(tracked),
            AuthzOutcome::Deny(reason) => Err(reason),
        }
    }

    pub fn len(&self) -> usize {
        self.conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(HashMap::len)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Re-checks every tracked connection; returns how many were told to close.
    pub fn reevaluate(&self, state: &ProxyState) -> usize {
        self.reevaluate_changes(state, &Since::Everything)
    }

    /// Re-checks the connections `changes` can affect; returns how many were told to close.
    pub fn reevaluate_changes(&self, state: &ProxyState, changes: &Since) -> usize {
        let candidates = self.candidates(state, changes);
        let mut closed = 0;
        for entry in candidates {
            if entry.close.is_set() {
                continue;
            }
            if let Some(reason) = recheck(state, &entry) {
                entry
                    .close
                    .set(format!("connection closed due to policy change: {reason}"));
                closed += 1;
            }
        }
        closed
    }

    /// The connections `changes` can affect, collected under the registry's lock.
    fn candidates(&self, state: &ProxyState, changes: &Since) -> Vec<Arc<Entry>> {
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        let all = || conns.values().flat_map(|g| g.values().cloned()).collect();
        let changes = match changes {
            Since::Everything => return all(),
            Since::Changes(c) if c.contains(&Affected::All) => return all(),
            Since::Changes(c) => c,
        };
        let mut uids: Vec<&WorkloadUid> = Vec::new();
        let policies: Vec<_> = changes
            .iter()
            .filter_map(|a| match a {
                Affected::Policy(key) => Some(key),
                _ => None,
            })
            .collect();
        for a in changes {
            if let Affected::Workload(uid) = a
                && let Some((uid, _)) = conns.get_key_value(uid)
            {
                uids.push(uid);
            }
        }
        if !policies.is_empty() {
            // One state lookup per workload with open connections, not per connection.
            for uid in conns.keys() {
                let applies = match state.workload_by_uid(uid.as_str()) {
                    Some(w) => policies.iter().any(|key| {
                        w.namespace() == key.namespace() || w.authorization_policies.contains(key)
                    }),
                    // Removed: re-checked, and so closed.
                    None => true,
                };
                if applies {
                    uids.push(uid);
                }
            }
        }
        uids.sort_unstable();
        uids.dedup();
        uids.iter()
            .filter_map(|uid| conns.get(*uid))
            .flat_map(|g| g.values().cloned())
            .collect()
    }

    /// Watches the state's policy generation and re-evaluates what each change can affect,
    /// until the state is dropped.
    pub async fn watch_policies(self: Arc<Self>, state: Arc<ProxyState>) {
        let mut generations = state.policy_changes();
        // Changes before this point found no connection to re-check.
        let mut seen = *generations.borrow_and_update();
        while generations.changed().await.is_ok() {
            let (changes, now) = state.changes_since(seen);
            seen = now;
            let n = self.reevaluate_changes(&state, &changes);
            if n > 0 {
                tracing::info!(closed = n, "policy change closed connections");
            }
        }
    }
}

#[cfg(test)]
mod changes_tests;

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
