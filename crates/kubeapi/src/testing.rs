//! A fake API server for tests of this and other crates: real HTTP (HTTP/1.1, or HTTP/2 over
//! TLS) on `127.0.0.1:0`, speaking the JSON shapes of the real one.
//!
//! - Collections are addressed by their cluster-wide path (`/api/v1/pods`,
//!   `/apis/security.istio.io/v1/authorizationpolicies`); namespaced paths
//!   (`/api/v1/namespaces/ns/pods[/name[/status]]`) reach the same objects.
//! - `GET` lists (`{"kind":"PodList","metadata":{"resourceVersion":"7"},"items":[…]}`, items
//!   without `kind`/`apiVersion` as the real server sends them), gets one object, or with
//!   `watch=true` streams `{"type":…,"object":…}` lines from `resourceVersion` on (an `ERROR`
//!   event with a 410 `Status` when that version was compacted away). `fieldSelector`
//!   equality (`a.b=c`, `a.b!=c`, comma-separated) is honoured.
//! - `PATCH` with `application/merge-patch+json` applies RFC 7386 to the object, records the
//!   request ([`FakeApiServer::patches`]) and emits `MODIFIED`.
//! - The test changes objects with [`FakeApiServer::apply`] / [`FakeApiServer::delete`],
//!   simulates lost history with [`FakeApiServer::lose_history`], injects raw answers
//!   with [`FakeApiServer::respond_once`] and revokes access with [`FakeApiServer::forbid`].
//! - Besides the pod-facing kinds it serves nodes and `apps/v1` DaemonSets (the agent's
//!   shutdown check); see [`STANDARD_COLLECTIONS`].
//! - `POST /apis/authentication.k8s.io/v1/tokenreviews` reviews tokens the test registered
//!   with [`FakeApiServer::add_token`], as the real server does for service-account tokens
//!   (audiences intersected, pod and node claims in `user.extra`).
//! - Lists honour `limit` / `continue` (token `page-OFFSET`) and `labelSelector` equality;
//!   `GET …/pods/NAME:PORT/proxy/PATH` answers what [`FakeApiServer::pod_proxy`] registered;
//!   [`FakeApiServer::set_unavailable`] answers 503 to everything (an outage).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use ambit_tls::ServerCertificate;
use ambit_tls::tokio_rustls::TlsAcceptor;
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};

use crate::client::MERGE_PATCH;
use crate::config::{Auth, KubeConfig, ServerUrl};

type Body = BoxBody<Bytes, Infallible>;

/// The collections every fake server starts with: (path, kind, apiVersion, namespaced).
pub const STANDARD_COLLECTIONS: [(&str, &str, &str, bool); 7] = [
    ("/api/v1/namespaces", "Namespace", "v1", false),
    ("/api/v1/nodes", "Node", "v1", false),
    ("/apis/apps/v1/daemonsets", "DaemonSet", "apps/v1", true),
    ("/api/v1/pods", "Pod", "v1", true),
    ("/api/v1/services", "Service", "v1", true),
    (
        "/apis/security.istio.io/v1/peerauthentications",
        "PeerAuthentication",
        "security.istio.io/v1",
        true,
    ),
    (
        "/apis/security.istio.io/v1/authorizationpolicies",
        "AuthorizationPolicy",
        "security.istio.io/v1",
        true,
    ),
];

/// Path of the TokenReview API.
pub const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";

/// Who a registered token belongs to ([`FakeApiServer::add_token`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenIdentity {
    /// `system:serviceaccount:NS:NAME` for service-account tokens.
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    /// The token's `aud` claim.
    pub audiences: Vec<String>,
    /// `user.extra`: the bound pod's `authentication.kubernetes.io/pod-name`, `…/pod-uid`,
    /// `…/node-name`, `…/node-uid`.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl TokenIdentity {
    /// A service-account token bound to a pod on a node, as the kubelet's projected tokens.
    pub fn pod_bound(
        namespace: &str,
        service_account: &str,
        pod: (&str, &str),
        node: &str,
        audiences: &[&str],
    ) -> Self {
        let mut extra = BTreeMap::new();
        let one = |v: &str| vec![v.to_string()];
        extra.insert("authentication.kubernetes.io/pod-name".into(), one(pod.0));
        extra.insert("authentication.kubernetes.io/pod-uid".into(), one(pod.1));
        if !node.is_empty() {
            extra.insert("authentication.kubernetes.io/node-name".into(), one(node));
        }
        Self {
            username: format!("system:serviceaccount:{namespace}:{service_account}"),
            uid: format!("uid-sa-{namespace}-{service_account}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
            audiences: audiences.iter().map(|a| a.to_string()).collect(),
            extra,
        }
    }
}

