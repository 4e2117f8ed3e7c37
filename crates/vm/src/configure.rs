//! `ambit vm configure`: the five bundle files for a WorkloadGroup, with the same keys and
//! quoting as `istioctl x workload entry configure` (its facts, our code), so [`Bundle::load`]
//! and upstream's start script read them alike.
//!
//! [`Bundle::load`]: crate::Bundle::load

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use serde::Deserialize;

use crate::bundle::{CLUSTER_ENV, HOSTS, MESH_YAML, ROOT_CERT, TOKEN};

/// The parts of a WorkloadGroup the bundle is made from.
#[derive(Debug, Clone, Deserialize)]
pub struct WorkloadGroup {
    /// `metadata`.
    pub metadata: GroupMeta,
    /// `spec`.
    pub spec: GroupSpec,
}

/// `metadata` of the group.
#[derive(Debug, Clone, Deserialize)]
pub struct GroupMeta {
    /// The group's name.
    pub name: String,
    /// The group's namespace.
    #[serde(default = "default_namespace")]
    pub namespace: String,
}

fn default_namespace() -> String {
    "default".into()
}

/// `spec` of the group.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct GroupSpec {
    /// `spec.metadata` (labels of the workloads).
    pub metadata: SpecMeta,
    /// `spec.template`: the WorkloadEntry template.
    pub template: Template,
}

/// `spec.metadata`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SpecMeta {
    /// Labels of every workload of the group.
    pub labels: BTreeMap<String, String>,
}

/// `spec.template`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Template {
    /// The workloads' service account (`default` when empty, as Kubernetes).
    pub service_account: String,
    /// The workloads' network.
    pub network: String,
    /// Named ports.
    pub ports: BTreeMap<String, u16>,
    /// Labels that override `spec.metadata.labels`.
    pub labels: BTreeMap<String, String>,
}

