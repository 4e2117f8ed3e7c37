//! WorkloadEntry auto-registration: a VM's ztunnel that opens an xDS stream with
//! `AUTO_REGISTER_GROUP` in its node metadata, and a token proving the group's identity, gets a
//! WorkloadEntry built from the group, served as a workload for as long as it stays connected
//! and for a grace period after (istiod's `pilot/pkg/autoregistration`, facts in `docs/vm.md`).
//!
//! - The entry is named `<group>-<address, ':' as '-'>[-<network>]` (cut from the front to 253
//!   characters), lives in the group's namespace, carries the group's template with
//!   `spec.address` the node's first `INSTANCE_IPS` (else the connection's address); labels
//!   are the template's, then the group's `metadata.labels`, then the node's `LABELS` (each
//!   over the one before; `istio-locality` dropped), plus `networking.istio.io/tunnel: http`
//!   (ztunnel accepts HBONE); annotations `istio.io/autoRegistrationGroup`, the group's
//!   `metadata.annotations`, `istio.io/workloadController`, `istio.io/connectedAt` (or, once
//!   disconnected, `istio.io/disconnectedAt`); the node's `NETWORK` and locality win over the
//!   template's.
//! - Fail closed: the stream's verified identity (a workload token; a node proxy's token or
//!   none refuses) must be the group's: same trust domain, namespace (= the node's
//!   `NAMESPACE`) and service account (the template's, `default` when empty). A missing group,
//!   an address that is not a usable IP or already a pod's (on any network) or another
//!   entry's (on the same network), a full group
//!   ([`AutoRegistrationConfig::max_entries_per_group`]) or malformed metadata refuse the
//!   stream, and nothing is registered.
//! - A second stream for the same entry shares it; when the last one ends the entry is kept
//!   for [`AutoRegistrationConfig::grace_period`] and removed unless a stream came back.
//! - Entries live in memory (no API server to write them to); the publisher merges them into
//!   each translated cluster ([`Registry::merge`]). A declared entry of the same name wins, and
//!   an entry whose group is gone is not served.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, SystemTime};

