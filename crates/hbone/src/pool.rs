//! HBONE connection pool (spec §3.4): keyed HTTP/2 connections with CONNECT streams
//! multiplexed over them.
//!
//! - Per-connection stream cap = min(`max_streams_per_connection`, the peer's
//!   SETTINGS_MAX_CONCURRENT_STREAMS); a full connection is skipped and another dialled.
//! - `spread_connections_per_key` lets a key use up to that many connections before
//!   multiplexing busy streams onto one: each connection is driven by its own task, so
//!   bulk flows to one peer spread over cores instead of sharing one h2 connection.
//! - Concurrent demand for a key with no usable connection is serialised: one caller
//!   dials, the others wait for its outcome (and share its error).
//! - A connection with no streams for `unused_release_timeout` is released; a connection
//!   whose driver ended (error, GOAWAY, keepalive) is removed.
//!
//! Each connection's driver runs in a task that ends when the connection closes; dropping
//! the pool drops every client handle, so connections close once their streams finish.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use http::HeaderMap;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Notify, watch};

use crate::authority::ConnectTarget;
use crate::client::{ClientError, ConnectResponse, EarlyData, HboneClient};
use crate::settings::H2Settings;
use crate::stream::H2Stream;

/// Pool tuning. Defaults match upstream ztunnel (one connection per key until full).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// Upper bound on streams per connection (`POOL_MAX_STREAMS_PER_CONNECTION`).
    pub max_streams_per_connection: usize,
    /// Idle connections are closed after this long (`POOL_UNUSED_RELEASE_TIMEOUT`).
    pub unused_release_timeout: Duration,
    /// Connections a key may open before a new stream shares an already busy connection.
    /// 1 reproduces upstream; higher values trade connections for parallelism.
    pub spread_connections_per_key: usize,
    /// HTTP/2 settings for dialled connections.
    pub h2: H2Settings,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            max_streams_per_connection: 100,
            unused_release_timeout: Duration::from_secs(300),
            spread_connections_per_key: 1,
            h2: H2Settings::default(),
        }
    }
}

/// Pool failures. Dial failures are shared by every caller that waited for the dial.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("upstream: connecting to the peer failed")]
    Dial(#[source] Arc<dyn StdError + Send + Sync>),
    #[error("upstream: HTTP/2 handshake with the peer failed")]
    Handshake(#[source] Arc<ClientError>),
    #[error(transparent)]
    Connect(#[from] ClientError),
}

#[derive(Debug, Clone)]
enum DialFailure {
    Dial(Arc<dyn StdError + Send + Sync>),
    Handshake(Arc<ClientError>),
}

impl From<DialFailure> for PoolError {
    fn from(f: DialFailure) -> Self {
        match f {
            DialFailure::Dial(e) => PoolError::Dial(e),
            DialFailure::Handshake(e) => PoolError::Handshake(e),
        }
    }
}

type Driver = Pin<Box<dyn Future<Output = Result<(), ClientError>> + Send>>;
type DialFuture = Pin<Box<dyn Future<Output = Result<(HboneClient, Driver), DialFailure>> + Send>>;
type Connector<K> = Box<dyn Fn(K) -> DialFuture + Send + Sync>;
type DialOutcome = Option<Result<(), DialFailure>>;

/// A keyed pool of HBONE connections. Cheap to clone.
pub struct Pool<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for Pool<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<K> std::fmt::Debug for Pool<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

struct Inner<K> {
    config: PoolConfig,
    connector: Connector<K>,
    /// Never held across an await.
    keys: Mutex<HashMap<K, KeyState>>,
    next_id: AtomicU64,
}

struct KeyState {
    conns: Vec<Arc<Conn>>,
    dialing: Option<(u64, watch::Receiver<DialOutcome>)>,
}

struct Conn {
    id: u64,
    client: HboneClient,
    state: Arc<ConnState>,
}

/// Shared between the pool entry, the connection's task and the streams' leases.
#[derive(Debug, Default)]
struct ConnState {
    active: AtomicUsize,
    /// Bumped on every checkout, so the idle timer can tell "idle the whole time".
    checkouts: AtomicU64,
    /// Signalled when `active` drops to zero.
    idle: Notify,
    closed: AtomicBool,
}

/// Holds one stream slot on a pooled connection; released when the stream is dropped.
#[derive(Debug)]
pub(crate) struct Lease {
    state: Arc<ConnState>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.state.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.state.idle.notify_one();
        }
    }
}

enum Next {
    Wait(watch::Receiver<DialOutcome>),
    Dial(u64, watch::Sender<DialOutcome>),
}

