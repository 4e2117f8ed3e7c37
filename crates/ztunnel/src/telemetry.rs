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

use std::borrow::Borrow;
use std::cell::RefCell;
use std::collections::HashSet;
use std::hash::Hash;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::LocalKey;

pub use access_log::{AccessLog, ConnectionLog, ConnectionNames, Direction, connection_failed};
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

/// Distinct values a [`share`] table keeps per thread before it starts over (values already
/// handed out stay valid; only sharing with later connections is lost).
pub(crate) const SHARE_CAPACITY: usize = 1024;

/// A per-thread table of shared values (see [`share`]).
pub(crate) type ShareTable<T> = RefCell<HashSet<Arc<T>>>;

/// One allocation for every open connection holding an equal `value` on this thread: what
/// each connection keeps for its whole life (its metric labels, its access-log names) is the
/// same for every connection between the same two workloads, so an idle connection holds a
/// pointer instead of a copy. A full table starts over; outside a thread-local context the
/// value is simply boxed.
pub(crate) fn share<T: Eq + Hash>(table: &'static LocalKey<ShareTable<T>>, value: T) -> Arc<T> {
    share_by(table, value, |_| true, |v| v)
}

/// [`share`] for values found by a key they borrow as: the entry equal to `key` if
/// `reusable` accepts it, else `make(key)`, which then replaces it in the table.
pub(crate) fn share_by<K: Eq + Hash, T: Eq + Hash>(
    table: &'static LocalKey<ShareTable<T>>,
    key: K,
    reusable: impl Fn(&T) -> bool,
    make: impl FnOnce(K) -> T,
) -> Arc<T>
where
    Arc<T>: Borrow<K>,
{
    let mut parts = Some((key, make));
    table
        .try_with(|set| {
            let (key, make) = parts.take().expect("taken once");
            let mut set = set.borrow_mut();
            if let Some(shared) = set.get(&key)
                && reusable(shared)
            {
                return shared.clone();
            }
            if set.len() >= SHARE_CAPACITY {
                set.clear();
            }
            let shared = Arc::new(make(key));
            set.replace(shared.clone());
            shared
        })
        .unwrap_or_else(|_| {
            let (key, make) = parts.take().expect("not taken when the table is gone");
            Arc::new(make(key))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static TABLE: ShareTable<String> = Default::default();
    }

    #[test]
    fn a_full_share_table_starts_over_and_handed_out_values_stay_valid() {
        let first = share(&TABLE, "value-0".to_owned());
        assert!(Arc::ptr_eq(&first, &share(&TABLE, "value-0".to_owned())));
        for i in 0..SHARE_CAPACITY * 2 {
            assert_eq!(*share(&TABLE, format!("value-{i}")), format!("value-{i}"));
        }
        assert_eq!(*first, "value-0");
        assert!(TABLE.with(|t| t.borrow().len()) <= SHARE_CAPACITY);
    }
}
