//! The indexed evaluation (`PolicySet::evaluate`) must decide exactly what the plain walk
//! over every applicable policy (`evaluate(set.for_workload(w), conn)`) decides: verdict,
//! the policy a deny names, and the dry-run matches in order.

use proptest::prelude::*;

use crate::addr::Cidr;
use crate::authz::eval::{Connection, evaluate};
use crate::authz::{
    Action, Authorization, Clause, Match, PolicySet, Rule, Scope, ServiceAccountMatch, StringMatch,
};
use crate::identity::SpiffeId;
use crate::names::{PolicyKey, WorkloadUid};
use crate::workload::Workload;

const NAMESPACES: [&str; 4] = ["a", "b", "c", "istio-system"];
const ACCOUNTS: [&str; 2] = ["x", "y"];
const ADDRS: [&str; 8] = [
    "10.0.0.1",
    "10.0.0.2",
    "10.1.0.1",
    "192.168.1.1",
    "fd00::1",
    "fd00::2",
    "::ffff:10.0.0.1",
    "::ffff:192.168.1.1",
];
const RANGES: [&str; 11] = [
    "10.0.0.0/8",
    "10.0.0.1/32",
    "10.0.0.0/24",
    "10.1.0.0/16",
    "0.0.0.0/0",
    "10.0.0.5/8",
    "fd00::/64",
    "fd00::1/128",
    "::/0",
    "::ffff:10.0.0.0/104",
    "192.168.1.1",
];
const PORTS: [u16; 3] = [80, 8080, 443];

fn pick<T: Clone + std::fmt::Debug + 'static>(items: &'static [T]) -> impl Strategy<Value = T> {
    prop::sample::select(items)
}

/// Mostly empty, so that match objects often match and every field is exercised.
fn few<S: Strategy>(s: S) -> impl Strategy<Value = Vec<S::Value>>
where
    S::Value: std::fmt::Debug + Clone,
{
    prop_oneof![3 => Just(Vec::new()), 1 => prop::collection::vec(s, 1..=2)]
}

fn principal_match() -> impl Strategy<Value = StringMatch> {
    prop_oneof![
        4 => (pick(&NAMESPACES), pick(&ACCOUNTS))
            .prop_map(|(n, s)| StringMatch::Exact(format!("cluster.local/ns/{n}/sa/{s}"))),
        1 => pick(&NAMESPACES).prop_map(|n| StringMatch::Prefix(format!("cluster.local/ns/{n}/"))),
        1 => pick(&ACCOUNTS).prop_map(|s| StringMatch::Suffix(format!("/sa/{s}"))),
        1 => Just(StringMatch::Presence),
    ]
}

fn namespace_match() -> impl Strategy<Value = StringMatch> {
    prop_oneof![
        4 => pick(&NAMESPACES).prop_map(|n| StringMatch::Exact(n.to_owned())),
        1 => Just(StringMatch::Exact(String::new())),
        1 => pick(&NAMESPACES).prop_map(|n| StringMatch::Prefix(n.to_owned())),
        1 => Just(StringMatch::Presence),
    ]
}

fn account() -> impl Strategy<Value = ServiceAccountMatch> {
    (pick(&NAMESPACES), pick(&ACCOUNTS)).prop_map(|(n, s)| ServiceAccountMatch {
        namespace: n.to_owned(),
        service_account: s.to_owned(),
    })
}

fn range() -> impl Strategy<Value = Cidr> {
    pick(&RANGES).prop_map(|r| r.parse().unwrap())
}

fn match_object() -> impl Strategy<Value = Match> {
    (
        (few(namespace_match()), few(namespace_match())),
        (few(principal_match()), few(principal_match())),
        (few(range()), few(range())),
        (few(range()), few(range())),
        (few(pick(&PORTS)), few(pick(&PORTS))),
        (few(account()), few(account())),
    )
        .prop_map(|(ns, pr, src, dst, ports, sas)| Match {
            namespaces: ns.0,
            not_namespaces: ns.1,
            principals: pr.0,
            not_principals: pr.1,
            source_ips: src.0,
            not_source_ips: src.1,
            destination_ips: dst.0,
            not_destination_ips: dst.1,
            destination_ports: ports.0,
            not_destination_ports: ports.1,
            service_accounts: sas.0,
            not_service_accounts: sas.1,
        })
}

