//! Host-netns rules that SNAT kubelet probes to enrolled pods (`spec/cni.md` §3.8, §3.9).
//!
//! The rules match on the probe set, so [`crate::ProbeSet::ensure`] must run first.

use crate::apply::{ApplyError, VerifyReport, nftables, xtables};
use crate::config::{Backend, HostRulesConfig};
use crate::consts::NFT_NAT_TABLE;
use crate::iptables::{host_delete_commands, host_rules};
use crate::nft::{host_flush_transaction, host_table, host_transaction};
use crate::runner::NetnsRunner;

/// The host rules of one node.
#[derive(Debug, Clone)]
pub struct HostRules {
    /// iptables or nftables.
    pub backend: Backend,
    /// Content.
    pub config: HostRulesConfig,
}

impl HostRules {
    /// Write the rules. Host rules are never reconciled: whatever is there is deleted and
    /// the rules are created again (iptables), or the table is flushed and rewritten in one
    /// transaction that leaves the probe sets alone (nftables).
    pub fn apply(&self, r: &dyn NetnsRunner) -> Result<(), ApplyError> {
        match self.backend {
            Backend::Iptables => {
                for &family in self.config.families() {
                    xtables::delete(r, &host_delete_commands(family))?;
                    xtables::restore(r, family, &host_rules(&self.config, family))?;
                }
                Ok(())
            }
            Backend::Nftables => {
                nftables::run_tx(r, &host_transaction(&self.config), "nft host rules")
            }
        }
    }

    /// Compare the kernel's host rules with the plan.
    pub fn verify(&self, r: &dyn NetnsRunner) -> Result<VerifyReport, ApplyError> {
        let findings = match self.backend {
            Backend::Iptables => {
                let mut f = Vec::new();
                for &family in self.config.families() {
                    f.extend(xtables::verify(
                        r,
                        family,
                        &host_rules(&self.config, family),
                    )?);
                }
                f
            }
            Backend::Nftables => {
                nftables::verify(r, &[host_table(&self.config)], &[NFT_NAT_TABLE])?
            }
        };
        Ok(VerifyReport { findings })
    }

    /// Remove the rules (shutdown). nftables keeps the table and its probe sets; the set
    /// manager ([`crate::ProbeSet::destroy`]) removes them.
    pub fn delete(&self, r: &dyn NetnsRunner) -> Result<(), ApplyError> {
        match self.backend {
            Backend::Iptables => {
                for &family in self.config.families() {
                    xtables::delete(r, &host_delete_commands(family))?;
                }
                Ok(())
            }
            Backend::Nftables => nftables::run_tx(r, &host_flush_transaction(), "nft host flush"),
        }
    }
}
