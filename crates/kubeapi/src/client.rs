//! The HTTP client: one connection per request (HTTP/2 when the server offers it over TLS,
//! else HTTP/1.1), bearer-token auth, bounded bodies, and the four verbs ambit needs:
//! [`Client::list`], [`Client::watch`], [`Client::get`] and [`Client::merge_patch`].
//!
//! A connection per request keeps the client small; the callers make few requests (a list
//! and a long-lived watch per resource, an annotation patch per pod enrolment).

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
use crate::watch::WatchStream;

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
    limits: Limits,
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

impl Client {
    pub fn new(config: KubeConfig) -> Result<Self, ConfigError> {
        let tls = match config.server.scheme {
            Scheme::Http => None,
            Scheme::Https => {
                let ca = config.ca_pem.as_deref().ok_or_else(|| ConfigError::NoCa {
                    url: config.server.to_string(),
                })?;
                let mut tls =
                    ambit_tls::client_config_for_root(ca, config.tls_server_name.as_deref())
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

    /// `GET path[?fieldSelector=…]`: every item and the list's resource version.
    pub async fn list(
        &self,
        path: &str,
        field_selector: Option<&str>,
    ) -> Result<ObjectList, Error> {
        let query = Query::new().opt("fieldSelector", field_selector);
        let body = self.call(Method::GET, path, &query, None).await?;
        #[derive(Deserialize)]
        struct ListMeta {
            #[serde(default, rename = "resourceVersion")]
            resource_version: Option<String>,
        }
        #[derive(Deserialize)]
        struct List {
            #[serde(default)]
            metadata: Option<ListMeta>,
            items: Option<Vec<Value>>,
        }
        let list: List = serde_json::from_slice(&body).map_err(|source| Error::Json {
            what: "a list",
            source,
        })?;
        let items = list.items.unwrap_or_default();
        if let Some(bad) = items.iter().find(|i| !i.is_object()) {
            return Err(Error::Shape {
                what: "list item",
                reason: format!("expected an object, found {bad}"),
            });
        }
        let resource_version = list
            .metadata
            .and_then(|m| m.resource_version)
            .filter(|rv| !rv.is_empty())
            .ok_or_else(|| Error::Shape {
                what: "list",
                reason: "no metadata.resourceVersion".into(),
            })?;
        Ok(ObjectList {
            items,
            resource_version,
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
        let open = self.send(Method::GET, path, &query, None);
        let response = tokio::time::timeout(limits.request_timeout, open)
            .await
            .map_err(|_| Error::Timeout {
                what: "opening a watch",
                after: limits.request_timeout,
            })??;
        let response = self.check(Method::GET, path, response).await?;
        Ok(WatchStream::new(
            response.into_body(),
            limits.max_line,
            limits.watch_idle,
        ))
    }

    /// A non-watch request: status checked, body read (bounded) within the request timeout.
    async fn call(
        &self,
        method: Method,
        path: &str,
        query: &Query,
        body: Option<(&'static str, Bytes)>,
    ) -> Result<Bytes, Error> {
        let after = self.inner.limits.request_timeout;
        let exchange = async {
            let response = self.send(method.clone(), path, query, body).await?;
            let response = self.check(method, path, response).await?;
            read_body(
                response.into_body(),
                self.inner.limits.max_body,
                "response body",
            )
            .await
        };
        tokio::time::timeout(after, exchange)
            .await
            .map_err(|_| Error::Timeout {
                what: "API request",
                after,
            })?
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
        let mut sender = self.connect().await?;
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
        match &mut sender {
            Sender::H1(s) => s.send_request(request).await,
            Sender::H2(s) => s.send_request(request).await,
        }
        .map_err(Error::Http)
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
