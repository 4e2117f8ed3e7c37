//! Who may open an xDS stream.
//!
//! Every stream is authenticated once, from what the transport and the request headers say,
//! before any resource is sent. Workload xDS carries no per-caller filtering (every ztunnel
//! gets the whole mesh), so the decision is only "who is this" or "refused".

use std::collections::HashMap;
use std::net::SocketAddr;

use ambit_model::SpiffeId;
use futures_util::future::BoxFuture;

use crate::ca::{CaAuthorizer, Caller, StaticAuthorizer};
use crate::kube_auth::TokenReviewAuthorizer;

/// What a stream presents when it opens.
#[derive(Debug, Clone, Copy, Default)]
pub struct Credentials<'a> {
    /// The `authorization: Bearer <token>` value, without the scheme.
    pub bearer_token: Option<&'a str>,
    /// The `clusterid` header.
    pub cluster_id: Option<&'a str>,
    /// The TCP peer, when the transport knows it.
    pub remote: Option<SocketAddr>,
}

/// An authenticated xDS client: a name for logs, and the workload identity its credentials
/// prove (none for a node proxy or an unauthenticated development peer). Auto-registration
/// ([`crate::autoregister`]) trusts only `identity`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsPeer {
    pub name: String,
    pub identity: Option<SpiffeId>,
}

impl XdsPeer {
    /// A peer known by name only (no workload identity).
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            identity: None,
        }
    }
}

/// Decides whether a stream may be served.
pub trait XdsAuthorizer: Send + Sync + 'static {
    /// `None` refuses the stream with `UNAUTHENTICATED`.
    fn authenticate<'a>(&'a self, credentials: Credentials<'a>) -> BoxFuture<'a, Option<XdsPeer>>;
}

/// Bearer tokens issued out of band, token → peer.
#[derive(Clone, Default)]
pub struct TokenAuthorizer {
    tokens: HashMap<String, XdsPeer>,
}

impl std::fmt::Debug for TokenAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the tokens themselves.
        f.debug_struct("TokenAuthorizer")
            .field("peers", &self.tokens.len())
            .finish()
    }
}

impl TokenAuthorizer {
    pub fn new(tokens: HashMap<String, XdsPeer>) -> Self {
        Self { tokens }
    }
}

impl XdsAuthorizer for TokenAuthorizer {
    fn authenticate<'a>(&'a self, credentials: Credentials<'a>) -> BoxFuture<'a, Option<XdsPeer>> {
        let peer = credentials
            .bearer_token
            .and_then(|t| self.tokens.get(t).cloned());
        Box::pin(std::future::ready(peer))
    }
}

fn peer_of(caller: Caller) -> XdsPeer {
    match caller {
        Caller::NodeProxy { node } => XdsPeer::named(format!("node proxy {node}")),
        Caller::Workload(id) => XdsPeer {
            name: id.to_string(),
            identity: Some(id),
        },
    }
}

/// The CA's token table serves xDS too: one token per node proxy or workload.
impl XdsAuthorizer for StaticAuthorizer {
    fn authenticate<'a>(&'a self, credentials: Credentials<'a>) -> BoxFuture<'a, Option<XdsPeer>> {
        Box::pin(std::future::ready(
            self.caller(credentials.bearer_token).map(peer_of),
        ))
    }
}

/// TokenReview'd service-account tokens serve xDS too (node proxies and workloads alike).
impl XdsAuthorizer for TokenReviewAuthorizer {
    fn authenticate<'a>(&'a self, credentials: Credentials<'a>) -> BoxFuture<'a, Option<XdsPeer>> {
        Box::pin(async move {
            CaAuthorizer::authenticate(self, credentials.bearer_token)
                .await
                .map(peer_of)
        })
    }
}

/// Serves anyone who completed the TLS handshake. For development meshes whose listener is
/// only reachable by trusted processes; never the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl XdsAuthorizer for AllowAll {
    fn authenticate<'a>(&'a self, credentials: Credentials<'a>) -> BoxFuture<'a, Option<XdsPeer>> {
        Box::pin(std::future::ready(Some(XdsPeer::named(
            credentials
                .remote
                .map_or_else(|| "unknown".to_string(), |r| r.to_string()),
        ))))
    }
}
