//! Windows redirection as data (`spec/windows.md` §3.2, §3.3): the two `L4WFPPROXY`
//! policies and the Add envelope must equal the spec's JSON (`tests/golden_windows/`,
//! transcribed from the spec) byte for byte in hcsshim's field order, and the per-endpoint
//! plan is exercised against a fake HNS. Platform-neutral: runs on Linux.

#![allow(clippy::unwrap_used)]

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;

use ambit_netns::guid::Guid;
use ambit_redirect::hns::{
    EndpointError, EndpointOutcome, HnsEndpoints, PodError, WfpPolicyConfig, add_request,
    apply_pod, parse_endpoint_policies, policies, remove_pod, remove_request, verify_pod,
};
use serde_json::{Value, json};

fn golden(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden_windows")
        .join(name);
    std::fs::read_to_string(&p).unwrap().trim_end().to_owned()
}

#[test]
fn policies_are_the_specs_json_in_hcsshims_order() {
    let [p1, p2] = policies(&WfpPolicyConfig::default());
    assert_eq!(serde_json::to_string(&p1).unwrap(), golden("p1.json"));
    assert_eq!(serde_json::to_string(&p2).unwrap(), golden("p2.json"));
    assert_eq!(add_request(&WfpPolicyConfig::default()), golden("add.json"));
}

#[test]
fn omitempty_drops_empty_values_but_never_the_nested_objects() {
    let [p1, _] = policies(&WfpPolicyConfig {
        user_sid: String::new(),
        ..WfpPolicyConfig::default()
    });
    let v = serde_json::to_value(&p1).unwrap();
    assert!(v.get("UserSID").is_none());
    assert!(v["FilterTuple"].get("Priority").is_none());
    assert!(v["FilterTuple"].get("LocalPorts").is_none());
    let empty = ambit_redirect::hns::L4WfpProxySettings::default();
    assert_eq!(
        serde_json::to_value(&empty).unwrap(),
        json!({"FilterTuple": {}, "InboundExceptions": {}, "OutboundExceptions": {}})
    );
}

#[test]
fn the_probe_address_is_configurable() {
    let cfg = WfpPolicyConfig {
        probe_snat_v4: "169.254.9.9".parse().unwrap(),
        ..WfpPolicyConfig::default()
    };
    for p in policies(&cfg) {
        assert_eq!(
            p.inbound_exceptions.ip_address_exceptions,
            ["169.254.9.9", "127.0.0.1"]
        );
        assert_eq!(
            p.outbound_exceptions.ip_address_exceptions,
            ["169.254.9.9", "127.0.0.1"]
        );
    }
}

#[test]
fn remove_sends_the_policies_as_hns_returned_them() {
    let existing = vec![json!({"Type": "L4WFPPROXY", "Settings": {"X": 1}})];
    let v: Value = serde_json::from_str(&remove_request(&existing)).unwrap();
    assert_eq!(
        v,
        json!({"ResourceType": "Policy", "RequestType": "Remove", "Settings": {"Policies": existing}})
    );
    let none: Value = serde_json::from_str(&remove_request(&[])).unwrap();
    assert_eq!(none["Settings"], json!({}), "as Go's omitempty");
}

fn ep(n: u8) -> Guid {
    Guid::from_u128(0x1000_0000_0000_4000_8000_0000_0000_0000 | u128::from(n))
}

/// A fake HNS: endpoint → policies (as HNS would list them); records every modify.
#[derive(Default)]
struct FakeHns {
    endpoints: RefCell<BTreeMap<Guid, Vec<Value>>>,
    raw: BTreeMap<Guid, String>,
    fail_modify: Option<Guid>,
    calls: RefCell<Vec<(Guid, String)>>,
}

impl FakeHns {
    fn with(eps: &[(Guid, Vec<Value>)]) -> Self {
        Self {
            endpoints: RefCell::new(eps.iter().cloned().collect()),
            ..Self::default()
        }
    }
    fn requests(&self) -> Vec<(Guid, String)> {
        self.calls
            .borrow()
            .iter()
            .map(|(g, s)| {
                let v: Value = serde_json::from_str(s).unwrap();
                (*g, v["RequestType"].as_str().unwrap().to_owned())
            })
            .collect()
    }
}

