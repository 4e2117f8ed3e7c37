//! Where the agent learns about pods and namespaces: the [`PodSource`] trait (list + watch
//! of this node's pods and all namespaces, and the annotation sink) and
//! [`LocalPodSource`], an in-memory source driven by the embedded mesh and by tests.
//!
//! [`kube::KubePodSource`] implements the same trait against the Kubernetes API server
//! (reflectors on `spec.nodeName`, merge patches on `pods/status`);
//! [`kube::from_environment`] builds it in-cluster or from `KUBECONFIG`.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc;

// The API-server source serves both agents; the upgrade-or-uninstall lookup is the Linux
// daemon's (the Windows agent removes nothing at shutdown).
pub mod kube;
#[cfg(unix)]
pub mod kube_daemonset;

/// The pod annotation the agent writes (`spec/cni.md` §1.11).
pub const REDIRECTION_ANNOTATION: &str = "ambient.istio.io/redirection";
/// Annotation value: rules in place and ztunnel acked.
pub const ENABLED: &str = "enabled";
/// Annotation value: rules in place, ztunnel add failed (retrying).
pub const PENDING: &str = "pending";

/// `status.phase`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PodPhase {
    /// Not scheduled / starting.
    #[default]
    Pending,
    /// Running.
    Running,
    /// Terminated successfully (terminal).
    Succeeded,
    /// Terminated with failure (terminal).
    Failed,
    /// Unknown.
    Unknown,
}

impl PodPhase {
    /// Succeeded or Failed.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// What the agent needs to know about a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pod {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// `spec.serviceAccountName`.
    pub service_account: String,
    /// `spec.nodeName`.
    pub node: String,
    /// `status.podIPs`.
    pub ips: Vec<IpAddr>,
    /// `status.phase`.
    pub phase: PodPhase,
    /// `spec.hostNetwork`.
    pub host_network: bool,
    /// ambit extension: the pod's netns path when the source knows it (the embedded mesh
    /// does). Lets the agent enrol a running pod without a `/proc` scan.
    pub netns: Option<PathBuf>,
}

impl Pod {
    /// The redirection annotation's value.
    pub fn redirection(&self) -> Option<&str> {
        self.annotations
            .get(REDIRECTION_ANNOTATION)
            .map(String::as_str)
    }
}

/// A namespace (only labels matter).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespace {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
}

/// A change (or, at subscription, the current state replayed as changes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodEvent {
    /// A pod was added or updated.
    Pod(Pod),
    /// A pod was deleted (its last known state).
    PodDeleted(Pod),
    /// A namespace was added or updated.
    Namespace(Namespace),
    /// A namespace was deleted.
    NamespaceDeleted(String),
    /// Everything that existed at subscription time has been delivered.
    Synced,
}

/// Failure writing to the source.
///
/// Callers tell "the pod is gone" ([`SourceError::is_pod_gone`]: stop retrying, the delete
/// event follows) from failures worth a retry ([`SourceError::is_retryable`]).
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The pod does not exist (any more).
    #[error("pod {0} not found")]
    NotFound(String),
    /// The API server answered with an error status other than 404 (403 forbidden, 409
    /// conflict, 429 throttled, 5xx, …).
    #[error("API server answered {status} for pod {pod}: {message}")]
    Api {
        /// `namespace/name`.
        pod: String,
        /// HTTP status.
        status: u16,
        /// The server's reason and message.
        message: String,
    },
    /// No answer: connecting, TLS, timeouts, broken or malformed responses, credentials.
    #[error("reaching the API server for pod {pod}: {reason}")]
    Transport {
        /// `namespace/name`.
        pod: String,
        /// What failed (the client error with its causes).
        reason: String,
    },
}

impl SourceError {
    /// The pod is gone: retrying cannot succeed, and the pod's delete event will clean up.
    pub fn is_pod_gone(&self) -> bool {
        matches!(self, Self::NotFound(_))
    }

    /// Whether the same write may succeed later. Everything except a gone pod and a
    /// request the server rejects as malformed (400, 415, 422: the same patch fails again)
    /// is retried; 403 included, as RBAC may still be propagating or be restored.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::NotFound(_) => false,
            Self::Api { status, .. } => !matches!(status, 400 | 415 | 422),
            Self::Transport { .. } => true,
        }
    }
}

/// Pods of this node, all namespaces, and the annotation sink.
pub trait PodSource: Send + Sync + 'static {
    /// Subscribes: the current state as events, then [`PodEvent::Synced`], then changes.
    fn watch(&self) -> mpsc::UnboundedReceiver<PodEvent>;

    /// Sets (`Some`) or removes (`None`) the redirection annotation of a pod.
    fn annotate(
        &self,
        namespace: &str,
        name: &str,
        value: Option<&str>,
    ) -> impl Future<Output = Result<(), SourceError>> + Send;
}

