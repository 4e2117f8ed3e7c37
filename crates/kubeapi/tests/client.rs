//! The client, watch streams and reflector against the fake API server.

use std::time::Duration;

use ambit_kubeapi::testing::{FakeApiServer, Route};
use ambit_kubeapi::{
    Auth, Client, Error, EventType, Limits, MERGE_PATCH, Reflector, ReflectorEvent, object_key,
};
use serde_json::{Value, json};

const PODS: &str = "/api/v1/pods";
const DEADLINE: Duration = Duration::from_secs(10);

fn pod(ns: &str, name: &str, node: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.1"},
    })
}

async fn start() -> (FakeApiServer, Client) {
    let server = FakeApiServer::start().await.expect("fake server");
    let client = Client::new(server.config()).expect("client");
    (server, client)
}

async fn next(r: &mut Reflector) -> ReflectorEvent {
    tokio::time::timeout(DEADLINE, r.next())
        .await
        .expect("reflector event within the deadline")
        .expect("no reflector error")
}

/// A compact view of an event: ("added", "ns/name").
fn summary(ev: &ReflectorEvent) -> (&'static str, String) {
    let key = |o: &Value| {
        let (ns, name) = object_key(o).expect("named object");
        format!("{ns}/{name}")
    };
    match ev {
        ReflectorEvent::Added(o) => ("added", key(o)),
        ReflectorEvent::Updated(o) => ("updated", key(o)),
        ReflectorEvent::Deleted(o) => ("deleted", key(o)),
        ReflectorEvent::Synced => ("synced", String::new()),
    }
}

async fn expect(r: &mut Reflector, want: &[(&str, &str)]) {
    for (kind, key) in want {
        let ev = next(r).await;
        assert_eq!(
            summary(&ev),
            (*kind, key.to_string()),
            "while expecting {want:?}"
        );
    }
}

#[tokio::test]
async fn list_then_watch_sees_add_modify_delete() {
    let (server, client) = start().await;
    server.apply(PODS, pod("a", "p1", "n1"));
    server.apply(PODS, pod("a", "elsewhere", "n2"));
    let mut r = Reflector::new(client, PODS, Some("spec.nodeName=n1".into()));
    expect(&mut r, &[("added", "a/p1"), ("synced", "")]).await;

    server.apply(PODS, pod("b", "p2", "n1"));
    server.apply(PODS, pod("b", "not-mine", "n2"));
    expect(&mut r, &[("added", "b/p2")]).await;

    let mut changed = pod("a", "p1", "n1");
    changed["metadata"]["labels"]["app"] = json!("other");
    server.apply(PODS, changed);
    let ev = next(&mut r).await;
    assert_eq!(summary(&ev), ("updated", "a/p1".into()));
    let ReflectorEvent::Updated(o) = ev else {
        unreachable!()
    };
    assert_eq!(o["metadata"]["labels"]["app"], "other");

    server.delete(PODS, "b", "p2");
    expect(&mut r, &[("deleted", "b/p2")]).await;
    assert_eq!(r.store().len(), 1);

    // The selector went to the server, encoded.
    let list = &server.requests()[0];
    assert_eq!(list.query, "fieldSelector=spec.nodeName%3Dn1&limit=500");
}

#[tokio::test]
async fn relists_after_410_and_reports_what_it_missed() {
    let (server, client) = start().await;
    server.apply(PODS, pod("a", "keep", "n1"));
    server.apply(PODS, pod("a", "gone", "n1"));
    let mut r = Reflector::new(client, PODS, None)
        .with_backoff(Duration::from_millis(10), Duration::from_millis(50));
    expect(
        &mut r,
        &[("added", "a/gone"), ("added", "a/keep"), ("synced", "")],
    )
    .await;

    // Changes the watch never sees, then the history is compacted: the resumed watch gets
    // an ERROR 410 and the reflector relists.
    server.lose_history(|s| {
        s.apply(PODS, pod("a", "new", "n1"));
        s.delete(PODS, "a", "gone");
    });
    expect(
        &mut r,
        &[("added", "a/new"), ("deleted", "a/gone"), ("synced", "")],
    )
    .await;
    let lists = server
        .requests()
        .iter()
        .filter(|q| !q.query.contains("watch=true"))
        .count();
    assert_eq!(lists, 2);

    // And it watches again from the new list.
    server.apply(PODS, pod("a", "later", "n1"));
    expect(&mut r, &[("added", "a/later")]).await;
}

#[tokio::test]
async fn a_disconnected_watch_resumes_without_relisting() {
    let (server, client) = start().await;
    let mut r = Reflector::new(client, PODS, None);
    expect(&mut r, &[("synced", "")]).await;
    server.apply(PODS, pod("a", "p1", "n1"));
    expect(&mut r, &[("added", "a/p1")]).await;
    server.disconnect_watches();
    server.apply(PODS, pod("a", "p2", "n1"));
    expect(&mut r, &[("added", "a/p2")]).await;
    let lists = server
        .requests()
        .iter()
        .filter(|q| !q.query.contains("watch=true"))
        .count();
    assert_eq!(lists, 1);
}

#[tokio::test]
async fn watch_from_a_compacted_version_is_gone() {
    let (server, client) = start().await;
    server.apply(PODS, pod("a", "p1", "n1"));
    let list = client.list(PODS, None).await.unwrap();
    server.lose_history(|s| {
        s.apply(PODS, pod("a", "p2", "n1"));
    });
    let mut w = client
        .watch(PODS, &list.resource_version, None)
        .await
        .unwrap();
    let ev = w.next().await.unwrap().unwrap();
    assert_eq!(ev.kind, EventType::Error);
    assert!(matches!(ev.error_status(), Some(Error::Gone { .. })));
}

