#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ambit_model::SpiffeId;
use ambit_proto::core::{Locality, Node};
use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};

use super::*;
use crate::objects::{ObjectSet, load_documents};
use crate::translate::{Cluster, ClusterConfig};

const GRACE: Duration = Duration::from_secs(10);

const GROUP: &str = "apiVersion: networking.istio.io/v1
kind: WorkloadGroup
metadata: {name: vm, namespace: bar}
spec:
  metadata:
    labels: {app: foo, tier: group}
    annotations: {team: a}
  template:
    serviceAccount: vm-sa
    network: net-template
    labels: {tier: template, version: v1}
";

fn cluster(extra: &str) -> Arc<Cluster> {
    let yaml = format!("{GROUP}{extra}");
    let set = ObjectSet::from_objects(load_documents("t.yaml", &yaml).unwrap()).unwrap();
    Arc::new(Cluster::new(ClusterConfig::default(), set))
}

fn registry(extra: &str, max: usize) -> Registry {
    let r = Registry::new(
        AutoRegistrationConfig {
            grace_period: GRACE,
            max_entries_per_group: max,
            instance_id: "test-control".into(),
        },
        tokio::runtime::Handle::current(),
    );
    r.set_cluster(cluster(extra));
    r
}

fn peer(id: &str) -> XdsPeer {
    XdsPeer {
        name: id.into(),
        identity: Some(SpiffeId::parse(id).unwrap()),
    }
}

const VM_ID: &str = "spiffe://cluster.local/ns/bar/sa/vm-sa";

fn facts(ip: &str) -> NodeFacts {
    NodeFacts {
        group: "vm".into(),
        namespace: "bar".into(),
        addresses: vec![ip.parse().unwrap()],
        network: String::new(),
        labels: BTreeMap::from([("tier".into(), "node".into())]),
        locality: String::new(),
    }
}

fn names(r: &Registry) -> Vec<String> {
    r.entries().into_iter().map(|e| e.metadata.name).collect()
}

#[tokio::test]
async fn the_entry_is_built_from_the_group_and_the_node() {
    let r = registry("", 8);
    let mut f = facts("10.1.0.5");
    f.network = "net-node".into();
    f.locality = "r1/z1/s1".into();
    let _reg = r.register_facts(&peer(VM_ID), &f, None).unwrap();
    let e = &r.entries()[0];
    assert_eq!(e.metadata.name, "vm-10.1.0.5-net-node");
    assert_eq!(e.metadata.namespace, "bar");
    assert_eq!(e.spec.address, "10.1.0.5");
    assert_eq!(e.spec.service_account, "vm-sa");
    assert_eq!(e.spec.network, "net-node", "the node's network wins");
    assert_eq!(e.spec.locality, "r1/z1/s1");
    let labels: Vec<_> = e
        .metadata
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    assert_eq!(
        labels,
        [
            "app=foo",
            "networking.istio.io/tunnel=http",
            "tier=node",
            "version=v1"
        ],
        "node over group metadata over template"
    );
    let a = &e.metadata.annotations;
    assert_eq!(a[AUTO_REGISTRATION_GROUP_ANNOTATION], "vm");
    assert_eq!(a["team"], "a");
    assert_eq!(a[CONTROLLER_ANNOTATION], "test-control");
    assert!(a.contains_key(CONNECTED_AT_ANNOTATION));
    assert_eq!(e.metadata.owner_references[0].name, "vm");
    assert_eq!(e.metadata.owner_references[0].kind, "WorkloadGroup");

    // The translated workload: the VM's identity, its labels select like a pod's, HBONE.
    let svc = "---\napiVersion: v1\nkind: Service\nmetadata: {name: foo, namespace: bar}\n\
               spec: {selector: {app: foo}, clusterIP: 10.96.0.9, ports: [{port: 80}]}\n";
    let mut warnings = Vec::new();
    let t = r.merge(&cluster(svc), &mut warnings).translate();
    assert!(warnings.is_empty(), "{warnings:?}");
    let w = &t.workloads[0];
    assert_eq!(
        w.uid.as_str(),
        "Kubernetes/networking.istio.io/WorkloadEntry/bar/vm-10.1.0.5-net-node"
    );
    assert_eq!(w.identity.to_string(), VM_ID);
    assert_eq!(w.services.len(), 1, "{:?}", w.services);
    assert_eq!(
        format!("{:?}", w.protocol),
        "Hbone",
        "the tunnel label makes the entry HBONE"
    );
}

