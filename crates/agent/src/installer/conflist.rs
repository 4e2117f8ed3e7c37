//! CNI config insertion (`spec/cni.md` §5.5), as pure file operations; the installer
//! ([`super`]) decides when to run them.
//!
//! Chained (default): the istio-cni entry is appended last to the primary network's plugin
//! list. The primary config is `CNI_CONF_NAME` or the lexicographically first valid
//! `.conf`/`.conflist` in the directory. A `.conf` is wrapped into a list named
//! `k8s-pod-network` and renamed to `.conflist`; an existing `istio-cni` entry is replaced;
//! the entry loses its `cniVersion` (the list's applies). Istio-owned: the same list is
//! written to our own file instead (mode 0600/0640), the primary is left alone.
//! Standalone: a file with only the entry. Every mode is computed as a [`ConfPlan`] first,
//! so an unchanged directory is never rewritten (other node agents watch it). Writes are
//! atomic (temp file + rename) and keep the primary file's mode.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

/// Errors installing the CNI config.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// No valid primary config exists yet (the caller waits for one and retries).
    #[error("no valid .conf/.conflist in {0}")]
    NoPrimary(PathBuf),
    /// The entry to insert is not a JSON object.
    #[error("the istio-cni entry must be a JSON object")]
    BadEntry,
    /// A file operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What we were doing.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// Type of the plugin entry we own.
pub const ISTIO_CNI_TYPE: &str = "istio-cni";

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> InstallError {
    let path = path.to_owned();
    move |source| InstallError::Io { what, path, source }
}

/// Whether `v` is a usable config of the kind its extension says.
fn valid(path: &Path, v: &Value) -> bool {
    match path.extension().and_then(|e| e.to_str()) {
        Some("conflist") => v.get("plugins").and_then(Value::as_array).is_some(),
        Some("conf") => v.get("type").and_then(Value::as_str).is_some(),
        _ => false,
    }
}

/// Reads `path` as JSON, `None` when missing or not JSON.
fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_slice(&fs::read(path).ok()?).ok()
}

/// With `CNI_CONF_NAME`, the named file, or its `.conf`/`.conflist` twin once our own
/// insertion renamed it (upstream looks for both too).
fn named_candidates(conf_dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = vec![conf_dir.join(name)];
    if let Some(stem) = name.strip_suffix(".conf") {
        out.push(conf_dir.join(format!("{stem}.conflist")));
    } else if let Some(stem) = name.strip_suffix(".conflist") {
        out.push(conf_dir.join(format!("{stem}.conf")));
    }
    out
}

/// Finds the primary config: `name` when given, else the first valid file by name,
/// never the file called `skip` (the Istio-owned copy).
fn primary(
    conf_dir: &Path,
    name: Option<&str>,
    skip: Option<&str>,
) -> Result<(PathBuf, Value), InstallError> {
    let mut candidates: Vec<PathBuf> = match name {
        Some(n) => named_candidates(conf_dir, n),
        None => {
            let entries = fs::read_dir(conf_dir).map_err(io_err("listing", conf_dir))?;
            let mut all: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .filter(|p| skip.is_none_or(|s| p.file_name().is_none_or(|n| n != s)))
                .collect();
            all.sort();
            all
        }
    };
    // A named file keeps its own order (the name first, then its twin).
    if name.is_none() {
        candidates.sort();
    }
    for path in candidates {
        if let Some(v) = read_json(&path)
            && valid(&path, &v)
        {
            return Ok((path, v));
        }
    }
    Err(InstallError::NoPrimary(conf_dir.to_owned()))
}

/// The name of the first valid `.conf`/`.conflist` in `conf_dir` (what the runtime uses).
pub fn first_valid(conf_dir: &Path) -> Option<PathBuf> {
    primary(conf_dir, None, None).ok().map(|(p, _)| p)
}

/// Inserts `entry` into the primary config in `conf_dir`; returns the file written.
pub fn install_conflist(conf_dir: &Path, entry: &Value) -> Result<PathBuf, InstallError> {
    install_conflist_named(conf_dir, None, entry)
}

