//! Which source owns a record: the local config file or xDS.
//!
//! Both sources feed one store (upstream does the same), but each owns its records: a reload
//! of the file replaces only what the file defined, and an xDS removal only what xDS sent.
//! Where both define the same key (workload uid, service `namespace/hostname`, policy
//! `namespace/name`) the file's record is the one used; the xDS record is kept aside and comes
//! back when the file stops defining the key. Without this, a reload wiped every xDS record,
//! and a delta stream never resends what it already delivered.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

/// The file's keys of one kind, and the xDS records they hide.
#[derive(Debug)]
pub(super) struct Owned<K, V> {
    local: HashSet<K>,
    hidden: HashMap<K, V>,
}

impl<K, V> Default for Owned<K, V> {
    fn default() -> Self {
        Self {
            local: HashSet::new(),
            hidden: HashMap::new(),
        }
    }
}

/// What an xDS change does to the effective store.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum XdsChange {
    /// Apply it.
    Apply,
    /// The file owns the key: the change only touched the hidden xDS record.
    Hidden,
}

impl<K: Hash + Eq + Clone + std::fmt::Debug, V> Owned<K, V> {
    /// An xDS upsert of `key`: kept aside when the file owns the key.
    pub(super) fn xds_upsert(&mut self, key: &K, value: V) -> Result<(), V> {
        if self.local.contains(key) {
            tracing::warn!(
                ?key,
                "xDS resource hidden by the local config's record with the same key"
            );
            self.hidden.insert(key.clone(), value);
            Ok(())
        } else {
            Err(value)
        }
    }

    /// An xDS removal of `key`.
    pub(super) fn xds_remove(&mut self, key: &K) -> XdsChange {
        if self.local.contains(key) {
            self.hidden.remove(key);
            XdsChange::Hidden
        } else {
            XdsChange::Apply
        }
    }

    /// The file now defines `keys`. Returns the keys it no longer defines, each with the
    /// xDS record to restore (if xDS has one). `current` gives the effective record of a key
    /// the file newly takes over, which is xDS's and so is kept aside.
    pub(super) fn replace(
        &mut self,
        keys: HashSet<K>,
        mut current: impl FnMut(&K) -> Option<V>,
    ) -> Vec<(K, Option<V>)> {
        let dropped: Vec<K> = self.local.difference(&keys).cloned().collect();
        let restored = dropped
            .into_iter()
            .map(|k| {
                let v = self.hidden.remove(&k);
                (k, v)
            })
            .collect();
        for k in keys.difference(&self.local) {
            if let Some(v) = current(k) {
                self.hidden.insert(k.clone(), v);
            }
        }
        self.local = keys;
        restored
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_wins_and_xds_comes_back() {
        let mut o: Owned<&str, &str> = Owned::default();
        // xDS alone: applied.
        assert_eq!(o.xds_upsert(&"a", "xds-a"), Err("xds-a"));
        // The file takes over "a" (effective was xDS's) and adds "b".
        let dropped = o.replace(HashSet::from(["a", "b"]), |k| {
            (*k == "a").then_some("xds-a")
        });
        assert!(dropped.is_empty());
        // xDS changes to "a" are hidden, removals too.
        assert_eq!(o.xds_upsert(&"a", "xds-a2"), Ok(()));
        assert_eq!(o.xds_remove(&"b"), XdsChange::Hidden);
        assert_eq!(o.xds_remove(&"c"), XdsChange::Apply);
        // The file drops both: "a" comes back as xDS's latest, "b" has nothing to restore.
        let mut dropped = o.replace(HashSet::new(), |_| None);
        dropped.sort();
        assert_eq!(dropped, vec![("a", Some("xds-a2")), ("b", None)]);
        assert_eq!(o.xds_upsert(&"a", "xds-a3"), Err("xds-a3"));
    }
}
