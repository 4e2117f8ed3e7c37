//! [`HnsEndpoints`] over the real HCN calls (`ambit_netns::hcn`, Windows only).

use ambit_netns::guid::Guid;
use ambit_netns::hcn::{self, HcnError};

use super::{EndpointError, HnsEndpoints};

/// The host's HNS.
#[derive(Debug, Clone, Copy, Default)]
pub struct HcnEndpoints;

fn convert(call: &'static str, endpoint: Guid, e: HcnError) -> EndpointError {
    if e.is_not_found() {
        EndpointError::Gone(endpoint)
    } else {
        EndpointError::Failed {
            call,
            endpoint,
            message: e.to_string(),
        }
    }
}

impl HnsEndpoints for HcnEndpoints {
    fn properties(&self, endpoint: Guid) -> Result<String, EndpointError> {
        hcn::endpoint_properties(endpoint).map_err(|e| convert("query", endpoint, e))
    }

    fn modify(&self, endpoint: Guid, settings: &str) -> Result<(), EndpointError> {
        hcn::modify_endpoint(endpoint, settings).map_err(|e| convert("modify", endpoint, e))
    }
}
