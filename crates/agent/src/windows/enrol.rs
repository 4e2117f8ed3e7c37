//! Capturing one pod on a Windows node (`spec/windows.md` §1.4, §3): its HNS namespace is
//! read (compartment and endpoints), both `L4WFPPROXY` policies go on every endpoint
//! (`ambit_redirect::hns`, idempotent per endpoint), and ZDS then names the namespace to
//! ztunnel. Unlike upstream the policy call is made from the host compartment only (no
//! compartment switch on removal either): HNS does not need one.

use ambit_netns::guid::Guid;
use ambit_netns::hcn::{self, HcnError};
use ambit_netns::hns::HnsNamespace;
use ambit_redirect::hns::{
    self as policy, EndpointOutcome, HcnEndpoints, PodError, WfpPolicyConfig,
};

use crate::platform::PodNamespace;

/// Why a pod could not be captured (or released); names the namespace.
#[derive(Debug, thiserror::Error)]
pub enum WindowsEnrolError {
    /// HNS has no such namespace or would not say.
    #[error("HNS namespace {guid}: {source}")]
    Namespace {
        /// The namespace.
        guid: Guid,
        /// HNS's answer.
        source: HcnError,
    },
    /// The policies are not on every endpoint.
    #[error("L4WFPPROXY policies of namespace {guid}: {source}")]
    Policies {
        /// The namespace.
        guid: Guid,
        /// Per-endpoint failures.
        source: PodError,
    },
}

/// Reads the namespace from HNS.
pub fn namespace(guid: Guid) -> Result<HnsNamespace, WindowsEnrolError> {
    hcn::namespace(guid).map_err(|source| WindowsEnrolError::Namespace { guid, source })
}

/// Puts the policies on every endpoint of `ns` and returns what ZDS should name.
pub fn capture(
    ns: &HnsNamespace,
    cfg: &WfpPolicyConfig,
) -> Result<(PodNamespace, Vec<(Guid, EndpointOutcome)>), WindowsEnrolError> {
    super::running::capture(&HcnEndpoints, ns, cfg).map_err(|source| WindowsEnrolError::Policies {
        guid: ns.id,
        source,
    })
}

/// HNS's namespaces through the HCN calls, for [`super::running::capture_running`].
#[derive(Debug, Clone, Copy, Default)]
pub struct HcnNamespaces;

impl super::running::NamespaceLookup for HcnNamespaces {
    type Error = HcnError;
    fn namespace(&self, guid: Guid) -> Result<HnsNamespace, HcnError> {
        hcn::namespace(guid)
    }
    fn is_gone(&self, e: &HcnError) -> bool {
        e.is_not_found()
    }
}

/// Takes every `L4WFPPROXY` policy off the namespace's endpoints.
pub fn release(ns: &HnsNamespace) -> Result<Vec<(Guid, EndpointOutcome)>, WindowsEnrolError> {
    policy::remove_pod(&HcnEndpoints, &ns.endpoints).map_err(|source| WindowsEnrolError::Policies {
        guid: ns.id,
        source,
    })
}
