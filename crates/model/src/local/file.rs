//! The file's shape, as serde types. Leaves are parsed types (IPs, CIDRs, `network/IP`,
//! `namespace/name`, u16 ports, identity parts), so a bad value fails where it is written and
//! the error carries its line; assembling the model from these parts can not fail.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use serde::Deserialize;

use crate::addr::{Cidr, NetworkAddr, NetworkCidr};
use crate::authz::{self, Authorization, Clause, Match, Rule};
use crate::identity::SpiffeId;
use crate::names::{NamespacedHostname, PolicyKey, WorkloadUid};
use crate::service::{self, Endpoint, Service};
use crate::workload::{self, GatewayDestination, Workload};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct ConfigFile {
    #[serde(default)]
    workloads: Vec<Loaded<Workload>>,
    #[serde(default)]
    policies: Vec<Loaded<Authorization>>,
    #[serde(default)]
    services: Vec<Loaded<Service>>,
}

impl ConfigFile {
    pub(super) fn into_model(self) -> super::LocalConfig {
        super::LocalConfig {
            workloads: self.workloads.into_iter().map(|l| l.0).collect(),
            services: self.services.into_iter().map(|l| l.0).collect(),
            policies: self.policies.into_iter().map(|l| l.0).collect(),
        }
    }
}

/// A model value assembled from its file form while deserializing, so that a (theoretical)
/// assembly error is still reported by the parser, with a position.
struct Loaded<T>(T);

macro_rules! loaded_from {
    ($($model:ty => $file:ty),*) => {$(
        impl<'de> Deserialize<'de> for Loaded<$model> {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                <$file>::deserialize(d)?.into_model().map(Loaded).map_err(serde::de::Error::custom)
            }
        }
    )*};
}

loaded_from!(Workload => FileWorkload, Service => FileService, Authorization => FilePolicy);

/// One part of a name or identity: non-empty, no `/`, no control characters.
struct Part(String);

/// Checks a string while the parser is still at it, so errors carry the value's position
/// (an error returned after `deserialize` would be attributed to the enclosing mapping).
fn parse_str<'de, D, T>(
    d: D,
    expecting: &'static str,
    parse: fn(&str) -> Option<T>,
) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct V<T> {
        expecting: &'static str,
        parse: fn(&str) -> Option<T>,
    }
    impl<T> serde::de::Visitor<'_> for V<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.expecting)
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<T, E> {
            (self.parse)(v).ok_or_else(|| E::invalid_value(serde::de::Unexpected::Str(v), &self))
        }
    }
    d.deserialize_str(V { expecting, parse })
}

