#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};

use ambit_proto::discovery::DeltaDiscoveryRequest;
use ambit_proto::rpc;
use prost_types::Any;

use super::session::{Answer, Session, SessionError};
use super::snapshot::Snapshot;

const A: &str = "type.test/A";
const B: &str = "type.test/B";

fn snapshot(items: &[(&str, &str, &str)]) -> Snapshot {
    let mut s = Snapshot::new();
    for (type_url, name, content) in items {
        s.insert(
            *name,
            Any {
                type_url: type_url.to_string(),
                value: content.as_bytes().to_vec(),
            },
        );
    }
    s
}

/// One step of a conversation with a session.
enum Step {
    /// Replace the served snapshot: (type, name, content).
    Snap(&'static [(&'static str, &'static str, &'static str)]),
    /// First request for a type: subscribe, initial versions (name, content it was built from).
    Open(
        &'static str,
        &'static [&'static str],
        &'static [(&'static str, &'static str)],
    ),
    Subscribe(
        &'static str,
        &'static [&'static str],
        &'static [&'static str],
    ),
    Ack(&'static str),
    Nack(&'static str),
    /// Answer with a nonce that is not in flight.
    StaleAck(&'static str),
    /// Expect the next response: type, resource names, removed names.
    Expect(
        &'static str,
        &'static [&'static str],
        &'static [&'static str],
    ),
    /// Expect no response now.
    Quiet,
}

fn version_of(type_url: &str, content: &str) -> String {
    let s = snapshot(&[(type_url, "x", content)]);
    s.get(type_url, "x").unwrap().version.clone()
}

fn run(name: &str, steps: &[Step]) {
    let mut session = Session::new();
    let mut current = Snapshot::new();
    let mut counter = 0u64;
    let mut last_nonce: HashMap<&str, String> = HashMap::new();
    let mut nonce = || {
        counter += 1;
        counter.to_string()
    };
    for (i, step) in steps.iter().enumerate() {
        let ctx = format!("{name}: step {i}");
        let request = |type_url: &str| DeltaDiscoveryRequest {
            type_url: type_url.to_string(),
            ..Default::default()
        };
        match step {
            Step::Snap(items) => {
                current = snapshot(items);
                session.snapshot_changed();
            }
            Step::Open(t, subscribe, initial) => {
                let req = DeltaDiscoveryRequest {
                    resource_names_subscribe: subscribe.iter().map(|s| s.to_string()).collect(),
                    initial_resource_versions: initial
                        .iter()
                        .map(|(n, c)| (n.to_string(), version_of(t, c)))
                        .collect(),
                    ..request(t)
                };
                assert_eq!(session.handle_request(req), Ok(Answer::None), "{ctx}");
            }
            Step::Subscribe(t, sub, unsub) => {
                let req = DeltaDiscoveryRequest {
                    resource_names_subscribe: sub.iter().map(|s| s.to_string()).collect(),
                    resource_names_unsubscribe: unsub.iter().map(|s| s.to_string()).collect(),
                    ..request(t)
                };
                assert_eq!(session.handle_request(req), Ok(Answer::None), "{ctx}");
            }
            Step::Ack(t) | Step::Nack(t) => {
                let nack = matches!(step, Step::Nack(_));
                let req = DeltaDiscoveryRequest {
                    response_nonce: last_nonce[t].clone(),
                    error_detail: nack.then(|| rpc::Status {
                        code: 3,
                        message: "bad".into(),
                        details: vec![],
                    }),
                    ..request(t)
                };
                let want = if nack {
                    Answer::Nack("bad".into())
                } else {
                    Answer::Ack
                };
                assert_eq!(session.handle_request(req), Ok(want), "{ctx}");
                assert_eq!(session.in_flight(t), None, "{ctx}");
            }
            Step::StaleAck(t) => {
                let req = DeltaDiscoveryRequest {
                    response_nonce: "no-such-nonce".into(),
                    ..request(t)
                };
                assert_eq!(session.handle_request(req), Ok(Answer::Stale), "{ctx}");
            }
            Step::Expect(t, names, removed) => {
                let resp = session
                    .next_response(&current, &mut nonce)
                    .unwrap_or_else(|| panic!("{ctx}: expected a response"));
                assert_eq!(resp.type_url, *t, "{ctx}");
                let got: Vec<&str> = resp.resources.iter().map(|r| r.name.as_str()).collect();
                assert_eq!(got, *names, "{ctx}: resources");
                assert_eq!(resp.removed_resources, *removed, "{ctx}: removed");
                for r in &resp.resources {
                    let want = current.get(t, &r.name).unwrap();
                    assert_eq!(r.version, want.version, "{ctx}");
                    assert_eq!(r.resource.as_ref(), Some(&want.resource), "{ctx}");
                }
                assert!(
                    !last_nonce.values().any(|n| *n == resp.nonce),
                    "{ctx}: nonce reused"
                );
                assert_eq!(session.in_flight(t), Some(resp.nonce.as_str()), "{ctx}");
                last_nonce.insert(t, resp.nonce);
            }
            Step::Quiet => {
                let resp = session.next_response(&current, &mut nonce);
                assert!(resp.is_none(), "{ctx}: unexpected {resp:?}");
            }
        }
    }
}

