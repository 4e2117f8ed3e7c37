//! Changing a running mesh (`ambit apply -f`, `ambit delete -f`), as the API server and
//! kubelet would: the changed object set is checked as a whole first (a bad manifest leaves
//! the mesh untouched), then
//!
//! 1. new pods get their network namespace (the topology grows),
//! 2. the generated manifests are rewritten: the control plane picks up policies, services
//!    and pods; each node's agent sees pods appear, change labels or disappear (it watches
//!    its pods file like an informer, and un-enrols deleted pods),
//! 3. deleted pods: their process is stopped, the CNI plugin runs `DEL`, the namespace goes,
//! 4. new pods are created through the CNI plugin (`ADD`) and their process starts,
//! 5. pods whose enrolment changed with a label (pod or namespace) are waited for: the agent
//!    enrols or un-enrols them on its own and writes the redirection annotation (its status
//!    file); only then does the control plane's copy change, as in a cluster.
//!
//! A running pod's node, command, arguments and environment cannot change (as in
//! Kubernetes): delete it and apply it again.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ambit_control::objects::Origin;

use crate::manifests::{Change, ManifestError, Manifests, PodPlan, PodStatus};
use crate::process;
use crate::state::{PodState, Role};
use crate::up::{Mesh, UpError, io_err};

/// Why a change was refused (nothing changed) or failed part-way.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Manifests(#[from] ManifestError),
    #[error(
        "{origin}: Pod {pod}: node {node:?} is not part of this mesh (nodes: {nodes}); nodes \
         are fixed when the mesh starts"
    )]
    UnknownNode {
        origin: Origin,
        pod: String,
        node: String,
        nodes: String,
    },
    #[error(
        "{origin}: Pod {pod}: {field} of a running pod cannot change; delete the pod and apply it again"
    )]
    Immutable {
        origin: Origin,
        pod: String,
        field: &'static str,
    },
    #[error(
        "no pod {pod:?} (known: {known}); use NAMESPACE/NAME when a name is in several namespaces"
    )]
    UnknownPod { pod: String, known: String },
    #[error("applying the change failed part-way: {0}")]
    Failed(#[from] UpError),
    #[error("the agent on {node} did not {what} pod {pod} within {timeout:?} (see its log)")]
    Enrolment {
        node: String,
        pod: String,
        what: &'static str,
        timeout: Duration,
    },
}

/// What a checked change does to pods.
#[derive(Debug, Default)]
struct PodDiff {
    added: Vec<PodPlan>,
    removed: Vec<String>,
    /// Existing pods whose enrolment flips: (key, now ambient).
    flipped: Vec<(String, bool)>,
}

impl Mesh {
    /// `ambit apply -f`: see the module documentation. Returns one line per object.
    pub fn apply(
        &mut self,
        file: &str,
        text: &str,
        progress: &dyn Fn(&str),
    ) -> Result<Vec<String>, ApplyError> {
        let (next, change) = self.manifests.apply(file, text)?;
        self.commit(next, progress)?;
        Ok(lines(&change))
    }

    /// `ambit delete -f`: see the module documentation. Returns one line per object.
    pub fn delete(
        &mut self,
        file: &str,
        text: &str,
        progress: &dyn Fn(&str),
    ) -> Result<Vec<String>, ApplyError> {
        let (next, change) = self.manifests.delete(file, text)?;
        self.commit(next, progress)?;
        Ok(lines(&change))
    }

    /// Refuses what a running mesh cannot do; computes what happens to pods.
    fn check(&self, next: &Manifests) -> Result<PodDiff, ApplyError> {
        let nodes: Vec<&str> = self.state.nodes.iter().map(|n| n.name.as_str()).collect();
        let mut diff = PodDiff::default();
        for p in next.pods() {
            if !nodes.contains(&p.node.as_str()) {
                return Err(ApplyError::UnknownNode {
                    origin: p.origin.clone(),
                    pod: p.key(),
                    node: p.node.clone(),
                    nodes: nodes.join(", "),
                });
            }
            let Some(old) = self.manifests.pods().iter().find(|o| o.key() == p.key()) else {
                diff.added.push(p.clone());
                continue;
            };
            let immutable = |field| ApplyError::Immutable {
                origin: p.origin.clone(),
                pod: p.key(),
                field,
            };
            if old.node != p.node {
                return Err(immutable("spec.nodeName"));
            }
            if old.argv != p.argv {
                return Err(immutable("the first container's command and args"));
            }
            if old.env != p.env {
                return Err(immutable("the first container's env"));
            }
            if old.uid != p.uid {
                return Err(immutable("metadata.uid"));
            }
            if old.ambient != p.ambient {
                diff.flipped.push((p.key(), p.ambient));
            }
        }
        let keep: BTreeSet<String> = next.pods().iter().map(PodPlan::key).collect();
        diff.removed = self
            .manifests
            .pods()
            .iter()
            .map(PodPlan::key)
            .filter(|k| !keep.contains(k))
            .collect();
        Ok(diff)
    }

