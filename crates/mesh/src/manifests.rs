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

pub mod mesh_config;
pub mod vms;
pub use mesh_config::MeshConfigDoc;
pub use vms::VmPlan;

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
    #[error("{file}: no objects to apply or delete")]
    NothingToApply { file: String },
    #[error("{origin}: {object} not found")]
    NotFound { origin: Origin, object: String },
    #[error("{origin} (VirtualMachine): {message}")]
    BadVm { origin: Origin, message: String },
    #[error(
        "{origin}: a VirtualMachine cannot be applied to or deleted from a running mesh \
         (change the manifests and run `ambit up` again)"
    )]
    VmChange { origin: Origin },
    #[error("{origin} (MeshConfig): {source}")]
    BadMeshConfig {
        origin: Origin,
        #[source]
        source: ambit_control::mesh_config::MeshConfigError,
    },
    #[error("{second}: a second MeshConfig (the first is {first}); the mesh has one")]
    TwoMeshConfigs { first: Origin, second: Origin },
    #[error(
        "{origin}: the MeshConfig's trust domain {new:?} differs from the running mesh's \
         {running:?} (change the manifests and run `ambit up` again)"
    )]
    TrustDomainChange {
        origin: Origin,
        running: String,
        new: String,
    },
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

/// One non-empty document: where it came from (the directory at `up`, or the file of an
/// `apply`), its key and its raw value.
#[derive(Debug, Clone)]
struct Document {
    origin: Origin,
    key: ObjectKey,
    value: Value,
}

/// A checked manifest set: the directory given to `up`, changed by `apply` and `delete`.
#[derive(Debug, Clone)]
pub struct Manifests {
    docs: Vec<Document>,
    set: ObjectSet,
    pods: Vec<PodPlan>,
    vms: Vec<VmPlan>,
    mesh_config: Option<MeshConfigDoc>,
}

