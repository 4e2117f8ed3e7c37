//! `ambit ztunnel-config`: a node's ztunnel `/config_dump` (fetched from its admin port
//! inside the node namespace) and the tables `istioctl ztunnel-config` shows of it.

use std::net::SocketAddr;

use serde_json::Value;

use crate::state::{RunDir, StateError};
use ambit_contract::ports;

/// Why a dump could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("no mesh in {0}")]
    NoMesh(std::path::PathBuf),
    #[error("no node {node:?}; known: {known}")]
    UnknownNode { node: String, known: String },
    #[error("ztunnel on {node}: {why}")]
    Fetch { node: String, why: String },
}

/// A part of the dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Workloads,
    Services,
    Policies,
    Certificates,
    /// Per-pod state of a shared-mode ztunnel (`workloadState`).
    Connections,
}

impl Section {
    /// The key of this section in the dump.
    pub fn key(self) -> &'static str {
        match self {
            Section::Workloads => "workloads",
            Section::Services => "services",
            Section::Policies => "policies",
            Section::Certificates => "certificates",
            Section::Connections => "workloadState",
        }
    }
}

/// The nodes `node` selects (every node when `None`), in node order.
fn select_nodes(
    run: &RunDir,
    node: Option<&str>,
) -> Result<Vec<crate::state::NodeState>, ConfigError> {
    let state = run
        .load()?
        .ok_or_else(|| ConfigError::NoMesh(run.root().to_path_buf()))?;
    let Some(n) = node else {
        return Ok(state.nodes);
    };
    let known = || {
        state
            .nodes
            .iter()
            .map(|x| x.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let found: Vec<_> = state
        .nodes
        .iter()
        .filter(|x| x.name == n)
        .cloned()
        .collect();
    if found.is_empty() {
        return Err(ConfigError::UnknownNode {
            node: n.to_owned(),
            known: known(),
        });
    }
    Ok(found)
}

/// The `/config_dump` of the ztunnel on `node`, or of every node's (in node order).
pub fn dumps(run: &RunDir, node: Option<&str>) -> Result<Vec<(String, Value)>, ConfigError> {
    let admin = SocketAddr::from(([127, 0, 0, 1], ports::ZTUNNEL_ADMIN));
    select_nodes(run, node)?
        .into_iter()
        .map(|n| {
            let fail = |why: String| ConfigError::Fetch {
                node: n.name.clone(),
                why,
            };
            let (code, body) = crate::probe::http_get(n.ztunnel_netns(), admin, "/config_dump")
                .ok_or_else(|| fail(format!("admin port {admin} unreachable")))?;
            if code != 200 {
                return Err(fail(format!("/config_dump answered {code}")));
            }
            let v = serde_json::from_str(&body).map_err(|e| fail(format!("bad JSON: {e}")))?;
            Ok((n.name.clone(), v))
        })
        .collect()
}

/// `POST /logging?query` (`query` already encoded, may be empty) on the ztunnel of `node`,
/// or of every node; the answers by node. A refusal (400) is an error with its text.
pub fn logging(
    run: &RunDir,
    node: Option<&str>,
    query: &str,
) -> Result<Vec<(String, String)>, ConfigError> {
    let admin = SocketAddr::from(([127, 0, 0, 1], ports::ZTUNNEL_ADMIN));
    let path = if query.is_empty() {
        "/logging".to_string()
    } else {
        format!("/logging?{query}")
    };
    select_nodes(run, node)?
        .into_iter()
        .map(|n| {
            let fail = |why: String| ConfigError::Fetch {
                node: n.name.clone(),
                why,
            };
            let (code, body) = crate::probe::http_request(n.ztunnel_netns(), admin, "POST", &path)
                .ok_or_else(|| fail(format!("admin port {admin} unreachable")))?;
            if code != 200 {
                return Err(fail(format!("{path} answered {code}: {}", body.trim_end())));
            }
            Ok((n.name.clone(), body))
        })
        .collect()
}

fn s(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::String(x)) if !x.is_empty() => x.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Bool(b)) => b.to_string(),
        _ => "-".to_owned(),
    }
}

/// A waypoint reference as text (`None` → `None`, like istioctl).
fn waypoint(v: &Value) -> String {
    match v.get("waypoint") {
        None | Some(Value::Null) => "None".to_owned(),
        Some(w) => w
            .get("destination")
            .map(|d| d.to_string().trim_matches('"').to_owned())
            .unwrap_or_else(|| w.to_string()),
    }
}

