//! Exact bytes for small messages: these pin the field numbers and oneof tags of the
//! specs, so a renumbered field fails here even though a round trip would still pass.

use ambit_proto::prost::Message;
use ambit_proto::{ca, core, cri, discovery, rpc, security, workload, zds};

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn request(payload: zds::workload_request::Payload) -> Vec<u8> {
    zds::WorkloadRequest {
        payload: Some(payload),
    }
    .encode_to_vec()
}

/// (what, encoding, expected hex).
fn cases() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    use zds::workload_request::Payload as Req;
    let x = || "x".to_owned();
    vec![
        (
            "ZdsHello{V1}",
            zds::ZdsHello {
                version: zds::Version::V1.into(),
            }
            .encode_to_vec(),
            "08 01",
        ),
        (
            "WorkloadResponse{ack: Ack{}}",
            zds::WorkloadResponse {
                payload: Some(zds::workload_response::Payload::Ack(zds::Ack::default())),
            }
            .encode_to_vec(),
            "0a 00",
        ),
        (
            "WorkloadRequest{snapshot_sent}",
            request(Req::SnapshotSent(zds::SnapshotSent {})),
            "1a 00",
        ),
        (
            "DelWorkload.uid is field 2",
            zds::DelWorkload { uid: x() }.encode_to_vec(),
            "12 01 78",
        ),
        (
            "WorkloadRequest{del}",
            request(Req::Del(zds::DelWorkload { uid: x() })),
            "12 03 12 01 78",
        ),
        (
            "WorkloadRequest{keep} is oneof field 5",
            request(Req::Keep(zds::KeepWorkload { uid: x() })),
            "2a 03 0a 01 78",
        ),
        (
            "WorkloadRequest{add{uid, info{name}}}",
            request(Req::Add(zds::AddWorkload {
                uid: x(),
                workload_info: Some(zds::WorkloadInfo {
                    name: "p".into(),
                    ..Default::default()
                }),
            })),
            "0a 08 0a 01 78 12 03 0a 01 70",
        ),
        // The Windows delta (spec/windows.md §2.2): the pod's HNS namespace rides in
        // WorkloadInfo field 5 instead of as a descriptor; these are the spec's own bytes.
        (
            "Windows Add{u1, info{a, b, c, windows_namespace{7, G}}}",
            request(Req::Add(zds::AddWorkload {
                uid: "u1".into(),
                workload_info: Some(zds::WorkloadInfo {
                    name: "a".into(),
                    namespace: "b".into(),
                    service_account: "c".into(),
                    windows_namespace: Some(zds::WindowsNamespace {
                        id: 7,
                        guid: "G".into(),
                    }),
                }),
            })),
            "0a 16 0a 02 75 31 12 10 0a 01 61 12 01 62 1a 01 63 2a 05 08 07 12 01 47",
        ),
        (
            "Windows nack(e)",
            zds::WorkloadResponse {
                payload: Some(zds::workload_response::Payload::Ack(zds::Ack {
                    error: "e".into(),
                })),
            }
            .encode_to_vec(),
            "0a 03 0a 01 65",
        ),
        (
            "Windows keep(u1)",
            request(Req::Keep(zds::KeepWorkload { uid: "u1".into() })),
            "2a 04 0a 02 75 31",
        ),
        (
            "Windows del(u1)",
            request(Req::Del(zds::DelWorkload { uid: "u1".into() })),
            "12 04 12 02 75 31",
        ),
        (
            "WindowsNamespace{id 0} is omitted, guid kept",
            zds::WindowsNamespace {
                id: 0,
                guid: "G".into(),
            }
            .encode_to_vec(),
            "12 01 47",
        ),
        (
            "WorkloadInfo.service_account is field 3",
            zds::WorkloadInfo {
                service_account: x(),
                ..Default::default()
            }
            .encode_to_vec(),
            "1a 01 78",
        ),
        (
            "Address{workload: {}}",
            workload::Address {
                r#type: Some(workload::address::Type::Workload(Default::default())),
            }
            .encode_to_vec(),
            "0a 00",
        ),
        (
            "Address{service: {}}",
            workload::Address {
                r#type: Some(workload::address::Type::Service(Default::default())),
            }
            .encode_to_vec(),
            "12 00",
        ),
        (
            "Workload.uid is field 20",
            workload::Workload {
                uid: x(),
                ..Default::default()
            }
            .encode_to_vec(),
            "a2 01 01 78",
        ),
        (
            "Workload.capacity is a UInt32Value at 27",
            workload::Workload {
                capacity: Some(2),
                ..Default::default()
            }
            .encode_to_vec(),
            "da 01 02 08 02",
        ),
        (
            "Workload.capacity = 0 is present but empty",
            workload::Workload {
                capacity: Some(0),
                ..Default::default()
            }
            .encode_to_vec(),
            "da 01 00",
        ),
        (
            "Workload.tunnel_protocol HBONE is field 5",
            workload::Workload {
                tunnel_protocol: workload::TunnelProtocol::Hbone.into(),
                ..Default::default()
            }
            .encode_to_vec(),
            "28 01",
        ),
        (
            "Service.hostname is field 3",
            workload::Service {
                hostname: "h".into(),
                ..Default::default()
            }
            .encode_to_vec(),
            "1a 01 68",
        ),
        (
            "Service.visibility NAMESPACE is field 14",
            workload::Service {
                visibility: workload::Visibility::Namespace.into(),
                ..Default::default()
            }
            .encode_to_vec(),
            "70 01",
        ),
        (
            "NetworkAddress.length is optional: 0 is still sent",
            workload::NetworkAddress {
                length: Some(0),
                ..Default::default()
            }
            .encode_to_vec(),
            "18 00",
        ),
        (
            "GatewayAddress.hbone_mtls_port is field 3",
            workload::GatewayAddress {
                hbone_mtls_port: 15008,
                ..Default::default()
            }
            .encode_to_vec(),
            "18 a0 75",
        ),
        (
            "LoadBalancing.routing_preference is packed",
            workload::LoadBalancing {
                routing_preference: vec![workload::load_balancing::Scope::Node.into()],
                ..Default::default()
            }
            .encode_to_vec(),
            "0a 01 04",
        ),
        (
            "ApplicationTunnel PROXY",
            workload::ApplicationTunnel {
                protocol: workload::application_tunnel::Protocol::Proxy.into(),
                port: 0,
            }
            .encode_to_vec(),
            "08 01",
        ),
        (
            "Port.app_protocol TLS is field 3",
            workload::Port {
                app_protocol: workload::AppProtocol::Tls.into(),
                ..Default::default()
            }
            .encode_to_vec(),
            "18 05",
        ),
        (
            "Authorization.action DENY is field 4",
            security::Authorization {
                action: security::Action::Deny.into(),
                ..Default::default()
            }
            .encode_to_vec(),
            "20 01",
        ),
        (
            "StringMatch presence is field 4",
            security::StringMatch {
                match_type: Some(security::string_match::MatchType::Presence(())),
            }
            .encode_to_vec(),
            "22 00",
        ),
        (
            "Clause.matches is field 2",
            security::Clause {
                matches: vec![security::Match::default()],
            }
            .encode_to_vec(),
            "12 00",
        ),
        (
            "Match.destination_ports is packed field 9",
            security::Match {
                destination_ports: vec![80],
                ..Default::default()
            }
            .encode_to_vec(),
            "4a 01 50",
        ),
        (
            "ServiceAccountMatch.serviceAccount is field 2",
            security::ServiceAccountMatch {
                service_account: "s".into(),
                ..Default::default()
            }
            .encode_to_vec(),
            "12 01 73",
        ),
        (
            "IstioCertificateRequest.validity_duration is field 3",
            ca::IstioCertificateRequest {
                validity_duration: 86400,
                ..Default::default()
            }
            .encode_to_vec(),
            "18 80 a3 05",
        ),
        (
            "IstioCertificateResponse.cert_chain is field 1",
            ca::IstioCertificateResponse {
                cert_chain: vec!["c".into()],
            }
            .encode_to_vec(),
            "0a 01 63",
        ),
        (
            "DeltaDiscoveryRequest.response_nonce is field 6",
            discovery::DeltaDiscoveryRequest {
                response_nonce: "n".into(),
                ..Default::default()
            }
            .encode_to_vec(),
            "32 01 6e",
        ),
        (
            "DeltaDiscoveryRequest.error_detail is field 7",
            discovery::DeltaDiscoveryRequest {
                error_detail: Some(rpc::Status {
                    code: 3,
                    ..Default::default()
                }),
                ..Default::default()
            }
            .encode_to_vec(),
            "3a 02 08 03",
        ),
        (
            "DeltaDiscoveryResponse nonce 5, removed_resources 6",
            discovery::DeltaDiscoveryResponse {
                nonce: "n".into(),
                removed_resources: vec!["r".into()],
                ..Default::default()
            }
            .encode_to_vec(),
            "2a 01 6e 32 01 72",
        ),
        (
            "Resource version 1, name 3",
            discovery::Resource {
                version: "v".into(),
                name: "r".into(),
                ..Default::default()
            }
            .encode_to_vec(),
            "0a 01 76 1a 01 72",
        ),
        (
            "Node id 1, cluster 2",
            core::Node {
                id: "i".into(),
                cluster: "c".into(),
                ..Default::default()
            }
            .encode_to_vec(),
            "0a 01 69 12 01 63",
        ),
        (
            "Status.message is field 2",
            rpc::Status {
                message: "m".into(),
                ..Default::default()
            }
            .encode_to_vec(),
            "12 01 6d",
        ),
        (
            "PodSandboxStatusRequest{pod_sandbox_id: x, verbose}",
            cri::PodSandboxStatusRequest {
                pod_sandbox_id: "x".into(),
                verbose: true,
            }
            .encode_to_vec(),
            "0a 01 78 10 01",
        ),
        (
            "PodSandboxStatusResponse.info is field 2, a map",
            cri::PodSandboxStatusResponse {
                status: None,
                info: [("info".to_owned(), "x".to_owned())].into(),
            }
            .encode_to_vec(),
            "12 09 0a 04 69 6e 66 6f 12 01 78",
        ),
        (
            "PodSandboxMetadata.uid is field 2",
            cri::PodSandboxMetadata {
                uid: "x".into(),
                ..Default::default()
            }
            .encode_to_vec(),
            "12 01 78",
        ),
        (
            "ListPodSandboxResponse{items: [PodSandbox{id: x, state: NOTREADY}]}",
            cri::ListPodSandboxResponse {
                items: vec![cri::PodSandbox {
                    id: "x".into(),
                    state: cri::PodSandboxState::SandboxNotready.into(),
                    ..Default::default()
                }],
            }
            .encode_to_vec(),
            "0a 05 0a 01 78 18 01",
        ),
    ]
}

#[test]
fn encodings_match_the_spec_bytes() {
    let failures: Vec<String> = cases()
        .into_iter()
        .filter(|(_, got, want)| hex(got) != *want)
        .map(|(what, got, want)| format!("{what}: got {}, want {want}", hex(&got)))
        .collect();
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The other direction: upstream's bytes decode to the intended variant.
#[test]
fn spec_bytes_decode_to_the_intended_message() {
    use zds::workload_request::Payload as Req;
    let cases: [(&[u8], Option<Req>); 3] = [
        (&[0x1a, 0x00], Some(Req::SnapshotSent(zds::SnapshotSent {}))),
        (
            &[0x12, 0x03, 0x12, 0x01, b'x'],
            Some(Req::Del(zds::DelWorkload { uid: "x".into() })),
        ),
        (
            &[0x2a, 0x03, 0x0a, 0x01, b'x'],
            Some(Req::Keep(zds::KeepWorkload { uid: "x".into() })),
        ),
    ];
    for (bytes, want) in cases {
        assert_eq!(zds::WorkloadRequest::decode(bytes).unwrap().payload, want);
    }
    let hello = zds::ZdsHello::decode(&[0x08, 0x01][..]).unwrap();
    assert_eq!(hello.version(), zds::Version::V1);
}
