//! [`KubeSource`]: [`Cluster`] snapshots from the Kubernetes API server, published on a tokio
//! watch channel like [`crate::source::DirectorySource::watch`].
//!
//! One [`Reflector`] per kind (namespaces, pods, services, and the security.istio.io/v1
//! PeerAuthentications and AuthorizationPolicies), all namespaces. Each item the server sends
//! goes through the same loader as a manifest file ([`load_documents`]): the JSON object, with
//! the `apiVersion`/`kind` list items lack, is valid YAML, so objects from the API server get
//! exactly the types, checks and defaults of objects from files. An object the loader rejects
//! is logged and left out; the rest of the cluster still translates.
//!
//! Except security objects: the API server has already accepted them, and leaving out a
//! policy fails open (a missing DENY, or a missing ALLOW that was the only one). An
//! AuthorizationPolicy or PeerAuthentication the loader refuses (an unknown field, a bad
//! value) is logged as an error and kept in its fail-closed form instead: its metadata and,
//! where they still read, its selector, action and targetRefs, marked
//! [`rejected`](crate::objects::AuthorizationPolicy::rejected). Translation then sends such
//! an ALLOW policy without rules (allows nothing) and such a DENY policy with one empty rule
//! (denies everything in its scope), with a warning each time; a refused PeerAuthentication
//! counts as STRICT for its whole scope. A selector that does not read leaves the policy
//! namespace-wide (fail closed for every workload of the namespace); an action that does not
//! read makes it a DENY.
//!
//! [`KubeSource::watch`] returns after the first complete list of every kind (failing on the
//! first API error, as a broken directory fails `DirectorySource::watch`); afterwards API
//! errors are logged and retried with backoff, and the last snapshot stays.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ambit_kubeapi::serde_json::{self, Value};
use ambit_kubeapi::{Client, Reflector, ReflectorEvent, object_key};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::objects::{Kind, Object, ObjectError, ObjectKey, ObjectSet, Resource, load_documents};
use crate::translate::{Cluster, ClusterConfig};

/// Where each kind is listed and watched, and the `apiVersion` its list items are given.
pub const RESOURCES: [(Kind, &str, &str); 5] = [
    (Kind::Namespace, "/api/v1/namespaces", "v1"),
    (Kind::Pod, "/api/v1/pods", "v1"),
    (Kind::Service, "/api/v1/services", "v1"),
    (
        Kind::PeerAuthentication,
        "/apis/security.istio.io/v1/peerauthentications",
        "security.istio.io/v1",
    ),
    (
        Kind::AuthorizationPolicy,
        "/apis/security.istio.io/v1/authorizationpolicies",
        "security.istio.io/v1",
    ),
];

#[derive(Debug, thiserror::Error)]
pub enum KubeSourceError {
    #[error("initial list of {kind} ({path}): {source}")]
    List {
        kind: Kind,
        path: &'static str,
        #[source]
        source: ambit_kubeapi::Error,
    },
}

/// The five kinds from the API server.
#[derive(Debug, Clone)]
pub struct KubeSource {
    client: Client,
    config: ClusterConfig,
    backoff: (Duration, Duration),
}

type Objects = BTreeMap<ObjectKey, Object>;

impl KubeSource {
    pub fn new(client: Client, config: ClusterConfig) -> Self {
        Self {
            client,
            config,
            backoff: (Duration::from_millis(200), Duration::from_secs(30)),
        }
    }

    /// Retry pacing of the watches after API errors.
    pub fn with_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff = (min, max);
        self
    }

    /// Lists every kind, publishes the first snapshot, then follows the watches. Must be
    /// called inside a tokio runtime; the tasks stop when the returned [`KubeWatch`] is
    /// dropped or stopped.
    pub async fn watch(self) -> Result<KubeWatch, KubeSourceError> {
        let mut objects = Objects::new();
        let mut reflectors = Vec::new();
        for (kind, path, api_version) in RESOURCES {
            let mut r = Reflector::new(self.client.clone(), path, None)
                .with_backoff(self.backoff.0, self.backoff.1);
            loop {
                match r.next().await {
                    Ok(ReflectorEvent::Synced) => break,
                    Ok(ev) => apply(&mut objects, kind, api_version, ev),
                    Err(source) => return Err(KubeSourceError::List { kind, path, source }),
                }
            }
            reflectors.push((kind, api_version, r));
        }
        let first = snapshot(&self.config, &objects);
        tracing::info!(
            objects = first.objects.len(),
            "objects listed from the API server"
        );
        let (tx, rx) = watch::channel(Arc::new(first));
        let task = tokio::spawn(follow(self.config, objects, reflectors, tx));
        Ok(KubeWatch { rx, task })
    }
}

