//! ambit's node agent and CNI plugin: the drop-in for upstream istio-cni's ambient mode
//! (`spec/cni.md`). It enrols pods (in-pod redirection rules, host probe set, ZDS `Add` to
//! ztunnel, the `ambient.istio.io/redirection` annotation), serves ztunnel over ZDS, and
//! contains the `istio-cni` CNI plugin as a pure function.
//!
//! # Layout
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | [`AgentConfig`] from upstream env names (§6.4), all errors at once |
//! | [`pods`] | [`PodSource`] (pods of this node + namespaces + annotation sink), [`LocalPodSource`] |
//! | [`enrol`] | the §2 predicate: selectors, excludes, hostNetwork/sidecar/ztunnel pods |
//! | [`zds`] | the ZDS server (§4): SEQPACKET socket, snapshot, Add→newest / Del→all |
//! | [`daemon`] | the running agent: event loop, worker with retries, add/remove (§1.4–§1.7), restart pass (§1.8), plugin-event and plugin log servers, health and metrics through [`monitoring`], verification |
//! | [`monitoring`] | the health (`/healthz`, `/readyz`) and metrics (`/metrics`) servers, shared by the Linux and Windows agents |
//! | [`discovery`] | `/proc` scan for pod netns: cgroup pod UIDs, IP-ownership check, oldest process wins (§1.8 step 3) |
//! | [`shutdown`] | upgrade vs uninstall (§1.10): [`shutdown::UninstallCheck`] and the full cleanup |
//! | [`plugin`] | [`plugin_main`] (§5.1–§5.3) and its side of the plugin log socket (§5.6) |
//! | [`installer`] | the installer (§1.3 step 9, §5.5): plugin binary copy, plugin kubeconfig, CNI config (conflist editing as file operations in [`installer::conflist`]), re-checked every second; readiness |
//! | `testing` | `FakeZtunnel`, a real ZDS peer for tests of this and other crates (feature `testing`, dev-dependencies only) |
//! | [`platform`] | the platform switch: what a pod's namespace is and how ZDS carries it |
//! | [`hold`] | the init container that holds a new Windows pod until it is captured |
//! | `windows` | Windows nodes: the CRI client and its sandbox info, HNS namespaces, `L4WFPPROXY` policies, the node agent's loop (`windows::daemon`) and, on Windows, the agent itself (`windows::agent`) |
//!
//! On Windows only `enrol`, `pods`, `zds`, `platform`, `hold`, `monitoring` and `windows` are
//! built (`windows` is on every platform: what it parses is tested on Linux); the rest (rules run in a netns, `/proc` discovery, the plugin's Unix socket, the
//! installer) is Linux's.
//!
//! Entry points for the CLI: [`plugin_main`], [`AgentConfig::from_vars`], [`run_agent`]
//! (or [`start`] for a handle that shuts down on demand).
//!
//! # Deviations from upstream
//!
//! - **Ambient decision in the agent.** Upstream's plugin asks the API server whether a pod
//!   is ambient and POSTs `/cmdadd` only for ambient pods; ours POSTs for every pod that is
//!   not excluded (self-pod, empty name, `exclude_namespaces`) and the agent answers 200
//!   without enrolling non-ambient pods (upstream answers 500 "not eligible"). There is no
//!   API server in the embedded mesh; the agent knows every pod from its [`PodSource`].
//!   Still fail closed: agent unreachable or non-200 fails the ADD.
//! - **No silent bypass.** A verification pass (every `AMBIT_VERIFY_INTERVAL`, default
//!   10 s, and after every ZDS snapshot) re-checks each enrolled pod's rules
//!   (`InPod::verify_in`) and ztunnel's 15001/15006/15008 listeners in its netns, repairs
//!   (re-apply with reconcile; `Del`+`Add` to ztunnel) and exports
//!   `ambit_enrolled_unprotected_pods` / `ambit_pod_repairs_total`.
//! - **ZDS liveness** is watched continuously instead of a 5 s idle probe (same
//!   classification: EOF = closed, data = protocol error), see [`zds`].
//! - **Netns hint.** [`pods::Pod::netns`] lets a local source name a pod's netns so the
//!   informer path can enrol running pods without a `/proc` scan.
//! - **Paths.** `/host` is not hard-coded: `AMBIT_HOST_PREFIX` (default none) and
//!   `AMBIT_HOST_NETNS` choose where netns paths and the host netns are (see [`config`]).
//! - **Probe set at startup** is resynced, never flushed: running pods' probes keep being
//!   SNATed through an agent restart (see `daemon/restart.rs`).
//! - **Shutdown decision**: [`shutdown::UninstallCheck`]; with the Kubernetes pod source
//!   upstream's DaemonSet lookup ([`pods::kube_daemonset`]); without an API server upgrade
//!   by default, `AMBIENT_DISABLE_SAFE_UPGRADE` uninstall.
//! - **Installer** (see [`installer`]): polls every `AMBIT_INSTALL_CHECK_INTERVAL` (1 s)
//!   instead of inotify; steps with no configured directory are skipped (bin dir and conf
//!   dir default to `AMBIT_HOST_PREFIX` + upstream's paths, none without a prefix); the
//!   kubeconfig is only written inside a pod (`KUBERNETES_SERVICE_HOST`), because ambit's
//!   plugin never reads it; `AMBIENT_ENABLED` defaults to true;
//!   `istio_cni_installs_total` counts passes that (re)installed something and failure
//!   episodes (a failure repeating every pass counts once).
//! - **Not implemented yet:** the plugin's rolling log file.

#![forbid(unsafe_code)]

#[cfg(unix)]
pub mod config;
pub mod enrol;
pub mod hold;
pub mod monitoring;
pub mod platform;
pub mod pods;
pub mod zds;

// The platform switch: the Linux agent, and the Windows node's parts.
#[cfg(unix)]
pub mod daemon;
#[cfg(unix)]
pub mod discovery;
#[cfg(unix)]
pub mod installer;
#[cfg(unix)]
pub mod plugin;
#[cfg(unix)]
pub mod shutdown;
#[cfg(all(unix, any(test, feature = "testing")))]
pub mod testing;
pub mod windows;

#[cfg(unix)]
pub use config::{AgentConfig, ConfigError};
#[cfg(unix)]
pub use daemon::{AgentError, AgentHandle, run_agent, run_agent_with, start};
#[cfg(unix)]
pub use plugin::plugin_main;
pub use pods::{LocalPodSource, PodSource};
