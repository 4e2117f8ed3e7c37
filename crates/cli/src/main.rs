//! The `ambit` binary: argument and environment parsing only, then calls the libraries.
//!
//! Each role reads its environment here, in one place, reports every bad variable at once and
//! hands a typed configuration to its library. Invoked as `istio-cni` (the name container
//! runtimes call CNI plugins by) it is the CNI plugin.
//!
//! On Windows the binary has the roles a Windows node runs: `ztunnel`, `cni-agent` (its own
//! module, `agent_windows.rs`) and `wait-enrolled` (docs/windows.md); the embedded mesh, the
//! CNI installer and plugin and the control plane are Linux's (the variants and modules
//! marked `cfg(unix)`).

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// jemalloc, as upstream ztunnel: glibc's malloc trims the data path's large buffers back
/// to the kernel and faults them in again (measured in BENCHMARKS.md, "Profiles").
/// (Not on Windows: jemalloc's build does not target windows-gnu.)
#[cfg(not(windows))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

// The node agent: one module per platform.
#[cfg(unix)]
mod agent;
#[cfg(windows)]
#[path = "agent_windows.rs"]
mod agent;
#[cfg(unix)]
mod config_dumps;
#[cfg(unix)]
mod control;
#[cfg(unix)]
mod install_cni;
#[cfg(unix)]
mod ops;
mod out;
#[cfg(unix)]
mod plugin;
#[cfg(unix)]
mod up;
#[cfg(unix)]
mod vm;
mod wait;
mod ztunnel;
#[cfg(unix)]
mod ztunnel_log;

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
    Ztunnel(ztunnel::Args),
    /// `ambit proxy ztunnel`: the ztunnel chart's args with the image's `ambit` entry point.
    #[command(hide = true)]
    Proxy(ztunnel::ProxyArgs),
    #[cfg(unix)]
    /// Run the control plane: CA and workload xDS from a directory of Kubernetes manifests.
    Control(control::Args),
    #[cfg(unix)]
    /// Certificate authority files for `ambit control`.
    #[command(after_help = "Example:\n  ambit ca init ./ca")]
    Ca(control::CaArgs),
    /// Run the CNI node agent (drop-in for the istio-cni ambient agent; same environment
    /// variables). On Windows: pods from the Kubernetes API, captured through HNS.
    CniAgent(agent::Args),
    #[cfg(unix)]
    /// Run the CNI node agent as upstream's istio-cni chart does (its `install-cni` command):
    /// upstream's container layout under /host and upstream's flags.
    #[command(
        after_help = "Example (what the istio-cni chart runs):\n  install-cni --log_output_level=info"
    )]
    InstallCni(install_cni::Args),
    #[cfg(unix)]
    /// The CNI plugin (reads CNI_* variables and the network config on stdin).
    CniPlugin,
    #[cfg(unix)]
    /// Bring up an embedded mesh from a directory of manifests (stays in the foreground;
    /// Ctrl-C removes it).
    #[command(
        after_help = "Example:\n  sudo ambit up examples/basic\n  sudo ambit exec client -- curl -s http://server.demo.svc.cluster.local/"
    )]
    Up(up::UpArgs),
    #[cfg(unix)]
    /// Remove the embedded mesh (also after its `ambit up` was killed).
    #[command(after_help = "Examples:\n  sudo ambit down\n  sudo ambit down --run-dir /tmp/mesh")]
    Down(up::RunDirArgs),
    #[cfg(unix)]
    /// Show the embedded mesh: nodes, pods, enrolment, readiness, certificates.
    #[command(after_help = "Examples:\n  sudo ambit status\n  sudo ambit status -o json")]
    Status(up::StatusArgs),
    #[cfg(unix)]
    /// Run a command inside a pod's network namespace with its environment.
    #[command(
        after_help = "Examples:\n  sudo ambit exec demo/client -- python3 -c 'print(1)'\n  sudo ambit exec client -- curl -s http://server.demo.svc.cluster.local/"
    )]
    Exec(up::ExecArgs),
    #[cfg(unix)]
    /// Add or change objects in a running embedded mesh (pods are created through the CNI
    /// path; label changes enrol or un-enrol running pods; policies apply at once).
    #[command(
        after_help = "Examples:\n  sudo ambit apply -f examples/basic/extra/deny-all.yaml\n  sudo ambit apply -f - <<EOF\n  apiVersion: v1\n  kind: Pod\n  ...\n  EOF"
    )]
    Apply(ops::ApplyArgs),
    #[cfg(unix)]
    /// Remove the objects a file names from a running embedded mesh (pods are stopped and
    /// their namespaces deleted).
    #[command(after_help = "Examples:\n  sudo ambit delete -f new-pod.yaml")]
    Delete(ops::ApplyArgs),
    #[cfg(unix)]
    /// Print a component's log from the run directory.
    #[command(
        after_help = "Components: control, agent-NODE, ztunnel-NODE, a pod (NAME or NAMESPACE/NAME).\n\nExamples:\n  sudo ambit logs ztunnel-node1\n  sudo ambit logs demo/server | tail"
    )]
    Logs(ops::LogsArgs),
    #[cfg(unix)]
    /// Show a ztunnel's configuration (its admin `/config_dump`), like `istioctl
    /// ztunnel-config`: of the embedded mesh, of a cluster (through the API server's pod
    /// proxy), or of a saved dump.
    #[command(
        after_help = "Examples:\n  sudo ambit ztunnel-config workloads\n  sudo ambit ztunnel-config certificates --node node1\n  sudo ambit ztunnel-config services -o json\n  ambit ztunnel-config workloads ztunnel-x7k2p.istio-system --workload-namespace demo\n  ambit ztunnel-config all --kubernetes --node worker-1 -o yaml\n  ambit ztunnel-config connections --file dump.json --direction inbound\n  sudo ambit ztunnel-config log --node node1 --level access:debug\n  ambit ztunnel-config log ztunnel-x7k2p.istio-system -r"
    )]
    ZtunnelConfig(ops::ZtunnelConfigArgs),
    #[cfg(unix)]
    /// Run a node's ztunnel or CNI agent again (same command and environment) and wait until
    /// it is ready, or re-create a pod's sandbox (new network namespace, CNI DEL and ADD).
    #[command(
        after_help = "Examples:\n  sudo ambit restart ztunnel node2\n  sudo ambit restart agent node1 --timeout 30\n  sudo ambit restart pod demo/server"
    )]
    Restart(ops::RestartArgs),
    #[cfg(unix)]
    /// Stop a component of a running embedded mesh for a while (an outage rehearsal); `ambit
    /// up` starts it again after.
    #[command(
        after_help = "Examples:\n  sudo ambit stop control --for 30\n  sudo ambit stop ztunnel node1 --for 5"
    )]
    Stop(ops::StopArgs),
    #[cfg(unix)]
    /// A VM or bare host in the mesh, from the bundle `istioctl x workload entry configure`
    /// writes (docs/vm.md).
    Vm(vm::Args),
    #[cfg(unix)]
    /// Print shell completions.
    #[command(
        after_help = "Examples:\n  ambit completions bash > /etc/bash_completion.d/ambit\n  ambit completions zsh > \"${fpath[1]}/_ambit\"\n  ambit completions fish > ~/.config/fish/completions/ambit.fish"
    )]
    Completions(ops::CompletionsArgs),
    /// Hold a new pod until the node agent has captured it: the init container of a pod on
    /// a Windows node (exits 0 once the pod's annotations say it is enrolled).
    #[command(
        after_help = "Example (init container, downward-API volume at /etc/podinfo):\n  ambit wait-enrolled --annotations /etc/podinfo/annotations"
    )]
    WaitEnrolled(wait::Args),
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
    let rest = std::env::args_os().skip(1);
    let cli = match invoked_as.as_str() {
        #[cfg(unix)]
        "istio-cni" => return plugin::main(),
        // Upstream's image entry points, all links to this binary.
        "ztunnel" => Cli::parse_from(ztunnel::upstream_argv(rest)),
        #[cfg(unix)]
        "install-cni" => Cli::parse_from(install_cni_argv(rest)),
        _ => Cli::parse(),
    };
    match cli.command {
        Command::Ztunnel(args) => match ztunnel::check_words(&args.words) {
            Ok(()) => ztunnel::main(),
            Err(e) => usage_error(&e),
        },
        Command::Proxy(args) => match ztunnel::check_proxy(&args) {
            Ok(()) => ztunnel::main(),
            Err(e) => usage_error(&e),
        },
        #[cfg(unix)]
        Command::InstallCni(args) => install_cni::main(args),
        #[cfg(unix)]
        Command::Control(args) => control::main(args),
        #[cfg(unix)]
        Command::Ca(args) => control::ca(args),
        Command::CniAgent(args) => agent::main(args),
        #[cfg(unix)]
        Command::CniPlugin => plugin::main(),
        #[cfg(unix)]
        Command::Up(args) => up::up(args),
        #[cfg(unix)]
        Command::Down(args) => up::down(args),
        #[cfg(unix)]
        Command::Status(args) => up::status(args),
        #[cfg(unix)]
        Command::Exec(args) => up::exec(args),
        #[cfg(unix)]
        Command::Apply(args) => ops::apply(args, ambit_mesh::api::Op::Apply),
        #[cfg(unix)]
        Command::Delete(args) => ops::apply(args, ambit_mesh::api::Op::Delete),
        #[cfg(unix)]
        Command::Logs(args) => ops::logs(args),
        #[cfg(unix)]
        Command::ZtunnelConfig(args) => ops::ztunnel_config(args),
        #[cfg(unix)]
        Command::Restart(args) => ops::restart(args),
        #[cfg(unix)]
        Command::Stop(args) => ops::stop(args),
        #[cfg(unix)]
        Command::Vm(args) => vm::main(args),
        #[cfg(unix)]
        Command::Completions(args) => {
            ops::completions(args, <Cli as clap::CommandFactory>::command())
        }
        Command::WaitEnrolled(args) => wait::main(args),
        Command::Version => {
            out::say(&format!("ambit {}", env!("CARGO_PKG_VERSION")));
            ExitCode::SUCCESS
        }
    }
}

