//! The workload xDS server: delta ADS (`DeltaAggregatedResources`) serving
//! `istio.workload.Address` and `istio.security.Authorization` resources (spec §4.1).
//!
//! [`XdsServer`] holds the current [`Snapshot`]; [`XdsServer::update`] swaps it and every open
//! stream pushes only what changed. Per stream and per type the server keeps what the client
//! holds (name → version), sends one response at a time and waits for its ACK or NACK before
//! the next, so a burst of updates collapses into one push of the latest state. A NACK is
//! logged and the stream kept; the refused version is not sent again (it would be refused
//! again), only a newer one. Subscriptions: an empty first request is a wildcard, explicit
//! names and `*` may be (un)subscribed later; on reconnect `initial_resource_versions` spares
//! the client what it already has and removes what disappeared meanwhile.
//!
//! Streams are driven by tonic itself (the response stream is the protocol loop, no spawned
//! task): a client that goes away drops its stream, and [`XdsServer::shutdown`] ends every
//! open stream with `UNAVAILABLE` so a graceful server shutdown is not held up by them.
//!
//! A [`ConnectHook`] (auto-registration) sees the first request that carries a `Node`; it may
//! refuse the stream or hold a guard that is dropped when the stream ends.

pub mod auth;
mod session;
pub mod snapshot;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ambit_proto::core::Node;
use ambit_proto::discovery::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use ambit_proto::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use futures_util::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status, Streaming};

pub use auth::{AllowAll, Credentials, TokenAuthorizer, XdsAuthorizer, XdsPeer};
pub use session::{Answer, Session, SessionError};
pub use snapshot::{Resources, Snapshot, VersionedResource};

use crate::grpc::PeerInfo;

/// Largest request the server decodes (spec §4.1: 200 MiB, same as the client).
pub const MAX_MESSAGE_SIZE: usize = 200 * 1024 * 1024;

/// A stream that has presented its node: who it is, what it says, where it comes from.
#[derive(Debug, Clone, Copy)]
pub struct Connection<'a> {
    pub peer: &'a XdsPeer,
    pub node: &'a Node,
    /// The TCP peer, when the transport knows it.
    pub remote: Option<SocketAddr>,
}

/// Something held for as long as a stream is open (dropped when it ends, however it ends).
pub type ConnectionGuard = Box<dyn std::any::Any + Send>;

/// Called once per stream, on the first request that carries a `Node`.
pub trait ConnectHook: Send + Sync + 'static {
    /// `Ok(Some(guard))`: keep `guard` for the stream's life; `Ok(None)`: nothing to keep;
    /// `Err(status)`: end the stream with `status` (fail closed).
    fn connect(&self, conn: Connection<'_>) -> Result<Option<ConnectionGuard>, Status>;
}

struct Inner {
    snapshot: watch::Sender<Arc<Snapshot>>,
    authorizer: Arc<dyn XdsAuthorizer>,
    connect_hook: Option<Arc<dyn ConnectHook>>,
    next_nonce: AtomicU64,
    next_version: AtomicU64,
    shutdown: watch::Sender<bool>,
}

/// The delta ADS server. Cheap to clone; clones share the snapshot and the streams.
#[derive(Clone)]
pub struct XdsServer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for XdsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdsServer")
            .field("version", &self.inner.snapshot.borrow().version())
            .field("streams", &self.inner.snapshot.receiver_count())
            .finish()
    }
}

impl XdsServer {
    /// A server with an empty snapshot.
    pub fn new(authorizer: Arc<dyn XdsAuthorizer>) -> Self {
        Self::build(authorizer, None)
    }

    /// A server with an empty snapshot that asks `hook` about every stream's node.
    pub fn with_connect_hook(
        authorizer: Arc<dyn XdsAuthorizer>,
        hook: Arc<dyn ConnectHook>,
    ) -> Self {
        Self::build(authorizer, Some(hook))
    }

    fn build(
        authorizer: Arc<dyn XdsAuthorizer>,
        connect_hook: Option<Arc<dyn ConnectHook>>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                snapshot: watch::channel(Arc::new(Snapshot::new())).0,
                authorizer,
                connect_hook,
                next_nonce: AtomicU64::new(1),
                next_version: AtomicU64::new(1),
                shutdown: watch::channel(false).0,
            }),
        }
    }

    /// Replaces the served snapshot; open streams push the difference.
    pub fn update(&self, mut snapshot: Snapshot) {
        snapshot.set_version(self.inner.next_version.fetch_add(1, Ordering::Relaxed));
        self.inner.snapshot.send_replace(Arc::new(snapshot));
    }

    /// The snapshot being served.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.inner.snapshot.borrow().clone()
    }

    /// Number of open streams.
    pub fn streams(&self) -> usize {
        self.inner.snapshot.receiver_count()
    }

    /// Ends every open stream (with `UNAVAILABLE`, so clients reconnect elsewhere) and
    /// refuses new ones. Call before (or with) the gRPC server's shutdown signal.
    pub fn shutdown(&self) {
        self.inner.shutdown.send_replace(true);
    }

    /// The tonic service, ready for `Routes::add_service`.
    pub fn service(&self) -> AggregatedDiscoveryServiceServer<XdsServer> {
        AggregatedDiscoveryServiceServer::new(self.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE)
    }

    fn nonce(&self) -> String {
        self.inner
            .next_nonce
            .fetch_add(1, Ordering::Relaxed)
            .to_string()
    }
}

fn header<'a>(meta: &'a tonic::metadata::MetadataMap, key: &str) -> Option<&'a str> {
    meta.get(key)?.to_str().ok()
}