use ambit_proto::core::Node;
use prost_types::value::Kind;
use prost_types::{Struct, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::objects::meta::{OwnerReference, Timestamp, stable_uid};
use crate::objects::{Object, ObjectMeta, Origin, Resource, WorkloadEntry, WorkloadGroup};
use crate::translate::Cluster;
use crate::translate::workload_entry::AUTO_REGISTRATION_GROUP_ANNOTATION;
use crate::xds::{ConnectHook, Connection, ConnectionGuard, XdsPeer};

/// istiod's `PILOT_WORKLOAD_ENTRY_GRACE_PERIOD` default.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(10);
/// Default bound on the entries one group may register.
pub const DEFAULT_MAX_ENTRIES_PER_GROUP: usize = 1024;
/// Most labels a node may bring.
pub const MAX_NODE_LABELS: usize = 256;

/// Node metadata keys (pilot-agent's and ztunnel's spelling).
pub const META_GROUP: &str = "AUTO_REGISTER_GROUP";
pub const META_NAMESPACE: &str = "NAMESPACE";
pub const META_INSTANCE_IPS: &str = "INSTANCE_IPS";
pub const META_NETWORK: &str = "NETWORK";
pub const META_LABELS: &str = "LABELS";

/// Annotations istiod writes on auto-registered entries.
pub const CONTROLLER_ANNOTATION: &str = "istio.io/workloadController";
pub const CONNECTED_AT_ANNOTATION: &str = "istio.io/connectedAt";
pub const DISCONNECTED_AT_ANNOTATION: &str = "istio.io/disconnectedAt";
/// The label istiod sets on an entry whose proxy accepts HBONE, and its value.
pub const TUNNEL_LABEL: &str = "networking.istio.io/tunnel";
pub const TUNNEL_HTTP: &str = "http";
/// A node label istiod drops (the locality is carried by the entry's own field).
const LOCALITY_LABEL: &str = "istio-locality";

/// Where merged entries say they came from.
pub const ORIGIN: &str = "auto-registration";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoRegistrationConfig {
    /// How long an entry outlives its last stream.
    pub grace_period: Duration,
    /// Most entries one WorkloadGroup may hold at once.
    pub max_entries_per_group: usize,
    /// `istio.io/workloadController` on the entries (istiod's instance id).
    pub instance_id: String,
}

impl Default for AutoRegistrationConfig {
    fn default() -> Self {
        Self {
            grace_period: DEFAULT_GRACE_PERIOD,
            max_entries_per_group: DEFAULT_MAX_ENTRIES_PER_GROUP,
            instance_id: "ambit-control".to_string(),
        }
    }
}

/// Why a stream may not register (it is refused with the matching gRPC status).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    #[error("auto-registration needs a workload identity; {peer} has none")]
    NoIdentity { peer: String },
    #[error("node metadata {key}: {reason}")]
    Metadata { key: &'static str, reason: String },
    #[error("identity {identity} is not in trust domain {trust_domain}")]
    TrustDomain {
        identity: String,
        trust_domain: String,
    },
    #[error("identity {identity} is not in namespace {namespace}")]
    Namespace { identity: String, namespace: String },
    #[error("WorkloadGroup {namespace}/{group} not found")]
    GroupNotFound { namespace: String, group: String },
    #[error("identity {identity} is not service account {service_account} of {entry}")]
    ServiceAccount {
        identity: String,
        service_account: String,
        entry: String,
    },
    #[error("no usable address: {reason}")]
    Address { reason: String },
    #[error("address {address} is already {holder}'s")]
    AddressInUse { address: IpAddr, holder: String },
    #[error("entry name {name:?}: {reason}")]
    Name { name: String, reason: String },
    #[error("WorkloadGroup {namespace}/{group} already holds {max} entries")]
    GroupFull {
        namespace: String,
        group: String,
        max: usize,
    },
}

impl From<RegisterError> for tonic::Status {
    fn from(e: RegisterError) -> Self {
        let message = format!("auto-registration refused: {e}");
        match e {
            RegisterError::GroupNotFound { .. } => tonic::Status::failed_precondition(message),
            RegisterError::GroupFull { .. } => tonic::Status::resource_exhausted(message),
            RegisterError::Metadata { .. }
            | RegisterError::Address { .. }
            | RegisterError::Name { .. } => tonic::Status::invalid_argument(message),
            RegisterError::NoIdentity { .. }
            | RegisterError::TrustDomain { .. }
            | RegisterError::Namespace { .. }
            | RegisterError::ServiceAccount { .. }
            | RegisterError::AddressInUse { .. } => tonic::Status::permission_denied(message),
        }
    }
}

/// (namespace, name).
type Key = (String, String);

struct Registered {
    entry: WorkloadEntry,
    group: String,
    connections: usize,
    /// Bumped on every connect and disconnect; a cleanup only removes the epoch it saw.
    epoch: u64,
    cleanup: Option<JoinHandle<()>>,
}

struct Shared {
    config: AutoRegistrationConfig,
    cluster: RwLock<Arc<Cluster>>,
    entries: Mutex<BTreeMap<Key, Registered>>,
    changes: watch::Sender<u64>,
    runtime: tokio::runtime::Handle,
}

/// The auto-registered entries. Cheap to clone.
#[derive(Clone)]
pub struct Registry {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("config", &self.shared.config)
            .field("entries", &self.lock().len())
            .finish()
    }
}

/// Held by a registered stream; dropping it starts the grace period (when it was the last).
pub struct Registration {
    shared: Weak<Shared>,
    key: Key,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Registration({}/{})", self.key.0, self.key.1)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            disconnect(&shared, &self.key);
        }
    }
}

fn now() -> String {
    let d = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos(),
    }
    .to_string()
}

fn lock_entries(shared: &Shared) -> std::sync::MutexGuard<'_, BTreeMap<Key, Registered>> {
    shared.entries.lock().unwrap_or_else(|p| p.into_inner())
}

fn changed(shared: &Shared) {
    shared.changes.send_modify(|v| *v += 1);
}