impl<K> Pool<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// Creates a pool. `connector` opens the transport (TCP + TLS in ztunnel) for a key.
    pub fn new<F, Fut, IO, E>(config: PoolConfig, connector: F) -> Self
    where
        F: Fn(K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<IO, E>> + Send + 'static,
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        E: Into<Box<dyn StdError + Send + Sync>>,
    {
        let h2 = config.h2.clone();
        let connector: Connector<K> = Box::new(move |key| {
            let dial = connector(key);
            let h2 = h2.clone();
            Box::pin(async move {
                let io = dial
                    .await
                    .map_err(|e| DialFailure::Dial(Arc::from(e.into())))?;
                let (client, driver) = HboneClient::handshake(io, &h2)
                    .await
                    .map_err(|e| DialFailure::Handshake(Arc::new(e)))?;
                Ok((client, Box::pin(driver) as Driver))
            })
        });
        Pool {
            inner: Arc::new(Inner {
                config,
                connector,
                keys: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(0),
            }),
        }
    }

    /// Opens a CONNECT tunnel to `target` over a pooled connection for `key`, dialling
    /// when none has room. A reused connection that turns out to be dead is dropped and
    /// the request retried once on a fresh one.
    pub async fn connect(
        &self,
        key: K,
        target: &ConnectTarget,
        headers: HeaderMap,
    ) -> Result<(ConnectResponse, H2Stream), PoolError> {
        self.connect_early(key, target, headers, &mut EarlyData::none())
            .await
    }

    /// [`connect`](Self::connect), sending `early`'s first bytes with the request (see
    /// [`EarlyData`]); a retry on a fresh connection sends them again.
    pub async fn connect_early<S: AsyncRead + Unpin>(
        &self,
        key: K,
        target: &ConnectTarget,
        headers: HeaderMap,
        early: &mut EarlyData<'_, S>,
    ) -> Result<(ConnectResponse, H2Stream), PoolError> {
        let (conn, lease, fresh) = self.checkout(&key).await?;
        if fresh {
            return Ok(conn
                .client
                .send_connect_leased(target, headers, Some(lease), early)
                .await?);
        }
        match conn
            .client
            .send_connect_leased(target, headers.clone(), Some(lease), early)
            .await
        {
            Err(e) if e.is_connection_level() => {
                tracing::debug!(error = %e, "pooled HBONE connection unusable; dialling again");
                self.inner.remove(&key, conn.id);
                let (conn, lease, _) = self.checkout(&key).await?;
                Ok(conn
                    .client
                    .send_connect_leased(target, headers, Some(lease), early)
                    .await?)
            }
            r => Ok(r?),
        }
    }

    /// Live connections currently pooled for `key`.
    pub fn connection_count(&self, key: &K) -> usize {
        self.inner.lock().get(key).map_or(0, |ks| {
            ks.conns
                .iter()
                .filter(|c| !c.state.closed.load(Ordering::Acquire))
                .count()
        })
    }

    /// Returns a connection with a reserved stream slot, and whether it was just dialled.
    async fn checkout(&self, key: &K) -> Result<(Arc<Conn>, Lease, bool), PoolError> {
        let inner = &self.inner;
        loop {
            let next = {
                let mut keys = inner.lock();
                let ks = keys.entry(key.clone()).or_insert_with(|| KeyState {
                    conns: Vec::new(),
                    dialing: None,
                });
                ks.conns.retain(|c| !c.state.closed.load(Ordering::Acquire));
                let best = ks
                    .conns
                    .iter()
                    .filter(|c| c.state.active.load(Ordering::Acquire) < inner.cap(c))
                    .min_by_key(|c| c.state.active.load(Ordering::Acquire));
                let spread = ks.conns.len() < inner.config.spread_connections_per_key
                    && ks.dialing.is_none()
                    && best.is_some_and(|c| c.state.active.load(Ordering::Acquire) > 0);
                match (best, &ks.dialing) {
                    (Some(c), _) if !spread => return Ok((c.clone(), lease(c), false)),
                    (None, Some((_, rx))) => Next::Wait(rx.clone()),
                    _ => {
                        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
                        let (tx, rx) = watch::channel(None);
                        ks.dialing = Some((id, rx));
                        Next::Dial(id, tx)
                    }
                }
            };
            match next {
                Next::Wait(mut rx) => {
                    // A closed channel means the dialling caller was cancelled: retry, and
                    // one of the waiters becomes the new dialler.
                    if let Ok(outcome) = rx.wait_for(Option::is_some).await
                        && let Some(Err(e)) = &*outcome
                    {
                        return Err(e.clone().into());
                    }
                }
                Next::Dial(id, tx) => return self.dial(key, id, tx).await,
            }
        }
    }

    async fn dial(
        &self,
        key: &K,
        id: u64,
        tx: watch::Sender<DialOutcome>,
    ) -> Result<(Arc<Conn>, Lease, bool), PoolError> {
        // If this future is dropped mid-dial, the guard clears the marker and dropping
        // `tx` wakes the waiters so one of them dials instead.
        let mut guard = DialGuard {
            inner: &self.inner,
            key,
            id,
            armed: true,
        };
        let result = (self.inner.connector)(key.clone()).await;
        // Clearing the marker and publishing the connection happen under one lock, so no
        // other caller can observe "no connection, no dial" in between and dial again.
        let mut keys = self.inner.lock();
        guard.clear(&mut keys);
        guard.armed = false;
        let (client, driver) = match result {
            Ok(ok) => ok,
            Err(e) => {
                drop(keys);
                tx.send_replace(Some(Err(e.clone())));
                return Err(e.into());
            }
        };
        let conn = Arc::new(Conn {
            id,
            client,
            state: Arc::default(),
        });
        let lease = lease(&conn);
        keys.entry(key.clone())
            .or_insert_with(|| KeyState {
                conns: Vec::new(),
                dialing: None,
            })
            .conns
            .push(conn.clone());
        drop(keys);
        tokio::spawn(run_connection(
            driver,
            conn.state.clone(),
            Arc::downgrade(&self.inner),
            key.clone(),
            id,
        ));
        tx.send_replace(Some(Ok(())));
        Ok((conn, lease, true))
    }
}

