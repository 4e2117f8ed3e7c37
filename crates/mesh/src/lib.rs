//! The embedded mesh (`ambit up`, `design.md` §3): a whole ambient mesh on one Linux machine
//! from a directory of Kubernetes manifests. Nodes and pods are network namespaces
//! (`ambit-topology`); the control plane, and per node a CNI agent and a shared-mode
//! ztunnel, run as separate `ambit` processes talking their production protocols; every pod
//! is created through the CNI plugin executable, then runs its first container's command as
//! a real process inside its namespace. Nothing is short-circuited in-process.
//!
//! | module | owns |
//! |---|---|
//! | [`manifests`] | loading and checking the user's documents; the generated manifests |
//! | [`state`] | the run directory and `state.json` (prefix, processes, nodes, pods) |
//! | [`process`] | starting children in their own process group, pid identity, stopping |
//! | [`up`] | [`Mesh`]: bring-up step by step, teardown on shutdown or drop |
//! | [`down`] | removal from the run directory alone (also after the orchestrator died) |
//! | [`status`] | recorded state + live readiness and certificates |
//! | [`exec`] | a command inside a pod's netns with its env |
//! | [`logs`] | which log file belongs to a component |
//! | [`ztunnel_config`] | a ztunnel's `/config_dump` and its tables |
//! | [`apply`] | `ambit apply -f` / `delete -f` on a running mesh ([`Mesh::apply`]) |
//! | [`api`] | the orchestrator's request socket `api.sock` (server and client) |
//! | [`pod_source`] | the node agents' pod source: a watched manifest directory, annotations to files |
//! | [`restart`] | running a node's ztunnel or agent again from its recorded command |
//! | [`supervise`] | restarting what exits on its own (kubelet's `restartPolicy: Always`) |
//! | [`vm`] | VMs (`kind: VirtualMachine`): a namespace on the node network, its bundle, `ambit vm up`, its command |
//! | `probe` | TCP/HTTP from inside a namespace |
//!
//! Layout of a run directory: `state.json`; `api.sock`; `manifests/mesh.yaml` (what `ambit
//! control` watches); `control/` (CA root); `tokens.yaml`;
//! `nodes/NODE/{ztunnel.sock, cni/, pods/, status/}` (`status/` holds the agent's
//! redirection annotations);
//! `pods/NAME.NAMESPACE/` (a pod's working directory);
//! `vms/vm.NAME.NAMESPACE/{bundle/, run/}` (a VM's bundle and `vm up`'s run directory; the
//! VM command's working directory); `logs/` (kept after `down`).
//!
//! This crate touches `nix` only for signals to recorded pids; namespaces go through
//! `ambit-netns` and `ambit-topology`.

// Network namespaces, veths and processes in them: Linux only (an empty crate elsewhere).
#![cfg(target_os = "linux")]
#![forbid(unsafe_code)]

pub mod api;
pub mod apply;
pub mod down;
pub mod exec;
pub mod logs;
pub mod manifests;
pub mod pod_source;
mod probe;
pub mod process;
pub mod restart;
pub mod state;
pub mod status;
pub mod supervise;
pub mod up;
pub mod vm;
pub mod ztunnel_config;

pub use apply::ApplyError;
pub use down::{DownError, DownReport, down};
pub use manifests::{ManifestError, Manifests};
pub use state::{MeshState, RunDir};
pub use status::{Status, status};
pub use up::{Mesh, UpConfig, UpError};
