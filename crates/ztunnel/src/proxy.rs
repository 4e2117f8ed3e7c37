//! The data path: the listeners of one proxied workload set (outbound 15001, inbound HBONE
//! 15008, inbound plaintext 15006) and what they share.
//!
//! A [`Proxy`] serves one "context": in dedicated mode the process's own namespace and its one
//! workload; in shared mode one pod, with every socket created inside the pod's netns through
//! its [`SocketFactory`]. Listeners are owned by the proxy's task set and stop on drain.

mod counted;
mod inbound;
mod inbound_plaintext;
mod observe;
mod outbound;
mod pool;
mod tracker;
mod upstream;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ambit_hbone::TaskSet;
use ambit_model::Workload;
use ambit_netns::{SocketFactory, SocketOptions, Transparent};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use ambit_contract::ports;

use crate::config::Config;
use crate::identity::CertManager;
use crate::state::ProxyState;
use crate::telemetry::Metrics;

pub use pool::{PoolKey, WorkloadPool};
pub use tracker::{ConnectionTracker, TrackedConnection};

/// Why a proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("binding the {listener} listener on {addr}: {source}")]
    Bind {
        listener: &'static str,
        addr: SocketAddr,
        #[source]
        source: ambit_netns::SocketError,
    },
    #[error("registering the {listener} listener with the runtime: {source}")]
    Register {
        listener: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Which workload(s) this proxy serves, resolved against the state on every connection (the
/// record can change under us via xDS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalWorkload {
    pub name: String,
    pub namespace: String,
    pub service_account: String,
}

/// Everything a proxy's listeners need.
#[derive(Debug, Clone)]
pub struct ProxyInputs {
    pub cfg: Arc<Config>,
    pub state: Arc<ProxyState>,
    pub certs: Arc<CertManager>,
    pub metrics: Arc<Metrics>,
    pub socket_factory: Arc<dyn SocketFactory>,
    pub pool: WorkloadPool,
    pub local: LocalWorkload,
    pub tracker: Arc<ConnectionTracker>,
    /// Whether IP_TRANSPARENT worked on the inbound listeners (source-IP preservation).
    pub transparent: bool,
}

impl ProxyInputs {
    /// The workload record this proxy serves, if the state has it.
    pub fn local_workload(&self) -> Option<Arc<Workload>> {
        let l = &self.local;
        self.state.find_local_workload(
            &l.name,
            &l.namespace,
            &l.service_account,
            self.cfg.node_name.as_deref(),
        )
    }

    /// Socket options for connections this proxy dials.
    fn upstream_options(&self) -> SocketOptions {
        SocketOptions {
            nodelay: true,
            keepalive: keepalive(&self.cfg),
            reuse_address: false,
            // Passthrough and dedicated-mode connects are not source-bound, but share the
            // pod's 4-tuples to one destination with the application's own connects.
            sequential_port_search: true,
            ..SocketOptions::default()
        }
    }

    /// Is `port` one of ours (connecting there would loop back into the proxy)?
    pub fn illegal_port(&self, port: u16) -> bool {
        self.cfg.illegal_ports().contains(&port)
    }
}

fn keepalive(cfg: &Config) -> Option<ambit_netns::Keepalive> {
    cfg.keepalive.enabled.then_some(ambit_netns::Keepalive {
        time: cfg.keepalive.time,
        interval: cfg.keepalive.interval,
        retries: cfg.keepalive.retries,
    })
}

/// The bound listeners of one proxy, before serving.
#[derive(Debug)]
pub struct Listeners {
    outbound: TcpListener,
    inbound: TcpListener,
    inbound_plaintext: TcpListener,
    /// IP_TRANSPARENT could be set on the inbound listeners.
    pub transparent: bool,
}

impl Listeners {
    /// Binds 15001/15006/15008 through `factory` on the unspecified address.
    pub fn bind(cfg: &Config, factory: &dyn SocketFactory) -> Result<Self, ProxyError> {
        let ip: IpAddr = if cfg.ipv6_enabled {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        } else {
            std::net::Ipv4Addr::UNSPECIFIED.into()
        };
        let transparent = match cfg.enable_orig_src {
            Some(true) => Transparent::Required,
            Some(false) => Transparent::Off,
            None => Transparent::BestEffort,
        };
        let opts = SocketOptions {
            reuse_port: cfg.inpod_port_reuse,
            nodelay: true,
            keepalive: keepalive(cfg),
            transparent,
            // Dual-stack: one listener serves v4 and v6 (upstream shows v6only:0).
            only_v6: cfg.ipv6_enabled.then_some(false),
            ..SocketOptions::default()
        };
        let bind = |listener: &'static str, port: u16| -> Result<TcpListener, ProxyError> {
            let addr = SocketAddr::new(ip, port);
            let std_listener =
                factory
                    .new_tcp_listener(addr, &opts)
                    .map_err(|source| ProxyError::Bind {
                        listener,
                        addr,
                        source,
                    })?;
            TcpListener::from_std(std_listener)
                .map_err(|source| ProxyError::Register { listener, source })
        };
        let outbound = bind("outbound", ports::OUTBOUND)?;
        let inbound = bind("inbound", ports::INBOUND_HBONE)?;
        let inbound_plaintext = bind("inbound plaintext", ports::INBOUND_PLAINTEXT)?;
        let transparent = transparent != Transparent::Off
            && ambit_netns::is_transparent(&inbound).unwrap_or(false);
        Ok(Self {
            outbound,
            inbound,
            inbound_plaintext,
            transparent,
        })
    }

    /// Local addresses (for tests and logs).
    pub fn addresses(&self) -> [Option<SocketAddr>; 3] {
        [
            self.outbound.local_addr().ok(),
            self.inbound.local_addr().ok(),
            self.inbound_plaintext.local_addr().ok(),
        ]
    }
}

