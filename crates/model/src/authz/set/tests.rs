use super::*;
use crate::authz::{Action, Rule, Verdict};
use crate::names::WorkloadUid;

fn policy(key: &str, scope: Scope) -> Authorization {
    Authorization {
        key: key.parse().unwrap(),
        scope,
        // A DENY that matches everything: the verdict names the first applicable policy.
        action: Action::Deny,
        dry_run: false,
        rules: vec![Rule::default()],
    }
}

fn workload(ns: &str, selected: &[&str]) -> Workload {
    let id = format!("spiffe://cluster.local/ns/{ns}/sa/default")
        .parse()
        .unwrap();
    let mut w = Workload::new(WorkloadUid::new("uid").unwrap(), "w", id);
    w.authorization_policies = selected.iter().map(|k| k.parse().unwrap()).collect();
    w
}

fn applicable(set: &PolicySet, w: &Workload) -> Vec<String> {
    let mut keys: Vec<String> = set.for_workload(w).map(|p| p.key.to_string()).collect();
    keys.sort();
    keys
}

#[test]
fn scopes_select_policies() {
    let mut set = PolicySet::new();
    for (key, scope) in [
        ("a/ns-policy", Scope::Namespace),
        ("b/other-ns-policy", Scope::Namespace),
        ("istio-system/global", Scope::Global),
        ("a/selected", Scope::WorkloadSelector),
        ("a/not-selected", Scope::WorkloadSelector),
        ("b/selected-elsewhere", Scope::WorkloadSelector),
    ] {
        set.insert(policy(key, scope));
    }
    let cases: Vec<(Workload, Vec<&str>)> = vec![
        (
            workload("a", &[]),
            vec!["a/ns-policy", "istio-system/global"],
        ),
        (
            workload("a", &["a/selected"]),
            vec!["a/ns-policy", "a/selected", "istio-system/global"],
        ),
        (
            workload("a", &["b/selected-elsewhere", "a/missing"]),
            vec!["a/ns-policy", "b/selected-elsewhere", "istio-system/global"],
        ),
        (workload("c", &[]), vec!["istio-system/global"]),
        (
            workload("b", &[]),
            vec!["b/other-ns-policy", "istio-system/global"],
        ),
    ];
    for (w, want) in cases {
        assert_eq!(applicable(&set, &w), want, "{:?}", w.authorization_policies);
    }
    let w = workload("a", &["a/selected", "a/missing", "x/y"]);
    let unknown: Vec<String> = set.unknown_for(&w).map(ToString::to_string).collect();
    assert_eq!(unknown, ["a/missing", "x/y"]);
}

#[test]
fn replace_and_remove_keep_indexes_consistent() {
    let mut set = PolicySet::new();
    let w = workload("a", &[]);
    set.insert(policy("a/p", Scope::Namespace));
    assert_eq!(applicable(&set, &w), ["a/p"]);
    // Same key, new scope: must leave the namespace index.
    let old = set.insert(policy("a/p", Scope::WorkloadSelector));
    assert_eq!(old.map(|p| p.scope), Some(Scope::Namespace));
    assert!(applicable(&set, &w).is_empty());
    set.insert(policy("a/p", Scope::Global));
    assert_eq!(applicable(&set, &workload("z", &[])), ["a/p"]);
    assert_eq!(set.len(), 1);
    assert!(set.remove(&"a/p".parse().unwrap()).is_some());
    assert!(set.remove(&"a/p".parse().unwrap()).is_none());
    assert!(set.is_empty());
    assert!(applicable(&set, &workload("z", &[])).is_empty());
}

#[test]
fn evaluates_only_applicable_policies_at_scale() {
    let mut set = PolicySet::new();
    // 10,000 policies in other namespaces, all denying everything.
    for i in 0..10_000 {
        set.insert(policy(&format!("ns{i}/deny"), Scope::Namespace));
    }
    let conn = Connection {
        src_identity: None,
        src_ip: "10.0.0.1".parse().unwrap(),
        dst_ip: "10.0.0.2".parse().unwrap(),
        dst_port: 80,
    };
    assert!(set.evaluate(&workload("quiet", &[]), &conn).is_allowed());
    let decision = set.evaluate(&workload("ns42", &[]), &conn);
    let key: PolicyKey = "ns42/deny".parse().unwrap();
    assert_eq!(
        decision.verdict,
        Verdict::Deny(crate::authz::DenyReason::ExplicitDeny(&key))
    );
}