/// Like [`install_conflist`] with `CNI_CONF_NAME` naming the primary file.
pub fn install_conflist_named(
    conf_dir: &Path,
    conf_name: Option<&str>,
    entry: &Value,
) -> Result<PathBuf, InstallError> {
    let plan = plan_conf(conf_dir, conf_name, &ConfMode::Chained, entry)?;
    plan.write()?;
    Ok(plan.path)
}

/// How the istio-cni entry reaches the container runtime (§5.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfMode {
    /// Appended to the primary network's config (`CHAINED_CNI_PLUGIN=true`, the default).
    Chained,
    /// A copy of the primary list plus the entry, in a file of our own that must sort
    /// first (`ISTIO_OWNED_CNI_CONFIG=true`); the primary file is never modified.
    IstioOwned {
        /// `ISTIO_OWNED_CNI_CONFIG_FILENAME` (default `02-istio-cni.conflist`).
        file_name: String,
        /// `CNI_CONF_GROUP_READ`: mode 0640 instead of 0600.
        group_read: bool,
    },
    /// A file holding only the entry (`CHAINED_CNI_PLUGIN=false`): `CNI_CONF_NAME`,
    /// default `YYY-istio-cni.conf`.
    Standalone,
}

/// Default `CNI_CONF_NAME` of the standalone mode.
pub const STANDALONE_CONF_NAME: &str = "YYY-istio-cni.conf";

/// Default `ISTIO_OWNED_CNI_CONFIG_FILENAME`.
pub const ISTIO_OWNED_CONF_NAME: &str = "02-istio-cni.conflist";

/// Where the entry must be and what the file must hold.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfPlan {
    /// The file to (re)write.
    pub path: PathBuf,
    /// Its desired JSON.
    pub content: Value,
    /// Its mode.
    pub mode: u32,
    /// A file that `path` replaces (a `.conf` primary wrapped into a `.conflist`).
    pub replaces: Option<PathBuf>,
}

impl ConfPlan {
    /// Whether the directory already holds the plan (content compared as JSON, and mode).
    pub fn is_current(&self) -> bool {
        self.replaces.is_none()
            && read_json(&self.path).is_some_and(|v| v == self.content)
            && fs::metadata(&self.path)
                .is_ok_and(|m| m.permissions().mode() & 0o7777 == self.mode & 0o7777)
    }

    /// Writes the plan (atomically) unless it is current; returns whether anything changed.
    pub fn apply(&self) -> Result<bool, InstallError> {
        if self.is_current() {
            return Ok(false);
        }
        self.write()?;
        Ok(true)
    }

    fn write(&self) -> Result<(), InstallError> {
        write_atomic(&self.path, &self.content, self.mode)?;
        if let Some(old) = &self.replaces {
            fs::remove_file(old).map_err(io_err("removing", old))?;
        }
        Ok(())
    }
}

/// The primary's plugin list with every `istio-cni` entry replaced by `entry`, appended
/// last; a `.conf` is wrapped into a list named `k8s-pod-network`.
fn chained_list(path: &Path, current: Value, entry: &Map<String, Value>) -> Value {
    let is_conf = path.extension().and_then(|e| e.to_str()) == Some("conf");
    let mut list = if is_conf {
        json!({"name": "k8s-pod-network", "cniVersion": "0.3.1", "plugins": [current]})
    } else {
        current
    };
    if let Some(plugins) = list.get_mut("plugins").and_then(Value::as_array_mut) {
        plugins.retain(|p| p.get("type").and_then(Value::as_str) != Some(ISTIO_CNI_TYPE));
        plugins.push(Value::Object(entry.clone()));
    }
    list
}

