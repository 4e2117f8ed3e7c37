use super::*;
use crate::addr::Cidr;
use crate::authz::{Scope, ServiceAccountMatch, StringMatch};

const CLIENT: &str = "spiffe://cluster.local/ns/client-ns/sa/client-sa";

fn conn(identity: Option<&str>) -> Connection {
    Connection {
        src_identity: identity.map(|id| id.parse().unwrap()),
        src_ip: "10.0.0.1".parse().unwrap(),
        dst_ip: "10.0.1.5".parse().unwrap(),
        dst_port: 8080,
    }
}

fn mtls() -> Connection {
    conn(Some(CLIENT))
}

fn plaintext() -> Connection {
    conn(None)
}

fn cidrs(list: &[&str]) -> Vec<Cidr> {
    list.iter().map(|c| c.parse().unwrap()).collect()
}

fn exact(s: &str) -> StringMatch {
    StringMatch::Exact(s.to_string())
}

fn prefix(s: &str) -> StringMatch {
    StringMatch::Prefix(s.to_string())
}

fn suffix(s: &str) -> StringMatch {
    StringMatch::Suffix(s.to_string())
}

fn sa(ns: &str, sa: &str) -> ServiceAccountMatch {
    ServiceAccountMatch {
        namespace: ns.to_string(),
        service_account: sa.to_string(),
    }
}

