//! One value per message type with every field set to something non-default, shared by
//! the round-trip and mutation tests.

use std::collections::HashMap;

use ambit_proto::prost::Name;
use ambit_proto::prost_types::{Any, Duration, Struct, Value, value::Kind};
use ambit_proto::{ca, core, cri, discovery, rpc, security, workload, zds};

pub fn string_struct(key: &str, value: &str) -> Struct {
    Struct {
        fields: [(
            key.to_owned(),
            Value {
                kind: Some(Kind::StringValue(value.to_owned())),
            },
        )]
        .into(),
    }
}

pub fn any_of<M: Name>(message: &M) -> Any {
    Any::from_msg(message).expect("encoding into a Vec cannot fail")
}

pub fn workload_info() -> zds::WorkloadInfo {
    zds::WorkloadInfo {
        name: "pod-a".into(),
        namespace: "ns".into(),
        service_account: "sa".into(),
        windows_namespace: None,
    }
}

pub fn windows_namespace() -> zds::WindowsNamespace {
    zds::WindowsNamespace {
        id: 7,
        guid: "0b1c5a7e-3d2f-4e6a-9b8c-1d2e3f405162".into(),
    }
}

pub fn network_address() -> workload::NetworkAddress {
    workload::NetworkAddress {
        network: "net".into(),
        address: vec![10, 0, 0, 1],
        length: Some(24),
    }
}

pub fn namespaced_hostname() -> workload::NamespacedHostname {
    workload::NamespacedHostname {
        namespace: "ns".into(),
        hostname: "waypoint.ns.svc.cluster.local".into(),
    }
}

pub fn gateway_by_host() -> workload::GatewayAddress {
    workload::GatewayAddress {
        destination: Some(workload::gateway_address::Destination::Hostname(
            namespaced_hostname(),
        )),
        hbone_mtls_port: 15008,
    }
}

pub fn gateway_by_address() -> workload::GatewayAddress {
    workload::GatewayAddress {
        destination: Some(workload::gateway_address::Destination::Address(
            network_address(),
        )),
        hbone_mtls_port: 15008,
    }
}

pub fn port() -> workload::Port {
    workload::Port {
        service_port: 80,
        target_port: 8080,
        app_protocol: workload::AppProtocol::Http2.into(),
    }
}

pub fn port_list() -> workload::PortList {
    workload::PortList {
        ports: vec![port(), port()],
    }
}

pub fn locality() -> workload::Locality {
    workload::Locality {
        region: "r".into(),
        zone: "z".into(),
        subzone: "s".into(),
    }
}

pub fn extension() -> workload::Extension {
    workload::Extension {
        name: "ext".into(),
        config: Some(any_of(&locality())),
    }
}

pub fn load_balancing() -> workload::LoadBalancing {
    use workload::load_balancing::{HealthPolicy, Mode, Scope};
    workload::LoadBalancing {
        routing_preference: vec![Scope::Network.into(), Scope::Node.into()],
        mode: Mode::Failover.into(),
        health_policy: HealthPolicy::AllowAll.into(),
    }
}

pub fn application_tunnel() -> workload::ApplicationTunnel {
    workload::ApplicationTunnel {
        protocol: workload::application_tunnel::Protocol::Proxy.into(),
        port: 15088,
    }
}

pub fn weighted_waypoint() -> workload::WeightedWaypoint {
    workload::WeightedWaypoint {
        destination: Some(gateway_by_address()),
        weight: 7,
    }
}

