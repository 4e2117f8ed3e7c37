//! Label sets of the `istio_*` metrics, with upstream's names and rendering (§8.1, §7).
//!
//! Free-form values are `Arc<str>` so workload and service names can be shared with the
//! proxy state instead of copied per connection. A missing value is `"unknown"` by default,
//! and an empty string is rendered as `unknown` too, so callers cannot produce the empty
//! labels upstream never emits.

use std::fmt;
use std::sync::{Arc, LazyLock};

use prometheus_client::encoding::{
    EncodeLabelSet, EncodeLabelValue, LabelSetEncoder, LabelValueEncoder,
};

/// The rendering of a missing label value.
pub const UNKNOWN: &str = "unknown";

static UNKNOWN_ARC: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(UNKNOWN));

/// A shared `"unknown"` value (no allocation per connection).
pub fn unknown() -> Arc<str> {
    UNKNOWN_ARC.clone()
}

/// Which side of the connection reports the series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reporter {
    /// The ztunnel of the client workload (outbound).
    Source,
    /// The ztunnel of the server workload (inbound).
    Destination,
}

impl Reporter {
    pub fn as_str(self) -> &'static str {
        match self {
            Reporter::Source => "source",
            Reporter::Destination => "destination",
        }
    }
}

/// Why a connection failed, as the `response_flags` label (Envoy-style names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum ResponseFlag {
    /// No failure: `-`.
    #[default]
    None = 0,
    /// Denied by authorization policy.
    Deny = 1,
    /// The upstream connection (TCP connect or HBONE CONNECT) failed.
    Connect = 2,
    TlsFailure = 3,
    H2HandshakeFailure = 4,
    NetworkPolicy = 5,
    IdentityError = 6,
    CertRevoked = 7,
}

impl ResponseFlag {
    const ALL: [ResponseFlag; 8] = [
        ResponseFlag::None,
        ResponseFlag::Deny,
        ResponseFlag::Connect,
        ResponseFlag::TlsFailure,
        ResponseFlag::H2HandshakeFailure,
        ResponseFlag::NetworkPolicy,
        ResponseFlag::IdentityError,
        ResponseFlag::CertRevoked,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ResponseFlag::None => "-",
            ResponseFlag::Deny => "DENY",
            ResponseFlag::Connect => "CONNECT",
            ResponseFlag::TlsFailure => "TLS_FAILURE",
            ResponseFlag::H2HandshakeFailure => "H2_HANDSHAKE_FAILURE",
            ResponseFlag::NetworkPolicy => "NETWORK_POLICY",
            ResponseFlag::IdentityError => "IDENTITY_ERROR",
            ResponseFlag::CertRevoked => "CERT_REVOKED",
        }
    }

    /// Whether the flag counts the connection in `istio_tcp_connections_failed_total`.
    pub fn is_failure(self) -> bool {
        self != ResponseFlag::None
    }

    pub(crate) fn from_u8(v: u8) -> ResponseFlag {
        Self::ALL.get(usize::from(v)).copied().unwrap_or_default()
    }
}

/// `connection_security_policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ConnectionSecurityPolicy {
    MutualTls,
    #[default]
    Unknown,
}

impl ConnectionSecurityPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectionSecurityPolicy::MutualTls => "mutual_tls",
            ConnectionSecurityPolicy::Unknown => UNKNOWN,
        }
    }
}

/// `request_protocol`: ztunnel only proxies TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RequestProtocol {
    #[default]
    Tcp,
}

impl RequestProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            RequestProtocol::Tcp => "tcp",
        }
    }
}

/// The label set of every `istio_tcp_*` traffic series, exactly upstream's list and order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TrafficLabels {
    pub reporter: Reporter,
    pub source_workload: Arc<str>,
    pub source_canonical_service: Arc<str>,
    pub source_canonical_revision: Arc<str>,
    pub source_workload_namespace: Arc<str>,
    /// SPIFFE id of the client (`spiffe://…`), known on the destination side from mTLS.
    pub source_principal: Arc<str>,
    pub source_app: Arc<str>,
    pub source_version: Arc<str>,
    pub source_cluster: Arc<str>,
    /// Service hostname (`svc.ns.svc.cluster.local`).
    pub destination_service: Arc<str>,
    pub destination_service_namespace: Arc<str>,
    pub destination_service_name: Arc<str>,
    pub destination_workload: Arc<str>,
    pub destination_canonical_service: Arc<str>,
    pub destination_canonical_revision: Arc<str>,
    pub destination_workload_namespace: Arc<str>,
    pub destination_principal: Arc<str>,
    pub destination_app: Arc<str>,
    pub destination_version: Arc<str>,
    pub destination_cluster: Arc<str>,
    pub request_protocol: RequestProtocol,
    /// The flag at open time (normally `-`); the final flag is set on the
    /// [`ConnectionGuard`](super::ConnectionGuard).
    pub response_flags: ResponseFlag,
    pub connection_security_policy: ConnectionSecurityPolicy,
    pub source_region: Arc<str>,
    pub source_zone: Arc<str>,
    pub destination_region: Arc<str>,
    pub destination_zone: Arc<str>,
}

impl TrafficLabels {
    /// All values unknown, for the given reporter.
    pub fn new(reporter: Reporter) -> Self {
        let u = unknown;
        TrafficLabels {
            reporter,
            source_workload: u(),
            source_canonical_service: u(),
            source_canonical_revision: u(),
            source_workload_namespace: u(),
            source_principal: u(),
            source_app: u(),
            source_version: u(),
            source_cluster: u(),
            destination_service: u(),
            destination_service_namespace: u(),
            destination_service_name: u(),
            destination_workload: u(),
            destination_canonical_service: u(),
            destination_canonical_revision: u(),
            destination_workload_namespace: u(),
            destination_principal: u(),
            destination_app: u(),
            destination_version: u(),
            destination_cluster: u(),
            request_protocol: RequestProtocol::Tcp,
            response_flags: ResponseFlag::None,
            connection_security_policy: ConnectionSecurityPolicy::Unknown,
            source_region: u(),
            source_zone: u(),
            destination_region: u(),
            destination_zone: u(),
        }
    }

