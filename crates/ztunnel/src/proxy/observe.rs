//! Filling metric labels and access-log fields from workload and service records.

use std::sync::Arc;

use ambit_model::{Service, Workload};

use crate::telemetry::{ConnectionLog, TrafficLabels};

fn s(v: &str) -> Arc<str> {
    if v.is_empty() {
        Arc::from("unknown")
    } else {
        Arc::from(v)
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
    info.src_workload = Some(Arc::from(w.name.as_str()));
    info.src_namespace = Some(Arc::from(w.namespace()));
    info.src_cluster = (!w.cluster_id.is_empty()).then(|| Arc::from(w.cluster_id.as_str()));
}

pub fn log_dst(info: &mut ConnectionLog, w: &Workload) {
    info.dst_workload = Some(Arc::from(w.name.as_str()));
    info.dst_namespace = Some(Arc::from(w.namespace()));
    info.dst_identity = Some(Arc::from(w.identity().to_string().as_str()));
    info.dst_cluster = (!w.cluster_id.is_empty()).then(|| Arc::from(w.cluster_id.as_str()));
}
