//! The proxy's view of the mesh: workloads, services and authorization policies, indexed for
//! the data path, fed by the local config file and by xDS.
//!
//! Readers take a short read lock and clone `Arc`s out, so no lock is held across I/O. Every
//! change that can alter an authorization decision bumps a generation on a watch channel and
//! says what it touched in a bounded log ([`changes`]); the inbound connection tracker
//! re-evaluates the open connections it can affect when it moves (§6 "policy change closes
//! now-denied connections").
//!
//! Fail closed: a new state is *not synced*. Whoever feeds it marks it synced once every
//! source had its first complete response (xDS: both types ACKed once; local config only:
//! the file loaded), and it stays synced. Nothing may be evaluated against it before: an empty
//! policy set means "allow", which before the first Authorization response would be a lie.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use ambit_model::authz::{Authorization, PolicySet, Scope};
use ambit_model::names::{NamespacedHostname, PolicyKey, WorkloadUid};
use ambit_model::workload::{HealthStatus, PortMap};
use ambit_model::{NetworkAddr, Service, Workload};
use tokio::sync::watch;

pub mod changes;
pub mod dump;
mod sources;

use changes::{Affected, ChangeLog, Since};

use sources::{Owned, XdsChange};

/// A service endpoint resolved to its workload.
#[derive(Debug, Clone)]
pub struct ResolvedEndpoint {
    pub workload: Arc<Workload>,
    /// Endpoint-specific port map (service port → target port); may be empty.
    pub ports: PortMap,
}

#[derive(Debug, Default)]
struct Inner {
    workloads: HashMap<WorkloadUid, Arc<Workload>>,
    workloads_by_addr: HashMap<NetworkAddr, WorkloadUid>,
    /// namespace → name → uids: finding the workload a proxy serves (every inbound
    /// connection, every DNS query) is a lookup, not a scan over every workload.
    workloads_by_name: HashMap<String, HashMap<String, BTreeSet<WorkloadUid>>>,
    services: HashMap<NamespacedHostname, Arc<Service>>,
    services_by_vip: HashMap<NetworkAddr, NamespacedHostname>,
    /// Hostname → the services with it (one per namespace at most), ordered by key: a DNS
    /// query or a hostname CONNECT costs a lookup per candidate name, not a scan.
    services_by_host: HashMap<String, BTreeSet<NamespacedHostname>>,
    /// Service → member workloads with their port maps, derived from `Workload.services` and
    /// from endpoints listed on the service itself (local config).
    endpoints: HashMap<NamespacedHostname, BTreeMap<WorkloadUid, PortMap>>,
    policies: PolicySet,
    /// What the local config file owns (see [`sources`]).
    local: LocalOwned,
}

/// The local config file's keys per kind, and the xDS records they hide.
#[derive(Debug, Default)]
struct LocalOwned {
    workloads: Owned<WorkloadUid, Arc<Workload>>,
    services: Owned<NamespacedHostname, Arc<Service>>,
    policies: Owned<PolicyKey, Arc<Authorization>>,
}

/// Shared, thread-safe state store.
#[derive(Debug)]
pub struct ProxyState {
    inner: RwLock<Inner>,
    policy_generation: watch::Sender<u64>,
    /// What each generation touched; its lock also orders the generations.
    changes: Mutex<ChangeLog>,
    /// Turns true once, when every source had its first complete response.
    synced: watch::Sender<bool>,
}

impl Default for ProxyState {
    fn default() -> Self {
        Self::new()
    }
}

impl ProxyState {
    pub fn new() -> Self {
        Self {
            inner: RwLock::new(Inner::default()),
            policy_generation: watch::channel(0).0,
            changes: Mutex::new(ChangeLog::default()),
            synced: watch::channel(false).0,
        }
    }

    /// Marks the state synced: every source delivered its first complete response. Once
    /// synced it stays synced (later source outages keep the last known state).
    pub fn mark_synced(&self) {
        self.synced
            .send_if_modified(|s| !std::mem::replace(s, true));
    }

