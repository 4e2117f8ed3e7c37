//! Access logs: one record per proxied connection on the tracing target `access` (§8.2).
//!
//! - DEBUG "connection opened" when it starts ([`AccessLog::opened`]);
//! - INFO "connection complete" when it ends, ERROR with `error=` if it failed
//!   ([`AccessLog::complete`]);
//! - WARN "connection failed" for failures before there is a connection record at all
//!   ([`connection_failed`]).
//!
//! `bytes_sent` is what flowed client → server (towards the destination) and `bytes_recv`
//! what flowed back, for both directions. Note this is the *opposite* word from Istio's metric
//! convention (see [`super::metrics`]): with a [`ConnectionGuard`],
//! `bytes_sent = guard.bytes_received()`; [`AccessLog::complete_with`] does that for you.
//! Missing optional fields are left out of the record, as upstream does.

use std::fmt::Display;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::metrics::ConnectionGuard;

/// The tracing target of access logs.
pub const TARGET: &str = "access";

/// Which way the connection goes, from the workload this ztunnel serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Outbound,
    Inbound,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Outbound => "outbound",
            Direction::Inbound => "inbound",
        }
    }
}

/// What an access log record says about a connection's endpoints.
#[derive(Debug, Clone)]
pub struct ConnectionLog {
    pub direction: Direction,
    pub src_addr: SocketAddr,
    /// L4 next hop (e.g. `podIP:15008` for HBONE, the app's address inbound).
    pub dst_addr: SocketAddr,
    pub names: ConnectionNames,
}

/// A record's names: all of it but the addresses and the direction. They are the same for
/// every connection between the same two workloads, so an open connection holds one shared
/// copy ([`super::share`]) instead of ten pointers of its own (160 bytes per connection and
/// proxy).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ConnectionNames {
    pub src_workload: Option<Arc<str>>,
    pub src_namespace: Option<Arc<str>>,
    /// SPIFFE id of the client; only when it was proven by mTLS.
    pub src_identity: Option<Arc<str>>,
    pub src_cluster: Option<Arc<str>>,
    /// The HBONE CONNECT authority, when tunnelled.
    pub dst_hbone_addr: Option<Arc<str>>,
    pub dst_service: Option<Arc<str>>,
    pub dst_workload: Option<Arc<str>>,
    pub dst_namespace: Option<Arc<str>>,
    pub dst_identity: Option<Arc<str>>,
    pub dst_cluster: Option<Arc<str>>,
}

impl ConnectionLog {
    /// A record with only the addresses and direction known.
    pub fn new(direction: Direction, src_addr: SocketAddr, dst_addr: SocketAddr) -> Self {
        ConnectionLog {
            direction,
            src_addr,
            dst_addr,
            names: ConnectionNames::default(),
        }
    }
}

thread_local! {
    static SHARED_NAMES: super::ShareTable<ConnectionNames> = Default::default();
}

/// The access log of one connection; log the end with [`AccessLog::complete`].
#[derive(Debug)]
pub struct AccessLog {
    direction: Direction,
    src_addr: SocketAddr,
    dst_addr: SocketAddr,
    names: Arc<ConnectionNames>,
    started: Instant,
}

/// `13ms`, upstream's rendering of the connection duration.
fn format_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

// Events need a constant level, so the field list is written once here and expanded per level.
// `$at` has the addresses and the direction, `$names` the [`ConnectionNames`].
macro_rules! access_event {
    ($level:expr, $at:expr, $names:expr, $msg:literal $(, $($extra:tt)+)?) => {
        tracing::event!(
            target: "access",
            $level,
            src.addr = %$at.src_addr,
            src.workload = $names.src_workload.as_deref(),
            src.namespace = $names.src_namespace.as_deref(),
            src.identity = $names.src_identity.as_deref(),
            src.cluster = $names.src_cluster.as_deref(),
            dst.addr = %$at.dst_addr,
            dst.hbone_addr = $names.dst_hbone_addr.as_deref(),
            dst.service = $names.dst_service.as_deref(),
            dst.workload = $names.dst_workload.as_deref(),
            dst.namespace = $names.dst_namespace.as_deref(),
            dst.identity = $names.dst_identity.as_deref(),
            dst.cluster = $names.dst_cluster.as_deref(),
            direction = $at.direction.as_str(),
            $($($extra)+,)?
            $msg
        )
    };
}

impl AccessLog {
    /// Starts the record and logs DEBUG "connection opened".
    pub fn opened(info: ConnectionLog) -> Self {
        access_event!(tracing::Level::DEBUG, info, info.names, "connection opened");
        AccessLog {
            direction: info.direction,
            src_addr: info.src_addr,
            dst_addr: info.dst_addr,
            names: super::share(&SHARED_NAMES, info.names),
            started: Instant::now(),
        }
    }

    /// Logs INFO "connection complete", or ERROR with `error` if it failed.
    pub fn complete(self, bytes_sent: u64, bytes_recv: u64, error: Option<&dyn Display>) {
        let names = &*self.names;
        let duration = format_duration(self.started.elapsed());
        match error {
            None => access_event!(
                tracing::Level::INFO,
                self,
                names,
                "connection complete",
                bytes_sent,
                bytes_recv,
                duration = %duration
            ),
            Some(error) => access_event!(
                tracing::Level::ERROR,
                self,
                names,
                "connection complete",
                bytes_sent,
                bytes_recv,
                duration = %duration,
                error = %error
            ),
        }
    }

    /// [`AccessLog::complete`] with the byte totals of a metrics guard.
    pub fn complete_with(self, guard: &ConnectionGuard, error: Option<&dyn Display>) {
        self.complete(guard.bytes_received(), guard.bytes_sent(), error);
    }
}

/// Logs WARN "connection failed" for a failure before a connection record exists.
pub fn connection_failed(
    src_addr: SocketAddr,
    dst_addr: SocketAddr,
    direction: Direction,
    error: &dyn Display,
) {
    tracing::event!(
        target: "access",
        tracing::Level::WARN,
        src.addr = %src_addr,
        dst.addr = %dst_addr,
        direction = direction.as_str(),
        error = %error,
        "connection failed"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(dst_workload: &str, src_port: u16) -> ConnectionLog {
        let mut info = ConnectionLog::new(
            Direction::Inbound,
            SocketAddr::from(([10, 0, 0, 1], src_port)),
            SocketAddr::from(([10, 0, 0, 2], 8080)),
        );
        info.names.src_workload = Some("client".into());
        info.names.dst_workload = Some(dst_workload.into());
        info
    }

    #[test]
    fn connections_with_equal_names_share_them_and_keep_their_addresses() {
        let (a, b, c) = (
            AccessLog::opened(record("server", 40000)),
            AccessLog::opened(record("server", 40001)),
            AccessLog::opened(record("other", 40002)),
        );
        assert!(Arc::ptr_eq(&a.names, &b.names));
        assert!(!Arc::ptr_eq(&a.names, &c.names));
        assert_eq!(c.names.dst_workload.as_deref(), Some("other"));
        assert_eq!(
            (a.src_addr.port(), b.src_addr.port(), b.direction),
            (40000, 40001, Direction::Inbound)
        );
    }
}
