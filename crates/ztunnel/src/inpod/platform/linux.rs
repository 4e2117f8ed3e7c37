//! Linux: the pod's netns descriptor; sockets through `NetnsSocketFactory`, marked.

use std::sync::Arc;
use std::time::Duration;

use ambit_contract::zds::{self as wire, RequestError};
use ambit_netns::zds::Attached;
use ambit_netns::{NetnsError, NetnsFd, NetnsSocketFactory, SocketFactory};

use super::super::{Inputs, Request, ZdsError};

/// The pod's namespace: the descriptor that came with `AddWorkload`.
pub type PodNetns = NetnsFd;
/// Why the descriptor of an `AddWorkload` was refused.
pub type NamespaceError = NetnsError;
/// Why a pod's sockets cannot be made.
pub type SetupError = NetnsError;

/// Decodes one `WorkloadRequest` and checks the descriptor rules: exactly one fd (a network
/// namespace) with `AddWorkload`, none with anything else. A descriptor that is not used is
/// closed when the error is dropped.
pub fn decode_request(data: &[u8], fd: Option<Attached>) -> Result<Request, ZdsError> {
    wire::decode_request(data, fd, NetnsFd::from_owned_fd).map_err(|e| match e {
        RequestError::Decode(e) => ZdsError::Decode(e),
        RequestError::NoPayload => ZdsError::NoPayload,
        RequestError::MissingFd { uid } => ZdsError::MissingFd { uid },
        RequestError::UnexpectedFd { message } => ZdsError::UnexpectedFd { message },
        RequestError::BadFd { uid, source } => ZdsError::BadNetns { uid, source },
        RequestError::MissingUid { message } => ZdsError::MissingUid { message },
        RequestError::MissingWorkloadInfo { uid } => ZdsError::MissingWorkloadInfo {
            uid: uid.into_string(),
        },
    })
}

/// The pod's socket factory: enters its netns around `socket(2)` and marks every socket.
pub(in crate::inpod) async fn socket_factory(
    inputs: &Inputs,
    uid: &str,
    netns: &PodNetns,
    _wait: Duration,
) -> Result<Arc<dyn SocketFactory>, SetupError> {
    let cfg = &inputs.cfg;
    // Hand-off without failures: when an old ztunnel closes its SO_REUSEPORT listeners, the
    // connections still queued on them move to the new ztunnel's listeners instead of being
    // reset (Linux ≥ 5.14, per network namespace). Best effort: older kernels only lose the
    // queued handshakes during a restart, as upstream does.
    if cfg.inpod_port_reuse {
        let migrated = ambit_netns::in_netns(netns, || {
            std::fs::write("/proc/sys/net/ipv4/tcp_migrate_req", "1")
        });
        if !matches!(migrated, Ok(Ok(()))) {
            tracing::debug!(uid, "could not enable tcp_migrate_req in the pod netns");
        }
    }
    Ok(Arc::new(NetnsSocketFactory::new(
        netns.try_clone()?,
        cfg.packet_mark,
    )))
}