fn rules() -> impl Strategy<Value = Vec<Rule>> {
    let clause =
        prop::collection::vec(match_object(), 0..=2).prop_map(|matches| Clause { matches });
    let rule = prop::collection::vec(clause, 0..=2).prop_map(|clauses| Rule { clauses });
    prop::collection::vec(rule, 0..=2)
}

fn key() -> impl Strategy<Value = PolicyKey> {
    (pick(&NAMESPACES), 0..5u8).prop_map(|(n, i)| PolicyKey::new(n, format!("p{i}")).unwrap())
}

fn policy() -> impl Strategy<Value = Authorization> {
    (
        key(),
        prop_oneof![
            Just(Scope::Global),
            Just(Scope::Namespace),
            Just(Scope::WorkloadSelector)
        ],
        prop_oneof![Just(Action::Allow), Just(Action::Deny)],
        prop::bool::weighted(0.2),
        rules(),
    )
        .prop_map(|(key, scope, action, dry_run, rules)| Authorization {
            key,
            scope,
            action,
            dry_run,
            rules,
        })
}

#[derive(Debug, Clone)]
enum Op {
    Insert(Authorization),
    Remove(PolicyKey),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![4 => policy().prop_map(Op::Insert), 1 => key().prop_map(Op::Remove)],
        0..25,
    )
}

fn workload() -> impl Strategy<Value = Workload> {
    (pick(&NAMESPACES), prop::collection::vec(key(), 0..3)).prop_map(|(ns, selected)| {
        let id = SpiffeId::new("cluster.local", ns, "w").unwrap();
        let mut w = Workload::new(WorkloadUid::new("uid").unwrap(), "w", id);
        w.authorization_policies = selected;
        w
    })
}

