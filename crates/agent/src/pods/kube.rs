//! [`KubePodSource`]: the agent's [`PodSource`] backed by the Kubernetes API server
//! (`spec/cni.md` §6.1): pods of this node (field selector `spec.nodeName=<node>`, all
//! namespaces) and all namespaces through [`ambit_kubeapi::Reflector`]s, and the redirection
//! annotation written as a JSON merge patch on `pods/<name>/status` (§1.4 e, §1.6 (4)).
//!
//! Namespaces are synced before pods, as upstream waits for both informers before handling
//! pods, and [`PodEvent::Synced`] is sent once, after both initial lists. Later relists (after
//! a 410) only send the differences they find.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use ambit_kubeapi::{Client, KubeConfig, Reflector, ReflectorEvent, SERVICE_ACCOUNT_DIR};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::{Namespace, Pod, PodEvent, PodPhase, PodSource, REDIRECTION_ANNOTATION, SourceError};

/// Why no [`KubePodSource`] could be built from the environment.
#[derive(Debug, thiserror::Error)]
pub enum KubeSetupError {
    /// `NODE_NAME` is empty: the pod watch would select unscheduled pods of every node.
    #[error("NODE_NAME must be set to watch this node's pods from the Kubernetes API")]
    NoNodeName,
    /// No usable API server configuration (see [`KubeConfig::from_environment`]).
    #[error("Kubernetes API client configuration: {0}")]
    Config(#[from] ambit_kubeapi::ConfigError),
}

/// A client for the API server this process should talk to: `KUBECONFIG` when set, else
/// in-cluster (`KUBERNETES_SERVICE_HOST`/`_PORT`, the service-account token and CA under
/// [`SERVICE_ACCOUNT_DIR`]), else `$HOME/.kube/config`. `vars` are the process's variables
/// (the library never reads the environment itself).
pub fn client_from_environment(vars: &[(String, String)]) -> Result<Client, KubeSetupError> {
    client_from_environment_in(vars, Path::new(SERVICE_ACCOUNT_DIR))
}

/// [`client_from_environment`] with another service-account directory (tests).
pub fn client_from_environment_in(
    vars: &[(String, String)],
    sa_dir: &Path,
) -> Result<Client, KubeSetupError> {
    // Last assignment wins, as in a process environment built by appending.
    let var = |name: &str| {
        vars.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let config = KubeConfig::from_environment(var, sa_dir)?;
    Ok(Client::new(config)?)
}

/// The agent's pod source for the node `node` (`NODE_NAME`), with a client from
/// [`client_from_environment`].
pub fn from_environment(
    vars: &[(String, String)],
    node: &str,
) -> Result<KubePodSource, KubeSetupError> {
    if node.is_empty() {
        return Err(KubeSetupError::NoNodeName);
    }
    Ok(KubePodSource::new(client_from_environment(vars)?, node))
}

const NAMESPACES: &str = "/api/v1/namespaces";
const PODS: &str = "/api/v1/pods";

/// Pods of one node and all namespaces, from the API server.
#[derive(Debug, Clone)]
pub struct KubePodSource {
    client: Client,
    node: String,
    backoff: (Duration, Duration),
}

impl KubePodSource {
    /// The API client (shared with other lookups, e.g. the shutdown DaemonSet check).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Watches pods with `spec.nodeName == node`.
    pub fn new(client: Client, node: impl Into<String>) -> Self {
        Self {
            client,
            node: node.into(),
            backoff: (Duration::from_millis(200), Duration::from_secs(30)),
        }
    }

    /// Retry pacing of the watches after API errors.
    pub fn with_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff = (min, max);
        self
    }

    fn reflector(&self, path: &str, field_selector: Option<String>) -> Reflector {
        Reflector::new(self.client.clone(), path, field_selector)
            .with_backoff(self.backoff.0, self.backoff.1)
    }
}

impl PodSource for KubePodSource {
    /// Must be called inside a tokio runtime. The watch task stops when the receiver is
    /// dropped.
    fn watch(&self) -> mpsc::UnboundedReceiver<PodEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        let namespaces = self.reflector(NAMESPACES, None);
        let pods = self.reflector(PODS, Some(format!("spec.nodeName={}", self.node)));
        tokio::spawn(run(namespaces, pods, tx));
        rx
    }

