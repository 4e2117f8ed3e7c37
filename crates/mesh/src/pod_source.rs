//! The embedded mesh's pod source for node agents (`ambit cni-agent --pods DIR`): the agent
//! plays both sides of the API server. It re-reads the directory every [`POLL_INTERVAL`]
//! (pods that appear, change labels or disappear become the events an informer delivers; a
//! broken edit is logged and the last good state stays), and with a status directory it
//! "patches" pods by writing each pod's redirection annotation to `DIR/NAMESPACE_NAME`
//! (removed with the annotation), which the orchestrator reads back as the API server's copy.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ambit_agent::pods::{
    LocalPodSource, Namespace, Pod, PodEvent, PodPhase, PodSource, SourceError,
};
use ambit_control::objects::{ObjectError, ObjectSet};
use tokio::sync::mpsc;

use crate::manifests::NETNS_ANNOTATION;

/// How often the pods directory is re-read.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Why the pods directory could not be read into a pod source.
#[derive(Debug, thiserror::Error)]
pub enum PodSourceError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Manifest(#[from] ObjectError),
    #[error("pod status directory {}: {source}", path.display())]
    StatusDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn read_error(path: &Path) -> impl FnOnce(std::io::Error) -> PodSourceError + '_ {
    move |source| PodSourceError::Read {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads `dir` (pods of `node`; all nodes when empty), then keeps watching it on a thread of
/// its own for the life of the process. `status_dir`: where annotations are mirrored.
pub fn start(
    dir: &Path,
    node: &str,
    status_dir: Option<PathBuf>,
) -> Result<ManifestPodSource, PodSourceError> {
    let first = read_dir_texts(dir).and_then(|t| snapshot(&t, node))?;
    if let Some(status) = &status_dir {
        std::fs::create_dir_all(status).map_err(|source| PodSourceError::StatusDir {
            path: status.clone(),
            source,
        })?;
    }
    let source = LocalPodSource::new();
    publish(&source, &Snapshot::default(), &first);
    let (dir, node, src) = (dir.to_path_buf(), node.to_owned(), source.clone());
    std::thread::spawn(move || watch_dir(dir, node, src, first));
    Ok(ManifestPodSource {
        inner: source,
        status_dir,
    })
}

/// What one read of the pods directory found.
#[derive(Debug, Default, PartialEq)]
struct Snapshot {
    namespaces: BTreeMap<String, Namespace>,
    pods: BTreeMap<(String, String), Pod>,
}

fn read_dir_texts(dir: &Path) -> Result<Vec<(PathBuf, String)>, PodSourceError> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_error(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    entries.sort();
    entries
        .into_iter()
        .map(|path| {
            std::fs::read_to_string(&path)
                .map(|t| (path.clone(), t))
                .map_err(read_error(&path))
        })
        .collect()
}

fn snapshot(texts: &[(PathBuf, String)], node: &str) -> Result<Snapshot, PodSourceError> {
    let mut set = ObjectSet::new();
    for (path, text) in texts {
        let name = path.display().to_string();
        for obj in ambit_control::objects::load_documents(&name, text)? {
            set.insert(obj)?;
        }
    }
    let mut snap = Snapshot::default();
    for obj in &set.namespaces {
        snap.namespaces.insert(
            obj.metadata.name.clone(),
            Namespace {
                name: obj.metadata.name.clone(),
                labels: obj.metadata.labels.clone(),
            },
        );
    }
    for pod in &set.pods {
        if !node.is_empty() && pod.spec.node_name != node {
            continue;
        }
        let p = Pod {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            uid: pod.metadata.uid.clone(),
            labels: pod.metadata.labels.clone(),
            annotations: pod.metadata.annotations.clone(),
            service_account: pod.spec.service_account_name.clone(),
            node: pod.spec.node_name.clone(),
            ips: pod.ips(),
            phase: if pod.is_terminal() {
                PodPhase::Failed
            } else {
                PodPhase::Running
            },
            host_network: pod.spec.host_network,
            netns: pod
                .metadata
                .annotations
                .get(NETNS_ANNOTATION)
                .map(PathBuf::from),
        };
        snap.pods.insert((p.namespace.clone(), p.name.clone()), p);
    }
    Ok(snap)
}

/// Feeds the difference between two snapshots into the source, as informer events.
fn publish(source: &LocalPodSource, old: &Snapshot, new: &Snapshot) {
    for (name, ns) in &new.namespaces {
        if old.namespaces.get(name) != Some(ns) {
            source.upsert_namespace(ns.clone());
        }
    }
    for (key, pod) in &new.pods {
        if old.pods.get(key) != Some(pod) {
            source.upsert_pod(pod.clone());
        }
    }
    for (ns, name) in old.pods.keys() {
        if !new.pods.contains_key(&(ns.clone(), name.clone())) {
            source.delete_pod(ns, name);
        }
    }
}

/// Re-reads `dir` until the process ends; only changes are published.
fn watch_dir(dir: PathBuf, node: String, source: LocalPodSource, mut last: Snapshot) {
    let mut last_texts = read_dir_texts(&dir).ok();
    loop {
        std::thread::sleep(POLL_INTERVAL);
        let texts = match read_dir_texts(&dir) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "pods directory unreadable; keeping the last state");
                continue;
            }
        };
        if last_texts.as_ref() == Some(&texts) {
            continue;
        }
        last_texts = Some(texts.clone());
        match snapshot(&texts, &node) {
            Ok(snap) => {
                publish(&source, &last, &snap);
                last = snap;
            }
            Err(e) => tracing::warn!(error = %e, "bad pods manifest; keeping the last state"),
        }
    }
}

