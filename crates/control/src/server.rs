//! `ambit control`: the CA and the xDS server on one TLS port, fed by a watched directory of
//! Kubernetes manifests or by the API server.
//!
//! Callers authenticate with bearer tokens ([`CallerAuth`]): from a token file (`tokens.yaml`),
//! or, on a cluster, Kubernetes service-account tokens checked by TokenReview
//! ([`crate::kube_auth`]). A node proxy may ask for the certificates of pods on its node
//! (`ImpersonatedIdentity`); a workload only for its own identity. Both may read xDS.
//!
//! With [`ControlConfig::monitoring`] an HTTP listener serves `/ready` (200 once the first
//! snapshot is published and the gRPC port is bound, 503 before) and `/metrics`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use ambit_model::SpiffeId;
use ambit_proto::ca::istio_certificate_service_server::IstioCertificateServiceServer;
use ambit_tls::LocalCa;
use serde::Deserialize;
use tokio::net::TcpListener;

use crate::autoregister::{AutoRegistrationConfig, Registry};
use crate::ca::{CaService, Caller, StaticAuthorizer};
use crate::kube_auth::{PodIndex, PodPlacement, TokenReviewAuthorizer};
use crate::mesh_config::MeshSettings;
use crate::mesh_config::watch::{MeshSource, MeshWatch};
use crate::source::DirectorySource;
use crate::translate::{ClusterConfig, Translation};
use crate::xds::{Snapshot, XdsServer};

/// Everything `ambit control` needs.
#[derive(Debug, Clone)]
pub struct ControlConfig {
    /// Where objects come from.
    pub source: ObjectSource,
    pub listen: SocketAddr,
    /// Holds the CA root (`ca-cert.pem`, `ca-key.pem`, `root-cert.pem`), created on first start.
    pub state_dir: PathBuf,
    /// How callers authenticate.
    pub auth: CallerAuth,
    /// `/ready` and `/metrics` (none: not served).
    pub monitoring: Option<SocketAddr>,
    /// Names in the server certificate (the listen IP is always added).
    pub hostnames: Vec<String>,
    /// The flags' cluster settings; `trust_domain` and `root_namespace` are the defaults for
    /// what [`ControlConfig::mesh_config`] does not set.
    pub cluster: ClusterConfig,
    /// Istio's mesh config (`crate::mesh_config`): read at start, followed while running.
    pub mesh_config: MeshSource,
    /// WorkloadEntry auto-registration of connecting VMs.
    pub autoregistration: AutoRegistrationConfig,
}

/// The origin of the Kubernetes objects.
#[derive(Debug, Clone)]
pub enum ObjectSource {
    /// A directory of manifests, watched.
    Directory(PathBuf),
    /// The Kubernetes API server (list + watch of the five kinds).
    Kubernetes(Box<ambit_kubeapi::KubeConfig>),
}

/// How callers of the CA and xDS authenticate.
#[derive(Debug, Clone)]
pub enum CallerAuth {
    /// A token file; see [`TokenFile`].
    Tokens(PathBuf),
    /// Kubernetes service-account tokens, by TokenReview (needs [`ObjectSource::Kubernetes`]);
    /// the (namespace, service account) pairs that are node proxies.
    TokenReview {
        node_accounts: Vec<(String, String)>,
    },
}

/// istiod's default `CA_TRUSTED_NODE_ACCOUNTS`.
pub const DEFAULT_NODE_ACCOUNTS: [(&str, &str); 1] = [("istio-system", "ztunnel")];

/// `tokens.yaml`: `{tokens: [{token: "...", node: "node1"} | {token: "...", identity: "spiffe://..."}]}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenFile {
    pub tokens: Vec<TokenEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    pub token: String,
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default)]
    pub identity: Option<String>,
}

impl From<crate::kube_source::KubeSourceError> for ControlError {
    fn from(e: crate::kube_source::KubeSourceError) -> Self {
        ControlError::KubeSource(Box::new(e))
    }
}

