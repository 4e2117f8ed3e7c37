//! `ambit cni-agent`: environment (upstream's names, every bad one reported) → the node agent,
//! with pods from a directory of manifests (the embedded mesh) or the Kubernetes API.
//!
//! A manifest-fed agent plays both sides of the API server: it re-reads the directory every
//! [`POLL_INTERVAL`] (pods that appear, change labels or disappear become the same events an
//! informer delivers; a broken edit is logged and the last good state stays), and with
//! `--pod-status DIR` it "patches" pods by writing each pod's redirection annotation to
//! `DIR/NAMESPACE_NAME` (removed when the annotation is removed), which the embedded mesh
//! reads back as the API server's copy.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use ambit_agent::pods::{
    LocalPodSource, Namespace, Pod, PodEvent, PodPhase, PodSource, SourceError,
};
use ambit_control::objects::ObjectSet;
use tokio::sync::mpsc;

/// ambit extension for manifest-fed agents: the pod's network namespace path, so a restarted
/// agent finds running pods whose namespaces hold no process (Kubernetes pods always have
/// one, found through /proc).
pub const NETNS_ANNOTATION: &str = "ambit.io/netns";

/// How often a manifest-fed agent re-reads its pods directory.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory of Pod and Namespace manifests for this node (watched). Without it the
    /// agent watches the Kubernetes API (in-cluster, or KUBECONFIG).
    #[arg(long, env = "AMBIT_PODS")]
    pods: Option<PathBuf>,
    /// With --pods: where the agent writes each pod's redirection annotation
    /// (file NAMESPACE_NAME holding the value; absent = no annotation).
    #[arg(long, env = "AMBIT_POD_STATUS", requires = "pods")]
    pod_status: Option<PathBuf>,
}

/// What one read of the pods directory found.
#[derive(Debug, Default, PartialEq)]
struct Snapshot {
    namespaces: BTreeMap<String, Namespace>,
    pods: BTreeMap<(String, String), Pod>,
}

fn read_dir_texts(dir: &Path) -> Result<Vec<(PathBuf, String)>, String> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    entries.sort();
    entries
        .into_iter()
        .map(|path| {
            std::fs::read_to_string(&path)
                .map(|t| (path.clone(), t))
                .map_err(|e| format!("{}: {e}", path.display()))
        })
        .collect()
}

fn snapshot(texts: &[(PathBuf, String)], node: &str) -> Result<Snapshot, String> {
    let mut set = ObjectSet::new();
    for (path, text) in texts {
        let name = path.display().to_string();
        for obj in ambit_control::objects::load_documents(&name, text).map_err(|e| e.to_string())? {
            set.insert(obj).map_err(|e| e.to_string())?;
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
struct FileBackedSource {
    inner: LocalPodSource,
    status_dir: Option<PathBuf>,
}

impl FileBackedSource {
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

impl PodSource for FileBackedSource {
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

pub fn main(args: Args) -> ExitCode {
    crate::init_logging();
    let env: Vec<(String, String)> = std::env::vars().collect();
    let cfg = match ambit_agent::AgentConfig::from_vars(&env) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("invalid agent configuration ({} problems):", errors.len());
            for e in errors {
                eprintln!("  - {e}");
            }
            return ExitCode::from(2);
        }
    };
    tracing::info!(config = ?cfg, "running CNI agent");
    let Some(dir) = &args.pods else {
        return run_kubernetes(cfg, &env);
    };
    let source = LocalPodSource::new();
    {
        let first = read_dir_texts(dir).and_then(|t| snapshot(&t, &cfg.node_name));
        let first = match first {
            Ok(s) => s,
            Err(e) => {
                eprintln!("pods: {e}");
                return ExitCode::from(2);
            }
        };
        if let Some(status) = &args.pod_status
            && let Err(e) = std::fs::create_dir_all(status)
        {
            eprintln!("pod status directory {}: {e}", status.display());
            return ExitCode::from(2);
        }
        publish(&source, &Snapshot::default(), &first);
        let (dir, node, src) = (dir.clone(), cfg.node_name.clone(), source.clone());
        std::thread::spawn(move || watch_dir(dir, node, src, first));
    }
    let source = FileBackedSource {
        inner: source,
        status_dir: args.pod_status.clone(),
    };
    let Some(rt) = runtime() else {
        return ExitCode::FAILURE;
    };
    exit(rt.block_on(ambit_agent::run_agent(cfg, source)))
}

/// Pods from the Kubernetes API (in-cluster or KUBECONFIG); the upgrade/uninstall decision
/// at shutdown asks about the agent's DaemonSet, as upstream.
fn run_kubernetes(cfg: ambit_agent::AgentConfig, env: &[(String, String)]) -> ExitCode {
    use ambit_agent::pods::kube_daemonset::{KubeDaemonSetLookup, daemonset_check};
    let source = match ambit_agent::pods::kube::from_environment(env, &cfg.node_name) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("Kubernetes pod source: {e} (or give --pods DIR)");
            return ExitCode::from(2);
        }
    };
    let owned = matches!(
        cfg.install.mode,
        ambit_agent::plugin::install::ConfMode::IstioOwned { .. }
    );
    let lookup = KubeDaemonSetLookup::new(
        source.client().clone(),
        cfg.pod_namespace.clone(),
        cfg.node_name.clone(),
    );
    let check = daemonset_check(lookup, cfg.disable_safe_upgrade, owned);
    let Some(rt) = runtime() else {
        return ExitCode::FAILURE;
    };
    exit(rt.block_on(ambit_agent::run_agent_with(cfg, source, check.as_ref())))
}

fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("runtime: {e}");
            None
        }
    }
}

fn exit(result: Result<(), ambit_agent::AgentError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent failed: {e}");
            ExitCode::FAILURE
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
    fn bad_manifest_is_an_error_naming_the_file() {
        let err = snapshot(&[(PathBuf::from("p.yaml"), "kind: [".into())], "n1").unwrap_err();
        assert!(err.contains("p.yaml"), "{err}");
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
        let src = FileBackedSource {
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
