//! A pod's containers as a kubelet and a container runtime start them: the environment
//! (the image's, the kubelet's service variables, `envFrom`, `env` with `value`,
//! `fieldRef`, `resourceFieldRef`, `configMapKeyRef`, `secretKeyRef`), the volumes
//! (`hostPath` with its type, `emptyDir`, `configMap`, `secret`, `projected` with a
//! service-account token, the automounted API token), `/etc/hosts`, and each container as a
//! process: an overlay of the image, the volume mounts (read-only, `HostToContainer`), the
//! node's PID namespace, the pod's network namespace, the security context (user, groups,
//! capabilities, no new privileges, read-only root) and the command (`command` replaces the
//! image's entry point, `args` its arguments).

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ambit_netns::NetnsFd;
use ambit_netns::sandbox::Bind;
use base64::Engine as _;
use serde_json::Value;

use super::node::{IMAGE_DIR, NodeHost};

/// The image's configuration (`scripts/image --rootfs`'s `config.json`).
#[derive(Debug, Clone)]
pub struct Image {
    /// The root filesystem on the test's side.
    pub rootfs: PathBuf,
    pub entrypoint: Vec<String>,
    pub workdir: String,
    pub env: Vec<(String, String)>,
}

/// What a pod's containers need from the cluster.
pub struct PodContext<'a> {
    pub node: &'a NodeHost,
    pub image: &'a Image,
    /// The pod object as stored (status filled in).
    pub pod: &'a Value,
    /// Objects the kubelet reads: ConfigMaps, Secrets, ServiceAccounts, Services.
    pub lookup: &'a dyn Fn(&str, &str, &str) -> Option<Value>,
    /// Services of the pod's namespace (for the service environment variables).
    pub services: Vec<Value>,
    /// `KUBERNETES_SERVICE_HOST` / `_PORT`, and the API server's CA for the token volume.
    pub api: (String, u16, String),
    /// A service-account token for (namespace, account, audience).
    pub token: &'a dyn Fn(&str, Option<&str>) -> String,
    /// Node allocatable resources for `resourceFieldRef` without limits: (cpu, memory bytes).
    pub allocatable: (u32, u64),
}

/// A running container; killed when dropped.
pub struct ContainerRun {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
}

impl ContainerRun {
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then SIGKILL after `grace`; the exit status.
    pub fn terminate(&mut self, grace: Duration) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + grace;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return self.child.wait().expect("wait after SIGKILL");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ContainerRun {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn str_at<'v>(v: &'v Value, key: &str) -> Option<&'v str> {
    v.get(key).and_then(Value::as_str)
}

fn pod_field(pod: &Value, path: &str) -> String {
    let v = match path {
        "metadata.name" => &pod["metadata"]["name"],
        "metadata.namespace" => &pod["metadata"]["namespace"],
        "metadata.uid" => &pod["metadata"]["uid"],
        "spec.nodeName" => &pod["spec"]["nodeName"],
        "spec.serviceAccountName" => &pod["spec"]["serviceAccountName"],
        "status.podIP" => &pod["status"]["podIP"],
        "status.hostIP" => &pod["status"]["hostIP"],
        other => panic!("fieldRef {other} is not supported by the test kubelet"),
    };
    v.as_str().unwrap_or_default().to_string()
}

/// `resourceFieldRef`: the container's limit (or request), else the node's allocatable.
fn resource_field(ctx: &PodContext<'_>, container: &Value, field: &Value) -> String {
    let resource = str_at(field, "resource").unwrap_or_default();
    let divisor = str_at(field, "divisor").unwrap_or("1");
    let (section, name) = resource
        .split_once('.')
        .unwrap_or_else(|| panic!("resourceFieldRef {resource}"));
    let declared = container["resources"][section][name].as_str();
    match name {
        "cpu" => {
            let millis = match declared {
                Some(v) => v
                    .strip_suffix('m')
                    .map(|m| m.parse::<u64>().expect("cpu millis"))
                    .unwrap_or_else(|| v.parse::<u64>().expect("cpu") * 1000),
                None => u64::from(ctx.allocatable.0) * 1000,
            };
            let div = match divisor.strip_suffix('m') {
                Some(m) => m.parse::<u64>().expect("divisor"),
                None => divisor.parse::<u64>().expect("divisor") * 1000,
            };
            // The kubelet rounds up.
            millis.div_ceil(div).to_string()
        }
        "memory" => {
            let bytes = declared.map_or(ctx.allocatable.1, quantity_bytes);
            (bytes / quantity_bytes(divisor).max(1)).to_string()
        }
        other => panic!("resourceFieldRef {other} is not supported by the test kubelet"),
    }
}