pub fn workload() -> workload::Workload {
    workload::Workload {
        uid: "cluster/pod/ns/pod-a".into(),
        name: "pod-a".into(),
        namespace: "ns".into(),
        addresses: vec![vec![10, 0, 0, 1], vec![0xfd; 16]],
        hostname: "pod-a.example".into(),
        network: "net".into(),
        tunnel_protocol: workload::TunnelProtocol::Hbone.into(),
        trust_domain: "td".into(),
        service_account: "sa".into(),
        waypoint: Some(gateway_by_host()),
        network_gateway: Some(gateway_by_address()),
        node: "node-1".into(),
        canonical_name: "app".into(),
        canonical_revision: "v1".into(),
        workload_type: workload::WorkloadType::Pod.into(),
        workload_name: "pod-a".into(),
        native_tunnel: true,
        application_tunnel: Some(application_tunnel()),
        services: HashMap::from([("ns/svc.ns.svc.cluster.local".to_owned(), port_list())]),
        authorization_policies: vec!["ns/allow".into()],
        status: workload::WorkloadStatus::Unhealthy.into(),
        cluster_id: "c1".into(),
        locality: Some(locality()),
        network_mode: workload::NetworkMode::HostNetwork.into(),
        extensions: vec![extension()],
        capacity: Some(3),
    }
}

pub fn service() -> workload::Service {
    workload::Service {
        name: "svc".into(),
        namespace: "ns".into(),
        hostname: "svc.ns.svc.cluster.local".into(),
        addresses: vec![network_address()],
        ports: vec![port()],
        subject_alt_names: vec!["spiffe://td/ns/ns/sa/sa".into()],
        waypoint: Some(gateway_by_host()),
        load_balancing: Some(load_balancing()),
        ip_families: workload::IpFamilies::Dual.into(),
        extensions: vec![extension()],
        canonical: true,
        ingress_use_waypoint: true,
        weighted_waypoints: vec![weighted_waypoint()],
        visibility: workload::Visibility::Namespace.into(),
    }
}

pub fn string_matches() -> Vec<security::StringMatch> {
    use security::string_match::MatchType;
    [
        MatchType::Exact("e".into()),
        MatchType::Prefix("p".into()),
        MatchType::Suffix("s".into()),
        MatchType::Presence(()),
    ]
    .into_iter()
    .map(|m| security::StringMatch {
        match_type: Some(m),
    })
    .collect()
}

pub fn authz_address() -> security::Address {
    security::Address {
        address: vec![192, 168, 0, 0],
        length: 16,
    }
}

pub fn service_account_match() -> security::ServiceAccountMatch {
    security::ServiceAccountMatch {
        namespace: "ns".into(),
        service_account: "sa".into(),
    }
}

pub fn authz_match() -> security::Match {
    security::Match {
        namespaces: string_matches(),
        not_namespaces: string_matches(),
        principals: string_matches(),
        not_principals: string_matches(),
        source_ips: vec![authz_address()],
        not_source_ips: vec![authz_address()],
        destination_ips: vec![authz_address()],
        not_destination_ips: vec![authz_address()],
        destination_ports: vec![80, 443],
        not_destination_ports: vec![22],
        service_accounts: vec![service_account_match()],
        not_service_accounts: vec![service_account_match()],
        extensions: vec![extension()],
    }
}

pub fn clause() -> security::Clause {
    security::Clause {
        matches: vec![authz_match()],
    }
}

pub fn rule() -> security::Rule {
    security::Rule {
        clauses: vec![clause()],
    }
}

pub fn authorization() -> security::Authorization {
    security::Authorization {
        name: "deny-all".into(),
        namespace: "ns".into(),
        scope: security::Scope::WorkloadSelector.into(),
        action: security::Action::Deny.into(),
        rules: vec![rule()],
        dry_run: true,
        extensions: vec![extension()],
    }
}

pub fn status() -> rpc::Status {
    rpc::Status {
        code: 3,
        message: "bad resource".into(),
        details: vec![any_of(&locality())],
    }
}

pub fn node() -> core::Node {
    core::Node {
        id: "ztunnel~10.0.0.1~ztunnel-x.istio-system~istio-system.svc.cluster.local".into(),
        cluster: "Kubernetes".into(),
        metadata: Some(string_struct("NODE_NAME", "node-1")),
        locality: Some(core::Locality {
            region: "r".into(),
            zone: "z".into(),
            sub_zone: "s".into(),
        }),
        user_agent_name: "ambit".into(),
        client_features: vec!["feature".into()],
        user_agent_version_type: Some(core::node::UserAgentVersionType::UserAgentVersion(
            "0.1.0".into(),
        )),
    }
}

