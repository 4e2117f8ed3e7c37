//! Shared (in-pod) mode: the ZDS client and the per-pod proxies it starts (§2, §1.3).
//!
//! The CNI node agent listens on `INPOD_UDS` (`SOCK_SEQPACKET`); ztunnel connects, says
//! hello (`ZdsHello{V1}`, bytes `08 01`) and then handles the agent's `WorkloadRequest`s
//! one at a time, answering every one with a `WorkloadResponse{Ack}` *after* processing it
//! (empty error = ACK). For each enrolled pod ([`AddWorkload`] + the pod's netns fd) it binds
//! the outbound (15001), inbound HBONE (15008) and inbound plaintext (15006) listeners inside
//! the pod's netns, every socket marked with `PACKET_MARK`, and serves them with a
//! [`Proxy`](crate::proxy::Proxy). Optional per-pod servers (the DNS proxy on 15053) plug in
//! through [`PodExtras`].
//!
//! # The conversation
//!
//! - Before `SnapshotSent`, `AddWorkload` / `KeepWorkload` mark a uid as named ("keep");
//!   `DelWorkload` only forgets the uid (and a pending start). At `SnapshotSent` every proxy
//!   not named since this connection started is stopped, then the snapshot is acked. After
//!   it only `AddWorkload` / `DelWorkload` are legal; `DelWorkload` drains the pod's proxies
//!   immediately (unknown uid: still ACK).
//! - Re-adding a uid with the same netns (inode, device) is a no-op ACK; with a different
//!   netns (re-created sandbox) the old proxies are drained and new ones started.
//! - A start failure (port still held, workload record not in the state after
//!   [`WORKLOAD_WAIT`]) is NACKed with `failure to start proxy : …`; the pod stays *pending*
//!   and is retried every [`RETRY_INTERVAL`] while the connection lasts.
//! - Running proxies survive a disconnect; per-connection state (keep set, pending pods) is
//!   reset on every connection and the next snapshot reconciles.
//! - Readiness task `"workload proxy manager"` is pending until this connection's
//!   `SnapshotSent` was processed and while any pod is pending.
//! - Reconnect backoff: 10 ms doubling to 15 s, forever.
//!
//! # Deviation from upstream (deliberate)
//!
//! Upstream treats a *protocol error* — `KeepWorkload` after the snapshot, a second
//! `SnapshotSent`, `AddWorkload` without `workload_info` — as a fatal version mismatch and
//! exits the whole process, which takes every pod on the node down with it. ambit NACKs the
//! message with a clear error, logs it, keeps the connection and keeps serving every other
//! pod. Transport-level errors (undecodable datagram, truncation, `AddWorkload` without its
//! fd, an fd on any other message, more than one fd, an fd that is not a network
//! namespace) are NACKed and the connection is dropped and re-established, like upstream.
//!
//! Layout: `protocol` turns datagrams into typed [`Request`]s and back, `client` owns the
//! connection loop, `workloads` the per-pod state machine, `pod` starting and stopping one
//! pod's proxies.

mod client;
pub mod compartment_wait;
mod platform;
mod pod;
mod protocol;
mod workloads;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ambit_netns::{NetnsId, SocketFactory, zds::TransportError};
use tokio::task::JoinSet;

use crate::config::Config;
use crate::drain::DrainWatcher;
use crate::identity::CertManager;
use crate::proxy::{ConnectionTracker, LocalWorkload};
use crate::readiness::Ready;
use crate::state::ProxyState;
use crate::telemetry::Metrics;

pub use platform::{NamespaceError, PodNetns, SetupError};
pub use pod::StartError;
pub use protocol::{Request, decode_request, encode_ack, encode_hello};

/// How long an `AddWorkload` waits for the pod's workload record to appear in the state.
/// Upstream waits 5 s, exactly the CNI agent's ack deadline: a late record then makes the agent
/// drop the connection and read our late ack as the answer to its next request. 3 s answers
/// in time (a NACK; the pod stays pending and is retried every 5 s).
pub const WORKLOAD_WAIT: Duration = Duration::from_secs(3);
/// How often pending pods are retried.
pub const RETRY_INTERVAL: Duration = Duration::from_secs(5);
/// First reconnect delay; doubles up to [`BACKOFF_MAX`].
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(10);
/// Longest reconnect delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(15);
/// Readiness task name (§8.4).
pub const READINESS_TASK: &str = "workload proxy manager";