impl<'de> Deserialize<'de> for Part {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        parse_str(
            d,
            "a non-empty name without '/' or control characters",
            |s| {
                let bad = s.is_empty() || s.contains('/') || s.chars().any(char::is_control);
                (!bad).then(|| Part(s.to_string()))
            },
        )
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileWorkload {
    uid: WorkloadUid,
    #[serde(default)]
    name: String,
    namespace: Part,
    trust_domain: Part,
    service_account: Part,
    workload_ips: Vec<IpAddr>,
    #[serde(default)]
    protocol: FileProtocol,
    #[serde(default)]
    network_mode: FileNetworkMode,
    #[serde(default)]
    network: String,
    #[serde(default)]
    hostname: String,
    #[serde(default)]
    node: String,
    #[serde(default)]
    waypoint: Option<FileGateway>,
    #[serde(default)]
    network_gateway: Option<FileGateway>,
    #[serde(default)]
    canonical_name: String,
    #[serde(default)]
    canonical_revision: String,
    #[serde(default)]
    workload_name: String,
    #[serde(default)]
    workload_type: FileWorkloadType,
    #[serde(default)]
    native_tunnel: bool,
    #[serde(default)]
    application_tunnel: Option<FileApplicationTunnel>,
    #[serde(default)]
    authorization_policies: Vec<PolicyKey>,
    #[serde(default)]
    status: FileStatus,
    #[serde(default)]
    cluster_id: String,
    #[serde(default)]
    locality: FileLocality,
    #[serde(default = "default_capacity")]
    capacity: u32,
    #[serde(default)]
    services: BTreeMap<NamespacedHostname, BTreeMap<u16, u16>>,
}

fn default_capacity() -> u32 {
    workload::DEFAULT_CAPACITY
}

impl FileWorkload {
    fn into_model(self) -> Result<Workload, String> {
        let (td, ns, sa) = (
            self.trust_domain.0,
            self.namespace.0,
            self.service_account.0,
        );
        let identity = SpiffeId::new(td, ns, sa).map_err(|e| {
            format!(
                "workload {}: trustDomain/namespace/serviceAccount: {e}",
                self.uid
            )
        })?;
        let mut w = Workload::new(self.uid, self.name, identity);
        w.addresses = self.workload_ips;
        w.protocol = match self.protocol {
            FileProtocol::Tcp => workload::TunnelProtocol::None,
            FileProtocol::Hbone => workload::TunnelProtocol::Hbone,
        };
        w.network_mode = match self.network_mode {
            FileNetworkMode::Standard => workload::NetworkMode::Standard,
            FileNetworkMode::HostNetwork => workload::NetworkMode::HostNetwork,
        };
        w.network = self.network;
        w.hostname = self.hostname;
        w.node = self.node;
        w.waypoint = self.waypoint.map(FileGateway::into_model);
        w.network_gateway = self.network_gateway.map(FileGateway::into_model);
        w.canonical_name = self.canonical_name;
        w.canonical_revision = self.canonical_revision;
        w.workload_name = self.workload_name;
        w.workload_type = match self.workload_type {
            FileWorkloadType::Deployment => workload::WorkloadType::Deployment,
            FileWorkloadType::CronJob => workload::WorkloadType::CronJob,
            FileWorkloadType::Pod => workload::WorkloadType::Pod,
            FileWorkloadType::Job => workload::WorkloadType::Job,
        };
        w.native_tunnel = self.native_tunnel;
        w.application_tunnel = self
            .application_tunnel
            .map(|t| workload::ApplicationTunnel {
                protocol: match t.protocol {
                    FileAppTunnelProtocol::None => workload::AppTunnelProtocol::None,
                    FileAppTunnelProtocol::Proxy => workload::AppTunnelProtocol::Proxy,
                },
                port: t.port,
            });
        w.authorization_policies = self.authorization_policies;
        w.status = self.status.into_model();
        w.cluster_id = self.cluster_id;
        w.locality = workload::Locality {
            region: self.locality.region,
            zone: self.locality.zone,
            subzone: self.locality.subzone,
        };
        w.capacity = self.capacity;
        w.services = self.services;
        Ok(w)
    }
}

#[derive(Deserialize, Default)]
enum FileProtocol {
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "HBONE")]
    Hbone,
}

#[derive(Deserialize, Default)]
enum FileNetworkMode {
    #[default]
    Standard,
    HostNetwork,
}

#[derive(Deserialize, Default)]
enum FileStatus {
    #[default]
    Healthy,
    Unhealthy,
}