fn disconnect(shared: &Arc<Shared>, key: &Key) {
    let mut entries = lock_entries(shared);
    let Some(r) = entries.get_mut(key) else {
        return;
    };
    r.connections = r.connections.saturating_sub(1);
    if r.connections > 0 {
        return;
    }
    r.epoch += 1;
    let annotations = &mut r.entry.metadata.annotations;
    annotations.remove(CONNECTED_AT_ANNOTATION);
    annotations.insert(DISCONNECTED_AT_ANNOTATION.to_string(), now());
    let (epoch, grace, weak) = (r.epoch, shared.config.grace_period, Arc::downgrade(shared));
    let key2 = key.clone();
    let task = shared.runtime.spawn(async move {
        tokio::time::sleep(grace).await;
        let Some(shared) = weak.upgrade() else {
            return;
        };
        let mut entries = lock_entries(&shared);
        if entries
            .get(&key2)
            .is_some_and(|r| r.epoch == epoch && r.connections == 0)
        {
            entries.remove(&key2);
            drop(entries);
            tracing::info!(namespace = %key2.0, name = %key2.1, "auto-registered WorkloadEntry removed after the grace period");
            changed(&shared);
        }
    });
    if let Some(old) = r.cleanup.replace(task) {
        old.abort();
    }
    tracing::info!(namespace = %key.0, name = %key.1, grace = ?shared.config.grace_period, "auto-registered WorkloadEntry disconnected");
    drop(entries);
    changed(shared);
}

/// What a node says about itself, read from its metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub group: String,
    pub namespace: String,
    pub addresses: Vec<IpAddr>,
    pub network: String,
    pub labels: BTreeMap<String, String>,
    /// `region/zone/subzone`, empty when the node has no locality.
    pub locality: String,
}

fn string_field<'a>(meta: &'a Struct, key: &'static str) -> Result<&'a str, RegisterError> {
    match meta.fields.get(key).and_then(|v| v.kind.as_ref()) {
        None | Some(Kind::NullValue(_)) => Ok(""),
        Some(Kind::StringValue(s)) => Ok(s.trim()),
        Some(_) => Err(RegisterError::Metadata {
            key,
            reason: "expected a string".into(),
        }),
    }
}