fn connection() -> impl Strategy<Value = Connection> {
    (
        prop::option::weighted(0.8, (pick(&NAMESPACES), pick(&ACCOUNTS))),
        pick(&ADDRS),
        pick(&ADDRS),
        pick(&PORTS),
    )
        .prop_map(|(id, src, dst, port)| Connection {
            src_identity: id.map(|(n, s)| SpiffeId::new("cluster.local", n, s).unwrap()),
            src_ip: src.parse().unwrap(),
            dst_ip: dst.parse().unwrap(),
            dst_port: port,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn indexed_evaluation_decides_as_the_plain_walk(
        ops in ops(),
        checks in prop::collection::vec((workload(), connection()), 1..8),
    ) {
        let mut set = PolicySet::new();
        for op in ops {
            match op {
                Op::Insert(p) => { set.insert(p); }
                Op::Remove(k) => { set.remove(&k); }
            }
        }
        for (w, c) in &checks {
            let reference = evaluate(set.for_workload(w), c);
            prop_assert_eq!(set.evaluate(w, c), reference, "{:?} -> {:?}", c, w.namespace());
        }
    }
}

fn rule_of(m: Match) -> Vec<Rule> {
    vec![Rule {
        clauses: vec![Clause { matches: vec![m] }],
    }]
}

fn allow(name: &str, rules: Vec<Rule>) -> Authorization {
    Authorization {
        key: PolicyKey::new("a", name).unwrap(),
        scope: Scope::Namespace,
        action: Action::Allow,
        dry_run: false,
        rules,
    }
}

/// The cases the property test could find only by chance, one by one: each policy is the
/// only one in its set, and `allowed` says whether the connection gets through.
#[test]
fn anchors_that_must_still_match() {
    let cidr = |s: &str| vec![s.parse::<Cidr>().unwrap()];
    let conn = |id: Option<(&str, &str)>, src: &str, port: u16| Connection {
        src_identity: id.map(|(n, s)| SpiffeId::new("cluster.local", n, s).unwrap()),
        src_ip: src.parse().unwrap(),
        dst_ip: "10.9.9.9".parse().unwrap(),
        dst_port: port,
    };
    let mtls = conn(Some(("b", "x")), "10.0.0.7", 80);
    let cases: Vec<(&str, Vec<Rule>, Connection, bool)> = vec![
        (
            "mapped IPv4 peer in an IPv4 range",
            rule_of(Match {
                source_ips: cidr("10.0.0.0/8"),
                ..Match::default()
            }),
            conn(None, "::ffff:10.0.0.7", 80),
            true,
        ),
        (
            "range written with host bits",
            rule_of(Match {
                source_ips: cidr("10.0.0.5/8"),
                ..Match::default()
            }),
            conn(None, "10.200.0.1", 80),
            true,
        ),
        (
            "exact empty namespace is plaintext",
            rule_of(Match {
                namespaces: vec![StringMatch::Exact(String::new())],
                ..Match::default()
            }),
            conn(None, "10.0.0.7", 80),
            true,
        ),
        (
            "exact principal",
            rule_of(Match {
                principals: vec![StringMatch::Exact("cluster.local/ns/b/sa/x".into())],
                ..Match::default()
            }),
            mtls.clone(),
            true,
        ),
        (
            "port anchor, other port",
            rule_of(Match {
                destination_ports: vec![81],
                ..Match::default()
            }),
            mtls.clone(),
            false,
        ),
        (
            "rule without clauses matches all",
            vec![Rule::default()],
            mtls.clone(),
            true,
        ),
        (
            "clause of empty match objects never matches",
            vec![Rule {
                clauses: vec![Clause {
                    matches: vec![Match::default()],
                }],
            }],
            mtls.clone(),
            false,
        ),
        (
            "policy without rules never matches",
            vec![],
            mtls.clone(),
            false,
        ),
        (
            "negative field only: no anchor, still evaluated",
            rule_of(Match {
                not_destination_ports: vec![81],
                ..Match::default()
            }),
            mtls.clone(),
            true,
        ),
    ];
    let w = {
        let id = SpiffeId::new("cluster.local", "a", "w").unwrap();
        Workload::new(WorkloadUid::new("uid").unwrap(), "w", id)
    };
    for (what, rules, c, allowed) in cases {
        let mut set = PolicySet::new();
        set.insert(allow("p", rules));
        let decision = set.evaluate(&w, &c);
        assert_eq!(decision, evaluate(set.for_workload(&w), &c), "{what}");
        assert_eq!(decision.is_allowed(), allowed, "{what}");
    }
}

/// With 10,000 ALLOW policies of one principal each in the workload's namespace, only the
/// caller's own policy is walked.
#[test]
fn candidates_do_not_grow_with_the_set() {
    let mut group = super::Group::default();
    for i in 0..10_000 {
        let m = Match {
            principals: vec![StringMatch::Exact(format!("cluster.local/ns/a/sa/s{i}"))],
            ..Match::default()
        };
        group.insert(std::sync::Arc::new(allow(&format!("p{i}"), rule_of(m))));
    }
    let c = Connection {
        src_identity: Some(SpiffeId::new("cluster.local", "a", "s42").unwrap()),
        src_ip: "10.0.0.1".parse().unwrap(),
        dst_ip: "10.0.0.2".parse().unwrap(),
        dst_port: 80,
    };
    let found: Vec<String> = group
        .candidates(&c)
        .iter()
        .map(|p| p.key.to_string())
        .collect();
    assert_eq!(found, ["a/p42"]);
    for i in 0..10_000 {
        group.remove(&PolicyKey::new("a", format!("p{i}")).unwrap());
    }
    assert!(group.is_empty() && group.candidates(&c).is_empty() && !group.has_allow());
}
