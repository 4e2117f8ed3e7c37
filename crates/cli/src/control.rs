//! `ambit control`: flags (with environment fallbacks) → [`ambit_control::server::run`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use ambit_control::autoregister::AutoRegistrationConfig;
use ambit_control::mesh_config::watch::MeshSource;
use ambit_control::server::{CallerAuth, ControlConfig, DEFAULT_NODE_ACCOUNTS, ObjectSource};
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
    /// Watch the Kubernetes API instead (KUBECONFIG, else the in-cluster service account,
    /// else ~/.kube/config). Without --tokens, callers then authenticate with Kubernetes
    /// service-account tokens (TokenReview, audience istio-ca).
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
    /// Required with --manifests.
    #[arg(long, env = "AMBIT_TOKENS", required_unless_present = "kubernetes")]
    tokens: Option<PathBuf>,
    /// With TokenReview: service accounts (NAMESPACE/NAME, comma-separated) whose pods are
    /// node proxies, as istiod's CA_TRUSTED_NODE_ACCOUNTS.
    #[arg(
        long,
        env = "CA_TRUSTED_NODE_ACCOUNTS",
        value_delimiter = ',',
        default_value = "istio-system/ztunnel"
    )]
    node_accounts: Vec<String>,
    /// Address of the HTTP monitoring port (`/ready`, `/metrics`); none when not given.
    #[arg(long, env = "AMBIT_MONITORING")]
    monitoring: Option<SocketAddr>,
    /// DNS names for the server certificate (repeatable).
    #[arg(long = "hostname", default_values_t = ["istiod.istio-system.svc".to_string(), "localhost".to_string()])]
    hostnames: Vec<String>,
    /// Trust domain of workload identities, unless the mesh config sets `trustDomain` (which
    /// wins, as in istiod).
    #[arg(long, env = "TRUST_DOMAIN", default_value = "cluster.local")]
    trust_domain: String,
    #[arg(long, env = "CLUSTER_DOMAIN", default_value = "cluster.local")]
    cluster_domain: String,
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    cluster_id: String,
    /// Istio's root namespace (its selector-less policies are mesh-wide), unless the mesh
    /// config sets `rootNamespace` (which wins, as in istiod).
    #[arg(long, env = "ISTIO_ROOT_NAMESPACE", default_value = "istio-system")]
    root_namespace: String,
    /// Istio's mesh config as YAML (the `mesh` key of the `istio` ConfigMap): `trustDomain`,
    /// `rootNamespace` and `defaultConfig.proxyMetadata` are read, other fields ignored.
    /// Re-read while running; a changed `trustDomain` is refused (it takes a restart).
    /// Without it, --kubernetes watches the ConfigMap named by --mesh-config-map.
    #[arg(long, env = "AMBIT_MESH_CONFIG")]
    mesh_config: Option<PathBuf>,
    /// With --kubernetes and no --mesh-config: the ConfigMap (NAMESPACE/NAME) whose `mesh` key
    /// is the mesh config, watched; a missing ConfigMap is an empty mesh config.
    #[arg(
        long,
        env = "AMBIT_MESH_CONFIG_MAP",
        default_value = "istio-system/istio"
    )]
    mesh_config_map: String,
    /// How long an auto-registered WorkloadEntry outlives its VM's last xDS stream (Go
    /// duration, as istiod's PILOT_WORKLOAD_ENTRY_GRACE_PERIOD).
    #[arg(
        long,
        env = "PILOT_WORKLOAD_ENTRY_GRACE_PERIOD",
        default_value = "10s",
        value_parser = grace_period
    )]
    workload_entry_grace_period: std::time::Duration,
    /// Most WorkloadEntries one WorkloadGroup may auto-register at once.
    #[arg(
        long,
        env = "AMBIT_MAX_ENTRIES_PER_GROUP",
        default_value_t = ambit_control::autoregister::DEFAULT_MAX_ENTRIES_PER_GROUP
    )]
    max_entries_per_group: usize,
}

fn grace_period(s: &str) -> Result<std::time::Duration, String> {
    ambit_contract::values::parse_duration(s).map_err(|e| format!("{s:?}: {e}"))
}

pub fn main(args: Args) -> ExitCode {
    crate::init_logging();
    let source = match (args.manifests, args.kubernetes) {
        (Some(dir), _) => ObjectSource::Directory(dir),
        (None, _) => match crate::kube_config() {
            Ok(k) => ObjectSource::Kubernetes(Box::new(k)),
            Err(e) => {
                eprintln!("Kubernetes API configuration: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let auth = match args.tokens {
        Some(path) => CallerAuth::Tokens(path),
        None => {
            let mut node_accounts = Vec::new();
            for a in &args.node_accounts {
                match a.split_once('/') {
                    Some((ns, sa)) if !ns.is_empty() && !sa.is_empty() && !sa.contains('/') => {
                        node_accounts.push((ns.to_string(), sa.to_string()));
                    }
                    _ => {
                        eprintln!("--node-accounts {a:?}: expected NAMESPACE/NAME");
                        return ExitCode::from(2);
                    }
                }
            }
            if node_accounts.is_empty() {
                node_accounts = DEFAULT_NODE_ACCOUNTS
                    .iter()
                    .map(|(ns, sa)| (ns.to_string(), sa.to_string()))
                    .collect();
            }
            CallerAuth::TokenReview { node_accounts }
        }
    };
    let mesh_config = match (args.mesh_config, args.kubernetes) {
        (Some(file), _) => MeshSource::File(file),
        (None, false) => MeshSource::None,
        (None, true) => match args.mesh_config_map.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                MeshSource::ConfigMap {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                }
            }
            _ => {
                eprintln!(
                    "--mesh-config-map {:?}: expected NAMESPACE/NAME",
                    args.mesh_config_map
                );
                return ExitCode::from(2);
            }
        },
    };
    let cfg = ControlConfig {
        source,
        listen: args.listen,
        state_dir: args.state_dir,
        auth,
        monitoring: args.monitoring,
        hostnames: args.hostnames,
        cluster: ClusterConfig {
            cluster_domain: args.cluster_domain,
            trust_domain: args.trust_domain,
            root_namespace: args.root_namespace,
            cluster_id: args.cluster_id,
        },
        mesh_config,
        autoregistration: AutoRegistrationConfig {
            grace_period: args.workload_entry_grace_period,
            max_entries_per_group: args.max_entries_per_group,
            instance_id: std::env::var("POD_NAME")
                .ok()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| AutoRegistrationConfig::default().instance_id),
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

#[derive(Debug, clap::Args)]
pub struct CaArgs {
    #[command(subcommand)]
    command: CaCommand,
}

#[derive(Debug, clap::Subcommand)]
enum CaCommand {
    /// Write a new CA (ca-cert.pem, ca-key.pem, root-cert.pem) into DIR, for `ambit control
    /// --state-dir` (on a cluster: the ambit-ca Secret, see docs/kubernetes.md). An existing
    /// CA in DIR is kept.
    Init {
        dir: PathBuf,
        #[arg(long, default_value = "cluster.local")]
        trust_domain: String,
    },
}

pub fn ca(args: CaArgs) -> ExitCode {
    match args.command {
        CaCommand::Init { dir, trust_domain } => {
            match ambit_tls::LocalCa::load_or_generate(&dir, &trust_domain) {
                Ok(_) => {
                    eprintln!("CA in {}", dir.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("ambit ca init: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
