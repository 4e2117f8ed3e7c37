//! The CRI client (`ambit_agent::windows::sandboxes`) against a fake runtime speaking the real
//! `runtime.v1.RuntimeService` gRPC on a Unix socket: which sandbox names a pod's HNS
//! namespace, what is skipped and why, the deadline on a runtime that stops answering, and
//! the capture of running pods (CRI, then HNS, then the policies) over fake HNS calls.
//! The same client over a named pipe runs under Wine (`tests/windows.rs`).

#![cfg(unix)]
#![allow(clippy::unwrap_used)]

#[path = "support/fake_cri.rs"]
mod fake_cri;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use ambit_agent::windows::cri::SandboxInfoError;
use ambit_agent::windows::running::{NamespaceLookup, RunningError, capture_running};
use ambit_agent::windows::sandboxes::{CriClient, CriError, SkipReason};
use ambit_netns::guid::Guid;
use ambit_netns::hns::HnsNamespace;
use ambit_redirect::hns::{
    EndpointError, EndpointOutcome, HnsEndpoints, PodError, WfpPolicyConfig,
};
use fake_cri::{Answer, FakeRuntime, Sandbox, info_naming};
use tokio::net::UnixListener;
use tokio::sync::oneshot;

const G1: &str = "11111111-1111-4111-8111-111111111111";
const G2: &str = "22222222-2222-4222-8222-222222222222";
const G3: &str = "33333333-3333-4333-8333-333333333333";

/// Serves `runtime` on `path` until the sender is dropped.
fn serve(runtime: &FakeRuntime, path: &Path) -> oneshot::Sender<()> {
    let listener = UnixListener::bind(path).unwrap();
    let incoming = futures_util::stream::unfold(listener, |l| async move {
        Some((l.accept().await.map(|(s, _)| s), l))
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let service = runtime.service();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            })
            .await
    });
    stop
}

fn sandbox(
    id: &'static str,
    uid: &'static str,
    ready: bool,
    created_at: i64,
    answer: Answer,
) -> Sandbox {
    Sandbox {
        id,
        uid: Some(uid),
        ready,
        created_at,
        answer,
    }
}

#[tokio::test]
async fn each_wanted_pod_gets_the_namespace_of_its_live_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cri.sock");
    let runtime = FakeRuntime::new(vec![
        sandbox("a-1", "a", true, 10, info_naming(G1)),
        // A pod restarted by the kubelet: the old sandbox is still listed, and listed first.
        sandbox("b-old", "b", false, 5, info_naming(G3)),
        sandbox(
            "b-new",
            "b",
            true,
            20,
            info_naming(&format!("{{{}}}", G2.to_uppercase())),
        ),
        // The live sandbox cannot be read (removed since the list): the next one is asked.
        sandbox("c-new", "c", true, 30, Answer::Fail(tonic::Code::NotFound)),
        sandbox("c-old", "c", false, 1, info_naming(G3)),
        // Half-created: no runtime spec yet.
        sandbox(
            "d-1",
            "d",
            true,
            1,
            Answer::Info(r#"{"pid":0,"runtimeSpec":null}"#.into()),
        ),
        // Not wanted: never asked.
        sandbox("e-1", "e", true, 1, Answer::Hang),
        Sandbox {
            id: "no-metadata",
            uid: None,
            ready: true,
            created_at: 1,
            answer: Answer::Hang,
        },
    ]);
    let _stop = serve(&runtime, &path);
    let mut client = CriClient::connect(&path, Duration::from_secs(5))
        .await
        .unwrap();
    let wanted: BTreeSet<String> = ["a", "b", "c", "d", "z"].map(String::from).into();
    let lookup = client.pod_namespaces(&wanted).await.unwrap();

    let found: Vec<(&str, &str, String)> = lookup
        .found
        .iter()
        .map(|(uid, f)| (uid.as_str(), f.sandbox.as_str(), f.namespace.to_string()))
        .collect();
    assert_eq!(
        found,
        [
            ("a", "a-1", G1.to_owned()),
            ("b", "b-new", G2.to_owned()),
            ("c", "c-old", G3.to_owned()),
        ]
    );
    let skipped: Vec<(&str, &str, String)> = lookup
        .skipped
        .iter()
        .map(|s| (s.uid.as_str(), s.sandbox.as_str(), s.reason.to_string()))
        .collect();
    assert_eq!(skipped.len(), 2, "{skipped:#?}");
    assert!(
        matches!(lookup.skipped[0].reason, SkipReason::Status(CriError::Call { ref status, .. }) if status.code() == tonic::Code::NotFound)
            && skipped[0].0 == "c"
            && skipped[0].2.contains("PodSandboxStatus c-new"),
        "{skipped:#?}"
    );
    assert!(
        matches!(
            lookup.skipped[1].reason,
            SkipReason::Info(SandboxInfoError::NoRuntimeSpec(_))
        ) && skipped[1].1 == "d-1",
        "{skipped:#?}"
    );
    // b's old sandbox was never needed; the unwanted and metadata-less ones never asked.
    for (id, calls) in [
        ("b-old", 0),
        ("b-new", 1),
        ("e-1", 0),
        ("no-metadata", 0),
        ("c-old", 1),
    ] {
        assert_eq!(runtime.calls(id), calls, "status calls of {id}");
    }
}

