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
//! Applying, verifying and deleting run external tools (`iptables-restore`, `nft`, `ip`,
//! `ipset`) inside a network namespace through the [`NetnsRunner`] abstraction; the crate never
//! builds shell strings. [`InPod`] and [`HostRules`] are the entry points the agent uses.
//! The agent's periodic check of every enrolled pod, [`InPod::verify_in`], reads the kernel
//! in-process instead (netlink, `/proc/sys`) and starts rule tools only when a pod's rules
//! changed, so its cost does not grow by a process per pod.

#![forbid(unsafe_code)]

mod apply;
pub mod config;
pub mod consts;
pub mod host;
pub mod iptables;
mod kernel;
pub mod netlink;
pub mod nft;
pub mod pod;
pub mod probe_set;
pub mod runner;
pub mod vm;

pub use apply::{ApplyError, ApplyOutcome, Finding, Location, VerifyReport};
pub use config::{Backend, ConfigError, Family, HostRulesConfig, IfaceName, PodRedirectConfig};
pub use host::HostRules;
pub use kernel::KernelError;
pub use kernel::guard::Guard;
pub use kernel::watch::{Drained, RulesetWatch};
pub use pod::{InPod, VerifyMemo};
pub use probe_set::{ProbeSet, ProbeSetError};
pub use runner::{
    Cmd, CmdOutput, CurrentNetns, FdRunner, HostRunner, IpNetnsExec, NetnsRunner, Nsenter, RunError,
};
pub use vm::{VmRedirectConfig, VmRules};

/// The in-pod `iptables-restore --noflush` input for one family (`spec/cni.md` §3.2, §3.3).
pub fn render_iptables(cfg: &PodRedirectConfig, family: Family) -> String {
    iptables::pod_rules(cfg, family).render_restore()
}

/// The in-pod `nft -f -` transaction (`spec/cni.md` §3.7).
pub fn render_nft(cfg: &PodRedirectConfig) -> String {
    nft::pod_transaction(cfg).render()
}

/// The host `iptables-restore --noflush` input for one family (`spec/cni.md` §3.8).
pub fn render_host_iptables(cfg: &HostRulesConfig, family: Family) -> String {
    iptables::host_rules(cfg, family).render_restore()
}

/// The host `nft -f -` rule transaction (`spec/cni.md` §3.9).
pub fn render_host_nft(cfg: &HostRulesConfig) -> String {
    nft::host_transaction(cfg).render()
}
