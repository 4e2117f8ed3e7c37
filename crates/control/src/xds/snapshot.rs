//! The resources the xDS server serves: per type URL, name → (version, encoded resource).
//!
//! A [`Snapshot`] is a complete, immutable picture; the server diffs each stream's view of
//! the client against it. Versions are content hashes of the encoded resource, so rebuilding
//! an unchanged resource (or restarting the server) yields the same version and nothing is
//! resent to a client that already has it.

use std::collections::BTreeMap;
use std::sync::Arc;

use ambit_model::{AddressResource, Authorization, Service, Workload};
use ambit_proto::prost::{Message, Name};
use ambit_proto::{security, workload};
use prost_types::Any;

/// One named resource as served: its version and its encoded payload.
#[derive(Debug, Clone, PartialEq)]
pub struct VersionedResource {
    pub version: String,
    pub resource: Any,
}

/// Name → resource for one type URL, ordered by name (responses are deterministic).
pub type Resources = BTreeMap<String, Arc<VersionedResource>>;

/// Every resource the server serves, by type URL.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Assigned by [`super::XdsServer::update`]; sent as `system_version_info`.
    version: u64,
    types: BTreeMap<String, Resources>,
}

impl Snapshot {
    /// An empty snapshot.
    pub fn new() -> Self {
        Self::default()
    }

    /// The snapshot of a translated mesh. Resource names follow §4.1: a workload's uid, a
    /// service's `namespace/hostname`, a policy's `namespace/name`. Workloads and services
    /// are both `istio.workload.Address` resources.
    pub fn from_model<'a>(
        workloads: impl IntoIterator<Item = &'a Workload>,
        services: impl IntoIterator<Item = &'a Service>,
        policies: impl IntoIterator<Item = &'a Authorization>,
    ) -> Self {
        let mut snapshot = Snapshot::new();
        for w in workloads {
            let address = workload::Address {
                r#type: Some(workload::address::Type::Workload(w.into())),
            };
            snapshot.insert_message(w.uid.as_str(), &address);
        }
        for s in services {
            let address = workload::Address {
                r#type: Some(workload::address::Type::Service(s.into())),
            };
            snapshot.insert_message(s.key.to_string(), &address);
        }
        for p in policies {
            snapshot.insert_message(p.key.to_string(), &security::Authorization::from(p));
        }
        snapshot
    }

    /// Adds (or replaces) a model address resource under its canonical name.
    pub fn insert_address(&mut self, address: &AddressResource) {
        let name = match address {
            AddressResource::Workload(w) => w.uid.to_string(),
            AddressResource::Service(s) => s.key.to_string(),
        };
        self.insert_message(name, &workload::Address::from(address));
    }

    /// Adds (or replaces) a message under `name`; its type URL comes from the message type.
    pub fn insert_message<M: Message + Name>(&mut self, name: impl Into<String>, message: &M) {
        let any = Any {
            type_url: M::type_url(),
            value: message.encode_to_vec(),
        };
        self.insert(name, any);
    }

    /// Adds (or replaces) an already encoded resource; the type URL is the `Any`'s.
    pub fn insert(&mut self, name: impl Into<String>, resource: Any) {
        let version = content_version(&resource);
        self.types
            .entry(resource.type_url.clone())
            .or_default()
            .insert(
                name.into(),
                Arc::new(VersionedResource { version, resource }),
            );
    }

    /// Removes a resource; whether it was there.
    pub fn remove(&mut self, type_url: &str, name: &str) -> bool {
        self.types
            .get_mut(type_url)
            .is_some_and(|r| r.remove(name).is_some())
    }

    /// The resources of one type (`None` for a type the snapshot does not hold).
    pub fn resources(&self, type_url: &str) -> Option<&Resources> {
        self.types.get(type_url)
    }

    /// One resource.
    pub fn get(&self, type_url: &str, name: &str) -> Option<&Arc<VersionedResource>> {
        self.types.get(type_url)?.get(name)
    }

    /// Number of resources of one type.
    pub fn len(&self, type_url: &str) -> usize {
        self.types.get(type_url).map_or(0, BTreeMap::len)
    }

    /// Whether the snapshot holds no resource at all.
    pub fn is_empty(&self) -> bool {
        self.types.values().all(BTreeMap::is_empty)
    }

    /// The server-assigned snapshot version (0 until served).
    pub fn version(&self) -> u64 {
        self.version
    }

    pub(super) fn set_version(&mut self, version: u64) {
        self.version = version;
    }
}

/// A stable content hash (FNV-1a, 64 bit) of the type URL and the encoded bytes, as 16 hex
/// digits. Stable across processes and Rust versions (unlike `DefaultHasher`), so a client
/// reconnecting to a restarted server is not sent what it already has.
fn content_version(any: &Any) -> String {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    let len = u64::try_from(any.value.len()).unwrap_or(u64::MAX);
    for b in any
        .type_url
        .as_bytes()
        .iter()
        .chain(&len.to_le_bytes())
        .chain(&any.value)
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(PRIME);
    }
    format!("{h:016x}")
}
