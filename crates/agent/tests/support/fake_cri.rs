//! A fake container runtime for the CRI client's tests: the real `runtime.v1.RuntimeService`
//! over gRPC (tonic's server, the generated service), answering from a table of sandboxes.
//! Served on a Unix socket on Linux and on a named pipe under Wine.

#![allow(dead_code, reason = "each test binary uses a part of it")]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ambit_proto::cri::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use ambit_proto::cri::{
    ListPodSandboxRequest, ListPodSandboxResponse, PodSandbox, PodSandboxMetadata, PodSandboxState,
    PodSandboxStatus, PodSandboxStatusRequest, PodSandboxStatusResponse,
};
use tonic::{Request, Response, Status};

/// How the runtime answers a sandbox's status.
#[derive(Clone)]
pub enum Answer {
    /// With this `info["info"]` JSON.
    Info(String),
    /// With this error.
    Fail(tonic::Code),
    /// Never.
    Hang,
}

/// One sandbox the runtime holds.
#[derive(Clone)]
pub struct Sandbox {
    pub id: &'static str,
    /// The pod UID; `None` for a sandbox without metadata.
    pub uid: Option<&'static str>,
    pub ready: bool,
    pub created_at: i64,
    pub answer: Answer,
}

/// containerd's sandbox-info JSON naming `guid` as the HNS namespace.
pub fn info_naming(guid: &str) -> Answer {
    Answer::Info(format!(
        r#"{{"pid":1,"runtimeSpec":{{"windows":{{"network":{{"networkNamespace":"{guid}"}}}}}}}}"#
    ))
}

#[derive(Clone)]
pub struct FakeRuntime {
    sandboxes: Arc<Vec<Sandbox>>,
    /// Status calls per sandbox ID.
    pub status_calls: Arc<Mutex<HashMap<String, usize>>>,
}

impl FakeRuntime {
    pub fn new(sandboxes: Vec<Sandbox>) -> Self {
        Self {
            sandboxes: Arc::new(sandboxes),
            status_calls: Arc::default(),
        }
    }

    pub fn calls(&self, id: &str) -> usize {
        self.status_calls
            .lock()
            .unwrap()
            .get(id)
            .copied()
            .unwrap_or(0)
    }

    pub fn service(&self) -> RuntimeServiceServer<Self> {
        RuntimeServiceServer::new(self.clone())
    }
}

fn state(ready: bool) -> i32 {
    if ready {
        PodSandboxState::SandboxReady.into()
    } else {
        PodSandboxState::SandboxNotready.into()
    }
}

fn metadata(uid: Option<&str>) -> Option<PodSandboxMetadata> {
    uid.map(|uid| PodSandboxMetadata {
        name: format!("pod-{uid}"),
        uid: uid.to_owned(),
        namespace: "ns".into(),
        attempt: 0,
    })
}

#[tonic::async_trait]
impl RuntimeService for FakeRuntime {
    async fn pod_sandbox_status(
        &self,
        request: Request<PodSandboxStatusRequest>,
    ) -> Result<Response<PodSandboxStatusResponse>, Status> {
        let request = request.into_inner();
        *self
            .status_calls
            .lock()
            .unwrap()
            .entry(request.pod_sandbox_id.clone())
            .or_default() += 1;
        let Some(sandbox) = self
            .sandboxes
            .iter()
            .find(|s| s.id == request.pod_sandbox_id)
        else {
            return Err(Status::not_found("no such sandbox"));
        };
        let info = match &sandbox.answer {
            Answer::Info(json) if request.verbose => [("info".to_owned(), json.clone())].into(),
            Answer::Info(_) => HashMap::new(),
            Answer::Fail(code) => return Err(Status::new(*code, "the fake says no")),
            Answer::Hang => std::future::pending().await,
        };
        Ok(Response::new(PodSandboxStatusResponse {
            status: Some(PodSandboxStatus {
                id: sandbox.id.into(),
                metadata: metadata(sandbox.uid),
                state: state(sandbox.ready),
                created_at: sandbox.created_at,
            }),
            info,
        }))
    }

    async fn list_pod_sandbox(
        &self,
        _: Request<ListPodSandboxRequest>,
    ) -> Result<Response<ListPodSandboxResponse>, Status> {
        let items = self
            .sandboxes
            .iter()
            .map(|s| PodSandbox {
                id: s.id.into(),
                metadata: metadata(s.uid),
                state: state(s.ready),
                created_at: s.created_at,
                ..Default::default()
            })
            .collect();
        Ok(Response::new(ListPodSandboxResponse { items }))
    }
}