#[test]
fn entry_names() {
    let cases: &[(&str, &str, &str, &str)] = &[
        ("v4", "10.0.0.1", "", "vm-10.0.0.1"),
        ("v6 colons become dashes", "fd00::1", "", "vm-fd00--1"),
        ("network appended", "10.0.0.1", "n1", "vm-10.0.0.1-n1"),
    ];
    for (what, ip, net, want) in cases {
        assert_eq!(entry_name("vm", ip.parse().unwrap(), net), *want, "{what}");
    }
    let long = "g".repeat(300);
    let name = entry_name(&long, "10.0.0.1".parse().unwrap(), "");
    assert_eq!(name.len(), 253, "cut from the front");
    assert!(name.ends_with("-10.0.0.1"));
}

#[tokio::test]
async fn refusals_register_nothing() {
    let pod = "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: bar}\n\
               spec: {nodeName: n1}\nstatus: {podIP: 10.1.0.9}\n";
    type Edit = fn(&mut NodeFacts);
    let cases: &[(&str, Option<&str>, Edit, &str, &str)] = &[
        (
            "node proxy token",
            None,
            |_| {},
            "",
            "needs a workload identity",
        ),
        (
            "wrong service account",
            Some("spiffe://cluster.local/ns/bar/sa/other"),
            |_| {},
            "",
            "is not service account vm-sa",
        ),
        (
            "wrong namespace",
            Some("spiffe://cluster.local/ns/baz/sa/vm-sa"),
            |_| {},
            "",
            "is not in namespace bar",
        ),
        (
            "other trust domain",
            Some("spiffe://evil.example/ns/bar/sa/vm-sa"),
            |_| {},
            "",
            "is not in trust domain",
        ),
        (
            "no such group",
            Some(VM_ID),
            |f| f.group = "nope".into(),
            "",
            "not found",
        ),
        (
            "no namespace",
            Some(VM_ID),
            |f| f.namespace.clear(),
            "",
            "NAMESPACE: required",
        ),
        (
            "loopback address",
            Some(VM_ID),
            |f| f.addresses = vec!["127.0.0.1".parse().unwrap()],
            "",
            "can not be a workload's address",
        ),
        (
            "no address at all",
            Some(VM_ID),
            |f| f.addresses.clear(),
            "",
            "no INSTANCE_IPS",
        ),
        (
            "a pod's address",
            Some(VM_ID),
            |f| f.addresses = vec!["10.1.0.9".parse().unwrap()],
            pod,
            "already Pod bar/p's",
        ),
    ];
    for (what, id, edit, extra, want) in cases {
        let r = registry(extra, 8);
        let p = id.map_or_else(|| XdsPeer::named("node proxy n1"), peer);
        let mut f = facts("10.1.0.5");
        edit(&mut f);
        let err = r.register_facts(&p, &f, None).unwrap_err().to_string();
        assert!(err.contains(want), "{what}: {err}");
        assert!(r.entries().is_empty(), "{what}: nothing registered");
    }
}

#[tokio::test]
async fn the_connection_address_when_the_node_declares_none() {
    let r = registry("", 8);
    let mut f = facts("10.1.0.5");
    f.addresses.clear();
    let remote: SocketAddr = "[::ffff:10.2.0.7]:40000".parse().unwrap();
    let _reg = r.register_facts(&peer(VM_ID), &f, Some(remote)).unwrap();
    assert_eq!(r.entries()[0].spec.address, "10.2.0.7");
}