#[tokio::test]
async fn merge_patch_is_recorded_and_applied() {
    let (server, client) = start().await;
    server.apply(PODS, pod("a", "p1", "n1"));
    let path = "/api/v1/namespaces/a/pods/p1/status";
    let patch = json!({"metadata": {"annotations": {"ambient.istio.io/redirection": "enabled"}}});
    let out = client.merge_patch(path, &patch).await.unwrap();
    assert_eq!(
        out["metadata"]["annotations"]["ambient.istio.io/redirection"],
        "enabled"
    );
    let recorded = server.patches();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].path, path);
    assert_eq!(recorded[0].content_type, MERGE_PATCH);
    assert_eq!(
        serde_json::from_str::<Value>(&recorded[0].body).unwrap(),
        patch
    );

    let remove = json!({"metadata": {"annotations": {"ambient.istio.io/redirection": null}}});
    client.merge_patch(path, &remove).await.unwrap();
    let stored = server.object(PODS, "a", "p1").unwrap();
    assert_eq!(stored["metadata"]["annotations"], json!({}));

    let missing = client
        .merge_patch("/api/v1/namespaces/a/pods/nope/status", &patch)
        .await
        .unwrap_err();
    assert!(missing.is_not_found(), "{missing}");
}

#[tokio::test]
async fn bad_answers_are_errors_not_panics() {
    let (server, client) = start().await;
    type Check = fn(&Error) -> bool;
    let cases: [(u16, &str, Check); 6] = [
        (200, "{not json", |e| matches!(e, Error::Json { .. })),
        (200, r#"{"items": []}"#, |e| {
            matches!(e, Error::Shape { .. })
        }),
        (
            200,
            r#"{"metadata": {"resourceVersion": "1"}, "items": [1]}"#,
            |e| matches!(e, Error::Shape { .. }),
        ),
        (200, r#"[1, 2]"#, |e| matches!(e, Error::Json { .. })),
        (
            403,
            r#"{"kind":"Status","code":403,"reason":"Forbidden","message":"pods is forbidden"}"#,
            |e| matches!(e, Error::Status { status: 403, message, .. } if message == "pods is forbidden"),
        ),
        (500, "plain text", |e| {
            matches!(e, Error::Status { status: 500, .. })
        }),
    ];
    for (status, body, check) in cases {
        server.respond_once(Route::List(PODS.into()), status, body);
        let err = client.list(PODS, None).await.unwrap_err();
        assert!(check(&err), "{status} {body}: {err:?}");
    }

    // A broken watch line ends the stream with an error after the good events.
    let good = r#"{"type":"ADDED","object":{"metadata":{"name":"x","resourceVersion":"5"}}}"#;
    server.respond_once(
        Route::Watch(PODS.into()),
        200,
        format!("{good}\n{{oops\n{good}\n"),
    );
    let mut w = client.watch(PODS, "1", None).await.unwrap();
    assert_eq!(w.next().await.unwrap().unwrap().kind, EventType::Added);
    assert!(matches!(w.next().await, Some(Err(Error::Json { .. }))));
    assert!(w.next().await.is_none());

    // An over-long line is refused, not buffered forever.
    let small = client.clone().with_limits(Limits {
        max_line: 64,
        ..Limits::default()
    });
    server.respond_once(Route::Watch(PODS.into()), 200, "x".repeat(1000));
    let mut w = small.watch(PODS, "1", None).await.unwrap();
    assert!(matches!(w.next().await, Some(Err(Error::TooLarge { .. }))));
}

#[tokio::test]
async fn reflector_recovers_from_a_broken_watch() {
    let (server, client) = start().await;
    let mut r = Reflector::new(client, PODS, None)
        .with_backoff(Duration::from_millis(10), Duration::from_millis(50));
    expect(&mut r, &[("synced", "")]).await;
    server.respond_once(Route::Watch(PODS.into()), 200, "{garbage\n");
    server.disconnect_watches();
    let err = tokio::time::timeout(DEADLINE, r.next())
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::Json { .. }), "{err}");
    server.apply(PODS, pod("a", "p1", "n1"));
    expect(&mut r, &[("added", "a/p1")]).await;
}

#[tokio::test]
async fn tls_with_ca_and_bearer_token() {
    let ca = ambit_tls::LocalCa::generate("cluster.local").unwrap();
    let cert = ca.server_cert_for_hostnames(&["127.0.0.1"]).unwrap();
    let server = FakeApiServer::start_tls(&cert).await.unwrap();
    server.apply(PODS, pod("a", "p1", "n1"));

    let mut config = server.config();
    config.ca_pem = Some(ca.root_pem().to_string());
    config.auth = Auth::Token("s3cret".into());
    let client = Client::new(config.clone()).unwrap();
    let list = client.list(PODS, None).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(
        server.requests()[0].authorization.as_deref(),
        Some("Bearer s3cret")
    );

    // Watches work over the same (HTTP/2) transport.
    let mut w = client
        .watch(PODS, &list.resource_version, None)
        .await
        .unwrap();
    server.apply(PODS, pod("a", "p2", "n1"));
    let ev = tokio::time::timeout(DEADLINE, w.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(ev.object["metadata"]["name"], "p2");

    // A server whose certificate does not chain to the configured CA is refused.
    let other = ambit_tls::LocalCa::generate("cluster.local").unwrap();
    config.ca_pem = Some(other.root_pem().to_string());
    let err = Client::new(config)
        .unwrap()
        .list(PODS, None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Transport { .. }), "{err:?}");
}
