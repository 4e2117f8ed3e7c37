//! Workload identities: the CA client and the per-identity certificate cache (§5).
//!
//! [`CertManager`] keeps one entry per SPIFFE id. A certificate is fetched on first use (or
//! prefetched when a local workload appears), renewed at half-life by a background task per
//! identity, and on failure retried with exponential backoff while the still-valid certificate
//! keeps serving. Renewal only swaps the certificate used for *new* handshakes; established
//! connections keep their TLS session and are never dropped.
//!
//! Deadlines: each CA call gets [`CA_REQUEST_TIMEOUT`] (a CA that never answers is given up
//! on and retried with the backoff), a caller waits at most [`FETCH_WAIT`] for an identity's
//! first certificate, and an expired certificate is never handed out, however renewal goes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use ambit_model::SpiffeId;
use ambit_proto::ca::IstioCertificateRequest;
use ambit_proto::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use ambit_tls::WorkloadCertificate;
use tokio::sync::{Notify, watch};
use tonic::transport::Channel;

use crate::config::AuthToken;

/// Why a certificate could not be obtained.
#[derive(Debug, Clone, thiserror::Error)]
pub enum IdentityError {
    #[error("CA request for {identity} failed: {message}")]
    Ca { identity: SpiffeId, message: String },
    #[error("generating a CSR for {identity}: {message}")]
    Csr { identity: SpiffeId, message: String },
    #[error("CA response for {identity} rejected: {message}")]
    BadResponse { identity: SpiffeId, message: String },
    #[error("CA request for {identity} got no answer within {after:?}")]
    CaTimeout { identity: SpiffeId, after: Duration },
    #[error("no certificate for {identity} within {waited:?}")]
    NotYet {
        identity: SpiffeId,
        waited: Duration,
    },
    #[error("the certificate for {identity} has expired and no renewal succeeded")]
    Expired { identity: SpiffeId },
    #[error("reading the auth token: {0}")]
    Token(String),
    #[error("certificate manager is shutting down")]
    Shutdown,
}

/// Something that turns an identity into a certificate (the CA client in production).
pub trait CertProvider: Send + Sync + 'static {
    fn fetch<'a>(&'a self, identity: &'a SpiffeId) -> BoxFuture<'a, WorkloadCertificate>;
}

/// The boxed future a [`CertProvider`] returns (boxed so managers can hold `dyn` providers).
pub type BoxFuture<'a, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, IdentityError>> + Send + 'a>>;

/// gRPC client for `IstioCertificateService/CreateCertificate`.
#[derive(Debug, Clone)]
pub struct CaClient {
    client: IstioCertificateServiceClient<Channel>,
    token: Option<AuthToken>,
    cluster_id: String,
    headers: Vec<(String, String)>,
    ttl: Duration,
    /// Shared mode asks for pod identities on this node's behalf.
    impersonate: bool,
}

impl CaClient {
    pub fn new(
        channel: Channel,
        token: Option<AuthToken>,
        cluster_id: String,
        headers: Vec<(String, String)>,
        ttl: Duration,
        impersonate: bool,
    ) -> Self {
        Self {
            client: IstioCertificateServiceClient::new(channel),
            token,
            cluster_id,
            headers,
            ttl,
            impersonate,
        }
    }

    fn token(&self) -> Result<Option<String>, IdentityError> {
        match &self.token {
            None => Ok(None),
            Some(AuthToken::Literal(t)) => Ok(Some(t.clone())),
            // Re-read every call: projected tokens rotate.
            Some(AuthToken::File(p)) => std::fs::read_to_string(p)
                .map(|t| Some(t.trim().to_string()))
                .map_err(|e| IdentityError::Token(format!("{}: {e}", p.display()))),
        }
    }
}

impl CertProvider for CaClient {
    fn fetch<'a>(&'a self, identity: &'a SpiffeId) -> BoxFuture<'a, WorkloadCertificate> {
        Box::pin(self.request(identity))
    }
}

impl CaClient {
    async fn request(&self, identity: &SpiffeId) -> Result<WorkloadCertificate, IdentityError> {
        let (csr, key) = ambit_tls::generate_csr(identity).map_err(|e| IdentityError::Csr {
            identity: identity.clone(),
            message: e.to_string(),
        })?;
        let metadata = self.impersonate.then(|| prost_types::Struct {
            fields: [(
                "ImpersonatedIdentity".to_string(),
                prost_types::Value {
                    kind: Some(prost_types::value::Kind::StringValue(identity.to_string())),
                },
            )]
            .into(),
        });
        let mut req = tonic::Request::new(IstioCertificateRequest {
            csr,
            validity_duration: i64::try_from(self.ttl.as_secs()).unwrap_or(i64::MAX),
            metadata,
        });
        // Tell the CA too (grpc-timeout), so it can stop working on an abandoned call.
        req.set_timeout(CA_REQUEST_TIMEOUT);
        let meta = req.metadata_mut();
        if let Some(token) = self.token()? {
            if let Ok(v) = format!("Bearer {token}").parse() {
                meta.insert("authorization", v);
            }
            if let Ok(v) = self.cluster_id.parse() {
                meta.insert("clusterid", v);
            }
        }
        for (k, v) in &self.headers {
            if let (Ok(k), Ok(v)) = (
                tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes()),
                v.parse(),
            ) {
                meta.insert(k, v);
            }
        }
        let resp = self
            .client
            .clone()
            .create_certificate(req)
            .await
            .map_err(|s| IdentityError::Ca {
                identity: identity.clone(),
                message: s.message().to_string(),
            })?;
        WorkloadCertificate::from_ca_response(&resp.into_inner().cert_chain, key, identity).map_err(
            |e| IdentityError::BadResponse {
                identity: identity.clone(),
                message: e.to_string(),
            },
        )
    }
}

