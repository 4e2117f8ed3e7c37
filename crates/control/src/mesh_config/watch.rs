//! Following a mesh config source while the control plane runs: a file (re-read every
//! [`POLL_INTERVAL`]; a ConfigMap mounted as a volume changes this way too) or one ConfigMap's
//! `mesh` key on the API server (a watch on that one object).
//!
//! Every new version goes through [`MeshConfig::parse`], then [`MeshSettings::effective`]. It
//! is published only when it is good and keeps the running trust domain: the CA and every
//! certificate it issued belong to the trust domain of the start, so a new one is refused
//! (logged as an error, counted in `ambit_control_mesh_config_rejected_total`,
//! `ambit_control_mesh_config_in_sync` 0) and the last good settings stay, as for any bad
//! version. A good version puts `ambit_control_mesh_config_in_sync` back to 1.
//!
//! At start the source must be good (the control plane does not start on a broken mesh
//! config). A ConfigMap that does not exist is an empty mesh config, as for istiod; one
//! without the `mesh` key is refused.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ambit_kubeapi::serde_json::Value;
use ambit_kubeapi::{Client, Reflector, ReflectorEvent};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{MAX_BYTES, MeshConfig, MeshConfigError, MeshSettings};
use crate::monitoring::Metrics;
use crate::translate::ClusterConfig;

/// How often a mesh config file is re-read.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// The key of the `istio` ConfigMap that holds the mesh config.
pub const CONFIG_MAP_KEY: &str = "mesh";

/// Where the mesh config comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MeshSource {
    /// None: the flags alone.
    None,
    /// A YAML file (`--mesh-config`).
    File(PathBuf),
    /// The `mesh` key of a ConfigMap on the API server (istiod's `istio` ConfigMap).
    ConfigMap { namespace: String, name: String },
}

/// A running mesh config watch: the settings in force and the task that follows the source.
#[derive(Debug)]
pub struct MeshWatch {
    rx: watch::Receiver<Arc<MeshSettings>>,
    task: Option<JoinHandle<()>>,
    /// Without a source, the sender nobody sends on: held so that receivers wait for a
    /// change forever instead of seeing the channel closed.
    _fixed: Option<watch::Sender<Arc<MeshSettings>>>,
}

impl Drop for MeshWatch {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

impl MeshWatch {
    /// Reads the source now (failing when it is broken), then follows it. `client` is needed
    /// for [`MeshSource::ConfigMap`]. Must be called inside a tokio runtime.
    pub async fn start(
        source: MeshSource,
        defaults: ClusterConfig,
        client: Option<Client>,
        metrics: Arc<Metrics>,
    ) -> Result<MeshWatch, MeshConfigError> {
        match source {
            MeshSource::None => {
                let (tx, rx) = watch::channel(Arc::new(MeshSettings::effective(
                    &defaults,
                    &MeshConfig::default(),
                )));
                Ok(MeshWatch {
                    rx,
                    task: None,
                    _fixed: Some(tx),
                })
            }
            MeshSource::File(path) => {
                let origin = format!("mesh config {}", path.display());
                let text = read_file(&path, &origin).await?;
                let first = MeshConfig::parse(&origin, &text)?;
                let (follower, rx) = Follower::new(origin, defaults, &first, metrics);
                let task = tokio::spawn(follow_file(path, text, follower));
                Ok(MeshWatch {
                    rx,
                    task: Some(task),
                    _fixed: None,
                })
            }
            MeshSource::ConfigMap { namespace, name } => {
                let origin = format!("ConfigMap {namespace}/{name} key {CONFIG_MAP_KEY}");
                let client = client.ok_or_else(|| MeshConfigError::Read {
                    origin: origin.clone(),
                    reason: "needs the Kubernetes API server".into(),
                })?;
                let mut reflector = Reflector::new(
                    client,
                    format!("/api/v1/namespaces/{namespace}/configmaps"),
                    Some(format!("metadata.name={name}")),
                );
                let mut first = MeshConfig::default();
                loop {
                    match reflector.next().await {
                        Ok(ReflectorEvent::Synced) => break,
                        Ok(ReflectorEvent::Added(item) | ReflectorEvent::Updated(item)) => {
                            first = from_config_map(&origin, &item)?;
                        }
                        Ok(ReflectorEvent::Deleted(_)) => first = MeshConfig::default(),
                        Err(e) => {
                            return Err(MeshConfigError::Read {
                                origin,
                                reason: e.to_string(),
                            });
                        }
                    }
                }
                let (follower, rx) = Follower::new(origin, defaults, &first, metrics);
                let task = tokio::spawn(follow_config_map(reflector, follower));
                Ok(MeshWatch {
                    rx,
                    task: Some(task),
                    _fixed: None,
                })
            }
        }
    }

    /// The settings in force now.
    pub fn current(&self) -> Arc<MeshSettings> {
        Arc::clone(&self.rx.borrow())
    }