/// A `PATCH` the server received.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedPatch {
    pub path: String,
    pub content_type: String,
    /// The body as sent (kept even when it is not JSON).
    pub body: String,
}

/// Any request the server received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    pub query: String,
    pub authorization: Option<String>,
}

/// Which requests a [`FakeApiServer::respond_once`] answer replaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// A non-watch `GET` of this path: a list, or one object.
    List(String),
    Watch(String),
    Patch(String),
}

#[derive(Debug)]
struct Collection {
    kind: String,
    api_version: String,
    namespaced: bool,
    objects: BTreeMap<(String, String), Value>,
}

#[derive(Debug)]
struct Logged {
    rv: u64,
    collection: String,
    kind: &'static str,
    object: Value,
}

/// The server's objects and history; [`FakeApiServer::lose_history`] hands it to a closure.
#[derive(Debug)]
pub struct FakeState {
    rv: u64,
    /// Watches from a version below this get 410.
    compacted: u64,
    /// Bumped to end every open watch.
    generation: u64,
    collections: BTreeMap<String, Collection>,
    log: Vec<Logged>,
    patches: Vec<RecordedPatch>,
    requests: Vec<RecordedRequest>,
    overrides: VecDeque<(Route, u16, String)>,
    /// Collections every request to which gets 403 (RBAC without the rule).
    forbidden: BTreeSet<String>,
    /// Tokens TokenReview knows.
    tokens: BTreeMap<String, TokenIdentity>,
    /// While set, every request gets 503 (an API server outage).
    unavailable: bool,
    /// Answers of `pods/NAME:PORT/proxy/PATH` by (namespace, name, port, path).
    proxied: BTreeMap<(String, String, u16, String), String>,
    /// TCP connections accepted.
    connections: u64,
}

impl FakeState {
    fn new() -> Self {
        let mut collections = BTreeMap::new();
        for (path, kind, api_version, namespaced) in STANDARD_COLLECTIONS {
            collections.insert(
                path.to_string(),
                Collection {
                    kind: kind.into(),
                    api_version: api_version.into(),
                    namespaced,
                    objects: BTreeMap::new(),
                },
            );
        }
        Self {
            rv: 1,
            compacted: 0,
            generation: 0,
            collections,
            log: Vec::new(),
            patches: Vec::new(),
            requests: Vec::new(),
            overrides: VecDeque::new(),
            forbidden: BTreeSet::new(),
            tokens: BTreeMap::new(),
            unavailable: false,
            proxied: BTreeMap::new(),
            connections: 0,
        }
    }

    /// Creates or replaces an object of `collection` (a cluster-wide path); sets its
    /// `resourceVersion`, a `uid` when missing, and `default` namespace for namespaced kinds.
    /// Returns the stored object.
    ///
    /// # Panics
    /// On an unknown collection or an object without `metadata.name` (test bugs).
    pub fn apply(&mut self, collection: &str, mut object: Value) -> Value {
        let coll = self
            .collections
            .get(collection)
            .unwrap_or_else(|| panic!("unknown collection {collection}"));
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_else(|| panic!("object without metadata.name: {object}"))
            .to_string();
        let namespace = if coll.namespaced {
            object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string()
        } else {
            String::new()
        };
        if coll.namespaced {
            object["metadata"]["namespace"] = json!(namespace);
        }
        object["kind"] = json!(coll.kind);
        object["apiVersion"] = json!(coll.api_version);
        let key = (namespace, name);
        let existed = coll.objects.get(&key);
        if object["metadata"]["uid"].as_str().is_none() {
            let uid = existed
                .and_then(|o| o["metadata"]["uid"].as_str().map(str::to_string))
                .unwrap_or_else(|| format!("uid-{}-{}-{}", key.0, key.1, self.rv + 1));
            object["metadata"]["uid"] = json!(uid);
        }
        let kind = if existed.is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.store(collection, key, object, kind)
    }

