#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use ambit_model::authz::{Action, Scope};
use ambit_model::{
    AddressResource, Authorization, NamespacedHostname, PolicyKey, Service, SpiffeId, Workload,
    WorkloadUid,
};
use ambit_proto::discovery::{DeltaDiscoveryResponse, Resource};
use ambit_proto::prost::Message;
use ambit_proto::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL, security, workload};
use prost_types::Any;

use super::handler::{ApplyError, Handler};
use crate::state::ProxyState;

fn wl(uid: &str, node: &str) -> Workload {
    let mut w = Workload::new(
        WorkloadUid::new(uid).unwrap(),
        uid.rsplit('/').next().unwrap(),
        SpiffeId::parse("spiffe://cluster.local/ns/default/sa/default").unwrap(),
    );
    w.addresses = vec!["10.0.0.1".parse().unwrap()];
    w.node = node.into();
    w
}

fn address(name: &str, version: &str, a: &workload::Address) -> Resource {
    any_resource(name, version, ADDRESS_TYPE_URL, a.encode_to_vec())
}

fn any_resource(name: &str, version: &str, type_url: &str, value: Vec<u8>) -> Resource {
    Resource {
        name: name.into(),
        version: version.into(),
        resource: Some(Any {
            type_url: type_url.into(),
            value,
        }),
        ..Default::default()
    }
}

fn wl_res(uid: &str, version: &str, node: &str) -> Resource {
    let a = workload::Address::from(&AddressResource::Workload(Box::new(wl(uid, node))));
    address(uid, version, &a)
}

fn svc_res(version: &str) -> Resource {
    let s = Service::new(
        "web",
        NamespacedHostname::new("default", "web.default.svc").unwrap(),
    );
    let a = workload::Address::from(&AddressResource::Service(Box::new(s)));
    address("default/web.default.svc", version, &a)
}

fn policy_res(name: &str, version: &str) -> Resource {
    let p = Authorization {
        key: PolicyKey::new("default", name).unwrap(),
        scope: Scope::Namespace,
        action: Action::Deny,
        dry_run: false,
        rules: vec![],
    };
    any_resource(
        &format!("default/{name}"),
        version,
        AUTHORIZATION_TYPE_URL,
        security::Authorization::from(&p).encode_to_vec(),
    )
}

/// A workload whose address is 5 bytes long.
fn bad_wl_res(uid: &str, version: &str) -> Resource {
    let mut w = workload::Workload::from(&wl(uid, "bad"));
    w.addresses = vec![vec![1, 2, 3, 4, 5]];
    let a = workload::Address {
        r#type: Some(workload::address::Type::Workload(w)),
    };
    address(uid, version, &a)
}

fn resp(type_url: &str, resources: Vec<Resource>, removed: &[&str]) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        type_url: type_url.into(),
        nonce: "n".into(),
        resources,
        removed_resources: removed.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

const W1: &str = "c//v1/Pod/default/w1";
const W2: &str = "c//v1/Pod/default/w2";

/// What the state and the declared versions look like after a step.
struct Expect {
    errors: &'static [&'static str],
    /// (uid, node) of every workload.
    workloads: &'static [(&'static str, &'static str)],
    services: usize,
    policies: usize,
    /// Declared address versions, sorted.
    address_versions: &'static [(&'static str, &'static str)],
}

