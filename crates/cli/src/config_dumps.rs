//! Where `ambit ztunnel-config` gets `/config_dump`s besides the embedded mesh's run
//! directory: a cluster, through the API server's proxy to a ztunnel pod's admin port 15000
//! (`/api/v1/namespaces/NS/pods/NAME:15000/proxy/config_dump`, as istioctl does), or a saved
//! dump (`--file`). Also the filters istioctl offers (`--workload-namespace`, `--address`,
//! `--direction`), applied to the dumps before they are shown.

use std::path::Path;

use ambit_kubeapi::Client;
use serde_json::Value;

/// ztunnel's admin port.
pub const ADMIN_PORT: u16 = 15000;
/// The label of upstream's (and our) ztunnel pods.
pub const ZTUNNEL_SELECTOR: &str = "app=ztunnel";

/// Which ztunnel(s) on the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `NAME[.NAMESPACE]`.
    Pod { name: String, namespace: String },
    /// The ztunnel pod on this node.
    Node(String),
    /// Every ztunnel pod.
    All,
}

impl Target {
    /// `NAME[.NAMESPACE]`, the namespace defaulting to `default_namespace`.
    pub fn pod(spec: &str, default_namespace: &str) -> Self {
        let (name, namespace) = spec.split_once('.').unwrap_or((spec, default_namespace));
        Target::Pod {
            name: name.to_string(),
            namespace: namespace.to_string(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error("listing ztunnel pods in {namespace}")]
    List {
        namespace: String,
        #[source]
        source: Box<ambit_kubeapi::Error>,
    },
    #[error("no ztunnel pod ({ZTUNNEL_SELECTOR}) in {namespace}{}", on_node(.node))]
    NoZtunnel {
        namespace: String,
        node: Option<String>,
    },
    #[error("several ztunnel pods on node {node}: {pods:?}; name one")]
    Several { node: String, pods: Vec<String> },
    #[error("reading /config_dump of {pod} through the API server's pod proxy")]
    Fetch {
        pod: String,
        #[source]
        source: Box<ambit_kubeapi::Error>,
    },
    #[error("POST /logging of {pod} through the API server's pod proxy")]
    Logging {
        pod: String,
        #[source]
        source: Box<ambit_kubeapi::Error>,
    },
    #[error("reading {path}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a /config_dump (JSON object)")]
    NotADump { path: String },
}

fn on_node(node: &Option<String>) -> String {
    node.as_ref()
        .map(|n| format!(" on node {n}"))
        .unwrap_or_default()
}

/// The dumps of the targeted ztunnels, keyed by pod name (`NAME.NAMESPACE`).
pub async fn from_cluster(
    client: &Client,
    target: &Target,
    ztunnel_namespace: &str,
) -> Result<Vec<(String, Value)>, DumpError> {
    let mut out = Vec::new();
    for (namespace, name) in targets(client, target, ztunnel_namespace).await? {
        let path =
            format!("/api/v1/namespaces/{namespace}/pods/{name}:{ADMIN_PORT}/proxy/config_dump");
        let key = format!("{name}.{namespace}");
        let dump = client.get(&path).await.map_err(|source| DumpError::Fetch {
            pod: key.clone(),
            source: Box::new(source),
        })?;
        out.push((key, dump));
    }
    Ok(out)
}

/// `POST /logging?QUERY` on the targeted ztunnels (`ztunnel-config log`); their answers,
/// keyed by pod name (`NAME.NAMESPACE`).
pub async fn logging_on_cluster(
    client: &Client,
    target: &Target,
    ztunnel_namespace: &str,
    query: &[(&'static str, String)],
) -> Result<Vec<(String, String)>, DumpError> {
    let query: Vec<(&'static str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut out = Vec::new();
    for (namespace, name) in targets(client, target, ztunnel_namespace).await? {
        let path = format!("/api/v1/namespaces/{namespace}/pods/{name}:{ADMIN_PORT}/proxy/logging");
        let key = format!("{name}.{namespace}");
        let body =
            client
                .post_action(&path, &query)
                .await
                .map_err(|source| DumpError::Logging {
                    pod: key.clone(),
                    source: Box::new(source),
                })?;
        out.push((key, String::from_utf8_lossy(&body).into_owned()));
    }
    Ok(out)
}

/// The targeted ztunnel pods as (namespace, name).
async fn targets(
    client: &Client,
    target: &Target,
    ztunnel_namespace: &str,
) -> Result<Vec<(String, String)>, DumpError> {
    let pods: Vec<(String, String)> = match target {
        Target::Pod { name, namespace } => vec![(namespace.clone(), name.clone())],
        Target::Node(node) => {
            let found = ztunnel_pods(client, ztunnel_namespace, Some(node)).await?;
            match found.as_slice() {
                [] => {
                    return Err(DumpError::NoZtunnel {
                        namespace: ztunnel_namespace.to_string(),
                        node: Some(node.clone()),
                    });
                }
                [one] => vec![one.clone()],
                several => {
                    return Err(DumpError::Several {
                        node: node.clone(),
                        pods: several.iter().map(|(_, n)| n.clone()).collect(),
                    });
                }
            }
        }
        Target::All => {
            let found = ztunnel_pods(client, ztunnel_namespace, None).await?;
            if found.is_empty() {
                return Err(DumpError::NoZtunnel {
                    namespace: ztunnel_namespace.to_string(),
                    node: None,
                });
            }
            found
        }
    };
    Ok(pods)
}

async fn ztunnel_pods(
    client: &Client,
    namespace: &str,
    node: Option<&str>,
) -> Result<Vec<(String, String)>, DumpError> {
    let field = node.map(|n| format!("spec.nodeName={n}"));
    let list = client
        .list_selected(
            &format!("/api/v1/namespaces/{namespace}/pods"),
            field.as_deref(),
            Some(ZTUNNEL_SELECTOR),
        )
        .await
        .map_err(|source| DumpError::List {
            namespace: namespace.to_string(),
            source: Box::new(source),
        })?;
    Ok(list
        .items
        .iter()
        .filter_map(|p| {
            let name = p["metadata"]["name"].as_str()?;
            Some((namespace.to_string(), name.to_string()))
        })
        .collect())
}

/// A dump saved from `/config_dump` (or `istioctl ztunnel-config all -o json`).
pub fn from_file(path: &Path) -> Result<Vec<(String, Value)>, DumpError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| DumpError::File {
        path: shown.clone(),
        source,
    })?;
    let dump: Value = serde_json::from_str(&text)
        .ok()
        .filter(Value::is_object)
        .ok_or_else(|| DumpError::NotADump {
            path: shown.clone(),
        })?;
    Ok(vec![(shown, dump)])
}

/// `--direction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Direction {
    Inbound,
    Outbound,
}

/// What to keep of a dump.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub workload_namespace: Option<String>,
    pub address: Option<String>,
    pub direction: Option<Direction>,
}

impl Filter {
    /// Drops what the filter excludes, in place.
    pub fn apply(&self, dump: &mut Value) {
        let ns = self.workload_namespace.as_deref();
        let addr = self.address.as_deref();
        let keep_ns = |v: &Value| ns.is_none_or(|n| v["namespace"].as_str() == Some(n));
        let has_addr = |list: &Value| {
            addr.is_none_or(|a| {
                list.as_array().is_some_and(|ips| {
                    ips.iter().filter_map(Value::as_str).any(|ip| {
                        // Service VIPs may carry their network: `network/ip`.
                        ip == a || ip.rsplit_once('/').is_some_and(|(_, ip)| ip == a)
                    })
                })
            })
        };
        if let Some(list) = dump.get_mut("workloads").and_then(Value::as_array_mut) {
            list.retain(|w| keep_ns(w) && has_addr(&w["workloadIps"]));
        }
        if let Some(list) = dump.get_mut("services").and_then(Value::as_array_mut) {
            list.retain(|s| keep_ns(s) && has_addr(&s["vips"]));
        }
        if let Some(list) = dump.get_mut("policies").and_then(Value::as_array_mut) {
            list.retain(keep_ns);
        }
        if let (Some(n), Some(list)) = (
            ns,
            dump.get_mut("certificates").and_then(Value::as_array_mut),
        ) {
            let part = format!("/ns/{n}/");
            list.retain(|c| c["identity"].as_str().is_some_and(|i| i.contains(&part)));
        }
        if let Some(states) = dump.get_mut("workloadState").and_then(Value::as_object_mut) {
            if let Some(n) = ns {
                states.retain(|_, s| s["info"]["namespace"].as_str() == Some(n));
            }
            if let Some(d) = self.direction {
                let drop = match d {
                    Direction::Inbound => "outbound",
                    Direction::Outbound => "inbound",
                };
                for s in states.values_mut() {
                    if let Some(c) = s.get_mut("connections").and_then(Value::as_object_mut) {
                        c.remove(drop);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn targets_and_filters() {
        assert_eq!(
            Target::pod("ztunnel-abc", "istio-system"),
            Target::Pod {
                name: "ztunnel-abc".into(),
                namespace: "istio-system".into()
            }
        );
        assert_eq!(
            Target::pod("ztunnel-abc.kube-system", "istio-system"),
            Target::Pod {
                name: "ztunnel-abc".into(),
                namespace: "kube-system".into()
            }
        );
        let dump = json!({
            "workloads": [
                {"name": "a", "namespace": "demo", "workloadIps": ["10.0.0.1"]},
                {"name": "b", "namespace": "other", "workloadIps": ["10.0.0.2"]},
            ],
            "services": [
                {"name": "s", "namespace": "demo", "vips": ["/10.96.0.1"]},
                {"name": "t", "namespace": "demo", "vips": ["10.96.0.2"]},
            ],
            "policies": [{"name": "p", "namespace": "other"}],
            "certificates": [
                {"identity": "spiffe://cluster.local/ns/demo/sa/a"},
                {"identity": "spiffe://cluster.local/ns/other/sa/b"},
            ],
            "workloadState": {
                "u1": {"info": {"namespace": "demo"}, "connections": {"inbound": [], "outbound": []}},
                "u2": {"info": {"namespace": "other"}},
            },
        });
        let names = |d: &Value, k: &str| -> Vec<String> {
            d[k].as_array()
                .map(|a| {
                    a.iter()
                        .map(|v| {
                            v["name"]
                                .as_str()
                                .or(v["identity"].as_str())
                                .unwrap_or_default()
                                .to_string()
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut by_ns = dump.clone();
        Filter {
            workload_namespace: Some("demo".into()),
            direction: Some(Direction::Inbound),
            ..Filter::default()
        }
        .apply(&mut by_ns);
        assert_eq!(names(&by_ns, "workloads"), ["a"]);
        assert_eq!(names(&by_ns, "services"), ["s", "t"]);
        assert!(names(&by_ns, "policies").is_empty());
        assert_eq!(
            names(&by_ns, "certificates"),
            ["spiffe://cluster.local/ns/demo/sa/a"]
        );
        let states = by_ns["workloadState"].as_object().expect("object");
        assert_eq!(states.keys().collect::<Vec<_>>(), ["u1"]);
        assert!(states["u1"]["connections"].get("outbound").is_none());
        let mut by_addr = dump;
        Filter {
            address: Some("10.96.0.1".into()),
            ..Filter::default()
        }
        .apply(&mut by_addr);
        assert!(names(&by_addr, "workloads").is_empty());
        assert_eq!(names(&by_addr, "services"), ["s"]);
    }
}
