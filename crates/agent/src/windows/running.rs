//! Capturing the pods that already run on a Windows node (`spec/windows.md` §1.3 snapshot
//! path, then §1.4 Add): the runtime names each wanted pod's sandbox and HNS namespace
//! ([`super::sandboxes`]), HNS gives the namespace's compartment and endpoints, and both
//! `L4WFPPROXY` policies go on every endpoint (`ambit_redirect::hns`, idempotent per
//! endpoint). What comes out is, per pod, the [`PodNamespace`] ZDS names to ztunnel, or why the
//! pod is not captured, so the caller can retry it or mark it as upstream does (a failed
//! lookup or policy is a retryable error, §1.4).
//!
//! An enrolled pod is re-checked by [`verify_namespace`]: HNS is asked again for the
//! namespace's endpoints and each endpoint's policies are compared with the plan; only an
//! endpoint whose policies differ is written to (the same per-endpoint plan as a capture).
//!
//! Platform-neutral: HNS is reached through [`NamespaceLookup`] and
//! [`HnsEndpoints`], which the Windows build implements with the HCN calls
//! (`super::enrol`) and the tests here with fakes.

use std::collections::{BTreeMap, BTreeSet};

use ambit_netns::guid::Guid;
use ambit_netns::hns::HnsNamespace;
use ambit_redirect::hns::{
    self as policy, EndpointOutcome, HnsEndpoints, PodError, WfpPolicyConfig,
};

use super::HnsPodNamespace as PodNamespace;
use super::sandboxes::{CriClient, CriError, Lookup, Skipped};

/// Reads an HNS namespace (`HcnOpenNamespace` + `HcnQueryNamespaceProperties` on Windows).
pub trait NamespaceLookup {
    /// Why a namespace could not be read.
    type Error: std::error::Error + Send + Sync + 'static;
    /// The namespace's compartment and endpoints.
    fn namespace(&self, guid: Guid) -> Result<HnsNamespace, Self::Error>;
    /// Whether `e` says the namespace does not exist (any more), as opposed to HNS not
    /// answering.
    fn is_gone(&self, e: &Self::Error) -> bool;
}

/// Why one running pod is not captured; names the pod and what failed.
#[derive(Debug, thiserror::Error)]
pub enum RunningError<E: std::error::Error + 'static> {
    /// No sandbox of the pod names an HNS namespace.
    #[error("pod {uid}: no sandbox names an HNS namespace{}", skipped_text(.skipped))]
    NoSandbox {
        /// The pod UID.
        uid: String,
        /// The pod's sandboxes that were asked, with why each was skipped.
        skipped: Vec<String>,
    },
    /// HNS could not read the namespace.
    #[error("pod {uid}: HNS namespace {guid} of sandbox {sandbox}: {source}")]
    Namespace {
        /// The pod UID.
        uid: String,
        /// The sandbox that named the namespace.
        sandbox: String,
        /// The namespace.
        guid: Guid,
        /// HNS's answer.
        source: E,
    },
    /// The policies are not on every endpoint.
    #[error("pod {uid}: L4WFPPROXY policies of namespace {guid}: {source}")]
    Policies {
        /// The pod UID.
        uid: String,
        /// The namespace.
        guid: Guid,
        /// Per-endpoint failures.
        source: PodError,
    },
}

fn skipped_text(skipped: &[String]) -> String {
    if skipped.is_empty() {
        " (the runtime lists none)".to_owned()
    } else {
        format!(" ({})", skipped.join("; "))
    }
}

/// A captured pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// The sandbox the namespace came from.
    pub sandbox: String,
    /// What ZDS names to ztunnel.
    pub namespace: PodNamespace,
    /// What happened on each endpoint.
    pub endpoints: Vec<(Guid, EndpointOutcome)>,
}

/// Per pod UID of `wanted`: captured, or why not.
pub type Outcomes<E> = BTreeMap<String, Result<Captured, RunningError<E>>>;

/// Puts the policies on every endpoint of `ns` and returns what ZDS should name (the
/// namespace's compartment, or none yet: ztunnel then waits for it).
pub fn capture(
    eps: &dyn HnsEndpoints,
    ns: &HnsNamespace,
    cfg: &WfpPolicyConfig,
) -> Result<(PodNamespace, Vec<(Guid, EndpointOutcome)>), PodError> {
    let done = policy::apply_pod(eps, &ns.endpoints, cfg)?;
    let pod = PodNamespace {
        guid: ns.id,
        compartment: ns
            .compartment
            .unwrap_or(ambit_contract::windows::NO_COMPARTMENT),
    };
    Ok((pod, done))
}

/// Finds and captures every pod of `wanted` (pod UIDs) that runs. Fails only when the runtime
/// cannot be asked at all; each pod's own failure is in its outcome.
pub async fn capture_running<L: NamespaceLookup>(
    cri: &mut CriClient,
    hns: &L,
    eps: &dyn HnsEndpoints,
    cfg: &WfpPolicyConfig,
    wanted: &BTreeSet<String>,
) -> Result<Outcomes<L::Error>, CriError> {
    let lookup = cri.pod_namespaces(wanted).await?;
    Ok(capture_found(&lookup, hns, eps, cfg, wanted))
}

