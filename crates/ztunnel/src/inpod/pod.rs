//! Starting and stopping one pod's proxies: find the pod's workload record, bind the
//! listeners inside the pod's netns through its socket factory, prefetch the certificate,
//! start the [`PodExtras`](super::PodExtras), serve.

use std::sync::Arc;
use std::time::Duration;

use ambit_model::SpiffeId;
use ambit_netns::{NetnsId, SocketFactory, SocketOptions};
use tokio::task::JoinSet;

use super::platform::{self, PodNetns, SetupError};
use super::{ExtrasError, Inputs, PodContext};
use crate::drain::{DrainMode, DrainTrigger};
use crate::proxy::{
    Listeners, LocalWorkload, Proxy, ProxyError, ProxyInputs, WorkloadPool, pool_config,
};

/// Why a pod's proxies could not start (the pod stays pending and is retried).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(
        "no workload {name} in namespace {namespace} with service account {service_account} on this node (waited {waited:?})"
    )]
    WorkloadNotFound {
        name: String,
        namespace: String,
        service_account: String,
        waited: Duration,
    },
    #[error("setting up the pod's sockets: {0}")]
    Netns(#[from] SetupError),
    #[error(transparent)]
    Proxy(#[from] ProxyError),
    #[error("starting the pod's extra servers: {0}")]
    Extras(ExtrasError),
}

/// A running pod: its proxy, its extra servers and what identifies it.
pub(super) struct PodProxy {
    pub(super) netns: NetnsId,
    pub(super) identity: SpiffeId,
    proxy: Proxy,
    extras: Option<(DrainTrigger, JoinSet<()>)>,
}

impl std::fmt::Debug for PodProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodProxy")
            .field("netns", &self.netns)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl PodProxy {
    /// Stops the pod's listeners and servers; in-flight connections get `deadline`
    /// (none for [`DrainMode::Immediate`]).
    pub(super) async fn drain(
        self,
        data: &tokio::runtime::Handle,
        mode: DrainMode,
        deadline: Duration,
    ) {
        let proxy = self.proxy.drain(mode, deadline);
        let extras = async move {
            if let Some((trigger, mut tasks)) = self.extras {
                trigger.start_drain_and_wait(mode, deadline).await;
                tasks.abort_all();
                while tasks.join_next().await.is_some() {}
            }
        };
        // On the data-plane runtime, where the tasks live; a failed join means that runtime
        // is shutting down, which stops the tasks anyway.
        let _ = data
            .spawn(async move {
                tokio::join!(proxy, extras);
            })
            .await;
    }
}

/// Starts one pod's proxies. `wait` bounds how long the workload record may take to appear.
pub(super) async fn start(
    inputs: &Inputs,
    uid: &str,
    info: &LocalWorkload,
    netns: &PodNetns,
    wait: Duration,
) -> Result<PodProxy, StartError> {
    let workload = wait_for_workload(inputs, info, wait).await.ok_or_else(|| {
        StartError::WorkloadNotFound {
            name: info.name.clone(),
            namespace: info.namespace.clone(),
            service_account: info.service_account.clone(),
            waited: wait,
        }
    })?;
    let cfg = &inputs.cfg;
    let factory: Arc<dyn SocketFactory> =
        platform::socket_factory(inputs, uid, netns, wait).await?;
    let listeners = {
        // Registration with the reactor needs the runtime the listeners will be served on.
        let _guard = inputs.data.enter();
        Listeners::bind(cfg, factory.as_ref())?
    };
    let extras = match &inputs.extras {
        None => None,
        Some(hook) => {
            let ctx = PodContext {
                uid,
                workload: info,
                netns: netns.identity(),
                socket_factory: factory.clone(),
            };
            let (trigger, watcher) = crate::drain::new();
            let mut tasks = JoinSet::new();
            let _guard = inputs.data.enter();
            hook.start(&ctx, &mut tasks, watcher)
                .map_err(StartError::Extras)?;
            Some((trigger, tasks))
        }
    };
    // Prefetch on the caller's (control) runtime, so the first connection does not wait for
    // the CA.
    inputs.certs.prefetch(workload.identity());
    let proxy_inputs = ProxyInputs {
        cfg: cfg.clone(),
        state: inputs.state.clone(),
        certs: inputs.certs.clone(),
        metrics: inputs.metrics.clone(),
        socket_factory: factory.clone(),
        pool: WorkloadPool::new(
            pool_config(cfg),
            inputs.certs.clone(),
            factory,
            SocketOptions {
                nodelay: true,
                ..SocketOptions::default()
            },
        ),
        local: info.clone(),
        tracker: inputs.tracker.clone(),
        transparent: false,
    };
    tracing::info!(
        uid,
        name = %info.name,
        namespace = %info.namespace,
        netns = %netns.identity(),
        addresses = ?listeners.addresses(),
        transparent = listeners.transparent,
        "pod proxy listening"
    );
    let proxy = {
        let _guard = inputs.data.enter();
        Proxy::serve(listeners, proxy_inputs)
    };
    Ok(PodProxy {
        netns: netns.identity(),
        identity: workload.identity().clone(),
        proxy,
        extras,
    })
}

/// The pod's workload record on this node, waiting up to `wait` for it to arrive via xDS.
async fn wait_for_workload(
    inputs: &Inputs,
    info: &LocalWorkload,
    wait: Duration,
) -> Option<Arc<ambit_model::Workload>> {
    let find = || {
        inputs.state.find_local_workload(
            &info.name,
            &info.namespace,
            &info.service_account,
            inputs.cfg.node_name.as_deref(),
        )
    };
    let deadline = tokio::time::Instant::now() + wait;
    let mut changes = inputs.state.policy_changes();
    loop {
        changes.mark_unchanged();
        if let Some(w) = find() {
            return Some(w);
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return None;
        }
        // Every workload update bumps the generation; the short tick is a safety net in case
        // some update path does not.
        tokio::select! {
            r = changes.changed() => if r.is_err() { return find() },
            _ = tokio::time::sleep(left.min(Duration::from_millis(100))) => {}
        }
    }
}
