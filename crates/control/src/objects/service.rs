//! `v1 Service`: VIPs, ports (with numeric or named target ports) and the pod selector.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Deserializer};

use super::meta::{ObjectMeta, nullable};
use super::pod::Protocol;

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Service {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ServiceSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    /// `None` (the string) makes the service headless; absent or empty means unassigned.
    #[serde(
        default,
        rename = "clusterIP",
        deserialize_with = "optional_cluster_ip"
    )]
    pub cluster_ip: Option<ClusterIp>,
    /// All cluster IPs (dual stack); the first equals `clusterIP` when both are set.
    #[serde(default, rename = "clusterIPs", deserialize_with = "nullable")]
    pub cluster_ips: Vec<ClusterIp>,
    #[serde(default, deserialize_with = "nullable")]
    pub ports: Vec<ServicePort>,
    /// Pods with all these labels back the service. Empty selects nothing (like Kubernetes,
    /// whose endpoints controller ignores services without a selector).
    #[serde(default, deserialize_with = "nullable")]
    pub selector: BTreeMap<String, String>,
}

/// One entry of `clusterIP` / `clusterIPs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClusterIp {
    /// The literal `None`: headless.
    None,
    Ip(IpAddr),
}

impl<'de> Deserialize<'de> for ClusterIp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_cluster_ip(&s).map_err(serde::de::Error::custom)
    }
}

fn parse_cluster_ip(s: &str) -> Result<ClusterIp, String> {
    if s == "None" {
        return Ok(ClusterIp::None);
    }
    s.parse()
        .map(ClusterIp::Ip)
        .map_err(|_| format!("{s:?} is neither an IP address nor \"None\""))
}

fn optional_cluster_ip<'de, D: Deserializer<'de>>(d: D) -> Result<Option<ClusterIp>, D::Error> {
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(s) if s.is_empty() => Ok(None),
        Some(s) => parse_cluster_ip(&s)
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    #[serde(default)]
    pub name: Option<String>,
    pub port: u16,
    /// Defaults to `port`.
    #[serde(default)]
    pub target_port: Option<TargetPort>,
    #[serde(default, deserialize_with = "nullable")]
    pub protocol: Protocol,
    #[serde(default)]
    pub app_protocol: Option<String>,
}

impl ServicePort {
    /// The target port with the Kubernetes default (the service port) applied.
    pub fn target(&self) -> TargetPort {
        self.target_port
            .clone()
            .unwrap_or(TargetPort::Number(self.port))
    }
}

/// `targetPort`: Kubernetes' IntOrString. A quoted number is a (named) string, as there.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TargetPort {
    Number(u16),
    /// A container port name, resolved per pod.
    Name(String),
}

impl fmt::Display for TargetPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetPort::Number(n) => n.fmt(f),
            TargetPort::Name(s) => write!(f, "{s:?}"),
        }
    }
}

impl<'de> Deserialize<'de> for TargetPort {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = TargetPort;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port number (1-65535) or a port name")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<TargetPort, E> {
                match u16::try_from(v) {
                    Ok(p) if p != 0 => Ok(TargetPort::Number(p)),
                    _ => Err(E::custom(format!("port {v} is out of range 1-65535"))),
                }
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<TargetPort, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!("port {v} is out of range 1-65535"))),
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TargetPort, E> {
                if v.is_empty() {
                    return Err(E::custom("port name must not be empty"));
                }
                Ok(TargetPort::Name(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

impl Service {
    /// The service's VIPs: `clusterIPs`, else `clusterIP`; empty when headless or unassigned.
    pub fn vips(&self) -> Vec<IpAddr> {
        let listed = self.spec.cluster_ips.iter().chain(&self.spec.cluster_ip);
        let mut vips = Vec::new();
        for ip in listed {
            if let ClusterIp::Ip(ip) = ip
                && !vips.contains(ip)
            {
                vips.push(*ip);
            }
        }
        vips
    }

    pub fn is_headless(&self) -> bool {
        self.spec.cluster_ip == Some(ClusterIp::None)
            || self.spec.cluster_ips.first() == Some(&ClusterIp::None)
    }

    /// Whether a pod with these labels backs the service.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        !self.spec.selector.is_empty()
            && self
                .spec
                .selector
                .iter()
                .all(|(k, v)| labels.get(k) == Some(v))
    }

    /// Why `clusterIP` and `clusterIPs` disagree, if they do.
    pub(crate) fn cluster_ip_conflict(&self) -> Option<String> {
        let spec = &self.spec;
        if let (Some(single), Some(first)) = (&spec.cluster_ip, spec.cluster_ips.first())
            && single != first
        {
            return Some("clusterIPs[0] must equal clusterIP".to_string());
        }
        let headless = spec.cluster_ips.contains(&ClusterIp::None);
        if headless && spec.cluster_ips.len() > 1 {
            return Some("\"None\" must be the only entry of clusterIPs".to_string());
        }
        None
    }
}
