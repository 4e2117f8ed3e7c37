//! The HTTP client: HTTP/2 when the server offers it over TLS, else HTTP/1.1; connections are
//! reused (the one HTTP/2 connection carries every request and watch; up to
//! [`MAX_IDLE_H1`] idle HTTP/1.1 connections are kept, a watch holds its own); a request that
//! fails on a reused connection before any answer is retried once on a new one. Bearer-token,
//! client-certificate and `exec`-plugin auth (a token that the server refuses with 401 is
//! fetched again and the request retried once), bounded bodies, paged lists, and the verbs
//! ambit needs:
//! [`Client::list`], [`Client::watch`], [`Client::get`], [`Client::merge_patch`] and
//! [`Client::create`].
//!

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ambit_tls::pki_types::ServerName;
use ambit_tls::tokio_rustls::TlsConnector;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::config::{Auth, ConfigError, KubeConfig, Scheme, ServerUrl};
use crate::exec::ExecCredential;
use crate::watch::WatchStream;

/// Idle HTTP/1.1 connections kept for reuse.
pub const MAX_IDLE_H1: usize = 4;
/// Most pages one list may take.
const MAX_PAGES: usize = 10_000;

/// The content type of a JSON merge patch (RFC 7386).
pub const MERGE_PATCH: &str = "application/merge-patch+json";

