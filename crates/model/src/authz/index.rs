//! Candidate policies for one connection, found by lookups whose number does not grow with
//! the number of policies.
//!
//! A policy matches only if one of its rules does; a rule only if all its clauses do; a
//! clause only if one of its non-empty match objects does; a match object only if each of
//! its positive fields has an entry that matches (`eval.rs`). So a match object whose
//! positive field lists exact values (principals, service accounts, exact namespaces,
//! ports, address ranges) can only match a connection that has one of those values: each
//! value is an [`Anchor`], and the anchors of a policy are the union over its rules of the
//! anchors of one clause per rule. A connection's own anchors (its principal, namespace,
//! service account, port, and its addresses masked to each prefix length in use) are
//! looked up; the policies found, plus those without anchors (a rule or clause that
//! matches everything, or only negative or pattern fields), are every policy that can
//! match. Evaluating just those, in the original order, gives the same decision as
//! evaluating all (`PolicySet::evaluate` adds the one fact that needs all of them: whether
//! any ALLOW policy applies).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::eval::Connection;
use super::{Action, Authorization, Clause, Match, Rule, StringMatch};
use crate::addr::Cidr;
use crate::names::PolicyKey;

/// A value a connection must have for some match object to match it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Anchor {
    /// The source identity without `spiffe://`.
    Principal(String),
    /// The source namespace ("" for plaintext, as evaluation compares it).
    Namespace(String),
    /// Source namespace and service account.
    ServiceAccount(String, String),
    /// Destination port.
    DstPort(u16),
    /// Source address range, host bits cleared.
    SrcNet(IpNet),
    /// Destination address range, host bits cleared.
    DstNet(IpNet),
}

fn net(c: &Cidr) -> IpNet {
    c.as_ipnet().trunc()
}

/// The anchors of one match object: those of its most selective positive field whose every
/// entry is an exact value; `None` when it has no such field.
fn match_anchors(m: &Match) -> Option<Vec<Anchor>> {
    let exact = |list: &[StringMatch], anchor: fn(String) -> Anchor| -> Option<Vec<Anchor>> {
        if list.is_empty() {
            return None;
        }
        list.iter()
            .map(|s| match s {
                StringMatch::Exact(v) => Some(anchor(v.clone())),
                _ => None,
            })
            .collect()
    };
    let nonempty = |v: Vec<Anchor>| (!v.is_empty()).then_some(v);
    exact(&m.principals, Anchor::Principal)
        .or_else(|| {
            nonempty(
                m.service_accounts
                    .iter()
                    .map(|sa| {
                        Anchor::ServiceAccount(sa.namespace.clone(), sa.service_account.clone())
                    })
                    .collect(),
            )
        })
        .or_else(|| exact(&m.namespaces, Anchor::Namespace))
        .or_else(|| {
            nonempty(
                m.source_ips
                    .iter()
                    .map(|c| Anchor::SrcNet(net(c)))
                    .collect(),
            )
        })
        .or_else(|| {
            nonempty(
                m.destination_ports
                    .iter()
                    .map(|p| Anchor::DstPort(*p))
                    .collect(),
            )
        })
        .or_else(|| {
            nonempty(
                m.destination_ips
                    .iter()
                    .map(|c| Anchor::DstNet(net(c)))
                    .collect(),
            )
        })
}

/// A clause matches if any non-empty match object does (an empty clause always matches:
/// `None`; one whose match objects are all empty never does: no anchors).
fn clause_anchors(c: &Clause) -> Option<Vec<Anchor>> {
    if c.matches.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    for m in c.matches.iter().filter(|m| !m.is_empty()) {
        out.extend(match_anchors(m)?);
    }
    Some(out)
}

/// A rule matches only if every clause does: the anchors of its clause with the fewest
/// (`None` when no clause has anchors, e.g. a rule without clauses, which matches all).
fn rule_anchors(r: &Rule) -> Option<Vec<Anchor>> {
    r.clauses
        .iter()
        .filter_map(clause_anchors)
        .min_by_key(Vec::len)
}

/// The anchors of a policy (`None`: it may match any connection). A policy without rules
/// never matches and has no anchors.
fn policy_anchors(p: &Authorization) -> Option<Vec<Anchor>> {
    let mut out = Vec::new();
    for r in &p.rules {
        out.extend(rule_anchors(r)?);
    }
    Some(out)
}

/// Policies by key, in evaluation order.
pub(super) type Ordered = BTreeMap<PolicyKey, Arc<Authorization>>;

