//! Pieces of the in-pod scenario that are plain data or one-shot commands: the manifests the
//! node agents read, the CNI network configuration a container runtime hands the plugin, the
//! plugin call itself, and the bare network namespaces of the "enrolled pods" measurement.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// The namespace every benchmark pod lives in; labelled for ambient enrolment, so the
/// agent's default enablement selectors pick every pod in it.
pub const NAMESPACE: &str = "default";

/// Where `ip netns` keeps namespaces.
const NETNS_DIR: &str = "/var/run/netns";

/// A pod as the agent and ztunnel know it.
#[derive(Clone, Debug)]
pub struct PodInfo {
    /// Pod name (also its service account, so each pod has its own identity).
    pub name: String,
    /// Node it runs on.
    pub node: String,
    /// Its address (the prevResult IP of its CNI ADD).
    pub ip: Ipv4Addr,
    /// Its network namespace.
    pub netns: PathBuf,
}

impl PodInfo {
    /// `K8S_POD_UID`.
    pub fn uid(&self) -> String {
        format!("uid-{}", self.name)
    }
}

/// `n` extra pods for node `node`, each with a bare network namespace named with the
/// topology's `prefix` (so the topology's teardown deletes them too) and an address from
/// the upper half of the pod range, which no node of a small topology uses (node `i` owns
/// `.(i+1).0/24`). Nothing routes to these addresses: the agent and ztunnel only need the
/// namespace and an address to enrol a pod.
pub fn extra_pods(prefix: &str, pod_net: Ipv4Addr, node: &str, n: usize) -> Result<Vec<PodInfo>> {
    const PER_SUBNET: usize = 250;
    if n > PER_SUBNET * 127 {
        bail!("at most {} extra pods", PER_SUBNET * 127);
    }
    let [a, b, _, _] = pod_net.octets();
    Ok((0..n)
        .map(|i| {
            let third = u8::try_from(128 + i / PER_SUBNET).unwrap_or(255);
            let fourth = u8::try_from(1 + i % PER_SUBNET).unwrap_or(254);
            PodInfo {
                name: format!("extra-{i:05}"),
                node: node.to_string(),
                ip: Ipv4Addr::new(a, b, third, fourth),
                netns: Path::new(NETNS_DIR).join(format!("{prefix}~{node}~x{i}")),
            }
        })
        .collect())
}

/// Creates the namespaces of `pods` (one `ip -batch` process; ~1 ms per namespace).
pub fn create_netns(pods: &[PodInfo]) -> Result<()> {
    if pods.is_empty() {
        return Ok(());
    }
    let lines: String = pods
        .iter()
        .filter_map(|p| p.netns.file_name())
        .map(|n| format!("netns add {}\n", n.to_string_lossy()))
        .collect();
    let mut child = Command::new("ip")
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running ip -batch")?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(lines.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "creating {} namespaces: {}",
            pods.len(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The ambient-labelled namespace object.
pub fn namespace_manifest() -> String {
    format!(
        "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n  labels: {{istio.io/dataplane-mode: ambient}}\n"
    )
}

/// A pod object as the API server holds it *before* its sandbox exists: no IP, no netns
/// hint, so only the CNI ADD (with the netns and the IP) can enrol it.
pub fn pod_manifest(p: &PodInfo) -> String {
    format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NAMESPACE}\n  uid: {uid}\n  labels: {{app: {name}}}\nspec:\n  nodeName: {node}\n  serviceAccountName: {name}\n  containers: [{{name: app, image: x}}]\n",
        name = p.name,
        uid = p.uid(),
        node = p.node,
    )
}

/// One workload of upstream's local-config format (`LOCAL_XDS_PATH`).
pub fn local_workload(p: &PodInfo, trust_domain: &str) -> String {
    format!(
        "- uid: cluster1//v1/Pod/{NAMESPACE}/{name}\n  name: {name}\n  namespace: {NAMESPACE}\n  serviceAccount: {name}\n  trustDomain: {trust_domain}\n  workloadIps: [\"{ip}\"]\n  protocol: HBONE\n  node: {node}\n  canonicalName: {name}\n  canonicalRevision: v1\n  workloadName: {name}\n  workloadType: deployment\n",
        name = p.name,
        ip = p.ip,
        node = p.node,
    )
}

