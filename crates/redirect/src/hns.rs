//! Redirection on Windows nodes as data (`spec/windows.md` §3): the two HNS endpoint
//! policies of type `L4WFPPROXY` every endpoint of an enrolled pod carries, the request
//! envelopes that add and remove them, and the per-endpoint plan that makes applying them
//! idempotent. Rendering and planning are pure and tested on Linux against the spec's JSON;
//! the calls go through [`HnsEndpoints`] (on Windows `HcnEndpoints`, over
//! `ambit_netns::hcn`).
//!
//! Where ambit differs from upstream (`spec/windows.md` §3.3), deliberately:
//! - an endpoint that already carries `L4WFPPROXY` policies is skipped only when their
//!   settings are exactly the desired ones; other settings are removed and replaced;
//! - every endpoint of the pod is handled (upstream stops at the first endpoint that already
//!   had a policy, leaving the others uncaptured);
//! - an endpoint that vanished is reported for that endpoint and the others still get their
//!   policies; the pod fails only if none is left or any other call failed;
//! - removing from an endpoint without `L4WFPPROXY` policies makes no HNS call.

#[cfg(windows)]
mod hcn;
mod plan;
mod policy;

#[cfg(windows)]
pub use hcn::HcnEndpoints;

pub use plan::{
    EndpointError, EndpointOutcome, HnsEndpoints, PodError, apply_pod, parse_endpoint_policies,
    remove_pod, verify_pod,
};
pub use policy::{
    Exceptions, FilterTuple, L4WfpProxySettings, POLICY_TYPE, WfpPolicyConfig, add_request,
    policies, remove_request,
};