    /// Deletes an object; returns its last state.
    pub fn delete(&mut self, collection: &str, namespace: &str, name: &str) -> Option<Value> {
        let coll = self.collections.get_mut(collection)?;
        let mut object = coll
            .objects
            .remove(&(namespace.to_string(), name.to_string()))?;
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.log.push(Logged {
            rv: self.rv,
            collection: collection.to_string(),
            kind: "DELETED",
            object: object.clone(),
        });
        Some(object)
    }

    fn store(
        &mut self,
        collection: &str,
        key: (String, String),
        mut object: Value,
        kind: &'static str,
    ) -> Value {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.log.push(Logged {
            rv: self.rv,
            collection: collection.to_string(),
            kind,
            object: object.clone(),
        });
        if let Some(coll) = self.collections.get_mut(collection) {
            coll.objects.insert(key, object.clone());
        }
        object
    }
}

struct Shared {
    state: Mutex<FakeState>,
    changed: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Why [`FakeApiServer::start_tls_on`] could not start.
#[derive(Debug, thiserror::Error)]
pub enum FakeStartError {
    #[error("TLS configuration of the fake API server")]
    Tls(#[source] ambit_tls::ConfigError),
    #[error("the fake API server's listener")]
    Io(#[source] std::io::Error),
}

/// A running fake API server; stops when dropped.
pub struct FakeApiServer {
    addr: SocketAddr,
    tls: bool,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeApiServer")
            .field("addr", &self.addr)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// The protocols the fake offers over TLS, the API server's.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

impl FakeApiServer {
    /// Plain HTTP/1.1 on `127.0.0.1:0`.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_inner(None).await
    }

    /// TLS with `cert`: HTTP/2 when the client asks for `h2` by ALPN, else HTTP/1.1, as the
    /// API server does.
    pub async fn start_tls(cert: &ServerCertificate) -> Result<Self, ambit_tls::ConfigError> {
        let mut config = ambit_tls::server_config_plain(cert)?;
        config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        // Binding a loopback port only fails when the machine is out of ports; a test bug.
        Ok(Self::start_inner(Some(acceptor))
            .await
            .unwrap_or_else(|e| panic!("binding the fake API server: {e}")))
    }

    /// TLS with a caller-built server configuration (for example one that requires client
    /// certificates); ALPN `h2` and `http/1.1` are set.
    pub async fn start_tls_with(
        mut config: ambit_tls::rustls::ServerConfig,
    ) -> std::io::Result<Self> {
        config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
        Self::start_inner(Some(TlsAcceptor::from(Arc::new(config)))).await
    }

    /// TLS (ALPN `h2` or `http/1.1`) with `cert` on a listener the caller bound, e.g. inside a network
    /// namespace where nodes and pods of a test cluster reach it.
    pub async fn start_tls_on(
        listener: std::net::TcpListener,
        cert: &ServerCertificate,
    ) -> Result<Self, FakeStartError> {
        let mut config = ambit_tls::server_config_plain(cert).map_err(FakeStartError::Tls)?;
        config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
        listener.set_nonblocking(true).map_err(FakeStartError::Io)?;
        let listener = TcpListener::from_std(listener).map_err(FakeStartError::Io)?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        Self::serve_on(listener, Some(acceptor)).map_err(FakeStartError::Io)
    }

    async fn start_inner(tls: Option<TlsAcceptor>) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        Self::serve_on(listener, tls)
    }

    fn serve_on(listener: TcpListener, tls: Option<TlsAcceptor>) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(FakeState::new()),
            changed: Notify::new(),
        });
        let is_tls = tls.is_some();
        let task = tokio::spawn(serve(listener, tls, shared.clone()));
        Ok(Self {
            addr,
            tls: is_tls,
            shared,
            task,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:port` (or `https://`).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// A client config for this server (no CA, no credentials: set them for TLS / auth).
    pub fn config(&self) -> KubeConfig {
        KubeConfig {
            server: ServerUrl::parse(&self.url())
                .unwrap_or_else(|e| panic!("fake server URL: {e}")),
            ca_pem: None,
            tls_server_name: None,
            client_identity: None,
            auth: Auth::None,
        }
    }

    /// Serves one more collection (e.g. `/api/v1/configmaps`, `/apis/apps/v1/deployments`);
    /// serving one that exists already changes nothing.
    pub fn add_collection(&self, path: &str, kind: &str, api_version: &str, namespaced: bool) {
        self.shared
            .lock()
            .collections
            .entry(path.to_string())
            .or_insert_with(|| Collection {
                kind: kind.into(),
                api_version: api_version.into(),
                namespaced,
                objects: BTreeMap::new(),
            });
    }

    /// See [`FakeState::apply`].
    pub fn apply(&self, collection: &str, object: Value) -> Value {
        let out = self.shared.lock().apply(collection, object);
        self.shared.changed.notify_waiters();
        out
    }

    /// See [`FakeState::delete`].
    pub fn delete(&self, collection: &str, namespace: &str, name: &str) -> Option<Value> {
        let out = self.shared.lock().delete(collection, namespace, name);
        self.shared.changed.notify_waiters();
        out
    }

    /// Changes a stored object in place (e.g. a kubelet writing `status` without losing
    /// what others patched meanwhile) and emits `MODIFIED`; returns the stored object.
    pub fn modify(
        &self,
        collection: &str,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) -> Option<Value> {
        let out = {
            let mut st = self.shared.lock();
            let key = (namespace.to_string(), name.to_string());
            let mut object = st.collections.get(collection)?.objects.get(&key)?.clone();
            change(&mut object);
            Some(st.store(collection, key, object, "MODIFIED"))
        };
        self.shared.changed.notify_waiters();
        out
    }

    /// Every stored object of `collection`.
    pub fn objects(&self, collection: &str) -> Vec<Value> {
        self.shared
            .lock()
            .collections
            .get(collection)
            .map(|c| c.objects.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The stored object.
    pub fn object(&self, collection: &str, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .lock()
            .collections
            .get(collection)?
            .objects
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Runs `changes` while no watcher can see them, then forgets the history: every open
    /// watch ends, and resuming from an older resource version gets 410 Gone, so clients
    /// must relist to learn what `changes` did (as after an etcd compaction).
    pub fn lose_history<R>(&self, changes: impl FnOnce(&mut FakeState) -> R) -> R {
        let out = {
            let mut st = self.shared.lock();
            let out = changes(&mut st);
            st.generation += 1;
            st.compacted = st.rv;
            st.log.clear();
            out
        };
        self.shared.changed.notify_waiters();
        out
    }

    /// Ends every open watch (clients resume from their last resource version).
    pub fn disconnect_watches(&self) {
        self.shared.lock().generation += 1;
        self.shared.changed.notify_waiters();
    }

    /// The next request matching `route` gets `status` with `body` (as-is, JSON or not).
    pub fn respond_once(&self, route: Route, status: u16, body: impl Into<String>) {
        self.shared
            .lock()
            .overrides
            .push_back((route, status, body.into()));
    }

    /// Answers every request to `collection` (a cluster-wide path, namespaced requests
    /// included) with 403 Forbidden, as the API server does once the RBAC rule is gone,
    /// until [`FakeApiServer::allow`].
    pub fn forbid(&self, collection: &str) {
        self.shared.lock().forbidden.insert(collection.to_string());
    }

    /// Answers `GET /api/v1/namespaces/NS/pods/POD:PORT/proxy/PATH` (the API server's proxy to
    /// a pod's port) with `body` (200, JSON).
    pub fn pod_proxy(&self, namespace: &str, pod: &str, port: u16, path: &str, body: &str) {
        self.shared.lock().proxied.insert(
            (
                namespace.to_string(),
                pod.to_string(),
                port,
                path.trim_start_matches('/').to_string(),
            ),
            body.to_string(),
        );
    }

    /// Registers a token for TokenReview.
    pub fn add_token(&self, token: &str, identity: TokenIdentity) {
        self.shared
            .lock()
            .tokens
            .insert(token.to_string(), identity);
    }

    /// Starts (`true`) or ends an outage: every request gets 503 and open watches end.
    pub fn set_unavailable(&self, unavailable: bool) {
        {
            let mut st = self.shared.lock();
            st.unavailable = unavailable;
            st.generation += 1;
        }
        self.shared.changed.notify_waiters();
    }

    /// Undoes [`FakeApiServer::forbid`].
    pub fn allow(&self, collection: &str) {
        self.shared.lock().forbidden.remove(collection);
    }

    /// Every `PATCH` so far.
    pub fn patches(&self) -> Vec<RecordedPatch> {
        self.shared.lock().patches.clone()
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().requests.clone()
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.lock().connections
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(listener: TcpListener, tls: Option<TlsAcceptor>, shared: Arc<Shared>) {
    // Connections are owned by this task: aborting it drops the set, which aborts them.
    let mut conns = JoinSet::new();
    loop {
        let (tcp, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(_) => continue,
            },
            Some(_) = conns.join_next() => continue,
        };
        shared.lock().connections += 1;
        let shared = shared.clone();
        let tls = tls.clone();
        conns.spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(&shared, req).await) }
            });
            match tls {
                None => {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                }
                Some(acceptor) => {
                    let Ok(stream) = acceptor.accept(tcp).await else {
                        return;
                    };
                    if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
                        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    } else {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    }
                }
            }
        });
    }
}

fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    full(
        code,
        status_json(code.as_u16(), reason, message).to_string(),
    )
}

fn status_json(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    })
}

/// A parsed request path.
struct Target {
    collection: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

fn parse_target(path: &str) -> Option<Target> {
    let (prefix, rest) = if let Some(rest) = path.strip_prefix("/api/v1/") {
        ("/api/v1".to_string(), rest)
    } else {
        let rest = path.strip_prefix("/apis/")?;
        let mut parts = rest.splitn(3, '/');
        let (group, version, rest) = (parts.next()?, parts.next()?, parts.next()?);
        (format!("/apis/{group}/{version}"), rest)
    };
    let segs: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let (namespace, segs) = match segs.as_slice() {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        all => (None, all),
    };
    let (plural, name, sub) = match segs {
        [plural] => (plural, None, None),
        [plural, name] => (plural, Some(name), None),
        [plural, name, sub] => (plural, Some(name), Some(sub)),
        _ => return None,
    };
    Some(Target {
        collection: format!("{prefix}/{plural}"),
        namespace,
        name: name.map(|n| n.to_string()),
        subresource: sub.map(|s| s.to_string()),
    })
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `a.b=c,d!=e` against an object.
fn selector_matches(selector: &str, object: &Value) -> bool {
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        let (path, want, equal) = match term.split_once("!=") {
            Some((p, v)) => (p, v, false),
            None => match term.split_once("==").or_else(|| term.split_once('=')) {
                Some((p, v)) => (p, v, true),
                None => return false,
            },
        };
        let mut value = object;
        for part in path.split('.') {
            value = &value[part];
        }
        let have = match value {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
        (have == want) == equal
    })
}

fn in_scope(target: &Target, selector: Option<&str>, object: &Value) -> bool {
    let ns_ok = match &target.namespace {
        Some(ns) => object["metadata"]["namespace"].as_str() == Some(ns.as_str()),
        None => true,
    };
    ns_ok && selector.is_none_or(|s| selector_matches(s, object))
}

/// RFC 7386.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    if let Value::Object(map) = target {
        for (k, v) in patch {
            if v.is_null() {
                map.remove(k);
            } else {
                merge_patch(map.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

async fn handle(shared: &Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let header_text = |name| {
        req.headers()
            .get(name)
            .and_then(|v: &header::HeaderValue| v.to_str().ok())
            .map(str::to_string)
    };
    let authorization = header_text(header::AUTHORIZATION);
    let content_type = header_text(header::CONTENT_TYPE).unwrap_or_default();
    let watch = query_param(&query, "watch").as_deref() == Some("true");
    let route = match (&method, watch) {
        (&Method::GET, true) => Route::Watch(path.clone()),
        (&Method::GET, false) => Route::List(path.clone()),
        _ => Route::Patch(path.clone()),
    };
    let injected = {
        let mut st = shared.lock();
        st.requests.push(RecordedRequest {
            method: method.to_string(),
            path: path.clone(),
            query: query.clone(),
            authorization,
        });
        let at = st.overrides.iter().position(|(r, _, _)| *r == route);
        at.and_then(|i| st.overrides.remove(i))
    };
    if let Some((_, code, body)) = injected {
        return full(
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            body,
        );
    }
    if shared.lock().unavailable {
        return status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "the API server is unavailable",
        );
    }
    if let Some((ns, pod, port, rest)) = proxy_target(&path) {
        let answer = shared.lock().proxied.get(&(ns, pod, port, rest)).cloned();
        return match answer {
            Some(body) => full(StatusCode::OK, body),
            None => status(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "no endpoint",
            ),
        };
    }
    if path == TOKEN_REVIEWS {
        if shared.lock().forbidden.contains(TOKEN_REVIEWS) {
            return status(
                StatusCode::FORBIDDEN,
                "Forbidden",
                "tokenreviews is forbidden",
            );
        }
        if method != Method::POST {
            return status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "tokenreviews: create only",
            );
        }
        let body = match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => return status(StatusCode::BAD_REQUEST, "BadRequest", "body"),
        };
        return token_review(shared, &body);
    }
    let Some(target) = parse_target(&path) else {
        return status(StatusCode::NOT_FOUND, "NotFound", "no such path");
    };
    if shared.lock().forbidden.contains(&target.collection) {
        return status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            &format!("{path} is forbidden: RBAC: access denied"),
        );
    }
    let selector = query_param(&query, "fieldSelector");
    match method {
        Method::GET if watch => {
            let from = query_param(&query, "resourceVersion").unwrap_or_default();
            watch_response(shared, target, selector, &from)
        }
        Method::GET => {
            let page = Page {
                limit: query_param(&query, "limit").and_then(|l| l.parse().ok()),
                offset: query_param(&query, "continue"),
                labels: query_param(&query, "labelSelector"),
            };
            get(shared, &target, selector.as_deref(), &page)
        }
        Method::PATCH => {
            let body = match req.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => return status(StatusCode::BAD_REQUEST, "BadRequest", "body"),
            };
            patch(shared, &target, &path, &content_type, &body)
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the fake supports GET and PATCH",
        ),
    }
}