#[test]
fn conversations() {
    use Step::*;
    let cases: &[(&str, &[Step])] = &[
        (
            "wildcard: everything first, then only the delta after the ACK",
            &[
                Snap(&[(A, "a1", "1"), (A, "a2", "2"), (B, "b1", "1")]),
                Open(A, &[], &[]),
                Expect(A, &["a1", "a2"], &[]),
                Quiet,
                // Two updates while the first push is unanswered collapse into one push.
                Snap(&[(A, "a1", "1"), (A, "a2", "2x"), (A, "a3", "3")]),
                Snap(&[(A, "a2", "2y"), (A, "a3", "3")]),
                Quiet,
                Ack(A),
                Expect(A, &["a2", "a3"], &["a1"]),
                Ack(A),
                Quiet,
                // An unchanged snapshot sends nothing.
                Snap(&[(A, "a2", "2y"), (A, "a3", "3")]),
                Quiet,
            ],
        ),
        (
            "an empty snapshot still gets a first (empty) response per type",
            &[
                Open(A, &[], &[]),
                Open(B, &[], &[]),
                Expect(A, &[], &[]),
                Expect(B, &[], &[]),
                Quiet,
            ],
        ),
        (
            "reconnect: initial versions spare what the client has, remove what is gone",
            &[
                Snap(&[(A, "a1", "1"), (A, "a2", "2new"), (A, "a4", "4")]),
                Open(A, &[], &[("a1", "1"), ("a2", "2old"), ("a3", "3")]),
                Expect(A, &["a2", "a4"], &["a3"]),
            ],
        ),
        (
            "reconnect with everything current: an empty first response",
            &[
                Snap(&[(A, "a1", "1")]),
                Open(A, &[], &[("a1", "1")]),
                Expect(A, &[], &[]),
            ],
        ),
        (
            "NACK keeps the stream; the refused version is not resent, a newer one is",
            &[
                Snap(&[(A, "a1", "1")]),
                Open(A, &[], &[]),
                Expect(A, &["a1"], &[]),
                Nack(A),
                Quiet,
                Snap(&[(A, "a1", "1")]),
                Quiet,
                Snap(&[(A, "a1", "1b")]),
                Expect(A, &["a1"], &[]),
                Ack(A),
            ],
        ),
        (
            "an answer to an old nonce does not release the type",
            &[
                Snap(&[(A, "a1", "1")]),
                Open(A, &[], &[]),
                Expect(A, &["a1"], &[]),
                Snap(&[(A, "a1", "2")]),
                StaleAck(A),
                Quiet,
                Ack(A),
                Expect(A, &["a1"], &[]),
            ],
        ),
        (
            "explicit names: only those, absent ones answered as removed, unsubscribe forgets",
            &[
                Snap(&[(A, "a1", "1"), (A, "a2", "2")]),
                Open(A, &["a1", "zz"], &[]),
                Expect(A, &["a1"], &["zz"]),
                Ack(A),
                Subscribe(A, &["a2"], &["a1"]),
                Expect(A, &["a2"], &[]),
                Ack(A),
                // a1 changes, but it is no longer subscribed.
                Snap(&[(A, "a1", "1b"), (A, "a2", "2")]),
                Quiet,
                Subscribe(A, &["a1"], &[]),
                Expect(A, &["a1"], &[]),
            ],
        ),
        (
            "on-demand start: subscribe and unsubscribe * means nothing",
            &[
                Snap(&[(A, "a1", "1")]),
                Subscribe(A, &["*"], &["*"]),
                Expect(A, &[], &[]),
                Ack(A),
                Subscribe(A, &["a1"], &[]),
                Expect(A, &["a1"], &[]),
            ],
        ),
        (
            "types are independent: one type waiting for its ACK does not hold the other",
            &[
                Snap(&[(A, "a1", "1"), (B, "b1", "1")]),
                Open(A, &[], &[]),
                Open(B, &[], &[]),
                Expect(A, &["a1"], &[]),
                Expect(B, &["b1"], &[]),
                Ack(B),
                Snap(&[(A, "a1", "2"), (B, "b1", "2")]),
                Expect(B, &["b1"], &[]),
                Quiet,
            ],
        ),
    ];
    for (name, steps) in cases {
        run(name, steps);
    }
}