/// What an `apply` or `delete` changes, by object (`Kind namespace/name`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Change {
    pub created: Vec<String>,
    pub configured: Vec<String>,
    pub unchanged: Vec<String>,
    pub deleted: Vec<String>,
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
        let mut docs = Vec::new();
        let mut vms = Vec::new();
        let mut mesh: Option<MeshConfigDoc> = None;
        for (name, text) in texts {
            let (objects, side) = documents(name, text)?;
            docs.extend(objects);
            for (origin, value) in side {
                if mesh_config::is_mesh_config(&value) {
                    if let Some(first) = &mesh {
                        return Err(ManifestError::TwoMeshConfigs {
                            first: first.origin.clone(),
                            second: origin,
                        });
                    }
                    mesh = Some(mesh_config::parse(&origin, &value)?);
                } else {
                    vms.push(vms::parse(&origin, &value)?);
                }
            }
        }
        let mut m = Self::from_documents(docs, vms)?;
        m.mesh_config = mesh;
        if m.pods.is_empty() {
            return Err(ManifestError::NoPods);
        }
        Ok(m)
    }

    fn from_documents(docs: Vec<Document>, mut vms: Vec<VmPlan>) -> Result<Self, ManifestError> {
        let mut set = ObjectSet::new();
        for doc in &docs {
            let text = serde_norway::to_string(&doc.value).map_err(|e| ObjectError::Yaml {
                origin: doc.origin.clone(),
                object: None,
                line: None,
                message: e.to_string(),
            })?;
            for mut object in objects::load_documents(&doc.origin.file, &text)? {
                object.origin = doc.origin.clone();
                set.insert(object)?;
            }
        }
        let pods = plan_pods(&set)?;
        vms::plan(&set, &mut vms)?;
        Ok(Self {
            docs,
            set,
            pods,
            vms,
            mesh_config: None,
        })
    }

    /// `kubectl apply -f`: every object of `text` (named `file` in errors) replaces the object
    /// with the same kind, namespace and name, or is added. The result is checked as a whole;
    /// on error nothing changes (`self` is untouched either way).
    pub fn apply(&self, file: &str, text: &str) -> Result<(Self, Change), ManifestError> {
        let (applied, mesh) = objects_only(file, text)?;
        if applied.is_empty() && mesh.is_none() {
            return Err(ManifestError::NothingToApply {
                file: file.to_owned(),
            });
        }
        let mut docs = self.docs.clone();
        let mut change = Change::default();
        for doc in applied {
            let label = key_label(&doc.key);
            match docs.iter_mut().find(|d| d.key == doc.key) {
                Some(existing) if existing.value == doc.value => change.unchanged.push(label),
                Some(existing) => {
                    *existing = doc;
                    change.configured.push(label);
                }
                None => {
                    docs.push(doc);
                    change.created.push(label);
                }
            }
        }
        let mut next = Self::from_documents(docs, self.vms.clone())?;
        next.mesh_config = self.mesh_config.clone();
        if let Some(doc) = mesh {
            let running = MeshConfigDoc::trust_domain(self.mesh_config.as_ref()).to_owned();
            let new = MeshConfigDoc::trust_domain(Some(&doc)).to_owned();
            if running != new {
                return Err(ManifestError::TrustDomainChange {
                    origin: doc.origin,
                    running,
                    new,
                });
            }
            let label = mesh_config::KIND.to_owned();
            match &self.mesh_config {
                Some(old) if old.config == doc.config && old.text == doc.text => {
                    change.unchanged.push(label)
                }
                Some(_) => change.configured.push(label),
                None => change.created.push(label),
            }
            next.mesh_config = Some(doc);
        }
        Ok((next, change))
    }

    /// `kubectl delete -f`: removes every object `text` names (by kind, namespace and name;
    /// the rest of each document is ignored). An object that does not exist is an error
    /// naming its document; the result is checked as a whole; on error nothing changes.
    pub fn delete(&self, file: &str, text: &str) -> Result<(Self, Change), ManifestError> {
        let (named, mesh) = objects_only(file, text)?;
        if let Some(doc) = mesh {
            // The mesh config stays for the life of the mesh (apply another one to change it).
            return Err(ManifestError::NotFound {
                origin: doc.origin,
                object: "a deletable MeshConfig (apply a changed one instead)".into(),
            });
        }
        if named.is_empty() {
            return Err(ManifestError::NothingToApply {
                file: file.to_owned(),
            });
        }
        let mut docs = self.docs.clone();
        let mut change = Change::default();
        for doc in named {
            let Some(pos) = docs.iter().position(|d| d.key == doc.key) else {
                return Err(ManifestError::NotFound {
                    origin: doc.origin,
                    object: key_label(&doc.key),
                });
            };
            docs.remove(pos);
            change.deleted.push(key_label(&doc.key));
        }
        let mut next = Self::from_documents(docs, self.vms.clone())?;
        next.mesh_config = self.mesh_config.clone();
        Ok((next, change))
    }

    /// The pods, in manifest order.
    pub fn pods(&self) -> &[PodPlan] {
        &self.pods
    }

    /// The VMs (`kind: VirtualMachine`), in manifest order.
    pub fn vms(&self) -> &[VmPlan] {
        &self.vms
    }

    /// The `kind: MeshConfig` document, if any.
    pub fn mesh_config(&self) -> Option<&MeshConfigDoc> {
        self.mesh_config.as_ref()
    }

    /// The text of the WorkloadGroup `namespace/name` as the user wrote it (what `ambit vm
    /// configure` reads).
    pub fn workload_group_text(&self, namespace: &str, name: &str) -> Option<String> {
        self.docs
            .iter()
            .find(|d| {
                d.key.kind == Kind::WorkloadGroup
                    && d.key.namespace == namespace
                    && d.key.name == name
            })
            .and_then(|d| serde_norway::to_string(&d.value).ok())
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
        for d in &self.docs {
            let mut doc = d.value.clone();
            let kind = d.key.kind;
            if let Some(node) = only_node {
                let keep = match kind {
                    Kind::Namespace => true,
                    Kind::Pod => {
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
            if kind == Kind::Pod {
                let key = format!("{}/{}", d.key.namespace, d.key.name);
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
                    tracing::warn!(origin = %d.origin, error = %e, "cannot re-serialise a document")
                }
            }
        }
        out
    }
}

/// `Kind namespace/name` (or `Kind name` for cluster-scoped kinds).
fn key_label(key: &ObjectKey) -> String {
    if key.namespace.is_empty() {
        format!("{} {}", key.kind.as_str(), key.name)
    } else {
        format!("{} {}/{}", key.kind.as_str(), key.namespace, key.name)
    }
}

/// [`documents`] of a change (`apply`, `delete`) and its MeshConfig, if any: VMs are fixed
/// for the life of a mesh.
fn objects_only(
    file: &str,
    text: &str,
) -> Result<(Vec<Document>, Option<MeshConfigDoc>), ManifestError> {
    let (docs, side) = documents(file, text)?;
    let mut mesh: Option<MeshConfigDoc> = None;
    for (origin, value) in side {
        if !mesh_config::is_mesh_config(&value) {
            return Err(ManifestError::VmChange { origin });
        }
        if let Some(first) = &mesh {
            return Err(ManifestError::TwoMeshConfigs {
                first: first.origin.clone(),
                second: origin,
            });
        }
        mesh = Some(mesh_config::parse(&origin, &value)?);
    }
    Ok((docs, mesh))
}

/// The VirtualMachine and MeshConfig documents of `text` taken out: the text the object
/// loader reads (each such document an empty one, so the others keep their numbers) and the
/// documents taken out with their origins. A text that does not parse is returned unchanged for the loader to report.
fn split_vms(file: &str, text: &str) -> (Option<String>, Vec<(Origin, Value)>) {
    let mut values = Vec::new();
    for doc in serde_norway::Deserializer::from_str(text) {
        match Value::deserialize(doc) {
            Ok(v) => values.push(v),
            Err(_) => return (None, Vec::new()),
        }
    }
    let side = |v: &Value| vms::is_vm(v) || mesh_config::is_mesh_config(v);
    if !values.iter().any(side) {
        return (None, Vec::new());
    }
    let mut rest = String::new();
    let mut found = Vec::new();
    for (i, value) in values.into_iter().enumerate() {
        rest.push_str("---\n");
        if side(&value) {
            let origin = Origin {
                file: file.to_owned(),
                document: i + 1,
            };
            found.push((origin, value));
            rest.push_str("null\n");
        } else {
            match serde_norway::to_string(&value) {
                Ok(t) => rest.push_str(&t),
                // A parsed value always serialises; let the loader see the original.
                Err(_) => return (None, Vec::new()),
            }
        }
    }
    (Some(rest), found)
}

/// The non-empty documents of one file, each with its key, after the loader's checks (so
/// YAML errors, unknown kinds and duplicates inside the file name the file and document),
/// and its VirtualMachine and MeshConfig documents apart.
#[allow(clippy::type_complexity)]
fn documents(
    file: &str,
    text: &str,
) -> Result<(Vec<Document>, Vec<(Origin, Value)>), ManifestError> {
    let (rest, vms) = split_vms(file, text);
    let text = rest.as_deref().unwrap_or(text);
    let objects = objects::load_documents(file, text)?;
    let mut values = Vec::new();
    for (i, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
        let origin = Origin {
            file: file.to_owned(),
            document: i + 1,
        };
        // Already parsed successfully by the loader; stay total anyway.
        let value = Value::deserialize(doc).map_err(|e| ObjectError::Yaml {
            origin: origin.clone(),
            object: None,
            line: e.location().map(|l| l.line()),
            message: e.to_string(),
        })?;
        values.push((origin, value));
    }
    let docs = objects
        .into_iter()
        .filter_map(|o| {
            let (origin, value) = values.iter().find(|(origin, _)| *origin == o.origin)?;
            Some(Document {
                origin: origin.clone(),
                key: o.key(),
                value: value.clone(),
            })
        })
        .collect();
    Ok((docs, vms))
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

    /// `principal` for `principals`: refused by `ambit up` and `ambit apply` (issue 12).
    const TYPO_POLICY: &str = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n\
        metadata: {name: allow, namespace: demo}\nspec:\n  rules:\n  - from:\n    \
        - source: {principal: [cluster.local/ns/demo/sa/a]}\n";

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
            (
                "misspelt policy key (an ALLOW from anyone otherwise)",
                format!("{GOOD}---\n{TYPO_POLICY}"),
                "spec.rules[0].from[0].source: unknown field `principal`",
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
    fn apply_adds_replaces_and_refuses_as_a_whole() {
        let m = load(&[("a.yaml", GOOD)]).expect("valid");
        let new_pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: extra, namespace: demo}\nspec:\n  nodeName: node2\n  containers: [{name: c, command: [sleep]}]\n";
        let relabel = "apiVersion: v1\nkind: Namespace\nmetadata: {name: demo, labels: {istio.io/dataplane-mode: none}}\n";
        let (next, change) = m
            .apply("new.yaml", &format!("{new_pod}---\n{relabel}"))
            .expect("applies");
        assert_eq!(change.created, vec!["Pod demo/extra"]);
        assert_eq!(change.configured, vec!["Namespace demo"]);
        assert_eq!(next.pods().len(), 3);
        assert!(
            next.pods().iter().all(|p| !p.ambient),
            "namespace label none: nothing ambient"
        );
        assert_eq!(m.pods().len(), 2, "the original is untouched");
        let (_, again) = next.apply("new.yaml", new_pod).expect("idempotent");
        assert_eq!(again.unchanged, vec!["Pod demo/extra"]);

        // (case, text, what the error must mention)
        let cases = [
            ("malformed", "kind: [unclosed\n".to_string(), "bad.yaml"),
            (
                "unknown kind",
                "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n".into(),
                "document 1",
            ),
            (
                "unknown namespace",
                new_pod.replace("namespace: demo", "namespace: nope"),
                "nope",
            ),
            ("empty", "---\n".into(), "no objects"),
            (
                "misspelt policy key",
                TYPO_POLICY.into(),
                "bad.yaml: document 1 (AuthorizationPolicy demo/allow)",
            ),
        ];
        for (name, text, needle) in cases {
            let err = m.apply("bad.yaml", &text).expect_err(name).to_string();
            assert!(err.contains(needle), "{name}: {err}");
        }
    }

    #[test]
    fn delete_removes_named_objects_or_refuses() {
        let m = load(&[("a.yaml", GOOD)]).expect("valid");
        let client = "apiVersion: v1\nkind: Pod\nmetadata: {name: client, namespace: demo}\n";
        let (next, change) = m.delete("d.yaml", client).expect("deletes");
        assert_eq!(change.deleted, vec!["Pod demo/client"]);
        assert_eq!(next.pods().len(), 1);
        let err = next.delete("d.yaml", client).expect_err("gone").to_string();
        assert!(err.contains("d.yaml") && err.contains("not found"), "{err}");
        let ns = "apiVersion: v1\nkind: Namespace\nmetadata: {name: demo}\n";
        let err = m.delete("d.yaml", ns).expect_err("still used").to_string();
        assert!(err.contains("demo"), "{err}");
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
