//! The Windows manifests (`deploy/kubernetes/windows/`, docs/windows.md): valid against the
//! Kubernetes schemas (`kubernetes-validate --strict`, as `kubernetes_manifests.rs`), and the
//! properties a Windows node needs, checked on the parsed objects: every workload of the
//! Linux manifests pinned to `kubernetes.io/os: linux` and every Windows one to `windows`;
//! ztunnel a HostProcess container running as `NT AUTHORITY\SYSTEM` (the policies' exempt
//! SID) on the pipe the agent serves, without `SO_REUSEPORT`; the agent a SYSTEM HostProcess
//! container too, creating that pipe, with the Linux agent's service account and enablement
//! settings, its environment parsing as the Windows agent's configuration, probed and scraped
//! as the Linux agent on the addresses that configuration serves; the hold snippet's init
//! container running `ambit wait-enrolled` on a downward-API file of the pod's annotations
//! before any application container; the Windows ztunnel with the Linux one's service
//! account, istio-ca token and root bundle; the image holding `ambit.exe` where each
//! manifest runs it.

// Unix only: the schema tool is installed by scripts/test on the Linux host.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn objects(files: &[PathBuf]) -> Vec<Value> {
    files
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path).expect("read manifest");
            serde_norway::Deserializer::from_str(&text)
                .map(|d| serde::Deserialize::deserialize(d).expect("YAML"))
                .filter(|v: &Value| !v.is_null())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn windows_objects() -> Vec<Value> {
    let files = yaml_files(&deploy().join("windows"));
    assert!(files.len() >= 2, "Windows manifests missing: {files:?}");
    objects(&files)
}

/// The pod spec of a workload or of a bare Pod.
fn pod_spec(o: &Value) -> &Value {
    if o["kind"] == "Pod" {
        &o["spec"]
    } else {
        &o["spec"]["template"]["spec"]
    }
}

fn name(o: &Value) -> String {
    format!("{} {}", o["kind"], o["metadata"]["name"])
}

fn env<'a>(container: &'a Value, key: &str) -> Option<&'a str> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == key)?["value"]
        .as_str()
}

#[test]
fn windows_manifests_pass_the_kubernetes_schemas() {
    let tool = std::env::var_os("AMBIT_KUBERNETES_VALIDATE")
        .map(PathBuf::from)
        .filter(|p| p.exists());
    let Some(tool) = tool else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: kubernetes-validate is missing (scripts/test installs it; set \
             AMBIT_KUBERNETES_VALIDATE)"
        );
        eprintln!("skipped: AMBIT_KUBERNETES_VALIDATE not set (run scripts/test)");
        return;
    };
    let files = yaml_files(&deploy().join("windows"));
    let out = Command::new(&tool)
        .arg("--strict")
        .args(&files)
        .output()
        .expect("run kubernetes-validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kubernetes-validate failed:\n{text}");
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("ERROR") || l.starts_with("WARN")),
        "{text}"
    );
    let passed = text.lines().filter(|l| l.contains(" passed for ")).count();
    assert_eq!(
        passed,
        objects(&files).len(),
        "every object validated:\n{text}"
    );
}

#[test]
fn every_workload_is_pinned_to_its_os() {
    let workloads = ["DaemonSet", "Deployment", "StatefulSet", "Pod"];
    for (os, objects) in [
        ("linux", objects(&yaml_files(&deploy()))),
        ("windows", windows_objects()),
    ] {
        let pinned: Vec<_> = objects
            .iter()
            .filter(|o| workloads.iter().any(|k| o["kind"] == *k))
            .collect();
        assert!(!pinned.is_empty(), "no {os} workloads");
        for o in pinned {
            assert_eq!(
                pod_spec(o)["nodeSelector"]["kubernetes.io/os"],
                os,
                "{}",
                name(o)
            );
        }
    }
}

/// The Windows DaemonSets by the role they run (`ambit.exe ROLE`).
fn daemonsets(objects: &[Value]) -> Vec<(&Value, String)> {
    objects
        .iter()
        .filter(|o| o["kind"] == "DaemonSet")
        .map(|o| {
            let command = &pod_spec(o)["containers"][0]["command"];
            (o, command[1].as_str().unwrap_or_default().to_owned())
        })
        .collect()
}