/// Forwards each reflector's events (one task per kind, so a busy kind never cancels the
/// requests of another) and publishes a snapshot after each burst of changes.
async fn follow(
    config: ClusterConfig,
    mut objects: Objects,
    reflectors: Vec<(Kind, &'static str, Reflector)>,
    tx: watch::Sender<Arc<Cluster>>,
) {
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let mut tasks = JoinSet::new();
    for (kind, api_version, mut r) in reflectors {
        let events_tx = events_tx.clone();
        tasks.spawn(async move {
            loop {
                match r.next().await {
                    Ok(ev) => {
                        if events_tx.send((kind, api_version, ev)).is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::warn!(%kind, path = r.path(), error = %e, "watching the API server"),
                }
            }
        });
    }
    drop(events_tx);
    loop {
        let first = tokio::select! {
            _ = tx.closed() => return,
            ev = events.recv() => match ev {
                Some(ev) => ev,
                None => return,
            },
        };
        let (kind, api_version, ev) = first;
        apply(&mut objects, kind, api_version, ev);
        // Everything already queued goes into the same snapshot.
        while let Ok((kind, api_version, ev)) = events.try_recv() {
            apply(&mut objects, kind, api_version, ev);
        }
        let cluster = snapshot(&config, &objects);
        tx.send_if_modified(|current| {
            if **current == cluster {
                return false;
            }
            tracing::debug!(objects = cluster.objects.len(), "objects changed");
            *current = Arc::new(cluster);
            true
        });
    }
}

fn snapshot(config: &ClusterConfig, objects: &Objects) -> Cluster {
    let mut set = ObjectSet::new();
    for object in objects.values() {
        // Keys are unique in the map, so the set cannot see a duplicate.
        if let Err(e) = set.insert(object.clone()) {
            tracing::warn!(error = %e, "object left out");
        }
    }
    Cluster::new(config.clone(), set)
}

fn apply(objects: &mut Objects, kind: Kind, api_version: &str, ev: ReflectorEvent) {
    match ev {
        ReflectorEvent::Added(item) | ReflectorEvent::Updated(item) => {
            let key = key_of(kind, &item);
            match to_object(kind, api_version, item) {
                Ok(object) => {
                    objects.insert(object.key(), object);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "object from the API server ignored");
                    // A broken update must not leave the previous version in place silently.
                    if let Some(key) = key {
                        objects.remove(&key);
                    }
                }
            }
        }
        ReflectorEvent::Deleted(item) => {
            if let Some(key) = key_of(kind, &item) {
                objects.remove(&key);
            }
        }
        ReflectorEvent::Synced => {}
    }
}

fn key_of(kind: Kind, item: &Value) -> Option<ObjectKey> {
    let (namespace, name) = object_key(item)?;
    Some(ObjectKey {
        kind,
        namespace: if kind.is_namespaced() {
            namespace
        } else {
            String::new()
        },
        name,
    })
}

/// One API object through the manifest loader.
fn to_object(kind: Kind, api_version: &str, mut item: Value) -> Result<Object, ObjectError> {
    let (namespace, name) = object_key(&item).unwrap_or_default();
    let origin = if namespace.is_empty() {
        format!("API server {kind} {name}")
    } else {
        format!("API server {kind} {namespace}/{name}")
    };
    if let Value::Object(map) = &mut item {
        map.insert("apiVersion".into(), Value::from(api_version));
        map.insert("kind".into(), Value::from(kind.as_str()));
    }
    // Pretty form: block-indented JSON is YAML every YAML 1.1 parser reads alike.
    let text = serde_json::to_string_pretty(&item).unwrap_or_default();
    let mut loaded = match load_documents(&origin, &text) {
        Ok(loaded) => loaded,
        Err(e) if matches!(kind, Kind::AuthorizationPolicy | Kind::PeerAuthentication) => {
            let kept = fail_closed(&origin, kind, &item, &e).ok_or(e.clone())?;
            tracing::error!(
                error = %e,
                "security object from the API server refused; enforced in its fail-closed form"
            );
            vec![kept]
        }
        Err(e) => return Err(e),
    };
    match loaded.pop() {
        Some(object) if loaded.is_empty() => Ok(object),
        _ => Err(ObjectError::Missing {
            origin: crate::objects::Origin {
                file: origin,
                document: 1,
            },
            field: "object",
        }),
    }
}

/// The fail-closed stand-in for a security object the loader refused (see the module doc):
/// `None` when not even its metadata reads.
fn fail_closed(origin: &str, kind: Kind, item: &Value, refused: &ObjectError) -> Option<Object> {
    use crate::objects::security::{
        AuthorizationPolicy, AuthzAction, PeerAuthentication, TargetRef, WorkloadSelector,
    };
    let spec = item.get("spec");
    let part = |name: &str| spec.and_then(|s| s.get(name)).filter(|v| !v.is_null());
    let selector =
        part("selector").and_then(|v| serde_json::from_value::<WorkloadSelector>(v.clone()).ok());
    // Only the metadata goes through the loader (its defaults and checks), under this kind.
    let bare = serde_json::json!({
        "apiVersion": item.get("apiVersion"),
        "kind": kind.as_str(),
        "metadata": item.get("metadata"),
    });
    let text = serde_json::to_string_pretty(&bare).ok()?;
    let mut object = load_documents(origin, &text).ok()?.pop()?;
    let reason = refused.to_string();
    object.resource = match object.resource {
        Resource::AuthorizationPolicy(ap) => {
            let action = part("action")
                .map(|v| {
                    serde_json::from_value::<AuthzAction>(v.clone()).unwrap_or(AuthzAction::Deny)
                })
                .unwrap_or_default();
            let targeted = part("targetRef").is_some()
                || part("targetRefs").is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty()));
            let target_refs = if targeted {
                vec![TargetRef::default()]
            } else {
                Vec::new()
            };
            Resource::AuthorizationPolicy(AuthorizationPolicy::rejected(
                ap.metadata,
                selector,
                target_refs,
                action,
                reason,
            ))
        }
        Resource::PeerAuthentication(pa) => Resource::PeerAuthentication(
            PeerAuthentication::rejected(pa.metadata, selector, reason),
        ),
        _ => return None,
    };
    Some(object)
}

