//! The ZDS server (`spec/cni.md` §4, `spec/ztunnel.md` §2, `spec/windows.md` §2): the agent
//! listens (a `SOCK_SEQPACKET` socket on Linux, a named pipe on Windows), ztunnels connect,
//! and each one gets the snapshot of enrolled pods (an `Add` per pod with its namespace,
//! `Keep` for pods whose namespace is unknown, then `SnapshotSent`) followed by a serialised
//! stream of `Add`/`Del` updates.
//!
//! Ownership: [`ZdsServer`] holds the snapshot cache (pod UID → workload info and netns fd;
//! the fds stay open while the pod is enrolled) and the list of live connections, oldest
//! first. [`ZdsServer::serve`] owns the accept loop and every connection task in a
//! [`JoinSet`]; they all stop when the shutdown signal fires.
//!
//! Routing: [`ZdsServer::add`] goes to the newest live connection and falls back to older
//! ones when a connection is gone; [`ZdsServer::del`] goes to every connection and joins the
//! errors. Each connection has one request in flight at a time and a bounded queue behind it
//! that is drained only after its snapshot, so a ztunnel never sees `Keep` after
//! `SnapshotSent`.
//!
//! Liveness (deviation, stricter than upstream's 5 s idle probe): an idle connection is
//! watched for readability all the time; EOF closes it at once and unsolicited data is a
//! protocol error that closes it. The classification is upstream's, only detection is
//! immediate instead of after up to 5 s.
//!
//! The transport is `ambit_netns::zds` and the framing `ambit_contract::zds`, the same
//! code ztunnel's client uses; how a pod's namespace travels is [`crate::platform`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ambit_contract::zds::{
    self as wire, Answer, AnswerError, EmptyUid, MAX_MESSAGE, PodUid, TooLarge, WorkloadInfo,
};
use ambit_netns::zds::{Attach, Conn, Listener, TransportError};
use ambit_proto::zds::Version;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until, timeout};

use crate::platform::{self, PodNamespace};