impl HnsEndpoints for FakeHns {
    fn properties(&self, endpoint: Guid) -> Result<String, EndpointError> {
        if let Some(raw) = self.raw.get(&endpoint) {
            return Ok(raw.clone());
        }
        let eps = self.endpoints.borrow();
        let policies = eps.get(&endpoint).ok_or(EndpointError::Gone(endpoint))?;
        Ok(json!({"ID": endpoint.to_string(), "Policies": policies, "Flags": 0}).to_string())
    }

    fn modify(&self, endpoint: Guid, settings: &str) -> Result<(), EndpointError> {
        self.calls
            .borrow_mut()
            .push((endpoint, settings.to_owned()));
        if self.fail_modify == Some(endpoint) {
            return Err(EndpointError::Failed {
                call: "modify",
                endpoint,
                message: "access denied".into(),
            });
        }
        let req: Value = serde_json::from_str(settings).unwrap();
        let mut eps = self.endpoints.borrow_mut();
        let list = eps
            .get_mut(&endpoint)
            .ok_or(EndpointError::Gone(endpoint))?;
        let sent = req["Settings"]["Policies"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        match req["RequestType"].as_str().unwrap() {
            "Add" => list.extend(sent),
            "Remove" => list.retain(|p| !sent.contains(p)),
            other => panic!("unexpected request {other}"),
        }
        Ok(())
    }
}

/// The desired policies as HNS would list them back, with a field HNS adds.
fn applied() -> Vec<Value> {
    policies(&WfpPolicyConfig::default())
        .iter()
        .map(|s| {
            let mut v = serde_json::to_value(s).unwrap();
            v["FilterTuple"]["Priority"] = json!(0);
            json!({"Type": "L4WFPPROXY", "Settings": v})
        })
        .collect()
}

fn nat() -> Value {
    json!({"Type": "OutBoundNAT", "Settings": {"Exceptions": ["10.0.0.0/8"]}})
}

fn stale() -> Value {
    json!({"Type": "L4WFPPROXY", "Settings": {"InboundProxyPort": "15006", "OutboundProxyPort": "15009"}})
}

#[test]
fn apply_is_idempotent_per_endpoint_and_compares_settings() {
    use EndpointOutcome::*;
    let cfg = WfpPolicyConfig::default();
    // (name, endpoints and their policies, expected outcomes, expected requests)
    type Case = (
        &'static str,
        Vec<(Guid, Vec<Value>)>,
        Vec<EndpointOutcome>,
        Vec<&'static str>,
    );
    let cases: Vec<Case> = vec![
        (
            "fresh",
            vec![(ep(1), vec![nat()])],
            vec![Added],
            vec!["Add"],
        ),
        (
            "already applied",
            vec![(ep(1), [applied(), vec![nat()]].concat())],
            vec![Unchanged],
            vec![],
        ),
        (
            "stale settings are replaced",
            vec![(ep(1), vec![stale(), nat()])],
            vec![Replaced],
            vec!["Remove", "Add"],
        ),
        (
            "half applied is replaced",
            vec![(ep(1), vec![applied()[0].clone()])],
            vec![Replaced],
            vec!["Remove", "Add"],
        ),
        (
            "every endpoint, not just up to the first applied one",
            vec![(ep(1), applied()), (ep(2), vec![])],
            vec![Unchanged, Added],
            vec!["Add"],
        ),
    ];
    for (name, eps, want, requests) in cases {
        let hns = FakeHns::with(&eps);
        let got = apply_pod(&hns, &eps.iter().map(|e| e.0).collect::<Vec<_>>(), &cfg).unwrap();
        assert_eq!(
            got.iter().map(|g| g.1.clone()).collect::<Vec<_>>(),
            want,
            "{name}"
        );
        let sent: Vec<String> = hns.requests().into_iter().map(|r| r.1).collect();
        assert_eq!(sent, requests, "{name}");
        // Afterwards every endpoint carries exactly the desired policies, other types kept,
        // and a second pass changes nothing.
        assert_eq!(
            verify_pod(&hns, &eps.iter().map(|e| e.0).collect::<Vec<_>>(), &cfg).unwrap(),
            []
        );
        for (g, before) in &eps {
            let now = &hns.endpoints.borrow()[g];
            assert_eq!(now.contains(&nat()), before.contains(&nat()), "{name}");
        }
        let again = apply_pod(&hns, &eps.iter().map(|e| e.0).collect::<Vec<_>>(), &cfg).unwrap();
        assert!(again.iter().all(|g| g.1 == Unchanged), "{name}: {again:?}");
    }
}

#[test]
fn endpoint_failures_are_per_endpoint() {
    let cfg = WfpPolicyConfig::default();
    // A vanished endpoint: the others still get their policies.
    let hns = FakeHns::with(&[(ep(1), vec![])]);
    let got = apply_pod(&hns, &[ep(9), ep(1)], &cfg).unwrap();
    assert_eq!(
        got,
        [
            (ep(9), EndpointOutcome::Vanished),
            (ep(1), EndpointOutcome::Added)
        ]
    );
    // All vanished, or none at all: the pod is not captured.
    assert_eq!(
        apply_pod(&hns, &[ep(8), ep(9)], &cfg),
        Err(PodError::AllVanished)
    );
    assert_eq!(apply_pod(&hns, &[], &cfg), Err(PodError::NoEndpoints));
    // A failing endpoint fails the pod but the others are done and reported.
    let hns = FakeHns {
        fail_modify: Some(ep(2)),
        ..FakeHns::with(&[(ep(1), vec![]), (ep(2), vec![]), (ep(3), vec![])])
    };
    match apply_pod(&hns, &[ep(1), ep(2), ep(3)], &cfg) {
        Err(PodError::Endpoints { failed, done }) => {
            assert_eq!(failed.len(), 1);
            assert!(
                failed[0].to_string().contains("access denied"),
                "{}",
                failed[0]
            );
            assert_eq!(
                done,
                [
                    (ep(1), EndpointOutcome::Added),
                    (ep(3), EndpointOutcome::Added)
                ]
            );
        }
        other => panic!("{other:?}"),
    }
    // Properties HNS wrote that we cannot read: a failure naming the endpoint, no request.
    let hns = FakeHns {
        raw: [(ep(1), "{not json".to_owned())].into(),
        ..FakeHns::with(&[(ep(1), vec![])])
    };
    let err = apply_pod(&hns, &[ep(1)], &cfg).unwrap_err();
    assert!(err.to_string().contains(&ep(1).to_string()), "{err}");
    assert!(hns.requests().is_empty());
}

#[test]
fn remove_takes_only_wfp_proxy_policies() {
    let hns = FakeHns::with(&[
        (ep(1), [applied(), vec![nat(), stale()]].concat()),
        (ep(2), vec![nat()]),
    ]);
    let got = remove_pod(&hns, &[ep(1), ep(2), ep(3)]).unwrap();
    assert_eq!(
        got,
        [
            (ep(1), EndpointOutcome::Removed),
            (ep(2), EndpointOutcome::Unchanged),
            (ep(3), EndpointOutcome::Vanished)
        ]
    );
    assert_eq!(
        hns.requests(),
        [(ep(1), "Remove".to_owned())],
        "no call for ep 2"
    );
    assert_eq!(hns.endpoints.borrow()[&ep(1)], [nat()]);
    assert_eq!(remove_pod(&hns, &[]).unwrap(), []);
}

#[test]
fn endpoint_policies_parse() {
    let json = json!({"Policies": [nat(), stale()], "ID": "x"}).to_string();
    assert_eq!(parse_endpoint_policies(&json).unwrap(), [stale()]);
    assert_eq!(
        parse_endpoint_policies(r#"{"ID":"x"}"#).unwrap(),
        Vec::<Value>::new()
    );
    assert_eq!(
        parse_endpoint_policies(r#"{"Policies":null}"#).unwrap(),
        Vec::<Value>::new()
    );
    assert!(parse_endpoint_policies("[").is_err());
}
