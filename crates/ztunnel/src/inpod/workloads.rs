//! The per-pod state machine (§2.3, §2.4): which pods run, which are pending, what this
//! connection's snapshot named, readiness and the `workload_manager_*` metrics.
//!
//! Only the client loop mutates pods (one request at a time), so a start or drain never
//! races another; the table lock is held only for map updates, never across an await, so
//! `/config_dump` can read it at any time.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::platform::PodNetns;
use super::pod::{self, PodProxy};
use super::{InpodManager, READINESS_TASK, Request, ZdsError};
use crate::drain::DrainMode;
use crate::proxy::LocalWorkload;
use crate::readiness::{BlockReady, Ready};

/// A pod whose proxies run.
#[derive(Debug)]
struct Running {
    info: LocalWorkload,
    proxy: PodProxy,
}

/// A pod whose start failed; retried while the connection lasts.
#[derive(Debug)]
struct Pending {
    info: LocalWorkload,
    netns: PodNetns,
}

/// Pods and per-connection protocol state.
#[derive(Debug)]
pub(super) struct Table {
    running: BTreeMap<String, Running>,
    pending: BTreeMap<String, Pending>,
    /// This connection's `SnapshotSent` was processed.
    snapshot_done: bool,
    /// Uids named by Add/Keep since this connection started (before its snapshot).
    keep: BTreeSet<String>,
    /// Held while not ready.
    not_ready: Option<BlockReady>,
}

impl Table {
    pub(super) fn new(ready: &Ready) -> Self {
        Self {
            running: BTreeMap::new(),
            pending: BTreeMap::new(),
            snapshot_done: false,
            keep: BTreeSet::new(),
            not_ready: Some(ready.register_task(READINESS_TASK)),
        }
    }

    pub(super) fn dump(&self) -> Value {
        let info = |i: &LocalWorkload| {
            json!({
                "name": i.name,
                "namespace": i.namespace,
                "serviceAccount": i.service_account,
            })
        };
        let mut out = serde_json::Map::new();
        for (uid, r) in &self.running {
            out.insert(uid.clone(), json!({"state": "Up", "info": info(&r.info)}));
        }
        for (uid, p) in &self.pending {
            out.insert(
                uid.clone(),
                json!({"state": "Pending", "info": info(&p.info)}),
            );
        }
        Value::Object(out)
    }
}

impl InpodManager {
    /// Handles one request; `Ok` is an ACK, `Err` a NACK with that message.
    pub(super) async fn handle(&self, req: Request) -> Result<(), ZdsError> {
        match req {
            Request::Add { uid, info, netns } => {
                let info = LocalWorkload {
                    name: info.name,
                    namespace: info.namespace,
                    service_account: info.service_account,
                };
                self.add(uid.into_string(), info, netns).await
            }
            Request::Keep { uid } => {
                let uid = uid.into_string();
                let mut t = self.lock();
                if t.snapshot_done {
                    return Err(ZdsError::KeepAfterSnapshot { uid });
                }
                t.keep.insert(uid);
                Ok(())
            }
            Request::Del { uid } => {
                let uid = uid.into_string();
                let removed = {
                    let mut t = self.lock();
                    t.pending.remove(&uid);
                    let removed = if t.snapshot_done {
                        t.running.remove(&uid)
                    } else {
                        // Before the snapshot a Del only un-names the pod; the snapshot then
                        // stops it.
                        t.keep.remove(&uid);
                        None
                    };
                    self.sync(&mut t);
                    removed
                };
                if let Some(r) = removed {
                    tracing::info!(uid, "pod removed, draining its proxies");
                    self.stop(vec![r], DrainMode::Immediate).await;
                }
                Ok(())
            }
            Request::SnapshotSent => {
                let stale = {
                    let mut t = self.lock();
                    if t.snapshot_done {
                        return Err(ZdsError::DuplicateSnapshot);
                    }
                    t.snapshot_done = true;
                    let keep = std::mem::take(&mut t.keep);
                    t.pending.retain(|uid, _| keep.contains(uid));
                    let stale: Vec<String> = t
                        .running
                        .keys()
                        .filter(|uid| !keep.contains(*uid))
                        .cloned()
                        .collect();
                    let stale: Vec<Running> = stale
                        .iter()
                        .filter_map(|uid| t.running.remove(uid))
                        .collect();
                    self.sync(&mut t);
                    stale
                };
                tracing::info!(
                    stopped = stale.len(),
                    "snapshot received; stopping pods the agent no longer knows"
                );
                self.stop(stale, DrainMode::Immediate).await;
                Ok(())
            }
        }
    }

