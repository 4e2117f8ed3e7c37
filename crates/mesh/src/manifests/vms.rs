//! `kind: VirtualMachine` (`apiVersion: ambit.io/v1alpha1`): a VM beside the cluster, the
//! embedded mesh's own document (`docs/vm.md`, "VMs in `ambit up`"). It reads like a Pod of
//! the embedded mesh: a name and namespace, and the command that runs on the "machine"; in
//! place of `spec.nodeName` it names the Istio `WorkloadGroup` it joins, which the same
//! manifests hold:
//!
//! ```yaml
//! apiVersion: ambit.io/v1alpha1
//! kind: VirtualMachine
//! metadata: {name: billing-vm, namespace: demo}
//! spec:
//!   workloadGroup: billing          # a WorkloadGroup in the same namespace
//!   command: [python3, -m, http.server, "8080"]
//!   env: [{name: PYTHONUNBUFFERED, value: "1"}]
//! ```
//!
//! Only `ambit up` reads these documents: the control plane never sees them (to it, the VM
//! is the WorkloadEntry it registers when the VM's ztunnel connects). Every field is known;
//! an unknown one is refused naming file, document and key path, as for the security kinds.

use std::collections::BTreeMap;

use ambit_control::objects::{ObjectSet, Origin};
use serde::Deserialize;
use serde_norway::Value;

use super::ManifestError;

/// The document's `apiVersion`.
pub const API_VERSION: &str = "ambit.io/v1alpha1";
/// The document's `kind`.
pub const KIND: &str = "VirtualMachine";

/// One VM to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmPlan {
    pub namespace: String,
    pub name: String,
    /// The WorkloadGroup (in `namespace`) the VM joins.
    pub group: String,
    /// The group's service account (`default` when the template names none): the VM's
    /// identity.
    pub service_account: String,
    /// Name in the topology (`vm.NAME.NAMESPACE`): a namespace on the node network.
    pub topology_name: String,
    /// `spec.command` followed by `spec.args`.
    pub argv: Vec<String>,
    /// `spec.env`.
    pub env: Vec<(String, String)>,
    pub origin: Origin,
}