/// The annotation sink of a manifest-fed agent: the in-memory source plus one file per pod.
#[derive(Debug, Clone)]
pub struct ManifestPodSource {
    inner: LocalPodSource,
    status_dir: Option<PathBuf>,
}

impl ManifestPodSource {
    fn record(&self, namespace: &str, name: &str, value: Option<&str>) -> std::io::Result<()> {
        let Some(dir) = &self.status_dir else {
            return Ok(());
        };
        let path = dir.join(format!("{namespace}_{name}"));
        match value {
            Some(v) => {
                let tmp = dir.join(format!(".{namespace}_{name}.tmp"));
                std::fs::write(&tmp, v)?;
                std::fs::rename(&tmp, &path)
            }
            None => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
        }
    }
}

impl PodSource for ManifestPodSource {
    fn watch(&self) -> mpsc::UnboundedReceiver<PodEvent> {
        self.inner.watch()
    }

    fn annotate(
        &self,
        namespace: &str,
        name: &str,
        value: Option<&str>,
    ) -> impl Future<Output = Result<(), SourceError>> + Send {
        let this = self.clone();
        let (namespace, name, value) = (
            namespace.to_owned(),
            name.to_owned(),
            value.map(str::to_owned),
        );
        async move {
            this.inner
                .annotate(&namespace, &name, value.as_deref())
                .await?;
            if let Err(e) = this.record(&namespace, &name, value.as_deref()) {
                // The in-memory copy is what the agent acts on; the file is for observers.
                tracing::warn!(pod = %name, error = %e, "writing the pod status file");
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const NS: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}\n";

    fn pod(name: &str, node: &str, labels: &str) -> String {
        format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: demo, labels: {{{labels}}}}}\nspec: {{nodeName: {node}, containers: [{{name: c, command: [sleep]}}]}}\n"
        )
    }

    /// Events a change of the directory produces, as (kind, pod or namespace name).
    fn events(before: &str, after: &str) -> Vec<(String, String)> {
        let src = LocalPodSource::new();
        let snap = |t: &str| snapshot(&[(PathBuf::from("p.yaml"), t.to_owned())], "n1").unwrap();
        let old = snap(before);
        publish(&src, &Snapshot::default(), &old);
        let mut rx = src.watch();
        while let Ok(ev) = rx.try_recv() {
            if ev == PodEvent::Synced {
                break;
            }
        }
        publish(&src, &old, &snap(after));
        let mut out = Vec::new();
        while let Ok(ev) = rx.try_recv() {
            out.push(match ev {
                PodEvent::Pod(p) => ("pod".into(), p.name),
                PodEvent::PodDeleted(p) => ("deleted".into(), p.name),
                PodEvent::Namespace(n) => ("namespace".into(), n.name),
                other => (format!("{other:?}"), String::new()),
            });
        }
        out
    }

    #[test]
    fn directory_changes_become_informer_events() {
        let a = pod("a", "n1", "app: a");
        let b = pod("b", "n1", "app: b");
        let other_node = pod("c", "n2", "app: c");
        let relabelled = pod("a", "n1", "app: a, istio.io/dataplane-mode: none");
        let ns_none = NS.replace("ambient", "none");
        let pair = |x: &str, y: &str| (x.to_string(), y.to_string());
        type Case<'a> = (&'a str, String, String, Vec<(String, String)>);
        let cases: Vec<Case> = vec![
            ("unchanged", format!("{NS}{a}"), format!("{NS}{a}"), vec![]),
            (
                "new pod",
                format!("{NS}{a}"),
                format!("{NS}{a}{b}"),
                vec![pair("pod", "b")],
            ),
            (
                "other node ignored",
                format!("{NS}{a}"),
                format!("{NS}{a}{other_node}"),
                vec![],
            ),
            (
                "label change",
                format!("{NS}{a}"),
                format!("{NS}{relabelled}"),
                vec![pair("pod", "a")],
            ),
            (
                "pod removed",
                format!("{NS}{a}{b}"),
                format!("{NS}{a}"),
                vec![pair("deleted", "b")],
            ),
            (
                "namespace label",
                format!("{NS}{a}"),
                format!("{ns_none}{a}"),
                vec![pair("namespace", "demo")],
            ),
        ];
        for (name, before, after, want) in cases {
            assert_eq!(events(&before, &after), want, "{name}");
        }
    }

    #[test]
    fn bad_input_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-dir");
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let cases: Vec<(&str, PodSourceError, String)> = vec![
            (
                "bad manifest",
                snapshot(&[(PathBuf::from("p.yaml"), "kind: [".into())], "n1").unwrap_err(),
                "p.yaml".into(),
            ),
            (
                "missing pods directory",
                start(&missing, "n1", None).unwrap_err(),
                missing.display().to_string(),
            ),
            (
                "status directory under a file",
                start(dir.path(), "n1", Some(file.join("status"))).unwrap_err(),
                file.join("status").display().to_string(),
            ),
        ];
        for (case, err, names) in cases {
            let text = err.to_string();
            assert!(
                text.contains(&names),
                "{case}: {text:?} does not name {names}"
            );
        }
    }

    #[tokio::test]
    async fn annotations_are_mirrored_to_status_files() {
        let dir = tempfile::tempdir().unwrap();
        let inner = LocalPodSource::new();
        let first = snapshot(
            &[(
                PathBuf::from("p.yaml"),
                format!("{NS}{}", pod("a", "n1", "")),
            )],
            "n1",
        )
        .unwrap();
        publish(&inner, &Snapshot::default(), &first);
        let src = ManifestPodSource {
            inner,
            status_dir: Some(dir.path().to_owned()),
        };
        let file = dir.path().join("demo_a");
        src.annotate("demo", "a", Some("enabled")).await.unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "enabled");
        src.annotate("demo", "a", None).await.unwrap();
        assert!(!file.exists());
        assert!(src.annotate("demo", "gone", Some("enabled")).await.is_err());
        assert!(!dir.path().join("demo_gone").exists());
    }
}
