//! The agent's HTTP servers: plugin events on `<run_dir>/pluginevent.sock` (HTTP/1.1,
//! mode 0666, `POST /cmdadd`, §5.3), health on `/healthz` + `/readyz` (§6.2) and
//! Prometheus `/metrics` (§6.3) (those two are [`crate::monitoring`]'s, shared with the
//! Windows agent), all on the one HTTP/1 server loop ([`ambit_http`]) with
//! [`AgentConfig::http`]'s bounds: header-read deadline, body limit (`/cmdadd` included:
//! `413` beyond it), connection cap, backoff after a failed accept.
//!
//! Deviation: a pod that is not ambient gets 200 from `/cmdadd` (upstream: 500 "not
//! eligible"), because our plugin posts every pod and leaves the decision to the agent
//! (see [`crate::plugin`]).

use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ambit_http::{Body, Limits};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::metrics::CodeLabel;
use super::{AgentError, Core};
use crate::config::AgentConfig;
use crate::monitoring::{BindError, Monitored, MonitoringServers, serve_until, text};
use crate::plugin::{CmdAddRequest, PLUGIN_SOCKET};
use crate::pods::PodSource;

/// Bound sockets, not yet serving.
#[derive(Debug)]
pub(super) struct Servers {
    plugin: UnixListener,
    monitoring: MonitoringServers,
    pub health_addr: SocketAddr,
    pub metrics_addr: SocketAddr,
}

impl<S: PodSource> Monitored for Core<S> {
    fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    fn metrics_text(&self) -> String {
        self.metrics.encode()
    }
}

impl From<BindError> for AgentError {
    fn from(e: BindError) -> Self {
        Self::Bind {
            what: e.what,
            addr: e.addr.to_string(),
            source: e.source,
        }
    }
}

fn bind_err(what: &'static str, addr: String) -> impl FnOnce(std::io::Error) -> AgentError {
    move |source| AgentError::Bind { what, addr, source }
}

impl Servers {
    pub async fn bind(cfg: &AgentConfig) -> Result<Self, AgentError> {
        let sock: PathBuf = cfg.run_dir.join(PLUGIN_SOCKET);
        let name = sock.display().to_string();
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(&cfg.run_dir)
                .map_err(bind_err("plugin socket dir", name.clone()))?;
        }
        match std::fs::remove_file(&sock) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(bind_err("plugin socket", name)(e));
            }
            _ => {}
        }
        let plugin = UnixListener::bind(&sock).map_err(bind_err("plugin socket", name.clone()))?;
        // The plugin runs as whatever user the runtime uses.
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666))
            .map_err(bind_err("plugin socket", name))?;
        let monitoring = MonitoringServers::bind(cfg.health_addr, cfg.metrics_addr).await?;
        Ok(Self {
            health_addr: monitoring.health_addr,
            metrics_addr: monitoring.metrics_addr,
            plugin,
            monitoring,
        })
    }

    pub fn spawn<S: PodSource>(
        self,
        tasks: &mut JoinSet<()>,
        core: Arc<Core<S>>,
        stop: watch::Receiver<bool>,
    ) {
        let limits = core.cfg.http;
        tasks.spawn(serve(
            "plugin events",
            self.plugin,
            limits,
            core.clone(),
            stop.clone(),
        ));
        self.monitoring.spawn(tasks, limits, core, stop);
    }
}

/// Serves the plugin events until `stop` turns true; open connections are then dropped.
async fn serve<S: PodSource>(
    name: &'static str,
    listener: impl ambit_http::Listener,
    limits: Limits,
    core: Arc<Core<S>>,
    stop: watch::Receiver<bool>,
) {
    let handler = move |req| {
        let core = core.clone();
        async move { handle(&core, req).await }
    };
    serve_until(name, listener, limits, stop, handler).await;
}

async fn handle<S: PodSource>(core: &Core<S>, req: Request<Incoming>) -> Response<Body> {
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/cmdadd") => {
            let resp = cmd_add(core, req).await;
            core.metrics
                .plugin_requests
                .get_or_create(&CodeLabel {
                    response_code: resp.status().as_u16().to_string(),
                })
                .inc();
            resp
        }
        _ => text(StatusCode::NOT_FOUND, "not found"),
    }
}

/// How long a CNI ADD waits for the pod's namespace to reach the cache when enrolment
/// depends on it: well inside the plugin's 5 s budget, which the rules and ztunnel's ack
/// still need.
const NAMESPACE_WAIT: Duration = Duration::from_secs(1);

async fn cmd_add<S: PodSource>(core: &Core<S>, req: Request<Incoming>) -> Response<Body> {
    let body = match ambit_http::read_body(req.into_body(), core.cfg.http.max_body).await {
        Ok(b) => b,
        Err(e) => return e.response(),
    };
    let ev: CmdAddRequest = match serde_json::from_slice(&body) {
        Ok(ev) => ev,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("decoding body: {e}")),
    };
    // The pod event may trail the CNI call slightly (§1.4 step 4: 10 × 10 ms).
    let key = (ev.pod_namespace.clone(), ev.pod_name.clone());
    let mut pod = None;
    for _ in 0..10 {
        pod = core.cache().pods.get(&key).cloned();
        if pod.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let Some(pod) = pod else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("pod {}/{} not found", key.0, key.1),
        );
    };
    // An unknown namespace is not a non-ambient one: wait for it (bounded), then fail the
    // ADD rather than start the pod uncaptured (issue 12). The namespace informer normally
    // runs ahead of pods, so this only waits when it lags or is broken.
    if core.cfg.enablement.needs_namespace(&pod) {
        let deadline = tokio::time::Instant::now() + NAMESPACE_WAIT;
        while !core.cache().namespaces.contains_key(&pod.namespace) {
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    pod = %pod.name, namespace = %pod.namespace,
                    "CNI add refused: the pod's namespace is not known to the agent"
                );
                return text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!(
                        "namespace {} of pod {}/{} not known to the agent after {:?}: \
                         enrolment can not be decided",
                        pod.namespace, pod.namespace, pod.name, NAMESPACE_WAIT
                    ),
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    if !core.should_enrol(&pod) {
        return text(StatusCode::OK, "");
    }
    let mut ips: Vec<IpAddr> = ev
        .ips
        .iter()
        .filter_map(|ip| ip.address.ip.parse::<IpAddr>().ok())
        .map(|ip| ip.to_canonical())
        .collect();
    if ips.is_empty() {
        ips.clone_from(&pod.ips);
    }
    let netns = core.cfg.netns_path(&ev.netns);
    match core.add_pod_to_mesh(&pod, &ips, Some(netns)).await {
        Ok(()) => text(StatusCode::OK, ""),
        Err(e) => {
            tracing::warn!(pod = %pod.name, error = %e, "CNI add failed");
            text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        }
    }
}
