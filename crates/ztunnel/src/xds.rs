//! The workload xDS client: one delta ADS stream to the control plane feeding the proxy
//! state with workloads, services (`istio.workload.Address`) and authorization policies
//! (`istio.security.Authorization`) — spec §4.1.
//!
//! [`XdsClient::run`] keeps a stream open until drained: it subscribes to both types with an
//! empty (wildcard) subscription, declares on every reconnect the versions it already holds
//! (`initial_resource_versions`), applies each response through the [`handler`] and answers
//! it with an ACK, or a NACK whose `error_detail` names every refused resource and field
//! (valid resources of a NACKed response are still applied; see [`handler`]). A broken
//! stream is retried with exponential backoff (10 ms doubling to 15 s), reset once a stream
//! delivered a response. Once each type got its first ACKed response, the state is marked
//! synced (the data path and the ZDS client wait for that) and the "state manager" readiness
//! guard is released. A NACKed response does not count: its refused resources are missing. On-demand (`XDS_ON_DEMAND`) subscriptions are not implemented:
//! the client always subscribes to everything.

pub mod handler;
pub mod node;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ambit_proto::core::Node;
use ambit_proto::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ambit_proto::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use ambit_proto::prost::Message;
use ambit_proto::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL, rpc};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::config::{AuthToken, Config};
use crate::drain::DrainWatcher;
use crate::readiness::BlockReady;
use crate::state::ProxyState;
use crate::telemetry::{Metrics, XdsTerminationReason};

pub use handler::{ApplyError, Handler};
pub use node::{node_from_config, node_id};

/// The types ztunnel subscribes to, in the order of the initial requests.
pub const TYPE_URLS: [&str; 2] = [ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL];
/// Largest response decoded (spec §4.1: 200 MiB).
pub const MAX_MESSAGE_SIZE: usize = 200 * 1024 * 1024;
/// ACKs waiting for the transport; one per response, so a handful is plenty.
const REQUEST_QUEUE: usize = 16;
/// `google.rpc.Code.INVALID_ARGUMENT`, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// Why a stream attempt could not start.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    #[error("reading the xDS auth token {path}: {source}")]
    Token {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid xDS header {name:?}")]
    Header { name: String },
}

/// Reconnect delays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(10),
            max: Duration::from_secs(15),
        }
    }
}

/// Everything the client needs besides the channel and the state.
#[derive(Debug, Clone)]
pub struct XdsClientConfig {
    pub node: Node,
    /// Bearer token; sent with `clusterid` when set. A file is re-read on every connect.
    pub token: Option<AuthToken>,
    pub cluster_id: String,
    /// Extra gRPC metadata (`XDS_HEADER_<name>`).
    pub headers: Vec<(String, String)>,
    pub backoff: Backoff,
}

impl XdsClientConfig {
    /// Node, token, cluster id and headers from the ztunnel config.
    pub fn from_config(cfg: &Config) -> Self {
        Self {
            node: node_from_config(cfg),
            token: cfg.auth_token.clone(),
            cluster_id: cfg.cluster_id.clone(),
            headers: cfg
                .xds_headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            backoff: Backoff::default(),
        }
    }

    fn token(&self) -> Result<Option<String>, XdsError> {
        match &self.token {
            None => Ok(None),
            Some(AuthToken::Literal(t)) => Ok(Some(t.clone())),
            // Re-read on every connect: projected tokens rotate.
            Some(AuthToken::File(p)) => std::fs::read_to_string(p)
                .map(|t| Some(t.trim().to_string()))
                .map_err(|source| XdsError::Token {
                    path: p.display().to_string(),
                    source,
                }),
        }
    }

    /// The stream's gRPC metadata.
    fn metadata(&self) -> Result<tonic::metadata::MetadataMap, XdsError> {
        use tonic::metadata::{MetadataKey, MetadataValue};
        let mut meta = tonic::metadata::MetadataMap::new();
        let invalid = |name: &str| XdsError::Header { name: name.into() };
        if let Some(token) = self.token()? {
            let bearer = MetadataValue::try_from(format!("Bearer {token}"))
                .map_err(|_| invalid("authorization"))?;
            meta.insert("authorization", bearer);
            let cluster = MetadataValue::try_from(self.cluster_id.as_str())
                .map_err(|_| invalid("clusterid"))?;
            meta.insert("clusterid", cluster);
        }
        for (k, v) in &self.headers {
            let key = MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
                .map_err(|_| invalid(k))?;
            let value = MetadataValue::try_from(v.as_str()).map_err(|_| invalid(k))?;
            meta.insert(key, value);
        }
        Ok(meta)
    }
}

/// Holds the "state manager" readiness task, and the state unsynced, until every type had an
/// ACKed response.
#[derive(Debug)]
struct ReadyTracker {
    guard: Option<BlockReady>,
    state: Arc<ProxyState>,
    waiting: BTreeSet<&'static str>,
}

impl ReadyTracker {
    fn new(guard: BlockReady, state: Arc<ProxyState>) -> Self {
        Self {
            guard: Some(guard),
            state,
            waiting: TYPE_URLS.into_iter().collect(),
        }
    }

    fn acked(&mut self, type_url: &str) {
        self.waiting.remove(type_url);
        if self.waiting.is_empty()
            && let Some(guard) = self.guard.take()
        {
            tracing::info!("xDS: initial configuration received");
            self.state.mark_synced();
            guard.mark_ready();
        }
    }
}