pub fn metadata() -> core::Metadata {
    core::Metadata {
        filter_metadata: HashMap::from([("f".to_owned(), string_struct("k", "v"))]),
    }
}

pub fn delta_request() -> discovery::DeltaDiscoveryRequest {
    discovery::DeltaDiscoveryRequest {
        node: Some(node()),
        type_url: ambit_proto::ADDRESS_TYPE_URL.into(),
        resource_names_subscribe: vec!["*".into()],
        resource_names_unsubscribe: vec!["*".into()],
        initial_resource_versions: HashMap::from([("uid".to_owned(), "v1".to_owned())]),
        response_nonce: "n1".into(),
        error_detail: Some(status()),
    }
}

pub fn resource() -> discovery::Resource {
    discovery::Resource {
        version: "v1".into(),
        resource: Some(any_of(&workload::Address {
            r#type: Some(workload::address::Type::Workload(workload())),
        })),
        name: "cluster/pod/ns/pod-a".into(),
        aliases: vec!["net/10.0.0.1".into()],
        ttl: Some(Duration {
            seconds: 30,
            nanos: 5,
        }),
        cache_control: Some(discovery::resource::CacheControl { do_not_cache: true }),
        metadata: Some(metadata()),
    }
}

pub fn delta_response() -> discovery::DeltaDiscoveryResponse {
    discovery::DeltaDiscoveryResponse {
        system_version_info: "sys".into(),
        resources: vec![resource()],
        type_url: ambit_proto::ADDRESS_TYPE_URL.into(),
        nonce: "n1".into(),
        removed_resources: vec!["gone".into()],
        control_plane: Some(core::ControlPlane {
            identifier: "ambit-control".into(),
        }),
    }
}

pub fn certificate_request() -> ca::IstioCertificateRequest {
    ca::IstioCertificateRequest {
        csr: "-----BEGIN CERTIFICATE REQUEST-----".into(),
        validity_duration: 86400,
        metadata: Some(string_struct(
            "ImpersonatedIdentity",
            "spiffe://td/ns/ns/sa/sa",
        )),
    }
}

pub fn certificate_response() -> ca::IstioCertificateResponse {
    ca::IstioCertificateResponse {
        cert_chain: vec!["leaf".into(), "intermediate".into(), "root".into()],
    }
}

pub fn sandbox_metadata() -> cri::PodSandboxMetadata {
    cri::PodSandboxMetadata {
        name: "web-0".into(),
        uid: "0b1c5a7e-3d2f-4e6a-9b8c-1d2e3f405162".into(),
        namespace: "shop".into(),
        attempt: 2,
    }
}

pub fn sandbox_status() -> cri::PodSandboxStatus {
    cri::PodSandboxStatus {
        id: "sb".into(),
        metadata: Some(sandbox_metadata()),
        state: cri::PodSandboxState::SandboxNotready.into(),
        created_at: 1_700_000_000_000_000_000,
    }
}

pub fn sandbox_state_value() -> cri::PodSandboxStateValue {
    cri::PodSandboxStateValue {
        state: cri::PodSandboxState::SandboxNotready.into(),
    }
}

pub fn sandbox_filter() -> cri::PodSandboxFilter {
    cri::PodSandboxFilter {
        id: "sb".into(),
        state: Some(sandbox_state_value()),
        label_selector: [("app".to_owned(), "web".to_owned())].into(),
    }
}

pub fn sandbox() -> cri::PodSandbox {
    cri::PodSandbox {
        id: "sb".into(),
        metadata: Some(sandbox_metadata()),
        state: cri::PodSandboxState::SandboxNotready.into(),
        created_at: 1_700_000_000_000_000_000,
        labels: [("app".to_owned(), "web".to_owned())].into(),
        annotations: [("a".to_owned(), "b".to_owned())].into(),
        runtime_handler: "runhcs-wcow-process".into(),
    }
}
