//! Filling metric labels and access-log fields from workload and service records.

//!
//! Every open connection keeps its labels (in its metrics guard) and its log fields (for the
//! "connection complete" record) until it closes: ~30 strings, and they are the same few
//! strings for every connection between the same workloads. They are interned per thread,
//! so an open connection holds references, not ~30 small allocations of its own.

use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::Arc;

use ambit_model::{Service, Workload};

use crate::telemetry::{ConnectionLog, TrafficLabels};

/// Distinct values kept per thread before the table starts over (values already handed out
/// stay valid; only sharing with later connections is lost).
const INTERN_CAPACITY: usize = 1024;

thread_local! {
    static INTERNED: RefCell<HashSet<Arc<str>>> = RefCell::new(HashSet::new());
}

/// A shared copy of `v`: the same allocation for equal values on this thread.
pub fn intern(v: &str) -> Arc<str> {
    INTERNED
        .try_with(|set| {
            let mut set = set.borrow_mut();
            if let Some(shared) = set.get(v) {
                return shared.clone();
            }
            if set.len() >= INTERN_CAPACITY {
                set.clear();
            }
            let shared: Arc<str> = Arc::from(v);
            set.insert(shared.clone());
            shared
        })
        .unwrap_or_else(|_| Arc::from(v))
}

/// Like [`intern`] for anything displayable (SPIFFE ids, CONNECT authorities).
pub fn intern_display(v: &impl std::fmt::Display) -> Arc<str> {
    intern(&v.to_string())
}

fn s(v: &str) -> Arc<str> {
    if v.is_empty() {
        intern("unknown")
    } else {
        intern(v)
    }
}

pub fn source(l: &mut TrafficLabels, w: &Workload) {
    l.source_workload = s(&w.workload_name);
    l.source_canonical_service = s(&w.canonical_name);
    l.source_canonical_revision = s(&w.canonical_revision);
    l.source_workload_namespace = s(w.namespace());
    l.source_app = s(&w.canonical_name);
    l.source_version = s(&w.canonical_revision);
    l.source_cluster = s(&w.cluster_id);
    l.source_region = s(&w.locality.region);
    l.source_zone = s(&w.locality.zone);
}

pub fn destination(l: &mut TrafficLabels, w: &Workload) {
    l.destination_workload = s(&w.workload_name);
    l.destination_canonical_service = s(&w.canonical_name);
    l.destination_canonical_revision = s(&w.canonical_revision);
    l.destination_workload_namespace = s(w.namespace());
    l.destination_app = s(&w.canonical_name);
    l.destination_version = s(&w.canonical_revision);
    l.destination_cluster = s(&w.cluster_id);
    l.destination_region = s(&w.locality.region);
    l.destination_zone = s(&w.locality.zone);
}

pub fn service(l: &mut TrafficLabels, svc: &Service) {
    l.destination_service = s(svc.hostname());
    l.destination_service_namespace = s(svc.namespace());
    l.destination_service_name = s(&svc.name);
}

pub fn log_src(info: &mut ConnectionLog, w: &Workload) {
    info.names.src_workload = Some(intern(&w.name));
    info.names.src_namespace = Some(intern(w.namespace()));
    info.names.src_cluster = (!w.cluster_id.is_empty()).then(|| intern(&w.cluster_id));
}

pub fn log_dst(info: &mut ConnectionLog, w: &Workload) {
    info.names.dst_workload = Some(intern(&w.name));
    info.names.dst_namespace = Some(intern(w.namespace()));
    info.names.dst_identity = Some(intern_display(w.identity()));
    info.names.dst_cluster = (!w.cluster_id.is_empty()).then(|| intern(&w.cluster_id));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_allocation() {
        let a = intern("reviews-v1");
        let b = intern(&String::from("reviews-v1"));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(&*a, "reviews-v1");
        assert!(!Arc::ptr_eq(&a, &intern("reviews-v2")));
        assert_eq!(&*s(""), "unknown");
    }

    #[test]
    fn a_full_table_starts_over_without_invalidating_values() {
        let first = intern("value-0");
        for i in 0..INTERN_CAPACITY * 2 {
            assert_eq!(&*intern(&format!("value-{i}")), format!("value-{i}"));
        }
        assert_eq!(&*first, "value-0");
        assert!(INTERNED.with(|t| t.borrow().len()) <= INTERN_CAPACITY);
    }
}
