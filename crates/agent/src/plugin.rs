//! The `istio-cni` CNI plugin (`spec/cni.md` §5): [`plugin_main`] turns the CNI
//! environment and stdin into an exit code and stdout bytes, with no global state, so it is
//! tested as a pure function and the `ambit cni-plugin` binary only forwards to it.
//!
//! Deviation from upstream (documented in the crate docs too): upstream's plugin asks the
//! Kubernetes API server whether the pod is ambient and only then POSTs `/cmdadd`. ambit
//! has no API server in its embedded mesh, so the plugin POSTs for every pod that is not
//! excluded (self-pod, empty name/namespace, `exclude_namespaces`) and the agent, which
//! knows every pod from its pod source, answers 200 without enrolling pods that are not
//! ambient. The failure policy stays fail-closed: any transport error or non-200 answer
//! fails the ADD.

pub(crate) mod client;
mod conf;
pub mod log;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

pub use conf::{CmdAddIp, CmdAddIpNet, CmdAddRequest, PluginConf, parse as parse_config};

/// CNI spec versions this plugin accepts and can print results in.
pub const SUPPORTED_VERSIONS: &[&str] = &[
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// How long the plugin waits for the agent (upstream's 5 s client timeout).
pub const AGENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Name of the agent's plugin-event socket inside `cni_agent_run_dir`.
pub const PLUGIN_SOCKET: &str = "pluginevent.sock";

/// A CNI error: printed as JSON on stdout with exit code 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg}: {details}")]
pub struct CniError {
    /// CNI well-known error code (spec "Error" section).
    pub code: u32,
    /// Short message.
    pub msg: String,
    /// Longer explanation.
    pub details: String,
}

/// CNI error codes we use.
pub mod codes {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Invalid necessary environment variables.
    pub const INVALID_ENV: u32 = 4;
    /// Failed to decode content.
    pub const DECODE: u32 = 6;
    /// Invalid network config.
    pub const INVALID_CONFIG: u32 = 7;
    /// Try again later (the agent could not enrol the pod yet).
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// Internal error (libcni's code for plain errors).
    pub const INTERNAL: u32 = 999;
}

impl CniError {
    fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }
}

/// Runs one plugin invocation. `env` is the process environment (only the `CNI_*`
/// variables are read), `stdin` the network configuration. Returns the exit code and what
/// to print on stdout. Never panics on bad input.
pub fn plugin_main(env: &[(String, String)], stdin: &[u8]) -> (i32, Vec<u8>) {
    let env: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    // The error JSON carries the config's version when it could be read.
    let version = serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| "1.0.0".to_owned());
    let outcome = run(&env, stdin);
    report(&env, stdin, outcome.as_ref().err());
    match outcome {
        Ok(out) => (0, out),
        Err(e) => {
            let body = json!({
                "cniVersion": version,
                "code": e.code,
                "msg": e.msg,
                "details": e.details,
            });
            (1, to_bytes(&body))
        }
    }
}

/// Best-effort: tells the agent's log socket what this invocation did (§5.6). Failures
/// are ignored; logging never changes the CNI result.
fn report(env: &BTreeMap<&str, &str>, stdin: &[u8], err: Option<&CniError>) {
    let command = env.get("CNI_COMMAND").copied().unwrap_or("");
    if command.is_empty() || command == "VERSION" {
        return;
    }
    let Ok(conf) = conf::parse(stdin) else {
        return;
    };
    let args: BTreeMap<&str, &str> = env
        .get("CNI_ARGS")
        .copied()
        .unwrap_or("")
        .split(';')
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let pod = format!(
        "{}/{}",
        args.get("K8S_POD_NAMESPACE").copied().unwrap_or(""),
        args.get("K8S_POD_NAME").copied().unwrap_or("")
    );
    let line = match err {
        None => log::log_line(
            log::Level::Info,
            &format!("{command} done"),
            &[("pod", &pod), ("command", command)],
        ),
        Some(e) => log::log_line(
            log::Level::Error,
            &format!("{command} failed: {e}"),
            &[("pod", &pod), ("command", command)],
        ),
    };
    let _ = log::post_lines(Path::new(&conf.cni_agent_run_dir), &[line]);
}

