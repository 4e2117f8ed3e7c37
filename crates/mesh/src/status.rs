//! `ambit status`: the recorded state joined with live checks — which processes run, the
//! agents' and ztunnels' readiness (asked inside each node namespace) and each ztunnel's
//! certificates from its admin `/config_dump`.

use std::net::{Ipv4Addr, SocketAddr};

use serde::Serialize;
use serde_json::Value;

use crate::process;
use crate::state::{MeshState, Phase, Role, RunDir, StateError};
use ambit_contract::ports;

#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub prefix: String,
    pub phase: Phase,
    /// Whether the `ambit up` process still runs.
    pub orchestrator: bool,
    pub control: ControlStatus,
    pub nodes: Vec<NodeStatus>,
    pub pods: Vec<PodStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub vms: Vec<VmStatus>,
}

/// A VM (`kind: VirtualMachine`).
#[derive(Debug, Clone, Serialize)]
pub struct VmStatus {
    pub namespace: String,
    pub name: String,
    pub group: String,
    pub ip: Ipv4Addr,
    pub identity: String,
    /// `ambit vm up` and its ztunnel: running, and ztunnel's readiness in the VM's namespace.
    pub ztunnel: Component,
    /// The VM's command runs.
    pub running: bool,
    pub restarts: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct ControlStatus {
    pub address: Option<SocketAddr>,
    pub running: bool,
    /// How often the supervisor restarted it after it exited on its own.
    pub restarts: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeStatus {
    pub name: String,
    pub ip: Ipv4Addr,
    /// The ztunnel pod's address (metrics on :15020, readiness on :15021).
    pub ztunnel_ip: Option<Ipv4Addr>,
    pub agent: Component,
    pub ztunnel: Component,
    /// The agent's `ambit_enrolled_unprotected_pods` (enrolled pods whose rules or ztunnel
    /// listeners were missing at its last verification): 0 when healthy, `None` when the
    /// agent's metrics could not be read.
    pub unprotected_pods: Option<u64>,
    pub certificates: Vec<Certificate>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Component {
    pub running: bool,
    pub ready: bool,
    /// How often the supervisor restarted it after it exited on its own.
    pub restarts: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct Certificate {
    pub identity: String,
    pub state: String,
    /// The leaf's expiry, as ztunnel reports it.
    pub expires: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PodStatus {
    pub namespace: String,
    pub name: String,
    pub node: String,
    pub ip: Ipv4Addr,
    pub ambient: bool,
    pub enrolled: bool,
    /// What the node's agent last wrote as the pod's `ambient.istio.io/redirection`
    /// annotation (`enabled`, `pending`), `None` when absent: the agent's own view, which
    /// `enrolled` (the orchestrator's) follows.
    pub redirection: Option<String>,
    pub running: bool,
    /// How often the supervisor restarted the pod's process after it exited on its own.
    pub restarts: u32,
}

/// The status of the mesh in `run`; `None` when nothing is recorded there.
pub fn status(run: &RunDir) -> Result<Option<Status>, StateError> {
    Ok(run.load()?.map(|s| collect(run, &s)))
}

fn running(state: &MeshState, role: &Role) -> bool {
    state
        .processes
        .iter()
        .any(|p| &p.role == role && process::is_alive(p))
}

fn collect(run: &RunDir, state: &MeshState) -> Status {
    let nodes = state
        .nodes
        .iter()
        .map(|n| {
            let role = Role::Agent {
                node: n.name.clone(),
            };
            let agent = Component {
                running: running(state, &role),
                ready: crate::probe::ok(&n.netns, n.agent_health, "/readyz"),
                restarts: state.restarts(&role),
            };
            let role = Role::Ztunnel {
                node: n.name.clone(),
            };
            let ztunnel = Component {
                running: running(state, &role),
                restarts: state.restarts(&role),
                ready: crate::probe::ok(
                    n.ztunnel_netns(),
                    SocketAddr::from(([127, 0, 0, 1], ports::ZTUNNEL_READINESS)),
                    "/healthz/ready",
                ),
            };
            let certificates = crate::probe::http_get(
                n.ztunnel_netns(),
                SocketAddr::from(([127, 0, 0, 1], ports::ZTUNNEL_ADMIN)),
                "/config_dump",
            )
            .and_then(|(code, body)| (code == 200).then_some(body))
            .and_then(|body| serde_json::from_str::<Value>(&body).ok())
            .map(|dump| certificates(&dump))
            .unwrap_or_default();
            NodeStatus {
                name: n.name.clone(),
                ip: n.ip,
                ztunnel_ip: n.ztunnel.as_ref().map(|z| z.ip),
                unprotected_pods: crate::probe::http_get(&n.netns, n.agent_metrics, "/metrics")
                    .filter(|(code, _)| *code == 200)
                    .and_then(|(_, body)| gauge(&body, "ambit_enrolled_unprotected_pods")),
                agent,
                ztunnel,
                certificates,
            }
        })
        .collect();
    let pods = state
        .pods
        .iter()
        .map(|p| {
            let role = Role::Pod {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
            };
            PodStatus {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                node: p.node.clone(),
                ip: p.ip,
                ambient: p.ambient,
                enrolled: p.enrolled,
                redirection: std::fs::read_to_string(
                    run.pod_status(&p.node)
                        .join(format!("{}_{}", p.namespace, p.name)),
                )
                .ok()
                .map(|v| v.trim().to_owned()),
                running: running(state, &role),
                restarts: state.restarts(&role),
            }
        })
        .collect();
    Status {
        prefix: state.prefix.clone(),
        phase: state.phase,
        orchestrator: running(state, &Role::Orchestrator),
        control: ControlStatus {
            address: state.control_address,
            running: running(state, &Role::Control),
            restarts: state.restarts(&Role::Control),
        },
        nodes,
        pods,
        vms: state.vms.iter().map(|v| vm_status(state, v)).collect(),
    }
}

fn vm_status(state: &MeshState, v: &crate::state::VmState) -> VmStatus {
    let up = Role::Vm {
        namespace: v.namespace.clone(),
        name: v.name.clone(),
    };
    let command = Role::VmCommand {
        namespace: v.namespace.clone(),
        name: v.name.clone(),
    };
    let ready = SocketAddr::from(([127, 0, 0, 1], ports::ZTUNNEL_READINESS));
    VmStatus {
        namespace: v.namespace.clone(),
        name: v.name.clone(),
        group: v.group.clone(),
        ip: v.ip,
        identity: v.identity.clone(),
        ztunnel: Component {
            running: running(state, &up),
            ready: crate::probe::ok(&v.netns, ready, "/healthz/ready"),
            restarts: state.restarts(&up),
        },
        running: running(state, &command),
        restarts: state.restarts(&command),
    }
}

/// The value of an unlabelled gauge in Prometheus text.
fn gauge(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix(' ')?;
        rest.trim().parse::<f64>().ok().map(|v| v as u64)
    })
}

/// The `certificates` section of a ztunnel config dump.
fn certificates(dump: &Value) -> Vec<Certificate> {
    dump.get("certificates")
        .and_then(Value::as_array)
        .map(|certs| {
            certs
                .iter()
                .map(|c| Certificate {
                    identity: str_field(c, "identity"),
                    state: str_field(c, "state"),
                    expires: c
                        .get("certChain")
                        .and_then(Value::as_array)
                        .and_then(|chain| chain.first())
                        .and_then(|leaf| leaf.get("expirationTime"))
                        .and_then(Value::as_str)
                        .map(readable_time),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn str_field(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// ztunnel prints times as `SystemTime { tv_sec: N, tv_nsec: M }`; show them as UTC
/// `YYYY-MM-DDTHH:MM:SSZ` (anything else is passed through).
pub(crate) fn readable_time(s: &str) -> String {
    let secs = s
        .split("tv_sec:")
        .nth(1)
        .and_then(|rest| rest.split([',', '}']).next())
        .and_then(|n| n.trim().parse::<i64>().ok());
    let Some(secs) = secs else {
        return s.to_owned();
    };
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_from_prometheus_text() {
        let text = "# TYPE ambit_enrolled_unprotected_pods gauge\nambit_enrolled_unprotected_pods 3\nambit_enrolled_unprotected_pods_x 9\n";
        assert_eq!(gauge(text, "ambit_enrolled_unprotected_pods"), Some(3));
        assert_eq!(gauge("", "ambit_enrolled_unprotected_pods"), None);
        assert_eq!(
            gauge(
                "ambit_enrolled_unprotected_pods NaNx\n",
                "ambit_enrolled_unprotected_pods"
            ),
            None
        );
    }

    #[test]
    fn times() {
        let cases = [
            (
                "SystemTime { tv_sec: 0, tv_nsec: 0 }",
                "1970-01-01T00:00:00Z",
            ),
            (
                "SystemTime { tv_sec: 1796065310, tv_nsec: 5 }",
                "2026-11-30T19:01:50Z",
            ),
            ("2030-01-01", "2030-01-01"),
        ];
        for (input, want) in cases {
            assert_eq!(readable_time(input), want, "{input}");
        }
    }
}
