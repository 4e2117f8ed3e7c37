//! The per-pod DNS proxy (§7): UDP and TCP on `127.0.0.1:15053` (and `[::1]:15053`) inside
//! each pod's network namespace, where the in-pod rules redirect the pod's port-53 traffic.
//!
//! - A/AAAA questions (class IN) for mesh service hostnames are answered locally from
//!   [`ProxyState`], using the pod's synthetic search list ([`resolve`]).
//! - **Everything else is forwarded** verbatim to the nameservers of ztunnel's own
//!   `resolv.conf` ([`Forwarder`]): any other type (SRV, PTR, TXT, MX, ANY, …), any other
//!   opcode (UPDATE, NOTIFY, …) and every name we do not know. Upstream ztunnel refuses most
//!   of these; we never refuse, because a pod must not lose DNS features by joining the mesh.
//! - Upstream sockets come from the pod's [`SocketFactory`], so they live in the pod netns and
//!   carry the ztunnel mark (the in-pod rules then let them out instead of redirecting them
//!   back to us).
//!
//! Layout: [`message`] classifies raw packets and builds responses (the only code touching
//! `hickory-proto`), [`resolve`] is the pure name matching, [`forward`] talks to upstream
//! servers, [`metrics`] is the hook the telemetry registry plugs into, and `server` owns the
//! sockets and tasks.

pub mod forward;
pub mod message;
pub mod metrics;
pub mod resolve;
mod server;

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ambit_model::Workload;
use ambit_netns::{SocketError, SocketFactory};

use crate::state::ProxyState;

pub use forward::Forwarder;
pub use metrics::{DnsMetrics, DnsRequest, NoDnsMetrics, Transport};
pub use resolve::{Family, LocalAnswer, NameConfig};
pub use server::{DnsListeners, DnsServer};

/// The addresses a pod's DNS proxy listens on: `127.0.0.1:15053`, plus `[::1]:15053` when
/// IPv6 is enabled (binding it is best effort, see [`DnsServer::bind`]).
pub fn listen_addrs(ipv6_enabled: bool) -> Vec<SocketAddr> {
    let mut addrs = vec![SocketAddr::from((
        std::net::Ipv4Addr::LOCALHOST,
        ambit_contract::ports::DNS_PROXY,
    ))];
    if ipv6_enabled {
        addrs.push(SocketAddr::from((
            std::net::Ipv6Addr::LOCALHOST,
            ambit_contract::ports::DNS_PROXY,
        )));
    }
    addrs
}

/// TTL of locally answered records, as upstream.
pub const LOCAL_TTL: u32 = 30;

/// How long one query may take end to end when forwarded, and how long a TCP client
/// connection may sit idle between messages.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Looks up the pod's own workload. Called per query: the record can arrive (via xDS) after
/// the listeners were bound, and it can change.
pub type ClientLookup = Arc<dyn Fn() -> Option<Arc<Workload>> + Send + Sync>;

/// Everything a pod's DNS proxy needs to answer and forward.
#[derive(Clone)]
pub struct DnsContext {
    pub state: Arc<ProxyState>,
    /// The pod's own workload; `None` ⇒ A/AAAA questions get SERVFAIL (other queries are
    /// still forwarded: they do not depend on who asks).
    pub client: ClientLookup,
    /// `CLUSTER_DOMAIN`, e.g. `cluster.local`.
    pub cluster_domain: String,
    /// `PREFERED_SERVICE_NAMESPACE` (upstream's spelling).
    pub prefered_service_namespace: Option<String>,
    /// `IPV6_ENABLED`; when false AAAA questions for mesh names get an empty answer.
    pub ipv6_enabled: bool,
    /// Where unanswered queries go.
    pub forwarder: Forwarder,
    /// The pod's socket factory: upstream sockets are created (and marked) through it.
    pub socket_factory: Arc<dyn SocketFactory>,
    pub metrics: Arc<dyn DnsMetrics>,
}

impl std::fmt::Debug for DnsContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsContext")
            .field("cluster_domain", &self.cluster_domain)
            .field(
                "prefered_service_namespace",
                &self.prefered_service_namespace,
            )
            .field("ipv6_enabled", &self.ipv6_enabled)
            .field("forwarder", &self.forwarder)
            .field("socket_factory", &self.socket_factory)
            .finish_non_exhaustive()
    }
}

impl DnsContext {
    pub(crate) fn name_config(&self) -> NameConfig<'_> {
        NameConfig {
            cluster_domain: &self.cluster_domain,
            prefered_service_namespace: self.prefered_service_namespace.as_deref(),
            ipv6_enabled: self.ipv6_enabled,
        }
    }
}

/// Errors at the DNS proxy boundary. Binding and configuration errors reach the caller;
/// upstream errors are turned into SERVFAIL for the pod and logged, and say which server
/// failed.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("binding DNS {transport} listener on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        transport: Transport,
        source: SocketError,
    },
    #[error("no DNS listener address given")]
    NoAddresses,
    #[error("reading {path}: {source}")]
    ResolvConf { path: PathBuf, source: io::Error },
    #[error("{path} lists no usable nameserver")]
    NoNameservers { path: PathBuf },
    #[error("no upstream nameserver configured")]
    NoUpstream,
    #[error("creating socket to upstream {server}: {source}")]
    UpstreamSocket {
        server: SocketAddr,
        source: SocketError,
    },
    #[error("upstream {server} over {transport}: {source}")]
    UpstreamIo {
        server: SocketAddr,
        transport: Transport,
        source: io::Error,
    },
    #[error("upstream {server} over {transport} timed out")]
    UpstreamTimeout {
        server: SocketAddr,
        transport: Transport,
    },
    #[error("upstream {server} sent a response that does not answer our query")]
    UpstreamMismatch { server: SocketAddr },
    #[error("query of {len} bytes has no DNS header")]
    QueryTooShort { len: usize },
    #[error("query of {len} bytes is too large for TCP framing")]
    QueryTooLarge { len: usize },
}
