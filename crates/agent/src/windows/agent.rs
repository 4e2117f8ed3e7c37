//! The Windows node agent (`ambit cni-agent` on Windows): the ZDS pipe server, the pod watch
//! from the API server ([`crate::pods::kube`]), the loop of [`super::daemon`] over the
//! real effects: the CRI client then HNS then the policies ([`CriNode`]) and the ZDS server,
//! and the Linux agent's health and metrics servers ([`crate::monitoring`]) over what the
//! loop and the pipe server publish ([`WindowsMonitor`]). Runs until `shutdown` turns true or
//! a part fails for good.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ambit_netns::hcn::HcnError;
use ambit_redirect::hns::{HcnEndpoints, WfpPolicyConfig};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::HnsPodNamespace;
use super::config::WindowsAgentConfig;
use super::daemon::{self, Backoff, Captures, Check, Daemon, Node, Workload, Ztunnel};
use super::enrol::{self, HcnNamespaces, WindowsEnrolError};
use super::monitor::WindowsMonitor;
use super::running::{self, RunningError, VerifyError};
use super::sandboxes::{CriClient, CriError};
use crate::monitoring::{BindError, MonitoringServers};
use crate::pods::kube::{KubePodSource, KubeSetupError, client_from_environment_in};
use crate::zds::{ZdsConfig, ZdsError, ZdsPod, ZdsServer};

/// The deadline of each CRI call (upstream's, `spec/windows.md` §1.3).
pub const CRI_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the Windows agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum WindowsAgentError {
    /// The ZDS pipe could not be created (a squatter holds the name, or no rights).
    #[error(transparent)]
    Zds(#[from] ZdsError),
    /// No API server client.
    #[error(transparent)]
    Kube(#[from] KubeSetupError),
    /// The health or metrics address could not be bound.
    #[error(transparent)]
    Monitoring(#[from] BindError),
    /// The loop ended.
    #[error(transparent)]
    Run(#[from] daemon::RunError),
}

/// Why one pod (or all) could not be captured or released.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The runtime could not be reached or asked.
    #[error(transparent)]
    Cri(#[from] CriError),
    /// The pod's sandbox, namespace or policies.
    #[error(transparent)]
    Pod(#[from] RunningError<HcnError>),
    /// Removing the policies.
    #[error(transparent)]
    Release(#[from] WindowsEnrolError),
    /// Re-checking an enrolled pod's namespace and policies.
    #[error(transparent)]
    Verify(#[from] VerifyError<HcnError>),
}

/// The runtime (connected on first use, again after a failure), HNS and the HCN policies.
#[derive(Debug)]
pub struct CriNode {
    endpoint: std::path::PathBuf,
    client: Option<CriClient>,
    policy: WfpPolicyConfig,
}

impl CriNode {
    /// For the runtime at `endpoint`.
    pub fn new(endpoint: std::path::PathBuf, policy: WfpPolicyConfig) -> Self {
        Self {
            endpoint,
            client: None,
            policy,
        }
    }
}

impl Node for CriNode {
    type Error = NodeError;

    async fn capture(&mut self, uids: &BTreeSet<String>) -> Result<Captures<NodeError>, NodeError> {
        let mut client = match self.client.take() {
            Some(c) => c,
            None => CriClient::connect(&self.endpoint, CRI_TIMEOUT).await?,
        };
        let lookup = client.pod_namespaces(uids).await?;
        // Kept only after a complete answer: a failed call reconnects next time.
        self.client = Some(client);
        let outcomes =
            running::capture_found(&lookup, &HcnNamespaces, &HcnEndpoints, &self.policy, uids);
        Ok(outcomes
            .into_iter()
            .map(|(uid, r)| (uid, r.map(|c| c.namespace).map_err(NodeError::from)))
            .collect())
    }

    async fn locate(&mut self, uid: &str) -> Result<Option<HnsPodNamespace>, NodeError> {
        let mut client = match self.client.take() {
            Some(c) => c,
            None => CriClient::connect(&self.endpoint, CRI_TIMEOUT).await?,
        };
        let wanted = BTreeSet::from([uid.to_owned()]);
        let lookup = client.pod_namespaces(&wanted).await?;
        self.client = Some(client);
        running::located(&lookup, uid).map_err(NodeError::from)
    }

    fn release(&mut self, ns: &HnsPodNamespace) -> Result<(), NodeError> {
        let found = match enrol::namespace(ns.guid) {
            Ok(found) => found,
            // The namespace went with the pod's sandbox: nothing holds the policies.
            Err(WindowsEnrolError::Namespace { source, .. }) if source.is_not_found() => {
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        enrol::release(&found)?;
        Ok(())
    }

    fn verify(&mut self, ns: &HnsPodNamespace) -> Check<NodeError> {
        running::verify_namespace(&HcnNamespaces, &HcnEndpoints, ns.guid, &self.policy)
            .map_err(NodeError::from)
    }
}

impl Ztunnel for ZdsServer {
    type Error = ZdsError;

    async fn add(&self, w: Workload) -> Result<(), ZdsError> {
        let pod = ZdsPod {
            uid: ambit_contract::zds::PodUid::new(&w.uid)?,
            name: w.name,
            namespace: w.namespace,
            service_account: w.service_account,
            netns: Some(w.hns),
        };
        ZdsServer::add(self, pod).await
    }

    async fn del(&self, uid: &str) -> Result<(), ZdsError> {
        ZdsServer::del(self, uid).await
    }
}

/// Runs the Windows agent with `cfg`; `vars` are the process environment (the API server
/// client's `KUBECONFIG` / in-cluster settings).
pub async fn run(
    cfg: WindowsAgentConfig,
    vars: &[(String, String)],
    shutdown: watch::Receiver<bool>,
) -> Result<(), WindowsAgentError> {
    let monitor = Arc::new(WindowsMonitor::new());
    let listener = ZdsServer::bind(&cfg.zds_pipe)?;
    let servers = MonitoringServers::bind(cfg.health_addr, cfg.metrics_addr).await?;
    let client = client_from_environment_in(vars, &cfg.service_account_dir)?;
    let source = KubePodSource::new(client, cfg.node_name.clone());
    let zds = ZdsServer::new(ZdsConfig::default(), Some(monitor.ztunnel_gauge()));
    // Dropped on return: the servers stop with the agent.
    let mut tasks = JoinSet::new();
    let (health, metrics) = (servers.health_addr, servers.metrics_addr);
    servers.spawn(
        &mut tasks,
        ambit_http::Limits::default(),
        monitor.clone(),
        shutdown.clone(),
    );
    let serve = {
        let zds = zds.clone();
        let shutdown = shutdown.clone();
        let monitor = monitor.clone();
        // The pipe exists (bound above): ztunnel can connect from now on.
        monitor.set_zds_listening(true);
        tokio::spawn(async move {
            zds.serve(listener, shutdown).await;
            monitor.set_zds_listening(false);
        })
    };
    tracing::info!(pipe = %cfg.zds_pipe.display(), cri = %cfg.cri_endpoint.display(), node = %cfg.node_name, verify_interval = ?cfg.verify_interval, %health, %metrics, "Windows node agent running");
    let node = CriNode::new(cfg.cri_endpoint.clone(), cfg.policy.clone());
    let d = Daemon::new(
        node,
        zds.clone(),
        source,
        cfg.enablement.clone(),
        Backoff::default(),
    )
    .with_verification(cfg.verify_interval)
    .with_monitor(monitor);
    let result = daemon::run(d, zds.snapshots(), shutdown).await;
    serve.abort();
    let _ = serve.await;
    Ok(result?)
}