/// A failed request. Every variant names what failed; none carries a catch-all string.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("connecting to the API server {server}")]
    Connect {
        server: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS handshake with the API server {server}")]
    Tls {
        server: String,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP exchange with the API server")]
    Http(#[source] hyper::Error),
    #[error("{what} timed out after {after:?}")]
    Timeout { what: &'static str, after: Duration },
    #[error("reading the bearer token {path}")]
    Token {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid request {0:?}")]
    InvalidRequest(String),
    #[error("API server answered {status} to {method} {path}: {reason}: {message}")]
    Status {
        method: Method,
        path: String,
        status: u16,
        reason: String,
        message: String,
    },
    /// 410 Gone (as a status or a watch `ERROR` event): the resource version is too old;
    /// list again.
    #[error("resource version expired (410 Gone): {message}")]
    Gone { message: String },
    #[error("API server sent invalid JSON in {what}")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("API server sent an unexpected {what}: {reason}")]
    Shape { what: &'static str, reason: String },
    #[error("API server sent a {what} larger than {limit} bytes")]
    TooLarge { what: &'static str, limit: usize },
    #[error("watch stream silent for {0:?}")]
    Idle(Duration),
    #[error("getting a token from the credential plugin")]
    Exec(#[from] crate::exec::ExecError),
}

impl Error {
    /// The HTTP status of a [`Error::Status`] / [`Error::Gone`] answer.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Status { status, .. } => Some(*status),
            Error::Gone { .. } => Some(410),
            _ => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }
}

/// Size and time bounds.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest list / object / error body.
    pub max_body: usize,
    /// Largest single watch event line.
    pub max_line: usize,
    pub connect_timeout: Duration,
    /// Whole non-watch request, body included.
    pub request_timeout: Duration,
    /// `timeoutSeconds` asked of the server for a watch.
    pub watch_timeout: Duration,
    /// A watch that sends nothing for this long is considered dead (bookmarks and the
    /// server-side timeout keep a healthy one talking).
    pub watch_idle: Duration,
    /// How long a token read from a file is used before it is read again.
    pub token_refresh: Duration,
    /// Items asked for per list page (`limit`).
    pub page_size: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body: 256 << 20,
            max_line: 16 << 20,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            watch_timeout: Duration::from_secs(290),
            watch_idle: Duration::from_secs(350),
            token_refresh: Duration::from_secs(60),
            page_size: 500,
        }
    }
}

/// The result of a list: the items (as the server sent them) and the list's
/// `metadata.resourceVersion` to watch from.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectList {
    pub items: Vec<Value>,
    pub resource_version: String,
}

/// A Kubernetes API client. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    server: ServerUrl,
    tls: Option<(TlsConnector, ServerName<'static>)>,
    auth: Auth,
    token_cache: Mutex<Option<(Instant, String)>>,
    /// The plugin's credential; the async lock makes concurrent callers wait for one run.
    exec_cache: tokio::sync::Mutex<Option<ExecCredential>>,
    pool: Mutex<Pool>,
    limits: Limits,
}

/// Connections kept for reuse.
#[derive(Default)]
struct Pool {
    h2: Option<hyper::client::conn::http2::SendRequest<Full<Bytes>>>,
    h1: Vec<hyper::client::conn::http1::SendRequest<Full<Bytes>>>,
    /// Connections opened so far (for tests and logs).
    opened: u64,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("server", &self.inner.server.to_string())
            .field("auth", &self.inner.auth)
            .finish_non_exhaustive()
    }
}

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

/// A sender and whether it came from the pool.
struct Conn {
    sender: Sender,
    reused: bool,
}

impl Client {
    pub fn new(config: KubeConfig) -> Result<Self, ConfigError> {
        let tls = match config.server.scheme {
            Scheme::Http => None,
            Scheme::Https => {
                let ca = config.ca_pem.as_deref().ok_or_else(|| ConfigError::NoCa {
                    url: config.server.to_string(),
                })?;
                let alt = config.tls_server_name.as_deref();
                let mut tls = match &config.client_identity {
                    None => ambit_tls::client_config_for_root(ca, alt),
                    Some(id) => {
                        let identity =
                            ambit_tls::ServerCertificate::from_pem(&id.cert_pem, &id.key_pem)
                                .map_err(ConfigError::ClientCertificate)?;
                        ambit_tls::client_config_with_identity(ca, alt, &identity)
                    }
                }
                .map_err(ConfigError::Tls)?;
                tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
                let name = ServerName::try_from(config.server.host.clone()).map_err(|_| {
                    ConfigError::Url {
                        url: config.server.to_string(),
                        reason: "the host is not a valid DNS name or IP address",
                    }
                })?;
                Some((TlsConnector::from(Arc::new(tls)), name))
            }
        };
        Ok(Self {
            inner: Arc::new(Inner {
                server: config.server,
                tls,
                auth: config.auth,
                token_cache: Mutex::new(None),
                exec_cache: tokio::sync::Mutex::new(None),
                pool: Mutex::new(Pool::default()),
                limits: Limits::default(),
            }),
        })
    }

    /// The same client with other [`Limits`].
    pub fn with_limits(self, limits: Limits) -> Self {
        let old = &self.inner;
        Self {
            inner: Arc::new(Inner {
                server: old.server.clone(),
                tls: old.tls.clone(),
                auth: old.auth.clone(),
                token_cache: Mutex::new(None),
                exec_cache: tokio::sync::Mutex::new(None),
                pool: Mutex::new(Pool::default()),
                limits,
            }),
        }
    }

    pub fn server(&self) -> &ServerUrl {
        &self.inner.server
    }

    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// How many connections this client has opened (reuse keeps it low).
    pub fn connections_opened(&self) -> u64 {
        self.lock_pool().opened
    }

    fn lock_pool(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.inner
            .pool
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `GET path[?fieldSelector=…]`: every item and the list's resource version, page by
    /// page ([`Limits::page_size`] items each, following `metadata.continue`). A continue
    /// token the server no longer accepts comes back as [`Error::Gone`]: list again.
    pub async fn list(
        &self,
        path: &str,
        field_selector: Option<&str>,
    ) -> Result<ObjectList, Error> {
        self.list_selected(path, field_selector, None).await
    }

    /// [`Client::list`] with a `labelSelector` too.
    pub async fn list_selected(
        &self,
        path: &str,
        field_selector: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<ObjectList, Error> {
        #[derive(Deserialize)]
        struct ListMeta {
            #[serde(default, rename = "resourceVersion")]
            resource_version: Option<String>,
            #[serde(default, rename = "continue")]
            next: Option<String>,
        }
        #[derive(Deserialize)]
        struct List {
            #[serde(default)]
            metadata: Option<ListMeta>,
            items: Option<Vec<Value>>,
        }
        let page_size = self.inner.limits.page_size.to_string();
        let mut items = Vec::new();
        let mut next: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let query = Query::new()
                .opt("fieldSelector", field_selector)
                .opt("labelSelector", label_selector)
                .add("limit", &page_size)
                .opt("continue", next.as_deref());
            let body = self.call(Method::GET, path, &query, None).await?;
            let list: List = serde_json::from_slice(&body).map_err(|source| Error::Json {
                what: "a list",
                source,
            })?;
            let page = list.items.unwrap_or_default();
            if let Some(bad) = page.iter().find(|i| !i.is_object()) {
                return Err(Error::Shape {
                    what: "list item",
                    reason: format!("expected an object, found {bad}"),
                });
            }
            items.extend(page);
            let meta = list.metadata;
            next = meta
                .as_ref()
                .and_then(|m| m.next.clone())
                .filter(|c| !c.is_empty());
            if next.is_none() {
                let resource_version = meta
                    .and_then(|m| m.resource_version)
                    .filter(|rv| !rv.is_empty())
                    .ok_or_else(|| Error::Shape {
                        what: "list",
                        reason: "no metadata.resourceVersion".into(),
                    })?;
                return Ok(ObjectList {
                    items,
                    resource_version,
                });
            }
        }
        Err(Error::TooLarge {
            what: "list (pages)",
            limit: MAX_PAGES,
        })
    }

    /// `GET path` of one object.
    pub async fn get(&self, path: &str) -> Result<Value, Error> {
        let body = self.call(Method::GET, path, &Query::new(), None).await?;
        serde_json::from_slice(&body).map_err(|source| Error::Json {
            what: "an object",
            source,
        })
    }

    /// `PATCH path` with a JSON merge patch; returns the patched object.
    pub async fn merge_patch(&self, path: &str, patch: &Value) -> Result<Value, Error> {
        let body = Bytes::from(patch.to_string());
        let body = self
            .call(
                Method::PATCH,
                path,
                &Query::new(),
                Some((MERGE_PATCH, body)),
            )
            .await?;
        serde_json::from_slice(&body).map_err(|source| Error::Json {
            what: "a patched object",
            source,
        })
    }

    /// `POST path` with a JSON object (a create, e.g. a `TokenReview`); returns what the
    /// server answered.
    pub async fn create(&self, path: &str, object: &Value) -> Result<Value, Error> {
        let body = Bytes::from(object.to_string());
        let body = self
            .call(
                Method::POST,
                path,
                &Query::new(),
                Some(("application/json", body)),
            )
            .await?;
        serde_json::from_slice(&body).map_err(|source| Error::Json {
            what: "a created object",
            source,
        })
    }

    /// `POST path?query` without a body, answered with anything (an action through the pod
    /// proxy, e.g. ztunnel's `/logging`); the answer's bytes.
    pub async fn post_action(
        &self,
        path: &str,
        query: &[(&'static str, &str)],
    ) -> Result<Vec<u8>, Error> {
        let q = query
            .iter()
            .fold(Query::new(), |q, (key, value)| q.add(key, value));
        Ok(self.call(Method::POST, path, &q, None).await?.to_vec())
    }

    /// `GET path?watch=true&resourceVersion=…`: the events after `resource_version`, with
    /// bookmarks, until the server ends the stream (after [`Limits::watch_timeout`]).
    pub async fn watch(
        &self,
        path: &str,
        resource_version: &str,
        field_selector: Option<&str>,
    ) -> Result<WatchStream, Error> {
        let limits = &self.inner.limits;
        let query = Query::new()
            .opt("fieldSelector", field_selector)
            .add("watch", "true")
            .add("allowWatchBookmarks", "true")
            .add("resourceVersion", resource_version)
            .add(
                "timeoutSeconds",
                &limits.watch_timeout.as_secs().to_string(),
            );
        let open = self.exchange(Method::GET, path, &query, None);
        let (response, _conn) = tokio::time::timeout(limits.request_timeout, open)
            .await
            .map_err(|_| Error::Timeout {
                what: "opening a watch",
                after: limits.request_timeout,
            })??;
        // The connection stays with the stream (HTTP/1.1) or is shared (HTTP/2).
        Ok(WatchStream::new(
            response.into_body(),
            limits.max_line,
            limits.watch_idle,
        ))
    }

    /// A non-watch request: status checked, body read (bounded) within the request timeout;
    /// the connection goes back to the pool afterwards.
    async fn call(
        &self,
        method: Method,
        path: &str,
        query: &Query,
        body: Option<(&'static str, Bytes)>,
    ) -> Result<Bytes, Error> {
        let after = self.inner.limits.request_timeout;
        let exchange = async {
            let (response, conn) = self.exchange(method, path, query, body).await?;
            let bytes = read_body(
                response.into_body(),
                self.inner.limits.max_body,
                "response body",
            )
            .await?;
            self.release(conn);
            Ok(bytes)
        };
        tokio::time::timeout(after, exchange)
            .await
            .map_err(|_| Error::Timeout {
                what: "API request",
                after,
            })?
    }

    /// Sends a request and checks its status: retried once on a new connection when a reused
    /// one fails before answering, and once with a fresh token after a 401.
    async fn exchange(
        &self,
        method: Method,
        path: &str,
        query: &Query,
        body: Option<(&'static str, Bytes)>,
    ) -> Result<(Response<Incoming>, Conn), Error> {
        let mut refreshed = false;
        let mut fresh_connection = false;
        loop {
            let mut conn = self.conn(fresh_connection).await?;
            let sent = self
                .send(&mut conn.sender, method.clone(), path, query, body.clone())
                .await;
            let response = match sent {
                Ok(r) => r,
                Err(Error::Http(_)) if conn.reused && !fresh_connection => {
                    fresh_connection = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if response.status() == StatusCode::UNAUTHORIZED && !refreshed && self.refreshable() {
                refreshed = true;
                self.forget_token().await;
                continue;
            }
            return Ok((self.check(method, path, response).await?, conn));
        }
    }

    /// Maps a non-2xx answer to an error, reading the `Status` object it carries.
    async fn check(
        &self,
        method: Method,
        path: &str,
        response: Response<Incoming>,
    ) -> Result<Response<Incoming>, Error> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = read_body(response.into_body(), 64 << 10, "error body")
            .await
            .unwrap_or_default();
        let parsed: Option<StatusObject> = serde_json::from_slice(&body).ok();
        let (reason, message) = match parsed {
            Some(s) => (s.reason, s.message),
            None => (
                status.canonical_reason().unwrap_or("").to_string(),
                String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
            ),
        };
        if status == StatusCode::GONE {
            return Err(Error::Gone { message });
        }
        Err(Error::Status {
            method,
            path: path.to_string(),
            status: status.as_u16(),
            reason,
            message,
        })
    }

    async fn send(
        &self,
        sender: &mut Sender,
        method: Method,
        path: &str,
        query: &Query,
        body: Option<(&'static str, Bytes)>,
    ) -> Result<Response<Incoming>, Error> {
        if !path.starts_with('/') || path.contains(['?', '#', ' ']) {
            return Err(Error::InvalidRequest(path.to_string()));
        }
        let server = &self.inner.server;
        let path_and_query = format!("{}{path}{}", server.base_path, query.render());
        let uri = match sender {
            Sender::H1(_) => path_and_query,
            Sender::H2(_) => {
                let scheme = if self.inner.tls.is_some() {
                    "https"
                } else {
                    "http"
                };
                format!("{scheme}://{}{path_and_query}", server.authority())
            }
        };
        let mut request = Request::builder()
            .method(method)
            .uri(&uri)
            .header(header::ACCEPT, "application/json")
            .header(
                header::USER_AGENT,
                concat!("ambit/", env!("CARGO_PKG_VERSION")),
            );
        if let Sender::H1(_) = sender {
            request = request.header(header::HOST, server.authority());
        }
        if let Some(token) = self.token().await? {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let body = match body {
            Some((content_type, bytes)) => {
                request = request.header(header::CONTENT_TYPE, content_type);
                Full::new(bytes)
            }
            None => Full::new(Bytes::new()),
        };
        let request = request
            .body(body)
            .map_err(|_| Error::InvalidRequest(uri.clone()))?;
        match sender {
            Sender::H1(s) => {
                s.ready().await.map_err(Error::Http)?;
                s.send_request(request).await
            }
            Sender::H2(s) => s.send_request(request).await,
        }
        .map_err(Error::Http)
    }

    /// A connection: the shared HTTP/2 one or an idle HTTP/1.1 one when there is one (and
    /// `fresh` is false), else a new one.
    async fn conn(&self, fresh: bool) -> Result<Conn, Error> {
        if !fresh {
            let mut pool = self.lock_pool();
            if let Some(h2) = &pool.h2 {
                if !h2.is_closed() {
                    return Ok(Conn {
                        sender: Sender::H2(h2.clone()),
                        reused: true,
                    });
                }
                pool.h2 = None;
            }
            while let Some(h1) = pool.h1.pop() {
                if h1.is_ready() {
                    return Ok(Conn {
                        sender: Sender::H1(h1),
                        reused: true,
                    });
                }
            }
        }
        let sender = self.connect().await?;
        let mut pool = self.lock_pool();
        pool.opened += 1;
        if let Sender::H2(h2) = &sender {
            pool.h2 = Some(h2.clone());
        }
        Ok(Conn {
            sender,
            reused: false,
        })
    }

    /// Returns an HTTP/1.1 connection whose exchange completed to the pool.
    fn release(&self, conn: Conn) {
        if let Sender::H1(h1) = conn.sender
            && !h1.is_closed()
        {
            let mut pool = self.lock_pool();
            if pool.h1.len() < MAX_IDLE_H1 {
                pool.h1.push(h1);
            }
        }
    }

    /// Whether a 401 may be cured by getting the token again.
    fn refreshable(&self) -> bool {
        matches!(self.inner.auth, Auth::TokenFile(_) | Auth::Exec(_))
    }

    async fn forget_token(&self) {
        *self
            .inner
            .token_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        *self.inner.exec_cache.lock().await = None;
    }

    async fn connect(&self) -> Result<Sender, Error> {
        let server = &self.inner.server;
        let limits = &self.inner.limits;
        let connect = TcpStream::connect((server.host.as_str(), server.port));
        let tcp = tokio::time::timeout(limits.connect_timeout, connect)
            .await
            .map_err(|_| Error::Timeout {
                what: "connecting to the API server",
                after: limits.connect_timeout,
            })?
            .map_err(|source| Error::Connect {
                server: server.to_string(),
                source,
            })?;
        // Small requests and event lines: do not wait for Nagle.
        let _ = tcp.set_nodelay(true);
        match &self.inner.tls {
            None => handshake(tcp, false).await,
            Some((connector, name)) => {
                let tls = tokio::time::timeout(
                    limits.connect_timeout,
                    connector.connect(name.clone(), tcp),
                )
                .await
                .map_err(|_| Error::Timeout {
                    what: "TLS handshake with the API server",
                    after: limits.connect_timeout,
                })?
                .map_err(|source| Error::Tls {
                    server: server.to_string(),
                    source,
                })?;
                let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                handshake(tls, h2).await
            }
        }
    }

    async fn token(&self) -> Result<Option<String>, Error> {
        match &self.inner.auth {
            Auth::None => Ok(None),
            Auth::Token(t) => Ok(Some(t.clone())),
            Auth::Exec(exec) => {
                let mut cache = self.inner.exec_cache.lock().await;
                let margin = Duration::from_secs(10);
                let valid = |c: &ExecCredential| {
                    c.expires
                        .is_none_or(|t| t > std::time::SystemTime::now() + margin)
                };
                if let Some(c) = cache.as_ref().filter(|c| valid(c)) {
                    return Ok(Some(c.token.clone()));
                }
                let fresh = exec.run().await?;
                let token = fresh.token.clone();
                *cache = Some(fresh);
                Ok(Some(token))
            }
            Auth::TokenFile(path) => {
                let fresh = self.inner.limits.token_refresh;
                {
                    let cache = self
                        .inner
                        .token_cache
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if let Some((at, token)) = &*cache
                        && at.elapsed() < fresh
                    {
                        return Ok(Some(token.clone()));
                    }
                }
                let token = tokio::fs::read_to_string(path)
                    .await
                    .map_err(|source| Error::Token {
                        path: path.clone(),
                        source,
                    })?
                    .trim()
                    .to_string();
                *self
                    .inner
                    .token_cache
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Some((Instant::now(), token.clone()));
                Ok(Some(token))
            }
        }
    }
}

/// HTTP handshake on a fresh connection; the connection driver task ends with the
/// connection (after the response body is consumed or dropped).
async fn handshake<IO>(io: IO, h2: bool) -> Result<Sender, Error>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(io);
    if h2 {
        let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(Error::Http)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "API server connection ended");
            }
        });
        Ok(Sender::H2(sender))
    } else {
        let (sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(Error::Http)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "API server connection ended");
            }
        });
        Ok(Sender::H1(sender))
    }
}

/// Reads a whole body, failing once it exceeds `limit` bytes.
async fn read_body(mut body: Incoming, limit: usize, what: &'static str) -> Result<Bytes, Error> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(Error::Http)?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                return Err(Error::TooLarge { what, limit });
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(out))
}