#[tokio::test]
async fn a_group_holds_a_bounded_number_of_entries() {
    let r = registry("", 2);
    let _a = r
        .register_facts(&peer(VM_ID), &facts("10.1.0.1"), None)
        .unwrap();
    let _b = r
        .register_facts(&peer(VM_ID), &facts("10.1.0.2"), None)
        .unwrap();
    let err = r
        .register_facts(&peer(VM_ID), &facts("10.1.0.3"), None)
        .unwrap_err();
    assert!(
        matches!(err, RegisterError::GroupFull { max: 2, .. }),
        "{err}"
    );
    assert_eq!(names(&r), ["vm-10.1.0.1", "vm-10.1.0.2"]);
    // A reconnect of a registered VM is not a new entry.
    let _a2 = r
        .register_facts(&peer(VM_ID), &facts("10.1.0.1"), None)
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn removed_after_the_grace_period_unless_it_reconnects() {
    let r = registry("", 8);
    let reg = r
        .register_facts(&peer(VM_ID), &facts("10.1.0.5"), None)
        .unwrap();
    drop(reg);
    let e = &r.entries()[0];
    assert!(
        e.metadata
            .annotations
            .contains_key(DISCONNECTED_AT_ANNOTATION)
    );
    assert!(!e.metadata.annotations.contains_key(CONNECTED_AT_ANNOTATION));
    tokio::time::sleep(GRACE - Duration::from_millis(1)).await;
    assert_eq!(names(&r), ["vm-10.1.0.5"], "kept during the grace period");

    // Back within the grace period: kept past it.
    let reg = r
        .register_facts(&peer(VM_ID), &facts("10.1.0.5"), None)
        .unwrap();
    tokio::time::sleep(GRACE * 3).await;
    assert_eq!(
        names(&r),
        ["vm-10.1.0.5"],
        "a reconnect cancels the removal"
    );
    assert!(
        r.entries()[0]
            .metadata
            .annotations
            .contains_key(CONNECTED_AT_ANNOTATION)
    );

    // A second stream of the same VM: the entry stays until both are gone.
    let second = r
        .register_facts(&peer(VM_ID), &facts("10.1.0.5"), None)
        .unwrap();
    drop(reg);
    tokio::time::sleep(GRACE * 2).await;
    assert_eq!(names(&r), ["vm-10.1.0.5"], "one stream still open");
    drop(second);
    tokio::time::sleep(GRACE + Duration::from_millis(1)).await;
    assert!(r.entries().is_empty(), "removed after the grace period");
}

#[tokio::test]
async fn a_declared_entry_wins_and_a_missing_group_is_not_served() {
    let r = registry("", 8);
    let _reg = r
        .register_facts(&peer(VM_ID), &facts("10.1.0.5"), None)
        .unwrap();
    let declared = "---\napiVersion: networking.istio.io/v1\nkind: WorkloadEntry\n\
                    metadata: {name: vm-10.1.0.5, namespace: bar}\nspec: {address: 10.1.0.6}\n";
    let mut warnings = Vec::new();
    let merged = r.merge(&cluster(declared), &mut warnings);
    assert_eq!(merged.objects.workload_entries.len(), 1);
    assert_eq!(merged.objects.workload_entries[0].spec.address, "10.1.0.6");
    assert_eq!(warnings.len(), 1, "{warnings:?}");

    let empty = Cluster::new(ClusterConfig::default(), ObjectSet::new());
    let merged = r.merge(&empty, &mut Vec::new());
    assert!(
        merged.objects.workload_entries.is_empty(),
        "no group, no entry"
    );
}

fn s(v: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(v.into())),
    }
}

fn node(fields: &[(&str, Value)]) -> Node {
    Node {
        id: "ztunnel~10.1.0.5~vm.bar~bar.svc.cluster.local".into(),
        metadata: Some(Struct {
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        }),
        locality: Some(Locality {
            region: "r".into(),
            zone: "z".into(),
            sub_zone: String::new(),
        }),
        ..Default::default()
    }
}

#[test]
fn node_metadata() {
    let labels = |pairs: &[(&str, Value)]| Value {
        kind: Some(Kind::StructValue(Struct {
            fields: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        })),
    };
    let list = |items: &[&str]| Value {
        kind: Some(Kind::ListValue(ListValue {
            values: items.iter().map(|i| s(i)).collect(),
        })),
    };
    let ok = |fields: &[(&str, Value)]| NodeFacts::from_node(&node(fields)).unwrap();
    assert_eq!(
        ok(&[(META_NAMESPACE, s("bar"))]),
        None,
        "no group: nothing to do"
    );
    let f = ok(&[
        (META_GROUP, s("vm")),
        (META_NAMESPACE, s("bar")),
        (META_INSTANCE_IPS, s("10.1.0.5, fd00::5")),
        (META_NETWORK, s("n1")),
        (
            META_LABELS,
            labels(&[("app", s("foo")), ("istio-locality", s("r.z"))]),
        ),
    ])
    .unwrap();
    let want: Vec<IpAddr> = vec!["10.1.0.5".parse().unwrap(), "fd00::5".parse().unwrap()];
    assert_eq!(f.addresses, want);
    assert_eq!(f.network, "n1");
    assert_eq!(f.locality, "r/z/");
    assert_eq!(
        f.labels,
        BTreeMap::from([("app".to_string(), "foo".to_string())]),
        "istio-locality dropped"
    );
    let f = ok(&[
        (META_GROUP, s("vm")),
        (META_INSTANCE_IPS, list(&["10.1.0.5"])),
    ])
    .unwrap();
    assert_eq!(f.addresses.len(), 1, "a list of addresses reads too");

    type Fields = Vec<(&'static str, Value)>;
    let bad: &[(&str, Fields, &str)] = &[
        (
            "bad address",
            vec![(META_INSTANCE_IPS, s("10.1.0.x"))],
            "not an IP address",
        ),
        (
            "label not a string",
            vec![(META_LABELS, labels(&[("a", list(&["x"]))]))],
            "a: expected a string",
        ),
        (
            "labels not an object",
            vec![(META_LABELS, s("app=foo"))],
            "expected an object",
        ),
        (
            "namespace not a string",
            vec![(META_NAMESPACE, list(&["bar"]))],
            "NAMESPACE: expected a string",
        ),
    ];
    for (what, fields, want) in bad {
        let mut fields = fields.clone();
        fields.push((META_GROUP, s("vm")));
        let err = NodeFacts::from_node(&node(&fields))
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{what}: {err}");
    }
}
