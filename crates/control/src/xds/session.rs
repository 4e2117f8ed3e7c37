//! One ADS stream's protocol state, free of I/O: what each type is subscribed to, which
//! version of each resource the client holds, and which response awaits its (N)ACK.
//!
//! The stream loop feeds requests in ([`Session::handle_request`]) and asks for the next
//! response to send ([`Session::next_response`]) whenever a request or a new snapshot
//! arrived. A type with a response in flight sends nothing more until that response is
//! answered; changes meanwhile only mark the type dirty, so the next response carries the
//! latest state in one message instead of a backlog.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ambit_proto::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource};

use super::snapshot::Snapshot;

/// Subscribing to (or unsubscribing from) this name toggles the wildcard.
const WILDCARD: &str = "*";

/// A request the server refuses; ends the stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("request without type_url")]
    MissingTypeUrl,
}

impl From<SessionError> for tonic::Status {
    fn from(e: SessionError) -> Self {
        tonic::Status::invalid_argument(e.to_string())
    }
}

/// How a request answered the response in flight, for logs and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// No nonce: a subscription request.
    None,
    Ack,
    Nack(String),
    /// A nonce that is not the one in flight (an answer to an older response): ignored.
    Stale,
}

#[derive(Debug, Default)]
struct TypeState {
    wildcard: bool,
    names: BTreeSet<String>,
    /// Name → version the client holds, as far as the server knows: what it was sent (ACKed,
    /// in flight, or NACKed — a rejected version is not resent) or declared on reconnect.
    known: HashMap<String, String>,
    /// Explicitly subscribed names not answered yet: answered even when absent (as removed),
    /// so an on-demand client learns that the name does not exist.
    unanswered: BTreeSet<String>,
    in_flight: Option<String>,
    first_sent: bool,
    /// Something may have changed since the last diff.
    dirty: bool,
}

impl TypeState {
    fn subscribed(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }
}

/// Protocol state of one stream.
#[derive(Debug, Default)]
pub struct Session {
    types: BTreeMap<String, TypeState>,
    node_id: Option<String>,
}

impl Session {
    pub fn new() -> Self {
        Self::default()
    }

    /// The node id the client sent (first request that had one).
    pub fn node_id(&self) -> Option<&str> {
        self.node_id.as_deref()
    }

    /// Applies one client request: its (N)ACK and its subscription changes.
    pub fn handle_request(&mut self, req: DeltaDiscoveryRequest) -> Result<Answer, SessionError> {
        if req.type_url.is_empty() {
            return Err(SessionError::MissingTypeUrl);
        }
        if self.node_id.is_none() {
            self.node_id = req.node.as_ref().map(|n| n.id.clone());
        }
        let is_new = !self.types.contains_key(&req.type_url);
        let ts = self.types.entry(req.type_url.clone()).or_default();

        let answer = if req.response_nonce.is_empty() {
            Answer::None
        } else if ts.in_flight.as_deref() == Some(req.response_nonce.as_str()) {
            ts.in_flight = None;
            match &req.error_detail {
                // The versions stay recorded as known: resending what the client just refused
                // would only be refused again. A new version is sent when the resource changes.
                Some(status) => Answer::Nack(status.message.clone()),
                None => Answer::Ack,
            }
        } else {
            Answer::Stale
        };

        if is_new {
            // Legacy wildcard: a first request naming nothing subscribes to everything.
            ts.wildcard = req.resource_names_subscribe.is_empty();
            ts.known = req.initial_resource_versions;
            ts.dirty = true;
        }
        for name in req.resource_names_subscribe {
            ts.dirty = true;
            if name == WILDCARD {
                ts.wildcard = true;
            } else if ts.names.insert(name.clone()) {
                ts.unanswered.insert(name);
            }
        }
        for name in req.resource_names_unsubscribe {
            ts.dirty = true;
            if name == WILDCARD {
                ts.wildcard = false;
            } else {
                ts.names.remove(&name);
                ts.unanswered.remove(&name);
            }
        }
        // Delta semantics: the client drops what it no longer subscribes to by itself, so
        // the server forgets it too (and sends it again on a later subscription).
        let TypeState {
            known,
            wildcard,
            names,
            ..
        } = ts;
        known.retain(|n, _| *wildcard || names.contains(n));
        Ok(answer)
    }

    /// Whether `type_url` has a response waiting for its (N)ACK.
    pub fn in_flight(&self, type_url: &str) -> Option<&str> {
        self.types.get(type_url)?.in_flight.as_deref()
    }

    /// The next response to send, if any type has something new (or still owes its first
    /// response) and is not waiting for an answer. `nonce` makes a fresh, unique nonce.
    pub fn next_response(
        &mut self,
        snapshot: &Snapshot,
        nonce: &mut dyn FnMut() -> String,
    ) -> Option<DeltaDiscoveryResponse> {
        for (type_url, ts) in &mut self.types {
            if !ts.dirty || ts.in_flight.is_some() {
                continue;
            }
            ts.dirty = false;
            let current = snapshot.resources(type_url);
            let mut resources = Vec::new();
            let mut removed = Vec::new();
            if let Some(current) = current {
                for (name, res) in current {
                    if ts.subscribed(name) && ts.known.get(name) != Some(&res.version) {
                        resources.push(Resource {
                            name: name.clone(),
                            version: res.version.clone(),
                            resource: Some(res.resource.clone()),
                            ..Default::default()
                        });
                    }
                }
            }
            let exists = |name: &str| current.is_some_and(|c| c.contains_key(name));
            for name in ts.known.keys() {
                if !exists(name) {
                    removed.push(name.clone());
                }
            }
            for name in std::mem::take(&mut ts.unanswered) {
                if !exists(&name) && !ts.known.contains_key(&name) {
                    removed.push(name);
                }
            }
            if resources.is_empty() && removed.is_empty() && ts.first_sent {
                continue;
            }
            removed.sort();
            for r in &resources {
                ts.known.insert(r.name.clone(), r.version.clone());
            }
            for name in &removed {
                ts.known.remove(name);
            }
            let nonce = nonce();
            ts.first_sent = true;
            ts.in_flight = Some(nonce.clone());
            return Some(DeltaDiscoveryResponse {
                system_version_info: snapshot.version().to_string(),
                resources,
                type_url: type_url.clone(),
                nonce,
                removed_resources: removed,
                control_plane: None,
            });
        }
        None
    }

    /// A new snapshot arrived: every type may have changes.
    pub fn snapshot_changed(&mut self) {
        for ts in self.types.values_mut() {
            ts.dirty = true;
        }
    }
}