/// A `meta/v1 Status` (error bodies and watch `ERROR` events).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct StatusObject {
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub code: u16,
}

/// A query string with percent-encoded values.
#[derive(Debug, Default)]
struct Query(Vec<(&'static str, String)>);

impl Query {
    fn new() -> Self {
        Self::default()
    }

    fn add(mut self, key: &'static str, value: &str) -> Self {
        self.0.push((key, value.to_string()));
        self
    }

    fn opt(self, key: &'static str, value: Option<&str>) -> Self {
        match value {
            Some(v) if !v.is_empty() => self.add(key, v),
            _ => self,
        }
    }

    fn render(&self) -> String {
        let mut out = String::new();
        for (i, (k, v)) in self.0.iter().enumerate() {
            out.push(if i == 0 { '?' } else { '&' });
            out.push_str(k);
            out.push('=');
            out.push_str(&percent_encode(v));
        }
        out
    }
}

pub(crate) fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_encoding() {
        let q = Query::new()
            .opt("fieldSelector", Some("spec.nodeName=node-1,a!=b c"))
            .opt("empty", Some(""))
            .opt("none", None)
            .add("watch", "true");
        assert_eq!(
            q.render(),
            "?fieldSelector=spec.nodeName%3Dnode-1%2Ca%21%3Db%20c&watch=true"
        );
    }
}
