//! What the agent reads from containerd's CRI on Windows (`spec/windows.md` §1.3): a
//! sandbox's HNS namespace is in the verbose `PodSandboxStatus` answer, under `info["info"]`,
//! as containerd's sandbox-info JSON whose `runtimeSpec.windows.network.networkNamespace`
//! is the namespace GUID. Pure parsing, tested on Linux; `runtimeSpec` may be absent or null
//! for a half-created sandbox (upstream dereferences it unguarded).

use ambit_netns::guid::{Guid, GuidError};
use serde::Deserialize;

/// Why a sandbox's info does not name a namespace.
#[derive(Debug, thiserror::Error)]
pub enum SandboxInfoError {
    /// The verbose answer has no `info` entry.
    #[error("sandbox {0}: no \"info\" in the verbose status")]
    NoInfo(String),
    /// `info` is not containerd's JSON.
    #[error("sandbox {sandbox}: unreadable sandbox info: {source}")]
    Json {
        /// The sandbox ID.
        sandbox: String,
        /// The parser's complaint.
        source: serde_json::Error,
    },
    /// No runtime spec yet (a sandbox being created or torn down).
    #[error("sandbox {0}: no runtime spec yet")]
    NoRuntimeSpec(String),
    /// The spec names no Windows network namespace.
    #[error("sandbox {0}: no windows.network.networkNamespace in the runtime spec")]
    NoNamespace(String),
    /// The namespace is not a GUID.
    #[error("sandbox {sandbox}: {source}")]
    BadGuid {
        /// The sandbox ID.
        sandbox: String,
        /// The bad value.
        source: GuidError,
    },
}

#[derive(Deserialize)]
struct Info {
    #[serde(rename = "runtimeSpec", default)]
    runtime_spec: Option<Spec>,
}

#[derive(Deserialize)]
struct Spec {
    #[serde(default)]
    windows: Option<Windows>,
}

#[derive(Deserialize)]
struct Windows {
    #[serde(default)]
    network: Option<Network>,
}

#[derive(Deserialize)]
struct Network {
    #[serde(rename = "networkNamespace", default)]
    network_namespace: Option<String>,
}

/// The HNS namespace of a sandbox from its verbose status `info` map (key `"info"`).
pub fn sandbox_namespace(
    sandbox: &str,
    info: &std::collections::HashMap<String, String>,
) -> Result<Guid, SandboxInfoError> {
    let json = info
        .get("info")
        .ok_or_else(|| SandboxInfoError::NoInfo(sandbox.to_owned()))?;
    let parsed: Info = serde_json::from_str(json).map_err(|source| SandboxInfoError::Json {
        sandbox: sandbox.to_owned(),
        source,
    })?;
    let spec = parsed
        .runtime_spec
        .ok_or_else(|| SandboxInfoError::NoRuntimeSpec(sandbox.to_owned()))?;
    let ns = spec
        .windows
        .and_then(|w| w.network)
        .and_then(|n| n.network_namespace)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| SandboxInfoError::NoNamespace(sandbox.to_owned()))?;
    ns.parse().map_err(|source| SandboxInfoError::BadGuid {
        sandbox: sandbox.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::HashMap;

    use super::*;

    const GUID: &str = "0b1c5a7e-3d2f-4e6a-9b8c-1d2e3f405162";

    fn info(json: &str) -> HashMap<String, String> {
        [("info".to_owned(), json.to_owned())].into()
    }

    #[test]
    fn reads_the_namespace_and_refuses_what_is_not_there() {
        let full = format!(
            r#"{{"pid":4242,"processStatus":"running","netNamespaceClosed":false,"image":"pause",
               "snapshotKey":"k","snapshotter":"windows","runtimeHandler":"","runtimeType":"io.containerd.runhcs.v1",
               "runtimeOptions":null,"config":{{"metadata":{{"name":"p"}}}},
               "runtimeSpec":{{"ociVersion":"1.1.0","windows":{{"layerFolders":null,
               "network":{{"allowUnqualifiedDNSQuery":true,"networkNamespace":"{{{}}}"}}}}}}}}"#,
            GUID.to_uppercase()
        );
        assert_eq!(
            sandbox_namespace("s", &info(&full)).unwrap().to_string(),
            GUID
        );
        type Check = fn(&SandboxInfoError) -> bool;
        let cases: Vec<(&str, HashMap<String, String>, Check)> = vec![
            ("no info", HashMap::new(), |e| {
                matches!(e, SandboxInfoError::NoInfo(_))
            }),
            ("not json", info("{"), |e| {
                matches!(e, SandboxInfoError::Json { .. })
            }),
            ("no spec", info(r#"{"pid":1}"#), |e| {
                matches!(e, SandboxInfoError::NoRuntimeSpec(_))
            }),
            ("null spec", info(r#"{"runtimeSpec":null}"#), |e| {
                matches!(e, SandboxInfoError::NoRuntimeSpec(_))
            }),
            ("linux spec", info(r#"{"runtimeSpec":{"linux":{}}}"#), |e| {
                matches!(e, SandboxInfoError::NoNamespace(_))
            }),
            (
                "empty ns",
                info(r#"{"runtimeSpec":{"windows":{"network":{"networkNamespace":""}}}}"#),
                |e| matches!(e, SandboxInfoError::NoNamespace(_)),
            ),
            (
                "bad guid",
                info(r#"{"runtimeSpec":{"windows":{"network":{"networkNamespace":"x"}}}}"#),
                |e| matches!(e, SandboxInfoError::BadGuid { .. }),
            ),
        ];
        for (name, info, check) in cases {
            let err = sandbox_namespace("sb-1", &info).unwrap_err();
            assert!(check(&err), "{name}: {err}");
            assert!(
                err.to_string().contains("sb-1"),
                "{name}: names the sandbox: {err}"
            );
        }
    }
}
