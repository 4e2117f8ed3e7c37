//! VMs in the embedded mesh (`kind: VirtualMachine`, [`crate::manifests::vms`]): each a
//! network namespace on the node network (beside the nodes, not behind one), joined to the
//! mesh as a real VM is (`docs/vm.md`):
//!
//! 1. a token for the WorkloadGroup's service account goes into the control plane's token
//!    file before it starts (what `ambit vm configure --tokens` does);
//! 2. once the control plane's CA exists, the bundle `ambit vm configure --autoregister`
//!    would write (with the `kind: MeshConfig` document's trust domain and proxyMetadata) (cluster.env, mesh.yaml, hosts, root-cert.pem, istio-token) goes into
//!    `RUN/vms/vm.NAME.NAMESPACE/bundle/`, with the control plane's name in `hosts` and the
//!    VM's address as `ISTIO_SVC_IP`;
//! 3. `ambit vm up BUNDLE` runs inside the VM's namespace: host-level redirection and a
//!    dedicated-mode ztunnel, which auto-registers the VM as a WorkloadEntry of the group;
//! 4. once `vm up` marks itself ready (ztunnel ready and the rules in place), the VM's
//!    command starts in the namespace, so none of its traffic precedes the capture.
//!
//! Both processes are supervised like a pod's and stopped, with the namespace, on `down`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::process::Command;

use ambit_netns::{NetnsFd, set_command_netns};
use ambit_topology::Topology;

use crate::state::{Role, VmState};
use crate::up::{CONTROL_HOSTNAME, Mesh, UpError, io_err, random_token};

/// Why a VM could not be started (inside [`UpError::Vm`]).
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("VM {vm}: {source}")]
    Configure {
        vm: String,
        #[source]
        source: ambit_vm::configure::ConfigureError,
    },
    #[error("VM {vm}: its WorkloadGroup {group} is not in the manifests")]
    NoGroup { vm: String, group: String },
}

impl Mesh {
    /// Records every VM of the manifests with its namespace and address in the topology.
    pub(crate) fn plan_vms(&mut self, topo: &Topology) -> Result<(), UpError> {
        // The mesh's trust domain: its MeshConfig's, else the control plane's default.
        let trust_domain =
            crate::manifests::MeshConfigDoc::trust_domain(self.manifests.mesh_config()).to_owned();
        for plan in self.manifests.vms() {
            let Some(node) = topo.get_node(&plan.topology_name) else {
                continue;
            };
            let dir = self.run.vm(&plan.topology_name);
            std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
            self.state.vms.push(VmState {
                namespace: plan.namespace.clone(),
                name: plan.name.clone(),
                group: plan.group.clone(),
                ip: node.ip(),
                netns: node.netns().path(),
                identity: format!(
                    "spiffe://{trust_domain}/ns/{}/sa/{}",
                    plan.namespace, plan.service_account
                ),
                argv: plan.argv.clone(),
                env: plan.env.clone(),
                dir,
            });
        }
        Ok(())
    }

