//! Kubernetes-shaped objects the control plane reads: Namespace, Pod, Service,
//! PeerAuthentication, AuthorizationPolicy, WorkloadEntry and WorkloadGroup, and the
//! multi-document YAML loader for them.
//!
//! The types cover only the subset of each object that translation uses. They are tolerant of
//! every field they do not name (real manifests carry many) and strict on the fields they do:
//! a wrong type, an out-of-range port or a bad IP is an error naming the file, the document
//! and (when the YAML parser knows it) the line.
//!
//! Normalisation done by the loader, so later stages never re-check:
//! - `metadata.name` is present and a DNS-1123 name; `metadata.namespace` defaults to
//!   `default` for namespaced kinds and is empty for `Namespace`;
//! - `metadata.uid`, when absent, is a stable UUID-shaped hash of `kind/namespace/name`
//!   ([`meta::stable_uid`]), so a file-defined object keeps its uid across reloads;
//! - `Pod.spec.serviceAccountName` defaults to the deprecated `serviceAccount`, then `default`;
//!   a WorkloadEntry's `spec.serviceAccount` defaults to `default`;
//! - a Service's `clusterIP` and `clusterIPs` agree.

mod load;
pub mod meta;
pub mod pod;
pub mod security;
pub mod service;
pub mod workload_entry;

use std::collections::BTreeMap;
use std::fmt;

pub use load::load_documents;
pub use meta::{Namespace, ObjectMeta, Timestamp};
pub use pod::Pod;
pub use security::{AuthorizationPolicy, PeerAuthentication};
pub use service::Service;
pub use workload_entry::{WorkloadEntry, WorkloadGroup};

/// The kinds of object the control plane understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Namespace,
    Pod,
    Service,
    PeerAuthentication,
    AuthorizationPolicy,
    WorkloadEntry,
    WorkloadGroup,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::Namespace,
        Kind::Pod,
        Kind::Service,
        Kind::PeerAuthentication,
        Kind::AuthorizationPolicy,
        Kind::WorkloadEntry,
        Kind::WorkloadGroup,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Namespace => "Namespace",
            Kind::Pod => "Pod",
            Kind::Service => "Service",
            Kind::PeerAuthentication => "PeerAuthentication",
            Kind::AuthorizationPolicy => "AuthorizationPolicy",
            Kind::WorkloadEntry => "WorkloadEntry",
            Kind::WorkloadGroup => "WorkloadGroup",
        }
    }

    /// The `apiVersion`s accepted for this kind.
    pub fn api_versions(self) -> &'static [&'static str] {
        match self {
            Kind::Namespace | Kind::Pod | Kind::Service => &["v1"],
            Kind::PeerAuthentication | Kind::AuthorizationPolicy => {
                &["security.istio.io/v1", "security.istio.io/v1beta1"]
            }
            Kind::WorkloadEntry | Kind::WorkloadGroup => &[
                "networking.istio.io/v1",
                "networking.istio.io/v1beta1",
                "networking.istio.io/v1alpha3",
            ],
        }
    }

    /// Whether objects of this kind live in a namespace.
    pub fn is_namespaced(self) -> bool {
        self != Kind::Namespace
    }

    /// The kind named by an `apiVersion`/`kind` pair, if we support that pair.
    pub fn from_type(api_version: &str, kind: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str() == kind && k.api_versions().contains(&api_version))
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where an object was defined: a file (or any named text) and the 1-based index of the YAML
/// document in it (documents are separated by `---`; empty documents count).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Origin {
    pub file: String,
    pub document: usize,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: document {}", self.file, self.document)
    }
}

/// What identifies an object within a set: two objects with the same key are duplicates.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub kind: Kind,
    /// Empty for cluster-scoped kinds.
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// Why a set of documents could not be loaded. Every variant names the file and document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// The text is not YAML, or a field is unknown (security kinds) or has the wrong type or
    /// value. `object` names the document's object (`Kind namespace/name`) when its kind and
    /// name could be read; `message` is the YAML library's, with the key path.
    #[error(
        "{origin}{}{}: {message}",
        object.as_ref().map(|o| format!(" ({o})")).unwrap_or_default(),
        line.map(|l| format!(" (line {l})")).unwrap_or_default()
    )]
    Yaml {
        origin: Origin,
        object: Option<String>,
        line: Option<usize>,
        message: String,
    },
    #[error("{origin}: a document must be a mapping (an object), found {found}")]
    NotAMapping { origin: Origin, found: &'static str },
    #[error("{origin}: missing or empty {field}")]
    Missing { origin: Origin, field: &'static str },
    #[error(
        "{origin}: unsupported kind {kind:?} (apiVersion {api_version:?}); supported: \
         v1 Namespace, Pod, Service; security.istio.io/v1 or v1beta1 PeerAuthentication, \
         AuthorizationPolicy; networking.istio.io/v1, v1beta1 or v1alpha3 WorkloadEntry, \
         WorkloadGroup"
    )]
    UnknownKind {
        origin: Origin,
        api_version: String,
        kind: String,
    },
    #[error("{origin}: {kind} {name:?}: {field}: {reason}")]
    Invalid {
        origin: Origin,
        kind: Kind,
        name: String,
        field: String,
        reason: String,
    },
    #[error("{second}: duplicate {key} (first defined at {first})")]
    Duplicate {
        key: ObjectKey,
        first: Origin,
        second: Origin,
    },
}

