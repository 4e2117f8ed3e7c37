//! The container runtime's CNI side, as containerd runs it: the loopback network, then the
//! first network configuration list in the node's `/etc/cni/net.d` (lexical order), each
//! plugin executed from the node's `/opt/cni/bin` on the node (its filesystem, its network
//! namespace) with the `CNI_*` environment, the plugin's configuration on standard input
//! (`name`, `cniVersion` of the list, the previous plugin's result as `prevResult`) and its
//! result read from standard output.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use super::node::NodeHost;

/// The node's bin directory, as `CNI_PATH`.
pub const CNI_BIN: &str = "/opt/cni/bin";
/// The node's configuration directory.
pub const CNI_CONF: &str = "/etc/cni/net.d";

/// What the runtime passes about the pod.
#[derive(Debug, Clone)]
pub struct PodRef<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub container_id: &'a str,
    /// The netns path as the node sees it (`/var/run/netns/NAME`).
    pub netns: &'a str,
}

/// The first configuration list of the node and its file name.
pub fn network_config(node: &NodeHost) -> (String, Value) {
    let dir = node.path(CNI_CONF);
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("CNI conf dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".conflist") || n.ends_with(".conf") || n.ends_with(".json"))
        .collect();
    files.sort();
    let first = files
        .first()
        .unwrap_or_else(|| panic!("no CNI network configuration in {}", dir.display()))
        .clone();
    let text = std::fs::read(dir.join(&first)).expect("read conflist");
    let conf: Value = serde_json::from_slice(&text)
        .unwrap_or_else(|e| panic!("{first} on {}: not JSON: {e}", node.name));
    (first, conf)
}

/// Runs one plugin; its result, or what it printed when it failed.
fn exec_plugin(
    node: &NodeHost,
    command: &str,
    conf: &Value,
    pod: &PodRef<'_>,
) -> Result<Value, String> {
    let kind = conf["type"]
        .as_str()
        .ok_or_else(|| format!("plugin without a type: {conf}"))?;
    let program = format!("{CNI_BIN}/{kind}");
    let mut cmd = Command::new(&program);
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin")
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", pod.container_id)
        .env("CNI_NETNS", pod.netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", CNI_BIN)
        .env(
            "CNI_ARGS",
            format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};\
                 K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
                pod.namespace, pod.name, pod.container_id, pod.uid
            ),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    node.sandbox()
        .cwd(std::path::Path::new("/"))
        .apply(&mut cmd)
        .map_err(|e| e.to_string())?;
    let mut child = node
        .spawn(&mut cmd)
        .map_err(|e| format!("starting {program} on {}: {e}", node.name))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(conf.to_string().as_bytes())
            .map_err(|e| format!("{program} stdin: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{program}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "{kind} {command} for {}/{} failed ({}): {stdout}{}",
            pod.namespace,
            pod.name,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    if command == "DEL" || stdout.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(&stdout).map_err(|e| format!("{kind} result is not JSON ({e}): {stdout}"))
}

/// Runs a network list for `command`; ADD returns the last plugin's result.
fn run_list(
    node: &NodeHost,
    command: &str,
    list: &Value,
    pod: &PodRef<'_>,
) -> Result<Value, String> {
    let plugins = list["plugins"]
        .as_array()
        .ok_or_else(|| format!("network list without plugins: {list}"))?;
    let mut prev = Value::Null;
    let order: Vec<&Value> = if command == "DEL" {
        plugins.iter().rev().collect()
    } else {
        plugins.iter().collect()
    };
    for plugin in order {
        let mut conf = plugin.clone();
        conf["name"] = list["name"].clone();
        conf["cniVersion"] = list["cniVersion"].clone();
        if !prev.is_null() {
            conf["prevResult"] = prev.clone();
        }
        let result = exec_plugin(node, command, &conf, pod)?;
        if command == "ADD" {
            prev = result;
        }
    }
    Ok(prev)
}

/// `ADD` of a pod sandbox: loopback, then the node's network list. Returns the pod's IPv4
/// address and the network list's file name.
pub fn add(node: &NodeHost, pod: &PodRef<'_>) -> Result<(std::net::Ipv4Addr, String), String> {
    let loopback = json!({"cniVersion": "1.0.0", "name": "cni-loopback",
                          "plugins": [{"type": "loopback"}]});
    run_list(node, "ADD", &loopback, pod)?;
    let (file, list) = network_config(node);
    let result = run_list(node, "ADD", &list, pod)?;
    let ip = result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str())
        .filter_map(|a| a.split('/').next()?.parse().ok())
        .next()
        .ok_or_else(|| format!("{file}: no IPv4 address in the result {result}"))?;
    Ok((ip, file))
}

/// `DEL` of a pod sandbox (after a failed ADD, as the runtime cleans up): the node's
/// network list in reverse, then loopback.
pub fn del(node: &NodeHost, pod: &PodRef<'_>) -> Result<(), String> {
    let (_, list) = network_config(node);
    run_list(node, "DEL", &list, pod)?;
    let loopback = json!({"cniVersion": "1.0.0", "name": "cni-loopback",
                          "plugins": [{"type": "loopback"}]});
    run_list(node, "DEL", &loopback, pod).map(|_| ())
}

/// The primary network of a node: kindnet-style `ptp` with host-local IPAM over the node's
/// pod range (the machine's containernetworking-plugins).
pub fn primary_conflist(pod_cidr: &str) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "kindnet",
        "plugins": [{
            "type": "ptp",
            "ipMasq": false,
            "mtu": 1500,
            "ipam": {
                "type": "host-local",
                "dataDir": "/var/lib/cni/networks",
                "ranges": [[{"subnet": pod_cidr}]],
                "routes": [{"dst": "0.0.0.0/0"}]
            }
        }]
    })
}

/// The primary CNI's plugins on this machine (Debian's containernetworking-plugins).
pub const PRIMARY_PLUGINS: [&str; 3] = ["loopback", "ptp", "host-local"];
/// Where Debian installs them.
pub const PRIMARY_PLUGIN_DIR: &str = "/usr/lib/cni";