/// Computes where `entry` must go in `conf_dir` for `mode` (no file is written).
/// Chained and Istio-owned modes need a primary config ([`InstallError::NoPrimary`] until
/// one appears).
pub fn plan_conf(
    conf_dir: &Path,
    conf_name: Option<&str>,
    mode: &ConfMode,
    entry: &Value,
) -> Result<ConfPlan, InstallError> {
    let mut entry: Map<String, Value> = entry.as_object().cloned().ok_or(InstallError::BadEntry)?;
    match mode {
        ConfMode::Standalone => {
            entry
                .entry("cniVersion")
                .or_insert_with(|| Value::from("0.3.1"));
            Ok(ConfPlan {
                path: conf_dir.join(conf_name.unwrap_or(STANDALONE_CONF_NAME)),
                content: Value::Object(entry),
                mode: 0o644,
                replaces: None,
            })
        }
        ConfMode::Chained => {
            entry.remove("cniVersion");
            let (path, current) = primary(conf_dir, conf_name, None)?;
            let mode = fs::metadata(&path)
                .map_err(io_err("reading mode of", &path))?
                .permissions()
                .mode();
            let is_conf = path.extension().and_then(|e| e.to_str()) == Some("conf");
            let content = chained_list(&path, current, &entry);
            Ok(if is_conf {
                ConfPlan {
                    path: path.with_extension("conflist"),
                    content,
                    mode,
                    replaces: Some(path),
                }
            } else {
                ConfPlan {
                    path,
                    content,
                    mode,
                    replaces: None,
                }
            })
        }
        ConfMode::IstioOwned {
            file_name,
            group_read,
        } => {
            entry.remove("cniVersion");
            let (path, current) = primary(conf_dir, conf_name, Some(file_name))?;
            Ok(ConfPlan {
                path: conf_dir.join(file_name),
                content: chained_list(&path, current, &entry),
                mode: if *group_read { 0o640 } else { 0o600 },
                replaces: None,
            })
        }
    }
}

/// Undoes `mode`'s install (uninstall, §1.10): chained removes every `istio-cni` entry
/// ([`uninstall_conflist`]); Istio-owned deletes the owned file; standalone deletes its
/// file if it is an `istio-cni` config. Returns the files changed or deleted.
pub fn uninstall_conf(
    conf_dir: &Path,
    conf_name: Option<&str>,
    mode: &ConfMode,
) -> Result<Vec<PathBuf>, InstallError> {
    let remove_if = |path: PathBuf, ours: bool| -> Result<Vec<PathBuf>, InstallError> {
        if !ours {
            return Ok(Vec::new());
        }
        match fs::remove_file(&path) {
            Ok(()) => Ok(vec![path]),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(io_err("removing", &path)(e)),
        }
    };
    match mode {
        ConfMode::Chained => uninstall_conflist(conf_dir, conf_name),
        ConfMode::IstioOwned { file_name, .. } => remove_if(conf_dir.join(file_name), true),
        ConfMode::Standalone => {
            let path = conf_dir.join(conf_name.unwrap_or(STANDALONE_CONF_NAME));
            let ours = read_json(&path)
                .is_some_and(|v| v.get("type").and_then(Value::as_str) == Some(ISTIO_CNI_TYPE));
            remove_if(path, ours)
        }
    }
}

/// Writes `v` as pretty JSON to `target` via a temp file + rename, with `mode`.
fn write_atomic(target: &Path, v: &Value, mode: u32) -> Result<(), InstallError> {
    let mut text = serde_json::to_vec_pretty(v).map_err(|e| InstallError::Io {
        what: "encoding",
        path: target.to_owned(),
        source: io::Error::other(e),
    })?;
    text.push(b'\n');
    write_bytes_atomic(target, &text, mode)
}