/// Errors of the ZDS server and of requests sent through it.
#[derive(Debug, thiserror::Error)]
pub enum ZdsError {
    /// Creating the socket's directory failed.
    #[error("binding ZDS socket {path}: {source}")]
    Dir {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Binding the listening socket failed.
    #[error("binding ZDS socket {path}: {source}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The socket error.
        source: TransportError,
    },
    /// No ztunnel is connected (an `Add` cannot be delivered).
    #[error("no ztunnel connection")]
    NoConnection,
    /// ztunnel answered with a non-empty `Ack.error`.
    #[error("ztunnel NACK: {0}")]
    Nack(String),
    /// The connection's queue is full.
    #[error("ZDS connection queue is full")]
    QueueFull,
    /// Writing or waiting for the answer took too long.
    #[error("timed out {0}")]
    Timeout(&'static str),
    /// The connection closed before the request was answered.
    #[error("ztunnel connection closed")]
    ConnectionClosed,
    /// The encoded message would not fit ztunnel's 1024-byte receive buffer.
    #[error("encoded ZDS message is {0} bytes, must be < {MAX_MESSAGE}")]
    TooLarge(usize),
    /// An `Add` for a pod whose netns is unknown.
    #[error("pod {0} has no network namespace to send")]
    NoNetns(PodUid),
    /// A pod without a uid cannot be named on ZDS.
    #[error(transparent)]
    Uid(#[from] EmptyUid),
    /// A socket error.
    #[error("ZDS socket {what}: {source}")]
    Io {
        /// What we were doing.
        what: &'static str,
        /// The socket error.
        source: TransportError,
    },
    /// The peer sent something ZDS does not allow.
    #[error("ZDS protocol error: {0}")]
    Protocol(#[from] ProtocolError),
    /// Several connections failed (a `Del` fan-out).
    #[error("{}", join_errors(.0))]
    Multiple(Vec<ZdsError>),
}

/// What ztunnel sent that ZDS does not allow.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// An undecodable hello or answer.
    #[error(transparent)]
    Answer(#[from] AnswerError),
    /// A descriptor with an answer.
    #[error("ztunnel sent a file descriptor")]
    Fd,
    /// Data while no request was outstanding.
    #[error("unsolicited {0} byte message from ztunnel")]
    Unsolicited(usize),
}

impl From<TooLarge> for ZdsError {
    fn from(TooLarge(n): TooLarge) -> Self {
        Self::TooLarge(n)
    }
}

fn join_errors(errs: &[ZdsError]) -> String {
    errs.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Timeouts and limits (upstream values by default).
#[derive(Debug, Clone)]
pub struct ZdsConfig {
    /// How long a new connection may take to send `ZdsHello`.
    pub hello_timeout: Duration,
    /// Write deadline and ack deadline of each request.
    pub request_timeout: Duration,
    /// Minimum spacing of accepted connections (5/s, burst 1).
    pub accept_interval: Duration,
    /// Queue length per connection.
    pub queue: usize,
}

impl Default for ZdsConfig {
    fn default() -> Self {
        Self {
            hello_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            accept_interval: Duration::from_millis(200),
            queue: 100,
        }
    }
}

/// One enrolled pod as ZDS knows it.
#[derive(Debug, Clone)]
pub struct ZdsPod {
    /// Kubernetes pod UID.
    pub uid: PodUid,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// `spec.serviceAccountName`.
    pub service_account: String,
    /// The pod's namespace; `None` (restart discovery found none) makes the snapshot send
    /// `Keep`.
    pub netns: Option<PodNamespace>,
}

impl ZdsPod {
    fn info(&self) -> WorkloadInfo {
        WorkloadInfo {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            service_account: self.service_account.clone(),
            windows_namespace: None,
        }
    }
}

#[derive(Debug)]
enum Request {
    Add(ZdsPod),
    Del(PodUid),
    Keep(PodUid),
    SnapshotSent,
}

#[derive(Debug)]
struct Job {
    req: Request,
    reply: oneshot::Sender<Result<(), ZdsError>>,
}

#[derive(Debug)]
struct ConnHandle {
    id: u64,
    tx: mpsc::Sender<Job>,
}

#[derive(Debug, Default)]
struct State {
    pods: BTreeMap<PodUid, ZdsPod>,
    conns: Vec<ConnHandle>,
    next_id: u64,
}

#[derive(Debug)]
struct Inner {
    cfg: ZdsConfig,
    state: Mutex<State>,
    snapshots: watch::Sender<u64>,
    gauge: Option<Gauge>,
}

/// The ZDS server; cheap to clone (all clones share one state).
#[derive(Debug, Clone)]
pub struct ZdsServer {
    inner: Arc<Inner>,
}

impl ZdsServer {
    /// A server with an empty cache; `gauge` (metric `ztunnel_connected`) tracks the number
    /// of connections.
    pub fn new(cfg: ZdsConfig, gauge: Option<Gauge>) -> Self {
        Self {
            inner: Arc::new(Inner {
                cfg,
                state: Mutex::new(State::default()),
                snapshots: watch::channel(0).0,
                gauge,
            }),
        }
    }

    /// Binds the socket (removing a stale file first; the parent directory is created with
    /// mode 0700 when missing) or, on Windows, creates the pipe. Connections queue until
    /// [`Self::serve`].
    pub fn bind(path: &Path) -> Result<Listener, ZdsError> {
        platform::prepare_listen_path(path).map_err(|source| ZdsError::Dir {
            path: path.to_owned(),
            source,
        })?;
        Listener::bind(path).map_err(|source| ZdsError::Bind {
            path: path.to_owned(),
            source,
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means another thread panicked mid-update of plain maps;
        // the data is still consistent enough to keep serving.
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Number of live connections.
    pub fn connected(&self) -> usize {
        self.state().conns.len()
    }

    /// Counts completed snapshots; changes whenever a ztunnel (re)connected and received
    /// the full state (the agent re-verifies pods then).
    pub fn snapshots(&self) -> watch::Receiver<u64> {
        self.inner.snapshots.subscribe()
    }

    /// Records a pod in the snapshot cache without sending anything (restart discovery).
    pub fn remember(&self, pod: ZdsPod) {
        self.state().pods.insert(pod.uid.clone(), pod);
    }

    /// UIDs in the snapshot cache.
    pub fn cached(&self) -> Vec<PodUid> {
        self.state().pods.keys().cloned().collect()
    }

    /// Caches the pod and sends `Add` + netns fd to the newest live connection, waiting for
    /// its ack. The pod stays cached on failure, so the next snapshot carries it.
    pub async fn add(&self, pod: ZdsPod) -> Result<(), ZdsError> {
        if pod.netns.is_none() {
            return Err(ZdsError::NoNetns(pod.uid));
        }
        let targets: Vec<mpsc::Sender<Job>> = {
            let mut st = self.state();
            st.pods.insert(pod.uid.clone(), pod.clone());
            st.conns.iter().rev().map(|c| c.tx.clone()).collect()
        };
        let mut last = ZdsError::NoConnection;
        for tx in targets {
            match submit(&tx, Request::Add(pod.clone())).await {
                Err(ZdsError::ConnectionClosed) => last = ZdsError::ConnectionClosed,
                other => return other,
            }
        }
        Err(last)
    }

    /// Forgets the pod and sends `Del` to every connection; zero connections is success.
    pub async fn del(&self, uid: &str) -> Result<(), ZdsError> {
        let uid = PodUid::new(uid)?;
        let targets: Vec<mpsc::Sender<Job>> = {
            let mut st = self.state();
            st.pods.remove(&uid);
            st.conns.iter().map(|c| c.tx.clone()).collect()
        };
        let mut errs = Vec::new();
        for tx in targets {
            match submit(&tx, Request::Del(uid.clone())).await {
                // A connection that went away no longer holds the pod.
                Ok(()) | Err(ZdsError::ConnectionClosed) => {}
                Err(e) => errs.push(e),
            }
        }
        match errs.len() {
            0 => Ok(()),
            1 => Err(errs.remove(0)),
            _ => Err(ZdsError::Multiple(errs)),
        }
    }

    /// Accepts ztunnels (at most one per `accept_interval`) until `shutdown` turns true;
    /// then every connection task is stopped.
    pub async fn serve(&self, listener: Listener, mut shutdown: watch::Receiver<bool>) {
        let mut conns = JoinSet::new();
        let mut next = Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.wait_for(|s| *s) => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => continue,
                _ = sleep_until(next) => {}
            }
            tokio::select! {
                _ = shutdown.wait_for(|s| *s) => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                accepted = listener.accept() => match accepted {
                    Ok(conn) => {
                        next = Instant::now() + self.inner.cfg.accept_interval;
                        let server = self.clone();
                        conns.spawn(async move { server.run_conn(conn).await });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "ZDS accept failed");
                        next = Instant::now() + self.inner.cfg.accept_interval;
                    }
                },
            }
        }
        conns.shutdown().await;
        self.state().conns.clear();
        self.update_gauge();
    }

    fn update_gauge(&self) {
        if let Some(g) = &self.inner.gauge {
            g.set(i64::try_from(self.connected()).unwrap_or(i64::MAX));
        }
    }

    async fn run_conn(&self, conn: Conn) {
        let (tx, rx) = mpsc::channel(self.inner.cfg.queue);
        // Registering and taking the snapshot under one lock means a concurrent `add`
        // either is in the snapshot or is queued behind it: never lost.
        let (id, snapshot) = {
            let mut st = self.state();
            st.next_id += 1;
            let id = st.next_id;
            st.conns.push(ConnHandle { id, tx });
            (id, st.pods.values().cloned().collect::<Vec<_>>())
        };
        self.update_gauge();
        let result = self.converse(&conn, snapshot, rx).await;
        match &result {
            Ok(()) => tracing::info!(conn = id, "ztunnel disconnected"),
            Err(e) => tracing::warn!(conn = id, error = %e, "ztunnel connection ended"),
        }
        self.state().conns.retain(|c| c.id != id);
        self.update_gauge();
    }

    async fn converse(
        &self,
        conn: &Conn,
        snapshot: Vec<ZdsPod>,
        mut rx: mpsc::Receiver<Job>,
    ) -> Result<(), ZdsError> {
        let cfg = &self.inner.cfg;
        let mut buf = [0u8; MAX_MESSAGE];
        let (n, _) = timeout(cfg.hello_timeout, conn.recv_with_fd(&mut buf))
            .await
            .map_err(|_| ZdsError::Timeout("waiting for ZdsHello"))?
            .map_err(|source| ZdsError::Io {
                what: "reading ZdsHello",
                source,
            })?;
        if n == 0 {
            return Err(ZdsError::ConnectionClosed);
        }
        let version = wire::decode_hello(&buf[..n]).map_err(ProtocolError::from)?;
        tracing::info!(version = ?Version::try_from(version), "ztunnel connected");

        for pod in &snapshot {
            let req = match &pod.netns {
                Some(_) => Request::Add(pod.clone()),
                None => Request::Keep(pod.uid.clone()),
            };
            match self.exchange(conn, &req).await {
                Ok(()) => {}
                // Upstream logs snapshot NACKs and goes on: ztunnel retries the pod itself.
                Err(ZdsError::Nack(e)) => {
                    tracing::warn!(uid = %pod.uid, error = %e, "ztunnel NACKed snapshot entry");
                }
                Err(e) => return Err(e),
            }
        }
        self.exchange(conn, &Request::SnapshotSent).await?;
        self.inner.snapshots.send_modify(|n| *n += 1);

        loop {
            tokio::select! {
                job = rx.recv() => {
                    let Some(job) = job else { return Ok(()) };
                    let result = self.exchange(conn, &job.req).await;
                    let fatal = matches!(
                        result,
                        Err(ZdsError::ConnectionClosed | ZdsError::Io { .. })
                    );
                    let _ = job.reply.send(result);
                    if fatal {
                        return Err(ZdsError::ConnectionClosed);
                    }
                }
                // Cancel-safe: nothing is consumed unless a datagram arrives.
                got = conn.recv_with_fd(&mut buf) => {
                    let (n, _) = got.map_err(|source| ZdsError::Io {
                        what: "reading while idle",
                        source,
                    })?;
                    if n == 0 {
                        return Ok(());
                    }
                    return Err(ProtocolError::Unsolicited(n).into());
                }
            }
        }
    }

    /// Sends one request and waits for its ack.
    async fn exchange(&self, conn: &Conn, req: &Request) -> Result<(), ZdsError> {
        let cfg = &self.inner.cfg;
        let msg: wire::Request<Option<Attach<'_>>> = match req {
            Request::Add(pod) => {
                let netns = pod
                    .netns
                    .as_ref()
                    .ok_or_else(|| ZdsError::NoNetns(pod.uid.clone()))?;
                let mut info = pod.info();
                let attached = platform::attach(netns, &mut info);
                wire::Request::Add {
                    uid: pod.uid.clone(),
                    info,
                    netns: attached,
                }
            }
            Request::Del(uid) => wire::Request::Del { uid: uid.clone() },
            Request::Keep(uid) => wire::Request::Keep { uid: uid.clone() },
            Request::SnapshotSent => wire::Request::SnapshotSent,
        };
        let bytes = msg.encode()?;
        let fds: Vec<Attach<'_>> = msg.netns().copied().flatten().into_iter().collect();
        match timeout(cfg.request_timeout, conn.send_with_fds(&bytes, &fds)).await {
            Err(_) => return Err(ZdsError::Timeout("writing to ztunnel")),
            Ok(Err(e)) if e.is_disconnect() => return Err(ZdsError::ConnectionClosed),
            Ok(Err(source)) => {
                return Err(ZdsError::Io {
                    what: "writing",
                    source,
                });
            }
            Ok(Ok(())) => {}
        }
        let mut buf = [0u8; MAX_MESSAGE];
        let (n, fd) = match timeout(cfg.request_timeout, conn.recv_with_fd(&mut buf)).await {
            Err(_) => return Err(ZdsError::Timeout("waiting for ztunnel's ack")),
            Ok(Err(e)) if e.is_disconnect() => return Err(ZdsError::ConnectionClosed),
            Ok(Err(source)) => {
                return Err(ZdsError::Io {
                    what: "reading ack",
                    source,
                });
            }
            Ok(Ok(got)) => got,
        };
        if n == 0 {
            return Err(ZdsError::ConnectionClosed);
        }
        if fd.is_some() {
            return Err(ProtocolError::Fd.into());
        }
        match wire::decode_answer(&buf[..n]).map_err(ProtocolError::from)? {
            Answer::Ack => Ok(()),
            Answer::Nack(e) => Err(ZdsError::Nack(e)),
        }
    }
}

async fn submit(tx: &mpsc::Sender<Job>, req: Request) -> Result<(), ZdsError> {
    let (reply, rx) = oneshot::channel();
    match tx.try_send(Job { req, reply }) {
        Ok(()) => {}
        Err(mpsc::error::TrySendError::Full(_)) => return Err(ZdsError::QueueFull),
        Err(mpsc::error::TrySendError::Closed(_)) => return Err(ZdsError::ConnectionClosed),
    }
    rx.await.unwrap_or(Err(ZdsError::ConnectionClosed))
}