    /// Whether [`ProxyState::mark_synced`] was called.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Completes once the state is synced.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        // The sender lives as long as `self`, so this only ends when the value is true.
        let _ = rx.wait_for(|s| *s).await;
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters more than stopping the proxy would, so recover the guard.
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// A receiver that changes whenever authorization-relevant state changed.
    pub fn policy_changes(&self) -> watch::Receiver<u64> {
        self.policy_generation.subscribe()
    }

    /// What changed after generation `seen` (a value from [`Self::policy_changes`], or 0),
    /// and the generation that brings the reader to.
    pub fn changes_since(&self, seen: u64) -> (Since, u64) {
        self.changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .since(seen)
    }

    fn bump_policy(&self, affected: Affected) {
        let mut log = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let generation = log.push(affected);
        // Sent under the log's lock, so the channel's value never runs ahead of the log.
        self.policy_generation.send_replace(generation);
    }

    // ---- mutation ----------------------------------------------------------------------
    //
    // `upsert_*` / `remove_*` are the xDS source; `replace_local` is the local config file.
    // Each source owns its records (see [`sources`]).

    /// Inserts or replaces a workload (xDS resource name = uid).
    pub fn upsert_workload(&self, workload: Workload) {
        let uid = workload.uid.clone();
        {
            let mut inner = self.write();
            let Err(w) = inner.local.workloads.xds_upsert(&uid, Arc::new(workload)) else {
                return;
            };
            inner.remove_workload(uid.as_str());
            inner.insert_workload(w);
        }
        self.bump_policy(Affected::Workload(uid));
    }

    pub fn remove_workload(&self, uid: &str) -> bool {
        let removed = {
            let mut inner = self.write();
            let owned = WorkloadUid::new(uid)
                .ok()
                .is_some_and(|k| inner.local.workloads.xds_remove(&k) == XdsChange::Hidden);
            !owned && inner.remove_workload(uid)
        };
        if removed {
            // A uid the maps held is a valid one; should it not parse, re-check everything.
            self.bump_policy(
                WorkloadUid::new(uid)
                    .map(Affected::Workload)
                    .unwrap_or(Affected::All),
            );
        }
        removed
    }

    /// Inserts or replaces a service (xDS resource name = `namespace/hostname`).
    pub fn upsert_service(&self, service: Service) {
        let mut inner = self.write();
        let key = service.key.clone();
        let Err(s) = inner.local.services.xds_upsert(&key, Arc::new(service)) else {
            return;
        };
        inner.remove_service(&key);
        inner.insert_service(s);
    }

    pub fn remove_service(&self, key: &NamespacedHostname) -> bool {
        let mut inner = self.write();
        inner.local.services.xds_remove(key) == XdsChange::Apply && inner.remove_service(key)
    }

    pub fn upsert_policy(&self, policy: Authorization) {
        let key = policy.key.clone();
        let global = {
            let mut inner = self.write();
            let Err(p) = inner.local.policies.xds_upsert(&key, Arc::new(policy)) else {
                return;
            };
            let p = Arc::unwrap_or_clone(p);
            let global = p.scope == Scope::Global;
            let old = inner.policies.insert(p);
            global || old.is_some_and(|o| o.scope == Scope::Global)
        };
        self.bump_policy(policy_affects(key, global));
    }

    pub fn remove_policy(&self, key: &PolicyKey) -> bool {
        let removed = {
            let mut inner = self.write();
            if inner.local.policies.xds_remove(key) == XdsChange::Apply {
                inner.policies.remove(key)
            } else {
                None
            }
        };
        let Some(old) = removed else {
            return false;
        };
        self.bump_policy(policy_affects(key.clone(), old.scope == Scope::Global));
        true
    }