/// What `lookup` says of pod `uid`'s namespace, for a release (no HNS call, no policy):
/// `None` when the runtime runs no sandbox of it, an error when it lists one it could not
/// describe (asked again later).
pub fn located<E: std::error::Error + 'static>(
    lookup: &Lookup,
    uid: &str,
) -> Result<Option<PodNamespace>, RunningError<E>> {
    if let Some(found) = lookup.found.get(uid) {
        return Ok(Some(PodNamespace {
            guid: found.namespace,
            // Not read: a release needs the namespace only.
            compartment: ambit_contract::windows::NO_COMPARTMENT,
        }));
    }
    let skipped: Vec<String> = (lookup.skipped.iter())
        .filter(|s| s.uid == uid)
        .map(|s| format!("{}: {}", s.sandbox, s.reason))
        .collect();
    if skipped.is_empty() {
        Ok(None)
    } else {
        Err(RunningError::NoSandbox {
            uid: uid.to_owned(),
            skipped,
        })
    }
}

/// [`capture_running`] after the runtime answered: HNS and the policies for each pod of
/// `wanted` that `lookup` found (no await, so a caller's future holds no HNS reference).
pub fn capture_found<L: NamespaceLookup>(
    lookup: &Lookup,
    hns: &L,
    eps: &dyn HnsEndpoints,
    cfg: &WfpPolicyConfig,
    wanted: &BTreeSet<String>,
) -> Outcomes<L::Error> {
    let mut skipped: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for Skipped {
        uid,
        sandbox,
        reason,
    } in &lookup.skipped
    {
        skipped
            .entry(uid.as_str())
            .or_default()
            .push(format!("{sandbox}: {reason}"));
    }
    let mut outcomes = Outcomes::new();
    for uid in wanted {
        let outcome = match lookup.found.get(uid) {
            None => Err(RunningError::NoSandbox {
                uid: uid.clone(),
                skipped: skipped.remove(uid.as_str()).unwrap_or_default(),
            }),
            Some(found) => match hns.namespace(found.namespace) {
                Err(source) => Err(RunningError::Namespace {
                    uid: uid.clone(),
                    sandbox: found.sandbox.clone(),
                    guid: found.namespace,
                    source,
                }),
                Ok(ns) => capture(eps, &ns, cfg)
                    .map(|(namespace, endpoints)| Captured {
                        sandbox: found.sandbox.clone(),
                        namespace,
                        endpoints,
                    })
                    .map_err(|source| RunningError::Policies {
                        uid: uid.clone(),
                        guid: found.namespace,
                        source,
                    }),
            },
        };
        outcomes.insert(uid.clone(), outcome);
    }
    outcomes
}

/// Why an enrolled pod's namespace is not (all) as planned after its check.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError<E: std::error::Error + 'static> {
    /// HNS could not read the namespace (it still exists, or HNS would not say).
    #[error("HNS namespace {guid}: {source}")]
    Namespace {
        /// The namespace.
        guid: Guid,
        /// HNS's answer.
        source: E,
    },
    /// Some endpoint could not be read or repaired, or none is left.
    #[error("L4WFPPROXY policies of namespace {guid}: {source}")]
    Policies {
        /// The namespace.
        guid: Guid,
        /// Per-endpoint failures.
        source: PodError,
    },
}

/// What re-checking one enrolled pod's namespace found (and repaired).
#[derive(Debug)]
pub enum Check<E> {
    /// Every endpoint HNS lists carries exactly the planned policies now; per endpoint what
    /// was found and done ([`EndpointOutcome::Unchanged`]: nothing was written to it).
    Protected(Vec<(Guid, EndpointOutcome)>),
    /// Not every endpoint does: what was done on the endpoints that answered, and why not
    /// the rest.
    Unprotected {
        /// Per endpoint that answered, what was found and done.
        done: Vec<(Guid, EndpointOutcome)>,
        /// Why the pod is not protected.
        error: E,
    },
    /// HNS has no such namespace any more (the pod's sandbox went or was re-created).
    Gone,
}

impl<E> Check<E> {
    /// The same check with its error converted.
    pub fn map_err<F>(self, f: impl FnOnce(E) -> F) -> Check<F> {
        match self {
            Self::Protected(done) => Check::Protected(done),
            Self::Unprotected { done, error } => Check::Unprotected {
                done,
                error: f(error),
            },
            Self::Gone => Check::Gone,
        }
    }
}

/// Re-reads namespace `guid` and the policies of each of its endpoints, and repairs per
/// endpoint what differs from the plan: an endpoint without the policies (one that joined the
/// namespace, or lost them out of band) gets them added, one with other `L4WFPPROXY`
/// settings gets them replaced, one that vanished is left alone, and an endpoint that is as
/// planned is not written to. A namespace without endpoints is [`Check::Unprotected`], as
/// for a capture.
pub fn verify_namespace<L: NamespaceLookup>(
    hns: &L,
    eps: &dyn HnsEndpoints,
    guid: Guid,
    cfg: &WfpPolicyConfig,
) -> Check<VerifyError<L::Error>> {
    let ns = match hns.namespace(guid) {
        Ok(ns) => ns,
        Err(e) if hns.is_gone(&e) => return Check::Gone,
        Err(source) => {
            return Check::Unprotected {
                done: Vec::new(),
                error: VerifyError::Namespace { guid, source },
            };
        }
    };
    match policy::apply_pod(eps, &ns.endpoints, cfg) {
        Ok(done) => Check::Protected(done),
        Err(source) => {
            let done = match &source {
                PodError::Endpoints { done, .. } => done.clone(),
                PodError::NoEndpoints => Vec::new(),
                PodError::AllVanished => (ns.endpoints.iter())
                    .map(|&ep| (ep, EndpointOutcome::Vanished))
                    .collect(),
            };
            Check::Unprotected {
                done,
                error: VerifyError::Policies { guid, source },
            }
        }
    }
}
