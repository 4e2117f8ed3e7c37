//! PeerAuthentication → DENY `Authorization`s, exactly as `spec/cni.md` §7 (ztunnel never sees
//! PeerAuthentication).
//!
//! - Effective mode of a workload: the oldest workload PeerAuthentication (same namespace,
//!   selector matching its labels), whose `UNSET` inherits the oldest namespace one (no
//!   selector), whose `UNSET` inherits the oldest mesh one (root namespace, no selector),
//!   whose `UNSET` is PERMISSIVE. "Oldest" is by `creationTimestamp` (an object without one
//!   counts as oldest, like Go's zero time), then by name. PERMISSIVE and DISABLE are both
//!   "not strict".
//! - Whenever at least one PeerAuthentication exists, `<root ns>/istio_converted_static_strict`
//!   (WORKLOAD_SELECTOR, DENY, one rule, one clause, one match `notPrincipals: [presence]`) is
//!   published; every STRICT workload lists it, unless its converted policy (below) replaces it.
//! - `converted_peer_authentication_<name>` in the PeerAuthentication's namespace, only for one
//!   outside the root namespace with a selector and `portLevelMtls`; listed by the workloads
//!   it is the effective workload PeerAuthentication of:
//!   - effective STRICT with PERMISSIVE/DISABLE ports: one rule whose clauses are
//!     `notPrincipals: [presence]` AND one `notDestinationPorts: [p]` per such port
//!     (plaintext denied except on those ports); the static policy is then not listed;
//!   - effective not STRICT with STRICT ports: one rule per strict port, with one match
//!     `{destinationPorts: [p], notPrincipals: [presence]}`;
//!   - otherwise (every port agrees with the workload mode): no converted policy.

use std::collections::BTreeMap;

use ambit_model::PolicyKey;
use ambit_model::authz::{Action, Authorization, Clause, Match, Rule, Scope, StringMatch};

use super::Cluster;
use crate::objects::Pod;
use crate::objects::security::{MtlsMode, PeerAuthentication, labels_match, selector_labels};

/// Name of the static policy denying plaintext to STRICT workloads.
pub const STATIC_STRICT_POLICY: &str = "istio_converted_static_strict";
/// Prefix of the per-PeerAuthentication converted policies.
pub const CONVERTED_PREFIX: &str = "converted_peer_authentication_";

/// The PeerAuthentications of a cluster, indexed for per-workload decisions.
#[derive(Debug)]
pub struct PeerAuthn<'c> {
    root_namespace: &'c str,
    any: bool,
    /// Oldest root-namespace PeerAuthentication without selector.
    mesh: Option<&'c PeerAuthentication>,
    /// Oldest PeerAuthentication without selector, by namespace.
    namespaces: BTreeMap<&'c str, &'c PeerAuthentication>,
    /// PeerAuthentications with a selector, oldest first.
    selectors: Vec<&'c PeerAuthentication>,
    /// Converted policies by the (namespace, name) of their PeerAuthentication.
    converted: BTreeMap<(&'c str, &'c str), Authorization>,
}

fn age_key(pa: &PeerAuthentication) -> impl Ord + '_ {
    (pa.metadata.creation_timestamp, pa.metadata.name.as_str())
}

fn is_strict(mode: MtlsMode) -> bool {
    mode == MtlsMode::Strict
}

/// `notPrincipals: [presence]`: the peer presented no mesh identity.
fn plaintext() -> Match {
    Match {
        not_principals: vec![StringMatch::Presence],
        ..Match::default()
    }
}

impl<'c> PeerAuthn<'c> {
    pub fn new(cluster: &'c Cluster) -> Self {
        let root = cluster.config.root_namespace.as_str();
        let mut all: Vec<&PeerAuthentication> =
            cluster.objects.peer_authentications.iter().collect();
        all.sort_by(|a, b| age_key(a).cmp(&age_key(b)));

        let mut namespaces = BTreeMap::new();
        let mut selectors = Vec::new();
        for pa in &all {
            if selector_labels(&pa.spec.selector).is_some() {
                selectors.push(*pa);
            } else {
                // Sorted oldest first: the first one per namespace wins.
                namespaces
                    .entry(pa.metadata.namespace.as_str())
                    .or_insert(*pa);
            }
        }
        let mut this = Self {
            root_namespace: root,
            any: !all.is_empty(),
            mesh: namespaces.get(root).copied(),
            namespaces,
            selectors,
            converted: BTreeMap::new(),
        };
        let converted = this
            .selectors
            .iter()
            .filter_map(|pa| {
                let policy = this.convert(pa)?;
                Some((
                    (pa.metadata.namespace.as_str(), pa.metadata.name.as_str()),
                    policy,
                ))
            })
            .collect();
        this.converted = converted;
        this
    }