    /// The local config file (re)loaded: its records replace what it defined before, and
    /// nothing else. Records it no longer defines are removed, or replaced by the xDS record
    /// of the same key it hid.
    pub fn replace_local(
        &self,
        workloads: Vec<Workload>,
        services: Vec<Service>,
        policies: Vec<Authorization>,
    ) {
        {
            let mut guard = self.write();
            let inner = &mut *guard;
            let keys: HashSet<_> = workloads.iter().map(|w| w.uid.clone()).collect();
            let current = |k: &WorkloadUid| inner.workloads.get(k).cloned();
            for (uid, xds) in inner.local.workloads.replace(keys, current) {
                inner.remove_workload(uid.as_str());
                if let Some(w) = xds {
                    inner.insert_workload(w);
                }
            }
            for w in workloads {
                inner.remove_workload(w.uid.as_str());
                inner.insert_workload(Arc::new(w));
            }

            let keys: HashSet<_> = services.iter().map(|s| s.key.clone()).collect();
            let current = |k: &NamespacedHostname| inner.services.get(k).cloned();
            for (key, xds) in inner.local.services.replace(keys, current) {
                inner.remove_service(&key);
                if let Some(s) = xds {
                    inner.insert_service(s);
                }
            }
            for s in services {
                inner.remove_service(&s.key);
                inner.insert_service(Arc::new(s));
            }

            let keys: HashSet<_> = policies.iter().map(|p| p.key.clone()).collect();
            let current = |k: &PolicyKey| inner.policies.get(k).cloned();
            for (key, xds) in inner.local.policies.replace(keys, current) {
                inner.policies.remove(&key);
                if let Some(p) = xds {
                    inner.policies.insert(Arc::unwrap_or_clone(p));
                }
            }
            for p in policies {
                inner.policies.insert(p);
            }
        }
        self.bump_policy(Affected::All);
    }

    // ---- lookups -----------------------------------------------------------------------

    pub fn workload_by_uid(&self, uid: &str) -> Option<Arc<Workload>> {
        self.read().workloads.get(uid).cloned()
    }

    pub fn workload_by_addr(&self, network: &str, ip: IpAddr) -> Option<Arc<Workload>> {
        let inner = self.read();
        let uid = inner
            .workloads_by_addr
            .get(&NetworkAddr::new(network, ip))?;
        inner.workloads.get(uid).cloned()
    }

    pub fn service_by_vip(&self, network: &str, ip: IpAddr) -> Option<Arc<Service>> {
        let inner = self.read();
        let key = inner.services_by_vip.get(&NetworkAddr::new(network, ip))?;
        inner.services.get(key).cloned()
    }

    pub fn service_by_key(&self, key: &NamespacedHostname) -> Option<Arc<Service>> {
        self.read().services.get(key).cloned()
    }

    /// Services with this hostname in any namespace (DNS and hostname CONNECT targets),
    /// ordered by key.
    pub fn services_by_hostname(&self, hostname: &str) -> Vec<Arc<Service>> {
        let inner = self.read();
        let Some(keys) = inner.services_by_host.get(hostname) else {
            return Vec::new();
        };
        keys.iter()
            .filter_map(|k| inner.services.get(k).cloned())
            .collect()
    }

    pub fn all_services(&self) -> Vec<Arc<Service>> {
        self.read().services.values().cloned().collect()
    }

    pub fn all_workloads(&self) -> Vec<Arc<Workload>> {
        self.read().workloads.values().cloned().collect()
    }

    pub fn all_policies(&self) -> Vec<Arc<Authorization>> {
        self.read().policies.iter().cloned().collect()
    }

    /// Endpoints of a service, healthy or admitted by its health policy.
    pub fn endpoints(&self, service: &Service) -> Vec<ResolvedEndpoint> {
        let inner = self.read();
        let Some(members) = inner.endpoints.get(&service.key) else {
            return Vec::new();
        };
        members
            .iter()
            .filter_map(|(uid, ports)| {
                let workload = inner.workloads.get(uid)?;
                let status = service
                    .endpoints
                    .get(uid)
                    .map(|e| e.status)
                    .unwrap_or(workload.status);
                let healthy = status == HealthStatus::Healthy && workload.status == status;
                (healthy || service.admits(status)).then(|| ResolvedEndpoint {
                    workload: workload.clone(),
                    ports: ports.clone(),
                })
            })
            .collect()
    }

    /// The workload an in-pod proxy serves: matched by name, namespace and service account,
    /// restricted to `node` when given (§2.4; the ZDS uid is not used for lookup).
    pub fn find_local_workload(
        &self,
        name: &str,
        namespace: &str,
        service_account: &str,
        node: Option<&str>,
    ) -> Option<Arc<Workload>> {
        let inner = self.read();
        // The index is ordered by uid, so the first match is the smallest uid.
        inner
            .workloads_by_name
            .get(namespace)?
            .get(name)?
            .iter()
            .filter_map(|uid| inner.workloads.get(uid))
            .find(|w| w.service_account() == service_account && node.is_none_or(|n| w.node == n))
            .cloned()
    }