/// The istio-cni network configuration with the primary CNI's result, as the container
/// runtime passes it on stdin (`shared/spec/cni.md` §5).
pub fn cni_config(agent_run_dir: &Path, p: &PodInfo) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "k8s-pod-network",
        "type": "istio-cni",
        "plugin_log_level": "warn",
        "cni_agent_run_dir": agent_run_dir,
        "ambient_enabled": true,
        "exclude_namespaces": ["kube-system"],
        "pod_namespace": "istio-system",
        "prevResult": {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": p.netns}],
            "ips": [{"address": format!("{}/32", p.ip), "interface": 0}],
        }
    })
    .to_string()
}

/// Runs the CNI plugin (`cmd`: the plugin executable, started in the node's namespace) for
/// an ADD of `p`, as a container runtime does: CNI_* environment, configuration on stdin.
/// Fails unless the plugin succeeds (which it only does once ztunnel acked the pod).
pub fn cni_add(mut cmd: Command, agent_run_dir: &Path, p: &PodInfo) -> Result<()> {
    let container = format!("sandbox-{}", p.name);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", &container)
        .env("CNI_NETNS", &p.netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/opt/cni/bin")
        .env(
            "CNI_ARGS",
            format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE={NAMESPACE};K8S_POD_NAME={};K8S_POD_UID={};K8S_POD_INFRA_CONTAINER_ID={container}",
                p.name,
                p.uid()
            ),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().context("starting the CNI plugin")?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(cni_config(agent_run_dir, p).as_bytes())?;
    }
    // The plugin bounds its own wait for the agent; this bounds the plugin.
    let out = wait_output(child, Duration::from_secs(60))?;
    if !out.status.success() {
        bail!(
            "CNI ADD of pod {} failed ({}): {}{}",
            p.name,
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// `wait_with_output` with a deadline: a plugin that hangs is killed and reported.
fn wait_output(child: std::process::Child, timeout: Duration) -> Result<std::process::Output> {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(out) => {
            let _ = waiter.join();
            Ok(out?)
        }
        Err(_) => {
            // Our own child, not reaped yet (the waiter thread is still waiting for it), so
            // the pid cannot have been reused.
            if let Ok(pid) = libc::pid_t::try_from(pid) {
                // SAFETY: kill(2) takes plain integers and touches no memory of ours.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            let _ = waiter.join();
            bail!("CNI plugin did not finish within {timeout:?}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_pods_get_distinct_addresses_outside_node_subnets() {
        let pods = extra_pods("amtest", Ipv4Addr::new(198, 19, 0, 0), "node2", 1000).unwrap();
        let mut ips: Vec<Ipv4Addr> = pods.iter().map(|p| p.ip).collect();
        ips.sort();
        ips.dedup();
        assert_eq!(ips.len(), 1000);
        assert!(
            ips.iter()
                .all(|ip| ip.octets()[2] >= 128 && ip.octets()[3] >= 1)
        );
        assert_eq!(
            pods[3].netns,
            PathBuf::from("/var/run/netns/amtest~node2~x3")
        );
    }

    #[test]
    fn cni_config_carries_the_netns_and_ip() {
        let p = PodInfo {
            name: "server".into(),
            node: "node2".into(),
            ip: Ipv4Addr::new(198, 19, 2, 2),
            netns: "/var/run/netns/x~node2~server".into(),
        };
        let v: serde_json::Value =
            serde_json::from_str(&cni_config(Path::new("/tmp/cni"), &p)).unwrap();
        assert_eq!(v["prevResult"]["ips"][0]["address"], "198.19.2.2/32");
        assert_eq!(
            v["prevResult"]["interfaces"][0]["sandbox"],
            "/var/run/netns/x~node2~server"
        );
        assert_eq!(v["cni_agent_run_dir"], "/tmp/cni");
        assert!(pod_manifest(&p).contains("serviceAccountName: server"));
        assert!(!pod_manifest(&p).contains("podIP"));
    }
}