impl NodeFacts {
    /// Reads the keys auto-registration uses; `Ok(None)` when the node names no group.
    pub fn from_node(node: &Node) -> Result<Option<Self>, RegisterError> {
        let empty = Struct::default();
        let meta = node.metadata.as_ref().unwrap_or(&empty);
        let group = string_field(meta, META_GROUP)?;
        if group.is_empty() {
            return Ok(None);
        }
        let bad = |key, reason: String| RegisterError::Metadata { key, reason };
        let ips: Vec<&str> = match meta
            .fields
            .get(META_INSTANCE_IPS)
            .and_then(|v| v.kind.as_ref())
        {
            None | Some(Kind::NullValue(_)) => Vec::new(),
            Some(Kind::StringValue(s)) => s
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect(),
            Some(Kind::ListValue(l)) => l
                .values
                .iter()
                .map(|v| match &v.kind {
                    Some(Kind::StringValue(s)) => Ok(s.trim()),
                    _ => Err(bad(META_INSTANCE_IPS, "expected strings".into())),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(bad(META_INSTANCE_IPS, "expected a string".into())),
        };
        let addresses = ips
            .iter()
            .map(|s| {
                s.parse::<IpAddr>()
                    .map_err(|_| bad(META_INSTANCE_IPS, format!("{s:?} is not an IP address")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut labels = BTreeMap::new();
        match meta.fields.get(META_LABELS).and_then(|v| v.kind.as_ref()) {
            None | Some(Kind::NullValue(_)) => {}
            Some(Kind::StructValue(s)) => {
                if s.fields.len() > MAX_NODE_LABELS {
                    return Err(bad(
                        META_LABELS,
                        format!("more than {MAX_NODE_LABELS} labels"),
                    ));
                }
                for (k, v) in &s.fields {
                    let Value {
                        kind: Some(Kind::StringValue(v)),
                    } = v
                    else {
                        return Err(bad(META_LABELS, format!("{k}: expected a string value")));
                    };
                    labels.insert(k.clone(), v.clone());
                }
            }
            Some(_) => return Err(bad(META_LABELS, "expected an object of strings".into())),
        }
        labels.remove(LOCALITY_LABEL);
        let locality = node
            .locality
            .as_ref()
            .filter(|l| !(l.region.is_empty() && l.zone.is_empty() && l.sub_zone.is_empty()))
            .map(|l| format!("{}/{}/{}", l.region, l.zone, l.sub_zone))
            .unwrap_or_default();
        Ok(Some(Self {
            group: group.to_string(),
            namespace: string_field(meta, META_NAMESPACE)?.to_string(),
            addresses,
            network: string_field(meta, META_NETWORK)?.to_string(),
            labels,
            locality,
        }))
    }
}

/// istiod's entry name: `<group>-<address, ':' as '-'>[-<network>]`, the last 253 characters.
pub fn entry_name(group: &str, address: IpAddr, network: &str) -> String {
    let mut name = format!("{group}-{}", address.to_string().replace(':', "-"));
    if !network.is_empty() {
        name.push('-');
        name.push_str(network);
    }
    if name.len() > 253 {
        let cut = name.len() - 253;
        // ASCII by construction of the parts that reach here (checked after), so any cut is
        // on a character boundary; fall back to no cut otherwise.
        if name.is_char_boundary(cut) {
            name = name[cut..].to_string();
        }
    }
    name
}

/// The address a registering node gets: the first of its `INSTANCE_IPS` (as istiod), else
/// the connection's. Unspecified, loopback and multicast addresses are refused.
fn pick_address(facts: &NodeFacts, remote: Option<SocketAddr>) -> Result<IpAddr, RegisterError> {
    let ip = match (facts.addresses.first(), remote) {
        (Some(ip), _) => *ip,
        (None, Some(r)) => r.ip().to_canonical(),
        (None, None) => {
            return Err(RegisterError::Address {
                reason: format!("no {META_INSTANCE_IPS} and no connection address"),
            });
        }
    };
    if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() {
        return Err(RegisterError::Address {
            reason: format!("{ip} can not be a workload's address"),
        });
    }
    Ok(ip)
}

/// Who else holds `ip` on `network`: a pod, a declared entry, another registered entry.
fn address_holder(
    cluster: &Cluster,
    registered: &BTreeMap<Key, Registered>,
    ip: IpAddr,
    network: &str,
    name: &Key,
) -> Option<String> {
    let objects = &cluster.objects;
    // Pods on any network: a VM may not take a pod's address even where networks could
    // tell them apart (the safe side of a misconfigured network name).
    if let Some(p) = objects.pods.iter().find(|p| p.ips().contains(&ip)) {
        return Some(format!("Pod {}/{}", p.metadata.namespace, p.metadata.name));
    }
    let same = |e: &WorkloadEntry| {
        e.spec.network == network && e.spec.address.parse::<IpAddr>().ok() == Some(ip)
    };
    if let Some(e) = objects.workload_entries.iter().find(|e| same(e)) {
        return Some(format!(
            "WorkloadEntry {}/{}",
            e.metadata.namespace, e.metadata.name
        ));
    }
    registered
        .iter()
        .find(|(k, r)| *k != name && same(&r.entry))
        .map(|((ns, n), _)| format!("WorkloadEntry {ns}/{n}"))
}

/// The entry istiod would create for `facts` from `group`.
pub fn entry_from_group(
    name: &str,
    group: &WorkloadGroup,
    facts: &NodeFacts,
    address: IpAddr,
    instance_id: &str,
) -> WorkloadEntry {
    let mut spec = group.spec.template.clone();
    spec.address = address.to_string();
    let mut labels = std::mem::take(&mut spec.labels);
    labels.extend(group.spec.metadata.labels.clone());
    labels.extend(facts.labels.clone());
    labels
        .entry(TUNNEL_LABEL.to_string())
        .or_insert_with(|| TUNNEL_HTTP.to_string());
    let mut annotations = BTreeMap::from([(
        AUTO_REGISTRATION_GROUP_ANNOTATION.to_string(),
        group.metadata.name.clone(),
    )]);
    annotations.extend(group.spec.metadata.annotations.clone());
    annotations.insert(CONTROLLER_ANNOTATION.to_string(), instance_id.to_string());
    annotations.insert(CONNECTED_AT_ANNOTATION.to_string(), now());
    if !facts.network.is_empty() {
        spec.network = facts.network.clone();
    }
    if !facts.locality.is_empty() {
        spec.locality = facts.locality.clone();
    }
    let namespace = group.metadata.namespace.clone();
    WorkloadEntry {
        metadata: ObjectMeta {
            uid: stable_uid("WorkloadEntry", &namespace, name),
            name: name.to_string(),
            namespace,
            labels: labels.clone(),
            annotations,
            owner_references: vec![OwnerReference {
                kind: "WorkloadGroup".to_string(),
                name: group.metadata.name.clone(),
                controller: Some(true),
            }],
            ..ObjectMeta::default()
        },
        spec,
        ..WorkloadEntry::default()
    }
}

impl Registry {
    /// An empty registry; cleanups run on `runtime`.
    pub fn new(config: AutoRegistrationConfig, runtime: tokio::runtime::Handle) -> Self {
        Self {
            shared: Arc::new(Shared {
                config,
                cluster: RwLock::new(Arc::new(Cluster::default())),
                entries: Mutex::new(BTreeMap::new()),
                changes: watch::channel(0).0,
                runtime,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, Registered>> {
        lock_entries(&self.shared)
    }

    /// The cluster groups, pods and declared entries are looked up in.
    pub fn set_cluster(&self, cluster: Arc<Cluster>) {
        *self
            .shared
            .cluster
            .write()
            .unwrap_or_else(|p| p.into_inner()) = cluster;
    }

    /// Fires after every change of the entries.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.changes.subscribe()
    }

    /// The registered entries, by namespace and name.
    pub fn entries(&self) -> Vec<WorkloadEntry> {
        self.lock().values().map(|r| r.entry.clone()).collect()
    }

    /// Registers (or re-connects) the entry of a stream; `Ok(None)` when the node names no
    /// group.
    pub fn register(&self, conn: Connection<'_>) -> Result<Option<Registration>, RegisterError> {
        let Some(facts) = NodeFacts::from_node(conn.node)? else {
            return Ok(None);
        };
        self.register_facts(conn.peer, &facts, conn.remote)
            .map(Some)
    }

    /// [`Self::register`] from already-read node facts.
    pub fn register_facts(
        &self,
        peer: &XdsPeer,
        facts: &NodeFacts,
        remote: Option<SocketAddr>,
    ) -> Result<Registration, RegisterError> {
        let cluster = self
            .shared
            .cluster
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let identity = peer
            .identity
            .as_ref()
            .ok_or_else(|| RegisterError::NoIdentity {
                peer: peer.name.clone(),
            })?;
        if identity.trust_domain() != cluster.config.trust_domain {
            return Err(RegisterError::TrustDomain {
                identity: identity.to_string(),
                trust_domain: cluster.config.trust_domain.clone(),
            });
        }
        if facts.namespace.is_empty() {
            return Err(RegisterError::Metadata {
                key: META_NAMESPACE,
                reason: "required with AUTO_REGISTER_GROUP".into(),
            });
        }
        if identity.namespace() != facts.namespace {
            return Err(RegisterError::Namespace {
                identity: identity.to_string(),
                namespace: facts.namespace.clone(),
            });
        }
        let group = cluster
            .objects
            .workload_groups
            .iter()
            .find(|g| g.metadata.namespace == facts.namespace && g.metadata.name == facts.group)
            .ok_or_else(|| RegisterError::GroupNotFound {
                namespace: facts.namespace.clone(),
                group: facts.group.clone(),
            })?;
        let address = pick_address(facts, remote)?;
        let network = if facts.network.is_empty() {
            group.spec.template.network.as_str()
        } else {
            facts.network.as_str()
        };
        let name = entry_name(&facts.group, address, &facts.network);
        crate::objects::meta::check_dns_name(&name, 253, true).map_err(|reason| {
            RegisterError::Name {
                name: name.clone(),
                reason,
            }
        })?;
        let key = (facts.namespace.clone(), name.clone());
        let check_sa = |sa: &str, entry: &str| {
            let sa = if sa.is_empty() { "default" } else { sa };
            if identity.service_account() == sa {
                Ok(())
            } else {
                Err(RegisterError::ServiceAccount {
                    identity: identity.to_string(),
                    service_account: sa.to_string(),
                    entry: entry.to_string(),
                })
            }
        };
        check_sa(
            &group.spec.template.service_account,
            &format!("WorkloadGroup {}/{}", facts.namespace, facts.group),
        )?;
        let mut entries = self.lock();
        if let Some(holder) = address_holder(&cluster, &entries, address, network, &key) {
            return Err(RegisterError::AddressInUse { address, holder });
        }
        if let Some(r) = entries.get_mut(&key) {
            check_sa(
                &r.entry.spec.service_account,
                &format!("WorkloadEntry {}/{}", key.0, key.1),
            )?;
            r.connections += 1;
            r.epoch += 1;
            if let Some(task) = r.cleanup.take() {
                task.abort();
            }
            let annotations = &mut r.entry.metadata.annotations;
            annotations.remove(DISCONNECTED_AT_ANNOTATION);
            annotations.insert(CONNECTED_AT_ANNOTATION.to_string(), now());
            tracing::info!(namespace = %key.0, name = %key.1, peer = %peer.name, "auto-registered WorkloadEntry connected again");
        } else {
            let held = entries
                .values()
                .filter(|r| r.entry.metadata.namespace == facts.namespace && r.group == facts.group)
                .count();
            let max = self.shared.config.max_entries_per_group;
            if held >= max {
                return Err(RegisterError::GroupFull {
                    namespace: facts.namespace.clone(),
                    group: facts.group.clone(),
                    max,
                });
            }
            let entry = entry_from_group(
                &name,
                group,
                facts,
                address,
                &self.shared.config.instance_id,
            );
            tracing::info!(namespace = %key.0, name = %key.1, peer = %peer.name, %address, "WorkloadEntry auto-registered");
            entries.insert(
                key.clone(),
                Registered {
                    entry,
                    group: facts.group.clone(),
                    connections: 1,
                    epoch: 0,
                    cleanup: None,
                },
            );
        }
        drop(entries);
        changed(&self.shared);
        Ok(Registration {
            shared: Arc::downgrade(&self.shared),
            key,
        })
    }

    /// `cluster` with the registered entries added: those whose group still exists and whose
    /// name no declared entry has. A skipped entry gives a warning.
    pub fn merge(&self, cluster: &Cluster, warnings: &mut Vec<String>) -> Cluster {
        let mut merged = cluster.clone();
        for r in self.lock().values() {
            let meta = &r.entry.metadata;
            let group_exists = cluster
                .objects
                .workload_groups
                .iter()
                .any(|g| g.metadata.namespace == meta.namespace && g.metadata.name == r.group);
            if !group_exists {
                continue;
            }
            let object = Object {
                origin: Origin {
                    file: ORIGIN.to_string(),
                    document: 0,
                },
                resource: Resource::WorkloadEntry(r.entry.clone()),
            };
            if merged.objects.insert(object).is_err() {
                warnings.push(format!(
                    "auto-registered WorkloadEntry {}/{}: a declared entry has this name; not served",
                    meta.namespace, meta.name
                ));
            }
        }
        merged
    }
}

impl ConnectHook for Registry {
    fn connect(&self, conn: Connection<'_>) -> Result<Option<ConnectionGuard>, tonic::Status> {
        match self.register(conn) {
            Ok(Some(r)) => Ok(Some(Box::new(r))),
            Ok(None) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests;