fn quantity_bytes(q: &str) -> u64 {
    let units = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ];
    for (suffix, mul) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<u64>().expect("quantity") * mul;
        }
    }
    q.parse().expect("quantity")
}

/// The `KUBERNETES_*` and per-Service variables the kubelet gives every container.
fn service_env(ctx: &PodContext<'_>) -> Vec<(String, String)> {
    let (host, port, _) = &ctx.api;
    let mut out = vec![
        ("KUBERNETES_SERVICE_HOST".to_string(), host.clone()),
        ("KUBERNETES_SERVICE_PORT".to_string(), port.to_string()),
        (
            "KUBERNETES_SERVICE_PORT_HTTPS".to_string(),
            port.to_string(),
        ),
        (
            "KUBERNETES_PORT".to_string(),
            format!("tcp://{host}:{port}"),
        ),
        (
            format!("KUBERNETES_PORT_{port}_TCP"),
            format!("tcp://{host}:{port}"),
        ),
        (
            format!("KUBERNETES_PORT_{port}_TCP_PROTO"),
            "tcp".to_string(),
        ),
        (format!("KUBERNETES_PORT_{port}_TCP_PORT"), port.to_string()),
        (format!("KUBERNETES_PORT_{port}_TCP_ADDR"), host.clone()),
    ];
    if ctx.pod["spec"]["enableServiceLinks"] == Value::Bool(false) {
        return out;
    }
    for svc in &ctx.services {
        let (Some(name), Some(ip)) = (
            svc["metadata"]["name"].as_str(),
            svc["spec"]["clusterIP"].as_str(),
        ) else {
            continue;
        };
        let prefix = name.to_uppercase().replace('-', "_");
        out.push((format!("{prefix}_SERVICE_HOST"), ip.to_string()));
        for (i, p) in svc["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let port = p["port"].as_u64().unwrap_or_default().to_string();
            if i == 0 {
                out.push((format!("{prefix}_SERVICE_PORT"), port.clone()));
            }
            if let Some(pname) = p["name"].as_str() {
                let pname = pname.to_uppercase().replace('-', "_");
                out.push((format!("{prefix}_SERVICE_PORT_{pname}"), port));
            }
        }
    }
    out
}

fn config_data(
    ctx: &PodContext<'_>,
    kind: &str,
    namespace: &str,
    name: &str,
) -> Option<BTreeMap<String, Vec<u8>>> {
    let collection = match kind {
        "ConfigMap" => "/api/v1/configmaps",
        _ => "/api/v1/secrets",
    };
    let obj = (ctx.lookup)(collection, namespace, name)?;
    let mut out = BTreeMap::new();
    for (k, v) in obj["data"].as_object().into_iter().flatten() {
        let text = v.as_str().unwrap_or_default();
        let bytes = if kind == "Secret" {
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .unwrap_or_else(|e| panic!("Secret {namespace}/{name} key {k}: {e}"))
        } else {
            text.as_bytes().to_vec()
        };
        out.insert(k.clone(), bytes);
    }
    Some(out)
}

