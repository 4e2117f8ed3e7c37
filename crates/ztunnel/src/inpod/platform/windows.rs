//! Windows: the pod's HNS namespace; sockets from its network compartment, made on the
//! process's dedicated compartment thread, once HNS has a compartment for it.

use std::sync::Arc;
use std::time::Duration;

use ambit_contract::zds::{self as wire, RequestError, WindowsNamespace, WindowsNamespaceError};
use ambit_netns::compartment::CompartmentError;
use ambit_netns::guid::{Guid, GuidError};
use ambit_netns::hcn::HcnError;
use ambit_netns::zds::Attached;
use ambit_netns::{CompartmentSocketFactory, NetnsId, SocketFactory};

use super::super::compartment_wait::{ADD_BUDGET, Lookup, WaitError, wait_for_compartment};
use super::super::{Inputs, Request, ZdsError};

/// The pod's namespace as the agent named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNetns {
    /// The HNS namespace.
    pub guid: Guid,
    /// The compartment the agent saw (0: none yet); HNS is asked again before use.
    pub compartment: u32,
}

impl PodNetns {
    /// Identifies the namespace (two Adds naming the same GUID are the same pod sandbox).
    pub fn identity(&self) -> NetnsId {
        let v = self.guid.as_u128();
        NetnsId {
            ino: v as u64,
            dev: (v >> 64) as u64,
        }
    }

    /// A copy (infallible; the same shape as the Linux descriptor's).
    pub fn try_clone(&self) -> Result<Self, std::convert::Infallible> {
        Ok(self.clone())
    }
}

impl std::fmt::Display for PodNetns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HNS namespace {}", self.guid)
    }
}

/// Why `windows_namespace` was refused.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    /// Absent or empty (upstream panics).
    #[error(transparent)]
    Missing(#[from] WindowsNamespaceError),
    /// Not a GUID.
    #[error(transparent)]
    Guid(#[from] GuidError),
}

/// Why a pod's sockets cannot be made (the pod stays pending).
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// No compartment yet, or HNS could not be asked.
    #[error(transparent)]
    Wait(#[from] WaitError<HcnError>),
    /// The compartment thread could not be started.
    #[error(transparent)]
    Compartment(#[from] CompartmentError),
}

/// Decodes one request message received over the pipe (nothing rides along there).
pub fn decode_request(data: &[u8], fd: Option<Attached>) -> Result<Request, ZdsError> {
    if let Some(never) = fd {
        match never {}
    }
    let req = wire::decode_request_windows(data).map_err(|e| match e {
        RequestError::Decode(e) => ZdsError::Decode(e),
        RequestError::NoPayload => ZdsError::NoPayload,
        RequestError::MissingFd { uid } => ZdsError::MissingFd { uid },
        RequestError::UnexpectedFd { message } => ZdsError::UnexpectedFd { message },
        RequestError::BadFd { uid, source } => ZdsError::BadNetns {
            uid,
            source: source.into(),
        },
        RequestError::MissingUid { message } => ZdsError::MissingUid { message },
        RequestError::MissingWorkloadInfo { uid } => ZdsError::MissingWorkloadInfo {
            uid: uid.into_string(),
        },
    })?;
    Ok(match req {
        wire::Request::Add { uid, info, netns } => {
            let WindowsNamespace { id, guid } = netns;
            let guid = guid.parse::<Guid>().map_err(|e| ZdsError::BadNetns {
                uid: uid.as_str().to_owned(),
                source: e.into(),
            })?;
            wire::Request::Add {
                uid,
                info,
                netns: PodNetns {
                    guid,
                    compartment: id,
                },
            }
        }
        wire::Request::Keep { uid } => wire::Request::Keep { uid },
        wire::Request::Del { uid } => wire::Request::Del { uid },
        wire::Request::SnapshotSent => wire::Request::SnapshotSent,
    })
}

/// The pod's socket factory in its compartment. HNS is asked for the compartment (the
/// agent's number may predate it) with a bounded backoff: [`ADD_BUDGET`] when handling an
/// `AddWorkload` (`wait` non-zero), one lookup on a pending retry.
pub(in crate::inpod) async fn socket_factory(
    _inputs: &Inputs,
    uid: &str,
    netns: &PodNetns,
    wait: Duration,
) -> Result<Arc<dyn SocketFactory>, SetupError> {
    let guid = netns.guid;
    let budget = if wait.is_zero() {
        Duration::ZERO
    } else {
        ADD_BUDGET
    };
    let lookup = || async move {
        let ns = tokio::task::spawn_blocking(move || ambit_netns::hcn::namespace(guid))
            .await
            .map_err(|e| HcnError::Unavailable(format!("HNS lookup task: {e}")))??;
        Ok::<_, HcnError>(match ns.compartment {
            Some(id) => Lookup::Ready(id),
            None => Lookup::NotYet,
        })
    };
    let compartment = wait_for_compartment(lookup, budget).await?;
    tracing::debug!(uid, %guid, compartment, "pod compartment found");
    let thread = CompartmentSocketFactory::system_thread()?;
    Ok(Arc::new(CompartmentSocketFactory::new(compartment, thread)))
}
