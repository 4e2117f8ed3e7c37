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
    let mut text = serde_json::to_vec_pretty(&list).map_err(|e| InstallError::Io {
        what: "encoding",
        path: target.clone(),
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
    fs::rename(&tmp, &target).map_err(io_err("renaming onto", &target))?;
    if is_conf {
        fs::remove_file(&path).map_err(io_err("removing", &path))?;
    }
    Ok(target)
}