/// `/api/v1/namespaces/NS/pods/NAME:PORT/proxy/REST` → (NS, NAME, PORT, REST).
fn proxy_target(path: &str) -> Option<(String, String, u16, String)> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let (ns, rest) = rest.split_once("/pods/")?;
    let (pod_port, rest) = rest.split_once("/proxy")?;
    let (pod, port) = pod_port.split_once(':')?;
    Some((
        ns.to_string(),
        pod.to_string(),
        port.parse().ok()?,
        rest.trim_start_matches('/').to_string(),
    ))
}

/// `labelSelector` equality terms (`k=v`, `k!=v`, comma-separated) against metadata.labels.
fn labels_match(selector: &str, object: &Value) -> bool {
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        let labels = &object["metadata"]["labels"];
        match term.split_once("!=") {
            Some((k, v)) => labels[k].as_str() != Some(v),
            None => match term.split_once("==").or_else(|| term.split_once('=')) {
                Some((k, v)) => labels[k].as_str() == Some(v),
                None => labels.get(term).is_some(),
            },
        }
    })
}

/// `TokenReview` create: authenticated when the token is registered and its audiences meet
/// the requested ones (any audience of the token when none are requested).
fn token_review(shared: &Shared, body: &[u8]) -> Response<Body> {
    let Ok(review) = serde_json::from_slice::<Value>(body) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "invalid JSON");
    };
    let Some(token) = review["spec"]["token"].as_str() else {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "spec.token: Required",
        );
    };
    let wanted: Vec<String> = review["spec"]["audiences"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let known = shared.lock().tokens.get(token).cloned();
    let result = match known {
        None => json!({"authenticated": false, "error": "invalid bearer token"}),
        Some(id) => {
            let audiences: Vec<&String> = if wanted.is_empty() {
                id.audiences.iter().collect()
            } else {
                id.audiences.iter().filter(|a| wanted.contains(a)).collect()
            };
            if audiences.is_empty() {
                json!({"authenticated": false, "error": "token audiences do not match"})
            } else {
                json!({
                    "authenticated": true,
                    "audiences": audiences,
                    "user": {
                        "username": id.username, "uid": id.uid,
                        "groups": id.groups, "extra": id.extra,
                    },
                })
            }
        }
    };
    let answer = json!({
        "kind": "TokenReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": review["spec"],
        "status": result,
    });
    full(StatusCode::CREATED, answer.to_string())
}