/// Why a ZDS message was NACKed. [`ZdsError::drops_connection`] says whether the
/// connection is re-established afterwards.
#[derive(Debug, thiserror::Error)]
pub enum ZdsError {
    #[error("failure to read message: {0}")]
    Read(#[from] TransportError),
    #[error("failure to read message: undecodable WorkloadRequest: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("failure to read message: WorkloadRequest without a known payload")]
    NoPayload,
    #[error(
        "failure to read message: No control message (AddWorkload {uid} needs the pod's netns fd)"
    )]
    MissingFd { uid: String },
    #[error("failure to read message: unexpected file descriptor with {message}")]
    UnexpectedFd { message: &'static str },
    #[error("failure to read message: the fd sent with AddWorkload {uid}: {source}")]
    BadNetns { uid: String, source: NamespaceError },
    #[error("protocol error: AddWorkload {uid} without workload_info")]
    MissingWorkloadInfo { uid: String },
    #[error("protocol error: {message} without a uid")]
    MissingUid { message: &'static str },
    #[error("protocol error: KeepWorkload {uid} after SnapshotSent")]
    KeepAfterSnapshot { uid: String },
    #[error("protocol error: second SnapshotSent on one connection")]
    DuplicateSnapshot,
    #[error("failure to start proxy : {0}")]
    StartProxy(#[from] StartError),
}

impl ZdsError {
    /// Transport errors: the datagram stream can no longer be trusted, so after the NACK the
    /// connection is dropped and re-established. Everything else keeps the connection.
    pub fn drops_connection(&self) -> bool {
        matches!(
            self,
            ZdsError::Read(_)
                | ZdsError::Decode(_)
                | ZdsError::NoPayload
                | ZdsError::MissingFd { .. }
                | ZdsError::UnexpectedFd { .. }
                | ZdsError::BadNetns { .. }
        )
    }
}

/// What a [`PodExtras`] hook gets to know about the pod it starts servers for.
#[derive(Debug)]
pub struct PodContext<'a> {
    /// The ZDS uid (Kubernetes pod UID).
    pub uid: &'a str,
    /// Name, namespace and service account from `WorkloadInfo`.
    pub workload: &'a LocalWorkload,
    /// The pod's netns identity.
    pub netns: NetnsId,
    /// Creates (marked) sockets inside the pod's netns.
    pub socket_factory: Arc<dyn SocketFactory>,
}

/// Error type of a [`PodExtras`] hook.
pub type ExtrasError = Box<dyn std::error::Error + Send + Sync>;

/// HOOK for the lead: extra per-pod servers started next to the pod's proxy — the DNS proxy
/// on 15053 (`crate::dns::DnsServer`). Set it with [`InpodManager::with_extras`].
///
/// `start` runs inside the data-plane runtime's context right after the proxy listeners
/// were bound, before they serve. It binds its sockets through `pod.socket_factory` and
/// spawns its tasks into `tasks`; they must finish once `drain` is signaled (graceful) and
/// are aborted when the pod's drain deadline passes. An error fails the pod's start
/// (NACK + pending + retry), exactly like a failed proxy bind: a pod whose DNS is redirected
/// to a port nobody listens on must not be reported as enrolled.
pub trait PodExtras: Send + Sync + 'static {
    fn start(
        &self,
        pod: &PodContext<'_>,
        tasks: &mut JoinSet<()>,
        drain: DrainWatcher,
    ) -> Result<(), ExtrasError>;
}

/// Everything starting a pod needs; shared by the manager and the pods.
struct Inputs {
    cfg: Arc<Config>,
    state: Arc<ProxyState>,
    certs: Arc<CertManager>,
    metrics: Arc<Metrics>,
    tracker: Arc<ConnectionTracker>,
    data: tokio::runtime::Handle,
    extras: Option<Arc<dyn PodExtras>>,
    workload_wait: Duration,
}

/// The shared-mode workload proxy manager: ZDS client plus every pod's proxies.
pub struct InpodManager {
    inputs: Inputs,
    ready: Ready,
    table: Mutex<workloads::Table>,
}

impl std::fmt::Debug for InpodManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InpodManager")
            .field("inpod_uds", &self.inputs.cfg.inpod_uds)
            .finish_non_exhaustive()
    }
}

impl InpodManager {
    /// A manager that is not ready (readiness task [`READINESS_TASK`]) until its first
    /// snapshot. Proxies are served on `data_runtime`; certificate prefetches go to the
    /// runtime `run` is polled on.
    pub fn new(
        cfg: Arc<Config>,
        state: Arc<ProxyState>,
        certs: Arc<CertManager>,
        metrics: Arc<Metrics>,
        tracker: Arc<ConnectionTracker>,
        ready: Ready,
        data_runtime: tokio::runtime::Handle,
    ) -> Self {
        let table = workloads::Table::new(&ready);
        Self {
            inputs: Inputs {
                cfg,
                state,
                certs,
                metrics,
                tracker,
                data: data_runtime,
                extras: None,
                workload_wait: WORKLOAD_WAIT,
            },
            ready,
            table: Mutex::new(table),
        }
    }

    /// Starts `extras` (e.g. the DNS proxy) next to every pod's proxy.
    pub fn with_extras(mut self, extras: Arc<dyn PodExtras>) -> Self {
        self.inputs.extras = Some(extras);
        self
    }

    /// Overrides [`WORKLOAD_WAIT`] (tests).
    pub fn with_workload_wait(mut self, wait: Duration) -> Self {
        self.inputs.workload_wait = wait;
        self
    }

    /// Runs the ZDS client until `drain` is signaled, then drains every pod's proxies
    /// gracefully (`CONNECTION_TERMINATION_DEADLINE`) and returns.
    pub async fn run(self: Arc<Self>, drain: DrainWatcher) {
        client::run(&self, &drain).await;
        self.shutdown().await;
        drop(drain);
    }

    /// `/config_dump` `workloadState`: uid → `{state: Pending|Up, info{name, namespace,
    /// serviceAccount}}`.
    pub fn workload_state(&self) -> serde_json::Value {
        self.lock().dump()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, workloads::Table> {
        // Every table update is a handful of map operations that cannot leave it
        // inconsistent, so a poisoned lock is still usable.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}
