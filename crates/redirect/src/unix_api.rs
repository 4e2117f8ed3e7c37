//! The crate's Unix entry points (re-exported at its root).

use crate::{iptables, nft};

pub use crate::apply::{ApplyError, ApplyOutcome, Finding, Location, VerifyReport};
pub use crate::config::{
    Backend, ConfigError, Family, HostRulesConfig, IfaceName, PodRedirectConfig,
};
pub use crate::host::HostRules;
pub use crate::kernel::KernelError;
pub use crate::kernel::guard::Guard;
pub use crate::kernel::sock_diag::{listening_tcp_ports, tcp_listeners_at};
pub use crate::kernel::watch::{Drained, RulesetWatch};
pub use crate::pod::{InPod, RulesMark, VerifyMemo, Visit};
pub use crate::probe_set::{ProbeSet, ProbeSetError};
pub use crate::runner::{
    Cmd, CmdOutput, CurrentNetns, FdRunner, HostRunner, IpNetnsExec, NetnsRunner, Nsenter, RunError,
};
pub use crate::vm::{VmRedirectConfig, VmRules};

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