    fn annotate(
        &self,
        namespace: &str,
        name: &str,
        value: Option<&str>,
    ) -> impl Future<Output = Result<(), SourceError>> + Send {
        let client = self.client.clone();
        let path = format!("/api/v1/namespaces/{namespace}/pods/{name}/status");
        let patch = json!({"metadata": {"annotations": {REDIRECTION_ANNOTATION: value}}});
        let pod = format!("{namespace}/{name}");
        async move {
            client
                .merge_patch(&path, &patch)
                .await
                .map(drop)
                .map_err(|e| source_error(pod, &e))
        }
    }
}

/// A client error as the agent sees it: 404 means the pod is gone, other statuses are API
/// refusals, everything else never got an answer.
pub(crate) fn source_error(pod: String, e: &ambit_kubeapi::Error) -> SourceError {
    use ambit_kubeapi::Error as E;
    match e {
        E::Status { status: 404, .. } => SourceError::NotFound(pod),
        E::Status {
            status,
            reason,
            message,
            ..
        } => SourceError::Api {
            pod,
            status: *status,
            message: format!("{reason}: {message}"),
        },
        E::Gone { message } => SourceError::Api {
            pod,
            status: 410,
            message: message.clone(),
        },
        other => SourceError::Transport {
            pod,
            reason: error_chain(other),
        },
    }
}

/// `error: cause: cause …`, so a transport failure names its root cause.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// Initial sync (namespaces, then pods, then `Synced`), then both watches until the receiver
/// is gone.
async fn run(mut namespaces: Reflector, mut pods: Reflector, tx: mpsc::UnboundedSender<PodEvent>) {
    let sync = async {
        initial_sync(&mut namespaces, &tx, namespace_event).await;
        initial_sync(&mut pods, &tx, pod_event).await;
        let _ = tx.send(PodEvent::Synced);
    };
    tokio::select! {
        _ = tx.closed() => return,
        _ = sync => {}
    }
    // One task per reflector, so a busy one never cancels the other's requests.
    let mut tasks = JoinSet::new();
    tasks.spawn(follow(namespaces, tx.clone(), namespace_event));
    tasks.spawn(follow(pods, tx.clone(), pod_event));
    tokio::select! {
        _ = tx.closed() => {}
        _ = tasks.join_next() => {}
    }
    // Dropping the set aborts the other task.
}

type Convert = fn(ReflectorEvent) -> Option<PodEvent>;

async fn initial_sync(r: &mut Reflector, tx: &mpsc::UnboundedSender<PodEvent>, convert: Convert) {
    loop {
        match r.next().await {
            Ok(ReflectorEvent::Synced) => return,
            Ok(ev) => {
                if let Some(ev) = convert(ev) {
                    let _ = tx.send(ev);
                }
            }
            Err(e) => tracing::warn!(path = r.path(), error = %e, "listing from the API server"),
        }
    }
}

async fn follow(mut r: Reflector, tx: mpsc::UnboundedSender<PodEvent>, convert: Convert) {
    loop {
        match r.next().await {
            Ok(ev) => {
                if let Some(ev) = convert(ev)
                    && tx.send(ev).is_err()
                {
                    return;
                }
            }
            Err(e) => tracing::warn!(path = r.path(), error = %e, "watching the API server"),
        }
    }
}

fn namespace_event(ev: ReflectorEvent) -> Option<PodEvent> {
    match ev {
        ReflectorEvent::Added(o) | ReflectorEvent::Updated(o) => {
            parse_namespace(&o).map(PodEvent::Namespace)
        }
        ReflectorEvent::Deleted(o) => {
            parse_namespace(&o).map(|ns| PodEvent::NamespaceDeleted(ns.name))
        }
        ReflectorEvent::Synced => None,
    }
}

