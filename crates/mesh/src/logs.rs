//! `ambit logs`: which log file in the run directory belongs to a component.
//!
//! Components are named `control`, `agent-NODE`, `ztunnel-NODE` and pods by `NAME` or
//! `NAMESPACE/NAME`. With a recorded mesh the names come from `state.json`; after `down`
//! (the logs are kept) they are derived from the file names in `logs/`.

use std::path::PathBuf;

use crate::state::{ProcessRecord, Role, RunDir, StateError};

/// Why no log could be chosen.
#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("no component {component:?} in {run_dir}; known: {known}")]
    Unknown {
        component: String,
        run_dir: PathBuf,
        known: String,
    },
}

/// A component's user-facing name(s) and its log file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFile {
    /// The canonical name (`control`, `agent-node1`, `ztunnel-node1`, `demo/client`).
    pub name: String,
    /// Other names that select it (a pod's bare name).
    pub aliases: Vec<String>,
    pub path: PathBuf,
}

fn from_record(rec: &ProcessRecord) -> Option<LogFile> {
    let path = rec.log.clone()?;
    let (name, aliases) = match &rec.role {
        Role::Orchestrator => return None,
        Role::Control => ("control".to_owned(), vec![]),
        Role::Agent { node } => (format!("agent-{node}"), vec![format!("cni-agent-{node}")]),
        Role::Ztunnel { node } => (format!("ztunnel-{node}"), vec![]),
        Role::Pod { namespace, name } => (format!("{namespace}/{name}"), vec![name.clone()]),
        // `vm up` with the VM's ztunnel; the VM's command is named like a pod's process.
        Role::Vm { namespace, name } => {
            (format!("vm-{namespace}/{name}"), vec![format!("vm-{name}")])
        }
        Role::VmCommand { namespace, name } => (format!("{namespace}/{name}"), vec![name.clone()]),
    };
    Some(LogFile {
        name,
        aliases,
        path,
    })
}

fn from_file_name(path: PathBuf) -> Option<LogFile> {
    let stem = path.file_name()?.to_str()?.strip_suffix(".log")?.to_owned();
    let (name, aliases) = if let Some(node) = stem.strip_prefix("cni-agent-") {
        (format!("agent-{node}"), vec![stem.clone()])
    } else if let Some(pod) = stem.strip_prefix("pod-") {
        (pod.to_owned(), vec![])
    } else {
        (stem, vec![])
    };
    Some(LogFile {
        name,
        aliases,
        path,
    })
}

/// Every component with a log in `run` (the latest process of each, e.g. after a restart).
pub fn list(run: &RunDir) -> Result<Vec<LogFile>, LogsError> {
    let mut out: Vec<LogFile> = Vec::new();
    if let Some(state) = run.load()? {
        for f in state.processes.iter().filter_map(from_record) {
            out.retain(|o| o.name != f.name);
            out.push(f);
        }
    } else if let Ok(dir) = std::fs::read_dir(run.logs()) {
        out.extend(dir.flatten().filter_map(|e| from_file_name(e.path())));
        out.sort_by(|a, b| a.name.cmp(&b.name));
    }
    Ok(out)
}

/// The log of `component`; an unknown name is an error listing the known ones.
pub fn find(run: &RunDir, component: &str) -> Result<LogFile, LogsError> {
    let all = list(run)?;
    let hits: Vec<&LogFile> = all
        .iter()
        .filter(|f| f.name == component || f.aliases.iter().any(|a| a == component))
        .collect();
    match hits.as_slice() {
        [one] => Ok((*one).clone()),
        _ => Err(LogsError::Unknown {
            component: component.to_owned(),
            run_dir: run.root().to_path_buf(),
            known: if all.is_empty() {
                "none".to_owned()
            } else {
                all.iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_files_after_down() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let run = RunDir::new(tmp.path());
        std::fs::create_dir_all(run.logs()).unwrap_or_else(|e| panic!("{e}"));
        for f in [
            "control.log",
            "cni-agent-node1.log",
            "ztunnel-node1.log",
            "pod-demo-client.log",
        ] {
            std::fs::write(run.logs().join(f), "x").unwrap_or_else(|e| panic!("{e}"));
        }
        let names: Vec<String> = list(&run)
            .unwrap_or_else(|e| panic!("{e}"))
            .into_iter()
            .map(|f| f.name)
            .collect();
        assert_eq!(
            names,
            ["agent-node1", "control", "demo-client", "ztunnel-node1"]
        );
        let f = find(&run, "agent-node1").unwrap_or_else(|e| panic!("{e}"));
        assert!(f.path.ends_with("cni-agent-node1.log"));
        let err = find(&run, "nope").err().map(|e| e.to_string());
        let err = err.unwrap_or_default();
        assert!(
            err.contains("ztunnel-node1") && err.contains("nope"),
            "{err}"
        );
    }
}
