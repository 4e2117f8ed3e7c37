//! Workloads (pods, VMs, …) as ztunnel sees them: addresses, identity, how to reach them
//! (protocol, waypoint, network gateway) and which services they back.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use crate::addr::NetworkAddr;
use crate::identity::SpiffeId;
use crate::names::{NamespacedHostname, PolicyKey, WorkloadUid};

/// Trust domain applied when xDS leaves it empty.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";
/// Service account applied when xDS leaves it empty.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// Cluster id applied when xDS leaves it empty.
pub const DEFAULT_CLUSTER_ID: &str = "Kubernetes";
/// Capacity applied when xDS leaves it unset.
pub const DEFAULT_CAPACITY: u32 = 1;

/// How traffic reaches the workload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum TunnelProtocol {
    /// Plain TCP (the workload is not captured, or is outside the mesh).
    #[default]
    None,
    /// HBONE (HTTP/2 CONNECT over mTLS to port 15008).
    Hbone,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum HealthStatus {
    #[default]
    Healthy,
    Unhealthy,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum NetworkMode {
    #[default]
    Standard,
    /// Shares the node's network: never indexed by IP (its IP is the node's).
    HostNetwork,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum WorkloadType {
    #[default]
    Deployment,
    CronJob,
    Pod,
    Job,
}

impl WorkloadType {
    /// The lowercase name used in logs, metrics labels and the local config file.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadType::Deployment => "deployment",
            WorkloadType::CronJob => "cronjob",
            WorkloadType::Pod => "pod",
            WorkloadType::Job => "job",
        }
    }
}

/// Where a waypoint or network gateway is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GatewayDestination {
    /// A service, resolved through the service index.
    Hostname(NamespacedHostname),
    /// A fixed address.
    Address(NetworkAddr),
}

impl fmt::Display for GatewayDestination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GatewayDestination::Hostname(h) => h.fmt(f),
            GatewayDestination::Address(a) => a.fmt(f),
        }
    }
}

/// A waypoint or east-west gateway and the port it accepts HBONE on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GatewayAddress {
    pub destination: GatewayDestination,
    pub hbone_mtls_port: u16,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum AppTunnelProtocol {
    /// The application receives plain traffic.
    #[default]
    None,
    /// The application receives PROXY protocol framing.
    Proxy,
}

/// A workload that terminates tunnels itself (e.g. a waypoint).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ApplicationTunnel {
    pub protocol: AppTunnelProtocol,
    /// `None` when the proto carries 0 (use the default port).
    pub port: Option<u16>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Locality {
    pub region: String,
    pub zone: String,
    pub subzone: String,
}

/// Port map of one service for one workload: service port → target port.
pub type PortMap = BTreeMap<u16, u16>;

/// A workload. Its identity is `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`
/// and the namespace is the identity's namespace (they can not disagree).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub uid: WorkloadUid,
    pub name: String,
    /// Trust domain, namespace and service account in one parsed value.
    pub identity: SpiffeId,
    pub addresses: Vec<IpAddr>,
    pub hostname: String,
    pub network: String,
    pub protocol: TunnelProtocol,
    pub waypoint: Option<GatewayAddress>,
    pub network_gateway: Option<GatewayAddress>,
    pub node: String,
    pub canonical_name: String,
    pub canonical_revision: String,
    pub workload_type: WorkloadType,
    pub workload_name: String,
    pub native_tunnel: bool,
    pub application_tunnel: Option<ApplicationTunnel>,
    /// Services this workload is an endpoint of, with their port maps.
    pub services: BTreeMap<NamespacedHostname, PortMap>,
    /// Workload-selector policies that apply to it.
    pub authorization_policies: Vec<PolicyKey>,
    pub status: HealthStatus,
    pub cluster_id: String,
    pub locality: Locality,
    pub network_mode: NetworkMode,
    pub capacity: u32,
}

impl Workload {
    /// A workload with the given keys and every other field at its xDS default.
    pub fn new(uid: WorkloadUid, name: impl Into<String>, identity: SpiffeId) -> Self {
        Self {
            uid,
            name: name.into(),
            identity,
            addresses: Vec::new(),
            hostname: String::new(),
            network: String::new(),
            protocol: TunnelProtocol::None,
            waypoint: None,
            network_gateway: None,
            node: String::new(),
            canonical_name: String::new(),
            canonical_revision: String::new(),
            workload_type: WorkloadType::Deployment,
            workload_name: String::new(),
            native_tunnel: false,
            application_tunnel: None,
            services: BTreeMap::new(),
            authorization_policies: Vec::new(),
            status: HealthStatus::Healthy,
            cluster_id: DEFAULT_CLUSTER_ID.to_string(),
            locality: Locality::default(),
            network_mode: NetworkMode::Standard,
            capacity: DEFAULT_CAPACITY,
        }
    }

    pub fn identity(&self) -> &SpiffeId {
        &self.identity
    }

    pub fn namespace(&self) -> &str {
        self.identity.namespace()
    }

    pub fn trust_domain(&self) -> &str {
        self.identity.trust_domain()
    }

    pub fn service_account(&self) -> &str {
        self.identity.service_account()
    }

    /// The `network/IP` keys this workload is reachable at (none for host-network workloads,
    /// whose IP belongs to the node).
    pub fn network_addrs(&self) -> impl Iterator<Item = NetworkAddr> + '_ {
        let indexed = self.network_mode == NetworkMode::Standard;
        self.addresses
            .iter()
            .filter(move |_| indexed)
            .map(|ip| NetworkAddr::new(self.network.clone(), *ip))
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} ({})", self.namespace(), self.name, self.uid)
    }
}
