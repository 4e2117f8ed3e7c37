//! Authorization policies (`istio.security.Authorization`) and their evaluation for inbound
//! connections (spec §6). Pure: no I/O, no logging — callers log the [`Decision`].

mod eval;
mod index;
mod set;

pub use eval::{Connection, Decision, DenyReason, DryRunMatch, Verdict, evaluate};
pub use set::PolicySet;

use crate::addr::Cidr;
use crate::identity::SpiffeId;
use crate::names::PolicyKey;

/// Which workloads a policy applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Every workload in the mesh.
    Global,
    /// Every workload in the policy's namespace.
    Namespace,
    /// Workloads that list the policy in their `authorization_policies`.
    WorkloadSelector,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Allow,
    Deny,
}

/// A policy: it matches a connection if ANY of its rules does (and never if it has none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorization {
    pub key: PolicyKey,
    pub scope: Scope,
    pub action: Action,
    /// A dry-run policy is evaluated and reported but never changes the verdict.
    pub dry_run: bool,
    pub rules: Vec<Rule>,
}

/// Matches if ALL clauses match (an empty rule matches everything).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    pub clauses: Vec<Clause>,
}

/// Matches if ANY non-empty match object matches. An empty clause matches; a clause whose
/// match objects are all empty does not (upstream skips empty match objects, leaving nothing
/// that could match).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Clause {
    pub matches: Vec<Match>,
}

/// One match object: every field type present must match; within a type the positive list
/// needs ANY entry to match and the negative list needs NONE to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Match {
    pub namespaces: Vec<StringMatch>,
    pub not_namespaces: Vec<StringMatch>,
    pub principals: Vec<StringMatch>,
    pub not_principals: Vec<StringMatch>,
    pub source_ips: Vec<Cidr>,
    pub not_source_ips: Vec<Cidr>,
    pub destination_ips: Vec<Cidr>,
    pub not_destination_ips: Vec<Cidr>,
    pub destination_ports: Vec<u16>,
    pub not_destination_ports: Vec<u16>,
    pub service_accounts: Vec<ServiceAccountMatch>,
    pub not_service_accounts: Vec<ServiceAccountMatch>,
}

impl Match {
    /// True when no field is set; such a match object is skipped.
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
            && self.not_namespaces.is_empty()
            && self.principals.is_empty()
            && self.not_principals.is_empty()
            && self.source_ips.is_empty()
            && self.not_source_ips.is_empty()
            && self.destination_ips.is_empty()
            && self.not_destination_ips.is_empty()
            && self.destination_ports.is_empty()
            && self.not_destination_ports.is_empty()
            && self.service_accounts.is_empty()
            && self.not_service_accounts.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StringMatch {
    Exact(String),
    Prefix(String),
    Suffix(String),
    /// Any non-empty value.
    Presence,
}

impl StringMatch {
    pub fn matches(&self, value: &str) -> bool {
        match self {
            StringMatch::Exact(s) => value == s,
            StringMatch::Prefix(s) => value.starts_with(s.as_str()),
            StringMatch::Suffix(s) => value.ends_with(s.as_str()),
            StringMatch::Presence => !value.is_empty(),
        }
    }
}

/// A namespace + service account pair; the trust domain is not compared.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceAccountMatch {
    pub namespace: String,
    pub service_account: String,
}

impl ServiceAccountMatch {
    pub fn matches(&self, id: &SpiffeId) -> bool {
        id.namespace() == self.namespace && id.service_account() == self.service_account
    }
}