/// Everything one stream's protocol loop owns.
struct StreamState {
    server: XdsServer,
    inbound: Streaming<DeltaDiscoveryRequest>,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    shutdown: watch::Receiver<bool>,
    current: Arc<Snapshot>,
    session: Session,
    peer: XdsPeer,
    remote: Option<SocketAddr>,
    /// Whether a request with a node has been seen (the hook runs once).
    node_seen: bool,
    /// The hook's guard, dropped with the stream.
    _guard: Option<ConnectionGuard>,
    done: bool,
}

enum Event {
    Request(Box<DeltaDiscoveryRequest>),
    Snapshot,
    Closed,
    Failed(String),
    Shutdown,
}

impl StreamState {
    /// Runs the protocol until there is a response to send or the stream ends.
    async fn next(mut self) -> Option<(Result<DeltaDiscoveryResponse, Status>, Self)> {
        if self.done {
            return None;
        }
        loop {
            let server = &self.server;
            if let Some(resp) = self
                .session
                .next_response(&self.current, &mut || server.nonce())
            {
                tracing::debug!(
                    peer = %self.peer.name,
                    type_url = %resp.type_url,
                    nonce = %resp.nonce,
                    resources = resp.resources.len(),
                    removed = resp.removed_resources.len(),
                    "xDS push"
                );
                return Some((Ok(resp), self));
            }
            let event = tokio::select! {
                biased;
                _ = self.shutdown.wait_for(|s| *s) => Event::Shutdown,
                msg = self.inbound.message() => match msg {
                    Ok(Some(req)) => Event::Request(Box::new(req)),
                    Ok(None) => Event::Closed,
                    Err(status) => Event::Failed(status.to_string()),
                },
                changed = self.snapshots.changed() => match changed {
                    Ok(()) => Event::Snapshot,
                    Err(_) => Event::Shutdown,
                },
            };
            match event {
                Event::Request(req) => {
                    if let Err(status) = self.on_node(&req) {
                        self.done = true;
                        return Some((Err(status), self));
                    }
                    let type_url = req.type_url.clone();
                    let nonce = req.response_nonce.clone();
                    match self.session.handle_request(*req) {
                        Ok(Answer::Nack(message)) => tracing::warn!(
                            peer = %self.peer.name, %type_url, %nonce, error = %message,
                            "xDS client rejected a response (NACK)"
                        ),
                        Ok(Answer::Stale) => tracing::debug!(
                            peer = %self.peer.name, %type_url, %nonce, "answer to an old nonce ignored"
                        ),
                        Ok(Answer::Ack | Answer::None) => {}
                        Err(e) => {
                            self.done = true;
                            return Some((Err(e.into()), self));
                        }
                    }
                }
                Event::Snapshot => {
                    self.current = self.snapshots.borrow_and_update().clone();
                    self.session.snapshot_changed();
                }
                Event::Closed => {
                    tracing::debug!(peer = %self.peer.name, "xDS stream closed by the client");
                    return None;
                }
                Event::Failed(error) => {
                    tracing::debug!(peer = %self.peer.name, %error, "xDS stream broke");
                    return None;
                }
                Event::Shutdown => {
                    self.done = true;
                    return Some((Err(Status::unavailable("xDS server shutting down")), self));
                }
            }
        }
    }
}

impl StreamState {
    /// Runs the connect hook on the first request that carries a node.
    fn on_node(&mut self, req: &DeltaDiscoveryRequest) -> Result<(), Status> {
        let (false, Some(node)) = (self.node_seen, req.node.as_ref()) else {
            return Ok(());
        };
        self.node_seen = true;
        let Some(hook) = self.server.inner.connect_hook.clone() else {
            return Ok(());
        };
        let conn = Connection {
            peer: &self.peer,
            node,
            remote: self.remote,
        };
        match hook.connect(conn) {
            Ok(guard) => {
                self._guard = guard;
                Ok(())
            }
            Err(status) => {
                tracing::warn!(peer = %self.peer.name, node = %node.id, error = %status.message(), "xDS stream refused");
                Err(status)
            }
        }
    }
}

type ResponseStream =
    Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for XdsServer {
    type DeltaAggregatedResourcesStream = ResponseStream;

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<ResponseStream>, Status> {
        if *self.inner.shutdown.borrow() {
            return Err(Status::unavailable("xDS server shutting down"));
        }
        let meta = request.metadata();
        let credentials = Credentials {
            bearer_token: header(meta, "authorization")
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim),
            cluster_id: header(meta, "clusterid"),
            remote: request
                .extensions()
                .get::<PeerInfo>()
                .and_then(|p| p.remote),
        };
        let remote = credentials.remote;
        let Some(peer) = self.inner.authorizer.authenticate(credentials).await else {
            tracing::info!(remote = ?credentials.remote, "xDS stream refused: not authenticated");
            return Err(Status::unauthenticated("missing or unknown bearer token"));
        };
        tracing::debug!(peer = %peer.name, "xDS stream opened");
        let mut snapshots = self.inner.snapshot.subscribe();
        let current = snapshots.borrow_and_update().clone();
        let state = StreamState {
            server: self.clone(),
            inbound: request.into_inner(),
            snapshots,
            shutdown: self.inner.shutdown.subscribe(),
            current,
            session: Session::new(),
            peer,
            remote,
            node_seen: false,
            _guard: None,
            done: false,
        };
        let stream = futures_util::stream::unfold(state, StreamState::next);
        Ok(Response::new(Box::pin(stream)))
    }
}

#[cfg(test)]
mod tests;