    fn commit(&mut self, next: Manifests, progress: &dyn Fn(&str)) -> Result<(), ApplyError> {
        let diff = self.check(&next)?;
        // 1. Namespaces for new pods, before anyone reads their addresses. A failure here
        //    (e.g. a node's address range is full) undoes every one made: nothing
        //    else has changed yet.
        for (k, plan) in diff.added.iter().enumerate() {
            if let Err(e) = self.add_pod_network(plan, progress) {
                for done in &diff.added[..=k] {
                    self.forget_pod_network(done);
                }
                return Err(e);
            }
        }
        self.run.save(&self.state).map_err(UpError::from)?;
        // 2. What the control plane and the agents read.
        self.manifests = next;
        self.write_manifests()?;
        // 3. Deleted pods.
        for key in &diff.removed {
            self.remove_pod(key)?;
            progress(&format!("pod {key} deleted"));
        }
        // 4. New pods through the CNI plugin.
        for plan in &diff.added {
            let Some(i) = self.pod_index(&plan.key()) else {
                continue;
            };
            self.create_pod(i, progress)?;
        }
        // 5. Label changes: the agent acts on its own; wait for its annotation.
        for (key, ambient) in &diff.flipped {
            self.await_enrolment(key, *ambient)?;
            if let Some(i) = self.pod_index(key) {
                self.state.pods[i].ambient = *ambient;
                self.state.pods[i].enrolled = *ambient;
            }
            if let Some(st) = self.pod_status.get_mut(key) {
                st.enrolled = *ambient;
            }
            self.write_manifests()?;
            progress(&format!(
                "pod {key}: {}",
                if *ambient {
                    "enrolled in the mesh"
                } else {
                    "removed from the mesh"
                }
            ));
        }
        self.run.save(&self.state).map_err(UpError::from)?;
        Ok(())
    }

    /// Creates the pod's namespace and records it (not yet created through CNI).
    fn add_pod_network(
        &mut self,
        plan: &PodPlan,
        progress: &dyn Fn(&str),
    ) -> Result<(), ApplyError> {
        let topo = self.topology.as_mut().ok_or(UpError::Cancelled)?;
        let tp = topo
            .add_pod(&plan.node, &plan.topology_name)
            .map_err(UpError::from)?;
        let (ip, netns) = (tp.ip(), tp.netns_path());
        let workdir = self.run.pod(&plan.topology_name);
        std::fs::create_dir_all(&workdir).map_err(io_err(&workdir))?;
        self.pod_status.insert(
            plan.key(),
            PodStatus {
                ip: Some(ip),
                enrolled: false,
                netns: Some(netns.display().to_string()),
            },
        );
        self.state.pods.push(PodState {
            namespace: plan.namespace.clone(),
            name: plan.name.clone(),
            node: plan.node.clone(),
            ip,
            netns,
            ambient: plan.ambient,
            enrolled: false,
            created: false,
            argv: plan.argv.clone(),
            env: plan.env.clone(),
            workdir,
        });
        progress(&format!(
            "pod {} on {}: network at {ip}",
            plan.key(),
            plan.node
        ));
        Ok(())
    }

    /// Undoes [`Self::add_pod_network`].
    fn forget_pod_network(&mut self, plan: &PodPlan) {
        if let Some(t) = self.topology.as_mut() {
            let _ = t.remove_pod(&plan.topology_name);
        }
        let _ = std::fs::remove_dir_all(self.run.pod(&plan.topology_name));
        self.pod_status.remove(&plan.key());
        if let Some(i) = self.pod_index(&plan.key()) {
            self.state.pods.remove(i);
        }
    }

    fn pod_index(&self, key: &str) -> Option<usize> {
        self.state
            .pods
            .iter()
            .position(|p| format!("{}/{}", p.namespace, p.name) == key)
    }

    /// Stops the pod's process, runs CNI DEL, deletes its namespace and records.
    fn remove_pod(&mut self, key: &str) -> Result<(), ApplyError> {
        let Some(i) = self.pod_index(key) else {
            return Ok(());
        };
        let pod = self.state.pods[i].clone();
        self.stop_pod_process(&pod);
        if pod.created
            && let Err(e) = self.cni(&pod, "DEL")
        {
            tracing::warn!(pod = %key, error = %e, "CNI DEL failed");
        }
        if let Some(topo) = self.topology.as_mut() {
            topo.remove_pod(&format!("{}.{}", pod.name, pod.namespace))
                .map_err(UpError::from)?;
        }
        let _ = std::fs::remove_dir_all(&pod.workdir);
        let _ = std::fs::remove_file(
            self.run
                .pod_status(&pod.node)
                .join(format!("{}_{}", pod.namespace, pod.name)),
        );
        self.pod_status.remove(key);
        self.state.pods.remove(i);
        self.run.save(&self.state).map_err(UpError::from)?;
        Ok(())
    }

