//! Encode → decode → equal for every message type, and a check that the table really
//! covers every message declared in our .proto files.

use std::collections::BTreeSet;
use std::fmt::Debug;

use ambit_proto::prost::{Message, Name};
use ambit_proto::prost_types::FileDescriptorSet;
use ambit_proto::{core, cri, discovery, security, workload, zds};

use crate::samples as s;

/// A type-erased round trip of one sample; returns what went wrong.
pub struct Case {
    pub full_name: String,
    pub encoded: Vec<u8>,
    check: Box<dyn Fn() -> Result<(), String>>,
}

fn case<M>(sample: M) -> Case
where
    M: Message + Name + Default + PartialEq + Debug + 'static,
{
    let encoded = sample.encode_to_vec();
    let bytes = encoded.clone();
    Case {
        full_name: M::full_name(),
        encoded,
        check: Box::new(move || {
            let decoded = M::decode(bytes.as_slice()).map_err(|e| format!("decode: {e}"))?;
            if decoded != sample {
                return Err(format!("decoded {decoded:?}\n  != sample {sample:?}"));
            }
            if decoded.encoded_len() != bytes.len() {
                return Err("re-encoded length differs".into());
            }
            Ok(())
        }),
    }
}

/// Every sample; empty messages (SnapshotSent) are the only default values allowed.
pub fn cases() -> Vec<Case> {
    use zds::workload_request::Payload as Req;
    let request = |payload| zds::WorkloadRequest {
        payload: Some(payload),
    };
    let mut cases = vec![
        case(zds::ZdsHello {
            version: zds::Version::V1.into(),
        }),
        case(s::workload_info()),
        case(s::windows_namespace()),
        case(zds::WorkloadInfo {
            windows_namespace: Some(s::windows_namespace()),
            ..s::workload_info()
        }),
        case(zds::AddWorkload {
            uid: "u".into(),
            workload_info: Some(s::workload_info()),
        }),
        case(zds::KeepWorkload { uid: "u".into() }),
        case(zds::DelWorkload { uid: "u".into() }),
        case(zds::SnapshotSent {}),
        case(zds::Ack {
            error: "nack".into(),
        }),
        case(request(Req::Add(zds::AddWorkload {
            uid: "u".into(),
            workload_info: Some(s::workload_info()),
        }))),
        case(request(Req::Del(zds::DelWorkload { uid: "u".into() }))),
        case(request(Req::SnapshotSent(zds::SnapshotSent {}))),
        case(request(Req::Keep(zds::KeepWorkload { uid: "u".into() }))),
        case(zds::WorkloadResponse {
            payload: Some(zds::workload_response::Payload::Ack(zds::Ack {
                error: "e".into(),
            })),
        }),
        case(workload::Address {
            r#type: Some(workload::address::Type::Workload(s::workload())),
        }),
        case(workload::Address {
            r#type: Some(workload::address::Type::Service(s::service())),
        }),
        case(s::workload()),
        case(s::service()),
        case(s::load_balancing()),
        case(s::namespaced_hostname()),
        case(s::network_address()),
        case(s::gateway_by_host()),
        case(s::gateway_by_address()),
        case(s::weighted_waypoint()),
        case(s::port()),
        case(s::port_list()),
        case(s::locality()),
        case(s::application_tunnel()),
        case(s::extension()),
        case(s::authorization()),
        case(s::rule()),
        case(s::clause()),
        case(s::authz_match()),
        case(s::authz_address()),
        case(s::service_account_match()),
        case(s::status()),
        case(s::node()),
        case(core::Locality {
            region: "r".into(),
            zone: "z".into(),
            sub_zone: "s".into(),
        }),
        case(s::metadata()),
        case(core::ControlPlane {
            identifier: "cp".into(),
        }),
        case(s::delta_request()),
        case(s::delta_response()),
        case(s::resource()),
        case(discovery::resource::CacheControl { do_not_cache: true }),
        case(s::certificate_request()),
        case(s::certificate_response()),
        case(s::sandbox_metadata()),
        case(cri::PodSandboxStatusRequest {
            pod_sandbox_id: "sb".into(),
            verbose: true,
        }),
        case(s::sandbox_status()),
        case(cri::PodSandboxStatusResponse {
            status: Some(s::sandbox_status()),
            info: [("info".to_owned(), "{}".to_owned())].into(),
        }),
        case(s::sandbox_state_value()),
        case(s::sandbox_filter()),
        case(cri::ListPodSandboxRequest {
            filter: Some(s::sandbox_filter()),
        }),
        case(s::sandbox()),
        case(cri::ListPodSandboxResponse {
            items: vec![s::sandbox(), s::sandbox()],
        }),
    ];
    cases.extend(s::string_matches().into_iter().map(case));
    cases
}

#[test]
fn every_sample_round_trips() {
    let failures: Vec<String> = cases()
        .iter()
        .filter_map(|c| (c.check)().err().map(|e| format!("{}: {e}", c.full_name)))
        .collect();
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn samples_are_not_default() {
    let empty_allowed = zds::SnapshotSent::full_name();
    let defaults: Vec<String> = cases()
        .into_iter()
        .filter(|c| c.encoded.is_empty() && c.full_name != empty_allowed)
        .map(|c| c.full_name)
        .collect();
    assert!(
        defaults.is_empty(),
        "samples encode to nothing: {defaults:?}"
    );
}

/// Messages declared in our own files (not google.protobuf), nested ones included,
/// synthetic map-entry messages excluded.
pub fn declared_messages() -> BTreeSet<String> {
    fn walk(prefix: &str, messages: &[ambit_proto::prost_types::DescriptorProto]) -> Vec<String> {
        messages
            .iter()
            .filter(|m| !m.options.as_ref().is_some_and(|o| o.map_entry()))
            .flat_map(|m| {
                let name = format!("{prefix}.{}", m.name());
                let mut names = walk(&name, &m.nested_type);
                names.push(name);
                names
            })
            .collect()
    }
    let set = FileDescriptorSet::decode(ambit_proto::FILE_DESCRIPTOR_SET)
        .expect("build.rs wrote a valid descriptor set");
    set.file
        .iter()
        .filter(|f| f.package() != "google.protobuf")
        .flat_map(|f| walk(f.package(), &f.message_type))
        .collect()
}

#[test]
fn round_trip_table_covers_every_declared_message() {
    let covered: BTreeSet<String> = cases().into_iter().map(|c| c.full_name).collect();
    let declared = declared_messages();
    let missing: Vec<_> = declared.difference(&covered).collect();
    assert!(missing.is_empty(), "no round-trip sample for {missing:?}");
    // Guard against the walk silently finding nothing.
    assert!(declared.contains("istio.workload.zds.WorkloadRequest"));
    assert!(declared.contains("envoy.service.discovery.v3.Resource.CacheControl"));
}

#[test]
fn type_urls_match_the_xds_constants() {
    let cases = [
        (workload::Address::type_url(), ambit_proto::ADDRESS_TYPE_URL),
        (
            security::Authorization::type_url(),
            ambit_proto::AUTHORIZATION_TYPE_URL,
        ),
    ];
    for (generated, constant) in cases {
        assert_eq!(generated, constant);
    }
}

#[test]
fn resource_any_unpacks_to_the_address() {
    let resource = s::resource();
    let any = resource.resource.unwrap();
    assert_eq!(any.type_url, ambit_proto::ADDRESS_TYPE_URL);
    let address: workload::Address = any.to_msg().unwrap();
    assert_eq!(
        address.r#type,
        Some(workload::address::Type::Workload(s::workload()))
    );
}
