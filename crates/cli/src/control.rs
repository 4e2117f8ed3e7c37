//! `ambit control`: flags (with environment fallbacks) → [`ambit_control::server::run`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use ambit_control::server::{ControlConfig, ObjectSource};
use ambit_control::translate::ClusterConfig;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory of Kubernetes manifests (Namespace, Pod, Service, PeerAuthentication,
    /// AuthorizationPolicy); watched, edits are pushed within 2 s.
    #[arg(
        long,
        env = "AMBIT_MANIFESTS",
        conflicts_with = "kubernetes",
        required_unless_present = "kubernetes"
    )]
    manifests: Option<PathBuf>,
    /// Watch the Kubernetes API instead (in-cluster service account, or the file named by
    /// KUBECONFIG).
    #[arg(long)]
    kubernetes: bool,
    /// Address of the TLS gRPC port serving the CA and xDS.
    #[arg(long, env = "AMBIT_LISTEN", default_value = "0.0.0.0:15012")]
    listen: SocketAddr,
    /// Where the CA root lives (generated on first start).
    #[arg(
        long,
        env = "AMBIT_STATE_DIR",
        default_value = "/var/lib/ambit/control"
    )]
    state_dir: PathBuf,
    /// Token file: `tokens: [{token: ..., node: node1}, {token: ..., identity: spiffe://...}]`.
    #[arg(long, env = "AMBIT_TOKENS")]
    tokens: PathBuf,
    /// DNS names for the server certificate (repeatable).
    #[arg(long = "hostname", default_values_t = ["istiod.istio-system.svc".to_string(), "localhost".to_string()])]
    hostnames: Vec<String>,
    #[arg(long, env = "TRUST_DOMAIN", default_value = "cluster.local")]
    trust_domain: String,
    #[arg(long, env = "CLUSTER_DOMAIN", default_value = "cluster.local")]
    cluster_domain: String,
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    cluster_id: String,
    #[arg(long, env = "ISTIO_ROOT_NAMESPACE", default_value = "istio-system")]
    root_namespace: String,
}

pub fn main(args: Args) -> ExitCode {
    crate::init_logging();
    let source = match (args.manifests, args.kubernetes) {
        (Some(dir), _) => ObjectSource::Directory(dir),
        (None, _) => match crate::kube_config() {
            Ok(k) => ObjectSource::Kubernetes(k),
            Err(e) => {
                eprintln!("Kubernetes API configuration: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let cfg = ControlConfig {
        source,
        listen: args.listen,
        state_dir: args.state_dir,
        tokens: args.tokens,
        hostnames: args.hostnames,
        cluster: ClusterConfig {
            cluster_domain: args.cluster_domain,
            trust_domain: args.trust_domain,
            root_namespace: args.root_namespace,
            cluster_id: args.cluster_id,
        },
    };
    tracing::info!(config = ?cfg, "running control plane");
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let shutdown = async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    match rt.block_on(ambit_control::server::run(cfg, shutdown, None)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("control plane failed: {e}");
            ExitCode::FAILURE
        }
    }
}
