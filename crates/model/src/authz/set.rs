//! The policies a node knows, indexed so that finding those that apply to a workload costs one
//! hash lookup per namespace plus one per selector policy the workload names, however many
//! policies exist. Policies are shared (`Arc`) between indexes; evaluation borrows them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::eval::{Connection, Decision, evaluate};
use super::{Authorization, Scope};
use crate::names::PolicyKey;
use crate::workload::Workload;

#[derive(Debug, Default, Clone)]
pub struct PolicySet {
    by_key: HashMap<PolicyKey, Arc<Authorization>>,
    /// Namespace-scoped policies by namespace, then by name (ordered, so the policy named in
    /// a deny reason does not depend on hash order).
    by_namespace: HashMap<String, BTreeMap<String, Arc<Authorization>>>,
    global: BTreeMap<PolicyKey, Arc<Authorization>>,
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
                self.global.insert(key.clone(), Arc::clone(&policy));
            }
            Scope::Namespace => {
                self.by_namespace
                    .entry(key.namespace().to_string())
                    .or_default()
                    .insert(key.name().to_string(), Arc::clone(&policy));
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
                if let Some(names) = self.by_namespace.get_mut(key.namespace()) {
                    names.remove(key.name());
                    if names.is_empty() {
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
            .flat_map(BTreeMap::values);
        let selected = workload
            .authorization_policies
            .iter()
            .filter_map(|key| self.by_key.get(key));
        namespaced
            .chain(self.global.values())
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

    /// Evaluates the policies that apply to `workload` for an inbound connection to it.
    pub fn evaluate(&self, workload: &Workload, conn: &Connection) -> Decision<'_> {
        evaluate(self.for_workload(workload), conn)
    }
}

#[cfg(test)]
mod tests;
