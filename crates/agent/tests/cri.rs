//! The CRI client (`ambit_agent::windows::sandboxes`) against a fake runtime speaking the real
//! `runtime.v1.RuntimeService` gRPC on a Unix socket: which sandbox names a pod's HNS
//! namespace, what is skipped and why, and the deadline on a runtime that stops answering.
//! The same client over a named pipe runs under Wine (`tests/windows.rs`).

#![cfg(unix)]
#![allow(clippy::unwrap_used)]

#[path = "support/fake_cri.rs"]
mod fake_cri;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use ambit_agent::windows::cri::SandboxInfoError;
use ambit_agent::windows::sandboxes::{CriClient, CriError, SkipReason};
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
