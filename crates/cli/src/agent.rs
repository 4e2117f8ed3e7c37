//! `ambit cni-agent`: environment (upstream's names, every bad one reported) → the node agent,
//! with pods from a directory of manifests (no Kubernetes API client yet).

use std::path::PathBuf;
use std::process::ExitCode;

use ambit_agent::pods::{LocalPodSource, Namespace, Pod, PodPhase};
use ambit_control::objects::ObjectSet;

/// ambit extension for manifest-fed agents: the pod's network namespace path, so a restarted
/// agent finds running pods whose namespaces hold no process (Kubernetes pods always have
/// one, found through /proc).
pub const NETNS_ANNOTATION: &str = "ambit.io/netns";

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory of Pod and Namespace manifests for this node (read at start). Without it the
    /// agent watches the Kubernetes API (in-cluster, or KUBECONFIG).
    #[arg(long, env = "AMBIT_PODS")]
    pods: Option<PathBuf>,
}

fn load(dir: &std::path::Path, node: &str, source: &LocalPodSource) -> Result<(), String> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    entries.sort();
    let mut set = ObjectSet::new();
    for path in entries {
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let name = path.display().to_string();
        for obj in
            ambit_control::objects::load_documents(&name, &text).map_err(|e| e.to_string())?
        {
            set.insert(obj).map_err(|e| e.to_string())?;
        }
    }
    for obj in &set.namespaces {
        source.upsert_namespace(Namespace {
            name: obj.metadata.name.clone(),
            labels: obj.metadata.labels.clone(),
        });
    }
    for pod in &set.pods {
        if !node.is_empty() && pod.spec.node_name != node {
            continue;
        }
        source.upsert_pod(Pod {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            uid: pod.metadata.uid.clone(),
            labels: pod.metadata.labels.clone(),
            annotations: pod.metadata.annotations.clone(),
            service_account: pod.spec.service_account_name.clone(),
            node: pod.spec.node_name.clone(),
            ips: pod.ips(),
            phase: if pod.is_terminal() {
                PodPhase::Failed
            } else {
                PodPhase::Running
            },
            host_network: pod.spec.host_network,
            netns: pod
                .metadata
                .annotations
                .get(NETNS_ANNOTATION)
                .map(PathBuf::from),
        });
    }
    Ok(())
}

pub fn main(args: Args) -> ExitCode {
    crate::init_logging();
    let env: Vec<(String, String)> = std::env::vars().collect();
    let cfg = match ambit_agent::AgentConfig::from_vars(&env) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("invalid agent configuration ({} problems):", errors.len());
            for e in errors {
                eprintln!("  - {e}");
            }
            return ExitCode::from(2);
        }
    };
    tracing::info!(config = ?cfg, "running CNI agent");
    let source = LocalPodSource::new();
    if let Some(dir) = &args.pods {
        if let Err(e) = load(dir, &cfg.node_name, &source) {
            eprintln!("pods: {e}");
            return ExitCode::from(2);
        }
    }
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
    match rt.block_on(ambit_agent::run_agent(cfg, source)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent failed: {e}");
            ExitCode::FAILURE
        }
    }
}
