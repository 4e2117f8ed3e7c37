//! The name and hostname indexes stay true through inserts, replacements and removals.

use ambit_model::identity::SpiffeId;
use ambit_model::names::{NamespacedHostname, WorkloadUid};
use ambit_model::{Service, Workload};

use super::ProxyState;

fn workload(uid: &str, name: &str, sa: &str, node: &str) -> Workload {
    let id = SpiffeId::new("cluster.local", "default", sa).unwrap();
    let mut w = Workload::new(WorkloadUid::new(uid).unwrap(), name, id);
    w.node = node.into();
    w
}

fn service(ns: &str, host: &str) -> Service {
    Service::new(host, NamespacedHostname::new(ns, host).unwrap())
}

#[test]
fn local_workload_lookup_follows_changes() {
    let state = ProxyState::new();
    state.upsert_workload(workload("b", "web", "web", "n1"));
    state.upsert_workload(workload("a", "web", "web", "n2"));
    state.upsert_workload(workload("c", "web", "other", "n1"));
    let find = |node: Option<&str>| {
        state
            .find_local_workload("web", "default", "web", node)
            .map(|w| w.uid.to_string())
    };
    // (what, change, node filter, expected uid)
    type Change = fn(&ProxyState);
    let steps: [(&str, Change, Option<&str>, Option<&str>); 5] = [
        ("smallest uid of the matches", |_| {}, None, Some("a")),
        ("node filter", |_| {}, Some("n1"), Some("b")),
        (
            "renamed record no longer matches",
            |s| s.upsert_workload(workload("a", "api", "web", "n2")),
            None,
            Some("b"),
        ),
        (
            "removed record no longer matches",
            |s| {
                s.remove_workload("b");
            },
            None,
            None,
        ),
        (
            "back under the name",
            |s| s.upsert_workload(workload("a", "web", "web", "n2")),
            Some("n2"),
            Some("a"),
        ),
    ];
    for (what, change, node, want) in steps {
        change(&state);
        assert_eq!(find(node).as_deref(), want, "{what}");
    }
}

#[test]
fn hostname_lookup_follows_changes() {
    let state = ProxyState::new();
    let hosts = |s: &ProxyState| {
        s.services_by_hostname("web.example.com")
            .iter()
            .map(|s| s.key.namespace().to_string())
            .collect::<Vec<_>>()
    };
    state.upsert_service(service("ns-b", "web.example.com"));
    state.upsert_service(service("ns-a", "web.example.com"));
    state.upsert_service(service("ns-a", "api.example.com"));
    assert_eq!(hosts(&state), ["ns-a", "ns-b"], "ordered by key");
    state.remove_service(&NamespacedHostname::new("ns-a", "web.example.com").unwrap());
    assert_eq!(hosts(&state), ["ns-b"]);
    state.replace_local(vec![], vec![], vec![]);
    assert_eq!(hosts(&state), ["ns-b"], "the file owned none of them");
    state.remove_service(&NamespacedHostname::new("ns-b", "web.example.com").unwrap());
    assert!(hosts(&state).is_empty());
    assert_eq!(state.services_by_hostname("api.example.com").len(), 1);
}