/// Reserves a slot; called with the key map locked so the idle reaper cannot race it.
fn lease(conn: &Conn) -> Lease {
    conn.state.active.fetch_add(1, Ordering::AcqRel);
    conn.state.checkouts.fetch_add(1, Ordering::AcqRel);
    Lease {
        state: conn.state.clone(),
    }
}

impl<K: Hash + Eq> Inner<K> {
    fn lock(&self) -> MutexGuard<'_, HashMap<K, KeyState>> {
        // A panic while holding the lock leaves the map consistent (no multi-step
        // invariants span a panic point), so poisoning is ignored.
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cap(&self, conn: &Conn) -> usize {
        self.config
            .max_streams_per_connection
            .min(conn.client.peer_max_concurrent_streams())
            .max(1)
    }

    fn remove(&self, key: &K, id: u64) {
        remove_locked(&mut self.lock(), key, id);
    }

    /// Removes the connection if nothing used it since `seen_checkouts`. Checkouts happen
    /// under the same lock, so check and removal cannot race one.
    fn evict_if_idle(&self, key: &K, id: u64, state: &ConnState, seen_checkouts: u64) -> bool {
        let mut keys = self.lock();
        let idle = state.active.load(Ordering::Acquire) == 0
            && state.checkouts.load(Ordering::Acquire) == seen_checkouts;
        if idle {
            remove_locked(&mut keys, key, id);
        }
        idle
    }
}

fn remove_locked<K: Hash + Eq>(keys: &mut HashMap<K, KeyState>, key: &K, id: u64) {
    let Some(ks) = keys.get_mut(key) else { return };
    ks.conns.retain(|c| {
        if c.id == id {
            c.state.closed.store(true, Ordering::Release);
        }
        c.id != id
    });
    if ks.conns.is_empty() && ks.dialing.is_none() {
        keys.remove(key);
    }
}

struct DialGuard<'a, K: Hash + Eq> {
    inner: &'a Inner<K>,
    key: &'a K,
    id: u64,
    /// Cleared once the dial finished and the marker was removed under the caller's lock.
    armed: bool,
}

impl<K: Hash + Eq> DialGuard<'_, K> {
    fn clear(&self, keys: &mut HashMap<K, KeyState>) {
        if let Some(ks) = keys.get_mut(self.key)
            && ks.dialing.as_ref().is_some_and(|(id, _)| *id == self.id)
        {
            ks.dialing = None;
        }
    }
}

impl<K: Hash + Eq> Drop for DialGuard<'_, K> {
    fn drop(&mut self) {
        if self.armed {
            let mut keys = self.inner.lock();
            self.clear(&mut keys);
        }
    }
}

/// Drives one pooled connection and releases it when idle for too long.
async fn run_connection<K: Hash + Eq>(
    driver: Driver,
    state: Arc<ConnState>,
    pool: Weak<Inner<K>>,
    key: K,
    id: u64,
) {
    let mut driver = driver;
    let timeout = match pool.upgrade() {
        Some(p) => p.config.unused_release_timeout,
        None => return,
    };
    let idle = async {
        loop {
            while state.active.load(Ordering::Acquire) > 0 {
                state.idle.notified().await;
            }
            let seen = state.checkouts.load(Ordering::Acquire);
            tokio::time::sleep(timeout).await;
            match pool.upgrade() {
                Some(p) if p.evict_if_idle(&key, id, &state, seen) => return,
                Some(_) => {}
                // The pool is gone, so is our client handle: the driver ends by itself.
                None => return std::future::pending().await,
            }
        }
    };
    let evicted = tokio::select! {
        r = &mut driver => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "pooled HBONE connection ended");
            }
            false
        }
        () = idle => true,
    };
    if evicted {
        // The pool entry held the last client handle; with no streams left, h2 closes the
        // connection cleanly once its driver is polled to completion.
        tracing::debug!("releasing idle pooled HBONE connection");
        let _ = driver.await;
    }
    state.closed.store(true, Ordering::Release);
    if let Some(p) = pool.upgrade() {
        p.remove(&key, id);
    }
}
