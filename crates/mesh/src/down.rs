//! `ambit down`: removing a mesh from its run directory alone — also when its orchestrator
//! was killed. A live orchestrator is asked to stop (SIGTERM: it tears down itself); then
//! every recorded process that is still ours is stopped, the prefix's namespaces deleted
//! (which takes their links and rules with them) and the generated files removed.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::process;
use crate::state::{ProcessRecord, Role, RunDir, StateError};

/// Why a mesh could not be removed completely.
#[derive(Debug, thiserror::Error)]
pub enum DownError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("processes still running after KILL: {0:?}")]
    Processes(Vec<u32>),
    #[error("deleting the namespaces: {0}")]
    Topology(#[from] ambit_topology::TopologyError),
    #[error("removing {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What `down` found and removed.
#[derive(Debug, Clone, Default)]
pub struct DownReport {
    /// The prefix of the removed mesh, if there was one.
    pub prefix: Option<String>,
    /// Whether a live orchestrator was asked to stop.
    pub orchestrator_stopped: bool,
    /// Processes stopped here (the orchestrator's own children it could not stop itself).
    pub processes_stopped: usize,
}

/// Removes the mesh recorded in `run`. Waits up to `grace` for a live orchestrator to tear
/// down by itself before doing it here.
pub fn down(run: &RunDir, grace: Duration) -> Result<DownReport, DownError> {
    let mut report = DownReport::default();
    if let Some(state) = run.load()? {
        report.prefix = Some(state.prefix.clone());
        let me = std::process::id();
        if let Some(o) = state
            .processes
            .iter()
            .find(|p| p.role == Role::Orchestrator && p.pid != me && process::is_alive(p))
        {
            report.orchestrator_stopped = true;
            process::signal(o, Signal::SIGTERM);
            let deadline = Instant::now() + grace;
            while process::is_alive(o) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            process::signal(o, Signal::SIGKILL);
        }
    }
    report.processes_stopped = sweep(run, Duration::from_secs(5))?;
    Ok(report)
}

/// Stops whatever `run`'s state still records (not the calling process), deletes the
/// namespaces and generated files. Returns how many processes it had to stop. Nothing
/// recorded → only the generated files are removed.
pub(crate) fn sweep(run: &RunDir, grace: Duration) -> Result<usize, DownError> {
    let Some(state) = run.load()? else {
        remove_generated(run)?;
        return Ok(0);
    };
    let me = std::process::id();
    // Reverse start order: pods, node components, control plane.
    let records: Vec<ProcessRecord> = state
        .processes
        .iter()
        .rev()
        .filter(|p| p.pid != me && process::is_alive(p))
        .cloned()
        .collect();
    let left = process::stop_all(&records, grace, || {});
    finish(run, &state.prefix, left)?;
    Ok(records.len())
}

/// The last steps of every teardown: fail on surviving processes, delete the namespaces of
/// `prefix`, remove the generated files.
pub(crate) fn finish(
    run: &RunDir,
    prefix: &str,
    left: Vec<ProcessRecord>,
) -> Result<(), DownError> {
    // Namespaces go even if a process survived (it keeps its own namespace alive, but the
    // names and links are gone); report the survivors afterwards.
    ambit_topology::cleanup(prefix)?;
    if !left.is_empty() {
        return Err(DownError::Processes(left.iter().map(|p| p.pid).collect()));
    }
    remove_generated(run)
}

fn remove_generated(run: &RunDir) -> Result<(), DownError> {
    for path in run.generated() {
        let result = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match result {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(DownError::Io { path, source }),
        }
    }
    Ok(())
}