/// `limit` / `continue` of a list; the fake's continue token is `page-OFFSET`.
struct Page {
    limit: Option<usize>,
    offset: Option<String>,
    labels: Option<String>,
}

fn get(shared: &Shared, target: &Target, selector: Option<&str>, page: &Page) -> Response<Body> {
    let st = shared.lock();
    let Some(coll) = st.collections.get(&target.collection) else {
        return status(StatusCode::NOT_FOUND, "NotFound", "unknown resource");
    };
    if let Some(name) = &target.name {
        let key = (target.namespace.clone().unwrap_or_default(), name.clone());
        return match coll.objects.get(&key) {
            Some(o) => full(StatusCode::OK, o.to_string()),
            None => status(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("{name} not found"),
            ),
        };
    }
    let offset = match page.offset.as_deref() {
        None | Some("") => 0,
        Some(token) => match token.strip_prefix("page-").and_then(|n| n.parse().ok()) {
            Some(n) => n,
            None => return status(StatusCode::BAD_REQUEST, "BadRequest", "invalid continue"),
        },
    };
    let matching: Vec<&Value> = coll
        .objects
        .values()
        .filter(|o| in_scope(target, selector, o))
        .filter(|o| page.labels.as_deref().is_none_or(|l| labels_match(l, o)))
        .collect();
    let end = page
        .limit
        .filter(|l| *l > 0)
        .map_or(matching.len(), |l| (offset + l).min(matching.len()));
    let next = (end < matching.len()).then(|| format!("page-{end}"));
    let items: Vec<Value> = matching
        .get(offset.min(end)..end)
        .unwrap_or_default()
        .iter()
        .map(|o| {
            // Items of a typed list carry no kind/apiVersion.
            let mut o = (*o).clone();
            if let Value::Object(map) = &mut o {
                map.remove("kind");
                map.remove("apiVersion");
            }
            o
        })
        .collect();
    let mut metadata = json!({"resourceVersion": st.rv.to_string()});
    if let Some(next) = next {
        metadata["continue"] = json!(next);
    }
    let list = json!({
        "kind": format!("{}List", coll.kind),
        "apiVersion": coll.api_version,
        "metadata": metadata,
        "items": items,
    });
    full(StatusCode::OK, list.to_string())
}