/// How one stream ended.
#[derive(Debug)]
struct StreamEnd {
    reason: XdsTerminationReason,
    /// It delivered at least one response (the server was reachable and serving).
    healthy: bool,
    error: Option<String>,
}

impl StreamEnd {
    fn status(status: &tonic::Status, healthy: bool) -> Self {
        let reason = if status.code() == tonic::Code::Unavailable {
            XdsTerminationReason::ConnectionError
        } else {
            XdsTerminationReason::Error
        };
        Self {
            reason,
            healthy,
            error: Some(status.to_string()),
        }
    }
}

/// The delta ADS client.
#[derive(Debug)]
pub struct XdsClient {
    client: AggregatedDiscoveryServiceClient<Channel>,
    config: XdsClientConfig,
    handler: Handler,
    state: Arc<ProxyState>,
    metrics: Metrics,
}

impl XdsClient {
    pub fn new(
        channel: Channel,
        config: XdsClientConfig,
        state: Arc<ProxyState>,
        metrics: Metrics,
    ) -> Self {
        Self {
            client: AggregatedDiscoveryServiceClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE),
            config,
            handler: Handler::new(state.clone()),
            state,
            metrics,
        }
    }

    /// Streams until `drain` is signaled; `ready` is released after the first ACKed response
    /// of every type (and dropped unreleased-but-irrelevant if drained before).
    pub async fn run(mut self, ready: BlockReady, drain: DrainWatcher) {
        let mut ready = ReadyTracker::new(ready, self.state.clone());
        let backoff = self.config.backoff;
        let mut delay = backoff.initial;
        loop {
            let end = tokio::select! {
                biased;
                _ = drain.signaled() => return,
                end = self.stream(&mut ready) => end,
            };
            self.metrics.xds_connection_terminated(end.reason);
            if end.healthy {
                delay = backoff.initial;
            }
            match &end.error {
                Some(error) => tracing::warn!(
                    reason = end.reason.as_str(), %error, retry_in = ?delay, "xDS stream ended"
                ),
                None => tracing::info!(
                    reason = end.reason.as_str(), retry_in = ?delay, "xDS stream ended"
                ),
            }
            tokio::select! {
                biased;
                _ = drain.signaled() => return,
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(backoff.max);
        }
    }

    /// One stream, from connect to its end.
    async fn stream(&mut self, ready: &mut ReadyTracker) -> StreamEnd {
        let metadata = match self.config.metadata() {
            Ok(m) => m,
            Err(e) => {
                return StreamEnd {
                    reason: XdsTerminationReason::Error,
                    healthy: false,
                    error: Some(e.to_string()),
                };
            }
        };
        let initial: Vec<DeltaDiscoveryRequest> = TYPE_URLS
            .iter()
            .map(|type_url| DeltaDiscoveryRequest {
                node: Some(self.config.node.clone()),
                type_url: type_url.to_string(),
                initial_resource_versions: self.handler.versions(type_url),
                ..Default::default()
            })
            .collect();
        let (tx, rx) = mpsc::channel::<DeltaDiscoveryRequest>(REQUEST_QUEUE);
        let answers =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|r| (r, rx)) },
            );
        let outbound = futures_util::stream::iter(initial).chain(answers);
        let mut request = tonic::Request::new(outbound);
        *request.metadata_mut() = metadata;

        let mut inbound = match self.client.delta_aggregated_resources(request).await {
            Ok(r) => r.into_inner(),
            Err(status) => return StreamEnd::status(&status, false),
        };
        tracing::debug!("xDS stream open");
        let mut healthy = false;
        loop {
            let resp = match inbound.message().await {
                Ok(Some(resp)) => resp,
                Ok(None) => {
                    return StreamEnd {
                        reason: XdsTerminationReason::Complete,
                        healthy,
                        error: None,
                    };
                }
                Err(status) => return StreamEnd::status(&status, healthy),
            };
            healthy = true;
            let bytes = u64::try_from(resp.encoded_len()).unwrap_or(u64::MAX);
            self.metrics.xds_message(&resp.type_url, bytes);
            let answer = self.answer(&resp);
            let acked = answer.error_detail.is_none();
            if tx.send(answer).await.is_err() {
                return StreamEnd {
                    reason: XdsTerminationReason::ConnectionError,
                    healthy,
                    error: Some("request stream closed".into()),
                };
            }
            if acked {
                ready.acked(&resp.type_url);
            }
        }
    }

    /// Applies a response and builds its ACK or NACK.
    fn answer(&mut self, resp: &DeltaDiscoveryResponse) -> DeltaDiscoveryRequest {
        let errors = self.handler.apply(resp);
        let error_detail = if errors.is_empty() {
            tracing::debug!(
                type_url = %resp.type_url,
                nonce = %resp.nonce,
                resources = resp.resources.len(),
                removed = resp.removed_resources.len(),
                "xDS ACK"
            );
            None
        } else {
            let message = errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            tracing::warn!(type_url = %resp.type_url, nonce = %resp.nonce, error = %message, "xDS NACK");
            Some(rpc::Status {
                code: INVALID_ARGUMENT,
                message,
                details: Vec::new(),
            })
        };
        DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            error_detail,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests;
