//! [`TokenReviewAuthorizer`]: callers authenticated with Kubernetes service-account tokens, as
//! istiod does for ztunnel.
//!
//! Each bearer token goes to the API server as a `TokenReview` with audience `istio-ca` (the
//! audience of the projected token upstream's ztunnel chart mounts). The answer's user
//! `system:serviceaccount:NS:SA` is the caller's identity. A service account listed as a node
//! proxy (default `istio-system/ztunnel`, istiod's `CA_TRUSTED_NODE_ACCOUNTS`) becomes a
//! [`Caller::NodeProxy`] for the node of the pod its token is bound to: the token's
//! `authentication.kubernetes.io/pod-name` / `pod-uid` claims must name a pod the control plane
//! knows, with that uid and that service account, and a `node-name` claim (newer API
//! servers) must agree with the pod's node. A node-proxy token without pod claims, or bound to
//! a pod the control plane does not know (yet), is refused: impersonation is never granted on
//! the token alone. Every other account is a [`Caller::Workload`] of its own identity.
//!
//! Fail closed with a bounded memory: reviews that succeeded are remembered for
//! [`CACHE_TTL`] (at most [`CACHE_ENTRIES`] tokens), so a ztunnel reconnecting during a brief
//! API server outage is still served; a failed or unreachable review is never cached and
//! refuses the caller.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use ambit_kubeapi::Client;
use ambit_kubeapi::serde_json::{Value, json};
use ambit_model::SpiffeId;
use futures_util::future::BoxFuture;

use crate::ca::{CaAuthorizer, Caller};

/// The TokenReview API.
pub const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
/// The audience ztunnel's projected token carries (upstream's chart).
pub const ISTIO_CA_AUDIENCE: &str = "istio-ca";
/// How long a successful review is reused.
pub const CACHE_TTL: Duration = Duration::from_secs(60);
/// Most tokens remembered at once.
pub const CACHE_ENTRIES: usize = 4096;

const POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const POD_UID: &str = "authentication.kubernetes.io/pod-uid";
const NODE_NAME: &str = "authentication.kubernetes.io/node-name";

/// A pod as the CA's node restriction needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPlacement {
    pub uid: String,
    pub node: String,
    pub service_account: String,
}

/// Pods by (namespace, name), kept current by the control plane's object source.
pub type PodIndex = HashMap<(String, String), PodPlacement>;

/// Whether an identity has a pod on a node.
type OnNode = dyn Fn(&str, &SpiffeId) -> bool + Send + Sync;

/// Why a token was refused (logged; the caller only sees "unauthenticated").
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("TokenReview request failed")]
    Api(#[source] ambit_kubeapi::Error),
    #[error("the API server did not authenticate the token: {0}")]
    NotAuthenticated(String),
    #[error("the token is not for audience {ISTIO_CA_AUDIENCE}")]
    Audience,
    #[error("user {0:?} is not a service account")]
    NotServiceAccount(String),
    #[error("service account {0}: {1}")]
    Identity(String, ambit_model::SpiffeIdError),
    #[error("node proxy token of {0} has no pod claims")]
    NoPodClaims(String),
    #[error("node proxy token bound to pod {0}, which the control plane does not know")]
    UnknownPod(String),
    #[error("node proxy token bound to pod {pod}: {reason}")]
    PodMismatch { pod: String, reason: &'static str },
}

/// What a successful review said.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reviewed {
    namespace: String,
    service_account: String,
    pod: Option<(String, String)>,
    node: Option<String>,
}

/// Authenticates bearer tokens with TokenReview; see the module docs.
pub struct TokenReviewAuthorizer {
    client: Client,
    trust_domain: String,
    node_accounts: Vec<(String, String)>,
    pods: Arc<RwLock<PodIndex>>,
    identity_on_node: Box<OnNode>,
    cache: Mutex<HashMap<String, (Instant, Reviewed)>>,
}

