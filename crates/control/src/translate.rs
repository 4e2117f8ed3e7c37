//! Translation of a cluster's objects into what ztunnel consumes (`spec/ztunnel.md` §4.2,
//! §4.3): workloads, services and authorization policies as [`ambit_model`] values. The xDS
//! server only serialises the result (`ambit_model` converts to the protobuf types).
//!
//! Translation never fails: an object that can not be expressed is skipped, or expressed in a
//! deny-safe form, with a warning in [`Translation::warnings`]. Output is sorted by key, so
//! the same objects always give the same translation.
//!
//! - [`workload`]: Pod → `Workload` (identity, canonical names, tunnel protocol, services,
//!   policies);
//! - [`workload_entry`]: WorkloadEntry → `Workload` (VMs and bare hosts);
//! - [`service`]: Service → `Service`, and each pod's service port maps;
//! - [`authz`]: AuthorizationPolicy → `Authorization` (scopes, L4 matches, L7 handling);
//! - [`peer_authn`]: PeerAuthentication → the converted DENY policies of `spec/cni.md` §7.

pub mod authz;
pub mod peer_authn;
pub mod service;
pub mod workload;
pub mod workload_entry;

use ambit_model::{Authorization, Service, Workload};

use crate::objects::ObjectSet;

/// Cluster-wide settings translation depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// DNS suffix of services: `<name>.<ns>.svc.<cluster_domain>`.
    pub cluster_domain: String,
    /// Trust domain of workload identities.
    pub trust_domain: String,
    /// Istio's root namespace: its selector-less policies are mesh-wide.
    pub root_namespace: String,
    /// Prefix of workload uids and the workloads' `cluster_id`.
    pub cluster_id: String,
}

impl Default for ClusterConfig {
    /// Upstream istiod's defaults.
    fn default() -> Self {
        Self {
            cluster_domain: "cluster.local".to_string(),
            trust_domain: "cluster.local".to_string(),
            root_namespace: "istio-system".to_string(),
            cluster_id: ambit_model::workload::DEFAULT_CLUSTER_ID.to_string(),
        }
    }
}

/// A snapshot of a cluster: its objects and settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cluster {
    pub config: ClusterConfig,
    pub objects: ObjectSet,
}

impl Cluster {
    pub fn new(config: ClusterConfig, objects: ObjectSet) -> Self {
        Self { config, objects }
    }

    pub fn translate(&self) -> Translation {
        translate(self)
    }
}

/// What ztunnel gets for a cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Translation {
    /// Sorted by uid.
    pub workloads: Vec<Workload>,
    /// Sorted by `namespace/hostname`.
    pub services: Vec<Service>,
    /// Sorted by `namespace/name`.
    pub policies: Vec<Authorization>,
    /// What could not be translated faithfully, one line each, naming the object.
    pub warnings: Vec<String>,
}

/// Translates every object of the cluster.
pub fn translate(cluster: &Cluster) -> Translation {
    let mut warnings = Vec::new();
    let peer = peer_authn::PeerAuthn::new(cluster);
    // PeerAuthentication-derived policies first: on a key clash (an AuthorizationPolicy named
    // like a converted one) the stable sort keeps them ahead and the impostor is dropped.
    let mut policies = peer.policies();
    policies.extend(authz::convert_all(cluster, &mut warnings));
    policies.sort_by(|a, b| a.key.cmp(&b.key));
    policies.dedup_by(|later, kept| {
        let clash = later.key == kept.key;
        if clash {
            warnings.push(format!(
                "AuthorizationPolicy {}: name reserved for PeerAuthentication conversion; skipped",
                later.key
            ));
        }
        clash
    });

    let services = service::services(cluster, &mut warnings);
    let mut workloads: Vec<Workload> = cluster
        .objects
        .pods
        .iter()
        .filter_map(|pod| workload::workload(cluster, pod, &policies, &peer, &mut warnings))
        .collect();
    workloads.extend(cluster.objects.workload_entries.iter().filter_map(|entry| {
        workload_entry::entry_workload(cluster, entry, &policies, &peer, &mut warnings)
    }));
    workloads.sort_by(|a, b| a.uid.cmp(&b.uid));
    Translation {
        workloads,
        services,
        policies,
        warnings,
    }
}