    /// Whether a workload in `namespace` without a workload PeerAuthentication is STRICT.
    fn inherited_strict(&self, namespace: &str) -> bool {
        let ns_mode = self
            .namespaces
            .get(namespace)
            .map_or(MtlsMode::Unset, |pa| pa.mode());
        match ns_mode {
            MtlsMode::Unset => self.mesh.is_some_and(|pa| is_strict(pa.mode())),
            mode => is_strict(mode),
        }
    }

    /// Whether workloads selected by `pa` are STRICT (ports aside).
    fn effective_strict(&self, pa: &PeerAuthentication) -> bool {
        match pa.mode() {
            MtlsMode::Unset => self.inherited_strict(&pa.metadata.namespace),
            mode => is_strict(mode),
        }
    }

    fn convert(&self, pa: &PeerAuthentication) -> Option<Authorization> {
        let meta = &pa.metadata;
        if meta.namespace == self.root_namespace || pa.spec.port_level_mtls.is_empty() {
            return None;
        }
        let ports = &pa.spec.port_level_mtls;
        let rules = if self.effective_strict(pa) {
            let open: Vec<u16> = ports
                .iter()
                .filter(|(_, m)| matches!(m.mode, MtlsMode::Permissive | MtlsMode::Disable))
                .map(|(p, _)| *p)
                .collect();
            if open.is_empty() {
                return None;
            }
            let mut clauses = vec![Clause {
                matches: vec![plaintext()],
            }];
            clauses.extend(open.into_iter().map(|p| Clause {
                matches: vec![Match {
                    not_destination_ports: vec![p],
                    ..Match::default()
                }],
            }));
            vec![Rule { clauses }]
        } else {
            let strict: Vec<Rule> = ports
                .iter()
                .filter(|(_, m)| is_strict(m.mode))
                .map(|(p, _)| Rule {
                    clauses: vec![Clause {
                        matches: vec![Match {
                            destination_ports: vec![*p],
                            ..plaintext()
                        }],
                    }],
                })
                .collect();
            if strict.is_empty() {
                return None;
            }
            strict
        };
        let key =
            PolicyKey::new(&meta.namespace, format!("{CONVERTED_PREFIX}{}", meta.name)).ok()?;
        Some(Authorization {
            key,
            scope: Scope::WorkloadSelector,
            action: Action::Deny,
            dry_run: false,
            rules,
        })
    }

    fn static_key(&self) -> Option<PolicyKey> {
        PolicyKey::new(self.root_namespace, STATIC_STRICT_POLICY).ok()
    }

    /// Every policy PeerAuthentications turn into.
    pub fn policies(&self) -> Vec<Authorization> {
        let mut out = Vec::new();
        if self.any
            && let Some(key) = self.static_key()
        {
            out.push(Authorization {
                key,
                scope: Scope::WorkloadSelector,
                action: Action::Deny,
                dry_run: false,
                rules: vec![Rule {
                    clauses: vec![Clause {
                        matches: vec![plaintext()],
                    }],
                }],
            });
        }
        out.extend(self.converted.values().cloned());
        out
    }

    /// The PeerAuthentication-derived policies `pod` lists.
    pub fn policies_for(&self, pod: &Pod) -> Vec<PolicyKey> {
        if !self.any {
            return Vec::new();
        }
        let ns = pod.metadata.namespace.as_str();
        let workload_pa = self.workload_pa(pod);
        let (strict, converted) = match workload_pa {
            Some(pa) => (
                self.effective_strict(pa),
                self.converted
                    .get(&(pa.metadata.namespace.as_str(), pa.metadata.name.as_str())),
            ),
            None => (self.inherited_strict(ns), None),
        };
        let mut keys = Vec::new();
        match converted {
            Some(policy) => keys.push(policy.key.clone()),
            None if strict => keys.extend(self.static_key()),
            None => {}
        }
        keys
    }

    /// The oldest PeerAuthentication selecting `pod` in its namespace.
    fn workload_pa(&self, pod: &Pod) -> Option<&'c PeerAuthentication> {
        let ns = pod.metadata.namespace.as_str();
        self.selectors.iter().copied().find(|pa| {
            pa.metadata.namespace == ns
                && selector_labels(&pa.spec.selector)
                    .is_some_and(|sel| labels_match(sel, &pod.metadata.labels))
        })
    }

    /// Whether the effective mode of `pod` is STRICT (port-level overrides aside).
    pub fn is_strict(&self, pod: &Pod) -> bool {
        match self.workload_pa(pod) {
            Some(pa) => self.effective_strict(pa),
            None => self.inherited_strict(&pod.metadata.namespace),
        }
    }
}