#[cfg(unix)]
/// `install-cni ARGS` → `ambit install-cni ARGS` (`install-cni version` → `ambit version`).
fn install_cni_argv(rest: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let rest: Vec<std::ffi::OsString> = rest.collect();
    if rest.len() == 1 && rest[0] == "version" {
        return vec!["ambit".into(), "version".into()];
    }
    let mut argv = vec!["ambit".into(), "install-cni".into()];
    argv.extend(rest);
    argv
}

fn usage_error(e: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(2)
}

/// The Kubernetes API configuration, by the one rule every role uses
/// ([`ambit_kubeapi::KubeConfig::from_environment`]): `KUBECONFIG`, else in-cluster, else
/// `~/.kube/config`.
#[cfg(unix)]
fn kube_config() -> Result<ambit_kubeapi::KubeConfig, ambit_kubeapi::ConfigError> {
    ambit_kubeapi::KubeConfig::from_environment(
        |k| std::env::var(k).ok(),
        std::path::Path::new(ambit_kubeapi::SERVICE_ACCOUNT_DIR),
    )
}

/// Logging for the roles that have no format flag of their own: `RUST_LOG` filter,
/// `LOG_FORMAT=json` for JSON lines (as ztunnel).
fn init_logging() {
    let filter = std::env::var("RUST_LOG").unwrap_or_default();
    let json = std::env::var("LOG_FORMAT").is_ok_and(|f| f == "json");
    init_logging_with(if filter.is_empty() { "info" } else { &filter }, json);
}

/// Logging to stderr with a tracing filter, in upstream's plain (level coloured only on a
/// terminal) or JSON line format.
fn init_logging_with(filter: &str, json: bool) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder
            .event_format(ambit_ztunnel::telemetry::logging::JsonFormat)
            .try_init()
    } else {
        let ansi = std::io::stderr().is_terminal();
        builder
            .event_format(ambit_ztunnel::telemetry::logging::PlainFormat { ansi })
            .try_init()
    };
}
