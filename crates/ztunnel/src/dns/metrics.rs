//! The DNS proxy's metrics hook (§7): `istio_dns_requests_total`,
//! `istio_dns_upstream_requests_total`, `istio_dns_upstream_failures_total` and
//! `istio_dns_upstream_request_duration_seconds`, labelled by query type, protocol and the
//! asking pod's canonical service and revision.
//!
//! The proxy only calls [`DnsMetrics`]; the Prometheus registry implements it
//! ([`crate::telemetry::Metrics`]), tests count with their own implementation.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ambit_model::Workload;

use crate::telemetry::{DnsLabels, Metrics};

/// How a query reached us (`request_protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    Udp,
    Tcp,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the metrics know about one query.
#[derive(Debug, Clone)]
pub struct DnsRequest {
    /// Mnemonic of the first question's type (`A`, `SRV`, …); `unknown` when unreadable.
    pub query_type: String,
    pub protocol: Transport,
    /// The asking pod's workload, when known.
    pub client: Option<Arc<Workload>>,
}

/// Callbacks for the DNS metrics. Implementations must be cheap: they run per query.
pub trait DnsMetrics: Send + Sync {
    /// Every query we answered or forwarded (`istio_dns_requests_total`).
    fn request(&self, req: &DnsRequest);
    /// A query sent upstream (`istio_dns_upstream_requests_total`).
    fn upstream_request(&self, req: &DnsRequest);
    /// An upstream exchange that produced no answer (`istio_dns_upstream_failures_total`).
    fn upstream_failure(&self, req: &DnsRequest);
    /// How long the upstream exchange took, success or not.
    fn upstream_duration(&self, req: &DnsRequest, took: Duration);
}

/// Discards everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoDnsMetrics;

impl DnsMetrics for NoDnsMetrics {
    fn request(&self, _: &DnsRequest) {}
    fn upstream_request(&self, _: &DnsRequest) {}
    fn upstream_failure(&self, _: &DnsRequest) {}
    fn upstream_duration(&self, _: &DnsRequest, _: Duration) {}
}

impl DnsRequest {
    /// The Prometheus label set; missing values render as `unknown`, as upstream.
    pub fn labels(&self) -> DnsLabels {
        let mut labels = DnsLabels {
            request_query_type: Arc::from(self.query_type.as_str()),
            request_protocol: Arc::from(self.protocol.as_str()),
            ..DnsLabels::default()
        };
        if let Some(w) = &self.client {
            if !w.canonical_name.is_empty() {
                labels.source_canonical_service = Arc::from(w.canonical_name.as_str());
            }
            if !w.canonical_revision.is_empty() {
                labels.source_canonical_revision = Arc::from(w.canonical_revision.as_str());
            }
        }
        labels
    }
}

impl DnsMetrics for Metrics {
    fn request(&self, req: &DnsRequest) {
        self.dns_request(&req.labels());
    }
    fn upstream_request(&self, req: &DnsRequest) {
        self.dns_upstream_request(&req.labels());
    }
    fn upstream_failure(&self, req: &DnsRequest) {
        self.dns_upstream_failure(&req.labels());
    }
    fn upstream_duration(&self, req: &DnsRequest, took: Duration) {
        self.dns_upstream_duration(&req.labels(), took);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Exposition;
    use ambit_model::identity::SpiffeId;
    use ambit_model::names::WorkloadUid;

    #[test]
    fn prometheus_series_move() {
        let id = SpiffeId::new("cluster.local", "default", "sa").unwrap();
        let mut w = Workload::new(WorkloadUid::new("w").unwrap(), "w", id);
        w.canonical_name = "app".into();
        let metrics = Metrics::new("test");
        let known = DnsRequest {
            query_type: "SRV".into(),
            protocol: Transport::Tcp,
            client: Some(Arc::new(w)),
        };
        let anonymous = DnsRequest {
            query_type: "A".into(),
            protocol: Transport::Udp,
            client: None,
        };
        let hook: &dyn DnsMetrics = &metrics;
        hook.request(&known);
        hook.request(&known);
        hook.upstream_request(&known);
        hook.upstream_failure(&known);
        hook.upstream_duration(&known, Duration::from_millis(3));
        hook.request(&anonymous);
        let text = metrics.encode(Exposition::Prometheus).unwrap();
        let known_labels = r#"request_query_type="SRV",request_protocol="tcp",source_canonical_service="app",source_canonical_revision="unknown""#;
        let anon_labels = r#"request_query_type="A",request_protocol="udp",source_canonical_service="unknown",source_canonical_revision="unknown""#;
        for want in [
            format!("istio_dns_requests_total{{{known_labels}}} 2"),
            format!("istio_dns_upstream_requests_total{{{known_labels}}} 1"),
            format!("istio_dns_upstream_failures_total{{{known_labels}}} 1"),
            format!("istio_dns_upstream_request_duration_seconds_count{{{known_labels}}} 1"),
            format!("istio_dns_requests_total{{{anon_labels}}} 1"),
        ] {
            assert!(text.contains(&want), "missing {want:?} in\n{text}");
        }
    }
}