/// A running proxy: its accept loops and connections live in `tasks`.
#[derive(Debug)]
pub struct Proxy {
    tasks: JoinSet<()>,
    drain: crate::drain::DrainTrigger,
}

impl Proxy {
    /// Starts serving on `listeners`. Connections stop accepting when the proxy drains.
    pub fn serve(listeners: Listeners, inputs: ProxyInputs) -> Self {
        let (drain, watcher) = crate::drain::new();
        let mut tasks = JoinSet::new();
        let inputs = ProxyInputs {
            transparent: listeners.transparent,
            ..inputs
        };
        tasks.spawn(outbound::run(
            listeners.outbound,
            inputs.clone(),
            watcher.clone(),
        ));
        tasks.spawn(inbound::run(
            listeners.inbound,
            inputs.clone(),
            watcher.clone(),
        ));
        tasks.spawn(inbound_plaintext::run(
            listeners.inbound_plaintext,
            inputs,
            watcher,
        ));
        Self { tasks, drain }
    }

    /// Stops accepting, lets connections finish until `deadline`, then cuts them.
    pub async fn drain(mut self, mode: crate::drain::DrainMode, deadline: std::time::Duration) {
        self.drain.start_drain_and_wait(mode, deadline).await;
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }
}

pub use pool::CONNECT_TIMEOUT;

/// How long a connection accepted before the policy state synced is held, waiting for it,
/// before it is closed.
pub const POLICY_SYNC_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Holds connections until the policy state has synced (see [`crate::state`]): no connection
/// is routed or authorized against a state whose first complete response has not arrived.
/// In shared mode pods only get proxies after the sync, so this only ever holds connections
/// in dedicated mode right after start.
#[derive(Debug, Clone)]
struct SyncGate {
    state: Arc<ProxyState>,
    wait: std::time::Duration,
}

impl SyncGate {
    fn new(state: Arc<ProxyState>) -> Self {
        Self {
            state,
            wait: POLICY_SYNC_WAIT,
        }
    }

