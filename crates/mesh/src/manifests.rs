//! The user's manifest directory: loading and checking every document before anything is
//! created, the plan derived from it (nodes, pods, what each pod runs, which pods are
//! ambient), and the generated manifests the control plane and the agents read.
//!
//! The user's documents are kept as YAML values, so the generated copy is their text plus
//! what a cluster would add: `status.podIP` (the topology's address) and, once the CNI ADD
//! of an ambient pod succeeded, the `ambient.istio.io/redirection: enabled` annotation the
//! agent writes in Kubernetes (that annotation is what makes the control plane advertise the
//! pod as HBONE).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use ambit_agent::enrol::{Enablement, default_selectors};
use ambit_control::objects::{self, Kind, ObjectError, ObjectKey, ObjectSet, Origin};
use serde::Deserialize;
use serde_norway::{Mapping, Value};

/// The annotation the agent sets on enrolled pods.
pub const REDIRECTION_ANNOTATION: &str = "ambient.istio.io/redirection";

/// Why a manifest directory is refused. Every variant about a document names its file and
/// document number.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{dir}: no manifests (*.yaml or *.yml files)")]
    Empty { dir: PathBuf },
    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error("{origin}: Pod {pod}: spec.nodeName is missing (every pod names its node)")]
    MissingNode { origin: Origin, pod: String },
    #[error("{origin}: Pod {pod}: invalid node name {node:?}: {reason}")]
    BadNode {
        origin: Origin,
        pod: String,
        node: String,
        reason: &'static str,
    },
    #[error(
        "{origin}: Pod {pod}: the first container has no command or args (images are not \
         run; the command runs from the host's filesystem)"
    )]
    NoCommand { origin: Origin, pod: String },
    #[error("{origin}: Pod {pod}: hostNetwork pods are not supported by the embedded mesh")]
    HostNetwork { origin: Origin, pod: String },
    #[error(
        "{origin}: Pod {pod}: namespace {namespace:?} is not defined (add a Namespace document)"
    )]
    UnknownNamespace {
        origin: Origin,
        pod: String,
        namespace: String,
    },
    #[error(
        "{origin}: Pod {pod}: name too long for a network namespace (namespace + name ≤ 62 characters)"
    )]
    NameTooLong { origin: Origin, pod: String },
    #[error("no pods: the embedded mesh needs at least one Pod (with spec.nodeName)")]
    NoPods,
}

/// One pod to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPlan {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node: String,
    /// Name in the topology (`name.namespace`): unique across namespaces.
    pub topology_name: String,
    /// The first container's `command` followed by its `args`.
    pub argv: Vec<String>,
    /// The first container's literal `env`.
    pub env: Vec<(String, String)>,
    /// Whether the default enablement selectors select the pod (it will be captured).
    pub ambient: bool,
    pub origin: Origin,
}

impl PodPlan {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// One manifest file: its name and raw documents.
#[derive(Debug, Clone)]
struct SourceFile {
    name: String,
    documents: Vec<Value>,
}

/// A checked manifest directory.
#[derive(Debug, Clone)]
pub struct Manifests {
    files: Vec<SourceFile>,
    set: ObjectSet,
    pods: Vec<PodPlan>,
}

/// Per pod, what the generated manifests add.
#[derive(Debug, Clone, Default)]
pub struct PodStatus {
    pub ip: Option<Ipv4Addr>,
    pub enrolled: bool,
    /// The pod's netns path, written as the `ambit.io/netns` annotation so a restarted agent
    /// finds the pod even though no process of a pause container holds the namespace.
    pub netns: Option<String>,
}

/// ambit's annotation naming a pod's network namespace for manifest-fed agents.
pub const NETNS_ANNOTATION: &str = "ambit.io/netns";

impl Manifests {
    /// Reads every `*.yaml`/`*.yml` file of `dir` (sorted by name) and checks it.
    pub fn load_dir(dir: &Path) -> Result<Self, ManifestError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ManifestError::Io { path, source }
        };
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io(dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            .collect();
        paths.sort();
        if paths.is_empty() {
            return Err(ManifestError::Empty {
                dir: dir.to_path_buf(),
            });
        }
        let mut texts = Vec::new();
        for path in paths {
            let text = std::fs::read_to_string(&path).map_err(io(&path))?;
            texts.push((path.display().to_string(), text));
        }
        Self::from_texts(&texts)
    }

