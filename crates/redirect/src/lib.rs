//! Redirection as data (`spec/cni.md` §3).
//!
//! This crate owns every packet-redirection rule ambit writes on a node:
//!
//! - the in-pod rules that send a pod's traffic to ztunnel ([`PodRedirectConfig`] →
//!   [`iptables::pod_rules`] / [`nft::pod_transaction`]), plus the pod's policy-routing state
//!   ([`netlink`]);
//! - the host rules that SNAT kubelet probes ([`HostRulesConfig`] → [`iptables::host_rules`] /
//!   [`nft::host_transaction`]);
//! - the host probe set of enrolled pod IPs ([`ProbeSet`]);
//! - the host-level rules of a VM or bare host running ztunnel in dedicated mode
//!   ([`VmRedirectConfig`] → [`vm::vm_rules`] / [`vm::vm_transaction`], applied by [`VmRules`]).
//!
//! Rules are typed values. Renderers turn them into exactly the text upstream istio-cni feeds to
//! `iptables-restore` / `nft -f -` (golden-file tested against the spec listings), so an ambit
//! node and an upstream node are indistinguishable in `iptables-save`.
//!
//! On Windows nodes redirection is HNS endpoint policies instead ([`hns`], platform-neutral
//! data tested on Linux; the rest of the crate is Unix-only).
//!
//! Applying, verifying and deleting run external tools (`iptables-restore`, `nft`, `ip`,
//! `ipset`) inside a network namespace through the [`NetnsRunner`] abstraction; the crate never
//! builds shell strings. [`InPod`] and [`HostRules`] are the entry points the agent uses.
//! The agent's periodic check of every enrolled pod, [`InPod::verify_in`], reads the kernel
//! in-process instead (netlink, `/proc/sys`) and starts rule tools only when a pod's rules
//! changed, so its cost does not grow by a process per pod.

#![forbid(unsafe_code)]

pub mod consts;
pub mod hns;

// The platform switch: Linux rules (rendered for iptables / nft, applied with tools run in
// a namespace held by descriptor) exist on Unix only.
#[cfg(unix)]
mod apply;
#[cfg(unix)]
pub mod config;
#[cfg(unix)]
pub mod host;
#[cfg(unix)]
pub mod iptables;
#[cfg(unix)]
mod kernel;
#[cfg(unix)]
pub mod netlink;
#[cfg(unix)]
pub mod nft;
#[cfg(unix)]
pub mod pod;
#[cfg(unix)]
pub mod probe_set;
#[cfg(unix)]
pub mod runner;
#[cfg(unix)]
#[path = "unix_api.rs"]
mod unix_api;
#[cfg(unix)]
pub mod vm;
#[cfg(unix)]
pub use unix_api::*;