/// Why a WorkloadGroup could not be turned into a bundle.
#[derive(Debug, thiserror::Error)]
pub enum ConfigureError {
    /// The file is not a WorkloadGroup.
    #[error("{path}: not a WorkloadGroup: {reason}")]
    Parse {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A bundle file could not be written.
    #[error("{path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

/// Reads a WorkloadGroup document (`kind: WorkloadGroup`).
pub fn parse_group(path: &str, text: &str) -> Result<WorkloadGroup, ConfigureError> {
    let bad = |reason: String| ConfigureError::Parse {
        path: path.to_owned(),
        reason,
    };
    let v: serde_norway::Value = serde_norway::from_str(text).map_err(|e| bad(e.to_string()))?;
    match v.get("kind").and_then(|k| k.as_str()) {
        Some("WorkloadGroup") => {}
        other => return Err(bad(format!("kind is {other:?}"))),
    }
    serde_norway::from_value(v).map_err(|e| bad(e.to_string()))
}

/// What besides the group goes into the bundle.
#[derive(Debug, Clone)]
pub struct Options {
    /// The control plane (`CA_ADDR`, `discoveryAddress`), `host:port`.
    pub ca_address: String,
    /// The address the VM reaches the control plane's host name at (`hosts`), if any.
    pub ingress_ip: Option<IpAddr>,
    /// The VM's address (`ISTIO_SVC_IP`), if known.
    pub internal_ip: Option<IpAddr>,
    /// `ISTIO_META_CLUSTER_ID`.
    pub cluster_id: String,
    /// `TRUST_DOMAIN` (empty: the mesh's default).
    pub trust_domain: String,
    /// `ISTIO_META_DNS_CAPTURE` (written only when on, as istioctl).
    pub capture_dns: bool,
    /// `ISTIO_META_AUTO_REGISTER_GROUP`.
    pub auto_register: bool,
    /// The root certificate(s), PEM.
    pub root_cert_pem: String,
    /// The bearer token for the group's service account.
    pub token: String,
    /// The mesh config's `defaultConfig.proxyMetadata`: into mesh.yaml's proxyMetadata under
    /// the generated keys (which win, as istioctl merges them), not into cluster.env.
    pub proxy_metadata: BTreeMap<String, String>,
}

/// The five files, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Files(pub BTreeMap<&'static str, String>);

/// istioctl's `shellescape.Quote`: single quotes (an embedded `'` as `'"'"'`), `''` when
/// empty.
pub fn shell_quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', r#"'"'"'"#))
}

/// The bundle for `g`.
pub fn render(g: &WorkloadGroup, o: &Options) -> Files {
    let t = &g.spec.template;
    let sa = if t.service_account.is_empty() {
        "default".to_owned()
    } else {
        t.service_account.clone()
    };
    let mut labels = g.spec.metadata.labels.clone();
    labels.extend(t.labels.clone());
    let canonical_service = [
        "service.istio.io/canonical-name",
        "app.kubernetes.io/name",
        "app",
    ]
    .iter()
    .find_map(|k| labels.get(*k).cloned())
    .unwrap_or_else(|| g.metadata.name.clone());
    let canonical_revision = [
        "service.istio.io/canonical-revision",
        "app.kubernetes.io/version",
        "version",
    ]
    .iter()
    .find_map(|k| labels.get(*k).cloned())
    .unwrap_or_else(|| "latest".to_owned());
    labels.insert(
        "service.istio.io/canonical-name".into(),
        canonical_service.clone(),
    );
    labels.insert(
        "service.istio.io/canonical-revision".into(),
        canonical_revision.clone(),
    );

    let mut md: BTreeMap<&str, String> = BTreeMap::new();
    md.insert("CANONICAL_SERVICE", canonical_service);
    md.insert("CANONICAL_REVISION", canonical_revision);
    md.insert("POD_NAMESPACE", g.metadata.namespace.clone());
    md.insert("SERVICE_ACCOUNT", sa.clone());
    md.insert("TRUST_DOMAIN", o.trust_domain.clone());
    md.insert("ISTIO_META_CLUSTER_ID", o.cluster_id.clone());
    md.insert("ISTIO_META_MESH_ID", String::new());
    md.insert("ISTIO_META_NETWORK", t.network.clone());
    if !t.ports.is_empty() {
        let ports: Vec<serde_json::Value> = t
            .ports
            .iter()
            .map(|(name, port)| serde_json::json!({"name": name, "containerPort": port}))
            .collect();
        md.insert(
            "ISTIO_META_POD_PORTS",
            serde_json::Value::from(ports).to_string(),
        );
    }
    md.insert("ISTIO_META_WORKLOAD_NAME", g.metadata.name.clone());
    md.insert(
        "ISTIO_METAJSON_LABELS",
        serde_json::to_string(&labels).unwrap_or_default(),
    );
    if o.capture_dns {
        md.insert("ISTIO_META_DNS_CAPTURE", "true".into());
    }
    if o.auto_register {
        md.insert("ISTIO_META_AUTO_REGISTER_GROUP", g.metadata.name.clone());
    }

    let mut env = md.clone();
    let mut inbound: Vec<u16> = t.ports.values().copied().collect();
    inbound.sort_unstable();
    inbound.dedup();
    env.insert(
        "ISTIO_INBOUND_PORTS",
        if inbound.is_empty() {
            "*".into()
        } else {
            inbound
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(",")
        },
    );
    env.insert("ISTIO_NAMESPACE", g.metadata.namespace.clone());
    env.insert(
        "ISTIO_SERVICE",
        format!("{}.{}", g.metadata.name, g.metadata.namespace),
    );
    env.insert("ISTIO_SERVICE_CIDR", "*".into());
    env.insert("ISTIO_LOCAL_EXCLUDE_PORTS", "22,15090,15021,15020".into());
    env.insert("CA_ADDR", o.ca_address.clone());
    if let Some(ip) = o.internal_ip {
        env.insert("ISTIO_SVC_IP", ip.to_string());
    }
    let cluster_env: String = env
        .iter()
        .map(|(k, v)| format!("{k}={}\n", shell_quote(v)))
        .collect();

    let mut mesh_md: BTreeMap<&str, String> = o
        .proxy_metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    mesh_md.extend(md);
    let mesh = serde_json::json!({
        "defaultConfig": {
            "discoveryAddress": o.ca_address,
            "proxyMetadata": mesh_md,
        }
    });
    let mesh_yaml = serde_norway::to_string(&mesh).unwrap_or_default();

    let host = o
        .ca_address
        .rsplit_once(':')
        .map_or(o.ca_address.as_str(), |(h, _)| h);
    let hosts = match o.ingress_ip {
        Some(ip) if host.parse::<IpAddr>().is_err() => format!("{ip} {host}\n"),
        _ => String::new(),
    };
    let mut files = BTreeMap::new();
    files.insert(CLUSTER_ENV, cluster_env);
    files.insert(MESH_YAML, mesh_yaml);
    files.insert(HOSTS, hosts);
    files.insert(ROOT_CERT, o.root_cert_pem.clone());
    files.insert(TOKEN, o.token.clone());
    Files(files)
}

impl Files {
    /// Writes the files into `dir` (created), the token readable by its owner only.
    pub fn write(&self, dir: &Path) -> Result<(), ConfigureError> {
        use std::os::unix::fs::PermissionsExt;
        let werr = |path: &Path| {
            let path = path.display().to_string();
            move |source| ConfigureError::Write { path, source }
        };
        std::fs::create_dir_all(dir).map_err(werr(dir))?;
        for (name, text) in &self.0 {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(werr(&path))?;
            let mode = if *name == TOKEN { 0o600 } else { 0o644 };
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(werr(&path))?;
        }
        Ok(())
    }
}

/// A fresh bearer token: 32 hex digits from the kernel's random source.
pub fn new_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Why a tokens file could not take another entry.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    /// The file is not YAML, or the result could not be written as YAML.
    #[error(transparent)]
    Yaml(#[from] serde_norway::Error),
    /// The document is not a mapping.
    #[error("not a mapping with a tokens list")]
    NotAMapping,
    /// `tokens` is there but not a list.
    #[error("tokens is not a list")]
    NotAList,
}

/// `tokens.yaml` of `ambit control --tokens` with an entry for `token` as `identity` added
/// (an existing entry for the same token is replaced). Comments are not kept.
pub fn add_token(tokens_yaml: &str, token: &str, identity: &str) -> Result<String, TokensError> {
    use serde_norway::{Mapping, Value};
    let mut doc: Value = if tokens_yaml.trim().is_empty() {
        Value::Mapping(Mapping::new())
    } else {
        serde_norway::from_str(tokens_yaml)?
    };
    let Value::Mapping(map) = &mut doc else {
        return Err(TokensError::NotAMapping);
    };
    let list = map
        .entry(Value::from("tokens"))
        .or_insert_with(|| Value::Sequence(Vec::new()));
    let Value::Sequence(list) = list else {
        return Err(TokensError::NotAList);
    };
    list.retain(|e| e.get("token").and_then(Value::as_str) != Some(token));
    let mut entry = Mapping::new();
    entry.insert("token".into(), token.into());
    entry.insert("identity".into(), identity.into());
    list.push(Value::Mapping(entry));
    Ok(serde_norway::to_string(&doc)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_file_gains_one_entry() {
        let cases: &[(&str, usize)] = &[
            ("", 1),
            ("tokens: []\n", 1),
            (
                "tokens:\n- token: node1-token-0123456789\n  node: node1\n",
                2,
            ),
            (
                "tokens:\n- token: T0123456789abcdef\n  identity: spiffe://old\n",
                1,
            ),
        ];
        for (text, n) in cases {
            let out = add_token(
                text,
                "T0123456789abcdef",
                "spiffe://cluster.local/ns/bar/sa/vm",
            )
            .unwrap();
            let v: serde_norway::Value = serde_norway::from_str(&out).unwrap();
            let list = v["tokens"].as_sequence().unwrap();
            assert_eq!(list.len(), *n, "{text:?} -> {out}");
            assert_eq!(
                list.last().unwrap()["identity"].as_str(),
                Some("spiffe://cluster.local/ns/bar/sa/vm")
            );
        }
        assert!(matches!(
            add_token("tokens: 3\n", "t", "i"),
            Err(TokensError::NotAList)
        ));
        assert!(matches!(
            add_token("[1]\n", "t", "i"),
            Err(TokensError::NotAMapping)
        ));
        assert!(matches!(
            add_token("a: [\n", "t", "i"),
            Err(TokensError::Yaml(_))
        ));
    }

    #[test]
    fn tokens_are_fresh() {
        let a = new_token().unwrap();
        assert_eq!(a.len(), 32);
        assert_ne!(a, new_token().unwrap());
    }
}