fn policy(name: &str, action: Action, dry_run: bool, rules: Vec<Rule>) -> Authorization {
    Authorization {
        key: PolicyKey::new("dst-ns", name).unwrap(),
        scope: Scope::Namespace,
        action,
        dry_run,
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

/// A rule set that matches every connection.
fn always() -> Vec<Rule> {
    vec![Rule::default()]
}

/// A rule set that matches no connection used in these tests.
fn never() -> Vec<Rule> {
    vec![rule(vec![vec![Match {
        destination_ports: vec![1],
        ..Match::default()
    }]])]
}

fn matches(rules: Vec<Rule>, conn: &Connection) -> bool {
    let p = policy("p", Action::Allow, false, rules);
    evaluate([&p], conn).is_allowed()
}

#[test]
fn every_match_field_and_its_negation() {
    let ok_port = Match {
        destination_ports: vec![8080],
        ..Match::default()
    };
    let cases: Vec<(&str, Match, Connection, bool)> = vec![
        // namespaces
        (
            "ns exact",
            Match {
                namespaces: vec![exact("client-ns")],
                ..Match::default()
            },
            mtls(),
            true,
        ),
        (
            "ns exact other",
            Match {
                namespaces: vec![exact("x")],
                ..Match::default()
            },
            mtls(),
            false,
        ),
        (
            "ns prefix",
            Match {
                namespaces: vec![prefix("client")],
                ..Match::default()
            },
            mtls(),
            true,
        ),
        (
            "ns suffix",
            Match {
                namespaces: vec![suffix("-ns")],
                ..Match::default()
            },
            mtls(),
            true,
        ),
        (
            "ns suffix other",
            Match {
                namespaces: vec![suffix("x")],
                ..Match::default()
            },
            mtls(),
            false,
        ),
        (
            "ns presence",
            Match {
                namespaces: vec![StringMatch::Presence],
                ..Match::default()
            },
            mtls(),
            true,
        ),
        (
            "ns any of list",
            Match {
                namespaces: vec![exact("x"), exact("client-ns")],
                ..Match::default()
            },
            mtls(),
            true,
        ),
        (
            "ns presence plaintext",
            Match {
                namespaces: vec![StringMatch::Presence],
                ..Match::default()
            },
            plaintext(),
            false,
        ),
        (
            "ns exact plaintext",
            Match {
                namespaces: vec![exact("client-ns")],
                ..Match::default()
            },
            plaintext(),
            false,
        ),
        // Upstream compares plaintext as the empty namespace, so an empty pattern matches it.
        (
            "ns empty prefix plaintext",
            Match {
                namespaces: vec![prefix("")],
                ..Match::default()
            },
            plaintext(),
            true,
        ),
        (
            "not ns same",
            Match {
                not_namespaces: vec![exact("client-ns")],
                ..Match::default()
            },
            mtls(),
            false,
        ),
        (
            "not ns other",
            Match {
                not_namespaces: vec![exact("x")],
                ..Match::default()
            },
            mtls(),
            true,
        ),
        (
            "not ns one of list",
            Match {
                not_namespaces: vec![exact("x"), prefix("client")],
                ..Match::default()
            },
            mtls(),
            false,
        ),
        (
            "not ns presence plaintext",
            Match {
                not_namespaces: vec![StringMatch::Presence],
                ..Match::default()
            },
            plaintext(),
            true,
        ),
        (
            "not ns presence mtls",
            Match {
                not_namespaces: vec![StringMatch::Presence],
                ..Match::default()
            },
            mtls(),
            false,
        ),
        // principals (compared without spiffe://)
        (
            "principal exact",
            Match {
                principals: vec![exact("cluster.local/ns/client-ns/sa/client-sa")],
                ..Match::default()
            },
            mtls(),
            true,
        ),
        (
            "principal with scheme",
            Match {
                principals: vec![exact(CLIENT)],
                ..Match::default()
            },
            mtls(),
            false,
        ),
        (
            "principal prefix",
            Match {
                principals: vec![prefix("cluster.local/ns/client-ns/")],
                ..Match::default()
            },
            mtls(),
            true,
        ),
        (
            "principal suffix",
            Match {
                principals: vec![suffix("/sa/client-sa")],
                ..Match::default()
            },
            mtls(),
            true,
        ),
        (
            "principal suffix other",
            Match {
                principals: vec![suffix("/sa/other")],
                ..Match::default()
            },
            mtls(),
            false,
        ),
        (
            "principal presence",
            Match {
                principals: vec![StringMatch::Presence],
                ..Match::default()
            },
            mtls(),
            true,
        ),
        (
            "principal presence plaintext",
            Match {
                principals: vec![StringMatch::Presence],
                ..Match::default()
            },
            plaintext(),
            false,
        ),
        (
            "principal empty prefix plaintext",
            Match {
                principals: vec![prefix("")],
                ..Match::default()
            },
            plaintext(),
            false,
        ),
        (
            "not principal presence mtls",
            Match {
                not_principals: vec![StringMatch::Presence],
                ..Match::default()
            },
            mtls(),
            false,
        ),
        (
            "not principal presence plaintext",
            Match {
                not_principals: vec![StringMatch::Presence],
                ..Match::default()
            },
            plaintext(),
            true,
        ),
        (
            "not principal exact plaintext",
            Match {
                not_principals: vec![exact("a/ns/b/sa/c")],
                ..Match::default()
            },
            plaintext(),
            true,
        ),
        (
            "not principal other",
            Match {
                not_principals: vec![exact("x")],
                ..Match::default()
            },
            mtls(),
            true,
        ),
        (
            "not principal same",
            Match {
                not_principals: vec![suffix("client-sa")],
                ..Match::default()
            },
            mtls(),
            false,
        ),
        // service accounts (trust domain ignored)
        (
            "sa same",
            Match {
                service_accounts: vec![sa("client-ns", "client-sa")],
                ..Match::default()
            },
            mtls(),
            true,
        ),
        (
            "sa other trust domain",
            Match {
                service_accounts: vec![sa("client-ns", "client-sa")],
                ..Match::default()
            },
            conn(Some("spiffe://other.td/ns/client-ns/sa/client-sa")),
            true,
        ),
        (
            "sa wrong ns",
            Match {
                service_accounts: vec![sa("x", "client-sa")],
                ..Match::default()
            },
            mtls(),
            false,
        ),
        (
            "sa wrong sa",
            Match {
                service_accounts: vec![sa("client-ns", "x")],
                ..Match::default()
            },
            mtls(),
            false,
        ),
        (
            "sa plaintext",
            Match {
                service_accounts: vec![sa("client-ns", "client-sa")],
                ..Match::default()
            },
            plaintext(),
            false,
        ),
        (
            "not sa same",
            Match {
                not_service_accounts: vec![sa("client-ns", "client-sa")],
                ..Match::default()
            },
            mtls(),
            false,
        ),
        (
            "not sa other",
            Match {
                not_service_accounts: vec![sa("client-ns", "x")],
                ..Match::default()
            },
            mtls(),
            true,
        ),
        (
            "not sa plaintext",
            Match {
                not_service_accounts: vec![sa("client-ns", "client-sa")],
                ..Match::default()
            },
            plaintext(),
            true,
        ),
        // source IPs
        (
            "src in",
            Match {
                source_ips: cidrs(&["10.0.0.0/24"]),
                ..Match::default()
            },
            mtls(),
            true,
        ),
        (
            "src out",
            Match {
                source_ips: cidrs(&["10.9.0.0/16"]),
                ..Match::default()
            },
            mtls(),
            false,
        ),
        (
            "src any of list",
            Match {
                source_ips: cidrs(&["10.9.0.0/16", "10.0.0.1"]),
                ..Match::default()
            },
            mtls(),
            true,
        ),
        (
            "not src in",
            Match {
                not_source_ips: cidrs(&["10.0.0.0/24"]),
                ..Match::default()
            },
            mtls(),
            false,
        ),
        (
            "not src out",
            Match {
                not_source_ips: cidrs(&["10.9.0.0/16"]),
                ..Match::default()
            },
            mtls(),
            true,
        ),
        (
            "src v6 range v4 peer",
            Match {
                source_ips: cidrs(&["::/0"]),
                ..Match::default()
            },
            mtls(),
            false,
        ),
        // destination IPs
        (
            "dst in",
            Match {
                destination_ips: cidrs(&["10.0.1.0/24"]),
                ..Match::default()
            },
            mtls(),
            true,
        ),
        (
            "dst out",
            Match {
                destination_ips: cidrs(&["10.0.0.0/24"]),
                ..Match::default()
            },
            mtls(),
            false,
        ),
        (
            "not dst in",
            Match {
                not_destination_ips: cidrs(&["10.0.1.5/32"]),
                ..Match::default()
            },
            mtls(),
            false,
        ),
        (
            "not dst out",
            Match {
                not_destination_ips: cidrs(&["10.0.0.0/24"]),
                ..Match::default()
            },
            mtls(),
            true,
        ),
        // destination ports
        ("port same", ok_port.clone(), mtls(), true),
        (
            "port other",
            Match {
                destination_ports: vec![80],
                ..Match::default()
            },
            mtls(),
            false,
        ),
        (
            "port any of list",
            Match {
                destination_ports: vec![80, 8080],
                ..Match::default()
            },
            mtls(),
            true,
        ),
        (
            "not port same",
            Match {
                not_destination_ports: vec![8080],
                ..Match::default()
            },
            mtls(),
            false,
        ),
        (
            "not port other",
            Match {
                not_destination_ports: vec![9999],
                ..Match::default()
            },
            mtls(),
            true,
        ),
        // several field types: ALL must match
        (
            "all types match",
            Match {
                namespaces: vec![exact("client-ns")],
                ..ok_port.clone()
            },
            mtls(),
            true,
        ),
        (
            "one type fails",
            Match {
                namespaces: vec![exact("x")],
                ..ok_port.clone()
            },
            mtls(),
            false,
        ),
        (
            "positive and negative same type",
            Match {
                source_ips: cidrs(&["10.0.0.0/8"]),
                not_source_ips: cidrs(&["10.0.0.1"]),
                ..Match::default()
            },
            mtls(),
            false,
        ),
        (
            "positive and negative both pass",
            Match {
                source_ips: cidrs(&["10.0.0.0/8"]),
                not_source_ips: cidrs(&["10.0.0.2"]),
                ..Match::default()
            },
            mtls(),
            true,
        ),
    ];
    for (name, m, conn, want) in cases {
        let rules = vec![rule(vec![vec![m]])];
        assert_eq!(matches(rules, &conn), want, "{name}");
    }
}

#[test]
fn ipv4_mapped_peers_match_ipv4_ranges() {
    let mut c = mtls();
    c.src_ip = "::ffff:10.0.0.1".parse().unwrap();
    c.dst_ip = "::ffff:10.0.1.5".parse().unwrap();
    for m in [
        Match {
            source_ips: cidrs(&["10.0.0.0/24"]),
            ..Match::default()
        },
        Match {
            destination_ips: cidrs(&["10.0.1.5"]),
            ..Match::default()
        },
    ] {
        assert!(matches(vec![rule(vec![vec![m]])], &c));
    }
    let deny_v4 = Match {
        not_source_ips: cidrs(&["10.0.0.0/24"]),
        ..Match::default()
    };
    assert!(!matches(vec![rule(vec![vec![deny_v4]])], &c));
}

#[test]
fn rule_clause_and_match_structure() {
    let yes = || Match {
        destination_ports: vec![8080],
        ..Match::default()
    };
    let no = || Match {
        destination_ports: vec![80],
        ..Match::default()
    };
    let cases: Vec<(&str, Vec<Rule>, bool)> = vec![
        ("no rules never match", vec![], false),
        ("rule without clauses matches", vec![rule(vec![])], true),
        (
            "clause without match objects matches",
            vec![rule(vec![vec![]])],
            true,
        ),
        (
            "clause of only empty match objects fails",
            vec![rule(vec![vec![Match::default()]])],
            false,
        ),
        (
            "empty match object skipped",
            vec![rule(vec![vec![Match::default(), yes()]])],
            true,
        ),
        (
            "clause: any match object",
            vec![rule(vec![vec![no(), yes()]])],
            true,
        ),
        (
            "clause: none match",
            vec![rule(vec![vec![no(), no()]])],
            false,
        ),
        (
            "rule: all clauses",
            vec![rule(vec![vec![yes()], vec![yes()]])],
            true,
        ),
        (
            "rule: one clause fails",
            vec![rule(vec![vec![yes()], vec![no()]])],
            false,
        ),
        (
            "rule: empty clause and failing clause",
            vec![rule(vec![vec![], vec![no()]])],
            false,
        ),
        (
            "policy: any rule",
            vec![rule(vec![vec![no()]]), rule(vec![vec![yes()]])],
            true,
        ),
        (
            "policy: no rule",
            vec![rule(vec![vec![no()]]), rule(vec![vec![no()]])],
            false,
        ),
    ];
    for (name, rules, want) in cases {
        assert_eq!(matches(rules, &mtls()), want, "{name}");
    }
}

#[test]
fn decision_order_and_dry_run() {
    use Action::{Allow, Deny};
    type Case = (
        &'static str,
        Vec<(&'static str, Action, bool, bool)>,
        Result<(), &'static str>,
        Vec<&'static str>,
    );
    // (name, [(policy, action, dry_run, matches)], verdict (Err = deny reason), dry-run hits)
    let cases: Vec<Case> = vec![
        ("no policies", vec![], Ok(()), vec![]),
        (
            "deny not matching",
            vec![("d", Deny, false, false)],
            Ok(()),
            vec![],
        ),
        (
            "deny matching",
            vec![("d", Deny, false, true)],
            Err("explicitly denied by: dst-ns/d"),
            vec![],
        ),
        (
            "deny beats allow",
            vec![("a", Allow, false, true), ("d", Deny, false, true)],
            Err("explicitly denied by: dst-ns/d"),
            vec![],
        ),
        (
            "first matching deny named",
            vec![
                ("d1", Deny, false, false),
                ("d2", Deny, false, true),
                ("d3", Deny, false, true),
            ],
            Err("explicitly denied by: dst-ns/d2"),
            vec![],
        ),
        (
            "allow not matching",
            vec![("a", Allow, false, false)],
            Err("allow policies exist, but none allowed"),
            vec![],
        ),
        (
            "any allow matching",
            vec![("a1", Allow, false, false), ("a2", Allow, false, true)],
            Ok(()),
            vec![],
        ),
        (
            "deny miss then allow",
            vec![("d", Deny, false, false), ("a", Allow, false, true)],
            Ok(()),
            vec![],
        ),
        (
            "dry-run deny only logged",
            vec![("d", Deny, true, true)],
            Ok(()),
            vec!["d"],
        ),
        (
            "dry-run deny not matching",
            vec![("d", Deny, true, false)],
            Ok(()),
            vec![],
        ),
        (
            "dry-run deny with real deny",
            vec![("real", Deny, false, true), ("dry", Deny, true, true)],
            Err("explicitly denied by: dst-ns/real"),
            vec!["dry"],
        ),
        (
            "dry-run allow alone allows",
            vec![("a", Allow, true, false)],
            Ok(()),
            vec![],
        ),
        (
            "dry-run allow logged, real allow misses",
            vec![("dry", Allow, true, true), ("real", Allow, false, false)],
            Err("allow policies exist, but none allowed"),
            vec!["dry"],
        ),
        (
            "dry-run allow not reached after deny",
            vec![("dry", Allow, true, true), ("d", Deny, false, true)],
            Err("explicitly denied by: dst-ns/d"),
            vec![],
        ),
        (
            "dry-run deny and dry-run allow",
            vec![("dd", Deny, true, true), ("da", Allow, true, true)],
            Ok(()),
            vec!["dd", "da"],
        ),
    ];
    for (name, specs, want, want_dry) in cases {
        let policies: Vec<Authorization> = specs
            .iter()
            .map(|(n, action, dry, hit)| {
                policy(n, *action, *dry, if *hit { always() } else { never() })
            })
            .collect();
        let decision = evaluate(&policies, &mtls());
        let got = match decision.verdict {
            Verdict::Allow => Ok(()),
            Verdict::Deny(reason) => Err(reason.to_string()),
        };
        assert_eq!(got, want.map_err(str::to_string), "{name}");
        let dry: Vec<&str> = decision.dry_run.iter().map(|d| d.policy.name()).collect();
        assert_eq!(dry, want_dry, "{name}");
        for d in &decision.dry_run {
            let spec = specs.iter().find(|s| s.0 == d.policy.name()).unwrap();
            assert_eq!(d.action, spec.1, "{name}");
        }
    }
}