    /// Checks `(file name, text)` pairs: the loader's checks (YAML, kinds, fields, duplicates
    /// across files), then what the embedded mesh needs of pods.
    pub fn from_texts(texts: &[(String, String)]) -> Result<Self, ManifestError> {
        let mut set = ObjectSet::new();
        let mut files = Vec::new();
        for (name, text) in texts {
            for object in objects::load_documents(name, text)? {
                set.insert(object)?;
            }
            // Already parsed successfully above, so this cannot fail; stay total anyway.
            let mut documents = Vec::new();
            for (i, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
                let value = Value::deserialize(doc).map_err(|e| ObjectError::Yaml {
                    origin: Origin {
                        file: name.clone(),
                        document: i + 1,
                    },
                    line: e.location().map(|l| l.line()),
                    message: e.to_string(),
                })?;
                documents.push(value);
            }
            files.push(SourceFile {
                name: name.clone(),
                documents,
            });
        }
        let pods = plan_pods(&set)?;
        Ok(Self { files, set, pods })
    }

    /// The pods, in manifest order.
    pub fn pods(&self) -> &[PodPlan] {
        &self.pods
    }

    /// The loaded objects.
    pub fn objects(&self) -> &ObjectSet {
        &self.set
    }

    /// Node names, sorted (node `i` in this order gets the `i`-th addresses).
    pub fn nodes(&self) -> Vec<String> {
        let set: BTreeSet<&String> = self.pods.iter().map(|p| &p.node).collect();
        set.into_iter().cloned().collect()
    }

    /// Every document with the pods' generated fields, as one multi-document YAML text.
    /// `only_node`: keep just Namespaces and the Pods of that node (what an agent reads).
    pub fn render(&self, status: &BTreeMap<String, PodStatus>, only_node: Option<&str>) -> String {
        let mut out = String::new();
        for file in &self.files {
            for doc in &file.documents {
                let mut doc = doc.clone();
                let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
                let is_pod = kind == "Pod";
                if let Some(node) = only_node {
                    let keep = match kind {
                        "Namespace" => true,
                        "Pod" => {
                            doc.get("spec")
                                .and_then(|s| s.get("nodeName"))
                                .and_then(Value::as_str)
                                == Some(node)
                        }
                        _ => false,
                    };
                    if !keep {
                        continue;
                    }
                }
                if doc.is_null() {
                    continue;
                }
                if is_pod {
                    let key = doc_pod_key(&doc);
                    if let Some(st) = status.get(&key) {
                        patch_pod(&mut doc, st);
                    }
                }
                match serde_norway::to_string(&doc) {
                    Ok(text) => {
                        out.push_str("---\n");
                        out.push_str(&text);
                    }
                    // A value that was parsed from YAML always serialises; skip rather than panic.
                    Err(e) => {
                        tracing::warn!(file = %file.name, error = %e, "cannot re-serialise a document")
                    }
                }
            }
        }
        out
    }
}

/// `namespace/name` of a Pod document (namespace defaults to `default`, as the loader does).
fn doc_pod_key(doc: &Value) -> String {
    let meta = doc.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let ns = meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or("default");
    format!("{ns}/{name}")
}

/// The mapping under `key`, created (or replacing a non-mapping) if needed.
fn child_mapping<'a>(parent: &'a mut Mapping, key: &str) -> &'a mut Mapping {
    let k = Value::String(key.to_owned());
    if !parent.get(&k).is_some_and(Value::is_mapping) {
        parent.insert(k.clone(), Value::Mapping(Mapping::new()));
    }
    match parent.get_mut(&k) {
        Some(Value::Mapping(m)) => m,
        // Inserted just above.
        _ => unreachable!("mapping inserted above"),
    }
}

