//! The run directory: one place holding everything a mesh created outside its namespaces,
//! and `state.json`, the record `ambit down` (or the next `up`) uses to remove a mesh whose
//! orchestrator is gone.
//!
//! The state is written atomically (temp file + rename) before each thing it records is
//! created — the prefix before the first namespace — and right after each process starts, so
//! a SIGKILL at any point leaves a record at least as large as what exists.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Why the state could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a mesh state file: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The file names inside a run directory.
#[derive(Debug, Clone)]
pub struct RunDir {
    root: PathBuf,
}

impl RunDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn state(&self) -> PathBuf {
        self.root.join("state.json")
    }
    /// The generated manifests the control plane watches.
    pub fn manifests(&self) -> PathBuf {
        self.root.join("manifests")
    }
    pub fn control(&self) -> PathBuf {
        self.root.join("control")
    }
    pub fn tokens(&self) -> PathBuf {
        self.root.join("tokens.yaml")
    }
    /// The `kind: MeshConfig` document for `ambit control --mesh-config` (outside the
    /// manifests directory: it is not an object).
    pub fn mesh_config(&self) -> PathBuf {
        self.root.join("mesh-config.yaml")
    }
    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }
    pub fn node(&self, node: &str) -> PathBuf {
        self.root.join("nodes").join(node)
    }
    pub fn pod(&self, topology_name: &str) -> PathBuf {
        self.root.join("pods").join(topology_name)
    }
    /// A VM's directory (`bundle/` as `ambit vm configure` writes it, `run/` for `vm up`,
    /// the working directory of its command).
    pub fn vm(&self, topology_name: &str) -> PathBuf {
        self.root.join("vms").join(topology_name)
    }
    /// Where a node's agent writes its pods' redirection annotations (one file per pod,
    /// `NAMESPACE_NAME`): the API server's copy of what the agent patched.
    pub fn pod_status(&self, node: &str) -> PathBuf {
        self.node(node).join("status")
    }
    /// The orchestrator's request socket (`ambit apply`, `ambit delete`).
    pub fn api_socket(&self) -> PathBuf {
        self.root.join("api.sock")
    }
    /// Everything `down` deletes (logs are kept for a post-mortem).
    pub fn generated(&self) -> Vec<PathBuf> {
        vec![
            self.manifests(),
            self.control(),
            self.tokens(),
            self.mesh_config(),
            self.root.join("nodes"),
            self.root.join("pods"),
            self.root.join("vms"),
            self.api_socket(),
            self.state(),
        ]
    }

    /// Reads `state.json`; `None` when there is none.
    pub fn load(&self) -> Result<Option<MeshState>, StateError> {
        let path = self.state();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(StateError::Io { path, source }),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|source| StateError::Parse { path, source })
    }

    /// Writes `state.json` atomically.
    pub fn save(&self, state: &MeshState) -> Result<(), StateError> {
        let path = self.state();
        let io = |source| StateError::Io {
            path: path.clone(),
            source,
        };
        let text = serde_json::to_vec_pretty(state).map_err(|source| StateError::Parse {
            path: path.clone(),
            source,
        })?;
        write_atomic(&path, &text).map_err(io)
    }
}

/// Writes `path` through a temporary file in the same directory and a rename, so readers
/// (the control plane's watcher, `ambit status`) never see half a file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Where a mesh is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Starting,
    Ready,
    Stopping,
}

/// What a process is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "kebab-case")]
pub enum Role {
    Orchestrator,
    Control,
    Agent {
        node: String,
    },
    Ztunnel {
        node: String,
    },
    Pod {
        namespace: String,
        name: String,
    },
    /// A VM's `ambit vm up` (its ztunnel is its child).
    Vm {
        namespace: String,
        name: String,
    },
    /// The command a VM runs.
    VmCommand {
        namespace: String,
        name: String,
    },
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Role::Orchestrator => f.write_str("orchestrator"),
            Role::Control => f.write_str("control"),
            Role::Agent { node } => write!(f, "cni-agent/{node}"),
            Role::Ztunnel { node } => write!(f, "ztunnel/{node}"),
            Role::Pod { namespace, name } => write!(f, "pod {namespace}/{name}"),
            Role::Vm { namespace, name } => write!(f, "vm {namespace}/{name}"),
            Role::VmCommand { namespace, name } => write!(f, "vm {namespace}/{name} command"),
        }
    }
}

/// A process the mesh started. `start_time` (clock ticks since boot, from
/// `/proc/PID/stat`) guards against killing an unrelated process that reused the pid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRecord {
    #[serde(flatten)]
    pub role: Role,
    pub pid: u32,
    pub start_time: u64,
    /// Whether it leads its own process group (every child does; the orchestrator not).
    pub group: bool,
    pub log: Option<PathBuf>,
    /// How it was started (what `ambit restart` runs again); absent for the orchestrator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<CommandSpec>,
}

/// A recorded command line: program, arguments, the whole environment (children start from
/// a cleared one) and working directory. The namespace is the node's or pod's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub dir: Option<PathBuf>,
}