#[test]
fn every_windows_daemonset_is_a_system_host_process() {
    let objects = windows_objects();
    let ds = daemonsets(&objects);
    let roles: Vec<&str> = ds.iter().map(|(_, role)| role.as_str()).collect();
    assert_eq!(
        roles,
        ["cni-agent", "ztunnel"],
        "one agent and one ztunnel per node"
    );
    for (o, _) in ds {
        let spec = pod_spec(o);
        let what = name(o);
        assert_eq!(spec["hostNetwork"], true, "{what}");
        let windows = &spec["securityContext"]["windowsOptions"];
        assert_eq!(windows["hostProcess"], true, "{what}");
        // The policies exempt this user's connections (spec/windows.md §3.4); the ZDS pipe
        // admits only SYSTEM and Administrators.
        assert_eq!(windows["runAsUserName"], "NT AUTHORITY\\SYSTEM", "{what}");
        assert_eq!(spec["priorityClassName"], "system-node-critical", "{what}");
        let command: Vec<&str> = spec["containers"][0]["command"]
            .as_array()
            .expect("command")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            command[0].starts_with("%CONTAINER_SANDBOX_MOUNT_POINT%"),
            "{what}: a HostProcess image is mounted there: {command:?}"
        );
        assert_eq!(command.len(), 2, "{what}: {command:?}");
    }
}

/// The Windows agent's configuration from the environment `container` gets (config-map keys
/// from the Linux manifests' `istio-cni-config`), on node `win-1`.
fn agent_config(c: &Value, linux: &[Value]) -> ambit_agent::windows::config::WindowsAgentConfig {
    let config = linux
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "istio-cni-config")
        .expect("istio-cni-config");
    let mut vars = vec![("NODE_NAME".to_owned(), "win-1".to_owned())];
    for e in c["env"].as_array().expect("env") {
        let key = e["name"].as_str().expect("env name").to_owned();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_owned()
        } else if let Some(k) = e["valueFrom"]["configMapKeyRef"]["key"].as_str() {
            assert_eq!(
                e["valueFrom"]["configMapKeyRef"]["name"],
                "istio-cni-config"
            );
            config["data"][k]
                .as_str()
                .unwrap_or_else(|| panic!("{k} not in the config"))
                .to_owned()
        } else {
            continue;
        };
        vars.push((key, value));
    }
    ambit_agent::windows::config::WindowsAgentConfig::from_vars(&vars)
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_windows_agent_serves_ztunnels_pipe_with_the_linux_agents_identity_and_config() {
    let windows = windows_objects();
    let ds = daemonsets(&windows);
    let agent = ds.iter().find(|(_, r)| r == "cni-agent").expect("agent").0;
    let ztunnel = ds.iter().find(|(_, r)| r == "ztunnel").expect("ztunnel").0;
    let spec = pod_spec(agent);
    let c = &spec["containers"][0];
    // The pipe the agent creates is the one ztunnel connects to.
    let pipe = env(c, "ZTUNNEL_UDS_ADDRESS");
    assert_eq!(pipe, Some(ambit_contract::windows::ZDS_PIPE));
    assert_eq!(pipe, env(&pod_spec(ztunnel)["containers"][0], "INPOD_UDS"));
    assert_eq!(
        env(c, "AMBIT_CRI_ENDPOINT"),
        Some(ambit_contract::windows::CRI_PIPE)
    );
    let field = |key: &str| {
        let e = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == key);
        e.map(|e| e["valueFrom"]["fieldRef"]["fieldPath"].clone())
    };
    assert_eq!(field("NODE_NAME"), Some("spec.nodeName".into()));

    // The Linux agent's service account (bound to the ambit-cni ClusterRole: pods and
    // namespaces list/watch, pods/status patch) and its enablement settings.
    let linux = objects(&yaml_files(&deploy()));
    let linux_agent = linux
        .iter()
        .find(|o| o["kind"] == "DaemonSet" && o["metadata"]["name"] == "istio-cni-node")
        .expect("Linux agent");
    assert_eq!(
        spec["serviceAccountName"],
        pod_spec(linux_agent)["serviceAccountName"]
    );
    let binding = linux
        .iter()
        .find(|o| o["kind"] == "ClusterRoleBinding" && o["metadata"]["name"] == "ambit-cni")
        .expect("ambit-cni binding");
    assert_eq!(binding["subjects"][0]["name"], spec["serviceAccountName"]);
    // The environment the container gets parses as the Windows agent's configuration.
    let cfg = agent_config(c, &linux);
    assert_eq!(cfg.enablement.exclude_namespaces, ["kube-system"]);
    assert_eq!(cfg.enablement.selectors.len(), 2);
}

