//! WorkloadEntry → `Workload`: a VM or bare host, selected by Services and policies like a pod.
//!
//! - uid `<cluster id>/networking.istio.io/WorkloadEntry/<namespace>/<name>` (istiod's form);
//! - identity from the trust domain, the entry's namespace and `spec.serviceAccount`;
//! - labels: `metadata.labels` with `spec.labels` over them; Services in the entry's
//!   namespace select on these, as do AuthorizationPolicy and PeerAuthentication selectors;
//! - address: `spec.address` when it is an IP address; an entry with a DNS name or a unix
//!   socket gets no address and a warning (ztunnel can not resolve a workload by name);
//! - service ports: a Service port whose name is a key of `spec.ports` maps to that port;
//!   otherwise its `targetPort` (a named one resolved through `spec.ports` too);
//! - network, locality (`region/zone/subzone`) and weight (as capacity) from the spec;
//! - workload name: label `service.istio.io/workload-name`, else the auto-registration
//!   group (annotation `istio.io/autoRegistrationGroup`), else the entry's name; type Pod;
//! - canonical names, tunnel protocol and health as for pods ([`super::workload`]); also
//!   HBONE with istiod's label `networking.istio.io/tunnel: http` (auto-registration sets it
//!   for a VM running ztunnel).

use ambit_model::workload::{Locality, TunnelProtocol, Workload, WorkloadType};
use ambit_model::{Authorization, WorkloadUid};

use super::Cluster;
use super::peer_authn::PeerAuthn;
use super::workload::workload;
use crate::objects::pod::{Container, ContainerPort, PodSpec, PodStatus, Protocol};
use crate::objects::service::TargetPort;
use crate::objects::{Pod, WorkloadEntry};

/// Label naming the workload an entry belongs to.
pub const WORKLOAD_NAME_LABEL: &str = "service.istio.io/workload-name";
/// Annotation istiod puts on auto-registered entries: the WorkloadGroup's name.
pub const AUTO_REGISTRATION_GROUP_ANNOTATION: &str = "istio.io/autoRegistrationGroup";

/// `<cluster id>/networking.istio.io/WorkloadEntry/<namespace>/<name>`.
pub fn workload_entry_uid(cluster: &Cluster, entry: &WorkloadEntry) -> String {
    format!(
        "{}/networking.istio.io/WorkloadEntry/{}/{}",
        cluster.config.cluster_id, entry.metadata.namespace, entry.metadata.name
    )
}

/// The pod an entry stands for when selecting and naming it: its merged labels, service
/// account, IP and named ports.
fn as_pod(entry: &WorkloadEntry) -> Pod {
    let mut metadata = entry.metadata.clone();
    metadata.labels = entry.labels();
    metadata.owner_references.clear();
    let ports = entry
        .spec
        .ports
        .iter()
        .map(|(name, port)| ContainerPort {
            name: Some(name.clone()),
            container_port: *port,
            protocol: Default::default(),
        })
        .collect();
    Pod {
        metadata,
        spec: PodSpec {
            service_account_name: entry.spec.service_account.clone(),
            containers: vec![Container {
                ports,
                ..Container::default()
            }],
            ..PodSpec::default()
        },
        status: PodStatus {
            pod_ip: entry.spec.address.parse().ok(),
            ..PodStatus::default()
        },
    }
}

/// Translates one entry; `None` with a warning when it can not be a workload.
pub fn entry_workload(
    cluster: &Cluster,
    entry: &WorkloadEntry,
    policies: &[Authorization],
    peer: &PeerAuthn<'_>,
    warnings: &mut Vec<String>,
) -> Option<Workload> {
    let meta = &entry.metadata;
    let label = format!("WorkloadEntry {}/{}", meta.namespace, meta.name);
    let address = &entry.spec.address;
    if !address.is_empty() && address.parse::<std::net::IpAddr>().is_err() {
        warnings.push(format!(
            "{label}: spec.address {address:?} is not an IP address; the workload has no address"
        ));
    }
    let pod = as_pod(entry);
    let mut pod_warnings = Vec::new();
    let mut w = workload(cluster, &pod, policies, peer, &mut pod_warnings)?;
    warnings.extend(
        pod_warnings
            .into_iter()
            .map(|w| w.replace(&format!("Pod {}/{}", meta.namespace, meta.name), &label)),
    );
    match WorkloadUid::new(workload_entry_uid(cluster, entry)) {
        Ok(uid) => w.uid = uid,
        Err(e) => {
            warnings.push(format!("{label}: bad workload uid: {e}; skipped"));
            return None;
        }
    }
    let labels = &pod.metadata.labels;
    let workload_name = labels
        .get(WORKLOAD_NAME_LABEL)
        .or_else(|| meta.annotations.get(AUTO_REGISTRATION_GROUP_ANNOTATION))
        .filter(|n| !n.is_empty())
        .unwrap_or(&meta.name)
        .clone();
    let canonical_from_name = w.canonical_name == meta.name;
    if canonical_from_name {
        w.canonical_name = workload_name.clone();
    }
    w.workload_name = workload_name;
    w.workload_type = WorkloadType::Pod;
    if labels
        .get(crate::autoregister::TUNNEL_LABEL)
        .map(String::as_str)
        == Some(crate::autoregister::TUNNEL_HTTP)
    {
        w.protocol = TunnelProtocol::Hbone;
    }
    w.network = entry.spec.network.clone();
    let mut parts = entry.spec.locality.splitn(3, '/').map(str::to_string);
    w.locality = Locality {
        region: parts.next().unwrap_or_default(),
        zone: parts.next().unwrap_or_default(),
        subzone: parts.next().unwrap_or_default(),
    };
    if entry.spec.weight > 0 {
        w.capacity = entry.spec.weight;
    }
    // istiod maps a Service port to an entry's port by the Service port's name.
    for svc in &cluster.objects.services {
        if svc.metadata.namespace != meta.namespace || !svc.selects(labels) {
            continue;
        }
        let host = super::service::hostname(cluster, svc);
        let Some(ports) = w
            .services
            .iter_mut()
            .find(|(key, _)| key.hostname() == host)
            .map(|(_, ports)| ports)
        else {
            continue;
        };
        for port in svc
            .spec
            .ports
            .iter()
            .filter(|p| p.protocol == Protocol::Tcp)
        {
            let by_name = port.name.as_ref().and_then(|n| entry.spec.ports.get(n));
            let target = match (by_name, port.target()) {
                (Some(p), _) => Some(*p),
                (None, TargetPort::Number(n)) => Some(n),
                (None, TargetPort::Name(_)) => None,
            };
            if let Some(target) = target {
                ports.insert(port.port, target);
            }
        }
    }
    Some(w)
}