impl VmPlan {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct VmDoc {
    #[allow(dead_code)] // checked by `is_vm`
    api_version: String,
    #[allow(dead_code)] // checked by `is_vm`
    kind: String,
    metadata: Meta,
    spec: Spec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Meta {
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    #[allow(dead_code)] // accepted as on any object
    labels: BTreeMap<String, String>,
    #[serde(default)]
    #[allow(dead_code)] // accepted as on any object
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Spec {
    workload_group: String,
    #[serde(default)]
    command: Vec<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvVar {
    name: String,
    #[serde(default)]
    value: String,
}

/// Whether a parsed document is a VirtualMachine (by `kind`; a wrong `apiVersion` with that
/// kind is refused by [`parse`]).
pub(super) fn is_vm(value: &Value) -> bool {
    value.get("kind").and_then(Value::as_str) == Some(KIND)
}

/// A VirtualMachine document, checked on its own (the group and namespace are checked
/// against the whole set by [`plan`]).
pub(super) fn parse(origin: &Origin, value: &Value) -> Result<VmPlan, ManifestError> {
    let bad = |message: String| ManifestError::BadVm {
        origin: origin.clone(),
        message,
    };
    let api = value.get("apiVersion").and_then(Value::as_str);
    if api != Some(API_VERSION) {
        return Err(bad(format!(
            "apiVersion {api:?}: a VirtualMachine is {API_VERSION:?}"
        )));
    }
    // Through text, so that an unknown field's error names its key path.
    let text = serde_norway::to_string(value).map_err(|e| bad(e.to_string()))?;
    let doc: VmDoc = serde_norway::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let namespace = if doc.metadata.namespace.is_empty() {
        "default".to_owned()
    } else {
        doc.metadata.namespace
    };
    let name = doc.metadata.name;
    let dns_label = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    };
    if !dns_label(&name) {
        return Err(bad(format!(
            "metadata.name {name:?}: must be a DNS label (lowercase letters, digits, '-')"
        )));
    }
    let topology_name = format!("vm.{name}.{namespace}");
    if topology_name.len() > 40 {
        return Err(bad(format!(
            "name too long for a network namespace ({topology_name:?}: namespace + name ≤ 36 \
             characters)"
        )));
    }
    if doc.spec.workload_group.is_empty() {
        return Err(bad("spec.workloadGroup: required".into()));
    }
    let argv: Vec<String> = doc.spec.command.into_iter().chain(doc.spec.args).collect();
    if argv.is_empty() {
        return Err(bad(
            "spec.command: required (the command runs from the host's filesystem inside the \
             VM's network namespace)"
                .into(),
        ));
    }
    Ok(VmPlan {
        namespace,
        name,
        group: doc.spec.workload_group,
        service_account: String::new(),
        topology_name,
        argv,
        env: doc
            .spec
            .env
            .into_iter()
            .map(|e| (e.name, e.value))
            .collect(),
        origin: origin.clone(),
    })
}

/// Checks every VM against the loaded objects (its namespace and WorkloadGroup exist, no two
/// VMs share a name) and fills in the group's service account.
pub(super) fn plan(set: &ObjectSet, vms: &mut [VmPlan]) -> Result<(), ManifestError> {
    let mut seen = BTreeMap::new();
    for vm in vms.iter_mut() {
        if let Some(first) = seen.insert(vm.key(), vm.origin.clone()) {
            return Err(ManifestError::BadVm {
                origin: vm.origin.clone(),
                message: format!("VirtualMachine {} is also defined in {first}", vm.key()),
            });
        }
        if vm.namespace != "default"
            && !set
                .namespaces
                .iter()
                .any(|n| n.metadata.name == vm.namespace)
        {
            return Err(ManifestError::BadVm {
                origin: vm.origin.clone(),
                message: format!(
                    "namespace {:?} is not defined (add a Namespace document)",
                    vm.namespace
                ),
            });
        }
        if set
            .pods
            .iter()
            .any(|p| p.metadata.namespace == vm.namespace && p.metadata.name == vm.name)
        {
            return Err(ManifestError::BadVm {
                origin: vm.origin.clone(),
                message: format!(
                    "a Pod {} has the same name (`ambit exec` and `ambit logs` name both)",
                    vm.key()
                ),
            });
        }
        let Some(group) = set
            .workload_groups
            .iter()
            .find(|g| g.metadata.namespace == vm.namespace && g.metadata.name == vm.group)
        else {
            return Err(ManifestError::BadVm {
                origin: vm.origin.clone(),
                message: format!(
                    "spec.workloadGroup: no WorkloadGroup {}/{} in the manifests",
                    vm.namespace, vm.group
                ),
            });
        };
        vm.service_account = match group.spec.template.service_account.as_str() {
            "" => "default".to_owned(),
            sa => sa.to_owned(),
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::manifests::{ManifestError, Manifests};

    const BASE: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: demo}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: demo}\nspec:\n  nodeName: node1\n  containers: [{name: c, command: [sleep, infinity]}]\n---\napiVersion: networking.istio.io/v1\nkind: WorkloadGroup\nmetadata: {name: g, namespace: demo}\nspec:\n  metadata: {labels: {app: vm}}\n  template: {serviceAccount: vm-sa, ports: {http: 8080}}\n";

    fn vm(spec: &str) -> String {
        format!(
            "apiVersion: ambit.io/v1alpha1\nkind: VirtualMachine\nmetadata: {{name: vm1, namespace: demo}}\nspec:\n{spec}"
        )
    }

    fn load(text: &str) -> Result<Manifests, ManifestError> {
        Manifests::from_texts(&[("dir/m.yaml".to_string(), text.to_string())])
    }

    const GOOD_SPEC: &str = "  workloadGroup: g\n  command: [python3, -m, http.server]\n  args: [\"8080\"]\n  env: [{name: A, value: b}]\n";

    #[test]
    fn plans_a_vm_beside_the_pods() {
        let m = load(&format!("{BASE}---\n{}", vm(GOOD_SPEC))).expect("valid");
        let v = &m.vms()[0];
        assert_eq!(v.key(), "demo/vm1");
        assert_eq!(v.group, "g");
        assert_eq!(v.service_account, "vm-sa");
        assert_eq!(v.topology_name, "vm.vm1.demo");
        assert_eq!(v.argv, ["python3", "-m", "http.server", "8080"]);
        assert_eq!(v.env, [("A".to_string(), "b".to_string())]);
        assert_eq!(v.origin.document, 4);
        assert_eq!(m.pods().len(), 1);
        // The control plane never sees the VM document.
        let rendered = m.render(&Default::default(), None);
        assert!(!rendered.contains("VirtualMachine"), "{rendered}");
        assert!(rendered.contains("WorkloadGroup"), "{rendered}");
        assert!(m.workload_group_text("demo", "g").is_some());
    }

    #[test]
    fn refuses_bad_vms_naming_file_and_document() {
        let good = vm(GOOD_SPEC);
        // (case, documents after BASE, what the error must mention)
        let cases: Vec<(&str, String, &str)> = vec![
            (
                "misspelt key",
                vm("  workloadGroup: g\n  comand: [sleep]\n"),
                "spec: unknown field `comand`",
            ),
            (
                "unknown metadata key",
                good.replace("namespace: demo}", "namespace: demo, uid: x}"),
                "metadata: unknown field `uid`",
            ),
            (
                "wrong apiVersion",
                good.replace("ambit.io/v1alpha1", "v1"),
                "apiVersion",
            ),
            ("no group", vm("  command: [sleep]\n"), "workloadGroup"),
            (
                "unknown group",
                vm("  workloadGroup: nope\n  command: [sleep]\n"),
                "no WorkloadGroup demo/nope",
            ),
            (
                "no command",
                vm("  workloadGroup: g\n"),
                "spec.command: required",
            ),
            (
                "unknown namespace",
                good.replace("namespace: demo", "namespace: other"),
                "namespace \"other\" is not defined",
            ),
            (
                "same name as a pod",
                good.replace("name: vm1", "name: p"),
                "a Pod demo/p has the same name",
            ),
            (
                "twice",
                format!("{good}---\n{good}"),
                "also defined in dir/m.yaml: document 4",
            ),
            (
                "not a DNS label",
                good.replace("name: vm1", "name: Vm_1"),
                "must be a DNS label",
            ),
        ];
        for (name, docs, needle) in cases {
            let err = load(&format!("{BASE}---\n{docs}"))
                .expect_err(name)
                .to_string();
            assert!(err.contains("dir/m.yaml: document"), "{name}: {err}");
            assert!(err.contains(needle), "{name}: {err}");
        }
    }

    #[test]
    fn a_running_mesh_keeps_its_vms() {
        let m = load(&format!("{BASE}---\n{}", vm(GOOD_SPEC))).expect("valid");
        let err = m
            .apply("new.yaml", &vm(GOOD_SPEC))
            .expect_err("VMs are fixed")
            .to_string();
        assert!(
            err.contains("new.yaml: document 1") && err.contains("ambit up"),
            "{err}"
        );
        let group = "apiVersion: networking.istio.io/v1\nkind: WorkloadGroup\nmetadata: {name: g, namespace: demo}\n";
        let err = m
            .delete("d.yaml", group)
            .expect_err("the VM's group stays")
            .to_string();
        assert!(err.contains("no WorkloadGroup demo/g"), "{err}");
        // Other changes still apply, and the VM stays planned.
        let (next, _) = m
            .apply("p.yaml", &BASE.replace("infinity", "1000"))
            .expect("applies");
        assert_eq!(next.vms(), m.vms());
    }
}