#[tokio::test]
async fn a_runtime_that_stops_answering_fails_the_lookup_at_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cri.sock");
    let runtime = FakeRuntime::new(vec![
        sandbox("h-1", "h", true, 2, Answer::Hang),
        sandbox("h-0", "h", false, 1, info_naming(G1)),
    ]);
    let _stop = serve(&runtime, &path);
    let deadline = Duration::from_millis(300);
    let mut client = CriClient::connect(&path, deadline).await.unwrap();
    let started = Instant::now();
    let err = client
        .pod_namespaces(&["h".to_owned()].into())
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(
        took >= deadline && took < deadline + Duration::from_secs(5),
        "{took:?}"
    );
    assert!(matches!(err, CriError::Deadline { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&path.display().to_string()) && text.contains("PodSandboxStatus h-1"),
        "{text}"
    );
    // No deadline per remaining sandbox: the lookup stopped at the first.
    assert_eq!(runtime.calls("h-0"), 0);
}

#[tokio::test]
async fn no_runtime_at_the_endpoint_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.sock");
    let err = CriClient::connect(&path, Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(matches!(err, CriError::Connect { .. }), "{err}");
    assert!(err.to_string().contains("absent.sock"), "{err}");
}

/// HNS as the fakes below know it: namespaces by GUID, endpoints with no policies yet.
struct FakeHns {
    namespaces: std::collections::HashMap<Guid, HnsNamespace>,
    modified: std::sync::Mutex<Vec<Guid>>,
}

#[derive(Debug, thiserror::Error)]
#[error("HcnOpenNamespace: element not found")]
struct NotFound;

impl NamespaceLookup for FakeHns {
    type Error = NotFound;
    fn namespace(&self, guid: Guid) -> Result<HnsNamespace, NotFound> {
        self.namespaces.get(&guid).cloned().ok_or(NotFound)
    }
    fn is_gone(&self, _: &NotFound) -> bool {
        true
    }
}

