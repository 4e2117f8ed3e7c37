//! Applying delta xDS responses to the proxy state.
//!
//! The handler remembers, per type, which resources it holds (name → version and the state
//! key the name maps to): removals arrive by name only, and a reconnect declares these
//! versions in `initial_resource_versions` so the server resends only what changed.
//!
//! Invalid resources: every resource of a response is converted; the valid ones are applied
//! and the invalid ones are skipped — the state keeps the last good version of each of them
//! and the handler keeps declaring that old version — and the whole response is NACKed with
//! an `error_detail` naming every refused resource and field. Applying the valid part (rather
//! than nothing) matches the delta protocol: the server counts a sent version as delivered
//! and never resends it, so refusing a whole response would leave its valid resources stale
//! until they happen to change again.

use std::collections::HashMap;
use std::sync::Arc;

use ambit_model::ConversionError;
use ambit_model::{AddressResource, Authorization, NamespacedHostname, PolicyKey, WorkloadUid};
use ambit_proto::discovery::{DeltaDiscoveryResponse, Resource};
use ambit_proto::prost::Message;
use ambit_proto::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL, security, workload};

use crate::state::ProxyState;

/// Why one resource (or a whole response) was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApplyError {
    #[error("unsupported type {0}")]
    UnknownType(String),
    #[error("resource {name:?}: no payload")]
    MissingPayload { name: String },
    #[error("resource {name:?}: payload type {got} does not match the response type")]
    WrongType { name: String, got: String },
    #[error("resource {name:?}: undecodable: {source}")]
    Decode {
        name: String,
        #[source]
        source: ambit_proto::prost::DecodeError,
    },
    #[error("resource {name:?}: {source}")]
    Convert {
        name: String,
        #[source]
        source: Box<ConversionError>,
    },
}

/// Where a resource name lives in the state.
#[derive(Debug, Clone, PartialEq, Eq)]
enum StateKey {
    Workload(WorkloadUid),
    Service(NamespacedHostname),
    Policy(PolicyKey),
}

#[derive(Debug, Clone)]
struct Held {
    version: String,
    key: StateKey,
}

/// A converted resource, ready to go into the state.
enum Converted {
    Address(AddressResource),
    Policy(Authorization),
}

impl Converted {
    fn key(&self) -> StateKey {
        match self {
            Converted::Address(AddressResource::Workload(w)) => StateKey::Workload(w.uid.clone()),
            Converted::Address(AddressResource::Service(s)) => StateKey::Service(s.key.clone()),
            Converted::Policy(p) => StateKey::Policy(p.key.clone()),
        }
    }
}

/// Applies responses to a [`ProxyState`]; lives as long as the client (across reconnects).
#[derive(Debug)]
pub struct Handler {
    state: Arc<ProxyState>,
    /// type URL → name → what is held.
    held: HashMap<String, HashMap<String, Held>>,
}

impl Handler {
    pub fn new(state: Arc<ProxyState>) -> Self {
        Self {
            state,
            held: HashMap::new(),
        }
    }

    /// Name → version of everything held of `type_url` (for `initial_resource_versions`).
    pub fn versions(&self, type_url: &str) -> HashMap<String, String> {
        self.held
            .get(type_url)
            .map(|h| {
                h.iter()
                    .map(|(n, held)| (n.clone(), held.version.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Applies removals, then every valid resource. Returns the refused resources (empty:
    /// ACK; otherwise NACK) — see the module docs for why valid ones are applied anyway.
    pub fn apply(&mut self, resp: &DeltaDiscoveryResponse) -> Vec<ApplyError> {
        if resp.type_url != ADDRESS_TYPE_URL && resp.type_url != AUTHORIZATION_TYPE_URL {
            return vec![ApplyError::UnknownType(resp.type_url.clone())];
        }
        let held = self.held.entry(resp.type_url.clone()).or_default();
        for name in &resp.removed_resources {
            match held.remove(name) {
                Some(h) => remove_key(&self.state, &h.key),
                // Nothing held under that name (e.g. an on-demand "does not exist" answer).
                None => {
                    tracing::debug!(type_url = %resp.type_url, %name, "xDS removal of an unknown resource")
                }
            }
        }
        let mut errors = Vec::new();
        for resource in &resp.resources {
            let converted = match convert(&resp.type_url, resource) {
                Ok(c) => c,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let key = converted.key();
            if let Some(old) = held.get(&resource.name)
                && old.key != key
            {
                // The name now denotes something else: drop what it used to be.
                remove_key(&self.state, &old.key);
            }
            match converted {
                Converted::Address(AddressResource::Workload(w)) => self.state.upsert_workload(*w),
                Converted::Address(AddressResource::Service(s)) => self.state.upsert_service(*s),
                Converted::Policy(p) => self.state.upsert_policy(p),
            }
            held.insert(
                resource.name.clone(),
                Held {
                    version: resource.version.clone(),
                    key,
                },
            );
        }
        errors
    }
}

fn remove_key(state: &ProxyState, key: &StateKey) {
    match key {
        StateKey::Workload(uid) => {
            state.remove_workload(uid.as_str());
        }
        StateKey::Service(key) => {
            state.remove_service(key);
        }
        StateKey::Policy(key) => {
            state.remove_policy(key);
        }
    }
}

fn convert(type_url: &str, resource: &Resource) -> Result<Converted, ApplyError> {
    let name = || resource.name.clone();
    let any = resource
        .resource
        .as_ref()
        .ok_or_else(|| ApplyError::MissingPayload { name: name() })?;
    if any.type_url != type_url {
        return Err(ApplyError::WrongType {
            name: name(),
            got: any.type_url.clone(),
        });
    }
    let decode_err = |source| ApplyError::Decode {
        name: name(),
        source,
    };
    let convert_err = |source| ApplyError::Convert {
        name: name(),
        source: Box::new(source),
    };
    if type_url == ADDRESS_TYPE_URL {
        let address = workload::Address::decode(any.value.as_slice()).map_err(decode_err)?;
        AddressResource::try_from(address)
            .map(Converted::Address)
            .map_err(convert_err)
    } else {
        let policy = security::Authorization::decode(any.value.as_slice()).map_err(decode_err)?;
        Authorization::try_from(policy)
            .map(Converted::Policy)
            .map_err(convert_err)
    }
}