fn to_bytes(v: &Value) -> Vec<u8> {
    // Serialising a `Value` cannot fail (string keys only).
    serde_json::to_vec(v).unwrap_or_default()
}

fn run(env: &BTreeMap<&str, &str>, stdin: &[u8]) -> Result<Vec<u8>, CniError> {
    let command = env
        .get("CNI_COMMAND")
        .copied()
        .filter(|c| !c.is_empty())
        .ok_or_else(|| CniError::new(codes::INVALID_ENV, "missing CNI_COMMAND", ""))?;
    match command {
        "VERSION" => Ok(to_bytes(&json!({
            "cniVersion": "1.0.0",
            "supportedVersions": SUPPORTED_VERSIONS,
        }))),
        "ADD" => cmd_add(env, stdin),
        // DEL and CHECK are no-ops: teardown is driven by the agent's pod source (§1.7).
        "DEL" | "CHECK" => {
            conf::parse(stdin)?;
            Ok(Vec::new())
        }
        other => Err(CniError::new(
            codes::INVALID_ENV,
            "unknown CNI_COMMAND",
            format!("{other:?} is not ADD, DEL, CHECK or VERSION"),
        )),
    }
}

/// `K8S_POD_NAME` etc. from `CNI_ARGS` (`K=V;K=V`); public as a parse entry point (fuzzing).
pub fn cni_args(raw: &str) -> Result<BTreeMap<&str, &str>, CniError> {
    raw.split(';')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            kv.split_once('=').ok_or_else(|| {
                CniError::new(
                    codes::INVALID_ENV,
                    "invalid CNI_ARGS",
                    format!("{kv:?} is not KEY=VALUE"),
                )
            })
        })
        .collect()
}

fn cmd_add(env: &BTreeMap<&str, &str>, stdin: &[u8]) -> Result<Vec<u8>, CniError> {
    let conf = conf::parse(stdin)?;
    for required in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"] {
        if env.get(required).is_none_or(|v| v.is_empty()) {
            return Err(CniError::new(
                codes::INVALID_ENV,
                format!("missing {required}"),
                "required for ADD",
            ));
        }
    }
    let args = cni_args(env.get("CNI_ARGS").copied().unwrap_or(""))?;
    let pod_name = args.get("K8S_POD_NAME").copied().unwrap_or("");
    let pod_namespace = args.get("K8S_POD_NAMESPACE").copied().unwrap_or("");
    let result = conf.result_output()?;

    // The agent's own pod must start without the agent (it *is* the agent).
    let self_pod = pod_name.starts_with("istio-cni-node-")
        && conf.pod_namespace.as_deref() == Some(pod_namespace);
    let excluded = pod_name.is_empty()
        || pod_namespace.is_empty()
        || conf.exclude_namespaces.iter().any(|n| n == pod_namespace);
    if self_pod || excluded || !conf.ambient_enabled {
        return Ok(result);
    }

    let req = CmdAddRequest {
        netns: env.get("CNI_NETNS").copied().unwrap_or("").to_owned(),
        pod_name: pod_name.to_owned(),
        pod_namespace: pod_namespace.to_owned(),
        ips: conf.prev_ips(),
    };
    let body = serde_json::to_vec(&req)
        .map_err(|e| CniError::new(codes::INTERNAL, "encoding /cmdadd", e.to_string()))?;
    let socket = Path::new(&conf.cni_agent_run_dir).join(PLUGIN_SOCKET);
    let (status, text) = client::post(&socket, "/cmdadd", &body, AGENT_TIMEOUT).map_err(|e| {
        CniError::new(
            codes::TRY_AGAIN_LATER,
            "istio-cni agent unreachable",
            format!("{}: {e}", socket.display()),
        )
    })?;
    if status != 200 {
        return Err(CniError::new(
            codes::TRY_AGAIN_LATER,
            format!("istio-cni agent refused pod {pod_namespace}/{pod_name} ({status})"),
            text,
        ));
    }
    Ok(result)
}