fn pod_event(ev: ReflectorEvent) -> Option<PodEvent> {
    match ev {
        ReflectorEvent::Added(o) | ReflectorEvent::Updated(o) => parse_pod(&o).map(PodEvent::Pod),
        ReflectorEvent::Deleted(o) => parse_pod(&o).map(PodEvent::PodDeleted),
        ReflectorEvent::Synced => None,
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Meta {
    name: String,
    namespace: String,
    uid: String,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct KubeNamespace {
    metadata: Meta,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct KubePod {
    metadata: Meta,
    spec: PodSpec,
    status: PodStatus,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct PodSpec {
    node_name: Option<String>,
    service_account_name: Option<String>,
    host_network: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct PodStatus {
    phase: Option<String>,
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(rename = "podIPs")]
    pod_ips: Option<Vec<PodIp>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PodIp {
    ip: String,
}

fn parse_namespace(object: &Value) -> Option<Namespace> {
    let ns: KubeNamespace = decode("namespace", object)?;
    Some(Namespace {
        name: ns.metadata.name,
        labels: ns.metadata.labels.unwrap_or_default(),
    })
}

/// The agent's view of a pod; `None` (logged) when the object does not have a pod's shape.
fn parse_pod(object: &Value) -> Option<Pod> {
    let pod: KubePod = decode("pod", object)?;
    let ips = match pod.status.pod_ips.filter(|ips| !ips.is_empty()) {
        Some(ips) => ips
            .iter()
            .filter_map(|ip| ip.ip.parse::<IpAddr>().ok())
            .collect(),
        None => pod
            .status
            .pod_ip
            .and_then(|ip| ip.parse::<IpAddr>().ok())
            .into_iter()
            .collect(),
    };
    let phase = match pod.status.phase.as_deref() {
        None | Some("Pending") => PodPhase::Pending,
        Some("Running") => PodPhase::Running,
        Some("Succeeded") => PodPhase::Succeeded,
        Some("Failed") => PodPhase::Failed,
        Some(_) => PodPhase::Unknown,
    };
    Some(Pod {
        name: pod.metadata.name,
        namespace: pod.metadata.namespace,
        uid: pod.metadata.uid,
        labels: pod.metadata.labels.unwrap_or_default(),
        annotations: pod.metadata.annotations.unwrap_or_default(),
        service_account: pod
            .spec
            .service_account_name
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".to_string()),
        node: pod.spec.node_name.unwrap_or_default(),
        ips,
        phase,
        host_network: pod.spec.host_network.unwrap_or(false),
        netns: None,
    })
}

fn decode<T: for<'de> Deserialize<'de>>(what: &'static str, object: &Value) -> Option<T> {
    match T::deserialize(object) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(what, error = %e, "ignoring an object the API server sent");
            None
        }
    }
}

// Against the fake API server, on Linux (the Wine step runs the Windows parts only).
#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use ambit_kubeapi::testing::FakeApiServer;

    const DEADLINE: Duration = Duration::from_secs(10);

    fn pod(ns: &str, name: &str, node: &str) -> Value {
        json!({
            "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"),
                         "labels": {"app": name}},
            "spec": {"nodeName": node, "serviceAccountName": "sa", "containers": []},
            "status": {"phase": "Running", "podIP": "10.0.0.9",
                       "podIPs": [{"ip": "10.0.0.9"}, {"ip": "fd00::9"}]},
        })
    }

    async fn recv(rx: &mut mpsc::UnboundedReceiver<PodEvent>) -> PodEvent {
        tokio::time::timeout(DEADLINE, rx.recv())
            .await
            .expect("event within the deadline")
            .expect("source alive")
    }

    #[tokio::test]
    async fn pods_of_this_node_and_annotation_patches() {
        let server = FakeApiServer::start().await.unwrap();
        server.apply(
            NAMESPACES,
            json!({"metadata": {"name": "apps", "labels": {"istio.io/dataplane-mode": "ambient"}}}),
        );
        server.apply(PODS, pod("apps", "mine", "n1"));
        server.apply(PODS, pod("apps", "theirs", "n2"));
        let client = ambit_kubeapi::Client::new(server.config()).unwrap();
        let source = KubePodSource::new(client, "n1");
        let mut rx = source.watch();

        let PodEvent::Namespace(ns) = recv(&mut rx).await else {
            panic!("namespace first")
        };
        assert_eq!(ns.name, "apps");
        assert_eq!(ns.labels["istio.io/dataplane-mode"], "ambient");
        let PodEvent::Pod(p) = recv(&mut rx).await else {
            panic!("then the pod")
        };
        assert_eq!(
            (p.namespace.as_str(), p.name.as_str(), p.uid.as_str()),
            ("apps", "mine", "uid-mine")
        );
        assert_eq!(
            p.ips,
            vec![
                "10.0.0.9".parse::<IpAddr>().unwrap(),
                "fd00::9".parse().unwrap()
            ]
        );
        assert_eq!(
            (p.phase, p.service_account.as_str(), p.node.as_str()),
            (PodPhase::Running, "sa", "n1")
        );
        assert_eq!(recv(&mut rx).await, PodEvent::Synced);

        // Enable: a merge patch on pods/status, which the watch then reports back.
        source
            .annotate("apps", "mine", Some("enabled"))
            .await
            .unwrap();
        let patches = server.patches();
        assert_eq!(patches.len(), 1);
        assert_eq!(patches[0].path, "/api/v1/namespaces/apps/pods/mine/status");
        assert_eq!(patches[0].content_type, "application/merge-patch+json");
        assert_eq!(
            patches[0].body,
            r#"{"metadata":{"annotations":{"ambient.istio.io/redirection":"enabled"}}}"#
        );
        let PodEvent::Pod(p) = recv(&mut rx).await else {
            panic!("pod update")
        };
        assert_eq!(p.redirection(), Some("enabled"));

        // Remove: `null`.
        source.annotate("apps", "mine", None).await.unwrap();
        assert_eq!(
            server.patches()[1].body,
            r#"{"metadata":{"annotations":{"ambient.istio.io/redirection":null}}}"#
        );
        let PodEvent::Pod(p) = recv(&mut rx).await else {
            panic!("pod update")
        };
        assert_eq!(p.redirection(), None);

        let err = source
            .annotate("apps", "nope", Some("enabled"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, SourceError::NotFound(ref p) if p == "apps/nope"),
            "{err}"
        );

        // Pods of other nodes never show up; deletes do.
        server.apply(PODS, pod("apps", "theirs-2", "n2"));
        server.delete(PODS, "apps", "mine");
        let PodEvent::PodDeleted(p) = recv(&mut rx).await else {
            panic!("delete")
        };
        assert_eq!(p.name, "mine");
        server.delete(NAMESPACES, "", "apps");
        assert_eq!(
            recv(&mut rx).await,
            PodEvent::NamespaceDeleted("apps".into())
        );
    }

    #[tokio::test]
    async fn annotation_failures_are_classified() {
        use ambit_kubeapi::testing::Route;
        let server = FakeApiServer::start().await.unwrap();
        server.apply(PODS, pod("apps", "mine", "n1"));
        let source = KubePodSource::new(Client::new(server.config()).unwrap(), "n1");
        let path = "/api/v1/namespaces/apps/pods/mine/status";
        let status = |code: u16, reason: &str| {
            json!({"kind": "Status", "status": "Failure", "reason": reason,
                   "message": format!("injected {code}"), "code": code})
            .to_string()
        };
        // (injected status, body, expected error: (variant, status), pod gone, retryable)
        let cases = [
            (404, status(404, "NotFound"), ("NotFound", 0), true, false),
            (403, status(403, "Forbidden"), ("Api", 403), false, true),
            (409, status(409, "Conflict"), ("Api", 409), false, true),
            (422, status(422, "Invalid"), ("Api", 422), false, false),
            (500, status(500, "InternalError"), ("Api", 500), false, true),
            (
                502,
                "<html>bad gateway</html>".into(),
                ("Api", 502),
                false,
                true,
            ),
        ];
        for (code, body, (variant, want_status), gone, retry) in cases {
            server.respond_once(Route::Patch(path.into()), code, body);
            let err = source
                .annotate("apps", "mine", Some("enabled"))
                .await
                .unwrap_err();
            let got = match &err {
                SourceError::NotFound(p) => {
                    assert_eq!(p, "apps/mine");
                    ("NotFound", 0)
                }
                SourceError::Api {
                    pod,
                    status,
                    message,
                } => {
                    assert_eq!(pod, "apps/mine");
                    assert!(!message.is_empty(), "{code}: empty message");
                    ("Api", *status)
                }
                SourceError::Transport { .. } => ("Transport", 0),
            };
            assert_eq!(got, (variant, want_status), "{code}: {err}");
            assert_eq!(
                (err.is_pod_gone(), err.is_retryable()),
                (gone, retry),
                "{code}"
            );
        }
        // The injected answers are used up: the next patch goes through.
        source
            .annotate("apps", "mine", Some("enabled"))
            .await
            .unwrap();

        // No server at all: a transport error naming the cause, retryable.
        let addr = {
            let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            closed.local_addr().unwrap()
        };
        let gone = KubePodSource::new(
            Client::new(ambit_kubeapi::KubeConfig::for_url(&format!("http://{addr}")).unwrap())
                .unwrap(),
            "n1",
        );
        let err = gone.annotate("apps", "mine", None).await.unwrap_err();
        assert!(
            matches!(&err, SourceError::Transport { reason, .. } if reason.contains("talking to the API server")
                && reason.contains("refused")),
            "{err}"
        );
        assert!(err.is_retryable() && !err.is_pod_gone());
    }

    #[tokio::test]
    async fn built_from_the_environment() {
        let server = FakeApiServer::start().await.unwrap();
        server.apply(NAMESPACES, json!({"metadata": {"name": "apps"}}));
        server.apply(PODS, pod("apps", "mine", "n1"));
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "current-context: c\nclusters: [{{name: k, cluster: {{server: '{}'}}}}]\n\
                 contexts: [{{name: c, context: {{cluster: k, user: u}}}}]\n\
                 users: [{{name: u, user: {{token: t0ken}}}}]\n",
                server.url()
            ),
        )
        .unwrap();
        let vars = |kv: &[(&str, &str)]| -> Vec<(String, String)> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let kc = kubeconfig.display().to_string();

        let source = from_environment(&vars(&[("KUBECONFIG", &kc)]), "n1").unwrap();
        let mut rx = source.watch();
        assert!(matches!(recv(&mut rx).await, PodEvent::Namespace(ns) if ns.name == "apps"));
        assert!(matches!(recv(&mut rx).await, PodEvent::Pod(p) if p.name == "mine"));
        assert_eq!(recv(&mut rx).await, PodEvent::Synced);
        let requests = server.requests();
        assert!(
            requests
                .iter()
                .all(|r| r.authorization.as_deref() == Some("Bearer t0ken")),
            "{requests:?}"
        );

        // Bad environments are errors, never panics.
        let sa = dir.path().join("no-sa");
        let sa_ca = sa.join("ca.crt").display().to_string();
        type Vars = Vec<(String, String)>;
        let cases: Vec<(Vars, &str, &str)> = vec![
            (vars(&[("KUBECONFIG", &kc)]), "", "NODE_NAME"),
            (vars(&[]), "n1", "no Kubernetes API configuration"),
            (
                vars(&[
                    ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
                    ("KUBERNETES_SERVICE_PORT", "443"),
                ]),
                "n1",
                &sa_ca,
            ),
            (
                vars(&[("KUBECONFIG", &dir.path().join("nope").display().to_string())]),
                "n1",
                "nope",
            ),
        ];
        for (vars, node, want) in cases {
            let result = if node.is_empty() {
                from_environment(&vars, node).map(drop)
            } else {
                client_from_environment_in(&vars, &sa).map(drop)
            };
            let err = result.unwrap_err();
            let text = format!("{err}: {:?}", err);
            assert!(text.contains(want), "{vars:?}: {text}");
        }
    }

    #[test]
    fn pod_shapes() {
        // podIP fallback, unknown phase, default service account, junk IPs skipped.
        let p = parse_pod(&json!({
            "metadata": {"name": "p", "namespace": "n", "labels": null},
            "status": {"phase": "Weird", "podIP": "10.1.1.1", "podIPs": []},
        }))
        .unwrap();
        assert_eq!(p.ips, vec!["10.1.1.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(
            (p.phase, p.service_account.as_str()),
            (PodPhase::Unknown, "default")
        );
        let p = parse_pod(&json!({"metadata": {"name": "p"}, "status": {"podIPs": [{"ip": "x"}]}}))
            .unwrap();
        assert!(p.ips.is_empty());
        assert_eq!(p.phase, PodPhase::Pending);
        // Wrong types are skipped, not a panic.
        assert!(parse_pod(&json!({"metadata": {"name": 7}})).is_none());
        assert!(parse_pod(&json!({"metadata": {"labels": {"a": 1}}})).is_none());
    }
}
