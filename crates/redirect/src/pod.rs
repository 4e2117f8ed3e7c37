//! In-pod redirection: the entry point the agent uses per pod (`spec/cni.md` §3.1–§3.7).

use crate::apply::{ApplyError, ApplyOutcome, VerifyReport, nftables, routes, xtables};
use crate::config::{Backend, Family, PodRedirectConfig};
use crate::consts::{NFT_MANGLE_TABLE, NFT_NAT_TABLE, NFT_RAW_TABLE};
use crate::iptables::{pod_delete_commands, pod_rules};
use crate::nft::{pod_delete_transaction, pod_tables, pod_transaction};
use crate::runner::NetnsRunner;

mod in_process;

pub use in_process::{RulesMark, VerifyMemo, Visit};

/// One pod's redirection: which backend writes it and what it contains.
#[derive(Debug, Clone)]
pub struct InPod {
    /// iptables or nftables.
    pub backend: Backend,
    /// The rules' content.
    pub config: PodRedirectConfig,
    /// iptables only: on finding stale/partial rules, tear down under guardrails and rewrite
    /// (`true`, upstream default) instead of writing on top.
    pub reconcile: bool,
}

impl InPod {
    /// A pod with upstream's reconcile default (on).
    pub fn new(backend: Backend, config: PodRedirectConfig) -> Self {
        Self {
            backend,
            config,
            reconcile: true,
        }
    }

    /// The families iptables rules are written for: both when IPv6 is configured, and also
    /// when it is not but the kernel has IPv6 (then the v6 rules are the
    /// [`crate::iptables::ipv6_fence`]); IPv4 alone on a kernel without IPv6.
    pub(crate) fn xtables_families(&self) -> &'static [Family] {
        if self.config.ipv6 || kernel_has_ipv6() {
            &[Family::V4, Family::V6]
        } else {
            &[Family::V4]
        }
    }

    /// Write rules and netlink state into the netns `r` runs in. Re-applying identical
    /// rules is a no-op (iptables: [`ApplyOutcome::Unchanged`]; nftables: the atomic
    /// add+flush transaction rewrites the same content).
    pub fn apply(&self, r: &dyn NetnsRunner) -> Result<ApplyOutcome, ApplyError> {
        let outcome = match self.backend {
            Backend::Iptables => {
                let mut overall = ApplyOutcome::Unchanged;
                for &family in self.xtables_families() {
                    let o = xtables::apply(
                        r,
                        family,
                        &pod_rules(&self.config, family),
                        self.reconcile,
                    )?;
                    overall = merge(overall, o);
                }
                overall
            }
            Backend::Nftables => {
                nftables::run_tx(r, &pod_transaction(&self.config), "nft apply")?;
                ApplyOutcome::Applied
            }
        };
        routes::apply(r, self.config.ipv6)?;
        Ok(outcome)
    }

    /// Compare what the kernel reports in the netns with the plan.
    pub fn verify(&self, r: &dyn NetnsRunner) -> Result<VerifyReport, ApplyError> {
        let mut findings = match self.backend {
            Backend::Iptables => {
                let mut f = Vec::new();
                for &family in self.xtables_families() {
                    f.extend(xtables::verify(
                        r,
                        family,
                        &pod_rules(&self.config, family),
                    )?);
                }
                f
            }
            Backend::Nftables => nftables::verify(
                r,
                &pod_tables(&self.config),
                &[NFT_NAT_TABLE, NFT_MANGLE_TABLE, NFT_RAW_TABLE],
            )?,
        };
        findings.extend(routes::verify(r, self.config.ipv6)?);
        Ok(VerifyReport { findings })
    }

    /// Remove the rules and the netlink state (un-enrol). Absent objects are not an error.
    pub fn delete(&self, r: &dyn NetnsRunner) -> Result<(), ApplyError> {
        match self.backend {
            Backend::Iptables => {
                for &family in self.xtables_families() {
                    xtables::delete(r, &pod_delete_commands(family))?;
                }
            }
            Backend::Nftables => {
                nftables::run_tx(r, &pod_delete_transaction(), "nft delete")?;
            }
        }
        routes::delete(r, self.config.ipv6)
    }
}

/// Whether this kernel speaks IPv6 at all (the same in every network namespace).
fn kernel_has_ipv6() -> bool {
    std::path::Path::new("/proc/sys/net/ipv6").exists()
}

/// The most significant outcome across families.
fn merge(a: ApplyOutcome, b: ApplyOutcome) -> ApplyOutcome {
    let rank = |o| match o {
        ApplyOutcome::Unchanged => 0,
        ApplyOutcome::Applied => 1,
        ApplyOutcome::AppliedOnTop => 2,
        ApplyOutcome::Reconciled => 3,
    };
    if rank(b) > rank(a) { b } else { a }
}