#[test]
fn request_without_type_is_refused() {
    let mut session = Session::new();
    assert_eq!(
        session.handle_request(DeltaDiscoveryRequest::default()),
        Err(SessionError::MissingTypeUrl)
    );
}

#[test]
fn model_snapshot_names_and_stable_versions() {
    use ambit_model::authz::{Action, Scope};
    use ambit_model::{Authorization, NamespacedHostname, PolicyKey, Service, SpiffeId};
    use ambit_model::{Workload, WorkloadUid};
    use ambit_proto::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};

    let w = Workload::new(
        WorkloadUid::new("cluster1//v1/Pod/default/web").unwrap(),
        "web",
        SpiffeId::parse("spiffe://cluster.local/ns/default/sa/web").unwrap(),
    );
    let s = Service::new(
        "web",
        NamespacedHostname::new("default", "web.default.svc").unwrap(),
    );
    let p = Authorization {
        key: PolicyKey::new("default", "allow").unwrap(),
        scope: Scope::Namespace,
        action: Action::Allow,
        dry_run: false,
        rules: vec![],
    };
    let snap = Snapshot::from_model([&w], [&s], [&p]);
    let names = |t: &str| -> Vec<String> {
        snap.resources(t)
            .map(|r| r.keys().cloned().collect())
            .unwrap_or_default()
    };
    assert_eq!(
        names(ADDRESS_TYPE_URL),
        ["cluster1//v1/Pod/default/web", "default/web.default.svc"]
    );
    assert_eq!(names(AUTHORIZATION_TYPE_URL), ["default/allow"]);
    for t in [ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL] {
        for r in snap.resources(t).unwrap().values() {
            assert_eq!(r.resource.type_url, t);
        }
    }
    // Rebuilding gives the same versions; a change gives a new one.
    let again = Snapshot::from_model([&w], [&s], [&p]);
    assert_eq!(again, snap);
    let mut w2 = w.clone();
    w2.node = "node2".into();
    let changed = Snapshot::from_model([&w2], [&s], [&p]);
    let versions = |s: &Snapshot| -> BTreeMap<String, String> {
        s.resources(ADDRESS_TYPE_URL)
            .unwrap()
            .iter()
            .map(|(n, r)| (n.clone(), r.version.clone()))
            .collect()
    };
    let (a, b) = (versions(&snap), versions(&changed));
    assert_ne!(
        a["cluster1//v1/Pod/default/web"],
        b["cluster1//v1/Pod/default/web"]
    );
    assert_eq!(a["default/web.default.svc"], b["default/web.default.svc"]);
}
