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
            "ipBlocks and notIpBlocks: source IPs; IP or CIDR",
            ap(
                "ns",
                "{rules: [{from: [{source: {ipBlocks: [10.0.0.0/8, 192.168.1.1, 'fd00::/64'], notIpBlocks: [10.1.0.0/16, 10.2.0.1]}}]}]}",
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
            "ALLOW: remoteIpBlocks is not the peer address: the rule is dropped, as istiod",
            ap(
                "ns",
                "{rules: [{from: [{source: {ipBlocks: [10.0.0.0/8], remoteIpBlocks: ['fd00::/64']}}]}]}",
            ),
            Some(policy("ns", Namespace, Allow, vec![])),
            "from[0].source.remoteIpBlocks",
        ),
        (
            "DENY: remoteIpBlocks dropped, ipBlocks kept (denies more)",
            ap(
                "ns",
                "{action: DENY, rules: [{from: [{source: {ipBlocks: [10.0.0.0/8], notRemoteIpBlocks: [10.2.0.1]}}]}]}",
            ),
            Some(policy(
                "ns",
                Namespace,
                Deny,
                vec![rule(vec![vec![Match {
                    source_ips: vec![cidr("10.0.0.0/8")],
                    ..Match::default()
                }]])],
            )),
            "from[0].source.notRemoteIpBlocks",
        ),
        (
            "bad remoteIpBlocks: rejected although never sent",
            ap(
                "ns",
                "{action: DENY, rules: [{from: [{source: {remoteIpBlocks: [nope]}}]}]}",
            ),
            Some(policy("ns", Namespace, Deny, vec![rule(vec![])])),
            "remoteIpBlocks \"nope\"",
        ),
        (
            "ALLOW: trustDomains can not be checked: the rule is dropped",
            ap(
                "ns",
                "{rules: [{from: [{source: {principals: [a], trustDomains: [td]}}]}]}",
            ),
            Some(policy("ns", Namespace, Allow, vec![])),
            "from[0].source.trustDomains",
        ),
        (
            "serviceAccounts: namespace/name pairs; a bare name is in the policy's namespace",
            ap(
                "ns",
                "{rules: [{from: [{source: {serviceAccounts: [a/b, bare], notServiceAccounts: [c/d]}}]}]}",
            ),
            Some(policy(
                "ns",
                Namespace,
                Allow,
                vec![rule(vec![vec![Match {
                    service_accounts: vec![
                        ServiceAccountMatch {
                            namespace: "a".into(),
                            service_account: "b".into(),
                        },
                        ServiceAccountMatch {
                            namespace: "ns".into(),
                            service_account: "bare".into(),
                        },
                    ],
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
            "serviceAccounts with principals: Istio refuses it, rejected",
            ap(
                "ns",
                "{rules: [{from: [{source: {serviceAccounts: [a/b], principals: [x]}}]}]}",
            ),
            Some(policy("ns", Namespace, Allow, vec![])),
            "serviceAccounts can not be combined",
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
            "an empty source (Istio refuses it): rejected, not a match-anyone",
            ap(
                "ns",
                "{rules: [{from: [{source: {}}], to: [{operation: {ports: ['80']}}]}]}",
            ),
            Some(policy("ns", Namespace, Allow, vec![])),
            "rules[0].from[0].source: empty",
        ),
        (
            "a null source: rejected",
            ap("ns", "{rules: [{from: [{source: null}]}]}"),
            Some(policy("ns", Namespace, Allow, vec![])),
            "rules[0].from[0].source: missing",
        ),
        (
            "an empty operation: rejected",
            ap("ns", "{action: DENY, rules: [{to: [{operation: {}}]}]}"),
            Some(policy("ns", Namespace, Deny, vec![rule(vec![])])),
            "rules[0].to[0].operation: empty",
        ),
        (
            "a condition without values: rejected, not a match-anyone",
            ap("ns", "{rules: [{when: [{key: source.ip}]}]}"),
            Some(policy("ns", Namespace, Allow, vec![])),
            "neither values nor notValues",
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
                "{rules: [{from: [{source: {serviceAccounts: [a/b/c]}}]}]}",
            ),
            Some(policy("ns", Namespace, Allow, vec![])),
            "serviceAccounts \"a/b/c\"",
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
            "ALLOW: remote.ip and source.serviceAccount are not istiod's L4 keys: rule dropped",
            ap(
                "ns",
                "{rules: [{when: [{key: remote.ip, values: [10.0.0.1]}]}, {when: [{key: source.serviceAccount, values: [ns/sa]}]}]}",
            ),
            Some(policy("ns", Namespace, Allow, vec![])),
            "key \"remote.ip\"",
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

/// Issue 12, hole 4: the fields of one source are AND-ed, never OR-ed, and each field's
/// meaning is istiod's. Each row is one AuthorizationPolicy rule and connections that must be
/// allowed or denied by the workload's policy set (the policy alone in its namespace).
#[test]
fn source_fields_combine_as_istiod() {
    use ambit_model::SpiffeId;
    use ambit_model::authz::{Connection, evaluate};
    let conn = |id: Option<&str>, src: &str, port: u16| Connection {
        src_identity: id.map(|i| SpiffeId::parse(i).expect("SPIFFE id")),
        src_ip: src.parse().expect("IP"),
        dst_ip: "10.9.9.9".parse().expect("IP"),
        dst_port: port,
    };
    let a = Some("spiffe://cluster.local/ns/a/sa/x");
    let b = Some("spiffe://cluster.local/ns/b/sa/y");
    // (case, spec, [(connection, allowed)])
    type Row = (&'static str, &'static str, Vec<(Connection, bool)>);
    let rows: Vec<Row> = vec![
        (
            "ipBlocks AND remoteIpBlocks: the ALLOW rule is dropped, nobody is allowed",
            "{rules: [{from: [{source: {ipBlocks: [10.0.0.0/8], remoteIpBlocks: [192.168.0.0/16]}}]}]}",
            vec![
                (conn(a, "10.0.0.1", 80), false),
                (conn(a, "192.168.0.1", 80), false),
            ],
        ),
        (
            "DENY ipBlocks AND remoteIpBlocks: denies the ipBlocks (more than asked), not the remote ones",
            "{action: DENY, rules: [{from: [{source: {ipBlocks: [10.0.0.0/8], remoteIpBlocks: [192.168.0.0/16]}}]}]}",
            vec![
                (conn(a, "10.0.0.1", 80), false),
                (conn(a, "192.168.0.1", 80), true),
            ],
        ),
        (
            "principals AND ipBlocks",
            "{rules: [{from: [{source: {principals: [cluster.local/ns/a/sa/x], ipBlocks: [10.0.0.0/8]}}]}]}",
            vec![
                (conn(a, "10.0.0.1", 80), true),
                (conn(a, "11.0.0.1", 80), false),
                (conn(b, "10.0.0.1", 80), false),
            ],
        ),
        (
            "namespaces AND notIpBlocks",
            "{rules: [{from: [{source: {namespaces: [a], notIpBlocks: [10.0.0.0/8]}}]}]}",
            vec![
                (conn(a, "11.0.0.1", 80), true),
                (conn(a, "10.0.0.1", 80), false),
                (conn(b, "11.0.0.1", 80), false),
            ],
        ),
        (
            "principals AND notNamespaces",
            "{rules: [{from: [{source: {principals: ['*'], notNamespaces: [b]}}]}]}",
            vec![
                (conn(a, "10.0.0.1", 80), true),
                (conn(b, "10.0.0.1", 80), false),
                (conn(None, "10.0.0.1", 80), false),
            ],
        ),
        (
            "notPrincipals AND ipBlocks",
            "{rules: [{from: [{source: {notPrincipals: [cluster.local/ns/b/sa/y], ipBlocks: [10.0.0.0/8]}}]}]}",
            vec![
                (conn(a, "10.0.0.1", 80), true),
                (conn(None, "10.0.0.1", 80), true),
                (conn(b, "10.0.0.1", 80), false),
                (conn(a, "11.0.0.1", 80), false),
            ],
        ),
        (
            "serviceAccounts AND ipBlocks; a bare account is in the policy's namespace",
            "{rules: [{from: [{source: {serviceAccounts: [x], ipBlocks: [10.0.0.0/8]}}]}]}",
            vec![
                (
                    conn(Some("spiffe://cluster.local/ns/ns/sa/x"), "10.0.0.1", 80),
                    true,
                ),
                (conn(a, "10.0.0.1", 80), false),
                (
                    conn(Some("spiffe://cluster.local/ns/ns/sa/x"), "11.0.0.1", 80),
                    false,
                ),
            ],
        ),
        (
            "two sources are OR-ed",
            "{rules: [{from: [{source: {namespaces: [a]}}, {source: {ipBlocks: [11.0.0.0/8]}}]}]}",
            vec![
                (conn(a, "10.0.0.1", 80), true),
                (conn(b, "11.0.0.1", 80), true),
                (conn(b, "10.0.0.1", 80), false),
            ],
        ),
        (
            "requestPrincipals beside an L4 field: the ALLOW rule is dropped",
            "{rules: [{from: [{source: {namespaces: [a], requestPrincipals: ['*']}}]}]}",
            vec![(conn(a, "10.0.0.1", 80), false)],
        ),
        (
            "source AND operation AND condition",
            "{rules: [{from: [{source: {namespaces: [a]}}], to: [{operation: {ports: ['80']}}], when: [{key: source.ip, notValues: [10.0.0.2]}]}]}",
            vec![
                (conn(a, "10.0.0.1", 80), true),
                (conn(a, "10.0.0.1", 81), false),
                (conn(a, "10.0.0.2", 80), false),
                (conn(b, "10.0.0.1", 80), false),
            ],
        ),
        (
            "ports AND notPorts in one operation",
            "{rules: [{to: [{operation: {ports: ['80', '81'], notPorts: ['81']}}]}]}",
            vec![
                (conn(a, "10.0.0.1", 80), true),
                (conn(a, "10.0.0.1", 81), false),
            ],
        ),
        (
            "condition values AND notValues",
            "{rules: [{when: [{key: source.namespace, values: ['*'], notValues: [b]}]}]}",
            vec![
                (conn(a, "10.0.0.1", 80), true),
                (conn(b, "10.0.0.1", 80), false),
                (conn(None, "10.0.0.1", 80), false),
            ],
        ),
    ];
    for (case, spec, checks) in rows {
        let t = translate(&ap("ns", spec));
        for (c, allowed) in checks {
            let decision = evaluate(&t.policies, &c);
            assert_eq!(
                decision.is_allowed(),
                allowed,
                "{case}: {c:?}: {:?}",
                t.policies
            );
        }
    }
}