    /// `ambit restart pod`: the pod's sandbox is re-created as a kubelet does when it finds
    /// the sandbox gone: the process is stopped, the runtime runs CNI DEL, the network
    /// namespace is deleted and created again (same name; the address is the node's lowest
    /// free one, so normally the same), CNI ADD runs for the same pod in the new namespace and
    /// the process starts there. The pod object (and its redirection annotation) stays, so the
    /// agent sees an ADD for a pod it already enrolled, in a new namespace.
    pub fn recreate_sandbox(
        &mut self,
        query: &str,
        progress: &dyn Fn(&str),
    ) -> Result<String, ApplyError> {
        let pod = self
            .state
            .pod(query)
            .cloned()
            .ok_or_else(|| ApplyError::UnknownPod {
                pod: query.to_owned(),
                known: self
                    .state
                    .pods
                    .iter()
                    .map(|p| format!("{}/{}", p.namespace, p.name))
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let key = format!("{}/{}", pod.namespace, pod.name);
        self.stop_pod_process(&pod);
        if pod.created
            && let Err(e) = self.cni(&pod, "DEL")
        {
            tracing::warn!(pod = %key, error = %e, "CNI DEL failed");
        }
        let name = format!("{}.{}", pod.name, pod.namespace);
        let topo = self.topology.as_mut().ok_or(UpError::Cancelled)?;
        topo.remove_pod(&name).map_err(UpError::from)?;
        let tp = topo.add_pod(&pod.node, &name).map_err(UpError::from)?;
        let (ip, netns) = (tp.ip(), tp.netns_path());
        let Some(i) = self.pod_index(&key) else {
            return Err(UpError::Cancelled.into());
        };
        self.state.pods[i].ip = ip;
        self.state.pods[i].netns = netns.clone();
        self.state.pods[i].created = false;
        if let Some(st) = self.pod_status.get_mut(&key) {
            st.ip = Some(ip);
            st.netns = Some(netns.display().to_string());
        }
        self.write_manifests()?;
        self.run.save(&self.state).map_err(UpError::from)?;
        progress(&format!("pod {key}: new network namespace at {ip}"));
        self.create_pod(i, progress)?;
        Ok(format!("pod {key} sandbox re-created at {ip}"))
    }

    /// Stops `pod`'s process; it is not restarted.
    fn stop_pod_process(&mut self, pod: &PodState) {
        let role = Role::Pod {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
        };
        let records: Vec<_> = self
            .state
            .processes
            .iter()
            .filter(|r| r.role == role)
            .cloned()
            .collect();
        let children = &mut self.children;
        let left = process::stop_all(&records, Duration::from_secs(5), || {
            for (_, c) in children.iter_mut() {
                let _ = c.try_wait();
            }
        });
        if !left.is_empty() {
            tracing::warn!(pod = %role, "pod process did not stop");
        }
        self.children.retain(|(r, _)| r.role != role);
        self.supervisor.forget(&role);
        self.state.processes.retain(|r| r.role != role);
    }

    /// Polls the agent's status file of the pod until it shows `enabled` (or is gone).
    fn await_enrolment(&self, key: &str, ambient: bool) -> Result<(), ApplyError> {
        let Some(pod) = self
            .state
            .pods
            .iter()
            .find(|p| format!("{}/{}", p.namespace, p.name) == key)
        else {
            return Ok(());
        };
        let file = self
            .run
            .pod_status(&pod.node)
            .join(format!("{}_{}", pod.namespace, pod.name));
        let deadline = Instant::now() + self.cfg.timeout;
        loop {
            let value = std::fs::read_to_string(&file).ok();
            let done = if ambient {
                value.as_deref() == Some("enabled")
            } else {
                value.is_none()
            };
            if done {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ApplyError::Enrolment {
                    node: pod.node.clone(),
                    pod: key.to_owned(),
                    what: if ambient { "enrol" } else { "un-enrol" },
                    timeout: self.cfg.timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn lines(change: &Change) -> Vec<String> {
    let mut out = Vec::new();
    for (what, list) in [
        ("created", &change.created),
        ("configured", &change.configured),
        ("unchanged", &change.unchanged),
        ("deleted", &change.deleted),
    ] {
        out.extend(list.iter().map(|o| format!("{o} {what}")));
    }
    out
}