impl FileStatus {
    fn into_model(self) -> workload::HealthStatus {
        match self {
            FileStatus::Healthy => workload::HealthStatus::Healthy,
            FileStatus::Unhealthy => workload::HealthStatus::Unhealthy,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "lowercase")]
enum FileWorkloadType {
    #[default]
    Deployment,
    CronJob,
    Pod,
    Job,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileLocality {
    #[serde(default)]
    region: String,
    #[serde(default)]
    zone: String,
    #[serde(default)]
    subzone: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileApplicationTunnel {
    protocol: FileAppTunnelProtocol,
    #[serde(default)]
    port: Option<u16>,
}

#[derive(Deserialize)]
enum FileAppTunnelProtocol {
    #[serde(rename = "NONE")]
    None,
    #[serde(rename = "PROXY")]
    Proxy,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileGateway {
    destination: FileGatewayDestination,
    hbone_mtls_port: u16,
}

impl FileGateway {
    fn into_model(self) -> workload::GatewayAddress {
        workload::GatewayAddress {
            destination: self.destination.0,
            hbone_mtls_port: self.hbone_mtls_port,
        }
    }
}

/// `network/IP` when the part after the last `/` is an IP, else `namespace/hostname`.
struct FileGatewayDestination(GatewayDestination);

impl<'de> Deserialize<'de> for FileGatewayDestination {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        parse_str(d, "\"network/IP\" or \"namespace/hostname\"", |s| {
            let dest = match s.parse::<NetworkAddr>() {
                Ok(addr) => GatewayDestination::Address(addr),
                Err(_) => GatewayDestination::Hostname(s.parse().ok()?),
            };
            Some(Self(dest))
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileService {
    name: String,
    namespace: Part,
    hostname: Part,
    vips: Vec<NetworkAddr>,
    #[serde(default)]
    cidr_vips: Vec<NetworkCidr>,
    ports: BTreeMap<u16, u16>,
    #[serde(default)]
    endpoints: BTreeMap<WorkloadUid, FileEndpoint>,
    #[serde(default)]
    subject_alt_names: Vec<String>,
    #[serde(default)]
    waypoint: Option<FileGateway>,
    #[serde(default)]
    load_balancer: Option<FileLoadBalancer>,
    #[serde(default)]
    ip_families: Option<FileIpFamilies>,
    #[serde(default)]
    canonical: bool,
    #[serde(default)]
    visibility: FileVisibility,
}

impl FileService {
    fn into_model(self) -> Result<Service, String> {
        let (ns, host) = (self.namespace.0, self.hostname.0);
        let key = NamespacedHostname::new(ns, host)
            .map_err(|e| format!("service {}: namespace/hostname: {e}", self.name))?;
        let mut s = Service::new(self.name, key);
        s.vips = self.vips;
        s.cidr_vips = self.cidr_vips;
        s.ports = self.ports;
        s.endpoints = self
            .endpoints
            .into_iter()
            .map(|(uid, ep)| {
                let endpoint = Endpoint {
                    workload_uid: ep.workload_uid.unwrap_or_else(|| uid.clone()),
                    ports: ep.port,
                    status: ep.status.into_model(),
                };
                (uid, endpoint)
            })
            .collect();
        s.subject_alt_names = self.subject_alt_names;
        s.waypoint = self.waypoint.map(FileGateway::into_model);
        s.load_balancing = self.load_balancer.map(|lb| service::LoadBalancing {
            routing_preferences: lb
                .routing_preferences
                .into_iter()
                .map(FileScope::into_model)
                .collect(),
            mode: match lb.mode {
                FileLbMode::Standard => service::LoadBalancingMode::Standard,
                FileLbMode::Strict => service::LoadBalancingMode::Strict,
                FileLbMode::Failover => service::LoadBalancingMode::Failover,
                FileLbMode::Passthrough => service::LoadBalancingMode::Passthrough,
            },
            health_policy: match lb.health_policy {
                FileHealthPolicy::OnlyHealthy => service::HealthPolicy::OnlyHealthy,
                FileHealthPolicy::AllowAll => service::HealthPolicy::AllowAll,
            },
        });
        s.ip_families = self.ip_families.map(|f| match f {
            FileIpFamilies::Dual => service::IpFamilies::Dual,
            FileIpFamilies::IPv4 => service::IpFamilies::Ipv4Only,
            FileIpFamilies::IPv6 => service::IpFamilies::Ipv6Only,
        });
        s.canonical = self.canonical;
        s.visibility = match self.visibility {
            FileVisibility::Public => service::Visibility::Public,
            FileVisibility::Namespace => service::Visibility::Namespace,
        };
        Ok(s)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileEndpoint {
    #[serde(default)]
    workload_uid: Option<WorkloadUid>,
    #[serde(default)]
    port: BTreeMap<u16, u16>,
    #[serde(default)]
    status: FileStatus,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileLoadBalancer {
    #[serde(default)]
    routing_preferences: Vec<FileScope>,
    #[serde(default)]
    mode: FileLbMode,
    #[serde(default)]
    health_policy: FileHealthPolicy,
}

#[derive(Deserialize)]
enum FileScope {
    Region,
    Zone,
    Subzone,
    Node,
    Cluster,
    Network,
}

impl FileScope {
    fn into_model(self) -> service::LoadBalancingScope {
        use service::LoadBalancingScope as S;
        match self {
            FileScope::Region => S::Region,
            FileScope::Zone => S::Zone,
            FileScope::Subzone => S::Subzone,
            FileScope::Node => S::Node,
            FileScope::Cluster => S::Cluster,
            FileScope::Network => S::Network,
        }
    }
}

#[derive(Deserialize, Default)]
enum FileLbMode {
    #[default]
    Standard,
    Strict,
    Failover,
    Passthrough,
}

#[derive(Deserialize, Default)]
enum FileHealthPolicy {
    #[default]
    OnlyHealthy,
    AllowAll,
}

#[derive(Deserialize)]
#[allow(clippy::upper_case_acronyms)]
enum FileIpFamilies {
    Dual,
    IPv4,
    IPv6,
}

#[derive(Deserialize, Default)]
enum FileVisibility {
    #[default]
    Public,
    Namespace,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FilePolicy {
    name: Part,
    namespace: Part,
    scope: FilePolicyScope,
    action: FileAction,
    #[serde(default)]
    dry_run: bool,
    /// rules → clauses → match objects.
    rules: Vec<Vec<Vec<FileMatch>>>,
}

impl FilePolicy {
    fn into_model(self) -> Result<Authorization, String> {
        let key =
            PolicyKey::new(self.namespace.0, self.name.0).map_err(|e| format!("policy: {e}"))?;
        Ok(Authorization {
            key,
            scope: match self.scope {
                FilePolicyScope::Global => authz::Scope::Global,
                FilePolicyScope::Namespace => authz::Scope::Namespace,
                FilePolicyScope::WorkloadSelector => authz::Scope::WorkloadSelector,
            },
            action: match self.action {
                FileAction::Allow => authz::Action::Allow,
                FileAction::Deny => authz::Action::Deny,
            },
            dry_run: self.dry_run,
            rules: self
                .rules
                .into_iter()
                .map(|clauses| Rule {
                    clauses: clauses
                        .into_iter()
                        .map(|matches| Clause {
                            matches: matches.into_iter().map(FileMatch::into_model).collect(),
                        })
                        .collect(),
                })
                .collect(),
        })
    }
}

#[derive(Deserialize)]
enum FilePolicyScope {
    Global,
    Namespace,
    WorkloadSelector,
}

#[derive(Deserialize)]
enum FileAction {
    Allow,
    Deny,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileMatch {
    #[serde(default)]
    namespaces: Vec<FileStringMatch>,
    #[serde(default)]
    not_namespaces: Vec<FileStringMatch>,
    #[serde(default)]
    principals: Vec<FileStringMatch>,
    #[serde(default)]
    not_principals: Vec<FileStringMatch>,
    #[serde(default)]
    source_ips: Vec<Cidr>,
    #[serde(default)]
    not_source_ips: Vec<Cidr>,
    #[serde(default)]
    destination_ips: Vec<Cidr>,
    #[serde(default)]
    not_destination_ips: Vec<Cidr>,
    #[serde(default)]
    destination_ports: Vec<u16>,
    #[serde(default)]
    not_destination_ports: Vec<u16>,
    #[serde(default)]
    service_accounts: Vec<FileServiceAccount>,
    #[serde(default)]
    not_service_accounts: Vec<FileServiceAccount>,
}

impl FileMatch {
    fn into_model(self) -> Match {
        let strings =
            |v: Vec<FileStringMatch>| v.into_iter().map(FileStringMatch::into_model).collect();
        let accounts = |v: Vec<FileServiceAccount>| {
            v.into_iter()
                .map(|a| authz::ServiceAccountMatch {
                    namespace: a.namespace,
                    service_account: a.service_account,
                })
                .collect()
        };
        Match {
            namespaces: strings(self.namespaces),
            not_namespaces: strings(self.not_namespaces),
            principals: strings(self.principals),
            not_principals: strings(self.not_principals),
            source_ips: self.source_ips,
            not_source_ips: self.not_source_ips,
            destination_ips: self.destination_ips,
            not_destination_ips: self.not_destination_ips,
            destination_ports: self.destination_ports,
            not_destination_ports: self.not_destination_ports,
            service_accounts: accounts(self.service_accounts),
            not_service_accounts: accounts(self.not_service_accounts),
        }
    }
}

/// Externally tagged: in YAML only the tag form (`!Exact x`) is accepted, like upstream.
#[derive(Deserialize)]
enum FileStringMatch {
    Exact(String),
    Prefix(String),
    Suffix(String),
    Presence(),
}

impl FileStringMatch {
    fn into_model(self) -> authz::StringMatch {
        match self {
            FileStringMatch::Exact(s) => authz::StringMatch::Exact(s),
            FileStringMatch::Prefix(s) => authz::StringMatch::Prefix(s),
            FileStringMatch::Suffix(s) => authz::StringMatch::Suffix(s),
            FileStringMatch::Presence() => authz::StringMatch::Presence,
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileServiceAccount {
    namespace: String,
    service_account: String,
}