fn patch(
    shared: &Shared,
    target: &Target,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> Response<Body> {
    let response = {
        let mut st = shared.lock();
        st.patches.push(RecordedPatch {
            path: path.to_string(),
            content_type: content_type.to_string(),
            body: String::from_utf8_lossy(body).into_owned(),
        });
        if content_type != MERGE_PATCH {
            return status(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                "the fake accepts merge patches only",
            );
        }
        let Ok(patch) = serde_json::from_slice::<Value>(body) else {
            return status(StatusCode::BAD_REQUEST, "BadRequest", "invalid JSON");
        };
        let (Some(name), None | Some("status")) = (&target.name, target.subresource.as_deref())
        else {
            return status(StatusCode::NOT_FOUND, "NotFound", "not an object path");
        };
        let key = (target.namespace.clone().unwrap_or_default(), name.clone());
        let Some(mut object) = st
            .collections
            .get(&target.collection)
            .and_then(|c| c.objects.get(&key))
            .cloned()
        else {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("{name} not found"),
            );
        };
        merge_patch(&mut object, &patch);
        let stored = st.store(&target.collection, key, object, "MODIFIED");
        full(StatusCode::OK, stored.to_string())
    };
    shared.changed.notify_waiters();
    response
}

struct WatchState {
    shared: Arc<Shared>,
    target: Target,
    selector: Option<String>,
    generation: u64,
    rv: u64,
    lines: VecDeque<Bytes>,
    ended: bool,
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": kind, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

fn watch_response(
    shared: &Arc<Shared>,
    target: Target,
    selector: Option<String>,
    from: &str,
) -> Response<Body> {
    let mut state = {
        let st = shared.lock();
        if !st.collections.contains_key(&target.collection) {
            return status(StatusCode::NOT_FOUND, "NotFound", "unknown resource");
        }
        WatchState {
            shared: shared.clone(),
            generation: st.generation,
            rv: st.rv,
            lines: VecDeque::new(),
            ended: false,
            target,
            selector,
        }
    };
    match from.parse::<u64>() {
        // "" / "0": the current objects as ADDED, then changes.
        Err(_) | Ok(0) => {
            let st = shared.lock();
            if let Some(coll) = st.collections.get(&state.target.collection) {
                for o in coll.objects.values() {
                    if in_scope(&state.target, state.selector.as_deref(), o) {
                        state.lines.push_back(event_line("ADDED", o));
                    }
                }
            }
        }
        Ok(rv) if rv < shared.lock().compacted => {
            let message = format!("too old resource version: {rv}");
            let event = status_json(410, "Expired", &message);
            state.lines.push_back(event_line("ERROR", &event));
            state.ended = true;
        }
        Ok(rv) => state.rv = rv,
    }
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(line) = st.lines.pop_front() {
                return Some((Ok::<_, Infallible>(Frame::data(line)), st));
            }
            if st.ended {
                return None;
            }
            let shared = st.shared.clone();
            let notified = shared.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let state = shared.lock();
                if state.generation != st.generation {
                    return None;
                }
                for e in state.log.iter().filter(|e| e.rv > st.rv) {
                    if e.collection == st.target.collection
                        && in_scope(&st.target, st.selector.as_deref(), &e.object)
                    {
                        st.lines.push_back(event_line(e.kind, &e.object));
                    }
                }
                st.rv = state.rv;
            }
            if st.lines.is_empty() {
                notified.await;
            }
        }
    });
    let mut response = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let cases = [
            ("/api/v1/pods", "/api/v1/pods", None, None, None),
            ("/api/v1/namespaces", "/api/v1/namespaces", None, None, None),
            (
                "/api/v1/namespaces/a",
                "/api/v1/namespaces",
                None,
                Some("a"),
                None,
            ),
            (
                "/api/v1/namespaces/a/pods/p/status",
                "/api/v1/pods",
                Some("a"),
                Some("p"),
                Some("status"),
            ),
            (
                "/apis/security.istio.io/v1/namespaces/a/authorizationpolicies",
                "/apis/security.istio.io/v1/authorizationpolicies",
                Some("a"),
                None,
                None,
            ),
        ];
        for (path, coll, ns, name, sub) in cases {
            let t = parse_target(path).unwrap();
            assert_eq!(
                (
                    t.collection.as_str(),
                    t.namespace.as_deref(),
                    t.name.as_deref(),
                    t.subresource.as_deref()
                ),
                (coll, ns, name, sub),
                "{path}"
            );
        }
        assert!(parse_target("/healthz").is_none());
    }

    #[test]
    fn selectors_and_patches() {
        let pod = json!({"spec": {"nodeName": "n1"}, "metadata": {"name": "p"}});
        assert!(selector_matches("spec.nodeName=n1", &pod));
        assert!(selector_matches("spec.nodeName==n1,metadata.name=p", &pod));
        assert!(!selector_matches("spec.nodeName!=n1", &pod));
        assert!(!selector_matches("spec.nodeName=n2", &pod));
        assert_eq!(
            percent_decode("spec.nodeName%3Dn1%2Cx"),
            "spec.nodeName=n1,x"
        );
        let mut obj = json!({"a": {"b": 1, "c": 2}, "d": 3});
        merge_patch(&mut obj, &json!({"a": {"b": null, "e": 4}, "d": [1]}));
        assert_eq!(obj, json!({"a": {"c": 2, "e": 4}, "d": [1]}));
    }
}
