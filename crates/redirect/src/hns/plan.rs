//! Applying, verifying and removing the policies on every endpoint of a pod, one endpoint
//! at a time, through [`HnsEndpoints`].

use ambit_netns::guid::Guid;
use serde::Deserialize;
use serde_json::Value;

use super::policy::{
    L4WfpProxySettings, POLICY_TYPE, WfpPolicyConfig, add_request, policies, remove_request,
};

/// Why a call on one endpoint failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// The endpoint does not exist (any more).
    #[error("endpoint {0} not found")]
    Gone(Guid),
    /// HNS refused or failed the call.
    #[error("{call} on endpoint {endpoint}: {message}")]
    Failed {
        /// What we asked.
        call: &'static str,
        /// The endpoint.
        endpoint: Guid,
        /// HNS's answer.
        message: String,
    },
    /// The endpoint's properties are not the JSON HNS documents.
    #[error("endpoint {endpoint} properties: {message}")]
    Unreadable {
        /// The endpoint.
        endpoint: Guid,
        /// The parser's complaint.
        message: String,
    },
}

/// The two HCN operations on endpoints the plan needs.
pub trait HnsEndpoints {
    /// The endpoint's properties JSON (`HcnQueryEndpointProperties`).
    fn properties(&self, endpoint: Guid) -> Result<String, EndpointError>;
    /// `HcnModifyEndpoint` with `settings`.
    fn modify(&self, endpoint: Guid, settings: &str) -> Result<(), EndpointError>;
}

/// What happened on one endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointOutcome {
    /// The desired policies were already there; nothing was sent.
    Unchanged,
    /// The policies were added.
    Added,
    /// Other `L4WFPPROXY` settings were removed and the desired ones added.
    Replaced,
    /// Policies were removed (removal only).
    Removed,
    /// The endpoint is gone; nothing to do there.
    Vanished,
}

/// Why a pod's policies are not (all) in place; each endpoint's result is in the error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    /// HNS lists no endpoint for the namespace (upstream: "missing endpointIDs").
    #[error("the namespace has no HNS endpoints")]
    NoEndpoints,
    /// Every endpoint vanished.
    #[error("every HNS endpoint of the namespace vanished")]
    AllVanished,
    /// Some endpoints failed; the others are as reported.
    #[error("{}", .failed.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Endpoints {
        /// The failures.
        failed: Vec<EndpointError>,
        /// What happened on the endpoints that did not fail.
        done: Vec<(Guid, EndpointOutcome)>,
    },
}

#[derive(Deserialize)]
struct RawEndpoint {
    #[serde(rename = "Policies", default)]
    policies: Option<Vec<Value>>,
}

/// The endpoint's `L4WFPPROXY` policies, exactly as HNS returned them.
pub fn parse_endpoint_policies(json: &str) -> Result<Vec<Value>, String> {
    let raw: RawEndpoint = serde_json::from_str(json).map_err(|e| e.to_string())?;
    Ok(raw
        .policies
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.get("Type").and_then(Value::as_str) == Some(POLICY_TYPE))
        .collect())
}

/// Whether `existing` are exactly the desired settings (in any order). Settings HNS added
/// fields to still compare by the fields we know; settings we cannot read are different.
fn is_desired(existing: &[Value], desired: &[L4WfpProxySettings]) -> bool {
    let mut have: Vec<L4WfpProxySettings> = Vec::with_capacity(existing.len());
    for p in existing {
        match p
            .get("Settings")
            .map(|s| L4WfpProxySettings::deserialize(s.clone()))
        {
            Some(Ok(s)) => have.push(s),
            _ => return false,
        }
    }
    if have.len() != desired.len() {
        return false;
    }
    desired.iter().all(|d| {
        let want = desired.iter().filter(|x| *x == d).count();
        have.iter().filter(|x| *x == d).count() == want
    })
}

fn existing(eps: &dyn HnsEndpoints, endpoint: Guid) -> Result<Vec<Value>, EndpointError> {
    let json = eps.properties(endpoint)?;
    parse_endpoint_policies(&json)
        .map_err(|message| EndpointError::Unreadable { endpoint, message })
}

fn apply_one(
    eps: &dyn HnsEndpoints,
    endpoint: Guid,
    cfg: &WfpPolicyConfig,
    desired: &[L4WfpProxySettings],
) -> Result<EndpointOutcome, EndpointError> {
    let have = existing(eps, endpoint)?;
    if is_desired(&have, desired) {
        return Ok(EndpointOutcome::Unchanged);
    }
    let replaced = !have.is_empty();
    if replaced {
        eps.modify(endpoint, &remove_request(&have))?;
    }
    eps.modify(endpoint, &add_request(cfg))?;
    Ok(if replaced {
        EndpointOutcome::Replaced
    } else {
        EndpointOutcome::Added
    })
}

fn remove_one(eps: &dyn HnsEndpoints, endpoint: Guid) -> Result<EndpointOutcome, EndpointError> {
    let have = existing(eps, endpoint)?;
    if have.is_empty() {
        return Ok(EndpointOutcome::Unchanged);
    }
    eps.modify(endpoint, &remove_request(&have))?;
    Ok(EndpointOutcome::Removed)
}

/// Runs `op` on every endpoint; a vanished endpoint is an outcome, not a failure.
fn each(
    endpoints: &[Guid],
    mut op: impl FnMut(Guid) -> Result<EndpointOutcome, EndpointError>,
    all_vanished_is_error: bool,
) -> Result<Vec<(Guid, EndpointOutcome)>, PodError> {
    if endpoints.is_empty() {
        return Err(PodError::NoEndpoints);
    }
    let mut done = Vec::new();
    let mut failed = Vec::new();
    for &ep in endpoints {
        match op(ep) {
            Ok(o) => done.push((ep, o)),
            Err(EndpointError::Gone(_)) => done.push((ep, EndpointOutcome::Vanished)),
            Err(e) => failed.push(e),
        }
    }
    if !failed.is_empty() {
        return Err(PodError::Endpoints { failed, done });
    }
    if all_vanished_is_error && done.iter().all(|(_, o)| *o == EndpointOutcome::Vanished) {
        return Err(PodError::AllVanished);
    }
    Ok(done)
}

/// Puts both policies on every endpoint, idempotently (see the module docs).
pub fn apply_pod(
    eps: &dyn HnsEndpoints,
    endpoints: &[Guid],
    cfg: &WfpPolicyConfig,
) -> Result<Vec<(Guid, EndpointOutcome)>, PodError> {
    let desired = policies(cfg);
    each(endpoints, |ep| apply_one(eps, ep, cfg, &desired), true)
}

/// Removes every `L4WFPPROXY` policy from every endpoint (vanished endpoints are fine).
pub fn remove_pod(
    eps: &dyn HnsEndpoints,
    endpoints: &[Guid],
) -> Result<Vec<(Guid, EndpointOutcome)>, PodError> {
    if endpoints.is_empty() {
        return Ok(Vec::new());
    }
    each(endpoints, |ep| remove_one(eps, ep), false)
}

/// Which endpoints do not carry exactly the desired policies (vanished ones are not listed:
/// no traffic passes them).
pub fn verify_pod(
    eps: &dyn HnsEndpoints,
    endpoints: &[Guid],
    cfg: &WfpPolicyConfig,
) -> Result<Vec<Guid>, EndpointError> {
    let desired = policies(cfg);
    let mut missing = Vec::new();
    for &ep in endpoints {
        match existing(eps, ep) {
            Ok(have) if is_desired(&have, &desired) => {}
            Ok(_) => missing.push(ep),
            Err(EndpointError::Gone(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(missing)
}
