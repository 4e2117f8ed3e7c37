//! `ambit cni-agent`: environment (upstream's names, every bad one reported) → the node agent,
//! with pods from the Kubernetes API or, for the embedded mesh, a watched directory of
//! manifests ([`ambit_mesh::pod_source`]).

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory of Pod and Namespace manifests for this node (watched). Without it the
    /// agent watches the Kubernetes API (in-cluster, or KUBECONFIG).
    #[arg(long, env = "AMBIT_PODS")]
    pods: Option<PathBuf>,
    /// With --pods: where the agent writes each pod's redirection annotation
    /// (file NAMESPACE_NAME holding the value; absent = no annotation).
    #[arg(long, env = "AMBIT_POD_STATUS", requires = "pods")]
    pod_status: Option<PathBuf>,
}

pub fn main(args: Args) -> ExitCode {
    crate::init_logging();
    let env: Vec<(String, String)> = std::env::vars().collect();
    run(args.pods, args.pod_status, env)
}

/// Runs the agent with `env` (the process environment, or `install-cni`'s defaults, environment
/// and flags); pods from the directory `pods` when given, else from the Kubernetes API.
pub fn run(
    pods: Option<PathBuf>,
    pod_status: Option<PathBuf>,
    env: Vec<(String, String)>,
) -> ExitCode {
    let cfg = match ambit_agent::AgentConfig::from_vars(&env) {
        Ok(c) => c,
        Err(errors) => {
            eprint!("{errors}");
            return ExitCode::from(2);
        }
    };
    tracing::info!(config = ?cfg, "running CNI agent");
    let Some(dir) = &pods else {
        return run_kubernetes(cfg, &env);
    };
    let source = match ambit_mesh::pod_source::start(dir, &cfg.node_name, pod_status) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pods: {e}");
            return ExitCode::from(2);
        }
    };
    let Some(rt) = runtime() else {
        return ExitCode::FAILURE;
    };
    exit(rt.block_on(ambit_agent::run_agent(cfg, source)))
}

/// Pods from the Kubernetes API (in-cluster or KUBECONFIG); the upgrade/uninstall decision
/// at shutdown asks about the agent's DaemonSet, as upstream.
fn run_kubernetes(cfg: ambit_agent::AgentConfig, env: &[(String, String)]) -> ExitCode {
    use ambit_agent::pods::kube_daemonset::{KubeDaemonSetLookup, daemonset_check};
    let Some(rt) = runtime() else {
        return ExitCode::FAILURE;
    };
    // The Kubernetes client's transport starts its worker on this runtime.
    let _runtime = rt.enter();
    let source = match ambit_agent::pods::kube::from_environment(env, &cfg.node_name) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("Kubernetes pod source: {e} (or give --pods DIR)");
            return ExitCode::from(2);
        }
    };
    let owned = matches!(
        cfg.install.mode,
        ambit_agent::installer::conflist::ConfMode::IstioOwned { .. }
    );
    let lookup = KubeDaemonSetLookup::new(
        source.client().clone(),
        cfg.pod_namespace.clone(),
        cfg.node_name.clone(),
    );
    let check = daemonset_check(lookup, cfg.disable_safe_upgrade, owned);
    exit(rt.block_on(ambit_agent::run_agent_with(cfg, source, check.as_ref())))
}

fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("runtime: {e}");
            None
        }
    }
}

fn exit(result: Result<(), ambit_agent::AgentError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent failed: {e}");
            ExitCode::FAILURE
        }
    }
}