    /// Authorization decision for a connection to `workload`.
    pub fn authorize(
        &self,
        workload: &Workload,
        conn: &ambit_model::authz::Connection,
    ) -> AuthzOutcome {
        let inner = self.read();
        let decision = inner.policies.evaluate(workload, conn);
        AuthzOutcome::from_decision(&decision)
    }
}

/// The connections a change of policy `key` can affect: every one when the policy is (or
/// was) global.
fn policy_affects(key: PolicyKey, global: bool) -> Affected {
    if global {
        Affected::All
    } else {
        Affected::Policy(key)
    }
}

/// A decision detached from the state lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthzOutcome {
    Allow,
    Deny(String),
}

impl AuthzOutcome {
    fn from_decision(d: &ambit_model::authz::Decision<'_>) -> Self {
        match d.verdict {
            ambit_model::authz::Verdict::Allow => AuthzOutcome::Allow,
            ambit_model::authz::Verdict::Deny(reason) => AuthzOutcome::Deny(reason.to_string()),
        }
    }
}

impl Inner {
    fn insert_workload(&mut self, w: Arc<Workload>) {
        for addr in w.network_addrs() {
            self.workloads_by_addr.insert(addr, w.uid.clone());
        }
        self.workloads_by_name
            .entry(w.namespace().to_string())
            .or_default()
            .entry(w.name.clone())
            .or_default()
            .insert(w.uid.clone());
        for (svc, ports) in &w.services {
            self.endpoints
                .entry(svc.clone())
                .or_default()
                .insert(w.uid.clone(), ports.clone());
        }
        self.workloads.insert(w.uid.clone(), w);
    }

    fn remove_workload(&mut self, uid: &str) -> bool {
        let Some(old) = self.workloads.remove(uid) else {
            return false;
        };
        if let Some(names) = self.workloads_by_name.get_mut(old.namespace()) {
            if let Some(uids) = names.get_mut(&old.name) {
                uids.remove(&old.uid);
                if uids.is_empty() {
                    names.remove(&old.name);
                }
            }
            if names.is_empty() {
                self.workloads_by_name.remove(old.namespace());
            }
        }
        for addr in old.network_addrs() {
            if self
                .workloads_by_addr
                .get(&addr)
                .is_some_and(|u| u.as_str() == uid)
            {
                self.workloads_by_addr.remove(&addr);
            }
        }
        for svc in old.services.keys() {
            if let Some(members) = self.endpoints.get_mut(svc) {
                members.remove(uid);
            }
        }
        true
    }

    fn insert_service(&mut self, s: Arc<Service>) {
        for vip in &s.vips {
            self.services_by_vip.insert(vip.clone(), s.key.clone());
        }
        self.services_by_host
            .entry(s.hostname().to_string())
            .or_default()
            .insert(s.key.clone());
        // Endpoints listed on the service itself (local config form).
        for (uid, ep) in &s.endpoints {
            self.endpoints
                .entry(s.key.clone())
                .or_default()
                .insert(uid.clone(), ep.ports.clone());
        }
        self.services.insert(s.key.clone(), s);
    }

    fn remove_service(&mut self, key: &NamespacedHostname) -> bool {
        let Some(old) = self.services.remove(key) else {
            return false;
        };
        for vip in &old.vips {
            if self.services_by_vip.get(vip) == Some(key) {
                self.services_by_vip.remove(vip);
            }
        }
        if let Some(keys) = self.services_by_host.get_mut(old.hostname()) {
            keys.remove(key);
            if keys.is_empty() {
                self.services_by_host.remove(old.hostname());
            }
        }
        if let Some(members) = self.endpoints.get_mut(key) {
            for uid in old.endpoints.keys() {
                // Keep membership that workloads declare themselves.
                let declared = self
                    .workloads
                    .get(uid)
                    .is_some_and(|w| w.services.contains_key(key));
                if !declared {
                    members.remove(uid);
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests;