impl std::fmt::Debug for TokenReviewAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewAuthorizer")
            .field("node_accounts", &self.node_accounts)
            .finish_non_exhaustive()
    }
}

impl TokenReviewAuthorizer {
    /// `node_accounts`: the (namespace, service account) pairs that are node proxies;
    /// `pods`: the pod index; `identity_on_node`: whether an identity has a pod on a node.
    pub fn new(
        client: Client,
        trust_domain: impl Into<String>,
        node_accounts: Vec<(String, String)>,
        pods: Arc<RwLock<PodIndex>>,
        identity_on_node: impl Fn(&str, &SpiffeId) -> bool + Send + Sync + 'static,
    ) -> Self {
        Self {
            client,
            trust_domain: trust_domain.into(),
            node_accounts,
            pods,
            identity_on_node: Box::new(identity_on_node),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The caller a token belongs to, or why not.
    pub async fn caller(&self, token: &str) -> Result<Caller, ReviewError> {
        let reviewed = match self.cached(token) {
            Some(r) => r,
            None => {
                let r = self.review(token).await?;
                self.remember(token, r.clone());
                r
            }
        };
        self.caller_of(&reviewed)
    }

    fn cached(&self, token: &str) -> Option<Reviewed> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .get(token)
            .filter(|(at, _)| at.elapsed() < CACHE_TTL)
            .map(|(_, r)| r.clone())
    }

    fn remember(&self, token: &str, reviewed: Reviewed) {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= CACHE_ENTRIES {
            cache.retain(|_, (at, _)| at.elapsed() < CACHE_TTL);
        }
        if cache.len() >= CACHE_ENTRIES {
            // Still full of live entries: drop the oldest.
            if let Some(oldest) = cache
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone())
            {
                cache.remove(&oldest);
            }
        }
        cache.insert(token.to_string(), (Instant::now(), reviewed));
    }

    async fn review(&self, token: &str) -> Result<Reviewed, ReviewError> {
        let request = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [ISTIO_CA_AUDIENCE]},
        });
        let answer = self
            .client
            .create(TOKEN_REVIEWS, &request)
            .await
            .map_err(ReviewError::Api)?;
        parse_review(&answer["status"])
    }

    fn caller_of(&self, r: &Reviewed) -> Result<Caller, ReviewError> {
        let account = format!("{}/{}", r.namespace, r.service_account);
        let is_node_proxy = self
            .node_accounts
            .iter()
            .any(|(ns, sa)| *ns == r.namespace && *sa == r.service_account);
        if !is_node_proxy {
            let id = SpiffeId::new(&self.trust_domain, &r.namespace, &r.service_account)
                .map_err(|e| ReviewError::Identity(account, e))?;
            return Ok(Caller::Workload(id));
        }
        let Some((name, uid)) = &r.pod else {
            return Err(ReviewError::NoPodClaims(account));
        };
        let pod_ref = format!("{}/{name}", r.namespace);
        let pods = self.pods.read().unwrap_or_else(|p| p.into_inner());
        let pod = pods
            .get(&(r.namespace.clone(), name.clone()))
            .ok_or_else(|| ReviewError::UnknownPod(pod_ref.clone()))?;
        let mismatch = |reason| ReviewError::PodMismatch {
            pod: pod_ref.clone(),
            reason,
        };
        if pod.uid != *uid {
            return Err(mismatch("its uid differs from the token's pod-uid claim"));
        }
        if pod.service_account != r.service_account {
            return Err(mismatch("it runs as another service account"));
        }
        if pod.node.is_empty() {
            return Err(mismatch("it is not scheduled on a node"));
        }
        if let Some(node) = &r.node
            && *node != pod.node
        {
            return Err(mismatch(
                "the token's node-name claim differs from its node",
            ));
        }
        Ok(Caller::NodeProxy {
            node: pod.node.clone(),
        })
    }
}