impl HnsEndpoints for FakeHns {
    fn properties(&self, _: Guid) -> Result<String, EndpointError> {
        Ok(r#"{"Policies":[]}"#.into())
    }
    fn modify(&self, endpoint: Guid, _: &str) -> Result<(), EndpointError> {
        self.modified.lock().unwrap().push(endpoint);
        Ok(())
    }
}

#[tokio::test]
async fn running_pods_are_captured_or_say_why_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cri.sock");
    const G4: &str = "44444444-4444-4444-8444-444444444444";
    const EP1: &str = "e1e1e1e1-0000-4000-8000-000000000001";
    const EP2: &str = "e2e2e2e2-0000-4000-8000-000000000002";
    let runtime = FakeRuntime::new(vec![
        sandbox("a-1", "a", true, 1, info_naming(G1)),
        // HNS does not know the namespace the runtime names.
        sandbox("b-1", "b", true, 1, info_naming(G2)),
        // A namespace without endpoints (nothing to put the policies on).
        sandbox("c-1", "c", true, 1, info_naming(G3)),
        // A namespace without a compartment yet: captured, ztunnel waits for it.
        sandbox("f-1", "f", true, 1, info_naming(G4)),
        sandbox("d-1", "d", true, 1, Answer::Info("{}".into())),
    ]);
    let _stop = serve(&runtime, &path);
    let g = |s: &str| -> Guid { s.parse().unwrap() };
    let hns = FakeHns {
        namespaces: [
            (
                g(G1),
                HnsNamespace {
                    id: g(G1),
                    compartment: Some(7),
                    endpoints: vec![g(EP1), g(EP2)],
                },
            ),
            (
                g(G3),
                HnsNamespace {
                    id: g(G3),
                    compartment: Some(8),
                    endpoints: vec![],
                },
            ),
            (
                g(G4),
                HnsNamespace {
                    id: g(G4),
                    compartment: None,
                    endpoints: vec![g(EP1)],
                },
            ),
        ]
        .into(),
        modified: Default::default(),
    };
    let mut client = CriClient::connect(&path, Duration::from_secs(5))
        .await
        .unwrap();
    let wanted: BTreeSet<String> = ["a", "b", "c", "d", "f", "z"].map(String::from).into();
    let outcomes = capture_running(
        &mut client,
        &hns,
        &hns,
        &WfpPolicyConfig::default(),
        &wanted,
    )
    .await
    .unwrap();
    assert_eq!(
        outcomes.keys().collect::<Vec<_>>(),
        ["a", "b", "c", "d", "f", "z"]
    );

    let a = outcomes["a"].as_ref().unwrap();
    assert_eq!(
        (
            a.sandbox.as_str(),
            a.namespace.guid,
            a.namespace.compartment
        ),
        ("a-1", g(G1), 7)
    );
    assert_eq!(
        a.endpoints,
        [
            (g(EP1), EndpointOutcome::Added),
            (g(EP2), EndpointOutcome::Added)
        ]
    );
    let f = outcomes["f"].as_ref().unwrap();
    assert_eq!(
        f.namespace.compartment,
        ambit_contract::windows::NO_COMPARTMENT
    );

    type Check = fn(&RunningError<NotFound>) -> bool;
    let failures: [(&str, Check, &[&str]); 4] = [
        (
            "b",
            |e| matches!(e, RunningError::Namespace { .. }),
            &["pod b", G2, "b-1", "element not found"],
        ),
        (
            "c",
            |e| {
                matches!(
                    e,
                    RunningError::Policies {
                        source: PodError::NoEndpoints,
                        ..
                    }
                )
            },
            &["pod c", G3, "no HNS endpoints"],
        ),
        (
            "d",
            |e| matches!(e, RunningError::NoSandbox { skipped, .. } if skipped.len() == 1),
            &["pod d", "d-1", "no runtime spec"],
        ),
        (
            "z",
            |e| matches!(e, RunningError::NoSandbox { skipped, .. } if skipped.is_empty()),
            &["pod z", "the runtime lists none"],
        ),
    ];
    for (uid, check, words) in failures {
        let err = outcomes[uid].as_ref().unwrap_err();
        assert!(check(err), "{uid}: {err:?}");
        let text = err.to_string();
        for word in words {
            assert!(text.contains(word), "{uid}: {text:?} lacks {word:?}");
        }
    }
    // Policies went on a's two endpoints and f's one, nowhere else.
    assert_eq!(*hns.modified.lock().unwrap(), [g(EP1), g(EP2), g(EP1)]);
}
