//! Verification of a pod without a process per pod: the same findings as
//! [`InPod::verify`], read in-process (`crate::kernel`) wherever the kernel can tell us
//! directly.
//!
//! - Policy routing (§3.1): rtnetlink dumps, judged with the same predicates as the `ip`
//!   listings; the IPv6 route's precondition (`lo` has IPv6) from `/proc/sys` inside the
//!   namespace.
//! - nftables backend: the chains, hooks and rule counts `nft list table` reports, from an
//!   nfnetlink dump.
//! - iptables backend: the rule tools stay the judges (`iptables-save` and `iptables -C`,
//!   the kernel's own semantic comparison), but they run only for a family's nf_tables
//!   ruleset (where the nf_tables variant of iptables keeps its rules) that reads
//!   differently from every ruleset they already judged against the same plan. The tools
//!   read nothing but that ruleset, so the same rules (same tables, chains and rules,
//!   handles and packet counters aside) get the same verdict in any namespace, at any
//!   generation: it is reused ([`VerifyMemo`], one for all of a node's pods, so pods
//!   enrolled with the same rules cost one run of the tools between them). With the
//!   legacy variant (its rules are not in nf_tables) the tools run every time.
//!
//! Whenever an in-process read fails, the whole check falls back to [`InPod::verify`].
//!
//! Between passes most pods do not change at all. A pod's [`RulesMark`] remembers the
//! nf_tables generation of its namespace at the last visit that found its rules complete
//! and judged entirely from nf_tables; the kernel moves that generation on every commit in
//! the namespace (any table, any family, even a change and its undo), so while it reads
//! the same the rulesets are not dumped again (the dumps and their decoding were most of
//! a pass's cost at 1,000 pods). Routing and the sysctl have no such counter: they are
//! read every time.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use ambit_netns::NetnsFd;

use super::InPod;
use crate::apply::{ApplyError, Finding, VerifyReport, nftables, xtables};
use crate::config::{Backend, Family};
use crate::consts::{NFT_MANGLE_TABLE, NFT_NAT_TABLE, NFT_RAW_TABLE};
use crate::iptables::{RuleSet, pod_rules};
use crate::kernel::guard::{Guard, GuardPlan, probe_addresses};
use crate::kernel::nft::{self, NftFamily, Ruleset};
use crate::kernel::rtnl::Routing;
use crate::kernel::socket::Netlink;
use crate::kernel::{self, KernelError};
use crate::netlink::{LO_DISABLE_IPV6, NetlinkItem};
use crate::nft::pod_tables;
use crate::runner::NetnsRunner;
use netlink_sys::protocols::NETLINK_NETFILTER;

/// Verdicts of the rule tools on pod rulesets, reusable for any pod whose ruleset reads
/// the same (see the module docs). One can serve all of a node's pods (it locks itself
/// for the moment of a lookup or an insertion, never while the tools run); at most
/// [`VerifyMemo::CAPACITY`] verdicts are kept, the least recently used goes first.
#[derive(Debug, Default)]
pub struct VerifyMemo {
    xtables: Mutex<VecDeque<Verdict>>,
}

/// One family's verdict on one ruleset, for one plan.
#[derive(Debug)]
struct Verdict {
    family: Family,
    plan: RuleSet,
    seen: Ruleset,
    findings: Vec<Finding>,
}

impl VerifyMemo {
    /// Verdicts kept at most: distinct (plan, ruleset) pairs a node's pods show at once.
    /// Pods enrolled alike share one per family; a pod whose rules differ from all others
    /// (its app added rules of its own) needs one of its own to stay free.
    pub const CAPACITY: usize = 2048;