/// The table of `section` in `dump`: a header row, then one row per entry.
pub fn table(section: Section, dump: &Value) -> Vec<Vec<String>> {
    let empty = Vec::new();
    let list = dump
        .get(section.key())
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let header = |h: &[&str]| h.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    let mut rows = Vec::new();
    match section {
        Section::Workloads => {
            rows.push(header(&[
                "NAMESPACE",
                "POD-NAME",
                "ADDRESS",
                "NODE",
                "WAYPOINT",
                "PROTOCOL",
            ]));
            for w in list {
                let ips = w
                    .get("workloadIps")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default();
                rows.push(vec![
                    s(w, "namespace"),
                    s(w, "name"),
                    if ips.is_empty() { "-".into() } else { ips },
                    s(w, "node"),
                    waypoint(w),
                    s(w, "protocol"),
                ]);
            }
        }
        Section::Services => {
            rows.push(header(&[
                "NAMESPACE",
                "SERVICE-NAME",
                "SERVICE-VIP",
                "WAYPOINT",
                "ENDPOINTS",
            ]));
            for svc in list {
                let vips = svc
                    .get("vips")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            // `network/ip`; the default network is empty.
                            .map(|v| v.rsplit('/').next().unwrap_or(v))
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default();
                let endpoints = svc
                    .get("endpoints")
                    .and_then(Value::as_object)
                    .map(|e| e.len())
                    .unwrap_or(0);
                rows.push(vec![
                    s(svc, "namespace"),
                    s(svc, "name"),
                    if vips.is_empty() { "-".into() } else { vips },
                    waypoint(svc),
                    format!("{endpoints}/{endpoints}"),
                ]);
            }
        }
        Section::Policies => {
            rows.push(header(&["NAMESPACE", "POLICY-NAME", "ACTION", "SCOPE"]));
            for p in list {
                rows.push(vec![
                    s(p, "namespace"),
                    s(p, "name"),
                    s(p, "action"),
                    s(p, "scope"),
                ]);
            }
        }
        Section::Certificates => {
            rows.push(header(&[
                "CERTIFICATE-NAME",
                "TYPE",
                "STATUS",
                "VALID-CERT",
                "SERIAL-NUMBER",
                "NOT-AFTER",
                "NOT-BEFORE",
            ]));
            for c in list {
                let identity = s(c, "identity");
                let status = match s(c, "state").as_str() {
                    "Available" | "-" => "Available".to_owned(),
                    other => other.to_owned(),
                };
                for (kind, key) in [("Leaf", "certChain"), ("Root", "rootCerts")] {
                    for cert in c.get(key).and_then(Value::as_array).unwrap_or(&empty) {
                        let not_after = s(cert, "expirationTime");
                        rows.push(vec![
                            identity.clone(),
                            kind.to_owned(),
                            status.clone(),
                            (status == "Available").to_string(),
                            s(cert, "serialNumber"),
                            crate::status::readable_time(&not_after),
                            crate::status::readable_time(&s(cert, "validFrom")),
                        ]);
                    }
                }
            }
        }
        Section::Connections => {
            rows.push(header(&[
                "NAMESPACE",
                "POD-NAME",
                "UID",
                "STATE",
                "INBOUND",
                "OUTBOUND",
            ]));
            let empty_map = serde_json::Map::new();
            let states = dump
                .get(section.key())
                .and_then(Value::as_object)
                .unwrap_or(&empty_map);
            let count = |st: &Value, dir: &str| {
                st.get("connections")
                    .and_then(|c| c.get(dir))
                    .and_then(Value::as_array)
                    .map(|a| a.len().to_string())
                    .unwrap_or_else(|| "-".to_owned())
            };
            let mut body: Vec<Vec<String>> = states
                .iter()
                .map(|(uid, st)| {
                    let info = st.get("info").unwrap_or(&Value::Null);
                    vec![
                        s(info, "namespace"),
                        s(info, "name"),
                        uid.clone(),
                        s(st, "state"),
                        count(st, "inbound"),
                        count(st, "outbound"),
                    ]
                })
                .collect();
            body.sort();
            rows.extend(body);
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dump() -> Value {
        json!({
            "workloads": [{"namespace": "demo", "name": "client", "workloadIps": ["198.19.1.2"],
                           "node": "node1", "waypoint": null, "protocol": "HBONE"}],
            "services": [{"namespace": "demo", "name": "server", "vips": ["/10.96.0.20"],
                          "waypoint": null, "endpoints": {"a": {}, "b": {}}}],
            "policies": [{"namespace": "demo", "name": "allow", "action": "Allow",
                          "scope": "WorkloadSelector"}],
            "certificates": [{"identity": "spiffe://cluster.local/ns/demo/sa/client",
                "state": "Available",
                "certChain": [{"serialNumber": "1f", "expirationTime": "SystemTime { tv_sec: 0, tv_nsec: 0 }",
                               "validFrom": "SystemTime { tv_sec: 0, tv_nsec: 0 }"}],
                "rootCerts": [{"serialNumber": "1b"}]}],
            "workloadState": {"u1": {"info": {"name": "client", "namespace": "demo"}, "state": "Up"}}
        })
    }

    #[test]
    fn tables() {
        let d = dump();
        let w = table(Section::Workloads, &d);
        assert_eq!(
            w[1],
            ["demo", "client", "198.19.1.2", "node1", "None", "HBONE"]
        );
        let s = table(Section::Services, &d);
        assert_eq!(s[1], ["demo", "server", "10.96.0.20", "None", "2/2"]);
        let p = table(Section::Policies, &d);
        assert_eq!(p[1], ["demo", "allow", "Allow", "WorkloadSelector"]);
        let c = table(Section::Certificates, &d);
        assert_eq!(c.len(), 3);
        assert_eq!(c[1][1], "Leaf");
        assert_eq!(c[1][5], "1970-01-01T00:00:00Z");
        assert_eq!(c[2][1], "Root");
        let k = table(Section::Connections, &d);
        assert_eq!(k[1], ["demo", "client", "u1", "Up", "-", "-"]);
        assert_eq!(table(Section::Workloads, &json!({})).len(), 1);
    }
}