    /// The labels as (name, value) pairs in exposition order.
    pub fn pairs(&self) -> [(&'static str, &str); 27] {
        [
            ("reporter", self.reporter.as_str()),
            ("source_workload", &self.source_workload),
            ("source_canonical_service", &self.source_canonical_service),
            ("source_canonical_revision", &self.source_canonical_revision),
            ("source_workload_namespace", &self.source_workload_namespace),
            ("source_principal", &self.source_principal),
            ("source_app", &self.source_app),
            ("source_version", &self.source_version),
            ("source_cluster", &self.source_cluster),
            ("destination_service", &self.destination_service),
            (
                "destination_service_namespace",
                &self.destination_service_namespace,
            ),
            ("destination_service_name", &self.destination_service_name),
            ("destination_workload", &self.destination_workload),
            (
                "destination_canonical_service",
                &self.destination_canonical_service,
            ),
            (
                "destination_canonical_revision",
                &self.destination_canonical_revision,
            ),
            (
                "destination_workload_namespace",
                &self.destination_workload_namespace,
            ),
            ("destination_principal", &self.destination_principal),
            ("destination_app", &self.destination_app),
            ("destination_version", &self.destination_version),
            ("destination_cluster", &self.destination_cluster),
            ("request_protocol", self.request_protocol.as_str()),
            ("response_flags", self.response_flags.as_str()),
            (
                "connection_security_policy",
                self.connection_security_policy.as_str(),
            ),
            ("source_region", &self.source_region),
            ("source_zone", &self.source_zone),
            ("destination_region", &self.destination_region),
            ("destination_zone", &self.destination_zone),
        ]
    }
}

impl Default for TrafficLabels {
    /// Unknown everything; the reporter defaults to `destination`.
    fn default() -> Self {
        TrafficLabels::new(Reporter::Destination)
    }
}

impl EncodeLabelSet for TrafficLabels {
    fn encode(&self, encoder: LabelSetEncoder) -> Result<(), fmt::Error> {
        encode_pairs(&self.pairs(), encoder)
    }
}

/// Labels of the DNS proxy metrics (§7).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DnsLabels {
    /// `A`, `AAAA`, `SRV`, …
    pub request_query_type: Arc<str>,
    /// `udp` or `tcp`.
    pub request_protocol: Arc<str>,
    pub source_canonical_service: Arc<str>,
    pub source_canonical_revision: Arc<str>,
}

impl Default for DnsLabels {
    fn default() -> Self {
        DnsLabels {
            request_query_type: unknown(),
            request_protocol: unknown(),
            source_canonical_service: unknown(),
            source_canonical_revision: unknown(),
        }
    }
}

impl EncodeLabelSet for DnsLabels {
    fn encode(&self, encoder: LabelSetEncoder) -> Result<(), fmt::Error> {
        encode_pairs(
            &[
                ("request_query_type", &self.request_query_type),
                ("request_protocol", &self.request_protocol),
                ("source_canonical_service", &self.source_canonical_service),
                ("source_canonical_revision", &self.source_canonical_revision),
            ],
            encoder,
        )
    }
}

/// Why the xDS stream ended (`istio_xds_connection_terminations_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum XdsTerminationReason {
    /// Could not connect / the transport broke.
    ConnectionError,
    /// The server returned a gRPC error.
    Error,
    /// We reconnect on purpose (e.g. stream max age).
    Reconnect,
    /// The server ended the stream cleanly.
    Complete,
}

impl XdsTerminationReason {
    pub fn as_str(self) -> &'static str {
        match self {
            XdsTerminationReason::ConnectionError => "ConnectionError",
            XdsTerminationReason::Error => "Error",
            XdsTerminationReason::Reconnect => "Reconnect",
            XdsTerminationReason::Complete => "Complete",
        }
    }
}

/// A label set of one label with a static name and a fixed value rendering.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct OneLabel<V> {
    pub name: &'static str,
    pub value: V,
}

impl<V: AsRef<str>> EncodeLabelSet for OneLabel<V> {
    fn encode(&self, encoder: LabelSetEncoder) -> Result<(), fmt::Error> {
        encode_pairs(&[(self.name, self.value.as_ref())], encoder)
    }
}

/// Label values as strings, `unknown` for empty ones, escaped for the text exposition.
/// prometheus-client writes label values verbatim, and some values (app/version from a
/// peer's baggage) are peer-controlled: a `"` or newline must not break the scrape.
struct Value<'a>(&'a str);

impl EncodeLabelValue for Value<'_> {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), fmt::Error> {
        use std::fmt::Write;
        let v = if self.0.is_empty() { UNKNOWN } else { self.0 };
        let mut rest = v;
        while let Some(i) = rest.find(['\\', '"', '\n']) {
            encoder.write_str(&rest[..i])?;
            encoder.write_str(match rest.as_bytes()[i] {
                b'\\' => "\\\\",
                b'"' => "\\\"",
                _ => "\\n",
            })?;
            rest = &rest[i + 1..];
        }
        encoder.write_str(rest)
    }
}

fn encode_pairs(
    pairs: &[(&'static str, &str)],
    mut encoder: LabelSetEncoder,
) -> Result<(), fmt::Error> {
    for &(name, value) in pairs {
        prometheus_client::encoding::EncodeLabel::encode(
            &(name, Value(value)),
            encoder.encode_label(),
        )?;
    }
    Ok(())
}