/// The container's environment, in the kubelet's order (later entries win).
pub fn environment(ctx: &PodContext<'_>, container: &Value) -> Vec<(String, String)> {
    let ns = ctx.pod["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default");
    let mut env = ctx.image.env.clone();
    env.push((
        "HOSTNAME".into(),
        ctx.pod["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .into(),
    ));
    env.extend(service_env(ctx));
    for from in container["envFrom"].as_array().into_iter().flatten() {
        let (kind, r) = if from.get("configMapRef").is_some() {
            ("ConfigMap", &from["configMapRef"])
        } else {
            ("Secret", &from["secretRef"])
        };
        let name = str_at(r, "name").expect("envFrom name");
        match config_data(ctx, kind, ns, name) {
            Some(data) => {
                let prefix = str_at(from, "prefix").unwrap_or_default();
                env.extend(data.into_iter().map(|(k, v)| {
                    (
                        format!("{prefix}{k}"),
                        String::from_utf8_lossy(&v).into_owned(),
                    )
                }));
            }
            None if r["optional"] == Value::Bool(true) => {}
            None => panic!("envFrom {kind} {ns}/{name} does not exist"),
        }
    }
    for e in container["env"].as_array().into_iter().flatten() {
        let name = str_at(e, "name").expect("env name").to_string();
        let value = if let Some(v) = e.get("value") {
            v.as_str().unwrap_or_default().to_string()
        } else if let Some(from) = e.get("valueFrom") {
            if let Some(f) = from.get("fieldRef") {
                pod_field(ctx.pod, str_at(f, "fieldPath").expect("fieldPath"))
            } else if let Some(f) = from.get("resourceFieldRef") {
                resource_field(ctx, container, f)
            } else {
                let (kind, r) = if from.get("configMapKeyRef").is_some() {
                    ("ConfigMap", &from["configMapKeyRef"])
                } else {
                    ("Secret", &from["secretKeyRef"])
                };
                let (obj, key) = (
                    str_at(r, "name").expect("name"),
                    str_at(r, "key").expect("key"),
                );
                match config_data(ctx, kind, ns, obj).and_then(|d| d.get(key).cloned()) {
                    Some(v) => String::from_utf8_lossy(&v).into_owned(),
                    None if r["optional"] == Value::Bool(true) => continue,
                    None => panic!("env {name}: {kind} {ns}/{obj} key {key} does not exist"),
                }
            }
        } else {
            String::new()
        };
        env.push((name, value));
    }
    env
}

/// A volume ready to mount: its source as the node sees it.
#[derive(Debug, Clone)]
pub struct Volume {
    pub source: PathBuf,
}

fn write_files(dir: &Path, files: &BTreeMap<String, Vec<u8>>, mode: u32, group: Option<u32>) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).expect("volume dir");
    for (name, bytes) in files {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("volume subdir");
        }
        std::fs::write(&path, bytes).expect("volume file");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("mode");
        if let Some(gid) = group {
            std::os::unix::fs::chown(&path, None, Some(gid)).expect("fsGroup");
        }
    }
}

/// Selected keys (`items`) or all of them.
fn select(data: BTreeMap<String, Vec<u8>>, items: &Value) -> BTreeMap<String, Vec<u8>> {
    match items.as_array() {
        None => data,
        Some(items) => items
            .iter()
            .filter_map(|i| {
                let key = str_at(i, "key")?;
                Some((
                    str_at(i, "path").unwrap_or(key).to_string(),
                    data.get(key)?.clone(),
                ))
            })
            .collect(),
    }
}

fn mode_of(v: &Value, default: u32) -> u32 {
    v.as_u64()
        .and_then(|m| u32::try_from(m).ok())
        .unwrap_or(default)
}

