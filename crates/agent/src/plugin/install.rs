//! Chained CNI config insertion (`spec/cni.md` §5.5, default mode): the istio-cni entry is
//! appended last to the primary network's plugin list.
//!
//! The primary config is the lexicographically first valid `.conf`/`.conflist` in the
//! directory. A `.conf` is wrapped into a list named `k8s-pod-network` and renamed to
//! `.conflist`; an existing `istio-cni` entry is replaced; the entry loses its
//! `cniVersion` (the list's applies). Writes are atomic (temp file + rename) and keep the
//! primary file's mode.

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

/// Finds the primary config: `name` when given, else the first valid file by name.
fn primary(conf_dir: &Path, name: Option<&str>) -> Result<(PathBuf, Value), InstallError> {
    let mut candidates: Vec<PathBuf> = match name {
        Some(n) => vec![conf_dir.join(n)],
        None => {
            let entries = fs::read_dir(conf_dir).map_err(io_err("listing", conf_dir))?;
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .collect()
        }
    };
    candidates.sort();
    for path in candidates {
        let Ok(text) = fs::read(&path) else { continue };
        if let Ok(v) = serde_json::from_slice::<Value>(&text)
            && valid(&path, &v)
        {
            return Ok((path, v));
        }
    }
    Err(InstallError::NoPrimary(conf_dir.to_owned()))
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
    let mut entry: Map<String, Value> = entry.as_object().cloned().ok_or(InstallError::BadEntry)?;
    entry.remove("cniVersion");
    let (path, current) = primary(conf_dir, conf_name)?;
    let mode = fs::metadata(&path)
        .map_err(io_err("reading mode of", &path))?
        .permissions()
        .mode();

    let is_conf = path.extension().and_then(|e| e.to_str()) == Some("conf");
    let mut list = if is_conf {
        json!({"name": "k8s-pod-network", "cniVersion": "0.3.1", "plugins": [current]})
    } else {
        current
    };
    if let Some(plugins) = list.get_mut("plugins").and_then(Value::as_array_mut) {
        plugins.retain(|p| p.get("type").and_then(Value::as_str) != Some(ISTIO_CNI_TYPE));
        plugins.push(Value::Object(entry));
    }
    let target = if is_conf {
        path.with_extension("conflist")
    } else {
        path.clone()
    };
    write_atomic(&target, &list, mode)?;
    if is_conf {
        fs::remove_file(&path).map_err(io_err("removing", &path))?;
    }
    Ok(target)
}

/// Writes `v` as pretty JSON to `target` via a temp file + rename, with `mode`.
fn write_atomic(target: &Path, v: &Value, mode: u32) -> Result<(), InstallError> {
    let mut text = serde_json::to_vec_pretty(v).map_err(|e| InstallError::Io {
        what: "encoding",
        path: target.to_owned(),
        source: io::Error::other(e),
    })?;
    text.push(b'\n');
    let tmp = target.with_file_name(format!(
        ".{}.tmp.{}",
        target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    fs::write(&tmp, &text).map_err(io_err("writing", &tmp))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode & 0o7777))
        .map_err(io_err("setting mode of", &tmp))?;
    fs::rename(&tmp, target).map_err(io_err("renaming onto", target))
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
