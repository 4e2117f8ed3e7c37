//! AuthorizationPolicy → Authorization rules, one table row per rule.

use ambit_control::objects::{ObjectSet, load_documents};
use ambit_control::translate::{Cluster, ClusterConfig, Translation};
use ambit_model::authz::{
    Action, Authorization, Clause, Match, Rule, Scope, ServiceAccountMatch, StringMatch,
};
use ambit_model::{Cidr, PolicyKey};

fn translate(yaml: &str) -> Translation {
    let objects = load_documents("test.yaml", yaml).expect("test YAML loads");
    let set = ObjectSet::from_objects(objects).expect("no duplicates");
    Cluster::new(ClusterConfig::default(), set).translate()
}

/// An AuthorizationPolicy `ap` in `ns` with this spec (flow YAML).
fn ap(ns: &str, spec: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n\
         metadata: {{name: ap, namespace: {ns}}}\nspec: {spec}\n"
    )
}

fn policy(ns: &str, scope: Scope, action: Action, rules: Vec<Rule>) -> Authorization {
    Authorization {
        key: PolicyKey::new(ns, "ap").expect("policy key"),
        scope,
        action,
        dry_run: false,
        rules,
    }
}

fn rule(clauses: Vec<Vec<Match>>) -> Rule {
    Rule {
        clauses: clauses
            .into_iter()
            .map(|matches| Clause { matches })
            .collect(),
    }
}

fn cidr(s: &str) -> Cidr {
    s.parse().expect("CIDR")
}

fn exact(s: &str) -> StringMatch {
    StringMatch::Exact(s.to_string())
}

fn ports(p: &[u16]) -> Match {
    Match {
        destination_ports: p.to_vec(),
        ..Match::default()
    }
}

fn principals(p: &[&str]) -> Match {
    Match {
        principals: p.iter().map(|s| exact(s)).collect(),
        ..Match::default()
    }
}

use Action::{Allow, Deny};
use Scope::{Global, Namespace, WorkloadSelector};