    /// How many verdicts are kept (for tests and logs).
    pub fn verdicts(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Verdict>> {
        // A panic elsewhere cannot leave a half-made verdict: entries are pushed whole.
        self.xtables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The findings the tools gave for the same rules under the same plan, if any; the
    /// verdict becomes the most recently used.
    fn reuse(&self, family: Family, plan: &RuleSet, now: &Ruleset) -> Option<Vec<Finding>> {
        let mut all = self.lock();
        let i = all
            .iter()
            .position(|v| v.family == family && v.seen.same_rules(now) && v.plan == *plan)?;
        let v = all.remove(i)?;
        let found = v.findings.clone();
        all.push_front(v);
        Some(found)
    }

    fn remember(&self, verdict: Verdict) {
        let mut all = self.lock();
        all.retain(|v| {
            !(v.family == verdict.family
                && v.plan == verdict.plan
                && v.seen.same_rules(&verdict.seen))
        });
        all.push_front(verdict);
        all.truncate(Self::CAPACITY);
    }
}

/// Per enrolled pod: the nf_tables generation of its namespace at the last visit of
/// [`InPod::verify_here`] that found its rules complete, judged from nf_tables alone (not
/// with the legacy iptables variant, not by a fallback to the tools). Meaningful only for
/// the one [`InPod`] and namespace it was used with: give a re-enrolled pod a new one.
#[derive(Debug)]
pub struct RulesMark(AtomicU64);

/// No generation marked (generations are `u32`).
const UNMARKED: u64 = u64::MAX;

impl Default for RulesMark {
    fn default() -> Self {
        Self(AtomicU64::new(UNMARKED))
    }
}

impl RulesMark {
    /// Forgets the mark: the next visit reads everything. For a caller whose own check of
    /// the same nf_tables state failed (the agent's standby guard table), so that an
    /// unchanged generation does not stand for a state it found wrong.
    pub fn clear(&self) {
        self.0.store(UNMARKED, Ordering::Relaxed);
    }

    fn get(&self) -> Option<u32> {
        u32::try_from(self.0.load(Ordering::Relaxed)).ok()
    }

    fn set(&self, generation: u32) {
        self.0.store(u64::from(generation), Ordering::Relaxed);
    }
}

/// What one [`InPod::verify_here`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Visit {
    /// The same findings as [`InPod::verify`].
    pub report: VerifyReport,
    /// The namespace's nf_tables state is the one the mark was set at, so its rulesets were
    /// not read again; everything else was.
    pub unchanged: bool,
}

fn nft_family(family: Family) -> NftFamily {
    match family {
        Family::V4 => NftFamily::Ip,
        Family::V6 => NftFamily::Ip6,
    }
}

/// Everything read in one visit to the namespace.
#[derive(Debug)]
struct Snapshot {
    routing: Routing,
    /// `Some` when IPv6 is configured: the `lo` sysctl, `None` if unreadable.
    lo_disable_ipv6: Option<Option<String>>,
    /// The nf_tables generation, read before anything else.
    generation: u32,
    /// nftables backend: the `inet` family; iptables: one per configured family. `None`:
    /// not read, the generation is the marked one.
    rulesets: Option<Vec<(Option<Family>, Ruleset)>>,
}

/// Findings about the rules, and whether they may be marked (see [`RulesMark`]).
struct Judged {
    findings: Vec<Finding>,
    markable: bool,
}

impl InPod {
    /// After a repair: deletes the conntrack entries in `netns` of flows that went around
    /// the rules while they were missing, so they cannot keep bypassing (which entries:
    /// the `kernel::conntrack` module docs); the number deleted. Ingress mode leaves
    /// inbound traffic unredirected by design and is not cleaned.
    pub fn flush_bypassed_conntrack(&self, netns: &NetnsFd) -> Result<usize, KernelError> {
        if self.config.ingress_mode {
            return Ok(0);
        }
        let snat = [
            std::net::IpAddr::V4(self.config.probe_snat_v4),
            std::net::IpAddr::V6(self.config.probe_snat_v6),
        ];
        kernel::read_in(netns, || kernel::conntrack::flush_bypassed(&snat))
    }

    /// Installs the pod's fail-closed guard in `netns` (see `kernel::guard`): while the
    /// returned value lives, TCP leaving the pod by any interface but `lo` that is not
    /// ztunnel's (or an answer to a kubelet probe) is dropped, whatever happens to the
    /// redirection rules; after it is dropped (the agent exits) the standby table keeps
    /// dropping until [`Guard::remove_standby`]. `None` in ingress mode (inbound is
    /// unredirected by design there, so the app answers its peers directly) and with
    /// virtual interfaces (traffic forwarded for a VM behind them takes paths the guard
    /// does not model; not measured); then a standby table left from when the pod was
    /// guarded is removed.
    pub fn guard(&self, netns: &NetnsFd) -> Result<Option<Guard>, KernelError> {
        if self.config.ingress_mode || !self.config.virtual_interfaces.is_empty() {
            Guard::remove_standby_in(netns)?;
            return Ok(None);
        }
        let plan = GuardPlan {
            probe_snat: probe_addresses(self.config.probe_snat_v4, self.config.probe_snat_v6),
        };
        Guard::install(netns, &plan).map(Some)
    }

