//! Telemetry: what the proxy tells the outside world about itself (§8.1, §8.2).
//!
//! - [`metrics`]: the Prometheus registry with upstream's metric names and labels, and the
//!   per-connection [`ConnectionGuard`] that keeps traffic counters live.
//! - [`access_log`]: connection records on the tracing target `access`.
//! - [`logging`]: the tracing subscriber with a reloadable filter (admin `/logging`).
//! - [`server`]: the Prometheus scrape endpoint (15020).
//!
//! The small HTTP/1.1 serving loop shared by the metrics, admin and readiness servers lives in
//! `http_server` (crate-private) so all three stop on drain the same way.

pub mod access_log;
pub(crate) mod http_server;
pub mod logging;
pub mod metrics;
mod process;
pub mod server;

use std::net::SocketAddr;

pub use access_log::{AccessLog, ConnectionLog, Direction, connection_failed};
pub use logging::{LogHandle, init_logging};
pub use metrics::{
    ConnectionGuard, ConnectionSecurityPolicy, DnsLabels, Exposition, Metrics, Reporter,
    RequestProtocol, ResponseFlag, TrafficLabels, WorkloadManagerMetrics, XdsTerminationReason,
};
pub use server::MetricsServer;

/// Errors at the telemetry boundary: starting servers and configuring logging.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("failed to bind metrics server on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("invalid log filter {filter:?}: {reason}")]
    InvalidFilter { filter: String, reason: String },
    #[error("a global tracing subscriber is already installed")]
    SubscriberAlreadySet,
    #[error("log filter can no longer be changed: the subscriber is gone")]
    ReloadFailed,
}
