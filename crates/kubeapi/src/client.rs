//! The client: the transport is a [`kube::Client`] (TLS with aws-lc-rs, hyper-util's
//! connection pool, bearer tokens, token files re-read as they rotate, client certificates,
//! `exec` credential plugins); this module adds ambit's bounds (body and line sizes, request
//! and watch deadlines), typed [`Error`]s, paged lists, and the verbs ambit needs:
//! [`Client::list`], [`Client::watch`], [`Client::get`], [`Client::merge_patch`] and
//! [`Client::create`].
//!

use std::sync::Arc;
use std::time::Duration;

use ambit_tls::pki_types::CertificateDer;
use ambit_tls::pki_types::pem::PemObject;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode, header};
use k8s_openapi::jiff::Timestamp;
use kube::client::Body;
use serde::Deserialize;
use serde_json::Value;

use crate::config::{Auth, ClientIdentity, ConfigError, KubeConfig, Scheme, ServerUrl};
use crate::exec::{ExecConfig, ExecError, ExecFailure};
use crate::watch::WatchStream;

/// Most pages one list may take.
const MAX_PAGES: usize = 10_000;

/// The content type of a JSON merge patch (RFC 7386).
pub const MERGE_PATCH: &str = "application/merge-patch+json";

/// A failed request. Every variant names what failed; none carries a catch-all string.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Connecting, TLS, credentials (token file, plugin) or the HTTP exchange failed.
    #[error("talking to the API server {server}")]
    Transport {
        server: String,
        #[source]
        source: kube::Error,
    },
    /// The `exec` credential plugin failed (it runs on the first request and again before
    /// its credential expires).
    #[error("getting credentials")]
    Credentials(#[source] Box<ExecError>),
    #[error("{what} timed out after {after:?}")]
    Timeout { what: &'static str, after: Duration },
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
    /// Items asked for per list page (`limit`).
    pub page_size: u32,
    /// Longest an `exec` credential plugin may run before it is killed.
    pub exec_timeout: Duration,
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
            page_size: 500,
            exec_timeout: Duration::from_secs(30),
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

/// A Kubernetes API client. Cheap to clone; clones and [`Client::with_limits`] share one
/// connection pool and one credential (one plugin run per credential lifetime).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    server: ServerUrl,
    transport: Arc<Transport>,
    limits: Limits,
}

/// The connection pool and the credentials.
enum Transport {
    /// Credentials fixed by the configuration (a token, a token file kube-rs re-reads as it
    /// rotates, a client certificate, none).
    Fixed(kube::Client),
    /// An `exec` plugin's credential, fetched on first use and again before it expires or
    /// after the server refused it.
    Exec(Box<ExecTransport>),
}

struct ExecTransport {
    plugin: ExecConfig,
    /// kube-rs's configuration without the plugin's credential, and the pool built from it
    /// (used while the plugin answers tokens only).
    base: kube::Config,
    pool: kube::Client,
    deadline: Duration,
    /// Held across a plugin run, so concurrent requests wait for one run (bounded by
    /// `deadline`) instead of starting their own.
    current: tokio::sync::Mutex<Option<ExecCurrent>>,
}

struct ExecCurrent {
    kube: kube::Client,
    identity: Option<ClientIdentity>,
    header: Option<HeaderValue>,
    expires: Option<Timestamp>,
    refused: bool,
}

/// A credential is fetched again this long before its expiry (as client-go and kube-rs do).
const EXPIRY_MARGIN: Duration = Duration::from_secs(60);

impl ExecCurrent {
    fn usable(&self) -> bool {
        let margin = k8s_openapi::jiff::SignedDuration::try_from(EXPIRY_MARGIN)
            .unwrap_or(k8s_openapi::jiff::SignedDuration::ZERO);
        !self.refused
            && self.expires.is_none_or(|at| {
                Timestamp::now()
                    .saturating_add(margin)
                    .is_ok_and(|t| t < at)
            })
    }
}

impl Transport {
    /// The pool to send on and the `Authorization` header to add (if ambit adds one).
    async fn current(&self) -> Result<(kube::Client, Option<HeaderValue>), Error> {
        let exec = match self {
            Transport::Fixed(kube) => return Ok((kube.clone(), None)),
            Transport::Exec(exec) => exec,
        };
        let mut current = exec.current.lock().await;
        if let Some(c) = current.as_ref().filter(|c| c.usable()) {
            return Ok((c.kube.clone(), c.header.clone()));
        }
        let fail = |f| Error::Credentials(Box::new(exec.plugin.error(f)));
        let credential = exec
            .plugin
            .run(exec.deadline)
            .await
            .map_err(|e| Error::Credentials(Box::new(e)))?;
        let header = match &credential.token {
            Some(token) => {
                let mut value = HeaderValue::try_from(format!("Bearer {token}"))
                    .map_err(|_| fail(ExecFailure::InvalidToken))?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        // The pool is kept while the TLS identity stays the same; a new client certificate
        // needs new connections.
        let kube = match (current.take(), &credential.identity) {
            (Some(c), identity) if c.identity == *identity => c.kube,
            (_, None) => exec.pool.clone(),
            (_, Some(_)) => {
                let mut config = exec.base.clone();
                if let Some(id) = &credential.identity {
                    set_identity(&mut config, id);
                }
                kube::Client::try_from(config).map_err(|e| fail(ExecFailure::Identity(e)))?
            }
        };
        *current = Some(ExecCurrent {
            kube: kube.clone(),
            identity: credential.identity,
            header: header.clone(),
            expires: credential.expires,
            refused: false,
        });
        Ok((kube, header))
    }

    /// The server answered 401: the next request runs the plugin again (client-go's rule).
    async fn refused(&self) {
        if let Transport::Exec(exec) = self
            && let Some(c) = exec.current.lock().await.as_mut()
        {
            c.refused = true;
        }
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("server", &self.inner.server.to_string())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client for `config` with the default [`Limits`]. Must be called inside a Tokio
    /// runtime (the transport starts its worker task). Runs nothing: an `exec` plugin runs
    /// on the first request, bounded by [`Limits::exec_timeout`].
    pub fn new(config: KubeConfig) -> Result<Self, ConfigError> {
        Self::with_config_limits(config, Limits::default())
    }

    /// [`Client::new`] with other [`Limits`]; the only way to set the transport's
    /// [`Limits::connect_timeout`] and [`Limits::exec_timeout`].
    pub fn with_config_limits(config: KubeConfig, limits: Limits) -> Result<Self, ConfigError> {
        let server = config.server.clone();
        let auth = config.auth.clone();
        let kube_config = kube_config(config, &limits)?;
        let pool =
            kube::Client::try_from(kube_config.clone()).map_err(|source| ConfigError::Client {
                server: server.to_string(),
                source,
            })?;
        let transport = match auth {
            Auth::Exec(plugin) => Transport::Exec(Box::new(ExecTransport {
                plugin,
                base: kube_config,
                pool,
                deadline: limits.exec_timeout,
                current: tokio::sync::Mutex::new(None),
            })),
            _ => Transport::Fixed(pool),
        };
        Ok(Self {
            inner: Arc::new(Inner {
                server,
                transport: Arc::new(transport),
                limits,
            }),
        })
    }

    /// The same client (the same connection pool and credential) with other request
    /// [`Limits`]. The transport's connect and plugin timeouts stay those it was built with
    /// ([`Client::with_config_limits`]).
    pub fn with_limits(self, limits: Limits) -> Self {
        Self {
            inner: Arc::new(Inner {
                server: self.inner.server.clone(),
                transport: self.inner.transport.clone(),
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
        let response = tokio::time::timeout(limits.request_timeout, open)
            .await
            .map_err(|_| Error::Timeout {
                what: "opening a watch",
                after: limits.request_timeout,
            })??;
        Ok(WatchStream::new(
            response.into_body(),
            self.inner.server.to_string(),
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
            let response = self.exchange(method, path, query, body).await?;
            read_body(
                &self.inner.server,
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

    /// Sends a request (kube-rs adds the server's address and the credentials) and checks
    /// its status.
    async fn exchange(
        &self,
        method: Method,
        path: &str,
        query: &Query,
        body: Option<(&'static str, Bytes)>,
    ) -> Result<Response<Body>, Error> {
        if !path.starts_with('/') || path.contains(['?', '#', ' ']) {
            return Err(Error::InvalidRequest(path.to_string()));
        }
        let uri = format!("{path}{}", query.render());
        let mut request = Request::builder()
            .method(method.clone())
            .uri(&uri)
            .header(header::ACCEPT, "application/json")
            .header(
                header::USER_AGENT,
                concat!("ambit/", env!("CARGO_PKG_VERSION")),
            );
        let body = match body {
            Some((content_type, bytes)) => {
                request = request.header(header::CONTENT_TYPE, content_type);
                Body::from(bytes)
            }
            None => Body::empty(),
        };
        let mut request = request
            .body(body)
            .map_err(|_| Error::InvalidRequest(uri.clone()))?;
        let (kube, authorization) = self.inner.transport.current().await?;
        if let Some(value) = authorization {
            request.headers_mut().insert(header::AUTHORIZATION, value);
        }
        let response = kube
            .send(request)
            .await
            .map_err(|source| self.transport(source))?;
        if response.status() == StatusCode::UNAUTHORIZED {
            self.inner.transport.refused().await;
        }
        self.check(method, path, response).await
    }

    fn transport(&self, source: kube::Error) -> Error {
        Error::Transport {
            server: self.inner.server.to_string(),
            source,
        }
    }

    /// Maps a non-2xx answer to an error, reading the `Status` object it carries.
    async fn check(
        &self,
        method: Method,
        path: &str,
        response: Response<Body>,
    ) -> Result<Response<Body>, Error> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = read_body(
            &self.inner.server,
            response.into_body(),
            64 << 10,
            "error body",
        )
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
}

/// kube-rs's configuration for `config`: its roots, client certificate and credentials, and
/// ambit's connect timeout; no read timeout (ambit bounds each request and watch itself).
fn kube_config(config: KubeConfig, limits: &Limits) -> Result<kube::Config, ConfigError> {
    let url = config.server.to_string();
    let uri: http::Uri = url.parse().map_err(|_| ConfigError::Url {
        url: url.clone(),
        reason: "not a URI",
    })?;
    let mut out = kube::Config::new(uri);
    out.connect_timeout = Some(limits.connect_timeout);
    out.read_timeout = None;
    // A 429 / 503 is the caller's to handle (the reflector backs off, TokenReview fails
    // closed); kube-rs's retry layer would hide an outage until the request deadline.
    out.default_retry = false;
    out.write_timeout = Some(limits.request_timeout);
    out.tls_server_name = config.tls_server_name;
    if config.server.scheme == Scheme::Https {
        let ca = config
            .ca_pem
            .as_deref()
            .ok_or_else(|| ConfigError::NoCa { url: url.clone() })?;
        let roots = CertificateDer::pem_slice_iter(ca.as_bytes())
            .map(|c| c.map(|c| c.to_vec()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| ConfigError::Ca { url: url.clone() })?;
        if roots.is_empty() {
            return Err(ConfigError::Ca { url });
        }
        out.root_cert = Some(roots);
    }
    if let Some(id) = &config.client_identity {
        set_identity(&mut out, id);
    }
    let auth = &mut out.auth_info;
    match config.auth {
        // The plugin is ambit's to run (crate::exec): kube-rs would run it with no deadline.
        Auth::None | Auth::Exec(_) => {}
        Auth::Token(token) => auth.token = Some(token.into()),
        Auth::TokenFile(path) => auth.token_file = Some(path_string(&path)),
    }
    Ok(out)
}

/// Presents `id` as the TLS client certificate.
fn set_identity(config: &mut kube::Config, id: &ClientIdentity) {
    let b64 = base64::engine::general_purpose::STANDARD;
    config.auth_info.client_certificate_data = Some(b64.encode(&id.cert_pem));
    config.auth_info.client_key_data = Some(b64.encode(&id.key_pem).into());
}

fn path_string(path: &std::path::Path) -> String {
    path.to_string_lossy().into_owned()
}

/// Reads a whole body, failing once it exceeds `limit` bytes.
async fn read_body(
    server: &ServerUrl,
    mut body: Body,
    limit: usize,
    what: &'static str,
) -> Result<Bytes, Error> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|source| Error::Transport {
            server: server.to_string(),
            source,
        })?;
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
