//! Finding running pods' HNS namespaces through the container runtime (`spec/windows.md`
//! §1.3, the snapshot / late-enrolment path): a gRPC client of the CRI `RuntimeService` over
//! the runtime's local endpoint (on Windows containerd's named pipe
//! [`CONTAINERD_PIPE`], on Unix a socket path, which is how the tests here reach a fake
//! runtime speaking the real protocol), `ListPodSandbox` with no filter, then a verbose
//! `PodSandboxStatus` per sandbox of a wanted pod, whose `info["info"]` names the namespace
//! ([`super::cri::sandbox_namespace`]).
//!
//! Every call has a deadline ([`CriClient::connect`]'s, 5 s like upstream's) and answers are
//! bounded (16 MiB, the kubelet's limit). Where upstream takes the first sandbox that answers,
//! a pod's ready sandboxes are asked first, newest first, so a stopped sandbox still listed
//! beside the live one (a pod restarted by the kubelet) never names a namespace HNS is
//! tearing down. A sandbox that cannot be read is skipped with its reason, as upstream does;
//! a runtime that stops answering fails the whole lookup instead of costing a deadline per
//! sandbox.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ambit_netns::guid::Guid;
use ambit_proto::cri::runtime_service_client::RuntimeServiceClient;
use ambit_proto::cri::{
    ListPodSandboxRequest, PodSandbox, PodSandboxState, PodSandboxStatusRequest,
};
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use super::cri::{SandboxInfoError, sandbox_namespace};

/// containerd's CRI endpoint on Windows nodes.
pub const CONTAINERD_PIPE: &str = r"\\.\pipe\containerd-containerd";

/// Upstream's deadline for each CRI call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest answer accepted (the kubelet's CRI message limit).
pub const MAX_MESSAGE: usize = 16 << 20;

/// A failed CRI call; names the endpoint and the method.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// The endpoint could not be reached.
    #[error("CRI endpoint {endpoint}: cannot connect: {source}")]
    Connect {
        /// The endpoint.
        endpoint: String,
        /// What the transport said.
        source: tonic::transport::Error,
    },
    /// The runtime answered with an error.
    #[error("CRI endpoint {endpoint}: {method}: {status}")]
    Call {
        /// The endpoint.
        endpoint: String,
        /// `ListPodSandbox` or `PodSandboxStatus <id>`.
        method: String,
        /// The runtime's gRPC status.
        status: Box<tonic::Status>,
    },
    /// No answer within the deadline.
    #[error("CRI endpoint {endpoint}: {method}: no answer within {after:?}")]
    Deadline {
        /// The endpoint.
        endpoint: String,
        /// `ListPodSandbox` or `PodSandboxStatus <id>`.
        method: String,
        /// The deadline.
        after: Duration,
    },
}

/// Why one sandbox of a wanted pod named no namespace.
#[derive(Debug, thiserror::Error)]
pub enum SkipReason {
    /// Its status call failed (for example, it was removed since the list).
    #[error(transparent)]
    Status(#[from] CriError),
    /// Its info names no usable namespace.
    #[error(transparent)]
    Info(#[from] SandboxInfoError),
}

/// A pod's sandbox and the HNS namespace it runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The sandbox ID.
    pub sandbox: String,
    /// The HNS namespace.
    pub namespace: Guid,
}

/// A sandbox that was asked and skipped.
#[derive(Debug)]
pub struct Skipped {
    /// The pod UID.
    pub uid: String,
    /// The sandbox ID.
    pub sandbox: String,
    /// Why.
    pub reason: SkipReason,
}

/// What a lookup found: per pod UID the sandbox that named a namespace, and every sandbox
/// skipped on the way (also of pods found through another sandbox).
#[derive(Debug, Default)]
pub struct Lookup {
    /// By pod UID.
    pub found: BTreeMap<String, Found>,
    /// In the order asked.
    pub skipped: Vec<Skipped>,
}

/// A CRI `RuntimeService` client on a local endpoint.
#[derive(Debug, Clone)]
pub struct CriClient {
    inner: RuntimeServiceClient<Channel>,
    endpoint: String,
    timeout: Duration,
}

impl CriClient {
    /// Connects to `endpoint` (a named pipe on Windows, a socket path on Unix); `timeout`
    /// bounds the connection and every call.
    pub async fn connect(endpoint: &Path, timeout: Duration) -> Result<Self, CriError> {
        let name = endpoint.display().to_string();
        let connector = LocalConnector {
            path: Arc::new(endpoint.to_path_buf()),
            timeout,
        };
        // The URI is only the HTTP/2 authority; the connector decides where bytes go.
        let channel = Endpoint::from_static("http://cri.local")
            .connect_timeout(timeout)
            .connect_with_connector(connector)
            .await
            .map_err(|source| CriError::Connect {
                endpoint: name.clone(),
                source,
            })?;
        let inner = RuntimeServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE);
        Ok(Self {
            inner,
            endpoint: name,
            timeout,
        })
    }