    /// Adds a token per VM (the group's identity) to the control plane's token file;
    /// the tokens by VM (`namespace/name`).
    pub(crate) fn vm_tokens(&self, tokens_yaml: &mut String) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for vm in &self.state.vms {
            let token = random_token();
            *tokens_yaml += &format!("- token: \"{token}\"\n  identity: \"{}\"\n", vm.identity);
            out.insert(format!("{}/{}", vm.namespace, vm.name), token);
        }
        out
    }

    /// Steps 2–4 of the module docs for VM `i`.
    pub(crate) fn start_vm(
        &mut self,
        i: usize,
        tokens: &BTreeMap<String, String>,
        progress: &dyn Fn(&str),
    ) -> Result<(), UpError> {
        let vm = self.state.vms[i].clone();
        let key = format!("{}/{}", vm.namespace, vm.name);
        let bundle = vm.dir.join("bundle");
        self.write_bundle(&vm, &bundle, tokens.get(&key).cloned().unwrap_or_default())?;

        let run_dir = vm.dir.join("run");
        let mut cmd = self.role_command(&vm.netns)?;
        cmd.arg("vm")
            .arg("up")
            .arg(&bundle)
            .arg("--run-dir")
            .arg(&run_dir)
            .arg("--ready-timeout")
            .arg(self.cfg.timeout.as_secs().max(1).to_string());
        let role = Role::Vm {
            namespace: vm.namespace.clone(),
            name: vm.name.clone(),
        };
        self.spawn(
            cmd,
            role.clone(),
            &format!("vm-{}-{}.log", vm.namespace, vm.name),
        )?;
        let ready = run_dir.join(ambit_vm::up::READY_FILE);
        self.wait_for(&format!("vm up of VM {key}"), &role, || ready.exists())?;

        let mut cmd = Command::new(&vm.argv[0]);
        set_command_netns(&mut cmd, &NetnsFd::open(&vm.netns)?)?;
        cmd.args(&vm.argv[1..])
            .env_clear()
            .envs(self.cfg.base_env.iter().cloned())
            .env("HOSTNAME", &vm.name)
            .envs(vm.env.iter().cloned())
            .current_dir(&vm.dir);
        self.spawn(
            cmd,
            Role::VmCommand {
                namespace: vm.namespace.clone(),
                name: vm.name.clone(),
            },
            &format!("vm-command-{}-{}.log", vm.namespace, vm.name),
        )?;
        progress(&format!(
            "VM {key} at {} in the mesh as {} (WorkloadGroup {})",
            vm.ip, vm.identity, vm.group
        ));
        Ok(())
    }

    /// What `ambit vm configure -f GROUP --autoregister` writes for this VM.
    fn write_bundle(
        &self,
        vm: &VmState,
        dir: &std::path::Path,
        token: String,
    ) -> Result<(), UpError> {
        let key = format!("{}/{}", vm.namespace, vm.name);
        let configure = |source| {
            UpError::Vm(VmError::Configure {
                vm: key.clone(),
                source,
            })
        };
        let text = self
            .manifests
            .workload_group_text(&vm.namespace, &vm.group)
            .ok_or_else(|| {
                UpError::Vm(VmError::NoGroup {
                    vm: key.clone(),
                    group: format!("{}/{}", vm.namespace, vm.group),
                })
            })?;
        let origin = format!("WorkloadGroup {}/{}", vm.namespace, vm.group);
        let group = ambit_vm::configure::parse_group(&origin, &text).map_err(configure)?;
        let root = &self.state.root_cert;
        let root_cert_pem = std::fs::read_to_string(root).map_err(io_err(root))?;
        let control = self
            .state
            .control_address
            .map(|a| a.ip())
            .unwrap_or(IpAddr::from([127, 0, 0, 1]));
        let port = self
            .state
            .control_address
            .map_or(ambit_contract::ports::CONTROL_PLANE, |a| a.port());
        let mesh = self.manifests.mesh_config();
        let files = ambit_vm::configure::render(
            &group,
            &ambit_vm::configure::Options {
                ca_address: format!("{CONTROL_HOSTNAME}:{port}"),
                ingress_ip: Some(control),
                internal_ip: Some(IpAddr::V4(vm.ip)),
                cluster_id: "Kubernetes".into(),
                // Empty: the default, as before any MeshConfig; else the MeshConfig's.
                trust_domain: mesh
                    .and_then(|m| m.config.trust_domain.clone())
                    .unwrap_or_default(),
                capture_dns: self.cfg.dns_capture,
                auto_register: true,
                root_cert_pem,
                token,
                proxy_metadata: mesh
                    .map(|m| m.config.proxy_metadata.clone())
                    .unwrap_or_default(),
            },
        );
        files.write(dir).map_err(configure)
    }
}