/// What `/config_dump` shows per identity.
#[derive(Debug, Clone)]
pub enum CertState {
    Initializing,
    Available(Arc<WorkloadCertificate>),
    /// The last fetch failed; a still-valid older certificate may be kept.
    Unavailable {
        error: String,
        previous: Option<Arc<WorkloadCertificate>>,
    },
}

struct Entry {
    state: watch::Sender<CertState>,
    /// Wakes the entry's refresh task early (prefetch/forget).
    stop: Arc<Notify>,
}

/// Backoff bounds for failed fetches (§5.2).
const BACKOFF_INITIAL: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(150);
/// Deadline of one CA call (CSR, request, answer). A CA that never answers must not stop the
/// identity's renewal: the call is given up on and retried with backoff.
pub const CA_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`CertManager::fetch`] waits for an identity's first certificate: a connection
/// is not held longer than this on a slow or absent CA (the fetch goes on in the background).
pub const FETCH_WAIT: Duration = Duration::from_secs(5);

/// The per-identity certificate cache.
pub struct CertManager {
    provider: Arc<dyn CertProvider>,
    entries: Mutex<HashMap<SpiffeId, Entry>>,
}

impl std::fmt::Debug for CertManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertManager").finish_non_exhaustive()
    }
}

impl CertManager {
    pub fn new(provider: impl CertProvider) -> Arc<Self> {
        Arc::new(Self {
            provider: Arc::new(provider),
            entries: Mutex::new(HashMap::new()),
        })
    }

    fn entry(self: &Arc<Self>, id: &SpiffeId) -> watch::Receiver<CertState> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = entries.get(id) {
            return e.state.subscribe();
        }
        let (tx, rx) = watch::channel(CertState::Initializing);
        let stop = Arc::new(Notify::new());
        entries.insert(
            id.clone(),
            Entry {
                state: tx.clone(),
                stop: stop.clone(),
            },
        );
        drop(entries);
        tokio::spawn(refresh_loop(self.provider.clone(), id.clone(), tx, stop));
        rx
    }

    /// Starts fetching `id` in the background (local workload appeared).
    pub fn prefetch(self: &Arc<Self>, id: &SpiffeId) {
        let _ = self.entry(id);
    }

    /// Stops renewing `id` (its last local workload disappeared).
    pub fn forget(&self, id: &SpiffeId) {
        let removed = self
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        if let Some(e) = removed {
            e.stop.notify_one();
        }
    }

    /// The current certificate for `id`, waiting up to [`FETCH_WAIT`] for the first fetch.
    /// Fails when the first fetch failed or is still running, and when the certificate has
    /// expired (a stalled renewal never makes an expired certificate usable).
    pub async fn fetch(
        self: &Arc<Self>,
        id: &SpiffeId,
    ) -> Result<Arc<WorkloadCertificate>, IdentityError> {
        let mut rx = self.entry(id);
        let first = async {
            loop {
                let now = SystemTime::now();
                match &*rx.borrow_and_update() {
                    CertState::Available(c) if !c.is_expired_at(now) => return Ok(c.clone()),
                    CertState::Available(_) => {
                        return Err(IdentityError::Expired {
                            identity: id.clone(),
                        });
                    }
                    CertState::Unavailable {
                        previous: Some(c), ..
                    } if !c.is_expired_at(now) => {
                        return Ok(c.clone());
                    }
                    CertState::Unavailable { error, .. } => {
                        return Err(IdentityError::Ca {
                            identity: id.clone(),
                            message: error.clone(),
                        });
                    }
                    CertState::Initializing => {}
                }
                if rx.changed().await.is_err() {
                    return Err(IdentityError::Shutdown);
                }
            }
        };
        tokio::time::timeout(FETCH_WAIT, first)
            .await
            .unwrap_or_else(|_| {
                Err(IdentityError::NotYet {
                    identity: id.clone(),
                    waited: FETCH_WAIT,
                })
            })
    }

    /// Snapshot for `/config_dump`.
    pub fn states(&self) -> Vec<(SpiffeId, CertState)> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<_> = entries
            .iter()
            .map(|(k, e)| (k.clone(), e.state.borrow().clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// Fetches, then sleeps until half-life (or backoff after a failure), until forgotten.
async fn refresh_loop(
    provider: Arc<dyn CertProvider>,
    id: SpiffeId,
    state: watch::Sender<CertState>,
    stop: Arc<Notify>,
) {
    let mut backoff = BACKOFF_INITIAL;
    loop {
        let fetched = tokio::time::timeout(CA_REQUEST_TIMEOUT, provider.fetch(&id))
            .await
            .unwrap_or_else(|_| {
                Err(IdentityError::CaTimeout {
                    identity: id.clone(),
                    after: CA_REQUEST_TIMEOUT,
                })
            });
        let wait = match fetched {
            Ok(cert) => {
                backoff = BACKOFF_INITIAL;
                let refresh_at = cert.refresh_at();
                tracing::info!(identity = %id, "certificate issued");
                state.send_replace(CertState::Available(Arc::new(cert)));
                refresh_at
                    .duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO)
            }
            Err(e) => {
                tracing::warn!(identity = %id, error = %e, retry_in = ?backoff, "certificate fetch failed");
                state.send_modify(|s| {
                    let previous = match s {
                        CertState::Available(c) => Some(c.clone()),
                        CertState::Unavailable { previous, .. } => previous.clone(),
                        CertState::Initializing => None,
                    }
                    .filter(|c| !c.is_expired_at(SystemTime::now()));
                    *s = CertState::Unavailable {
                        error: e.to_string(),
                        previous,
                    };
                });
                let wait = backoff;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                wait
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.notified() => return,
        }
    }
}

#[cfg(test)]
mod tests;
