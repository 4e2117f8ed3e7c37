//! The drills' mesh: two nodes, echo servers, load clients and a holder, all enrolled in the
//! `drill` namespace under STRICT mTLS, plus what the drills read from it (addresses,
//! component health, certificates) and the faults they inject.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::embedded::{ambit, status_json, stdout};
use crate::load;

/// The service in front of both `a` servers.
pub const SERVICE_VIP: &str = "10.96.0.50";
/// Where every Service address of the drills is (the VIP, the resync probes).
pub const SERVICE_NET: &str = "10.96.0.0/16";

pub fn is_service(ip: Ipv4Addr) -> bool {
    ip.octets()[..2] == [10, 96]
}
/// The guarded server's policy, by action: only the holder's identity may reach it, or the
/// holder may not.
pub fn guard_policy(action: &str) -> String {
    json!({
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "guard", "namespace": "drill"},
        "spec": {
            "selector": {"matchLabels": {"app": "g"}},
            "action": action,
            "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/drill/sa/h"]}}]}]
        }
    })
    .to_string()
}

fn pod(name: &str, node: &str, app: &str, argv: &[&str]) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "drill", "labels": {"app": app}},
        "spec": {
            "nodeName": node,
            "serviceAccountName": app,
            "containers": [{"name": "main", "command": argv}]
        }
    })
}

fn python(script: &str) -> Vec<&str> {
    vec!["python3", "-u", "-c", script]
}

/// Writes the drill mesh's manifests into `dir`.
pub fn write_manifests(dir: &Path) {
    std::fs::create_dir_all(dir).expect("manifest dir");
    let docs = [
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "drill", "labels": {"istio.io/dataplane-mode": "ambient"}}}),
        json!({"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
               "metadata": {"name": "default", "namespace": "drill"},
               "spec": {"mtls": {"mode": "STRICT"}}}),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "a", "namespace": "drill"},
               "spec": {"selector": {"app": "a"}, "clusterIP": SERVICE_VIP,
                        "ports": [{"name": "echo", "port": 8080, "targetPort": 8080}]}}),
        pod("a1", "node1", "a", &python(load::SERVER)),
        pod("a2", "node2", "a", &python(load::SERVER)),
        pod("g2", "node2", "g", &python(load::SERVER)),
        pod("c1", "node1", "c", &python(load::CLIENT)),
        pod("c2", "node2", "c", &python(load::CLIENT)),
        // A third client, loaded only in the drill that flushes its rules (what that leaves
        // behind stays out of the other drills).
        pod("c3", "node1", "c", &python(load::CLIENT)),
        pod("h1", "node1", "h", &python(load::HOLDER)),
    ];
    let text: Vec<String> = docs.iter().map(Value::to_string).collect();
    std::fs::write(dir.join("drill.yaml"), text.join("\n---\n")).expect("manifests");
    std::fs::write(dir.join("guard.yaml"), guard_policy("ALLOW")).expect("policy");
}

