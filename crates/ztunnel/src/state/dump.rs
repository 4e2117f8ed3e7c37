//! JSON views of the state for `/config_dump` (camelCase, upstream's field names where they
//! exist).

use ambit_model::authz::{Action, Authorization, Scope, StringMatch};
use ambit_model::workload::{GatewayAddress, TunnelProtocol};
use ambit_model::{Service, Workload};
use serde_json::{Value, json};

fn gateway(g: &Option<GatewayAddress>) -> Value {
    match g {
        None => Value::Null,
        Some(g) => {
            json!({"destination": g.destination.to_string(), "hboneMtlsPort": g.hbone_mtls_port})
        }
    }
}

pub fn workload(w: &Workload) -> Value {
    json!({
        "uid": w.uid.as_str(),
        "workloadIps": w.addresses.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
        "protocol": match w.protocol { TunnelProtocol::Hbone => "HBONE", TunnelProtocol::None => "TCP" },
        "name": w.name,
        "namespace": w.namespace(),
        "serviceAccount": w.service_account(),
        "trustDomain": w.trust_domain(),
        "identity": w.identity().to_string(),
        "workloadName": w.workload_name,
        "workloadType": w.workload_type.as_str(),
        "canonicalName": w.canonical_name,
        "canonicalRevision": w.canonical_revision,
        "node": w.node,
        "network": w.network,
        "clusterId": w.cluster_id,
        "status": format!("{:?}", w.status),
        "waypoint": gateway(&w.waypoint),
        "networkGateway": gateway(&w.network_gateway),
        "authorizationPolicies": w.authorization_policies.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        "services": w.services.iter().map(|(k, ports)| {
            (k.to_string(), json!(ports.iter().map(|(a, b)| (a.to_string(), json!(*b))).collect::<serde_json::Map<_, _>>()))
        }).collect::<serde_json::Map<_, _>>(),
    })
}

pub fn service(s: &Service, endpoints: &[super::ResolvedEndpoint]) -> Value {
    json!({
        "name": s.name,
        "namespace": s.namespace(),
        "hostname": s.hostname(),
        "vips": s.vips.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
        "ports": s.ports.iter().map(|(a, b)| (a.to_string(), json!(*b))).collect::<serde_json::Map<_, _>>(),
        "subjectAltNames": s.subject_alt_names,
        "waypoint": gateway(&s.waypoint),
        "canonical": s.canonical,
        "visibility": format!("{:?}", s.visibility),
        "endpoints": endpoints.iter().map(|e| (e.workload.uid.to_string(), json!({
            "workloadUid": e.workload.uid.as_str(),
            "port": e.ports.iter().map(|(a, b)| (a.to_string(), json!(*b))).collect::<serde_json::Map<_, _>>(),
        }))).collect::<serde_json::Map<_, _>>(),
    })
}

fn string_match(m: &StringMatch) -> Value {
    match m {
        StringMatch::Exact(v) => json!({"Exact": v}),
        StringMatch::Prefix(v) => json!({"Prefix": v}),
        StringMatch::Suffix(v) => json!({"Suffix": v}),
        StringMatch::Presence => json!({"Presence": {}}),
    }
}

pub fn policy(p: &Authorization) -> Value {
    let strings = |v: &[StringMatch]| v.iter().map(string_match).collect::<Vec<_>>();
    let cidrs = |v: &[ambit_model::Cidr]| v.iter().map(|c| c.to_string()).collect::<Vec<_>>();
    json!({
        "name": p.key.name(),
        "namespace": p.key.namespace(),
        "scope": match p.scope { Scope::Global => "Global", Scope::Namespace => "Namespace", Scope::WorkloadSelector => "WorkloadSelector" },
        "action": match p.action { Action::Allow => "Allow", Action::Deny => "Deny" },
        "dryRun": p.dry_run,
        "rules": p.rules.iter().map(|r| r.clauses.iter().map(|c| c.matches.iter().map(|m| json!({
            "namespaces": strings(&m.namespaces),
            "notNamespaces": strings(&m.not_namespaces),
            "principals": strings(&m.principals),
            "notPrincipals": strings(&m.not_principals),
            "sourceIps": cidrs(&m.source_ips),
            "notSourceIps": cidrs(&m.not_source_ips),
            "destinationIps": cidrs(&m.destination_ips),
            "notDestinationIps": cidrs(&m.not_destination_ips),
            "destinationPorts": m.destination_ports,
            "notDestinationPorts": m.not_destination_ports,
        })).collect::<Vec<_>>()).collect::<Vec<_>>()).collect::<Vec<_>>(),
    })
}