#[test]
fn handler_applies_and_refuses() {
    let state = Arc::new(ProxyState::new());
    let mut handler = Handler::new(state.clone());
    let steps: Vec<(&str, DeltaDiscoveryResponse, Expect)> = vec![
        (
            "first address response",
            resp(
                ADDRESS_TYPE_URL,
                vec![
                    wl_res(W1, "v1", "n1"),
                    wl_res(W2, "v1", "n1"),
                    svc_res("s1"),
                ],
                &[],
            ),
            Expect {
                errors: &[],
                workloads: &[(W1, "n1"), (W2, "n1")],
                services: 1,
                policies: 0,
                address_versions: &[(W1, "v1"), (W2, "v1"), ("default/web.default.svc", "s1")],
            },
        ),
        (
            "policies",
            resp(
                AUTHORIZATION_TYPE_URL,
                vec![policy_res("p1", "1"), policy_res("p2", "1")],
                &[],
            ),
            Expect {
                errors: &[],
                workloads: &[(W1, "n1"), (W2, "n1")],
                services: 1,
                policies: 2,
                address_versions: &[(W1, "v1"), (W2, "v1"), ("default/web.default.svc", "s1")],
            },
        ),
        (
            "invalid workload: valid ones applied, the bad one keeps its last good version",
            resp(
                ADDRESS_TYPE_URL,
                vec![wl_res(W2, "v2", "n2"), bad_wl_res(W1, "v2")],
                &[],
            ),
            Expect {
                errors: &["c//v1/Pod/default/w1", "addresses", "5"],
                workloads: &[(W1, "n1"), (W2, "n2")],
                services: 1,
                policies: 2,
                address_versions: &[(W1, "v1"), (W2, "v2"), ("default/web.default.svc", "s1")],
            },
        ),
        (
            "removals by name",
            resp(
                ADDRESS_TYPE_URL,
                vec![],
                &[W2, "default/web.default.svc", "unknown"],
            ),
            Expect {
                errors: &[],
                workloads: &[(W1, "n1")],
                services: 0,
                policies: 2,
                address_versions: &[(W1, "v1")],
            },
        ),
        (
            "policy removal",
            resp(AUTHORIZATION_TYPE_URL, vec![], &["default/p1"]),
            Expect {
                errors: &[],
                workloads: &[(W1, "n1")],
                services: 0,
                policies: 1,
                address_versions: &[(W1, "v1")],
            },
        ),
        (
            "payload problems are refused",
            resp(
                ADDRESS_TYPE_URL,
                vec![
                    Resource {
                        name: "empty".into(),
                        ..Default::default()
                    },
                    any_resource("wrong", "1", AUTHORIZATION_TYPE_URL, vec![]),
                    any_resource("garbage", "1", ADDRESS_TYPE_URL, vec![0xff, 0xff]),
                ],
                &[],
            ),
            Expect {
                errors: &[
                    "\"empty\": no payload",
                    "\"wrong\": payload type",
                    "\"garbage\": undecodable",
                ],
                workloads: &[(W1, "n1")],
                services: 0,
                policies: 1,
                address_versions: &[(W1, "v1")],
            },
        ),
        (
            "unknown type",
            resp("type.googleapis.com/other", vec![], &[]),
            Expect {
                errors: &["unsupported type type.googleapis.com/other"],
                workloads: &[(W1, "n1")],
                services: 0,
                policies: 1,
                address_versions: &[(W1, "v1")],
            },
        ),
    ];
    for (name, response, expect) in steps {
        let errors = handler.apply(&response);
        let text = errors
            .iter()
            .map(ApplyError::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        if expect.errors.is_empty() {
            assert!(errors.is_empty(), "{name}: {text}");
        }
        for want in expect.errors {
            assert!(text.contains(want), "{name}: {text:?} lacks {want:?}");
        }
        let mut workloads: Vec<(String, String)> = state
            .all_workloads()
            .iter()
            .map(|w| (w.uid.to_string(), w.node.clone()))
            .collect();
        workloads.sort();
        let want: Vec<(String, String)> = expect
            .workloads
            .iter()
            .map(|(u, n)| (u.to_string(), n.to_string()))
            .collect();
        assert_eq!(workloads, want, "{name}");
        assert_eq!(state.all_services().len(), expect.services, "{name}");
        assert_eq!(state.all_policies().len(), expect.policies, "{name}");
        let mut versions: Vec<(String, String)> =
            handler.versions(ADDRESS_TYPE_URL).into_iter().collect();
        versions.sort();
        let mut want: Vec<(String, String)> = expect
            .address_versions
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        want.sort();
        assert_eq!(versions, want, "{name}");
    }
}

#[test]
fn node_from_config() {
    let vars: Vec<(String, String)> = [
        ("POD_NAME", "ztunnel-abc"),
        ("POD_NAMESPACE", "istio-system"),
        ("INSTANCE_IP", "10.1.2.3"),
        ("NODE_NAME", "node1"),
        ("ISTIO_META_DNS_CAPTURE", "true"),
        ("ISTIO_META_CLUSTER_ID", "east"),
        ("ISTIO_METAJSON_LABELS", r#"{"app":"foo","n":[1,true]}"#),
        ("XDS_HEADER_X-Extra", "1"),
        ("AUTH_TOKEN", "literal-token"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let cfg = crate::config::Config::from_vars(&vars, 1, &|_| false).unwrap();
    let xds = super::XdsClientConfig::from_config(&cfg);
    assert_eq!(
        xds.node.id,
        "ztunnel~10.1.2.3~ztunnel-abc.istio-system~istio-system.svc.cluster.local"
    );
    let meta = xds.node.metadata.clone().unwrap().fields;
    let get = |k: &str| match meta.get(k).and_then(|v| v.kind.clone()) {
        Some(prost_types::value::Kind::StringValue(s)) => Some(s),
        _ => None,
    };
    for (k, v) in [
        ("NAME", "ztunnel-abc"),
        ("NAMESPACE", "istio-system"),
        ("INSTANCE_IPS", "10.1.2.3"),
        ("NODE_NAME", "node1"),
        ("DNS_CAPTURE", "true"),
        ("CLUSTER_ID", "east"),
    ] {
        assert_eq!(get(k).as_deref(), Some(v), "{k}");
    }
    // ISTIO_METAJSON_* arrive as structured values, as upstream ztunnel sends them.
    let Some(prost_types::value::Kind::StructValue(labels)) =
        meta.get("LABELS").and_then(|v| v.kind.clone())
    else {
        panic!("LABELS is not a struct: {:?}", meta.get("LABELS"));
    };
    assert_eq!(
        labels.fields["app"].kind,
        Some(prost_types::value::Kind::StringValue("foo".into()))
    );
    assert!(matches!(
        &labels.fields["n"].kind,
        Some(prost_types::value::Kind::ListValue(l)) if l.values.len() == 2
    ));
    assert_eq!(xds.cluster_id, "east");
    let md = xds.metadata().unwrap();
    assert_eq!(md.get("authorization").unwrap(), "Bearer literal-token");
    assert_eq!(md.get("clusterid").unwrap(), "east");
    assert_eq!(md.get("x-extra").unwrap(), "1");
}

#[test]
fn token_file_is_read_at_each_connect() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("token");
    let mut cfg = super::XdsClientConfig {
        node: Default::default(),
        token: Some(crate::config::AuthToken::File(path.clone())),
        cluster_id: "Kubernetes".into(),
        headers: vec![],
        backoff: Default::default(),
    };
    assert!(matches!(cfg.metadata(), Err(super::XdsError::Token { .. })));
    for token in ["first", "second"] {
        std::fs::write(&path, format!("{token}\n")).unwrap();
        let md = cfg.metadata().unwrap();
        assert_eq!(md.get("authorization").unwrap(), &format!("Bearer {token}"));
    }
    cfg.token = None;
    assert!(cfg.metadata().unwrap().get("authorization").is_none());
}