/// One group of policies that apply together (one namespace's, or the global ones), with
/// the index that finds the candidates for a connection.
#[derive(Debug, Default, Clone)]
pub(super) struct Group {
    all: Ordered,
    by_anchor: HashMap<Anchor, Ordered>,
    /// Policies without anchors: candidates for every connection.
    unanchored: Ordered,
    /// How many anchors use each prefix length, per direction and family (`true`: IPv6).
    src_lens: BTreeMap<(bool, u8), usize>,
    dst_lens: BTreeMap<(bool, u8), usize>,
    /// Non-dry-run ALLOW policies in the group.
    allows: usize,
}

fn is_allow(p: &Authorization) -> bool {
    p.action == Action::Allow && !p.dry_run
}

impl Group {
    pub(super) fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// Every policy of the group, in evaluation order.
    pub(super) fn all(&self) -> &Ordered {
        &self.all
    }

    /// Whether a non-dry-run ALLOW policy is in the group (candidate or not).
    pub(super) fn has_allow(&self) -> bool {
        self.allows > 0
    }

    pub(super) fn insert(&mut self, p: Arc<Authorization>) {
        let key = p.key.clone();
        self.remove(&key);
        if is_allow(&p) {
            self.allows += 1;
        }
        match policy_anchors(&p) {
            None => {
                self.unanchored.insert(key.clone(), Arc::clone(&p));
            }
            Some(anchors) => {
                for a in anchors {
                    self.count_len(&a, 1);
                    self.by_anchor
                        .entry(a)
                        .or_default()
                        .insert(key.clone(), Arc::clone(&p));
                }
            }
        }
        self.all.insert(key, p);
    }

    pub(super) fn remove(&mut self, key: &PolicyKey) -> Option<Arc<Authorization>> {
        let old = self.all.remove(key)?;
        if is_allow(&old) {
            self.allows -= 1;
        }
        match policy_anchors(&old) {
            None => {
                self.unanchored.remove(key);
            }
            Some(anchors) => {
                for a in anchors {
                    self.count_len(&a, -1);
                    if let Some(set) = self.by_anchor.get_mut(&a) {
                        set.remove(key);
                        if set.is_empty() {
                            self.by_anchor.remove(&a);
                        }
                    }
                }
            }
        }
        Some(old)
    }

    fn count_len(&mut self, a: &Anchor, delta: isize) {
        let (lens, n) = match a {
            Anchor::SrcNet(n) => (&mut self.src_lens, n),
            Anchor::DstNet(n) => (&mut self.dst_lens, n),
            _ => return,
        };
        let k = (matches!(n, IpNet::V6(_)), n.prefix_len());
        let c = lens.entry(k).or_default();
        *c = c.saturating_add_signed(delta);
        if *c == 0 {
            lens.remove(&k);
        }
    }

    /// The policies of the group that can match `conn`, in evaluation order.
    pub(super) fn candidates<'s>(&'s self, conn: &Connection) -> Vec<&'s Arc<Authorization>> {
        let mut out: Vec<&Arc<Authorization>> = self.unanchored.values().collect();
        let mut add = |a: Anchor| {
            if let Some(set) = self.by_anchor.get(&a) {
                out.extend(set.values());
            }
        };
        match &conn.src_identity {
            Some(id) => {
                add(Anchor::Principal(id.principal()));
                add(Anchor::Namespace(id.namespace().to_owned()));
                add(Anchor::ServiceAccount(
                    id.namespace().to_owned(),
                    id.service_account().to_owned(),
                ));
            }
            None => add(Anchor::Namespace(String::new())),
        }
        add(Anchor::DstPort(conn.dst_port));
        for (ip, lens, anchor) in [
            (
                conn.src_ip,
                &self.src_lens,
                Anchor::SrcNet as fn(IpNet) -> Anchor,
            ),
            (conn.dst_ip, &self.dst_lens, Anchor::DstNet),
        ] {
            // Ranges are compared with the address a mapped IPv4 peer carries (`Cidr::contains`).
            let ip = ip.to_canonical();
            let v6 = matches!(ip, IpAddr::V6(_));
            for &(fam, len) in lens.keys() {
                if fam == v6
                    && let Ok(n) = IpNet::new(ip, len)
                {
                    add(anchor(n.trunc()));
                }
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out.dedup_by(|a, b| Arc::ptr_eq(a, b));
        out
    }
}

#[cfg(test)]
mod tests;