/// Reads a TokenReview `status`.
fn parse_review(status: &Value) -> Result<Reviewed, ReviewError> {
    if status["authenticated"].as_bool() != Some(true) {
        let why = status["error"].as_str().unwrap_or("not authenticated");
        return Err(ReviewError::NotAuthenticated(why.to_string()));
    }
    // An API server that ignores audiences returns none: refuse, as istiod does.
    let audience_ok = status["audiences"]
        .as_array()
        .is_some_and(|a| a.iter().any(|v| v.as_str() == Some(ISTIO_CA_AUDIENCE)));
    if !audience_ok {
        return Err(ReviewError::Audience);
    }
    let user = status["user"]["username"].as_str().unwrap_or_default();
    let Some(rest) = user.strip_prefix("system:serviceaccount:") else {
        return Err(ReviewError::NotServiceAccount(user.to_string()));
    };
    let Some((namespace, service_account)) = rest.split_once(':') else {
        return Err(ReviewError::NotServiceAccount(user.to_string()));
    };
    if namespace.is_empty() || service_account.is_empty() || service_account.contains(':') {
        return Err(ReviewError::NotServiceAccount(user.to_string()));
    }
    let claim = |key: &str| -> Option<String> {
        match status["user"]["extra"][key].as_array().map(Vec::as_slice) {
            Some([one]) => one.as_str().filter(|s| !s.is_empty()).map(str::to_string),
            _ => None,
        }
    };
    let pod = match (claim(POD_NAME), claim(POD_UID)) {
        (Some(name), Some(uid)) => Some((name, uid)),
        _ => None,
    };
    Ok(Reviewed {
        namespace: namespace.to_string(),
        service_account: service_account.to_string(),
        pod,
        node: claim(NODE_NAME),
    })
}

impl CaAuthorizer for TokenReviewAuthorizer {
    fn authenticate<'a>(&'a self, bearer_token: Option<&'a str>) -> BoxFuture<'a, Option<Caller>> {
        Box::pin(async move {
            let token = bearer_token?;
            match self.caller(token).await {
                Ok(caller) => Some(caller),
                Err(e) => {
                    tracing::info!(error = %e, "token refused");
                    None
                }
            }
        })
    }

    fn identity_on_node(&self, node: &str, identity: &SpiffeId) -> bool {
        (self.identity_on_node)(node, identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn review_status_shapes() {
        let ok = json!({
            "authenticated": true, "audiences": ["istio-ca"],
            "user": {"username": "system:serviceaccount:istio-system:ztunnel",
                     "extra": {POD_NAME: ["ztunnel-x"], POD_UID: ["u1"], NODE_NAME: ["n1"]}},
        });
        assert_eq!(
            parse_review(&ok).expect("valid"),
            Reviewed {
                namespace: "istio-system".into(),
                service_account: "ztunnel".into(),
                pod: Some(("ztunnel-x".into(), "u1".into())),
                node: Some("n1".into()),
            }
        );
        let bad = [
            (
                json!({"authenticated": false, "error": "expired"}),
                "expired",
            ),
            (
                json!({"authenticated": true, "audiences": ["other"],
                       "user": {"username": "system:serviceaccount:a:b"}}),
                "audience",
            ),
            (
                json!({"authenticated": true, "user": {"username": "system:serviceaccount:a:b"}}),
                "audience",
            ),
            (
                json!({"authenticated": true, "audiences": ["istio-ca"],
                       "user": {"username": "kubernetes-admin"}}),
                "not a service account",
            ),
            (
                json!({"authenticated": true, "audiences": ["istio-ca"],
                       "user": {"username": "system:serviceaccount:a:b:c"}}),
                "not a service account",
            ),
        ];
        for (status, needle) in bad {
            let err = parse_review(&status).expect_err("refused").to_string();
            assert!(err.contains(needle), "{status}: {err}");
        }
    }
}
