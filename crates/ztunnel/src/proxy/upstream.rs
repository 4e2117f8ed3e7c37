//! Pieces shared by the listeners: dialling the application (with the client's source IP when
//! transparent sockets work), building HBONE request/response headers from workload records.

use std::net::{IpAddr, SocketAddr};

use ambit_hbone::Baggage;
use ambit_model::Workload;
use http::{HeaderMap, HeaderValue};
use tokio::net::TcpStream;

use super::{CONNECT_TIMEOUT, ProxyInputs};

/// Why connecting to the local application failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream: connect to {dst}: {source}")]
    Connect {
        dst: SocketAddr,
        #[source]
        source: ambit_netns::SocketError,
    },
    #[error("upstream: connect to {dst} timed out")]
    Timeout { dst: SocketAddr },
}

/// Connects to `dst` (the application) through the proxy's socket factory. With transparent
/// sockets available the connection is made *from* `client` (IP_FREEBIND + IP_TRANSPARENT,
/// port chosen by the kernel), so the app sees the real client address; the in-pod routing
/// (mark 0x539 → connmark 0x111 → table 100) brings the replies back to us.
pub async fn connect_app(
    inputs: &ProxyInputs,
    dst: SocketAddr,
    client: Option<IpAddr>,
) -> Result<TcpStream, UpstreamError> {
    let mut opts = inputs.upstream_options();
    let local = match (inputs.transparent, client) {
        (true, Some(ip)) if ip.is_ipv4() == dst.is_ipv4() && ip != dst.ip() => {
            opts.transparent = ambit_netns::Transparent::Required;
            opts.freebind = true;
            Some(SocketAddr::new(ip, 0))
        }
        _ => None,
    };
    let connect = ambit_netns::connect_tcp(inputs.socket_factory.as_ref(), dst, local, &opts);
    // Boxed: the dial and its timer are over once connected; inline they would size the
    // connection's task for its whole lifetime.
    match Box::pin(tokio::time::timeout(CONNECT_TIMEOUT, connect)).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(source)) => Err(UpstreamError::Connect { dst, source }),
        Err(_) => Err(UpstreamError::Timeout { dst }),
    }
}

/// The `baggage` a workload announces about itself (§3.2). Empty values are omitted.
pub fn baggage_for(w: &Workload) -> Baggage {
    use ambit_hbone::headers::WorkloadKind;
    use ambit_model::workload::WorkloadType;
    Baggage {
        cluster_id: w.cluster_id.clone(),
        namespace: w.namespace().to_string(),
        workload_kind: (!w.workload_name.is_empty()).then_some(match w.workload_type {
            WorkloadType::Deployment => WorkloadKind::Deployment,
            WorkloadType::CronJob => WorkloadKind::CronJob,
            WorkloadType::Pod => WorkloadKind::Pod,
            WorkloadType::Job => WorkloadKind::Job,
        }),
        workload_name: w.workload_name.clone(),
        service_name: w.canonical_name.clone(),
        service_version: w.canonical_revision.clone(),
        region: w.locality.region.clone(),
        zone: w.locality.zone.clone(),
    }
}

/// Adds `baggage` to `headers` when it encodes to a valid header value.
pub fn insert_baggage(headers: &mut HeaderMap, baggage: &Baggage) {
    let text = baggage.encode();
    if text.is_empty() {
        return;
    }
    if let Ok(v) = HeaderValue::from_str(&text) {
        headers.insert("baggage", v);
    }
}