#[test]
fn policy_rules() {
    // (case, yaml, expected policy or None when skipped, expected warning fragment or "")
    let cases: Vec<(&str, String, Option<Authorization>, &str)> = vec![
        (
            "root namespace without selector: GLOBAL",
            ap("istio-system", "{rules: [{}]}"),
            Some(policy("istio-system", Global, Allow, vec![rule(vec![])])),
            "",
        ),
        (
            "namespace without selector: NAMESPACE",
            ap("ns", "{rules: [{}]}"),
            Some(policy("ns", Namespace, Allow, vec![rule(vec![])])),
            "",
        ),
        (
            "selector: WORKLOAD_SELECTOR",
            ap("ns", "{selector: {matchLabels: {app: a}}, rules: [{}]}"),
            Some(policy("ns", WorkloadSelector, Allow, vec![rule(vec![])])),
            "",
        ),
        (
            "selector in the root namespace: WORKLOAD_SELECTOR",
            ap("istio-system", "{selector: {matchLabels: {app: a}}}"),
            Some(policy("istio-system", WorkloadSelector, Allow, vec![])),
            "",
        ),
        (
            "empty matchLabels: the whole namespace",
            ap("ns", "{selector: {matchLabels: {}}}"),
            Some(policy("ns", Namespace, Allow, vec![])),
            "",
        ),
        (
            "no rules: ALLOW allows nothing",
            ap("ns", "{rules: []}"),
            Some(policy("ns", Namespace, Allow, vec![])),
            "",
        ),
        (
            "no spec at all: ALLOW allows nothing",
            ap("ns", "{}"),
            Some(policy("ns", Namespace, Allow, vec![])),
            "",
        ),
        (
            "one empty rule: allows everything",
            ap("ns", "{rules: [{}]}"),
            Some(policy("ns", Namespace, Allow, vec![rule(vec![])])),
            "",
        ),
        (
            "DENY action",
            ap(
                "ns",
                "{action: DENY, rules: [{to: [{operation: {ports: ['22']}}]}]}",
            ),
            Some(policy(
                "ns",
                Namespace,
                Deny,
                vec![rule(vec![vec![ports(&[22])]])],
            )),
            "",
        ),
        (
            "AUDIT skipped",
            ap("ns", "{action: AUDIT, rules: [{}]}"),
            None,
            "action AUDIT",
        ),
        (
            "CUSTOM skipped",
            ap("ns", "{action: CUSTOM, provider: {name: ext}, rules: [{}]}"),
            None,
            "action CUSTOM",
        ),
        (
            "waypoint policy (targetRefs) skipped",
            ap(
                "ns",
                "{targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: w}], rules: [{}]}",
            ),
            None,
            "targetRef",
        ),
        (
            "waypoint policy (targetRef) skipped",
            ap("ns", "{targetRef: {kind: Service, name: s}, rules: [{}]}"),
            None,
            "targetRef",
        ),
        (
            "principals: presence, prefix, suffix, exact",
            ap(
                "ns",
                "{rules: [{from: [{source: {principals: ['*', 'cluster.local/ns/a/*', '*/sa/b', 'cluster.local/ns/a/sa/c']}}]}]}",
            ),
            Some(policy(
                "ns",
                Namespace,
                Allow,
                vec![rule(vec![vec![Match {
                    principals: vec![
                        StringMatch::Presence,
                        StringMatch::Prefix("cluster.local/ns/a/".into()),
                        StringMatch::Suffix("/sa/b".into()),
                        exact("cluster.local/ns/a/sa/c"),
                    ],
                    ..Match::default()
                }]])],
            )),
            "",
        ),
        (
            "notPrincipals, namespaces, notNamespaces",
            ap(
                "ns",
                "{rules: [{from: [{source: {notPrincipals: ['*'], namespaces: ['team-*'], notNamespaces: [kube-system]}}]}]}",
            ),
            Some(policy(
                "ns",
                Namespace,
                Allow,
                vec![rule(vec![vec![Match {
                    not_principals: vec![StringMatch::Presence],
                    namespaces: vec![StringMatch::Prefix("team-".into())],
                    not_namespaces: vec![exact("kube-system")],
                    ..Match::default()
                }]])],
            )),
            "",
        ),
        (
            "ipBlocks and remoteIpBlocks: source IPs; IP or CIDR",
            ap(
                "ns",
                "{rules: [{from: [{source: {ipBlocks: [10.0.0.0/8, 192.168.1.1], remoteIpBlocks: ['fd00::/64'], notIpBlocks: [10.1.0.0/16], notRemoteIpBlocks: [10.2.0.1]}}]}]}",
            ),
            Some(policy(
                "ns",
                Namespace,
                Allow,
                vec![rule(vec![vec![Match {
                    source_ips: vec![
                        cidr("10.0.0.0/8"),
                        cidr("192.168.1.1/32"),
                        cidr("fd00::/64"),
                    ],
                    not_source_ips: vec![cidr("10.1.0.0/16"), cidr("10.2.0.1/32")],
                    ..Match::default()
                }]])],
            )),
            "",
        ),
        (
            "serviceAccounts: namespace/name pairs",
            ap(
                "ns",
                "{rules: [{from: [{source: {serviceAccounts: [a/b], notServiceAccounts: [c/d]}}]}]}",
            ),
            Some(policy(
                "ns",
                Namespace,
                Allow,
                vec![rule(vec![vec![Match {
                    service_accounts: vec![ServiceAccountMatch {
                        namespace: "a".into(),
                        service_account: "b".into(),
                    }],
                    not_service_accounts: vec![ServiceAccountMatch {
                        namespace: "c".into(),
                        service_account: "d".into(),
                    }],
                    ..Match::default()
                }]])],
            )),
            "",
        ),
        (
            "from entries are OR-ed: one clause, one match each",
            ap(
                "ns",
                "{rules: [{from: [{source: {principals: [x]}}, {source: {principals: [y]}}]}]}",
            ),
            Some(policy(
                "ns",
                Namespace,
                Allow,
                vec![rule(vec![vec![principals(&["x"]), principals(&["y"])]])],
            )),
            "",
        ),
        (
            "from AND to: two clauses",
            ap(
                "ns",
                "{rules: [{from: [{source: {principals: [x]}}], to: [{operation: {ports: ['80']}}, {operation: {ports: ['443']}}]}]}",
            ),
            Some(policy(
                "ns",
                Namespace,
                Allow,
                vec![rule(vec![
                    vec![principals(&["x"])],
                    vec![ports(&[80]), ports(&[443])],
                ])],
            )),
            "",
        ),
        (
            "rules are OR-ed: one Rule each",
            ap(
                "ns",
                "{rules: [{to: [{operation: {ports: ['80']}}]}, {to: [{operation: {ports: ['81']}}]}]}",
            ),
            Some(policy(
                "ns",
                Namespace,
                Allow,
                vec![
                    rule(vec![vec![ports(&[80])]]),
                    rule(vec![vec![ports(&[81])]]),
                ],
            )),
            "",
        ),
        (
            "ports and notPorts; bare numbers accepted",
            ap(
                "ns",
                "{rules: [{to: [{operation: {ports: [80, '8080'], notPorts: ['9090']}}]}]}",
            ),
            Some(policy(
                "ns",
                Namespace,
                Allow,
                vec![rule(vec![vec![Match {
                    destination_ports: vec![80, 8080],
                    not_destination_ports: vec![9090],
                    ..Match::default()
                }]])],
            )),
            "",
        ),
        (
            "an empty source matches anyone: no from clause",
            ap(
                "ns",
                "{rules: [{from: [{source: {}}], to: [{operation: {ports: ['80']}}]}]}",
            ),
            Some(policy(
                "ns",
                Namespace,
                Allow,
                vec![rule(vec![vec![ports(&[80])]])],
            )),
            "",
        ),
        (
            "bad port: ALLOW rejected, allows nothing",
            ap(
                "ns",
                "{rules: [{to: [{operation: {ports: ['80']}}]}, {to: [{operation: {ports: [http]}}]}]}",
            ),
            Some(policy("ns", Namespace, Allow, vec![])),
            "rules[1].to[0].operation.ports \"http\"",
        ),
        (
            "port out of range: rejected",
            ap("ns", "{rules: [{to: [{operation: {ports: ['70000']}}]}]}"),
            Some(policy("ns", Namespace, Allow, vec![])),
            "not a port number",
        ),
        (
            "bad port: DENY rejected, denies everything",
            ap(
                "ns",
                "{action: DENY, rules: [{to: [{operation: {notPorts: ['0']}}]}]}",
            ),
            Some(policy("ns", Namespace, Deny, vec![rule(vec![])])),
            "notPorts \"0\"",
        ),
        (
            "bad ipBlock: rejected",
            ap(
                "ns",
                "{rules: [{from: [{source: {ipBlocks: [10.0.0.0/40]}}]}]}",
            ),
            Some(policy("ns", Namespace, Allow, vec![])),
            "ipBlocks \"10.0.0.0/40\"",
        ),
        (
            "bad service account: rejected",
            ap(
                "ns",
                "{rules: [{from: [{source: {serviceAccounts: [nosa]}}]}]}",
            ),
            Some(policy("ns", Namespace, Allow, vec![])),
            "serviceAccounts \"nosa\"",
        ),
        (
            "ALLOW: a rule with L7 fields is dropped, others kept",
            ap(
                "ns",
                "{rules: [{to: [{operation: {methods: [GET], ports: ['80']}}]}, {to: [{operation: {ports: ['81']}}]}]}",
            ),
            Some(policy(
                "ns",
                Namespace,
                Allow,
                vec![rule(vec![vec![ports(&[81])]])],
            )),
            "rules[0] uses L7 attributes ztunnel can not check (to[0].operation.methods); ALLOW rule dropped",
        ),
        (
            "ALLOW: every rule L7 → the policy allows nothing",
            ap(
                "ns",
                "{rules: [{to: [{operation: {paths: [/admin]}}]}, {from: [{source: {requestPrincipals: ['*']}}]}]}",
            ),
            Some(policy("ns", Namespace, Allow, vec![])),
            "requestPrincipals",
        ),
        (
            "ALLOW: hosts are L7",
            ap("ns", "{rules: [{to: [{operation: {hosts: [a.example]}}]}]}"),
            Some(policy("ns", Namespace, Allow, vec![])),
            "operation.hosts",
        ),
        (
            "ALLOW: when on request.* is L7",
            ap(
                "ns",
                "{rules: [{when: [{key: 'request.headers[x-user]', values: [bob]}]}]}",
            ),
            Some(policy("ns", Namespace, Allow, vec![])),
            "when[0] key \"request.headers[x-user]\"",
        ),
        (
            "DENY: L7 conditions dropped, L4 ones kept",
            ap(
                "ns",
                "{action: DENY, rules: [{to: [{operation: {methods: [POST], ports: ['80']}}]}]}",
            ),
            Some(policy(
                "ns",
                Namespace,
                Deny,
                vec![rule(vec![vec![ports(&[80])]])],
            )),
            "DENY rule kept without these conditions",
        ),
        (
            "DENY: only L7 conditions → the rule matches everything",
            ap(
                "ns",
                "{action: DENY, rules: [{to: [{operation: {paths: [/admin]}}]}]}",
            ),
            Some(policy("ns", Namespace, Deny, vec![rule(vec![])])),
            "operation.paths",
        ),
        (
            "DENY: an L7-only from entry matches anyone → no from clause",
            ap(
                "ns",
                "{action: DENY, rules: [{from: [{source: {principals: [x]}}, {source: {notRequestPrincipals: ['*']}}], to: [{operation: {ports: ['80']}}]}]}",
            ),
            Some(policy(
                "ns",
                Namespace,
                Deny,
                vec![rule(vec![vec![ports(&[80])]])],
            )),
            "notRequestPrincipals",
        ),
        (
            "DENY: L7 when dropped",
            ap(
                "ns",
                "{action: DENY, rules: [{from: [{source: {principals: [x]}}], when: [{key: 'request.auth.claims[iss]', values: [a]}]}]}",
            ),
            Some(policy(
                "ns",
                Namespace,
                Deny,
                vec![rule(vec![vec![principals(&["x"])]])],
            )),
            "when[0]",
        ),
        (
            "when: L4 keys become one clause each",
            ap(
                "ns",
                "{rules: [{when: [{key: source.ip, values: [10.0.0.0/8]}, {key: destination.port, notValues: ['22']}, {key: source.namespace, values: [a]}, {key: source.principal, notValues: ['*']}, {key: destination.ip, values: [10.0.0.1]}]}]}",
            ),
            Some(policy(
                "ns",
                Namespace,
                Allow,
                vec![rule(vec![
                    vec![Match {
                        source_ips: vec![cidr("10.0.0.0/8")],
                        ..Match::default()
                    }],
                    vec![Match {
                        not_destination_ports: vec![22],
                        ..Match::default()
                    }],
                    vec![Match {
                        namespaces: vec![exact("a")],
                        ..Match::default()
                    }],
                    vec![Match {
                        not_principals: vec![StringMatch::Presence],
                        ..Match::default()
                    }],
                    vec![Match {
                        destination_ips: vec![cidr("10.0.0.1/32")],
                        ..Match::default()
                    }],
                ])],
            )),
            "",
        ),
        (
            "when: bad destination.port rejects",
            ap(
                "ns",
                "{rules: [{when: [{key: destination.port, values: [ssh]}]}]}",
            ),
            Some(policy("ns", Namespace, Allow, vec![])),
            "when[0].values \"ssh\"",
        ),
        (
            "v1beta1 reads the same",
            ap("ns", "{rules: [{}]}").replace("security.istio.io/v1", "security.istio.io/v1beta1"),
            Some(policy("ns", Namespace, Allow, vec![rule(vec![])])),
            "",
        ),
    ];
    for (case, yaml, expected, warning) in cases {
        let t = translate(&yaml);
        assert_eq!(t.policies.first(), expected.as_ref(), "{case}");
        assert_eq!(t.policies.len(), usize::from(expected.is_some()), "{case}");
        if warning.is_empty() {
            assert!(t.warnings.is_empty(), "{case}: {:?}", t.warnings);
        } else {
            assert!(
                t.warnings.iter().any(|w| w.contains(warning)),
                "{case}: {:?}",
                t.warnings
            );
            assert!(
                t.warnings
                    .iter()
                    .all(|w| w.contains("AuthorizationPolicy ns/ap: ")),
                "{case}: {:?}",
                t.warnings
            );
        }
        for p in &t.policies {
            let wire = ambit_proto::security::Authorization::from(p);
            assert_eq!(
                &Authorization::try_from(wire).expect("round trip"),
                p,
                "{case}"
            );
        }
    }
}