    async fn add(&self, uid: String, info: LocalWorkload, netns: PodNetns) -> Result<(), ZdsError> {
        let replaced = {
            let mut t = self.lock();
            if !t.snapshot_done {
                t.keep.insert(uid.clone());
            }
            if let Some(r) = t.running.get(&uid)
                && r.proxy.netns == netns.identity()
            {
                if r.info != info {
                    tracing::warn!(
                        uid,
                        "AddWorkload repeated with different workload info; keeping the running proxy"
                    );
                }
                return Ok(());
            }
            t.pending.remove(&uid);
            let replaced = t.running.remove(&uid);
            self.sync(&mut t);
            replaced
        };
        if let Some(old) = replaced {
            tracing::info!(uid, old = %old.proxy.netns, new = %netns.identity(), "pod netns changed, replacing its proxies");
            self.stop(vec![old], DrainMode::Immediate).await;
        }
        let wait = self.inputs.workload_wait;
        let result = pod::start(&self.inputs, &uid, &info, &netns, wait).await;
        let mut t = self.lock();
        let outcome = match result {
            Ok(proxy) => {
                self.inputs.metrics.workload_manager().proxies_started.inc();
                t.running.insert(uid, Running { info, proxy });
                Ok(())
            }
            Err(e) => {
                tracing::warn!(uid, error = %e, "failed to start the pod's proxies; will retry");
                t.pending.insert(uid, Pending { info, netns });
                Err(e.into())
            }
        };
        self.sync(&mut t);
        outcome
    }

    /// Retries every pending pod once (no waiting for workload records: the client loop
    /// must stay responsive to the agent).
    pub(super) async fn retry_pending(&self) {
        let pending: Vec<(String, LocalWorkload, Option<PodNetns>)> = self
            .lock()
            .pending
            .iter()
            .map(|(uid, p)| (uid.clone(), p.info.clone(), p.netns.try_clone().ok()))
            .collect();
        for (uid, info, netns) in pending {
            let Some(netns) = netns else { continue };
            match pod::start(&self.inputs, &uid, &info, &netns, std::time::Duration::ZERO).await {
                Ok(proxy) => {
                    tracing::info!(uid, "pending pod started");
                    self.inputs.metrics.workload_manager().proxies_started.inc();
                    let mut t = self.lock();
                    t.pending.remove(&uid);
                    t.running.insert(uid, Running { info, proxy });
                    self.sync(&mut t);
                }
                Err(e) => tracing::debug!(uid, error = %e, "pending pod still failing"),
            }
        }
    }

    /// Whether any pod is pending (the client loop only retries then).
    pub(super) fn has_pending(&self) -> bool {
        !self.lock().pending.is_empty()
    }

    /// A new connection starts (or the old one ended): forget its snapshot and pending pods;
    /// running proxies stay until the next snapshot reconciles them.
    pub(super) fn reset_connection(&self) {
        let mut t = self.lock();
        t.snapshot_done = false;
        t.keep.clear();
        t.pending.clear();
        self.sync(&mut t);
    }

    /// Global shutdown: every pod drains gracefully.
    pub(super) async fn shutdown(&self) {
        let all: Vec<Running> = {
            let mut t = self.lock();
            t.pending.clear();
            let all = std::mem::take(&mut t.running).into_values().collect();
            self.sync(&mut t);
            all
        };
        tracing::info!(pods = all.len(), "draining every pod's proxies");
        self.stop(all, DrainMode::Graceful).await;
    }

    /// Drains `pods` concurrently and forgets certificates no running pod needs any more.
    async fn stop(&self, pods: Vec<Running>, mode: DrainMode) {
        if pods.is_empty() {
            return;
        }
        let deadline = match mode {
            DrainMode::Graceful => self.inputs.cfg.connection_termination_deadline,
            DrainMode::Immediate => std::time::Duration::ZERO,
        };
        let count = pods.len() as u64;
        let identities: BTreeSet<_> = pods.iter().map(|r| r.proxy.identity.clone()).collect();
        let data = &self.inputs.data;
        futures_util::future::join_all(
            pods.into_iter()
                .map(|r| r.proxy.drain(data, mode, deadline)),
        )
        .await;
        self.inputs
            .metrics
            .workload_manager()
            .proxies_stopped
            .inc_by(count);
        let t = self.lock();
        for id in identities {
            if !t.running.values().any(|r| r.proxy.identity == id) {
                self.inputs.certs.forget(&id);
            }
        }
    }

    /// Publishes gauges and readiness after a table change.
    fn sync(&self, t: &mut Table) {
        let wm = self.inputs.metrics.workload_manager();
        wm.active_proxies.set(t.running.len() as i64);
        wm.pending_proxies.set(t.pending.len() as i64);
        let blocked = !t.snapshot_done || !t.pending.is_empty();
        match (blocked, t.not_ready.is_some()) {
            (true, false) => t.not_ready = Some(self.ready.register_task(READINESS_TASK)),
            (false, true) => t.not_ready = None,
            _ => {}
        }
    }
}
