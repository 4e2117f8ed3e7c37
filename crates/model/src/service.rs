//! Services: a hostname with VIPs and ports, backed by workload endpoints.

use std::collections::BTreeMap;

use crate::addr::{NetworkAddr, NetworkCidr};
use crate::names::{NamespacedHostname, WorkloadUid};
use crate::workload::{GatewayAddress, HealthStatus, PortMap};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AppProtocol {
    Http11,
    Http2,
    Grpc,
    Tcp,
    Tls,
}

/// Locality scopes a load balancer can prefer, most specific last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoadBalancingScope {
    Region,
    Zone,
    Subzone,
    Node,
    Cluster,
    Network,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum LoadBalancingMode {
    /// Ignore the routing preferences.
    #[default]
    Standard,
    /// Only endpoints matching every preference.
    Strict,
    /// Prefer endpoints matching the preferences, fall back to others.
    Failover,
    /// No endpoint selection: send to the original destination.
    Passthrough,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum HealthPolicy {
    #[default]
    OnlyHealthy,
    AllowAll,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LoadBalancing {
    pub routing_preferences: Vec<LoadBalancingScope>,
    pub mode: LoadBalancingMode,
    pub health_policy: HealthPolicy,
}

/// Which address families a service uses; `None` on [`Service::ip_families`] is "automatic".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFamilies {
    Ipv4Only,
    Ipv6Only,
    Dual,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Visibility {
    #[default]
    Public,
    /// Only visible to clients in the service's namespace.
    Namespace,
}

/// One workload behind a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub workload_uid: WorkloadUid,
    /// service port → target port for this endpoint.
    pub ports: PortMap,
    pub status: HealthStatus,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub name: String,
    /// Namespace and hostname: the service's key.
    pub key: NamespacedHostname,
    /// VIPs; empty for a headless service.
    pub vips: Vec<NetworkAddr>,
    /// Range VIPs (addresses with a prefix length).
    pub cidr_vips: Vec<NetworkCidr>,
    /// service port → target port (0 = the target port is named per endpoint).
    pub ports: PortMap,
    /// Application protocol per service port, where known.
    pub app_protocols: BTreeMap<u16, AppProtocol>,
    pub subject_alt_names: Vec<String>,
    pub waypoint: Option<GatewayAddress>,
    pub load_balancing: Option<LoadBalancing>,
    pub ip_families: Option<IpFamilies>,
    pub canonical: bool,
    pub ingress_use_waypoint: bool,
    pub visibility: Visibility,
    /// Endpoints by workload uid. Never carried on the Service resource in xDS: filled from the
    /// workloads' `services` maps by whoever indexes them (see [`crate::index`]).
    pub endpoints: BTreeMap<WorkloadUid, Endpoint>,
}

impl Service {
    /// A service with the given key and every other field at its xDS default.
    pub fn new(name: impl Into<String>, key: NamespacedHostname) -> Self {
        Self {
            name: name.into(),
            key,
            vips: Vec::new(),
            cidr_vips: Vec::new(),
            ports: PortMap::new(),
            app_protocols: BTreeMap::new(),
            subject_alt_names: Vec::new(),
            waypoint: None,
            load_balancing: None,
            ip_families: None,
            canonical: false,
            ingress_use_waypoint: false,
            visibility: Visibility::Public,
            endpoints: BTreeMap::new(),
        }
    }

    pub fn namespace(&self) -> &str {
        self.key.namespace()
    }

    pub fn hostname(&self) -> &str {
        self.key.hostname()
    }

    /// Whether an endpoint in `status` may receive traffic under this service's health policy.
    pub fn admits(&self, status: HealthStatus) -> bool {
        status == HealthStatus::Healthy
            || self
                .load_balancing
                .as_ref()
                .is_some_and(|lb| lb.health_policy == HealthPolicy::AllowAll)
    }
}
