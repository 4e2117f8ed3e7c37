//! Object sources: where a [`Cluster`] snapshot comes from. For now a directory of manifests
//! (the embedded mesh and local runs); the Kubernetes API server comes later.
//!
//! [`DirectorySource`] reads every `*.yaml` / `*.yml` file of one directory (not recursive;
//! names starting with `.`, like editor swap files, are ignored) in name order, and merges
//! them into one object set: a duplicate across files is an error naming both places.
//! [`DirectorySource::watch`] polls the directory and publishes a new snapshot after each edit;
//! a broken edit is logged and the last good snapshot stays.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::objects::{ObjectError, ObjectSet, load_documents};
use crate::translate::{Cluster, ClusterConfig};

/// How often [`DirectorySource::watch`] looks at modification times.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("reading directory {dir}: {source}")]
    ReadDir { dir: PathBuf, source: io::Error },
    #[error("reading {file}: {source}")]
    ReadFile { file: PathBuf, source: io::Error },
    #[error(transparent)]
    Objects(#[from] ObjectError),
    #[error("loading {dir} in the background failed: {reason}")]
    Background { dir: PathBuf, reason: String },
}

/// A directory of Kubernetes-style manifests.
#[derive(Debug, Clone)]
pub struct DirectorySource {
    dir: PathBuf,
    config: ClusterConfig,
}

impl DirectorySource {
    pub fn new(dir: impl Into<PathBuf>, config: ClusterConfig) -> Self {
        Self {
            dir: dir.into(),
            config,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The manifest files, sorted by name.
    pub fn files(&self) -> Result<Vec<PathBuf>, SourceError> {
        let read_err = |source| SourceError::ReadDir {
            dir: self.dir.clone(),
            source,
        };
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(read_err)? {
            let path = entry.map_err(read_err)?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let manifest = name.ends_with(".yaml") || name.ends_with(".yml");
            if manifest && !name.starts_with('.') && path.is_file() {
                files.push(path);
            }
        }
        files.sort();
        Ok(files)
    }

    /// Loads every file into one snapshot.
    pub fn load(&self) -> Result<Cluster, SourceError> {
        let mut objects = ObjectSet::new();
        for file in self.files()? {
            let text = std::fs::read_to_string(&file).map_err(|source| SourceError::ReadFile {
                file: file.clone(),
                source,
            })?;
            for object in load_documents(&file.display().to_string(), &text)? {
                objects.insert(object)?;
            }
        }
        Ok(Cluster::new(self.config.clone(), objects))
    }

    /// What changes when a file is edited, added or removed: names, sizes and mtimes.
    fn fingerprint(&self) -> Result<Vec<(PathBuf, Option<SystemTime>, u64)>, SourceError> {
        Ok(self
            .files()?
            .into_iter()
            .map(|path| {
                let meta = std::fs::metadata(&path).ok();
                let mtime = meta.as_ref().and_then(|m| m.modified().ok());
                let len = meta.map_or(0, |m| m.len());
                (path, mtime, len)
            })
            .collect())
    }

    /// Loads the directory now (failing if it is broken), then polls it every
    /// [`POLL_INTERVAL`] and publishes each new good snapshot. Must be called inside a tokio
    /// runtime. The task stops when the returned [`DirectoryWatch`] is dropped or stopped, or
    /// when every receiver is gone.
    pub async fn watch(self) -> Result<DirectoryWatch, SourceError> {
        let source = Arc::new(self);
        let (fingerprint, first) = {
            let source = Arc::clone(&source);
            blocking(&source.dir.clone(), move || {
                let fp = source.fingerprint()?;
                Ok((fp, source.load()?))
            })
            .await?
        };
        let (tx, rx) = watch::channel(Arc::new(first));
        let task = tokio::spawn(poll(source, tx, fingerprint));
        Ok(DirectoryWatch { rx, task })
    }
}

async fn blocking<T: Send + 'static>(
    dir: &Path,
    f: impl FnOnce() -> Result<T, SourceError> + Send + 'static,
) -> Result<T, SourceError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SourceError::Background {
            dir: dir.to_path_buf(),
            reason: e.to_string(),
        })?
}

type Fingerprint = Vec<(PathBuf, Option<SystemTime>, u64)>;

async fn poll(
    source: Arc<DirectorySource>,
    tx: watch::Sender<Arc<Cluster>>,
    mut last: Fingerprint,
) {
    let dir = source.dir.clone();
    let mut ticker = tokio::time::interval(POLL_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Remembers the last failure so a broken file is logged once, not every tick.
    let mut last_error: Option<String> = None;
    loop {
        tokio::select! {
            _ = tx.closed() => return,
            _ = ticker.tick() => {}
        }
        // The fingerprint is taken before loading: an edit racing with the load changes it
        // again, so the next tick reloads.
        let src = Arc::clone(&source);
        let result = blocking(&dir, move || {
            let fp = src.fingerprint()?;
            Ok(fp)
        })
        .await;
        let fingerprint = match result {
            Ok(fp) => fp,
            Err(e) => {
                report(&mut last_error, &e);
                continue;
            }
        };
        if fingerprint == last {
            continue;
        }
        last = fingerprint;
        let src = Arc::clone(&source);
        match blocking(&dir, move || src.load()).await {
            Ok(cluster) => {
                last_error = None;
                tx.send_if_modified(|current| {
                    if **current == cluster {
                        return false;
                    }
                    tracing::info!(dir = %dir.display(), objects = cluster.objects.len(), "objects reloaded");
                    *current = Arc::new(cluster);
                    true
                });
            }
            Err(e) => report(&mut last_error, &e),
        }
    }
}

fn report(last_error: &mut Option<String>, e: &SourceError) {
    let text = e.to_string();
    if last_error.as_deref() != Some(text.as_str()) {
        tracing::error!(error = %text, "objects not reloaded; keeping the last good set");
        *last_error = Some(text);
    }
}

/// A running directory watch: the latest good snapshot and the polling task.
#[derive(Debug)]
pub struct DirectoryWatch {
    rx: watch::Receiver<Arc<Cluster>>,
    task: JoinHandle<()>,
}

impl DirectoryWatch {
    /// A receiver of snapshots; `changed()` fires after each reload that changed objects.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Cluster>> {
        self.rx.clone()
    }

    /// The latest good snapshot.
    pub fn current(&self) -> Arc<Cluster> {
        Arc::clone(&self.rx.borrow())
    }

    /// Stops polling and waits for the task to end.
    pub async fn stop(mut self) {
        self.task.abort();
        // The task is aborted: its only outcome is cancellation, nothing to report.
        let _ = (&mut self.task).await;
    }
}

impl Drop for DirectoryWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}
