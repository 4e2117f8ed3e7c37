//! The policies a node knows, indexed so that finding those that apply to a workload costs one
//! hash lookup per namespace plus one per selector policy the workload names, and finding
//! those among them that can match a connection costs a fixed number of lookups
//! (`index.rs`), however many policies exist. Policies are shared (`Arc`) between indexes;
//! evaluation borrows them.

use std::collections::HashMap;
use std::sync::Arc;

use super::eval::{Connection, Decision, evaluate_with};
use super::index::Group;
use super::{Authorization, Scope};
use crate::names::PolicyKey;
use crate::workload::Workload;

#[derive(Debug, Default, Clone)]
pub struct PolicySet {
    by_key: HashMap<PolicyKey, Arc<Authorization>>,
    /// Namespace-scoped policies by namespace, ordered by key (so the policy named in a deny
    /// reason does not depend on hash order).
    by_namespace: HashMap<String, Group>,
    global: Group,
}

impl PolicySet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Inserts or replaces the policy with the same key; returns the replaced one.
    pub fn insert(&mut self, policy: Authorization) -> Option<Arc<Authorization>> {
        let key = policy.key.clone();
        let old = self.remove(&key);
        let policy = Arc::new(policy);
        match policy.scope {
            Scope::Global => {
                self.global.insert(Arc::clone(&policy));
            }
            Scope::Namespace => {
                self.by_namespace
                    .entry(key.namespace().to_string())
                    .or_default()
                    .insert(Arc::clone(&policy));
            }
            // Reached only through the workloads that name it.
            Scope::WorkloadSelector => {}
        }
        self.by_key.insert(key, policy);
        old
    }

    pub fn remove(&mut self, key: &PolicyKey) -> Option<Arc<Authorization>> {
        let old = self.by_key.remove(key)?;
        match old.scope {
            Scope::Global => {
                self.global.remove(key);
            }
            Scope::Namespace => {
                if let Some(group) = self.by_namespace.get_mut(key.namespace()) {
                    group.remove(key);
                    if group.is_empty() {
                        self.by_namespace.remove(key.namespace());
                    }
                }
            }
            Scope::WorkloadSelector => {}
        }
        Some(old)
    }

    pub fn get(&self, key: &PolicyKey) -> Option<&Arc<Authorization>> {
        self.by_key.get(key)
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Authorization>> {
        self.by_key.values()
    }

    /// The policies that apply to `workload`: namespace-scoped ones of its namespace, all
    /// global ones, and the ones it names (names not known here are skipped; see
    /// [`Self::unknown_for`]). Cheap to clone and re-walk; allocates nothing.
    pub fn for_workload<'s, 'w>(
        &'s self,
        workload: &'w Workload,
    ) -> impl Iterator<Item = &'s Authorization> + Clone + use<'s, 'w> {
        let namespaced = self
            .by_namespace
            .get(workload.namespace())
            .into_iter()
            .flat_map(|g| g.all().values());
        let selected = workload
            .authorization_policies
            .iter()
            .filter_map(|key| self.by_key.get(key));
        namespaced
            .chain(self.global.all().values())
            .chain(selected)
            .map(Arc::as_ref)
    }

    /// Names the workload lists that this set does not know (callers warn about them).
    pub fn unknown_for<'a>(
        &'a self,
        workload: &'a Workload,
    ) -> impl Iterator<Item = &'a PolicyKey> + 'a {
        workload
            .authorization_policies
            .iter()
            .filter(|key| !self.by_key.contains_key(*key))
    }

    /// Evaluates the policies that apply to `workload` for an inbound connection to it: the
    /// same decision as [`super::evaluate`] over [`Self::for_workload`], with only the namespace
    /// and global policies that can match `conn` walked (found through the index) plus
    /// every policy the workload names.
    pub fn evaluate(&self, workload: &Workload, conn: &Connection) -> Decision<'_> {
        let namespace = self.by_namespace.get(workload.namespace());
        let namespaced = namespace.map(|g| g.candidates(conn)).unwrap_or_default();
        let global = self.global.candidates(conn);
        let selected = workload
            .authorization_policies
            .iter()
            .filter_map(|key| self.by_key.get(key));
        let policies = namespaced
            .into_iter()
            .chain(global)
            .chain(selected)
            .map(Arc::as_ref);
        // Whether any ALLOW policy applies, matching or not, is the one fact the
        // candidates alone cannot tell (no ALLOW policy at all allows).
        let allow_applies = namespace.is_some_and(Group::has_allow) || self.global.has_allow();
        evaluate_with(policies.collect::<Vec<_>>(), conn, allow_applies)
    }
}

#[cfg(test)]
mod tests;