/// Every volume of the pod, materialized under the node's `/var/lib/kubelet/pods/UID`; the
/// automounted API token included (unless turned off on the pod or its service account).
pub fn volumes(ctx: &PodContext<'_>) -> BTreeMap<String, Volume> {
    let pod = ctx.pod;
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    let uid = pod["metadata"]["uid"].as_str().expect("pod uid");
    let sa = pod["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or("default");
    let fs_group = pod["spec"]["securityContext"]["fsGroup"]
        .as_u64()
        .and_then(|g| u32::try_from(g).ok());
    let base = format!("/var/lib/kubelet/pods/{uid}/volumes");
    let mut out = BTreeMap::new();
    let mut specs: Vec<Value> = pod["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let automount = pod["spec"]["automountServiceAccountToken"]
        .as_bool()
        .or_else(|| {
            (ctx.lookup)("/api/v1/serviceaccounts", ns, sa)
                .and_then(|a| a["automountServiceAccountToken"].as_bool())
        });
    if automount != Some(false) {
        specs.push(serde_json::json!({"name": "kube-api-access", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}
        ]}}));
    }
    for v in &specs {
        let name = str_at(v, "name").expect("volume name").to_string();
        let node_dir = format!("{base}/{name}");
        let host_dir = ctx.node.path(&node_dir);
        let source = if let Some(hp) = v.get("hostPath") {
            let path = str_at(hp, "path").expect("hostPath path");
            let on_host = ctx.node.path(path);
            match str_at(hp, "type").unwrap_or("") {
                "DirectoryOrCreate" | "" => {
                    if !on_host.exists() {
                        std::fs::create_dir_all(&on_host).expect("hostPath dir");
                    }
                }
                "Directory" => assert!(
                    on_host.is_dir(),
                    "hostPath {path} (type Directory) does not exist on {}",
                    ctx.node.name
                ),
                other => panic!("hostPath type {other} is not supported by the test kubelet"),
            }
            PathBuf::from(path)
        } else if v.get("emptyDir").is_some() {
            std::fs::create_dir_all(&host_dir).expect("emptyDir");
            PathBuf::from(&node_dir)
        } else if let Some(cm) = v.get("configMap") {
            let cm_name = str_at(cm, "name").expect("configMap name");
            let data = match config_data(ctx, "ConfigMap", ns, cm_name) {
                Some(d) => select(d, &cm["items"]),
                None if cm["optional"] == Value::Bool(true) => BTreeMap::new(),
                None => panic!("volume {name}: ConfigMap {ns}/{cm_name} does not exist"),
            };
            write_files(
                &host_dir,
                &data,
                mode_of(&cm["defaultMode"], 0o644),
                fs_group,
            );
            PathBuf::from(&node_dir)
        } else if let Some(s) = v.get("secret") {
            let s_name = str_at(s, "secretName").expect("secretName");
            let data = config_data(ctx, "Secret", ns, s_name)
                .map(|d| select(d, &s["items"]))
                .unwrap_or_else(|| panic!("volume {name}: Secret {ns}/{s_name} does not exist"));
            let mode = mode_of(&s["defaultMode"], 0o644);
            write_files(&host_dir, &data, mode, fs_group);
            PathBuf::from(&node_dir)
        } else if let Some(p) = v.get("projected") {
            let mut files = BTreeMap::new();
            for src in p["sources"].as_array().into_iter().flatten() {
                if let Some(t) = src.get("serviceAccountToken") {
                    let token = (ctx.token)(sa, str_at(t, "audience"));
                    files.insert(
                        str_at(t, "path").expect("token path").to_string(),
                        token.into_bytes(),
                    );
                } else if let Some(cm) = src.get("configMap") {
                    let cm_name = str_at(cm, "name").expect("name");
                    if cm_name == "kube-root-ca.crt" {
                        files.insert("ca.crt".into(), ctx.api.2.clone().into_bytes());
                    } else if let Some(d) = config_data(ctx, "ConfigMap", ns, cm_name) {
                        files.extend(select(d, &cm["items"]));
                    }
                } else if let Some(d) = src.get("downwardAPI") {
                    for item in d["items"].as_array().into_iter().flatten() {
                        let path = str_at(item, "path").expect("path");
                        let field = str_at(&item["fieldRef"], "fieldPath").expect("fieldPath");
                        files.insert(path.to_string(), pod_field(pod, field).into_bytes());
                    }
                } else if let Some(s) = src.get("secret") {
                    let s_name = str_at(s, "name").expect("name");
                    if let Some(d) = config_data(ctx, "Secret", ns, s_name) {
                        files.extend(select(d, &s["items"]));
                    }
                }
            }
            write_files(
                &host_dir,
                &files,
                mode_of(&p["defaultMode"], 0o644),
                fs_group,
            );
            PathBuf::from(&node_dir)
        } else {
            panic!("volume {name}: kind not supported by the test kubelet: {v}");
        };
        out.insert(name, Volume { source });
    }
    out
}

