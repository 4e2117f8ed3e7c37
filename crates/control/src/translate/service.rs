//! Service → `Service`, and which services a pod backs with which port maps.
//!
//! Only TCP ports are translated (ztunnel proxies TCP; a UDP port of the same number, as DNS
//! services have, must not shadow the TCP one). A service's hostname is
//! `<name>.<ns>.svc.<cluster domain>`, its VIPs are its cluster IPs on the default network
//! (none when headless or unassigned). A numeric `targetPort` maps directly; a named one is 0
//! on the service (resolved per endpoint) and resolved through each pod's container ports,
//! a pod without such a port getting a warning and no entry for that service port.

use ambit_model::NamespacedHostname;
use ambit_model::addr::NetworkAddr;
use ambit_model::service::{AppProtocol, Service};
use ambit_model::workload::PortMap;

use super::Cluster;
use crate::objects::Pod;
use crate::objects::pod::Protocol;
use crate::objects::service::{Service as ServiceObject, TargetPort};

/// `<name>.<ns>.svc.<cluster domain>`.
pub fn hostname(cluster: &Cluster, svc: &ServiceObject) -> String {
    format!(
        "{}.{}.svc.{}",
        svc.metadata.name, svc.metadata.namespace, cluster.config.cluster_domain
    )
}

fn key(
    cluster: &Cluster,
    svc: &ServiceObject,
    warnings: &mut Vec<String>,
) -> Option<NamespacedHostname> {
    match NamespacedHostname::new(&svc.metadata.namespace, hostname(cluster, svc)) {
        Ok(key) => Some(key),
        Err(e) => {
            warnings.push(format!(
                "Service {}/{}: {e}; skipped",
                svc.metadata.namespace, svc.metadata.name
            ));
            None
        }
    }
}

/// Every Service of the cluster, sorted by key.
pub fn services(cluster: &Cluster, warnings: &mut Vec<String>) -> Vec<Service> {
    let mut out: Vec<Service> = cluster
        .objects
        .services
        .iter()
        .filter_map(|svc| {
            let mut s = Service::new(svc.metadata.name.clone(), key(cluster, svc, warnings)?);
            s.vips = svc
                .vips()
                .into_iter()
                .map(|ip| NetworkAddr::new("", ip))
                .collect();
            for port in svc
                .spec
                .ports
                .iter()
                .filter(|p| p.protocol == Protocol::Tcp)
            {
                let target = match port.target() {
                    TargetPort::Number(n) => n,
                    TargetPort::Name(_) => 0,
                };
                s.ports.insert(port.port, target);
                if let Some(proto) = port.app_protocol.as_deref().and_then(app_protocol) {
                    s.app_protocols.insert(port.port, proto);
                }
            }
            Some(s)
        })
        .collect();
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

/// Kubernetes `appProtocol` values ztunnel distinguishes.
fn app_protocol(value: &str) -> Option<AppProtocol> {
    Some(match value.to_ascii_lowercase().as_str() {
        "http" => AppProtocol::Http11,
        "http2" | "h2c" | "kubernetes.io/h2c" => AppProtocol::Http2,
        "grpc" => AppProtocol::Grpc,
        "tcp" => AppProtocol::Tcp,
        "tls" | "https" => AppProtocol::Tls,
        _ => return None,
    })
}

/// The services `pod` backs (Services in its namespace whose selector matches its labels),
/// with their service port → pod port maps.
pub fn memberships(
    cluster: &Cluster,
    pod: &Pod,
    warnings: &mut Vec<String>,
) -> Vec<(NamespacedHostname, PortMap)> {
    let meta = &pod.metadata;
    let mut out = Vec::new();
    for svc in &cluster.objects.services {
        if svc.metadata.namespace != meta.namespace || !svc.selects(&meta.labels) {
            continue;
        }
        let Some(key) = key(cluster, svc, &mut Vec::new()) else {
            continue;
        };
        let mut ports = PortMap::new();
        for port in svc
            .spec
            .ports
            .iter()
            .filter(|p| p.protocol == Protocol::Tcp)
        {
            match port.target() {
                TargetPort::Number(n) => {
                    ports.insert(port.port, n);
                }
                TargetPort::Name(name) => match pod.named_port(&name) {
                    Some(n) => {
                        ports.insert(port.port, n);
                    }
                    None => warnings.push(format!(
                        "Service {}/{} port {}: targetPort {name:?} is not a TCP container \
                         port of Pod {}/{}; port skipped for this pod",
                        svc.metadata.namespace,
                        svc.metadata.name,
                        port.port,
                        meta.namespace,
                        meta.name
                    )),
                },
            }
        }
        out.push((key, ports));
    }
    out
}
