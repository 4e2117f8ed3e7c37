//! The certificate authority: `istio.v1.auth.IstioCertificateService/CreateCertificate`.
//!
//! Signs workload CSRs from a [`LocalCa`]. Who may get which identity is decided by a
//! [`CaAuthorizer`]: a caller gets its own identity, and a node proxy (ztunnel in shared mode)
//! may ask for the identities of pods on its own node through the `ImpersonatedIdentity`
//! metadata, like upstream istiod's node restriction. Everything else is refused.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ambit_model::SpiffeId;
use ambit_proto::ca::istio_certificate_service_server::IstioCertificateService;
use ambit_proto::ca::{IstioCertificateRequest, IstioCertificateResponse};
use ambit_tls::LocalCa;
use futures_util::future::BoxFuture;
use tonic::{Request, Response, Status};

/// Metadata key a node proxy uses to ask for another identity's certificate.
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";
/// Shortest certificate the CA hands out; shorter requests are raised to it.
const MIN_TTL: Duration = Duration::from_secs(60);
/// Used when the request carries no (or a non-positive) lifetime.
const DEFAULT_TTL: Duration = Duration::from_secs(86400);

/// Who is calling, as established by the transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// A node proxy serving every pod of `node` (shared-mode ztunnel).
    NodeProxy { node: String },
    /// A single workload (dedicated-mode ztunnel, VM).
    Workload(SpiffeId),
}

/// Decides which identities a caller may obtain.
pub trait CaAuthorizer: Send + Sync + 'static {
    /// Maps the request's credentials (bearer token) to a caller; `None` = unauthenticated.
    /// Asynchronous: a Kubernetes authorizer asks the API server
    /// ([`crate::kube_auth::TokenReviewAuthorizer`]).
    fn authenticate<'a>(&'a self, bearer_token: Option<&'a str>) -> BoxFuture<'a, Option<Caller>>;
    /// Whether `identity` belongs to a pod scheduled on `node`.
    fn identity_on_node(&self, node: &str, identity: &SpiffeId) -> bool;
}

/// Tokens issued out of band (the embedded mesh writes one per node), plus a lookup of pod
/// identities per node.
pub struct StaticAuthorizer {
    tokens: HashMap<String, Caller>,
    on_node: Box<NodeLookup>,
}

/// Whether an identity belongs to a pod on a node.
type NodeLookup = dyn Fn(&str, &SpiffeId) -> bool + Send + Sync;

impl std::fmt::Debug for StaticAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticAuthorizer")
            .field("callers", &self.tokens.len())
            .finish()
    }
}

impl StaticAuthorizer {
    pub fn new(
        tokens: HashMap<String, Caller>,
        on_node: impl Fn(&str, &SpiffeId) -> bool + Send + Sync + 'static,
    ) -> Self {
        Self {
            tokens,
            on_node: Box::new(on_node),
        }
    }
}

impl StaticAuthorizer {
    /// The caller a token stands for.
    pub fn caller(&self, bearer_token: Option<&str>) -> Option<Caller> {
        bearer_token.and_then(|t| self.tokens.get(t).cloned())
    }
}

impl CaAuthorizer for StaticAuthorizer {
    fn authenticate<'a>(&'a self, bearer_token: Option<&'a str>) -> BoxFuture<'a, Option<Caller>> {
        Box::pin(std::future::ready(self.caller(bearer_token)))
    }

    fn identity_on_node(&self, node: &str, identity: &SpiffeId) -> bool {
        (self.on_node)(node, identity)
    }
}

/// The gRPC service.
pub struct CaService {
    ca: Arc<LocalCa>,
    authorizer: Arc<dyn CaAuthorizer>,
    min_ttl: Duration,
}

impl std::fmt::Debug for CaService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaService").finish_non_exhaustive()
    }
}

impl CaService {
    pub fn new(ca: Arc<LocalCa>, authorizer: Arc<dyn CaAuthorizer>) -> Self {
        Self {
            ca,
            authorizer,
            min_ttl: MIN_TTL,
        }
    }

    /// Lowers the shortest lifetime handed out (tests exercising renewal).
    pub fn with_min_ttl(mut self, min_ttl: Duration) -> Self {
        self.min_ttl = min_ttl;
        self
    }

    /// The whole decision and signing, separated from tonic for testing.
    pub async fn create(
        &self,
        bearer_token: Option<&str>,
        req: &IstioCertificateRequest,
    ) -> Result<Vec<String>, Status> {
        let caller = self
            .authorizer
            .authenticate(bearer_token)
            .await
            .ok_or_else(|| Status::unauthenticated("missing or unknown bearer token"))?;
        let impersonated = impersonated_identity(req)?;
        let ttl = match u64::try_from(req.validity_duration) {
            Ok(0) | Err(_) => DEFAULT_TTL,
            Ok(secs) => Duration::from_secs(secs).max(self.min_ttl),
        };
        let authorizer = &self.authorizer;
        let chain = self
            .ca
            .sign_csr(&req.csr, ttl, |identity| match (&caller, &impersonated) {
                (Caller::Workload(own), None) if own == identity => Ok(()),
                (Caller::Workload(own), None) => {
                    Err(format!("caller is {own}, CSR asks for {identity}"))
                }
                (Caller::Workload(_), Some(_)) => {
                    Err("only node proxies may impersonate".to_string())
                }
                (Caller::NodeProxy { .. }, None) => {
                    Err("a node proxy must name the identity in ImpersonatedIdentity".to_string())
                }
                (Caller::NodeProxy { node }, Some(imp)) => {
                    if imp != identity {
                        Err(format!(
                            "ImpersonatedIdentity {imp} differs from CSR SAN {identity}"
                        ))
                    } else if authorizer.identity_on_node(node, identity) {
                        Ok(())
                    } else {
                        Err(format!("no pod with identity {identity} on node {node}"))
                    }
                }
            });
        chain.map_err(|e| match e {
            ambit_tls::CaError::Unauthorized { .. } => Status::permission_denied(e.to_string()),
            other => Status::invalid_argument(format!("{other}")),
        })
    }
}

fn impersonated_identity(req: &IstioCertificateRequest) -> Result<Option<SpiffeId>, Status> {
    let Some(meta) = &req.metadata else {
        return Ok(None);
    };
    let Some(value) = meta.fields.get(IMPERSONATED_IDENTITY) else {
        return Ok(None);
    };
    match &value.kind {
        Some(prost_types::value::Kind::StringValue(s)) => SpiffeId::parse(s)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("ImpersonatedIdentity: {e}"))),
        _ => Err(Status::invalid_argument(
            "ImpersonatedIdentity must be a string",
        )),
    }
}

fn bearer(meta: &tonic::metadata::MetadataMap) -> Option<&str> {
    meta.get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

#[tonic::async_trait]
impl IstioCertificateService for CaService {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        let token = bearer(request.metadata()).map(str::to_string);
        let chain = self.create(token.as_deref(), request.get_ref()).await?;
        Ok(Response::new(IstioCertificateResponse {
            cert_chain: chain,
        }))
    }
}

#[cfg(test)]
mod tests;
