//! Applying, verifying and deleting rule plans inside a netns, shared by [`crate::InPod`] and
//! [`crate::HostRules`].
//!
//! Verification asks the kernel, not our own text: iptables presence is decided by
//! `iptables -C` per planned rule plus per-chain counts from `iptables-save`; nftables by the
//! chains, hooks and rule counts `nft list table` reports. The result is a typed
//! [`VerifyReport`].

pub(crate) mod nftables;
pub(crate) mod routes;
pub(crate) mod xtables;

use std::fmt;

use crate::config::Family;
use crate::netlink::NetlinkItem;
use crate::runner::RunError;

/// Failure applying, verifying or deleting rules.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// A required command failed; `step` says which part of the procedure.
    #[error("{step}: {source}")]
    Command {
        /// What we were doing.
        step: &'static str,
        /// The command's failure.
        #[source]
        source: RunError,
    },
}

pub(crate) fn step(step: &'static str) -> impl FnOnce(RunError) -> ApplyError {
    move |source| ApplyError::Command { step, source }
}

/// What an apply did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// No rules were present; they were written.
    Applied,
    /// The planned rules were already present exactly; nothing was written.
    Unchanged,
    /// Stale or partial rules were found, removed under guardrails and rewritten.
    Reconciled,
    /// Stale rules were found with reconcile disabled; the plan was written on top.
    AppliedOnTop,
}

/// Where a finding is: family (iptables only), table, chain.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Location {
    /// `Some` for iptables (`iptables` vs `ip6tables`), `None` for nft `inet` tables.
    pub family: Option<Family>,
    /// Table name.
    pub table: String,
    /// Chain name (empty for table-level findings).
    pub chain: String,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(fam) = self.family {
            write!(f, "{fam:?} ")?;
        }
        write!(f, "{}/{}", self.table, self.chain)
    }
}

/// One difference between the plan and what the kernel reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// A planned nft table does not exist.
    MissingTable(Location),
    /// An nft table exists that the plan does not have (e.g. raw with DNS capture off).
    ExtraTable(Location),
    /// A planned chain does not exist.
    MissingChain(Location),
    /// An `ISTIO_*` chain (or a chain in our nft table) that the plan does not have.
    ExtraChain(Location),
    /// A planned rule the kernel does not have (`iptables -C` failed).
    MissingRule {
        /// Where.
        at: Location,
        /// The planned rule, as restore/transaction text.
        rule: String,
    },
    /// A rule in one of our chains, or a jump to one, that the plan does not have.
    ExtraRule {
        /// Where.
        at: Location,
        /// The rule as the kernel lists it, when it could be singled out.
        rule: Option<String>,
    },
    /// An nft chain holds a different number of rules than planned.
    RuleCount {
        /// Where.
        at: Location,
        /// Planned.
        expected: usize,
        /// Listed.
        found: usize,
    },
    /// An nft base chain is attached to another hook than planned.
    WrongHook {
        /// Where.
        at: Location,
        /// Planned hook.
        expected: String,
        /// Listed hook (None: not a base chain).
        found: Option<String>,
    },
    /// Policy-routing state is missing.
    MissingNetlink(NetlinkItem),
}

/// The result of a verification: empty means the kernel state matches the plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Every difference found.
    pub findings: Vec<Finding>,
}

impl VerifyReport {
    /// Nothing missing, nothing extra.
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }

    /// Findings that mean protection is incomplete (something planned is absent).
    pub fn missing(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| {
            matches!(
                f,
                Finding::MissingTable(_)
                    | Finding::MissingChain(_)
                    | Finding::MissingRule { .. }
                    | Finding::MissingNetlink(_)
                    | Finding::WrongHook { .. }
            ) || matches!(f, Finding::RuleCount { expected, found, .. } if found < expected)
        })
    }

    /// Findings about state that is present but not planned.
    pub fn extra(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| {
            matches!(
                f,
                Finding::ExtraTable(_) | Finding::ExtraChain(_) | Finding::ExtraRule { .. }
            ) || matches!(f, Finding::RuleCount { expected, found, .. } if found > expected)
        })
    }
}