#[test]
fn dry_run_annotation() {
    let cases = [
        ("'true'", true, 0),
        ("'false'", false, 0),
        ("'1'", true, 0),
        ("maybe", false, 1),
    ];
    for (value, dry_run, warnings) in cases {
        let yaml = format!(
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n\
             metadata: {{name: ap, namespace: ns, annotations: {{istio.io/dry-run: {value}}}}}\n"
        );
        let t = translate(&yaml);
        assert_eq!(t.policies[0].dry_run, dry_run, "{value}");
        assert_eq!(t.warnings.len(), warnings, "{value}: {:?}", t.warnings);
    }
}

#[test]
fn workloads_list_their_selector_policies() {
    let pods = [
        ("a", "ns", "{app: a}"),
        ("b", "ns", "{app: b}"),
        ("c", "other", "{app: a}"),
    ]
    .map(|(name, ns, labels)| {
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, labels: {labels}}}\n")
    });
    let policies = [
        ("sel", "ns", "{selector: {matchLabels: {app: a}}}"),
        ("nswide", "ns", "{}"),
        ("global", "istio-system", "{}"),
        (
            "rootsel",
            "istio-system",
            "{selector: {matchLabels: {app: a}}}",
        ),
        (
            "audit",
            "ns",
            "{action: AUDIT, selector: {matchLabels: {app: a}}}",
        ),
    ]
    .map(|(name, ns, spec)| {
        format!(
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n\
             metadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n"
        )
    });
    let yaml = pods
        .iter()
        .chain(&policies)
        .cloned()
        .collect::<Vec<_>>()
        .join("---\n");
    let t = translate(&yaml);
    let listed = |pod: &str| {
        let w = t.workloads.iter().find(|w| w.name == pod).unwrap();
        w.authorization_policies
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    };
    let cases: [(&str, &[&str]); 3] = [
        ("a", &["istio-system/rootsel", "ns/sel"]),
        ("b", &[]),
        ("c", &["istio-system/rootsel"]),
    ];
    for (pod, expected) in cases {
        assert_eq!(listed(pod), expected, "pod {pod}");
    }
}