    /// Runs `conn` once the state is synced; drops it (closing its socket) if that takes
    /// longer than the gate's wait.
    async fn pass<Fut: std::future::Future<Output = ()>>(
        self,
        listener: &'static str,
        peer: SocketAddr,
        conn: Fut,
    ) {
        match tokio::time::timeout(self.wait, self.state.wait_synced()).await {
            Ok(()) => conn.await,
            Err(_) => tracing::warn!(
                listener,
                %peer,
                waited = ?self.wait,
                "policy state not synced: connection closed"
            ),
        }
    }
}

/// The accept loop every listener shares: each connection runs `handle` in a task owned by
/// the loop (a [`TaskSet`]: aborted with the loop, and a finished connection does not wake
/// it) and holding a drain watcher, once `gate` lets it; on drain the listener closes (no new
/// connections) and the loop waits for its connections (the proxy's drain deadline cuts them).
async fn accept_loop<F, Fut>(
    name: &'static str,
    listener: TcpListener,
    gate: SyncGate,
    drain: crate::drain::DrainWatcher,
    handle: F,
) where
    F: Fn(tokio::net::TcpStream, SocketAddr, crate::drain::DrainWatcher) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut conns = TaskSet::new();
    loop {
        tokio::select! {
            _ = drain.signaled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let conn = handle(stream, peer, drain.clone());
                    if gate.state.is_synced() {
                        conns.spawn(conn);
                    } else {
                        conns.spawn(gate.clone().pass(name, peer, conn));
                    }
                }
                Err(e) => accept_error(name, e).await,
            },
        }
    }
    drop(listener);
    conns.wait().await;
}

/// Accept errors (EMFILE, ECONNABORTED, ...) must not spin the loop: log and pause briefly.
async fn accept_error(listener: &'static str, e: std::io::Error) {
    tracing::warn!(listener, error = %e, "accept failed");
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
}

/// An inbound connection arrived on an address that does not belong (only) to the workload
/// the listener serves.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotServed {
    #[error("local: destination {arrived} is not an address of the served workload {served}")]
    Unclaimed { arrived: IpAddr, served: String },
    #[error(
        "local: destination {arrived} is claimed by workload {claimed_by}, not by the served workload {served}"
    )]
    ClaimedByOther {
        arrived: IpAddr,
        served: String,
        claimed_by: String,
    },
}

/// Checks that `arrived` (the address an inbound connection was sent to) is the served
/// workload's in the state's address index. Upstream evaluates policy for the served
/// workload without this check; ambit also refuses when the index names no record or
/// another one (a WorkloadEntry or a stale record holding the same IP): then the mesh's view
/// of who owns the address disagrees with who listens there, and a client's ztunnel picks
/// identities and routes by that other record.
fn served_at(state: &ProxyState, served: &Workload, arrived: IpAddr) -> Result<(), NotServed> {
    match state.workload_by_addr(&served.network, arrived) {
        Some(w) if w.uid == served.uid => Ok(()),
        Some(w) => Err(NotServed::ClaimedByOther {
            arrived,
            served: served.uid.to_string(),
            claimed_by: w.uid.to_string(),
        }),
        None => Err(NotServed::Unclaimed {
            arrived,
            served: served.uid.to_string(),
        }),
    }
}

/// IPv4-mapped IPv6 addresses (dual-stack listeners) as plain IPv4.
fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// The original destination of a redirected connection, or its local address when it was
/// not redirected (a client that dialled 15001 directly).
fn original_dst(stream: &tokio::net::TcpStream) -> SocketAddr {
    let dst = ambit_netns::original_dst(stream)
        .or_else(|_| stream.local_addr())
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    canonical(dst)
}

/// HTTP/2 settings from the configuration (§3.3).
fn h2_settings(cfg: &Config) -> ambit_hbone::H2Settings {
    ambit_hbone::H2Settings {
        stream_window: cfg.http2.stream_window_size,
        connection_window: cfg.http2.connection_window_size,
        max_frame_size: cfg.http2.frame_size,
        drain_deadline: cfg.connection_termination_deadline,
        ..ambit_hbone::H2Settings::default()
    }
}