/// Why the control plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("CA: {0}")]
    Ca(#[from] ambit_tls::CaError),
    #[error("TLS: {0}")]
    Tls(#[from] ambit_tls::ConfigError),
    #[error("token file {path}: {message}")]
    Tokens { path: PathBuf, message: String },
    #[error("manifests: {0}")]
    Source(#[from] crate::source::SourceError),
    #[error("Kubernetes API client: {0}")]
    KubeClient(#[from] ambit_kubeapi::ConfigError),
    #[error("Kubernetes object source: {0}")]
    KubeSource(#[source] Box<crate::kube_source::KubeSourceError>),
    #[error("mesh config: {0}")]
    MeshConfig(#[from] crate::mesh_config::MeshConfigError),
    #[error("TokenReview authentication needs the Kubernetes object source")]
    TokenReviewWithoutKubernetes,
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("gRPC server: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// Reads and checks the token file.
pub fn load_tokens(path: &Path) -> Result<HashMap<String, Caller>, ControlError> {
    let err = |message: String| ControlError::Tokens {
        path: path.to_path_buf(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let file: TokenFile = serde_norway::from_str(&text).map_err(|e| err(e.to_string()))?;
    let mut out = HashMap::new();
    for (i, t) in file.tokens.into_iter().enumerate() {
        if t.token.len() < 16 {
            return Err(err(format!(
                "tokens[{i}]: token shorter than 16 characters"
            )));
        }
        let caller = match (t.node, t.identity) {
            (Some(node), None) => Caller::NodeProxy { node },
            (None, Some(id)) => Caller::Workload(
                SpiffeId::parse(&id).map_err(|e| err(format!("tokens[{i}].identity: {e}")))?,
            ),
            _ => return Err(err(format!("tokens[{i}]: exactly one of node or identity"))),
        };
        if out.insert(t.token, caller).is_some() {
            return Err(err(format!("tokens[{i}]: duplicate token")));
        }
    }
    Ok(out)
}

/// Which identities live on which node, from the latest translation (for the CA's node
/// restriction).
#[derive(Debug, Default)]
struct Placement {
    by_node: HashMap<String, Vec<SpiffeId>>,
}

impl Placement {
    fn from(t: &Translation) -> Self {
        let mut by_node: HashMap<String, Vec<SpiffeId>> = HashMap::new();
        for w in &t.workloads {
            by_node
                .entry(w.node.clone())
                .or_default()
                .push(w.identity().clone());
        }
        Self { by_node }
    }
}

/// Every pod by (namespace, name): uid, node and service account (for TokenReview'd node
/// proxies, whose tokens name their pod).
fn pod_index(cluster: &crate::translate::Cluster) -> PodIndex {
    cluster
        .objects
        .pods
        .iter()
        .map(|p| {
            let key = (p.metadata.namespace.clone(), p.metadata.name.clone());
            let placement = PodPlacement {
                uid: p.metadata.uid.clone(),
                node: p.spec.node_name.clone(),
                service_account: if p.spec.service_account_name.is_empty() {
                    "default".to_string()
                } else {
                    p.spec.service_account_name.clone()
                },
            };
            (key, placement)
        })
        .collect()
}

/// The CA's and xDS server's view of callers.
trait Authorizer: crate::ca::CaAuthorizer + crate::xds::XdsAuthorizer {}
impl<T: crate::ca::CaAuthorizer + crate::xds::XdsAuthorizer> Authorizer for T {}

/// Where the objects come from, with the one Kubernetes client of the process.
enum Objects<'a> {
    Directory(&'a std::path::Path),
    Kubernetes(ambit_kubeapi::Client),
}

/// Runs until `shutdown` completes. Returns the bound address through `bound` (tests bind
/// port 0).
pub async fn run(
    cfg: ControlConfig,
    shutdown: impl std::future::Future<Output = ()> + Send,
    bound: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
) -> Result<(), ControlError> {
    // One Kubernetes client for the process: one connection pool and one credential (one
    // exec plugin run) for the TokenReview authorizer, the object source and the mesh config.
    let objects = match &cfg.source {
        ObjectSource::Kubernetes(kube) => {
            Objects::Kubernetes(ambit_kubeapi::Client::new((**kube).clone())?)
        }
        ObjectSource::Directory(dir) => Objects::Directory(dir),
    };
    let metrics = Arc::new(crate::monitoring::Metrics::default());
    let client = match &objects {
        Objects::Kubernetes(client) => Some(client.clone()),
        Objects::Directory(_) => None,
    };
    // The trust domain and root namespace in force: the mesh config's, else the flags'.
    let mesh = MeshWatch::start(
        cfg.mesh_config.clone(),
        cfg.cluster.clone(),
        client,
        metrics.clone(),
    )
    .await?;
    let mut mesh_settings = mesh.subscribe();
    let cluster_config = {
        let m = mesh.current();
        ClusterConfig {
            trust_domain: m.trust_domain.clone(),
            root_namespace: m.root_namespace.clone(),
            ..cfg.cluster.clone()
        }
    };
    let ca = Arc::new(LocalCa::load_or_generate(
        &cfg.state_dir,
        &cluster_config.trust_domain,
    )?);
    let mut names: Vec<String> = cfg.hostnames.clone();
    names.push(cfg.listen.ip().to_string());
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let server_cert = ca.server_cert_for_hostnames(&name_refs)?;
    let tls = Arc::new(ambit_tls::server_config_plain(&server_cert)?);

    let placement = Arc::new(RwLock::new(Placement::default()));
    let pods = Arc::new(RwLock::new(PodIndex::new()));
    let lookup = placement.clone();
    let on_node = move |node: &str, id: &SpiffeId| {
        lookup
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_node
            .get(node)
            .is_some_and(|ids| ids.contains(id))
    };
    let authorizer: Arc<dyn Authorizer> = match (&cfg.auth, &objects) {
        (CallerAuth::Tokens(path), _) => {
            Arc::new(StaticAuthorizer::new(load_tokens(path)?, on_node))
        }
        (CallerAuth::TokenReview { node_accounts }, Objects::Kubernetes(client)) => {
            Arc::new(TokenReviewAuthorizer::new(
                client.clone(),
                cluster_config.trust_domain.clone(),
                node_accounts.clone(),
                pods.clone(),
                on_node,
            ))
        }
        (CallerAuth::TokenReview { .. }, Objects::Directory(_)) => {
            return Err(ControlError::TokenReviewWithoutKubernetes);
        }
    };

    let registry = Registry::new(
        cfg.autoregistration.clone(),
        tokio::runtime::Handle::current(),
    );
    let xds = Arc::new(XdsServer::with_connect_hook(
        as_xds(authorizer.clone()),
        Arc::new(registry.clone()),
    ));
    let _monitoring = match cfg.monitoring {
        Some(addr) => Some(crate::monitoring::serve(addr, metrics.clone()).await?),
        None => None,
    };
    // Both sources publish whole-cluster snapshots on a watch channel; the guard keeps the
    // source's task alive.
    let (mut clusters, _source_guard): (_, Box<dyn std::any::Any + Send>) = match objects {
        Objects::Directory(dir) => {
            let watch = DirectorySource::new(dir, cluster_config.clone())
                .watch()
                .await?;
            (watch.subscribe(), Box::new(watch))
        }
        Objects::Kubernetes(client) => {
            let watch = crate::kube_source::KubeSource::new(client, cluster_config.clone())
                .watch()
                .await?;
            (watch.subscribe(), Box::new(watch))
        }
    };
    let publish = {
        let xds = xds.clone();
        let placement = placement.clone();
        let pods = pods.clone();
        let metrics = metrics.clone();
        let registry = registry.clone();
        move |cluster: &Arc<crate::translate::Cluster>, mesh: &MeshSettings| {
            // Registration looks groups, pods and declared entries up in the latest objects;
            // the served workloads are those objects plus the registered entries.
            registry.set_cluster(cluster.clone());
            let mut merge_warnings = Vec::new();
            let mut merged = registry.merge(cluster, &mut merge_warnings);
            // The sources carry the settings of the start; the mesh config's root namespace
            // may have changed since (the trust domain never does, see `mesh_config::watch`).
            merged.config.root_namespace = mesh.root_namespace.clone();
            let mut t = merged.translate();
            t.warnings.extend(merge_warnings);
            for w in &t.warnings {
                tracing::warn!(warning = %w, "translation");
            }
            *placement.write().unwrap_or_else(|p| p.into_inner()) = Placement::from(&t);
            *pods.write().unwrap_or_else(|p| p.into_inner()) = pod_index(cluster);
            metrics.published(t.workloads.len(), t.services.len(), t.policies.len());
            xds.update(Snapshot::from_model(&t.workloads, &t.services, &t.policies));
            tracing::info!(
                workloads = t.workloads.len(),
                services = t.services.len(),
                policies = t.policies.len(),
                "configuration pushed"
            );
        }
    };
    let first = clusters.borrow_and_update().clone();
    publish(&first, &mesh_settings.borrow_and_update().clone());
    let mut registrations = registry.subscribe();
    let updater = tokio::spawn(async move {
        // Owned by the task: the mesh config is followed as long as it publishes.
        let _mesh = mesh;
        // A mesh config that is no longer followed keeps its last settings; objects and
        // registrations still publish.
        let mut mesh_followed = true;
        loop {
            tokio::select! {
                c = clusters.changed() => if c.is_err() { break },
                r = registrations.changed() => if r.is_err() { break },
                m = mesh_settings.changed(), if mesh_followed => if m.is_err() {
                    tracing::error!("the mesh config is no longer followed; its last settings stay");
                    mesh_followed = false;
                    continue;
                },
            }
            let cluster = clusters.borrow_and_update().clone();
            registrations.borrow_and_update();
            let settings = mesh_settings.borrow_and_update().clone();
            publish(&cluster, &settings);
        }
    });

    let listener = TcpListener::bind(cfg.listen)
        .await
        .map_err(|source| ControlError::Listen {
            addr: cfg.listen,
            source,
        })?;
    let local = listener
        .local_addr()
        .map_err(|source| ControlError::Listen {
            addr: cfg.listen,
            source,
        })?;
    tracing::info!(address = %local, root = %cfg.state_dir.join("root-cert.pem").display(), "control plane serving");
    if let Some(tx) = bound {
        let _ = tx.send(local);
    }
    metrics.set_ready();
    let mut routes = tonic::service::Routes::new(IstioCertificateServiceServer::new(
        CaService::new(ca, as_ca(authorizer)),
    ));
    routes = routes.add_service(xds.service());
    let xds_stop = xds.clone();
    let result = crate::grpc::serve_tls(listener, tls, routes, async move {
        shutdown.await;
        xds_stop.shutdown();
    })
    .await;
    updater.abort();
    Ok(result?)
}

fn as_xds(a: Arc<dyn Authorizer>) -> Arc<dyn crate::xds::XdsAuthorizer> {
    Arc::new(Both(a))
}

fn as_ca(a: Arc<dyn Authorizer>) -> Arc<dyn crate::ca::CaAuthorizer> {
    Arc::new(Both(a))
}

/// One authorizer behind both services' trait objects.
struct Both(Arc<dyn Authorizer>);

impl crate::ca::CaAuthorizer for Both {
    fn authenticate<'a>(
        &'a self,
        bearer_token: Option<&'a str>,
    ) -> futures_util::future::BoxFuture<'a, Option<Caller>> {
        crate::ca::CaAuthorizer::authenticate(&*self.0, bearer_token)
    }

    fn identity_on_node(&self, node: &str, identity: &SpiffeId) -> bool {
        self.0.identity_on_node(node, identity)
    }
}

impl crate::xds::XdsAuthorizer for Both {
    fn authenticate<'a>(
        &'a self,
        credentials: crate::xds::Credentials<'a>,
    ) -> futures_util::future::BoxFuture<'a, Option<crate::xds::XdsPeer>> {
        crate::xds::XdsAuthorizer::authenticate(&*self.0, credentials)
    }
}