    /// [`Self::verify`] with in-process reads: same findings, in the same order; rule
    /// tools run only for an iptables family whose ruleset reads unlike every one `memo`
    /// holds a verdict on for the same plan (see the module docs). `runner` must run in
    /// `netns`.
    pub fn verify_in(
        &self,
        netns: &NetnsFd,
        runner: &dyn NetnsRunner,
        memo: &VerifyMemo,
    ) -> Result<VerifyReport, ApplyError> {
        let snap = match kernel::read_in(netns, || self.snapshot(None)) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "in-process read failed; verifying with the rule tools");
                return self.verify(runner);
            }
        };
        let reread = |f| kernel::read_in(netns, || Ruleset::read(nft_family(f)));
        let rules = self.judge(&snap, runner, memo, reread)?;
        Ok(self.report(&snap, rules.findings))
    }

    /// [`Self::verify_in`] on the calling thread, which must be inside the pod's namespace
    /// (`runner` must run there too): for a caller that visits each pod once per pass for
    /// several reads. With the rulesets unchanged since `mark` was set they are not read
    /// again ([`Visit::unchanged`]); `mark` is set or cleared by what this visit found.
    pub fn verify_here(
        &self,
        runner: &dyn NetnsRunner,
        memo: &VerifyMemo,
        mark: &RulesMark,
    ) -> Result<Visit, ApplyError> {
        let snap = match self.snapshot(mark.get()) {
            Ok(s) => s,
            Err(e) => {
                mark.clear();
                tracing::debug!(error = %e, "in-process read failed; verifying with the rule tools");
                return Ok(Visit {
                    report: self.verify(runner)?,
                    unchanged: false,
                });
            }
        };
        if snap.rulesets.is_none() {
            return Ok(Visit {
                report: self.report(&snap, Vec::new()),
                unchanged: true,
            });
        }
        let rules = self.judge(&snap, runner, memo, |f| Ruleset::read(nft_family(f)));
        let rules = match rules {
            Ok(r) => r,
            Err(e) => {
                mark.clear();
                return Err(e);
            }
        };
        if rules.markable && rules.findings.is_empty() {
            mark.set(snap.generation);
        } else {
            mark.clear();
        }
        Ok(Visit {
            report: self.report(&snap, rules.findings),
            unchanged: false,
        })
    }

    /// Judges the rulesets of `snap` (which must hold them); `reread` reads a family's
    /// ruleset in the pod's namespace again, after the tools ran.
    fn judge(
        &self,
        snap: &Snapshot,
        runner: &dyn NetnsRunner,
        memo: &VerifyMemo,
        reread: impl Fn(Family) -> Result<Ruleset, KernelError>,
    ) -> Result<Judged, ApplyError> {
        let rulesets = snap.rulesets.as_deref().unwrap_or_default();
        // Every ruleset read at the generation read first: nothing was committed between.
        let mut markable = rulesets
            .iter()
            .all(|(_, r)| r.generation() == snap.generation);
        let findings = match self.backend {
            Backend::Iptables => {
                let mut f = Vec::new();
                for (family, seen) in rulesets {
                    let Some(family) = *family else { continue };
                    let plan = pod_rules(&self.config, family);
                    if let Some(found) = memo.reuse(family, &plan, seen) {
                        f.extend(found);
                        continue;
                    }
                    let (found, nf_tables) = xtables::verify_full(runner, family, &plan)?;
                    // Reusable only if the tools judged nf_tables rules and nothing changed
                    // while they ran.
                    let after = reread(family);
                    if nf_tables && after.is_ok_and(|a| a.same_state(seen)) {
                        memo.remember(Verdict {
                            family,
                            plan,
                            seen: seen.clone(),
                            findings: found.clone(),
                        });
                    } else {
                        markable = false;
                    }
                    f.extend(found);
                }
                f
            }
            Backend::Nftables => {
                let inet = rulesets.first().map(|(_, r)| r);
                nftables::verify_listed(
                    &pod_tables(&self.config),
                    &[NFT_NAT_TABLE, NFT_MANGLE_TABLE, NFT_RAW_TABLE],
                    |name| Ok(inet.and_then(|r| r.listed(name))),
                )?
            }
        };
        Ok(Judged { findings, markable })
    }

    /// The report: the rule findings, then what routing lacks.
    fn report(&self, snap: &Snapshot, mut findings: Vec<Finding>) -> VerifyReport {
        for item in NetlinkItem::all(self.config.ipv6) {
            if item == NetlinkItem::Route(Family::V6)
                && snap
                    .lo_disable_ipv6
                    .as_ref()
                    .is_some_and(|v| v.as_deref().map(str::trim) != Some("0"))
            {
                // No IPv6 on `lo`: no local route can exist, none is expected.
                continue;
            }
            if !snap.routing.has(item) {
                findings.push(Finding::MissingNetlink(item));
            }
        }
        VerifyReport { findings }
    }

    /// Runs on a thread inside the pod's namespace; the rulesets are left unread when the
    /// generation is `unchanged_since`.
    fn snapshot(&self, unchanged_since: Option<u32>) -> Result<Snapshot, KernelError> {
        let mut nl = Netlink::open(NETLINK_NETFILTER)?;
        let generation = nft::read_generation(&mut nl)?;
        let lo_disable_ipv6 = self.config.ipv6.then(|| kernel::sysctl(LO_DISABLE_IPV6));
        let routing = Routing::read(self.config.families())?;
        let rulesets = if unchanged_since == Some(generation) {
            None
        } else {
            Some(match self.backend {
                Backend::Nftables => vec![(None, Ruleset::read_on(&mut nl, NftFamily::Inet)?)],
                Backend::Iptables => self
                    .xtables_families()
                    .iter()
                    .map(|&f| Ok((Some(f), Ruleset::read_on(&mut nl, nft_family(f))?)))
                    .collect::<Result<_, KernelError>>()?,
            })
        };
        Ok(Snapshot {
            routing,
            lo_disable_ipv6,
            generation,
            rulesets,
        })
    }
}