/// The Windows agent's probe, metrics port and scrape annotations are the Linux agent's, on
/// the addresses its configuration serves them: all interfaces, since kubelet probes (and
/// Prometheus scrapes) a HostProcess pod at the node's IP.
#[test]
fn the_windows_agent_is_probed_and_scraped_as_the_linux_agent() {
    let windows = windows_objects();
    let ds = daemonsets(&windows);
    let agent = ds.iter().find(|(_, r)| r == "cni-agent").expect("agent").0;
    let linux = objects(&yaml_files(&deploy()));
    let linux_agent = linux
        .iter()
        .find(|o| o["kind"] == "DaemonSet" && o["metadata"]["name"] == "istio-cni-node")
        .expect("Linux agent");
    let (c, lc) = (
        &pod_spec(agent)["containers"][0],
        &pod_spec(linux_agent)["containers"][0],
    );
    for key in ["readinessProbe", "livenessProbe", "startupProbe", "ports"] {
        assert_eq!(c[key], lc[key], "{key}");
    }
    let annotations = |o: &Value| {
        let a = o["spec"]["template"]["metadata"]["annotations"].as_object();
        let a = a.expect("annotations").clone();
        a.into_iter()
            .filter(|(k, _)| k.starts_with("prometheus.io/"))
            .collect::<Vec<_>>()
    };
    assert_eq!(annotations(agent).len(), 3);
    assert_eq!(annotations(agent), annotations(linux_agent));

    let cfg = agent_config(c, &linux);
    let probe = &c["readinessProbe"]["httpGet"];
    assert_eq!(probe["path"], "/readyz");
    assert_eq!(probe["port"], cfg.health_addr.port());
    assert!(cfg.health_addr.ip().is_unspecified(), "{}", cfg.health_addr);
    assert_eq!(c["ports"][0]["containerPort"], cfg.metrics_addr.port());
    assert!(
        cfg.metrics_addr.ip().is_unspecified(),
        "{}",
        cfg.metrics_addr
    );
}

#[test]
fn windows_ztunnel_is_on_the_agents_pipe() {
    let objects = windows_objects();
    let ds: Vec<_> = daemonsets(&objects)
        .into_iter()
        .filter(|(_, role)| role == "ztunnel")
        .map(|(o, _)| o)
        .collect();
    assert!(!ds.is_empty(), "no Windows ztunnel DaemonSet");
    for o in ds {
        let spec = pod_spec(o);
        let what = name(o);
        let c = &spec["containers"][0];
        assert_eq!(
            env(c, "INPOD_UDS"),
            Some(ambit_contract::windows::ZDS_PIPE),
            "{what}"
        );
        assert_eq!(env(c, "INPOD_ENABLED"), Some("true"), "{what}");
        // Refused on Windows when true (its default): no SO_REUSEPORT hand-off there.
        assert_eq!(env(c, "INPOD_PORT_REUSE"), Some("false"), "{what}");
        assert_eq!(env(c, "IPV6_ENABLED"), Some("false"), "{what}");
        assert_eq!(
            env(c, "PACKET_MARK"),
            None,
            "{what}: no socket marks on Windows"
        );
        assert!(
            env(c, "ALT_XDS_HOSTNAME").is_some() && env(c, "ALT_CA_HOSTNAME").is_some(),
            "{what}: HostProcess pods cannot use cluster DNS"
        );
    }
}

