//! The `ambit` binary: argument and environment parsing only, then calls the libraries.
//!
//! Each role reads its environment here, in one place, reports every bad variable at once and
//! hands a typed configuration to its library. Invoked as `istio-cni` (the name container
//! runtimes call CNI plugins by) it is the CNI plugin.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod agent;
mod control;
mod ops;
mod out;
mod plugin;
mod up;
mod ztunnel;

#[derive(Debug, Parser)]
#[command(name = "ambit", version, about = "Istio ambient-mode node data plane")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node L4 proxy (drop-in for upstream ztunnel; configured by the same environment
    /// variables).
    #[command(
        after_help = "Example (dedicated mode on a VM):\n  PROXY_MODE=dedicated PROXY_WORKLOAD_INFO=default/web/web \\\n    CA_ADDRESS=https://10.0.0.1:15012 LOCAL_XDS_PATH=./local.yaml ambit ztunnel"
    )]
    Ztunnel,
    /// Run the control plane: CA and workload xDS from a directory of Kubernetes manifests.
    Control(control::Args),
    /// Run the CNI node agent (drop-in for the istio-cni ambient agent; same environment
    /// variables).
    CniAgent(agent::Args),
    /// The CNI plugin (reads CNI_* variables and the network config on stdin).
    CniPlugin,
    /// Bring up an embedded mesh from a directory of manifests (stays in the foreground;
    /// Ctrl-C removes it).
    #[command(
        after_help = "Example:\n  sudo ambit up examples/basic\n  sudo ambit exec client -- curl -s http://server.demo.svc.cluster.local/"
    )]
    Up(up::UpArgs),
    /// Remove the embedded mesh (also after its `ambit up` was killed).
    #[command(after_help = "Examples:\n  sudo ambit down\n  sudo ambit down --run-dir /tmp/mesh")]
    Down(up::RunDirArgs),
    /// Show the embedded mesh: nodes, pods, enrolment, readiness, certificates.
    #[command(after_help = "Examples:\n  sudo ambit status\n  sudo ambit status -o json")]
    Status(up::StatusArgs),
    /// Run a command inside a pod's network namespace with its environment.
    #[command(
        after_help = "Examples:\n  sudo ambit exec demo/client -- python3 -c 'print(1)'\n  sudo ambit exec client -- curl -s http://server.demo.svc.cluster.local/"
    )]
    Exec(up::ExecArgs),
    /// Add or change objects in a running embedded mesh (pods are created through the CNI
    /// path; label changes enrol or un-enrol running pods; policies apply at once).
    #[command(
        after_help = "Examples:\n  sudo ambit apply -f examples/basic/extra/deny-all.yaml\n  sudo ambit apply -f - <<EOF\n  apiVersion: v1\n  kind: Pod\n  ...\n  EOF"
    )]
    Apply(ops::ApplyArgs),
    /// Remove the objects a file names from a running embedded mesh (pods are stopped and
    /// their namespaces deleted).
    #[command(after_help = "Examples:\n  sudo ambit delete -f new-pod.yaml")]
    Delete(ops::ApplyArgs),
    /// Print a component's log from the run directory.
    #[command(
        after_help = "Components: control, agent-NODE, ztunnel-NODE, a pod (NAME or NAMESPACE/NAME).\n\nExamples:\n  sudo ambit logs ztunnel-node1\n  sudo ambit logs demo/server | tail"
    )]
    Logs(ops::LogsArgs),
    /// Show a ztunnel's configuration (its admin `/config_dump`), like `istioctl
    /// ztunnel-config`.
    #[command(
        after_help = "Examples:\n  sudo ambit ztunnel-config workloads\n  sudo ambit ztunnel-config certificates --node node1\n  sudo ambit ztunnel-config services -o json"
    )]
    ZtunnelConfig(ops::ZtunnelConfigArgs),
    /// Run a node's ztunnel or CNI agent again (same command and environment): the old one
    /// is stopped, the new one started and waited for until ready.
    #[command(
        after_help = "Examples:\n  sudo ambit restart ztunnel node2\n  sudo ambit restart agent node1 --timeout 30"
    )]
    Restart(ops::RestartArgs),
    /// Print shell completions.
    #[command(
        after_help = "Examples:\n  ambit completions bash > /etc/bash_completion.d/ambit\n  ambit completions zsh > \"${fpath[1]}/_ambit\"\n  ambit completions fish > ~/.config/fish/completions/ambit.fish"
    )]
    Completions(ops::CompletionsArgs),
    /// Print the version.
    Version,
}

fn main() -> ExitCode {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let invoked_as = std::path::Path::new(&argv0)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string();
    if invoked_as == "istio-cni" {
        return plugin::main();
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Ztunnel => ztunnel::main(),
        Command::Control(args) => control::main(args),
        Command::CniAgent(args) => agent::main(args),
        Command::CniPlugin => plugin::main(),
        Command::Up(args) => up::up(args),
        Command::Down(args) => up::down(args),
        Command::Status(args) => up::status(args),
        Command::Exec(args) => up::exec(args),
        Command::Apply(args) => ops::apply(args, ambit_mesh::api::Op::Apply),
        Command::Delete(args) => ops::apply(args, ambit_mesh::api::Op::Delete),
        Command::Logs(args) => ops::logs(args),
        Command::ZtunnelConfig(args) => ops::ztunnel_config(args),
        Command::Restart(args) => ops::restart(args),
        Command::Completions(args) => {
            ops::completions(args, <Cli as clap::CommandFactory>::command())
        }
        Command::Version => {
            out::say(&format!("ambit {}", env!("CARGO_PKG_VERSION")));
            ExitCode::SUCCESS
        }
    }
}

/// The Kubernetes API configuration: `KUBECONFIG` when set, else the in-cluster service
/// account.
fn kube_config() -> Result<ambit_kubeapi::KubeConfig, ambit_kubeapi::ConfigError> {
    match std::env::var_os("KUBECONFIG") {
        Some(path) if !path.is_empty() => {
            ambit_kubeapi::KubeConfig::from_kubeconfig_file(std::path::Path::new(&path))
        }
        _ => ambit_kubeapi::KubeConfig::in_cluster(
            |k| std::env::var(k).ok(),
            std::path::Path::new(ambit_kubeapi::SERVICE_ACCOUNT_DIR),
        ),
    }
}

/// Logging for the roles that have no configurable format of their own.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