    /// Every sandbox the runtime holds, in any state.
    pub async fn sandboxes(&mut self) -> Result<Vec<PodSandbox>, CriError> {
        let mut inner = self.inner.clone();
        let answer = self
            .deadline("ListPodSandbox".into(), async move {
                inner
                    .list_pod_sandbox(ListPodSandboxRequest { filter: None })
                    .await
            })
            .await?;
        Ok(answer.items)
    }

    /// One sandbox's verbose `info` map.
    pub async fn sandbox_info(&mut self, id: &str) -> Result<HashMap<String, String>, CriError> {
        let mut inner = self.inner.clone();
        let request = PodSandboxStatusRequest {
            pod_sandbox_id: id.to_owned(),
            verbose: true,
        };
        let answer = self
            .deadline(format!("PodSandboxStatus {id}"), async move {
                inner.pod_sandbox_status(request).await
            })
            .await?;
        Ok(answer.info)
    }

    /// The HNS namespace of each pod in `wanted` (pod UIDs) that has a readable sandbox.
    pub async fn pod_namespaces(&mut self, wanted: &BTreeSet<String>) -> Result<Lookup, CriError> {
        let mut candidates: Vec<(String, PodSandbox)> = self
            .sandboxes()
            .await?
            .into_iter()
            .filter_map(|sandbox| {
                let uid = sandbox.metadata.as_ref()?.uid.clone();
                wanted.contains(&uid).then_some((uid, sandbox))
            })
            .collect();
        candidates.sort_by_key(|(_, s)| {
            (
                s.state() != PodSandboxState::SandboxReady,
                Reverse(s.created_at),
            )
        });
        let mut lookup = Lookup::default();
        for (uid, sandbox) in candidates {
            if lookup.found.contains_key(&uid) {
                continue;
            }
            let reason: SkipReason = match self.sandbox_info(&sandbox.id).await {
                Ok(info) => match sandbox_namespace(&sandbox.id, &info) {
                    Ok(namespace) => {
                        lookup.found.insert(
                            uid,
                            Found {
                                sandbox: sandbox.id,
                                namespace,
                            },
                        );
                        continue;
                    }
                    Err(e) => e.into(),
                },
                // A runtime that stops answering fails the lookup; one that answers an error
                // for this sandbox only skips it.
                Err(e @ CriError::Deadline { .. }) => return Err(e),
                Err(e) => e.into(),
            };
            lookup.skipped.push(Skipped {
                uid,
                sandbox: sandbox.id,
                reason,
            });
        }
        Ok(lookup)
    }

    async fn deadline<T>(
        &self,
        method: String,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, CriError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(answer)) => Ok(answer.into_inner()),
            Ok(Err(status)) => Err(CriError::Call {
                endpoint: self.endpoint.clone(),
                method,
                status: Box::new(status),
            }),
            Err(_) => Err(CriError::Deadline {
                endpoint: self.endpoint.clone(),
                method,
                after: self.timeout,
            }),
        }
    }
}

/// Opens the local endpoint for every connection the channel makes.
#[derive(Clone)]
struct LocalConnector {
    path: Arc<PathBuf>,
    timeout: Duration,
}

type ConnectFuture = Pin<Box<dyn Future<Output = std::io::Result<TokioIo<imp::Stream>>> + Send>>;

impl tower_service::Service<Uri> for LocalConnector {
    type Response = TokioIo<imp::Stream>;
    type Error = std::io::Error;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let path = Arc::clone(&self.path);
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, imp::open(&path)).await {
                Ok(stream) => stream.map(TokioIo::new),
                Err(_) => Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("{}: not open within {timeout:?}", path.display()),
                )),
            }
        })
    }
}

#[cfg(unix)]
mod imp {
    use std::path::Path;

    pub type Stream = tokio::net::UnixStream;

    pub async fn open(path: &Path) -> std::io::Result<Stream> {
        Stream::connect(path).await
    }
}

#[cfg(windows)]
mod imp {
    use std::path::Path;
    use std::time::Duration;

    use tokio::net::windows::named_pipe::{ClientOptions, NamedPipeClient};

    pub type Stream = NamedPipeClient;

    /// Every instance of the pipe is busy: wait a little and try again (the caller's
    /// deadline bounds the retries).
    const ERROR_PIPE_BUSY: i32 = 231;

    pub async fn open(path: &Path) -> std::io::Result<Stream> {
        loop {
            match ClientOptions::new().open(path) {
                Err(e) if e.raw_os_error() == Some(ERROR_PIPE_BUSY) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => return other,
            }
        }
    }
}
