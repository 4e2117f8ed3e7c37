//! Pod → `Workload` (`spec/ztunnel.md` §4.2).
//!
//! - uid `<cluster id>//v1/Pod/<namespace>/<name>`; addresses = the pod IPs (none yet is
//!   fine: the workload is still known by uid); identity from the trust domain, namespace and
//!   service account; node = `spec.nodeName`; host-network pods get `HostNetwork` mode.
//! - Canonical name: label `service.istio.io/canonical-name`, `app.kubernetes.io/name`, `app`,
//!   else the workload name; canonical revision: `service.istio.io/canonical-revision`,
//!   `app.kubernetes.io/version`, `version`, else `latest`.
//! - Workload name and type, see [`workload_name_and_type`].
//! - Tunnel protocol HBONE only when the CNI agent has captured the pod (annotation
//!   `ambient.istio.io/redirection: enabled`); otherwise peers must send plain TCP.
//! - Unhealthy only when the pod reports a `Ready` condition that is not `True`.
//! - Pods that finished (phase Succeeded/Failed) are not workloads.

use ambit_model::workload::{HealthStatus, NetworkMode, TunnelProtocol, Workload, WorkloadType};
use ambit_model::{Authorization, SpiffeId, WorkloadUid};

use super::Cluster;
use super::authz::selected_policies;
use super::peer_authn::PeerAuthn;
use super::service::memberships;
use crate::objects::Pod;

/// Annotation the CNI agent sets once the pod's traffic is redirected to ztunnel.
pub const REDIRECTION_ANNOTATION: &str = "ambient.istio.io/redirection";
/// Label Deployments put on their pods (the ReplicaSet's pod-template hash).
pub const POD_TEMPLATE_HASH_LABEL: &str = "pod-template-hash";

const CANONICAL_NAME_LABELS: [&str; 3] = [
    "service.istio.io/canonical-name",
    "app.kubernetes.io/name",
    "app",
];
const CANONICAL_REVISION_LABELS: [&str; 3] = [
    "service.istio.io/canonical-revision",
    "app.kubernetes.io/version",
    "version",
];

/// `<cluster id>//v1/Pod/<namespace>/<name>`, the upstream istiod form.
pub fn workload_uid(cluster: &Cluster, pod: &Pod) -> String {
    format!(
        "{}//v1/Pod/{}/{}",
        cluster.config.cluster_id, pod.metadata.namespace, pod.metadata.name
    )
}

/// Translates one pod; `None` (with a warning when it is not expected) if it is no workload.
/// `policies` are the emitted policies sorted by key.
pub fn workload(
    cluster: &Cluster,
    pod: &Pod,
    policies: &[Authorization],
    peer: &PeerAuthn<'_>,
    warnings: &mut Vec<String>,
) -> Option<Workload> {
    if pod.is_terminal() {
        return None;
    }
    let meta = &pod.metadata;
    let label = format!("Pod {}/{}", meta.namespace, meta.name);
    let uid = WorkloadUid::new(workload_uid(cluster, pod));
    let identity = SpiffeId::new(
        &cluster.config.trust_domain,
        &meta.namespace,
        &pod.spec.service_account_name,
    );
    let (uid, identity) = match (uid, identity) {
        (Ok(uid), Ok(identity)) => (uid, identity),
        (Err(e), _) => {
            warnings.push(format!("{label}: bad workload uid: {e}; skipped"));
            return None;
        }
        (_, Err(e)) => {
            warnings.push(format!("{label}: bad identity: {e}; skipped"));
            return None;
        }
    };
    let mut w = Workload::new(uid, meta.name.clone(), identity);
    w.addresses = pod.ips();
    w.node = pod.spec.node_name.clone();
    w.cluster_id = cluster.config.cluster_id.clone();
    if pod.spec.host_network {
        w.network_mode = NetworkMode::HostNetwork;
    }
    if meta
        .annotations
        .get(REDIRECTION_ANNOTATION)
        .map(String::as_str)
        == Some("enabled")
    {
        w.protocol = TunnelProtocol::Hbone;
    }
    if !pod.is_ready() {
        w.status = HealthStatus::Unhealthy;
    }
    let (workload_name, workload_type) = workload_name_and_type(pod);
    w.canonical_name = first_label(pod, &CANONICAL_NAME_LABELS)
        .unwrap_or(&workload_name)
        .to_string();
    w.canonical_revision = first_label(pod, &CANONICAL_REVISION_LABELS)
        .unwrap_or("latest")
        .to_string();
    w.workload_name = workload_name;
    w.workload_type = workload_type;
    w.services = memberships(cluster, pod, warnings).into_iter().collect();
    let mut keys = selected_policies(cluster, pod, policies);
    keys.extend(peer.policies_for(pod));
    keys.sort();
    keys.dedup();
    w.authorization_policies = keys;
    Some(w)
}

fn first_label<'p>(pod: &'p Pod, keys: &[&str]) -> Option<&'p str> {
    keys.iter()
        .filter_map(|k| pod.metadata.labels.get(*k))
        .map(String::as_str)
        .find(|v| !v.is_empty())
}

/// The workload a pod belongs to, like upstream istiod:
/// - controller ReplicaSet `<deployment>-<pod-template-hash>` → that Deployment;
/// - controller Job `<cronjob>-<8 to 10 digits>` → that CronJob, any other Job → the Job;
/// - no owner references but a `pod-template-hash` label and a name
///   `<deployment>-<hash>-<suffix>` → that Deployment (file-defined pods copied from a cluster);
/// - anything else → the pod itself, type Pod.
pub fn workload_name_and_type(pod: &Pod) -> (String, WorkloadType) {
    let meta = &pod.metadata;
    let hash = meta
        .labels
        .get(POD_TEMPLATE_HASH_LABEL)
        .filter(|h| !h.is_empty());
    let owner = meta
        .owner_references
        .iter()
        .find(|o| o.controller == Some(true))
        .or_else(|| meta.owner_references.first());
    match owner {
        Some(o) if o.kind == "ReplicaSet" => {
            if let Some(deployment) = hash.and_then(|h| o.name.strip_suffix(&format!("-{h}")))
                && !deployment.is_empty()
            {
                return (deployment.to_string(), WorkloadType::Deployment);
            }
        }
        Some(o) if o.kind == "Job" => {
            return match cron_job_name(&o.name) {
                Some(cron) => (cron.to_string(), WorkloadType::CronJob),
                None => (o.name.clone(), WorkloadType::Job),
            };
        }
        Some(_) => {}
        None => {
            if let Some(h) = hash
                && let Some(idx) = meta.name.rfind(&format!("-{h}-"))
                && idx > 0
            {
                return (meta.name[..idx].to_string(), WorkloadType::Deployment);
            }
        }
    }
    (meta.name.clone(), WorkloadType::Pod)
}

/// `<cronjob>` of a Job named `<cronjob>-<8 to 10 digits>` (the scheduled time in minutes).
fn cron_job_name(job: &str) -> Option<&str> {
    let (base, suffix) = job.rsplit_once('-')?;
    let digits = (8..=10).contains(&suffix.len()) && suffix.bytes().all(|b| b.is_ascii_digit());
    (digits && !base.is_empty()).then_some(base)
}