    /// A receiver of the settings; `changed()` fires after each applied change.
    pub fn subscribe(&self) -> watch::Receiver<Arc<MeshSettings>> {
        self.rx.clone()
    }
}

/// The file's text, at most [`MAX_BYTES`] (one more is read to tell a bigger file).
async fn read_file(path: &std::path::Path, origin: &str) -> Result<String, MeshConfigError> {
    use tokio::io::AsyncReadExt;
    let read = |e: std::io::Error| MeshConfigError::Read {
        origin: origin.to_owned(),
        reason: e.to_string(),
    };
    let file = tokio::fs::File::open(path).await.map_err(read)?;
    let mut buf = Vec::new();
    file.take(MAX_BYTES as u64 + 1)
        .read_to_end(&mut buf)
        .await
        .map_err(read)?;
    String::from_utf8(buf).map_err(|_| MeshConfigError::Yaml {
        origin: origin.to_owned(),
        reason: "not UTF-8".into(),
    })
}

/// The mesh config in a ConfigMap object from the API server.
fn from_config_map(origin: &str, item: &Value) -> Result<MeshConfig, MeshConfigError> {
    match item.get("data").and_then(|d| d.get(CONFIG_MAP_KEY)) {
        Some(Value::String(text)) => MeshConfig::parse(origin, text),
        Some(_) => Err(MeshConfigError::Read {
            origin: origin.to_owned(),
            reason: "not a string".into(),
        }),
        None => Err(MeshConfigError::Read {
            origin: origin.to_owned(),
            reason: "the ConfigMap has no such key".into(),
        }),
    }
}

/// Checks each new version and publishes the good ones (see the module docs).
struct Follower {
    origin: String,
    defaults: ClusterConfig,
    running_trust_domain: String,
    tx: watch::Sender<Arc<MeshSettings>>,
    metrics: Arc<Metrics>,
}

impl Follower {
    fn new(
        origin: String,
        defaults: ClusterConfig,
        first: &MeshConfig,
        metrics: Arc<Metrics>,
    ) -> (Self, watch::Receiver<Arc<MeshSettings>>) {
        let settings = MeshSettings::effective(&defaults, first);
        tracing::info!(
            source = %origin,
            trust_domain = %settings.trust_domain,
            root_namespace = %settings.root_namespace,
            proxy_metadata = ?settings.proxy_metadata,
            "mesh config"
        );
        if first
            .trust_domain
            .as_ref()
            .is_some_and(|td| *td != defaults.trust_domain)
        {
            tracing::warn!(
                source = %origin,
                flag = %defaults.trust_domain,
                mesh_config = %settings.trust_domain,
                "the mesh config's trustDomain overrides --trust-domain / TRUST_DOMAIN"
            );
        }
        metrics.mesh_config_in_sync(true);
        let running_trust_domain = settings.trust_domain.clone();
        let (tx, rx) = watch::channel(Arc::new(settings));
        let follower = Self {
            origin,
            defaults,
            running_trust_domain,
            tx,
            metrics,
        };
        (follower, rx)
    }

    fn offer(&self, version: Result<MeshConfig, MeshConfigError>) {
        let checked = version.and_then(|mesh| {
            let s = MeshSettings::effective(&self.defaults, &mesh);
            if s.trust_domain == self.running_trust_domain {
                Ok(s)
            } else {
                Err(MeshConfigError::TrustDomainChange {
                    origin: self.origin.clone(),
                    running: self.running_trust_domain.clone(),
                    new: s.trust_domain,
                })
            }
        });
        match checked {
            Ok(settings) => {
                self.metrics.mesh_config_in_sync(true);
                self.tx.send_if_modified(|current| {
                    if **current == settings {
                        return false;
                    }
                    tracing::info!(
                        source = %self.origin,
                        root_namespace = %settings.root_namespace,
                        proxy_metadata = ?settings.proxy_metadata,
                        "mesh config changed; applied"
                    );
                    *current = Arc::new(settings);
                    true
                });
            }
            Err(e) => {
                self.metrics.mesh_config_rejected();
                tracing::error!(error = %e, "mesh config not applied; keeping the last good one");
            }
        }
    }
}

async fn follow_file(path: PathBuf, mut last: String, follower: Follower) {
    let mut ticker = tokio::time::interval(POLL_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The last read error, so an unreadable file is counted and logged once, not every tick.
    let mut last_error: Option<MeshConfigError> = None;
    loop {
        tokio::select! {
            _ = follower.tx.closed() => return,
            _ = ticker.tick() => {}
        }
        match read_file(&path, &follower.origin).await {
            Ok(text) if text == last && last_error.is_none() => {}
            Ok(text) => {
                last_error = None;
                follower.offer(MeshConfig::parse(&follower.origin, &text));
                last = text;
            }
            Err(e) if last_error.as_ref() == Some(&e) => {}
            Err(e) => {
                last_error = Some(e.clone());
                follower.offer(Err(e));
            }
        }
    }
}

async fn follow_config_map(mut reflector: Reflector, follower: Follower) {
    loop {
        let event = tokio::select! {
            _ = follower.tx.closed() => return,
            ev = reflector.next() => ev,
        };
        match event {
            Ok(ReflectorEvent::Added(item) | ReflectorEvent::Updated(item)) => {
                follower.offer(from_config_map(&follower.origin, &item));
            }
            Ok(ReflectorEvent::Deleted(_)) => follower.offer(Ok(MeshConfig::default())),
            Ok(ReflectorEvent::Synced) => {}
            Err(e) => tracing::warn!(
                source = %follower.origin,
                error = %e,
                "watching the mesh config; retrying, the last good one stays"
            ),
        }
    }
}