/// Pool settings from the configuration (§3.4).
pub fn pool_config(cfg: &Config) -> ambit_hbone::PoolConfig {
    ambit_hbone::PoolConfig {
        max_streams_per_connection: usize::from(cfg.pool.max_streams_per_connection),
        unused_release_timeout: cfg.pool.unused_release_timeout,
        // Let bulk flows to one peer use more than one connection (and so more than one
        // core); upstream keeps one connection per key until it is full.
        spread_connections_per_key: cfg.worker_threads.clamp(1, 8),
        h2: h2_settings(cfg),
    }
}

/// Why the bytes of a proxied connection stopped moving before both sides closed. The
/// variant and its source say which side failed; the text is what access logs always said.
#[derive(Debug, thiserror::Error)]
pub enum CopyFailure {
    /// Between two TCP connections (passthrough, non-HBONE workloads, inbound plaintext).
    #[error("{}", .0.source)]
    Tcp(#[source] ambit_hbone::copy::StreamsCopyError),
    /// Between a socket and an HBONE tunnel.
    #[error("{0}")]
    Hbone(#[source] ambit_hbone::CopyError),
}

/// Which side of a [`copy_tcp`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpCopySide {
    /// The accepted connection (the application outbound, the peer inbound).
    Client,
    /// The connection ztunnel opened.
    Upstream,
}

impl CopyFailure {
    /// The failing side of a TCP copy (`None` for HBONE copies: see their [`CopySide`]).
    ///
    /// [`CopySide`]: ambit_hbone::CopySide
    pub fn tcp_side(&self) -> Option<TcpCopySide> {
        match self {
            CopyFailure::Tcp(e) => Some(match e.end {
                ambit_hbone::copy::StreamEnd::First => TcpCopySide::Client,
                ambit_hbone::copy::StreamEnd::Second => TcpCopySide::Upstream,
            }),
            CopyFailure::Hbone(_) => None,
        }
    }
}

/// Copies between two TCP streams, counting bytes live for metrics (Istio's convention:
/// "received" is the request direction, client → server; "sent" the response direction).
async fn copy_tcp(
    client: &mut tokio::net::TcpStream,
    upstream: &mut tokio::net::TcpStream,
    guard: &crate::telemetry::ConnectionGuard,
) -> Result<(), CopyFailure> {
    let mut counted = counted::Counted::new(client, guard, true);
    // No per-connection buffers: reads borrow a per-thread block only while data is moving.
    ambit_hbone::copy::copy_streams(&mut counted, upstream)
        .await
        .map(drop)
        .map_err(CopyFailure::Tcp)
}

/// Copies between a socket and an HBONE tunnel, counting bytes live for metrics.
/// `socket_is_client` tells which way is the request direction (outbound: the socket is the
/// client; inbound: the socket is the application).
async fn copy_hbone(
    socket: &mut tokio::net::TcpStream,
    tunnel: &mut ambit_hbone::H2Stream,
    guard: &crate::telemetry::ConnectionGuard,
    socket_is_client: bool,
) -> Result<(), CopyFailure> {
    let mut counted = counted::Counted::new(socket, guard, socket_is_client);
    ambit_hbone::copy_bidirectional(&mut counted, tunnel)
        .await
        .map(drop)
        .map_err(CopyFailure::Hbone)
}

#[cfg(test)]
mod tests;

/// Ciphertext read ahead of rustls on HBONE connections ([`ambit_hbone::ReadAhead`]): the
/// receiving ztunnel made 50–60 `recvfrom` per MB (one per TLS record, rustls's own reads),
/// ~12 with this (BENCHMARKS.md, "Bulk data"). 256 KiB measured no better than 64 KiB.
pub(crate) const HBONE_READ_AHEAD: usize = 64 * 1024;

/// rustls's bound on encrypted bytes queued for the socket of an HBONE connection (its
/// default is 64 KiB): the sending ztunnel hands the kernel up to this much per `writev`
/// (~14 → ~6 per MB), and a writer is back-pressured once it is reached, as before.
pub(crate) const HBONE_TLS_SEND_LIMIT: usize = 256 * 1024;