impl ObjectError {
    /// Where the offending document is.
    pub fn origin(&self) -> &Origin {
        match self {
            ObjectError::Yaml { origin, .. }
            | ObjectError::NotAMapping { origin, .. }
            | ObjectError::Missing { origin, .. }
            | ObjectError::UnknownKind { origin, .. }
            | ObjectError::Invalid { origin, .. } => origin,
            ObjectError::Duplicate { second, .. } => second,
        }
    }
}

/// One loaded object and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    pub origin: Origin,
    pub resource: Resource,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    Namespace(Namespace),
    Pod(Pod),
    Service(Service),
    PeerAuthentication(PeerAuthentication),
    AuthorizationPolicy(AuthorizationPolicy),
    WorkloadEntry(WorkloadEntry),
    WorkloadGroup(WorkloadGroup),
}

impl Resource {
    pub fn kind(&self) -> Kind {
        match self {
            Resource::Namespace(_) => Kind::Namespace,
            Resource::Pod(_) => Kind::Pod,
            Resource::Service(_) => Kind::Service,
            Resource::PeerAuthentication(_) => Kind::PeerAuthentication,
            Resource::AuthorizationPolicy(_) => Kind::AuthorizationPolicy,
            Resource::WorkloadEntry(_) => Kind::WorkloadEntry,
            Resource::WorkloadGroup(_) => Kind::WorkloadGroup,
        }
    }

    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Resource::Namespace(o) => &o.metadata,
            Resource::Pod(o) => &o.metadata,
            Resource::Service(o) => &o.metadata,
            Resource::PeerAuthentication(o) => &o.metadata,
            Resource::AuthorizationPolicy(o) => &o.metadata,
            Resource::WorkloadEntry(o) => &o.metadata,
            Resource::WorkloadGroup(o) => &o.metadata,
        }
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Resource::Namespace(o) => &mut o.metadata,
            Resource::Pod(o) => &mut o.metadata,
            Resource::Service(o) => &mut o.metadata,
            Resource::PeerAuthentication(o) => &mut o.metadata,
            Resource::AuthorizationPolicy(o) => &mut o.metadata,
            Resource::WorkloadEntry(o) => &mut o.metadata,
            Resource::WorkloadGroup(o) => &mut o.metadata,
        }
    }

    pub fn key(&self) -> ObjectKey {
        let meta = self.metadata();
        ObjectKey {
            kind: self.kind(),
            namespace: meta.namespace.clone(),
            name: meta.name.clone(),
        }
    }
}

impl Object {
    pub fn kind(&self) -> Kind {
        self.resource.kind()
    }

    pub fn key(&self) -> ObjectKey {
        self.resource.key()
    }
}

/// A set of objects with unique `(kind, namespace, name)`, split by kind for translation.
/// Objects keep the order they were inserted in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectSet {
    pub namespaces: Vec<Namespace>,
    pub pods: Vec<Pod>,
    pub services: Vec<Service>,
    pub peer_authentications: Vec<PeerAuthentication>,
    pub authorization_policies: Vec<AuthorizationPolicy>,
    pub workload_entries: Vec<WorkloadEntry>,
    pub workload_groups: Vec<WorkloadGroup>,
    origins: BTreeMap<ObjectKey, Origin>,
}

impl ObjectSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a set, failing on the first duplicate.
    pub fn from_objects(objects: impl IntoIterator<Item = Object>) -> Result<Self, ObjectError> {
        let mut set = Self::new();
        for object in objects {
            set.insert(object)?;
        }
        Ok(set)
    }

    /// Adds an object; a second object with the same kind, namespace and name is an error
    /// naming both places.
    pub fn insert(&mut self, object: Object) -> Result<(), ObjectError> {
        let key = object.key();
        if let Some(first) = self.origins.get(&key) {
            return Err(ObjectError::Duplicate {
                key,
                first: first.clone(),
                second: object.origin,
            });
        }
        self.origins.insert(key, object.origin);
        match object.resource {
            Resource::Namespace(o) => self.namespaces.push(o),
            Resource::Pod(o) => self.pods.push(o),
            Resource::Service(o) => self.services.push(o),
            Resource::PeerAuthentication(o) => self.peer_authentications.push(o),
            Resource::AuthorizationPolicy(o) => self.authorization_policies.push(o),
            Resource::WorkloadEntry(o) => self.workload_entries.push(o),
            Resource::WorkloadGroup(o) => self.workload_groups.push(o),
        }
        Ok(())
    }

    /// Where the object with this key was defined.
    pub fn origin(&self, key: &ObjectKey) -> Option<&Origin> {
        self.origins.get(key)
    }

    pub fn len(&self) -> usize {
        self.origins.len()
    }

    pub fn is_empty(&self) -> bool {
        self.origins.is_empty()
    }
}
