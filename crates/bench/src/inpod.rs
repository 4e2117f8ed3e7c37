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

/// One workload of upstream's local-config file (`LOCAL_XDS_PATH`,
/// `shared/spec/ztunnel.md` §4.4). Every key is one upstream's parser knows (camelCase,
/// unknown keys rejected there); `services` is required by upstream on each workload, even
/// when empty. The same keys are read back from each proxy's `/config_dump` after start
/// ([`check_loaded`]), so a file a ztunnel misreads fails the run.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalWorkload {
    uid: String,
    name: String,
    namespace: &'static str,
    service_account: String,
    trust_domain: String,
    workload_ips: [String; 1],
    protocol: &'static str,
    node: String,
    canonical_name: String,
    canonical_revision: &'static str,
    workload_name: String,
    workload_type: &'static str,
    /// `namespace/hostname` → {service port: target port}; none here.
    services: std::collections::BTreeMap<String, std::collections::BTreeMap<u16, u16>>,
}

/// `pods` as HBONE workloads, each pod its own service account.
pub fn local_workloads(pods: &[PodInfo], trust_domain: &str) -> Vec<LocalWorkload> {
    pods.iter()
        .map(|p| LocalWorkload {
            uid: workload_uid(&p.name),
            name: p.name.clone(),
            namespace: NAMESPACE,
            service_account: p.name.clone(),
            trust_domain: trust_domain.to_string(),
            workload_ips: [p.ip.to_string()],
            protocol: "HBONE",
            node: p.node.clone(),
            canonical_name: p.name.clone(),
            canonical_revision: "v1",
            workload_name: p.name.clone(),
            workload_type: "deployment",
            services: Default::default(),
        })
        .collect()
}

/// The local-config file with `workloads` and no services or policies.
pub fn local_config(workloads: &[LocalWorkload]) -> Result<String> {
    #[derive(serde::Serialize)]
    struct File<'a> {
        workloads: &'a [LocalWorkload],
        services: [(); 0],
        policies: [(); 0],
    }
    serde_norway::to_string(&File {
        workloads,
        services: [],
        policies: [],
    })
    .context("rendering the local config")
}

/// Checks that a ztunnel's `/config_dump` (JSON) holds every workload of the file with the
/// values written there (the `services` map aside, which dumps differ in rendering).
pub fn check_loaded(dump: &str, workloads: &[LocalWorkload]) -> Result<()> {
    let dump: serde_json::Value = serde_json::from_str(dump).context("config_dump is not JSON")?;
    let listed = dump["workloads"]
        .as_array()
        .context("config_dump has no workloads list")?;
    for w in workloads {
        let want = serde_json::to_value(w)?;
        let got = listed
            .iter()
            .find(|d| d["uid"] == want["uid"])
            .with_context(|| format!("workload {} not loaded", w.uid))?;
        for (key, value) in want.as_object().into_iter().flatten() {
            if key != "services" && &got[key] != value {
                bail!(
                    "workload {}: {key} loaded as {}, written as {value}",
                    w.uid,
                    got[key]
                );
            }
        }
    }
    Ok(())
}

/// The workload uid of pod `name` in the local config (upstream's `cluster//v1/Pod/ns/name`).
pub fn workload_uid(name: &str) -> String {
    format!("cluster1//v1/Pod/{NAMESPACE}/{name}")
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

    fn pods() -> Vec<PodInfo> {
        ["client", "server"]
            .iter()
            .enumerate()
            .map(|(i, name)| PodInfo {
                name: name.to_string(),
                node: format!("node{}", i + 1),
                ip: Ipv4Addr::new(198, 19, 1 + i as u8, 2),
                netns: PathBuf::from("/var/run/netns/x"),
            })
            .collect()
    }

    #[test]
    fn local_config_is_upstreams_format() {
        let workloads = local_workloads(&pods(), "cluster.local");
        let text = local_config(&workloads).unwrap();
        // Upstream refuses a workload without `services` ("missing field services").
        let doc: serde_json::Value = serde_norway::from_str(&text).unwrap();
        for w in doc["workloads"].as_array().unwrap() {
            assert_eq!(w["services"], serde_json::json!({}), "{text}");
        }
        assert_eq!(doc["services"], serde_json::json!([]));
        assert_eq!(doc["policies"], serde_json::json!([]));
        // ambit's ztunnel reads the same file into the workloads meant.
        let loaded = ambit_model::local::LocalConfig::from_yaml(&text).unwrap();
        let ids: Vec<String> = loaded
            .workloads
            .iter()
            .map(|w| format!("{} {:?}", w.identity(), w.addresses))
            .collect();
        assert_eq!(
            ids,
            [
                "spiffe://cluster.local/ns/default/sa/client [198.19.1.2]",
                "spiffe://cluster.local/ns/default/sa/server [198.19.2.2]"
            ]
        );
    }

    #[test]
    fn config_dump_must_hold_every_workload_as_written() {
        let workloads = local_workloads(&pods(), "cluster.local");
        let dumped: Vec<serde_json::Value> = workloads
            .iter()
            .map(|w| serde_json::to_value(w).unwrap())
            .collect();
        let edit = |f: &dyn Fn(&mut Vec<serde_json::Value>)| {
            let mut d = dumped.clone();
            f(&mut d);
            serde_json::json!({ "workloads": d }).to_string()
        };
        let cases: [(&str, String, Option<&str>); 5] = [
            ("as written", edit(&|_| {}), None),
            (
                "services rendered differently",
                edit(&|d| d[0]["services"] = serde_json::json!([])),
                None,
            ),
            (
                "a workload missing",
                edit(&|d| drop(d.pop())),
                Some("server not loaded"),
            ),
            (
                "a value changed",
                edit(&|d| d[1]["workloadType"] = "pod".into()),
                Some("workloadType loaded as \"pod\""),
            ),
            ("no list", "{}".into(), Some("no workloads list")),
        ];
        for (name, dump, want) in cases {
            let got = check_loaded(&dump, &workloads);
            match want {
                None => assert!(got.is_ok(), "{name}: {got:?}"),
                Some(w) => {
                    let e = format!("{:#}", got.expect_err(name));
                    assert!(e.contains(w), "{name}: {e}");
                }
            }
        }
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