#[test]
fn the_hold_snippet_runs_wait_enrolled_before_the_application() {
    let objects = windows_objects();
    let pods: Vec<_> = objects.iter().filter(|o| o["kind"] == "Pod").collect();
    assert_eq!(pods.len(), 1, "the hold snippet's example pod");
    let spec = pod_spec(pods[0]);
    let inits = spec["initContainers"].as_array().expect("initContainers");
    // Kubelet runs init containers in order and the app only after all of them: the hold
    // must be the first, so nothing of the pod runs before it is captured.
    let hold = &inits[0];
    let args: Vec<&str> = hold["command"]
        .as_array()
        .expect("command")
        .iter()
        .chain(hold["args"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect();
    assert!(args[0].ends_with("ambit.exe"), "{args:?}");
    assert_eq!(args[1], "wait-enrolled", "{args:?}");
    let file = args
        .iter()
        .position(|a| *a == "--annotations")
        .map(|i| args[i + 1])
        .expect("--annotations");
    // The file is `metadata.annotations` of a downward-API volume mounted at its directory.
    let mount = hold["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .find(|m| {
            let at = m["mountPath"].as_str().unwrap_or_default();
            file.strip_prefix(at)
                .is_some_and(|rest| rest.starts_with('\\') || rest.starts_with('/'))
        })
        .unwrap_or_else(|| panic!("no volume mounted over {file}"));
    let item_path = &file[mount["mountPath"].as_str().unwrap().len() + 1..];
    let volume = spec["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mounted volume");
    let item = volume["downwardAPI"]["items"]
        .as_array()
        .expect("a downwardAPI volume")
        .iter()
        .find(|i| i["path"] == item_path)
        .unwrap_or_else(|| panic!("no downwardAPI item {item_path}"));
    assert_eq!(item["fieldRef"]["fieldPath"], "metadata.annotations");
    assert_eq!(
        pods[0]["metadata"]["labels"]["istio.io/dataplane-mode"],
        "ambient"
    );
}

/// A container's volume (by mount path) and the pod volume behind it.
fn mounted_volume<'a>(spec: &'a Value, container: &Value, mount_path: &str) -> Option<&'a Value> {
    let mount = container["volumeMounts"]
        .as_array()?
        .iter()
        .find(|m| m["mountPath"] == mount_path)?;
    spec["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == mount["name"])
}

#[test]
fn windows_ztunnel_has_the_linux_ztunnels_identity_and_trust() {
    let linux = objects(&yaml_files(&deploy()));
    let linux_ds = linux
        .iter()
        .find(|o| o["kind"] == "DaemonSet" && o["metadata"]["name"] == "ztunnel")
        .expect("the Linux ztunnel DaemonSet");
    let objects = windows_objects();
    let ds = objects
        .iter()
        .find(|o| o["kind"] == "DaemonSet" && o["metadata"]["name"] == "ztunnel-windows")
        .expect("the Windows ztunnel DaemonSet");
    let (spec, linux_spec) = (pod_spec(ds), pod_spec(linux_ds));
    // The CA accepts istio-system/ztunnel as the node proxy: the same service account, which
    // the Linux manifests create.
    let ns = &ds["metadata"]["namespace"];
    assert_eq!(spec["serviceAccountName"], "ztunnel");
    assert!(
        linux.iter().any(|o| o["kind"] == "ServiceAccount"
            && o["metadata"]["name"] == spec["serviceAccountName"]
            && o["metadata"]["namespace"] == *ns),
        "no ServiceAccount {ns}/{}",
        spec["serviceAccountName"]
    );
    // The istio-ca token and the root bundle, at the paths ztunnel reads by default, from the
    // same sources as on Linux.
    let (c, linux_c) = (&spec["containers"][0], &linux_spec["containers"][0]);
    for path in ["/var/run/secrets/tokens", "/var/run/secrets/istio"] {
        let win = mounted_volume(spec, c, path).unwrap_or_else(|| panic!("no volume at {path}"));
        let lin = mounted_volume(linux_spec, linux_c, path).expect("Linux volume");
        assert_eq!(win, lin, "{path}");
    }
    // Labels: the selector picks the template, and istioctl treats any `app` starting with
    // "ztunnel" as ztunnel (spec/windows.md §1.1).
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    for (k, v) in ds["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(&labels[k], v, "selector label {k}");
    }
    assert!(
        labels["app"]
            .as_str()
            .is_some_and(|a| a.starts_with("ztunnel")),
        "{labels}"
    );
}

#[test]
fn the_windows_image_has_ambit_where_the_manifests_run_it() {
    let dockerfile = std::fs::read_to_string(deploy().join("../image/windows/Dockerfile"))
        .expect("deploy/image/windows/Dockerfile");
    let copied: Vec<String> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("COPY ambit.exe "))
        .map(|to| format!("C:{}", to.trim().replace('/', "\\")))
        .collect();
    for o in windows_objects() {
        let spec = pod_spec(&o);
        let containers = spec["containers"]
            .as_array()
            .into_iter()
            .chain(spec["initContainers"].as_array())
            .flatten();
        for c in containers {
            let Some(cmd) = c["command"][0].as_str() else {
                continue;
            };
            if !cmd.ends_with("ambit.exe") {
                continue;
            }
            // A HostProcess container's image is mounted at its sandbox mount point; other
            // containers see it at C:\.
            let at = cmd.replace("%CONTAINER_SANDBOX_MOUNT_POINT%", "C:");
            assert!(
                copied.contains(&at),
                "{}: {cmd} not in {copied:?}",
                name(&o)
            );
        }
    }
}