fn patch_pod(doc: &mut Value, st: &PodStatus) {
    let Value::Mapping(root) = doc else { return };
    if let Some(ip) = st.ip {
        let status = child_mapping(root, "status");
        status.insert("podIP".into(), Value::String(ip.to_string()));
        let mut entry = Mapping::new();
        entry.insert("ip".into(), Value::String(ip.to_string()));
        status.insert(
            "podIPs".into(),
            Value::Sequence(vec![Value::Mapping(entry)]),
        );
        status.insert("phase".into(), Value::String("Running".into()));
    }
    let annotations = child_mapping(child_mapping(root, "metadata"), "annotations");
    if let Some(netns) = &st.netns {
        annotations.insert(NETNS_ANNOTATION.into(), Value::String(netns.clone()));
    }
    if st.enrolled {
        annotations.insert(
            REDIRECTION_ANNOTATION.into(),
            Value::String("enabled".into()),
        );
    } else {
        annotations.remove(REDIRECTION_ANNOTATION);
    }
}

/// Node names become namespace file names; keep them to DNS-label characters.
fn check_node_name(node: &str) -> Result<(), &'static str> {
    if node.is_empty() || node.len() > 40 {
        return Err("must be 1 to 40 characters");
    }
    if !node
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        || node.starts_with('.')
    {
        return Err("only ASCII letters, digits, '-', '.' and '_' are allowed");
    }
    Ok(())
}

