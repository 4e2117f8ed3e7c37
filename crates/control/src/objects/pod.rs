//! `v1 Pod`: what a workload is made of (labels, service account, node, IPs, container ports)
//! and, for the embedded mesh, what to run (the containers' command, args and env).

use std::net::IpAddr;

use serde::{Deserialize, Deserializer};

use super::meta::{ObjectMeta, nullable};

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Pod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: PodSpec,
    #[serde(default)]
    pub status: PodStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default, deserialize_with = "nullable")]
    pub node_name: String,
    /// `default` when absent (the loader also honours the deprecated `serviceAccount`).
    #[serde(default, deserialize_with = "nullable")]
    pub service_account_name: String,
    /// Deprecated alias of `serviceAccountName`; folded into it by the loader.
    #[serde(default, rename = "serviceAccount", deserialize_with = "nullable")]
    pub(crate) deprecated_service_account: String,
    #[serde(default, deserialize_with = "nullable")]
    pub host_network: bool,
    #[serde(default, deserialize_with = "nullable")]
    pub containers: Vec<Container>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub image: String,
    #[serde(default, deserialize_with = "nullable")]
    pub command: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub args: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub env: Vec<EnvVar>,
    #[serde(default, deserialize_with = "nullable")]
    pub ports: Vec<ContainerPort>,
}

/// `env[]`; only literal values (`valueFrom` is ignored: nothing here can resolve it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct EnvVar {
    pub name: String,
    #[serde(default)]
    pub value: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPort {
    #[serde(default)]
    pub name: Option<String>,
    pub container_port: u16,
    #[serde(default, deserialize_with = "nullable")]
    pub protocol: Protocol,
}

/// A port's transport protocol (`TCP` when absent, like Kubernetes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
pub enum Protocol {
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
    #[serde(rename = "SCTP")]
    Sctp,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    #[serde(default, rename = "podIP", deserialize_with = "optional_ip")]
    pub pod_ip: Option<IpAddr>,
    #[serde(default, rename = "podIPs", deserialize_with = "nullable")]
    pub pod_ips: Vec<PodIp>,
    #[serde(default)]
    pub phase: Option<PodPhase>,
    #[serde(default, deserialize_with = "nullable")]
    pub conditions: Vec<PodCondition>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PodIp {
    pub ip: IpAddr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct PodCondition {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub status: String,
}

impl Pod {
    /// The pod's IPs: `status.podIPs` in order, else `status.podIP`; duplicates removed.
    pub fn ips(&self) -> Vec<IpAddr> {
        let mut ips: Vec<IpAddr> = Vec::new();
        let listed = self.status.pod_ips.iter().map(|p| p.ip);
        for ip in listed.chain(self.status.pod_ip) {
            if !ips.contains(&ip) {
                ips.push(ip);
            }
        }
        ips
    }

    /// Whether the pod has finished for good (its workload is gone).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self.status.phase,
            Some(PodPhase::Succeeded | PodPhase::Failed)
        )
    }

    /// False only when the pod reports a `Ready` condition that is not `True`: manifests
    /// without a status (the embedded mesh) are ready.
    pub fn is_ready(&self) -> bool {
        self.status
            .conditions
            .iter()
            .find(|c| c.kind == "Ready")
            .is_none_or(|c| c.status == "True")
    }

    /// The TCP container port named `name`, across all containers.
    pub fn named_port(&self, name: &str) -> Option<u16> {
        self.spec
            .containers
            .iter()
            .flat_map(|c| &c.ports)
            .find(|p| p.protocol == Protocol::Tcp && p.name.as_deref() == Some(name))
            .map(|p| p.container_port)
    }
}

/// `status.podIP` that tolerates the empty string Kubernetes writes before an IP is assigned.
fn optional_ip<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpAddr>, D::Error> {
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(s) if s.is_empty() => Ok(None),
        Some(s) => s
            .parse()
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("{s:?} is not an IP address"))),
    }
}
