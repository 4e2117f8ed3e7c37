//! Evaluation of a workload's policies against one inbound connection (spec §6).

use std::cell::OnceCell;
use std::fmt;
use std::net::IpAddr;

use super::{Action, Authorization, Clause, Match, Rule};
use crate::identity::SpiffeId;
use crate::names::PolicyKey;

/// What an inbound connection looks like to policy: the peer's verified identity (none for
/// plaintext), the peer address, and the final destination pod address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    pub src_identity: Option<SpiffeId>,
    pub src_ip: IpAddr,
    pub dst_ip: IpAddr,
    pub dst_port: u16,
}

/// Why a connection was denied. Displays as upstream ztunnel's log text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenyReason<'p> {
    /// A (non-dry-run) DENY policy matched.
    ExplicitDeny(&'p PolicyKey),
    /// ALLOW policies apply to the workload but none matched.
    NoAllowMatched,
}

impl fmt::Display for DenyReason<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DenyReason::ExplicitDeny(key) => write!(f, "explicitly denied by: {key}"),
            DenyReason::NoAllowMatched => f.write_str("allow policies exist, but none allowed"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict<'p> {
    Allow,
    Deny(DenyReason<'p>),
}

/// A dry-run policy that matched: it would have denied (DENY) or allowed (ALLOW).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DryRunMatch<'p> {
    pub policy: &'p PolicyKey,
    pub action: Action,
}

/// The outcome of evaluating policies, borrowing names from the policies (nothing is cloned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision<'p> {
    pub verdict: Verdict<'p>,
    /// Dry-run policies that matched, in evaluation order, for logging only.
    pub dry_run: Vec<DryRunMatch<'p>>,
}

impl Decision<'_> {
    pub fn is_allowed(&self) -> bool {
        self.verdict == Verdict::Allow
    }
}

/// Evaluates `policies` (all those that apply to the destination workload) against `conn`:
///
/// 1. matching dry-run DENY policies are recorded;
/// 2. any matching DENY policy denies ("explicitly denied by: ns/name");
/// 3. matching dry-run ALLOW policies are recorded;
/// 4. with no (non-dry-run) ALLOW policy the connection is allowed;
/// 5. any matching ALLOW policy allows;
/// 6. otherwise denied ("allow policies exist, but none allowed").
///
/// The iterator is walked twice (DENY, then ALLOW), hence `Clone`.
pub fn evaluate<'p, I>(policies: I, conn: &Connection) -> Decision<'p>
where
    I: IntoIterator<Item = &'p Authorization>,
    I::IntoIter: Clone,
{
    evaluate_with(policies, conn, false)
}

/// [`evaluate`] over a subset of the applicable policies that holds every one that can
/// match `conn` (in their order), with `allow_applies` telling whether a non-dry-run ALLOW
/// policy is among the ones left out: the decision is the same as over all of them.
pub(super) fn evaluate_with<'p, I>(
    policies: I,
    conn: &Connection,
    allow_applies: bool,
) -> Decision<'p>
where
    I: IntoIterator<Item = &'p Authorization>,
    I::IntoIter: Clone,
{
    let policies = policies.into_iter();
    let attrs = Attrs::new(conn);
    let mut dry_run = Vec::new();

    let mut denied_by = None;
    for policy in policies.clone().filter(|p| p.action == Action::Deny) {
        if policy.dry_run {
            if attrs.policy_matches(policy) {
                dry_run.push(DryRunMatch {
                    policy: &policy.key,
                    action: Action::Deny,
                });
            }
        } else if denied_by.is_none() && attrs.policy_matches(policy) {
            denied_by = Some(&policy.key);
        }
    }
    if let Some(key) = denied_by {
        return Decision {
            verdict: Verdict::Deny(DenyReason::ExplicitDeny(key)),
            dry_run,
        };
    }

    let mut have_allow = allow_applies;
    let mut allowed = false;
    for policy in policies.filter(|p| p.action == Action::Allow) {
        if policy.dry_run {
            if attrs.policy_matches(policy) {
                dry_run.push(DryRunMatch {
                    policy: &policy.key,
                    action: Action::Allow,
                });
            }
        } else {
            have_allow = true;
            // Once allowed, later ALLOW policies can not change the verdict: skip the work.
            allowed = allowed || attrs.policy_matches(policy);
        }
    }
    let verdict = if !have_allow || allowed {
        Verdict::Allow
    } else {
        Verdict::Deny(DenyReason::NoAllowMatched)
    };
    Decision { verdict, dry_run }
}

/// The connection's attributes in the forms matchers compare with, computed at most once.
struct Attrs<'c> {
    conn: &'c Connection,
    /// The identity without `spiffe://`, built only if some policy matches on principals.
    principal: OnceCell<Option<String>>,
}

impl<'c> Attrs<'c> {
    fn new(conn: &'c Connection) -> Self {
        Self {
            conn,
            principal: OnceCell::new(),
        }
    }

    fn principal(&self) -> Option<&str> {
        self.principal
            .get_or_init(|| self.conn.src_identity.as_ref().map(SpiffeId::principal))
            .as_deref()
    }

    /// The source namespace; empty for plaintext (no identity), as upstream compares it.
    fn namespace(&self) -> &str {
        self.conn
            .src_identity
            .as_ref()
            .map_or("", SpiffeId::namespace)
    }

    fn policy_matches(&self, policy: &Authorization) -> bool {
        // `any` over an empty rule list is false: a policy without rules never matches.
        policy.rules.iter().any(|rule| self.rule_matches(rule))
    }

    fn rule_matches(&self, rule: &Rule) -> bool {
        rule.clauses
            .iter()
            .all(|clause| self.clause_matches(clause))
    }

    fn clause_matches(&self, clause: &Clause) -> bool {
        if clause.matches.is_empty() {
            return true;
        }
        clause
            .matches
            .iter()
            .filter(|m| !m.is_empty())
            .any(|m| self.match_matches(m))
    }

    fn match_matches(&self, m: &Match) -> bool {
        let conn = self.conn;
        field(&m.destination_ips, &m.not_destination_ips, |c| {
            c.contains(conn.dst_ip)
        }) && field(&m.source_ips, &m.not_source_ips, |c| {
            c.contains(conn.src_ip)
        }) && field(&m.destination_ports, &m.not_destination_ports, |p| {
            *p == conn.dst_port
        }) && field(&m.service_accounts, &m.not_service_accounts, |sa| {
            conn.src_identity.as_ref().is_some_and(|id| sa.matches(id))
        }) && field(&m.principals, &m.not_principals, |s| {
            self.principal().is_some_and(|p| s.matches(p))
        }) && field(&m.namespaces, &m.not_namespaces, |s| {
            s.matches(self.namespace())
        })
    }
}

/// One field type: ANY of a non-empty positive list, and NONE of a non-empty negative list.
fn field<T>(positive: &[T], negative: &[T], pred: impl Fn(&T) -> bool) -> bool {
    (positive.is_empty() || positive.iter().any(&pred)) && !negative.iter().any(&pred)
}

#[cfg(test)]
mod tests;