fn plan_pods(set: &ObjectSet) -> Result<Vec<PodPlan>, ManifestError> {
    let enablement = Enablement {
        selectors: default_selectors(),
        exclude_namespaces: Vec::new(),
        system_namespace: "istio-system".into(),
    };
    let namespaces: BTreeMap<&str, &BTreeMap<String, String>> = set
        .namespaces
        .iter()
        .map(|n| (n.metadata.name.as_str(), &n.metadata.labels))
        .collect();
    let empty = BTreeMap::new();
    let mut node_names = BTreeSet::new();
    let mut out = Vec::new();
    for pod in &set.pods {
        let key = ObjectKey {
            kind: Kind::Pod,
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
        };
        let origin = set.origin(&key).cloned().unwrap_or_else(|| Origin {
            file: "?".into(),
            document: 0,
        });
        let name = format!("{}/{}", pod.metadata.namespace, pod.metadata.name);
        let node = pod.spec.node_name.clone();
        if node.is_empty() {
            return Err(ManifestError::MissingNode { origin, pod: name });
        }
        if let Err(reason) = check_node_name(&node) {
            return Err(ManifestError::BadNode {
                origin,
                pod: name,
                node,
                reason,
            });
        }
        if pod.spec.host_network {
            return Err(ManifestError::HostNetwork { origin, pod: name });
        }
        let ns = pod.metadata.namespace.as_str();
        let ns_labels = match namespaces.get(ns) {
            Some(l) => *l,
            None if ns == "default" => &empty,
            None => {
                return Err(ManifestError::UnknownNamespace {
                    origin,
                    pod: name,
                    namespace: ns.to_owned(),
                });
            }
        };
        let container = pod.spec.containers.first();
        let argv: Vec<String> = container
            .map(|c| c.command.iter().chain(&c.args).cloned().collect())
            .unwrap_or_default();
        if argv.is_empty() {
            return Err(ManifestError::NoCommand { origin, pod: name });
        }
        let topology_name = format!("{}.{}", pod.metadata.name, ns);
        if topology_name.len() > 63 {
            return Err(ManifestError::NameTooLong { origin, pod: name });
        }
        let agent_pod = ambit_agent::pods::Pod {
            name: pod.metadata.name.clone(),
            namespace: ns.to_owned(),
            labels: pod.metadata.labels.clone(),
            annotations: pod.metadata.annotations.clone(),
            host_network: pod.spec.host_network,
            ..Default::default()
        };
        node_names.insert(node.clone());
        out.push(PodPlan {
            namespace: ns.to_owned(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            node,
            topology_name,
            argv,
            env: container
                .map(|c| {
                    c.env
                        .iter()
                        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
                        .collect()
                })
                .unwrap_or_default(),
            ambient: enablement.should_enrol(&agent_pod, ns_labels),
            origin,
        });
    }
    if out.is_empty() {
        return Err(ManifestError::NoPods);
    }
    // Node and pod names share the topology's name space; pod names contain a '.', so a
    // clash needs a node named like `pod.namespace`, which we refuse here.
    for p in &out {
        if node_names.contains(&p.topology_name) {
            return Err(ManifestError::BadNode {
                origin: p.origin.clone(),
                pod: p.key(),
                node: p.topology_name.clone(),
                reason: "a node has the same name as a pod's network namespace",
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: demo\n  labels: {istio.io/dataplane-mode: ambient}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: client, namespace: demo}\nspec:\n  nodeName: node1\n  containers: [{name: c, image: x, command: [sleep], args: [infinity], env: [{name: A, value: b}]}]\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: plain}\nspec:\n  nodeName: node2\n  containers: [{name: c, image: x, command: [sleep, infinity]}]\n";

    fn load(texts: &[(&str, &str)]) -> Result<Manifests, ManifestError> {
        let texts: Vec<(String, String)> = texts
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        Manifests::from_texts(&texts)
    }

    #[test]
    fn plans_pods_and_nodes() {
        let m = load(&[("a.yaml", GOOD)]).expect("valid");
        assert_eq!(m.nodes(), vec!["node1", "node2"]);
        let client = &m.pods()[0];
        assert_eq!(client.argv, vec!["sleep", "infinity"]);
        assert_eq!(client.env, vec![("A".to_string(), "b".to_string())]);
        assert!(client.ambient);
        assert_eq!(client.topology_name, "client.demo");
        assert!(!m.pods()[1].ambient, "default namespace has no label");
    }

    #[test]
    fn refuses_bad_manifests_naming_file_and_document() {
        let pod = |extra: &str| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n{extra}  containers: [{{name: c, command: [sleep]}}]\n"
            )
        };
        let cases: Vec<(&str, String, &str)> = vec![
            (
                "unknown kind",
                format!("{GOOD}---\napiVersion: v1\nkind: Secret\nmetadata: {{name: s}}\n"),
                "document 4",
            ),
            (
                "missing node",
                format!("{GOOD}---\n{}", pod("")),
                "spec.nodeName",
            ),
            (
                "malformed",
                format!("{GOOD}---\nkind: [unclosed\n"),
                "document 4",
            ),
            (
                "duplicate",
                format!(
                    "{GOOD}---\n{}",
                    pod("  nodeName: n\n").replace("name: p", "name: plain")
                ),
                "duplicate",
            ),
            (
                "unknown namespace",
                format!(
                    "{GOOD}---\n{}",
                    pod("  nodeName: n\n").replace("{name: p}", "{name: p, namespace: nope}")
                ),
                "nope",
            ),
            (
                "no command",
                format!(
                    "{GOOD}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: q}}\nspec:\n  nodeName: n\n  containers: [{{name: c}}]\n"
                ),
                "no command",
            ),
        ];
        for (name, text, needle) in cases {
            let err = load(&[("dir/bad.yaml", &text)])
                .expect_err(name)
                .to_string();
            assert!(err.contains("dir/bad.yaml"), "{name}: {err}");
            assert!(err.contains("document"), "{name}: {err}");
            assert!(err.contains(needle), "{name}: {err}");
        }
    }

    #[test]
    fn duplicate_across_files_names_both() {
        let err = load(&[("a.yaml", GOOD), ("b.yaml", GOOD)])
            .expect_err("duplicate")
            .to_string();
        assert!(err.contains("a.yaml") && err.contains("b.yaml"), "{err}");
    }

    #[test]
    fn render_adds_ip_and_annotation() {
        let m = load(&[("a.yaml", GOOD)]).expect("valid");
        let mut st = BTreeMap::new();
        st.insert(
            "demo/client".to_string(),
            PodStatus {
                ip: Some(Ipv4Addr::new(198, 19, 1, 2)),
                enrolled: true,
                netns: None,
            },
        );
        let all = m.render(&st, None);
        let again = Manifests::from_texts(&[("gen.yaml".into(), all)]).expect("reloads");
        let client = &again.objects().pods[0];
        assert_eq!(client.ips(), vec![std::net::IpAddr::from([198, 19, 1, 2])]);
        assert_eq!(
            client
                .metadata
                .annotations
                .get(REDIRECTION_ANNOTATION)
                .map(String::as_str),
            Some("enabled")
        );
        let node2 = m.render(&st, Some("node2"));
        assert!(
            node2.contains("plain") && !node2.contains("client"),
            "{node2}"
        );
    }
}