impl CommandSpec {
    /// What `cmd` runs (its environment must have been cleared for `env` to be complete).
    pub fn of(cmd: &std::process::Command) -> Self {
        let s = |o: &std::ffi::OsStr| o.to_string_lossy().into_owned();
        Self {
            program: PathBuf::from(cmd.get_program()),
            args: cmd.get_args().map(s).collect(),
            env: cmd
                .get_envs()
                .filter_map(|(k, v)| Some((s(k), s(v?))))
                .collect(),
            dir: cmd.get_current_dir().map(Path::to_path_buf),
        }
    }

    /// A command running it again (no namespace set).
    pub fn command(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(&self.program);
        cmd.args(&self.args)
            .env_clear()
            .envs(self.env.iter().cloned());
        if let Some(d) = &self.dir {
            cmd.current_dir(d);
        }
        cmd
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    pub name: String,
    pub ip: Ipv4Addr,
    pub netns: PathBuf,
    pub zds_socket: PathBuf,
    pub agent_run_dir: PathBuf,
    /// Agent health (`/healthz`, `/readyz`) inside the node netns.
    pub agent_health: SocketAddr,
    pub agent_metrics: SocketAddr,
    /// The node's ztunnel runs in a pod of its own (as upstream's DaemonSet pod): its
    /// namespace and address. Absent in runs of older versions: the node namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ztunnel: Option<ZtunnelPod>,
}

/// The namespace a node's ztunnel runs in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZtunnelPod {
    /// Topology name (`ztunnel-NODE-GENERATION`).
    pub name: String,
    pub netns: PathBuf,
    pub ip: Ipv4Addr,
    /// Incremented by each `ambit restart ztunnel`.
    pub generation: u32,
}

impl NodeState {
    /// Where the ztunnel's admin, stats and readiness ports are.
    pub fn ztunnel_netns(&self) -> &Path {
        self.ztunnel.as_ref().map_or(&self.netns, |z| &z.netns)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodState {
    pub namespace: String,
    pub name: String,
    pub node: String,
    pub ip: Ipv4Addr,
    pub netns: PathBuf,
    /// Selected by the enablement selectors.
    pub ambient: bool,
    /// CNI ADD succeeded and the pod is captured (only ambient pods).
    pub enrolled: bool,
    /// The CNI ADD succeeded (for every pod).
    pub created: bool,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: PathBuf,
}

/// A VM (`kind: VirtualMachine`): a namespace on the node network, bootstrapped from the
/// bundle in `dir/bundle`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmState {
    pub namespace: String,
    pub name: String,
    /// The WorkloadGroup it registers into.
    pub group: String,
    pub ip: Ipv4Addr,
    pub netns: PathBuf,
    /// `spiffe://…` of the group's service account.
    pub identity: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// The VM's directory (bundle, `vm up`'s run directory, the command's working directory).
    pub dir: PathBuf,
}

/// `state.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeshState {
    pub prefix: String,
    pub phase: Phase,
    pub source: PathBuf,
    pub control_address: Option<SocketAddr>,
    pub root_cert: PathBuf,
    pub nodes: Vec<NodeState>,
    pub pods: Vec<PodState>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vms: Vec<VmState>,
    pub processes: Vec<ProcessRecord>,
    /// How often the supervisor restarted each component after it exited on its own
    /// (deliberate restarts and hand-offs are not counted, as in a pod's `restartCount`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restarts: Vec<Restarts>,
}

/// One component's restart count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restarts {
    #[serde(flatten)]
    pub role: Role,
    pub count: u32,
}

impl MeshState {
    /// How often `role` was restarted by the supervisor.
    pub fn restarts(&self, role: &Role) -> u32 {
        self.restarts
            .iter()
            .find(|r| &r.role == role)
            .map_or(0, |r| r.count)
    }

    /// Counts one more restart of `role`; the new count.
    pub fn count_restart(&mut self, role: &Role) -> u32 {
        match self.restarts.iter_mut().find(|r| &r.role == role) {
            Some(r) => {
                r.count += 1;
                r.count
            }
            None => {
                self.restarts.push(Restarts {
                    role: role.clone(),
                    count: 1,
                });
                1
            }
        }
    }

    pub fn pod(&self, query: &str) -> Option<&PodState> {
        find_pod(&self.pods, query)
    }

    /// A VM by `namespace/name`, or by `name` when that is unique.
    pub fn vm(&self, query: &str) -> Option<&VmState> {
        if let Some((ns, name)) = query.split_once('/') {
            return self
                .vms
                .iter()
                .find(|v| v.namespace == ns && v.name == name);
        }
        let mut matches = self.vms.iter().filter(|v| v.name == query);
        let first = matches.next()?;
        matches.next().is_none().then_some(first)
    }
}

/// A pod by `namespace/name`, or by `name` when that is unique.
pub fn find_pod<'a>(pods: &'a [PodState], query: &str) -> Option<&'a PodState> {
    if let Some((ns, name)) = query.split_once('/') {
        return pods.iter().find(|p| p.namespace == ns && p.name == name);
    }
    let mut matches = pods.iter().filter(|p| p.name == query);
    let first = matches.next()?;
    matches.next().is_none().then_some(first)
}