/// Writes `bytes` to `target` atomically: a hidden temp file beside it (created with
/// `mode`, so secrets are never readable by others, and synced), then a rename. The temp
/// file is removed when a step fails.
pub(crate) fn write_bytes_atomic(
    target: &Path,
    bytes: &[u8],
    mode: u32,
) -> Result<(), InstallError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = target.with_file_name(format!(
        ".{}.tmp.{}",
        target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode & 0o7777)
            .open(&tmp)
            .map_err(io_err("creating", &tmp))?;
        f.write_all(bytes).map_err(io_err("writing", &tmp))?;
        // The umask may have narrowed the mode at creation, and a stale temp file keeps
        // its old one: set it explicitly.
        f.set_permissions(fs::Permissions::from_mode(mode & 0o7777))
            .map_err(io_err("setting mode of", &tmp))?;
        f.sync_all().map_err(io_err("syncing", &tmp))?;
        fs::rename(&tmp, target).map_err(io_err("renaming onto", target))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// The inverse of [`install_conflist`] (uninstall, §1.10): removes every `istio-cni` entry
/// from the `.conflist` files in `conf_dir` (only `conf_name` when given). A list left
/// with no plugins was ours alone and is deleted. Returns the files changed or deleted;
/// a missing directory means nothing to undo.
pub fn uninstall_conflist(
    conf_dir: &Path,
    conf_name: Option<&str>,
) -> Result<Vec<PathBuf>, InstallError> {
    let mut candidates: Vec<PathBuf> = match conf_name {
        Some(n) => vec![conf_dir.join(n)],
        None => match fs::read_dir(conf_dir) {
            Ok(entries) => entries.filter_map(|e| e.ok().map(|e| e.path())).collect(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("listing", conf_dir)(e)),
        },
    };
    candidates.sort();
    let mut changed = Vec::new();
    for path in candidates {
        let Ok(text) = fs::read(&path) else { continue };
        let Ok(mut list) = serde_json::from_slice::<Value>(&text) else {
            continue;
        };
        if !valid(&path, &list) || path.extension().and_then(|e| e.to_str()) != Some("conflist") {
            continue;
        }
        let Some(plugins) = list.get_mut("plugins").and_then(Value::as_array_mut) else {
            continue;
        };
        let before = plugins.len();
        plugins.retain(|p| p.get("type").and_then(Value::as_str) != Some(ISTIO_CNI_TYPE));
        if plugins.len() == before {
            continue;
        }
        if plugins.is_empty() {
            fs::remove_file(&path).map_err(io_err("removing", &path))?;
        } else {
            let mode = fs::metadata(&path)
                .map_err(io_err("reading mode of", &path))?
                .permissions()
                .mode();
            write_atomic(&path, &list, mode)?;
        }
        changed.push(path);
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_then_uninstall_restores_primary() {
        let entry = json!({"type": ISTIO_CNI_TYPE, "cniVersion": "1.0.0", "ambient_enabled": true});
        let bridge = json!({"type": "bridge", "bridge": "cni0"});
        // (file name, initial content, after uninstall: Some(plugin types) or None = deleted)
        let cases: Vec<(&str, Value, Option<Vec<&str>>)> = vec![
            (
                "10-net.conflist",
                json!({"cniVersion": "1.0.0", "name": "net", "plugins": [bridge.clone()]}),
                Some(vec!["bridge"]),
            ),
            (
                "10-net.conf",
                json!({"cniVersion": "0.3.1", "name": "net", "type": "bridge"}),
                Some(vec!["bridge"]),
            ),
            (
                "10-only-istio.conflist",
                json!({"cniVersion": "1.0.0", "name": "net", "plugins": []}),
                None,
            ),
        ];
        for (name, content, want) in cases {
            let dir = tempfile::tempdir().unwrap();
            fs::write(dir.path().join(name), content.to_string()).unwrap();
            let target = install_conflist(dir.path(), &entry).unwrap();
            assert_eq!(
                uninstall_conflist(dir.path(), None).unwrap(),
                vec![target.clone()],
                "{name}"
            );
            match want {
                None => assert!(!target.exists(), "{name}"),
                Some(types) => {
                    let v: Value = serde_json::from_slice(&fs::read(&target).unwrap()).unwrap();
                    let got: Vec<&str> = v["plugins"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter_map(|p| p["type"].as_str())
                        .collect();
                    assert_eq!(got, types, "{name}");
                }
            }
            // Idempotent.
            assert!(
                uninstall_conflist(dir.path(), None).unwrap().is_empty(),
                "{name}"
            );
        }
        let missing = std::path::Path::new("/nonexistent/ambit/net.d");
        assert!(uninstall_conflist(missing, None).unwrap().is_empty());
    }
}