/// `count` pods spread over both nodes; each opens one connection to `server` when it
/// starts (its very first packets go through the mesh), writes the answer to `first` in
/// its working directory, then sleeps.
pub fn churn_pods(count: usize, server: Ipv4Addr) -> String {
    let script = format!(
        "if exec 3<>/dev/tcp/{server}/8080 && printf 'ping\\n' >&3 && read -t 5 r <&3; then echo \"$r\" > first; else echo fail > first; fi; exec sleep infinity"
    );
    (0..count)
        .map(|i| {
            let node = if i % 2 == 0 { "node1" } else { "node2" };
            pod(
                &format!("churn-{i}"),
                node,
                "churn",
                &["bash", "-c", &script],
            )
            .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// Now, seconds since the epoch (the clock tcpdump and the clients stamp with).
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What the drills need from `state.json`.
#[derive(Debug)]
pub struct Layout {
    pub prefix: String,
    /// `(node, netns name)`.
    pub nodes: Vec<(String, String)>,
    /// `name → (ip, netns path, workdir)` of the drill pods.
    pub pods: Vec<(String, Ipv4Addr, PathBuf, PathBuf)>,
}

impl Layout {
    pub fn read(run: &Path) -> Layout {
        let text = std::fs::read_to_string(run.join("state.json")).expect("state.json");
        let state: Value = serde_json::from_str(&text).expect("state json");
        let netns_name = |v: &Value| {
            Path::new(v.as_str().expect("netns"))
                .file_name()
                .expect("netns name")
                .to_string_lossy()
                .into_owned()
        };
        Layout {
            prefix: state["prefix"].as_str().expect("prefix").to_owned(),
            nodes: state["nodes"]
                .as_array()
                .expect("nodes")
                .iter()
                .map(|n| {
                    (
                        n["name"].as_str().expect("name").to_owned(),
                        netns_name(&n["netns"]),
                    )
                })
                .collect(),
            pods: state["pods"]
                .as_array()
                .expect("pods")
                .iter()
                .filter(|p| p["namespace"] == "drill")
                .map(|p| {
                    (
                        p["name"].as_str().expect("name").to_owned(),
                        p["ip"].as_str().expect("ip").parse().expect("ip"),
                        PathBuf::from(p["netns"].as_str().expect("netns")),
                        PathBuf::from(p["workdir"].as_str().expect("workdir")),
                    )
                })
                .collect(),
        }
    }

    pub fn pod(&self, name: &str) -> &(String, Ipv4Addr, PathBuf, PathBuf) {
        self.pods
            .iter()
            .find(|p| p.0 == name)
            .unwrap_or_else(|| panic!("pod {name}"))
    }

    pub fn ip(&self, name: &str) -> Ipv4Addr {
        self.pod(name).1
    }

    pub fn workdir(&self, name: &str) -> PathBuf {
        self.pod(name).3.clone()
    }

    /// Addresses of every pod of the `drill` namespace (all of them enrolled).
    pub fn enrolled(&self) -> HashSet<Ipv4Addr> {
        self.pods.iter().map(|p| p.1).collect()
    }
}

/// A node component's health from `ambit status -o json`.
#[derive(Debug, Clone, PartialEq)]
pub struct Health {
    pub running: bool,
    pub ready: bool,
    pub restarts: u64,
}

/// `component` (`agent` or `ztunnel`) of `node`, or the control plane (`control`).
pub fn health(run: &Path, component: &str, node: &str) -> Health {
    let st = status_json(run);
    let v = if component == "control" {
        st["control"].clone()
    } else {
        st["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .find(|n| n["name"] == node)
            .map(|n| n[component].clone())
            .unwrap_or_default()
    };
    Health {
        running: v["running"] == true,
        // The control plane has no readiness in status: running is what it shows.
        ready: v["ready"] == true || (component == "control" && v["running"] == true),
        restarts: v["restarts"].as_u64().unwrap_or(0),
    }
}

/// Every node's `ambit_enrolled_unprotected_pods` (`None` while an agent cannot tell).
pub fn unprotected(run: &Path) -> Vec<Option<u64>> {
    status_json(run)["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["unprotected_pods"].as_u64())
        .collect()
}

/// Runs `argv` inside the namespace at `netns`; its output, or the failure.
pub fn in_netns(netns: &Path, argv: &[&str]) -> Result<String, String> {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(argv)
        .output()
        .map_err(|e| format!("nsenter {argv:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{argv:?} in {}: {}{}",
            netns.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The ambit rules of a pod's namespace (`iptables-save` lines naming ISTIO chains),
/// sorted, IPv4 and IPv6.
pub fn istio_rules(netns: &Path) -> Vec<String> {
    let mut rules: Vec<String> = ["iptables-save", "ip6tables-save"]
        .iter()
        .filter_map(|tool| in_netns(netns, &[tool]).ok())
        .flat_map(|t| t.lines().map(str::to_owned).collect::<Vec<_>>())
        .filter(|l| l.contains("ISTIO") && l.starts_with("-A"))
        .collect();
    rules.sort();
    rules
}

/// Connections in the conntrack table of the namespace at `netns` that leave the pod
/// unredirected: the original destination is a pod or Service address (not 15008) and the
/// reply comes from that destination, not from ztunnel's redirect target on loopback. Such an
/// entry carries every later packet of its tuple past the nat rules until it expires.
pub fn unredirected_conntrack(netns: &Path, pod_net: [u8; 2]) -> Vec<String> {
    let text = in_netns(netns, &["cat", "/proc/net/nf_conntrack"]).unwrap_or_default();
    text.lines()
        .filter(|l| {
            let fields: Vec<(&str, &str)> = l
                .split_whitespace()
                .filter_map(|w| w.split_once('='))
                .collect();
            let get = |k: &str, nth: usize| {
                fields
                    .iter()
                    .filter(|(key, _)| *key == k)
                    .nth(nth)
                    .map(|(_, v)| *v)
            };
            let (Some(dst), Some(dport), Some(reply_src)) =
                (get("dst", 0), get("dport", 0), get("src", 1))
            else {
                return false;
            };
            let to_mesh = dst
                .parse::<Ipv4Addr>()
                .is_ok_and(|ip| is_service(ip) || ip.octets()[..2] == pod_net);
            to_mesh && dport != "15008" && reply_src == dst
        })
        .map(str::to_owned)
        .collect()
}

/// One identity's certificate on a node: when it was issued and when it expires (epoch s).
#[derive(Debug, Clone, PartialEq)]
pub struct Cert {
    pub node: String,
    pub identity: String,
    pub state: String,
    pub valid_from: f64,
    pub expires: f64,
}

impl Cert {
    /// ztunnel renews at half-life.
    pub fn refresh_at(&self) -> f64 {
        self.valid_from + (self.expires - self.valid_from) / 2.0
    }
}

/// Every node's certificates (`ambit ztunnel-config certificates -o json`).
pub fn certificates(run: &Path) -> Vec<Cert> {
    let out = ambit(run, &["ztunnel-config", "certificates", "-o", "json"]);
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap_or_default();
    let mut certs = Vec::new();
    for (node, list) in v.as_object().into_iter().flatten() {
        for c in list.as_array().into_iter().flatten() {
            let leaf = &c["certChain"][0];
            let (Some(from), Some(to)) = (
                leaf["validFrom"].as_str().and_then(rfc3339),
                leaf["expirationTime"].as_str().and_then(rfc3339),
            ) else {
                continue;
            };
            certs.push(Cert {
                node: node.clone(),
                identity: c["identity"].as_str().unwrap_or_default().to_owned(),
                state: c["state"].as_str().unwrap_or_default().to_owned(),
                valid_from: from,
                expires: to,
            });
        }
    }
    certs
}

/// `YYYY-MM-DDTHH:MM:SSZ` → seconds since the epoch.
pub fn rfc3339(s: &str) -> Option<f64> {
    let b = s.as_bytes();
    if b.len() != 20 || b[4] != b'-' || b[10] != b'T' || b[19] != b'Z' {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (hh, mm, ss) = (n(11..13)?, n(14..16)?, n(17..19)?);
    // Howard Hinnant's days_from_civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + hh * 3600 + mm * 60 + ss) as f64)
}

/// Waits up to `limit` for `f`; `Some` with how long it took, `None` on timeout.
pub fn within(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = std::time::Instant::now();
    loop {
        if f() {
            return Some(start.elapsed());
        }
        if start.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn rfc3339_times() {
    let cases = [
        ("1970-01-01T00:00:00Z", Some(0.0)),
        ("2026-11-30T19:01:50Z", Some(1_796_065_310.0)),
        ("2000-03-01T00:00:01Z", Some(951_868_801.0)),
        ("2026-11-30 19:01:50", None),
    ];
    for (s, want) in cases {
        assert_eq!(rfc3339(s), want, "{s}");
    }
}