/// `path` inside the image, with the image's symbolic links resolved inside it (as a runtime
/// must: the kernel would resolve an absolute link against the node's root instead).
fn resolve_in(root: &Path, path: &str) -> PathBuf {
    let mut resolved = PathBuf::from("/");
    let mut rest: Vec<String> = Path::new(path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .rev()
        .collect();
    let mut hops = 0;
    while let Some(part) = rest.pop() {
        let candidate = resolved.join(&part);
        match std::fs::read_link(root.join(candidate.strip_prefix("/").expect("absolute"))) {
            Ok(target) if hops < 40 => {
                hops += 1;
                if target.is_absolute() {
                    resolved = PathBuf::from("/");
                }
                for c in target.components().rev() {
                    match c {
                        Component::Normal(s) => rest.push(s.to_string_lossy().into_owned()),
                        Component::ParentDir => rest.push("..".into()),
                        _ => {}
                    }
                }
            }
            _ if part == ".." => {
                resolved.pop();
            }
            _ => resolved = candidate,
        }
    }
    resolved
}

/// Starts `container` of the pod in `netns`; `volumes` from [`volumes`].
pub fn start_container(
    ctx: &PodContext<'_>,
    netns: &NetnsFd,
    container: &Value,
    volumes: &BTreeMap<String, Volume>,
    hosts_file: &str,
) -> ContainerRun {
    let pod = ctx.pod;
    let node = ctx.node;
    let uid = pod["metadata"]["uid"].as_str().expect("uid");
    let name = str_at(container, "name")
        .expect("container name")
        .to_string();
    let id = format!("{uid}-{name}");
    let cdir = format!("/var/lib/containers/{id}");
    let upper = node.path(&format!("{cdir}/upper"));
    for d in ["upper", "work", "rootfs"] {
        std::fs::create_dir_all(node.path(&format!("{cdir}/{d}"))).expect("container dir");
    }
    let rootfs = PathBuf::from(format!("{cdir}/rootfs"));
    let image_root = &ctx.image.rootfs;
    // Mount points: created in the overlay's upper layer, at the image's resolved paths.
    let mut mounts: Vec<(PathBuf, PathBuf, Bind)> = Vec::new();
    let mut point = |target: &str, source: PathBuf, is_file: bool, how: Bind| {
        let inside = resolve_in(image_root, target);
        let rel = inside.strip_prefix("/").expect("absolute").to_path_buf();
        let in_upper = upper.join(&rel);
        if !image_root.join(&rel).exists() {
            if is_file {
                std::fs::create_dir_all(in_upper.parent().expect("parent")).expect("dir");
                std::fs::write(&in_upper, b"").expect("file mount point");
            } else {
                std::fs::create_dir_all(&in_upper).expect("mount point");
            }
        }
        mounts.push((source, rootfs.join(rel), how));
    };
    for m in container["volumeMounts"].as_array().into_iter().flatten() {
        let vname = str_at(m, "name").expect("volumeMount name");
        let target = str_at(m, "mountPath").expect("mountPath");
        let v = volumes
            .get(vname)
            .unwrap_or_else(|| panic!("volumeMount {vname}: no such volume"));
        let how = Bind {
            recursive: true,
            readonly: m["readOnly"] == Value::Bool(true),
            host_to_container: matches!(
                str_at(m, "mountPropagation"),
                Some("HostToContainer" | "Bidirectional")
            ),
        };
        point(target, v.source.clone(), false, how);
    }
    if let Some(api) = volumes.get("kube-api-access") {
        point(
            "/var/run/secrets/kubernetes.io/serviceaccount",
            api.source.clone(),
            false,
            Bind {
                recursive: false,
                readonly: true,
                host_to_container: false,
            },
        );
    }
    let hosts_node = format!("/var/lib/kubelet/pods/{uid}/etc-hosts");
    std::fs::write(node.path(&hosts_node), hosts_file).expect("hosts file");
    let resolv_node = format!("/var/lib/kubelet/pods/{uid}/resolv.conf");
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    // Names resolve from the hosts file (the test's cluster DNS); the name server is the
    // API server's address inside the test's bridge namespace, where nothing answers on 53
    // (ztunnel's DNS proxy needs one to forward to, as it has on a cluster).
    std::fs::write(
        node.path(&resolv_node),
        format!(
            "nameserver {}\nsearch {ns}.svc.cluster.local svc.cluster.local cluster.local\n\
             options ndots:5\n",
            ctx.api.0
        ),
    )
    .expect("resolv.conf");
    for (target, source) in [
        ("/etc/hosts", hosts_node),
        ("/etc/resolv.conf", resolv_node),
    ] {
        point(target, PathBuf::from(source), true, Bind::default());
    }
    for d in ["proc", "sys", "dev"] {
        if !image_root.join(d).exists() {
            std::fs::create_dir_all(upper.join(d)).expect("mount point");
        }
    }

    let sc = &container["securityContext"];
    let psc = &pod["spec"]["securityContext"];
    let id_of = |key: &str| {
        sc[key]
            .as_u64()
            .or_else(|| psc[key].as_u64())
            .and_then(|v| u32::try_from(v).ok())
    };
    let run_uid = id_of("runAsUser").unwrap_or(0);
    let run_gid = id_of("runAsGroup").unwrap_or(0);
    let mut groups: Vec<u32> = psc["supplementalGroups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g.as_u64().and_then(|g| u32::try_from(g).ok()))
        .collect();
    groups.extend(psc["fsGroup"].as_u64().and_then(|g| u32::try_from(g).ok()));
    let drop_all = sc["capabilities"]["drop"]
        .as_array()
        .is_some_and(|d| d.iter().any(|c| c == "ALL"));
    let added: Vec<String> = sc["capabilities"]["add"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_str().map(str::to_string))
        .collect();
    // containerd's default set, without drop: [ALL].
    const DEFAULT_CAPS: [&str; 14] = [
        "CHOWN",
        "DAC_OVERRIDE",
        "FSETID",
        "FOWNER",
        "MKNOD",
        "NET_RAW",
        "SETGID",
        "SETUID",
        "SETFCAP",
        "SETPCAP",
        "NET_BIND_SERVICE",
        "SYS_CHROOT",
        "KILL",
        "AUDIT_WRITE",
    ];
    let mut keep: Vec<String> = if drop_all {
        Vec::new()
    } else {
        DEFAULT_CAPS.iter().map(|c| c.to_string()).collect()
    };
    keep.extend(added);

    let upper_node = format!("{cdir}/upper");
    let work_node = format!("{cdir}/work");
    let mut sandbox = node.container_sandbox(netns).unshare_mount().mount(
        "overlay",
        &rootfs,
        &format!("lowerdir={IMAGE_DIR},upperdir={upper_node},workdir={work_node}"),
        false,
    );
    for (source, target, how) in &mounts {
        sandbox = sandbox.bind(source, target, *how);
    }
    sandbox = sandbox
        .mount("proc", &rootfs.join("proc"), "", false)
        .mount("sysfs", &rootfs.join("sys"), "", true)
        .bind(
            Path::new("/dev"),
            &rootfs.join("dev"),
            Bind {
                recursive: true,
                ..Bind::default()
            },
        );
    if sc["readOnlyRootFilesystem"] == Value::Bool(true) {
        sandbox = sandbox.remount_readonly(&rootfs);
    }
    let workdir = str_at(container, "workingDir").unwrap_or(&ctx.image.workdir);
    sandbox = sandbox.pivot_root(&rootfs).cwd(Path::new(workdir));
    if sc["privileged"] != Value::Bool(true) {
        sandbox = sandbox.capabilities(&keep);
    }
    if sc["allowPrivilegeEscalation"] == Value::Bool(false) {
        sandbox = sandbox.no_new_privs();
    }
    sandbox = sandbox.user(run_uid, run_gid, &groups);

    // `command` replaces the entry point, `args` the image's arguments (none in ours).
    let strings = |v: &Value| -> Option<Vec<String>> {
        v.as_array().map(|a| {
            a.iter()
                .map(|s| s.as_str().expect("string").to_string())
                .collect()
        })
    };
    let mut argv = strings(&container["command"]).unwrap_or_else(|| ctx.image.entrypoint.clone());
    argv.extend(strings(&container["args"]).unwrap_or_default());
    assert!(
        !argv.iter().any(|a| a.contains("$(")),
        "$(VAR) expansion is not supported by the test kubelet: {argv:?}"
    );
    let log_dir = node.path(&format!(
        "/var/log/pods/{ns}_{}_{uid}",
        pod["metadata"]["name"].as_str().unwrap_or_default()
    ));
    std::fs::create_dir_all(&log_dir).expect("log dir");
    let log = log_dir.join(format!("{name}.log"));
    let file = std::fs::File::create(&log).expect("log file");
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env_clear()
        .envs(environment(ctx, container))
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("dup log"))
        .stderr(file);
    sandbox.apply(&mut cmd).expect("container sandbox");
    let child = node.spawn(&mut cmd).unwrap_or_else(|e| {
        let why = std::fs::read_to_string(&log).unwrap_or_default();
        panic!("starting container {name} of {uid}: {e}: {why}")
    });
    ContainerRun { name, child, log }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_links_resolve_inside_the_image() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("run")).unwrap();
        std::fs::create_dir_all(dir.path().join("var")).unwrap();
        std::os::unix::fs::symlink("/run", dir.path().join("var/run")).unwrap();
        std::os::unix::fs::symlink("../run", dir.path().join("var/rel")).unwrap();
        let cases = [
            ("/var/run/ztunnel", "/run/ztunnel"),
            ("/var/rel/istio-cni", "/run/istio-cni"),
            ("/host/proc", "/host/proc"),
            ("/var/lib/x", "/var/lib/x"),
        ];
        for (path, want) in cases {
            assert_eq!(resolve_in(dir.path(), path), PathBuf::from(want), "{path}");
        }
    }
}