#[derive(Debug, Default)]
struct LocalState {
    pods: BTreeMap<(String, String), Pod>,
    namespaces: BTreeMap<String, Namespace>,
    watchers: Vec<mpsc::UnboundedSender<PodEvent>>,
    /// Every annotation write, in order (namespace, name, value) — for tests and status.
    annotations: Vec<(String, String, Option<String>)>,
}

/// An in-memory pod source; clones share one state.
#[derive(Debug, Clone, Default)]
pub struct LocalPodSource {
    state: Arc<Mutex<LocalState>>,
}

impl LocalPodSource {
    /// An empty source.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, LocalState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn broadcast(st: &mut LocalState, ev: &PodEvent) {
        st.watchers.retain(|w| w.send(ev.clone()).is_ok());
    }

    /// Adds or replaces a pod. The agent-owned redirection annotation is kept from the
    /// stored copy, as a real API server keeps fields the writer did not touch.
    pub fn upsert_pod(&self, mut pod: Pod) {
        let mut st = self.lock();
        let key = (pod.namespace.clone(), pod.name.clone());
        if let Some(old) = st.pods.get(&key)
            && old.uid == pod.uid
        {
            match old.annotations.get(REDIRECTION_ANNOTATION) {
                Some(v) => pod
                    .annotations
                    .insert(REDIRECTION_ANNOTATION.into(), v.clone()),
                None => pod.annotations.remove(REDIRECTION_ANNOTATION),
            };
        }
        st.pods.insert(key, pod.clone());
        Self::broadcast(&mut st, &PodEvent::Pod(pod));
    }

    /// Deletes a pod.
    pub fn delete_pod(&self, namespace: &str, name: &str) {
        let mut st = self.lock();
        if let Some(pod) = st.pods.remove(&(namespace.to_owned(), name.to_owned())) {
            Self::broadcast(&mut st, &PodEvent::PodDeleted(pod));
        }
    }

    /// Adds or replaces a namespace.
    pub fn upsert_namespace(&self, ns: Namespace) {
        let mut st = self.lock();
        st.namespaces.insert(ns.name.clone(), ns.clone());
        Self::broadcast(&mut st, &PodEvent::Namespace(ns));
    }

    /// The stored pod.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.lock()
            .pods
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// The current redirection annotation of a pod.
    pub fn redirection(&self, namespace: &str, name: &str) -> Option<String> {
        self.pod(namespace, name)
            .and_then(|p| p.redirection().map(str::to_owned))
    }

    /// Every annotation write so far.
    pub fn annotation_log(&self) -> Vec<(String, String, Option<String>)> {
        self.lock().annotations.clone()
    }
}

impl PodSource for LocalPodSource {
    fn watch(&self) -> mpsc::UnboundedReceiver<PodEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut st = self.lock();
        // Namespaces first, as informers for both are synced before pods are handled.
        for ns in st.namespaces.values() {
            let _ = tx.send(PodEvent::Namespace(ns.clone()));
        }
        for pod in st.pods.values() {
            let _ = tx.send(PodEvent::Pod(pod.clone()));
        }
        let _ = tx.send(PodEvent::Synced);
        st.watchers.push(tx);
        rx
    }

    fn annotate(
        &self,
        namespace: &str,
        name: &str,
        value: Option<&str>,
    ) -> impl Future<Output = Result<(), SourceError>> + Send {
        let result = {
            let mut st = self.lock();
            let key = (namespace.to_owned(), name.to_owned());
            st.annotations
                .push((key.0.clone(), key.1.clone(), value.map(str::to_owned)));
            match st.pods.get_mut(&key) {
                None => Err(SourceError::NotFound(format!("{namespace}/{name}"))),
                Some(pod) => {
                    match value {
                        Some(v) => pod
                            .annotations
                            .insert(REDIRECTION_ANNOTATION.into(), v.to_owned()),
                        None => pod.annotations.remove(REDIRECTION_ANNOTATION),
                    };
                    let ev = PodEvent::Pod(pod.clone());
                    Self::broadcast(&mut st, &ev);
                    Ok(())
                }
            }
        };
        std::future::ready(result)
    }
}

/// The agent's view of the source: latest pods and namespaces (the Linux daemon's).
#[cfg(unix)]
#[derive(Debug, Default)]
pub(crate) struct Cache {
    pub pods: std::collections::HashMap<(String, String), Pod>,
    pub namespaces: std::collections::HashMap<String, Namespace>,
}