/// A running API watch: the latest snapshot and the task that maintains it.
#[derive(Debug)]
pub struct KubeWatch {
    rx: watch::Receiver<Arc<Cluster>>,
    task: JoinHandle<()>,
}

impl KubeWatch {
    /// A receiver of snapshots; `changed()` fires after each change of the objects.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Cluster>> {
        self.rx.clone()
    }

    /// The latest snapshot.
    pub fn current(&self) -> Arc<Cluster> {
        Arc::clone(&self.rx.borrow())
    }

    /// Stops watching and waits for the task to end.
    pub async fn stop(mut self) {
        self.task.abort();
        // Aborted: cancellation is its only outcome.
        let _ = (&mut self.task).await;
    }
}

impl Drop for KubeWatch {
    fn drop(&mut self) {
        // Aborting the task drops its JoinSet, which aborts the per-kind tasks.
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_kubeapi::serde_json::json;
    use ambit_kubeapi::testing::FakeApiServer;

    const DEADLINE: Duration = Duration::from_secs(10);

    fn pod(name: &str, ip: &str) -> Value {
        json!({
            "metadata": {
                "name": name, "namespace": "apps", "uid": format!("uid-{name}"),
                "labels": {"app": name},
                "annotations": {
                    "ambient.istio.io/redirection": "enabled",
                    // Real objects carry JSON inside strings; it must survive the loader.
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"a\": [1, \"x: y\"]}\n",
                },
                "creationTimestamp": "2024-01-31T12:00:00Z",
            },
            "spec": {"nodeName": "n1", "serviceAccountName": "sa",
                     "containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 8080, "name": "http"}]}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
        })
    }

    fn workload_names(cluster: &Cluster) -> Vec<String> {
        let mut names: Vec<String> = cluster
            .translate()
            .workloads
            .into_iter()
            .map(|w| w.name)
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn pod_changes_reach_translated_workloads() {
        let server = FakeApiServer::start().await.unwrap();
        server.apply("/api/v1/namespaces", json!({"metadata": {"name": "apps"}}));
        server.apply("/api/v1/pods", pod("a", "10.0.0.1"));
        server.apply(
            "/api/v1/services",
            json!({"metadata": {"name": "web", "namespace": "apps"},
                   "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "a"},
                            "ports": [{"port": 80, "targetPort": "http", "protocol": "TCP"}]}}),
        );
        server.apply(
            "/apis/security.istio.io/v1/authorizationpolicies",
            json!({"metadata": {"name": "deny-all", "namespace": "apps"}, "spec": {"action": "DENY", "rules": [{}]}}),
        );
        let client = Client::new(server.config()).unwrap();
        let source = KubeSource::new(client, ClusterConfig::default())
            .with_backoff(Duration::from_millis(10), Duration::from_millis(100));
        let watch = source.watch().await.unwrap();

        let first = watch.current();
        assert_eq!(first.objects.len(), 4, "{:?}", first.objects);
        let t = first.translate();
        let w = t.workloads.iter().find(|w| w.name == "a").unwrap();
        assert_eq!(
            w.addresses,
            vec!["10.0.0.1".parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(t.services.len(), 1);
        assert_eq!(t.policies.len(), 1);

        // A pod added on the server shows up as a workload.
        let mut rx = watch.subscribe();
        server.apply("/api/v1/pods", pod("b", "10.0.0.2"));
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            tokio::time::timeout_at(deadline, rx.changed())
                .await
                .unwrap()
                .unwrap();
            if workload_names(&rx.borrow_and_update()) == ["a", "b"] {
                break;
            }
        }
        // And a deleted one goes away.
        server.delete("/api/v1/pods", "apps", "a");
        loop {
            tokio::time::timeout_at(deadline, rx.changed())
                .await
                .unwrap()
                .unwrap();
            if workload_names(&rx.borrow_and_update()) == ["b"] {
                break;
            }
        }
        watch.stop().await;
    }

    #[tokio::test]
    async fn a_failing_initial_list_fails_the_watch() {
        let server = FakeApiServer::start().await.unwrap();
        server.respond_once(
            ambit_kubeapi::testing::Route::List("/apis/security.istio.io/v1/peerauthentications".into()),
            404,
            r#"{"kind":"Status","code":404,"reason":"NotFound","message":"the server could not find the requested resource"}"#,
        );
        let client = Client::new(server.config()).unwrap();
        let err = KubeSource::new(client, ClusterConfig::default())
            .watch()
            .await
            .unwrap_err();
        assert!(
            matches!(&err, KubeSourceError::List { kind: Kind::PeerAuthentication, source, .. } if source.is_not_found()),
            "{err}"
        );
    }

    #[test]
    fn bad_objects_are_left_out() {
        let mut objects = Objects::new();
        let good = json!({"metadata": {"name": "ok", "namespace": "x"}});
        apply(&mut objects, Kind::Pod, "v1", ReflectorEvent::Added(good));
        // A wrong type in a field the loader reads: rejected, and an older good version of
        // the same object is dropped rather than kept silently.
        let bad =
            json!({"metadata": {"name": "ok", "namespace": "x"}, "spec": {"hostNetwork": "yes"}});
        apply(&mut objects, Kind::Pod, "v1", ReflectorEvent::Updated(bad));
        assert!(objects.is_empty());
    }

    /// Issue 12, hole 3: a security object the API server accepted but the loader refuses
    /// (unknown field, bad value) is enforced in its fail-closed form, never left out.
    #[test]
    fn refused_security_objects_fail_closed() {
        use ambit_model::authz::{Action, Rule, Scope};
        let ap = |name: &str, spec: Value| json!({"metadata": {"name": name, "namespace": "apps"}, "spec": spec});
        // (case, policy, expected scope, action, rules, warning fragment)
        type Case = (&'static str, Value, Scope, Action, Vec<Rule>, &'static str);
        let cases: Vec<Case> = vec![
            (
                "typo in an ALLOW source: allows nothing",
                ap(
                    "typo",
                    json!({"selector": {"matchLabels": {"app": "a"}},
                    "rules": [{"from": [{"source": {"principal": ["x"]}}]}]}),
                ),
                Scope::WorkloadSelector,
                Action::Allow,
                vec![],
                "unknown field `principal`",
            ),
            (
                "typo in a DENY: denies everything in scope",
                ap(
                    "typo",
                    json!({"action": "DENY", "rules": [{"to": [{"operation": {"port": ["80"]}}]}]}),
                ),
                Scope::Namespace,
                Action::Deny,
                vec![Rule::default()],
                "unknown field `port`",
            ),
            (
                "typo in the selector: the whole namespace",
                ap(
                    "typo",
                    json!({"selector": {"matchLabel": {"app": "a"}}, "rules": [{}]}),
                ),
                Scope::Namespace,
                Action::Allow,
                vec![],
                "unknown field `matchLabel`",
            ),
            (
                "unreadable action: DENY",
                ap("typo", json!({"action": "REJECT", "rules": [{}]})),
                Scope::Namespace,
                Action::Deny,
                vec![Rule::default()],
                "REJECT",
            ),
        ];
        for (case, item, scope, action, rules, fragment) in cases {
            let mut objects = Objects::new();
            apply(
                &mut objects,
                Kind::AuthorizationPolicy,
                "security.istio.io/v1",
                ReflectorEvent::Added(item),
            );
            let t = snapshot(&ClusterConfig::default(), &objects).translate();
            assert_eq!(t.policies.len(), 1, "{case}: {:?}", t.warnings);
            let p = &t.policies[0];
            assert_eq!(
                (p.scope, p.action, &p.rules),
                (scope, action, &rules),
                "{case}"
            );
            assert!(
                t.warnings
                    .iter()
                    .any(|w| w.contains("rejected") && w.contains(fragment)),
                "{case}: {:?}",
                t.warnings
            );
        }
    }

    /// A refused PeerAuthentication counts as STRICT (port-level exceptions dropped); one with
    /// port keys as the API server writes them (JSON strings) reads as it should.
    #[test]
    fn peer_authentications_from_the_api_server() {
        let pa =
            |spec: Value| json!({"metadata": {"name": "pa", "namespace": "apps"}, "spec": spec});
        let cases = [
            (
                "refused: STRICT",
                pa(json!({"mtls": {"mode": "PERMISSIVE"}, "portLevelMTLS": {}})),
                true,
            ),
            (
                "string port keys read",
                pa(json!({"selector": {"matchLabels": {"app": "a"}},
                "mtls": {"mode": "PERMISSIVE"}, "portLevelMtls": {"8080": {"mode": "STRICT"}}})),
                false,
            ),
        ];
        for (case, item, strict) in cases {
            let mut objects = Objects::new();
            apply(
                &mut objects,
                Kind::Pod,
                "v1",
                ReflectorEvent::Added(pod("a", "10.0.0.1")),
            );
            apply(
                &mut objects,
                Kind::PeerAuthentication,
                "security.istio.io/v1",
                ReflectorEvent::Added(item),
            );
            assert_eq!(objects.len(), 2, "{case}");
            let t = snapshot(&ClusterConfig::default(), &objects).translate();
            let w = t.workloads.iter().find(|w| w.name == "a").unwrap();
            let listed: Vec<String> = w
                .authorization_policies
                .iter()
                .map(ToString::to_string)
                .collect();
            assert_eq!(
                listed.contains(&"istio-system/istio_converted_static_strict".to_string()),
                strict,
                "{case}: {listed:?}"
            );
            if !strict {
                assert_eq!(listed, ["apps/converted_peer_authentication_pa"], "{case}");
            }
        }
    }
}
