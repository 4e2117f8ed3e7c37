//! Re-checking only what a change can affect closes exactly the connections a re-check of
//! every connection closes, over a long pseudo-random sequence of workload and policy
//! changes of every scope.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use ambit_model::authz::{Action, Authorization, Clause, Connection, Match, Rule, Scope};
use ambit_model::names::PolicyKey;
use ambit_model::{SpiffeId, Workload, WorkloadUid};

use super::{ConnectionTracker, TrackedConnection};
use crate::state::ProxyState;

/// A small deterministic generator (the sequence must be the same on every run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

const WORKLOADS: [(&str, &str); 4] = [("a", "a1"), ("a", "a2"), ("b", "b1"), ("c", "c1")];
const NAMESPACES: [&str; 3] = ["a", "b", "c"];
const POLICY_NAMES: [&str; 3] = ["p0", "p1", "p2"];
const PORTS: [u16; 4] = [80, 81, 82, 83];

fn workload(i: usize, selects: Vec<PolicyKey>) -> Workload {
    let (ns, name) = WORKLOADS[i];
    let mut w = Workload::new(
        WorkloadUid::new(format!("Kubernetes//Pod/{ns}/{name}")).unwrap(),
        name,
        SpiffeId::parse(&format!("spiffe://cluster.local/ns/{ns}/sa/default")).unwrap(),
    );
    w.authorization_policies = selects;
    w
}

fn policy(rng: &mut Lcg) -> Authorization {
    let ns = NAMESPACES[rng.next(NAMESPACES.len())];
    let name = POLICY_NAMES[rng.next(POLICY_NAMES.len())];
    // Mostly scoped policies: a global one re-checks everything, which proves little.
    let scope = [
        Scope::Global,
        Scope::Namespace,
        Scope::Namespace,
        Scope::Namespace,
        Scope::WorkloadSelector,
        Scope::WorkloadSelector,
    ][rng.next(6)];
    let action = [Action::Allow, Action::Deny][rng.next(2)];
    let port = PORTS[rng.next(PORTS.len())];
    Authorization {
        key: PolicyKey::new(ns, name).unwrap(),
        scope,
        action,
        dry_run: false,
        rules: vec![Rule {
            clauses: vec![Clause {
                matches: vec![Match {
                    destination_ports: vec![port],
                    ..Match::default()
                }],
            }],
        }],
    }
}

fn attrs(port: u16) -> Connection {
    Connection {
        src_identity: None,
        src_ip: "10.0.0.9".parse().unwrap(),
        dst_ip: "10.0.0.1".parse().unwrap(),
        dst_port: port,
    }
}

#[test]
fn changes_close_what_a_full_recheck_closes() {
    let state = ProxyState::new();
    for i in 0..WORKLOADS.len() {
        state.upsert_workload(workload(i, vec![]));
    }
    let by_change = ConnectionTracker::new();
    let full = ConnectionTracker::new();
    let mut pairs: Vec<(TrackedConnection, TrackedConnection)> = Vec::new();
    let mut seen = *state.policy_changes().borrow();
    let mut rng = Lcg(7);
    let (mut closed_any, mut kept_any) = (false, false);
    for step in 0..600 {
        // Most steps open connections, so there is something to close.
        match rng.next(20) {
            0..=3 => state.upsert_policy(policy(&mut rng)),
            4 | 5 => {
                let key = PolicyKey::new(
                    NAMESPACES[rng.next(NAMESPACES.len())],
                    POLICY_NAMES[rng.next(POLICY_NAMES.len())],
                )
                .unwrap();
                state.remove_policy(&key);
            }
            6 | 7 => {
                // Re-point a workload's selector list at some policies of its namespace
                // and of others (a root-namespace selector policy).
                let i = rng.next(WORKLOADS.len());
                let selects = (0..rng.next(3))
                    .map(|_| {
                        PolicyKey::new(
                            NAMESPACES[rng.next(NAMESPACES.len())],
                            POLICY_NAMES[rng.next(POLICY_NAMES.len())],
                        )
                        .unwrap()
                    })
                    .collect();
                state.upsert_workload(workload(i, selects));
            }
            8 => {
                let (ns, name) = WORKLOADS[rng.next(WORKLOADS.len())];
                state.remove_workload(&format!("Kubernetes//Pod/{ns}/{name}"));
            }
            _ => {
                // New connections to a workload that exists, admitted by both trackers
                // (the same state decides, so both admit or both refuse).
                let i = rng.next(WORKLOADS.len());
                let Some(w) = state.workload_by_uid(workload(i, vec![]).uid.as_str()) else {
                    continue;
                };
                let port = PORTS[rng.next(PORTS.len())];
                let a = by_change.admit(&state, w.clone(), attrs(port));
                let b = full.admit(&state, w, attrs(port));
                assert_eq!(a.is_ok(), b.is_ok(), "step {step}: admission differs");
                if let (Ok(a), Ok(b)) = (a, b) {
                    pairs.push((a, b));
                }
                continue;
            }
        }
        let (changes, now) = state.changes_since(seen);
        seen = now;
        by_change.reevaluate_changes(&state, &changes);
        full.reevaluate(&state);
        for (n, (a, b)) in pairs.iter().enumerate() {
            assert_eq!(
                a.entry.close.is_set(),
                b.entry.close.is_set(),
                "step {step}: connection {n} to {} differs after {changes:?}",
                a.entry.workload.uid
            );
        }
        // Closed connections go away, as their tasks would end.
        let before = pairs.len();
        pairs.retain(|(a, _)| !a.entry.close.is_set());
        closed_any |= pairs.len() < before;
        kept_any |= !pairs.is_empty();
    }
    assert!(
        closed_any && kept_any,
        "the sequence must both close and keep connections"
    );
    assert_eq!(by_change.len(), full.len());
}

#[test]
fn a_denied_admission_leaves_nothing_registered() {
    let state = ProxyState::new();
    state.upsert_workload(workload(0, vec![]));
    state.upsert_policy(Authorization {
        key: PolicyKey::new("a", "deny-80").unwrap(),
        scope: Scope::Namespace,
        action: Action::Deny,
        dry_run: false,
        rules: vec![Rule {
            clauses: vec![Clause {
                matches: vec![Match {
                    destination_ports: vec![80],
                    ..Match::default()
                }],
            }],
        }],
    });
    let tracker = ConnectionTracker::new();
    let w = state.workload_by_uid("Kubernetes//Pod/a/a1").unwrap();
    let denied = tracker.admit(&state, Arc::clone(&w), attrs(80));
    assert!(denied.is_err());
    assert!(tracker.is_empty());
    let allowed = tracker.admit(&state, w, attrs(81)).unwrap();
    assert_eq!(tracker.len(), 1);
    drop(allowed);
    assert!(tracker.is_empty());
}
