//! `networking.istio.io` WorkloadEntry and WorkloadGroup (v1, v1beta1 and v1alpha3 share the
//! shape): a workload that is not a pod (a VM, a bare host), and the template VMs register
//! from.
//!
//! Like the security kinds, these refuse unknown fields below `metadata`
//! (`deny_unknown_fields`): the service account decides the entry's identity and the labels
//! decide which Services and policies select it, so a misspelt key must not read as an absent
//! one. Every field of Istio's API is known here; `status` is accepted and not read.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::meta::{ObjectMeta, nullable};
use super::security::Ignored;

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadEntry {
    #[serde(default)]
    pub api_version: Ignored,
    #[serde(default)]
    pub kind: Ignored,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: WorkloadEntrySpec,
    #[serde(default)]
    pub status: Ignored,
}

/// `WorkloadEntry.spec`, also `WorkloadGroup.spec.template` (where `address` is empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadEntrySpec {
    /// An IP address, a DNS name or a `unix://` path; only IP addresses become workload
    /// addresses (see `translate::workload_entry`).
    #[serde(default, deserialize_with = "nullable")]
    pub address: String,
    /// Service port name → this endpoint's port.
    #[serde(default, deserialize_with = "nullable")]
    pub ports: BTreeMap<String, u16>,
    #[serde(default, deserialize_with = "nullable")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "nullable")]
    pub network: String,
    #[serde(default, deserialize_with = "nullable")]
    pub locality: String,
    #[serde(default, deserialize_with = "nullable")]
    pub weight: u32,
    /// `default` when empty (the loader fills it in, as for pods).
    #[serde(default, deserialize_with = "nullable")]
    pub service_account: String,
}

impl WorkloadEntry {
    /// The labels Services and policies select on: `metadata.labels` and `spec.labels`
    /// merged, the spec's winning on a clash (as istiod).
    pub fn labels(&self) -> BTreeMap<String, String> {
        let mut labels = self.metadata.labels.clone();
        labels.extend(self.spec.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        labels
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadGroup {
    #[serde(default)]
    pub api_version: Ignored,
    #[serde(default)]
    pub kind: Ignored,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: WorkloadGroupSpec,
    #[serde(default)]
    pub status: Ignored,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadGroupSpec {
    /// Labels and annotations copied onto the entries registered from the group.
    #[serde(default)]
    pub metadata: GroupMetadata,
    #[serde(default)]
    pub template: WorkloadEntrySpec,
    #[serde(default)]
    pub probe: Option<ReadinessProbe>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GroupMetadata {
    #[serde(default, deserialize_with = "nullable")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "nullable")]
    pub annotations: BTreeMap<String, String>,
}

/// `spec.probe`: read and checked for known keys, not run (ztunnel does not probe; see
/// `docs/upstream-differences.md`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReadinessProbe {
    #[serde(default)]
    pub initial_delay_seconds: Option<i32>,
    #[serde(default)]
    pub timeout_seconds: Option<i32>,
    #[serde(default)]
    pub period_seconds: Option<i32>,
    #[serde(default)]
    pub success_threshold: Option<i32>,
    #[serde(default)]
    pub failure_threshold: Option<i32>,
    #[serde(default)]
    pub http_get: Ignored,
    #[serde(default)]
    pub tcp_socket: Ignored,
    #[serde(default)]
    pub exec: Ignored,
    #[serde(default)]
    pub grpc: Ignored,
}
