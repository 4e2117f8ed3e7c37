//! The optional `kind: MeshConfig` document of the embedded mesh: Istio's MeshConfig (the YAML
//! of the `istio` ConfigMap's `mesh` key) with a `kind`, at most one in the manifests. The
//! control plane gets it as `--mesh-config RUN/mesh-config.yaml`; its trust domain names the
//! VMs' identities, its `defaultConfig.proxyMetadata` goes into the VMs' bundles. `ambit
//! apply` may change it while the mesh runs, except its trust domain.

use ambit_control::mesh_config::MeshConfig;
use ambit_control::objects::Origin;
use serde_norway::Value;

use super::ManifestError;

/// The document's `kind`.
pub const KIND: &str = "MeshConfig";

/// The trust domain when the document does not set one (the control plane's default).
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

/// A checked MeshConfig document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshConfigDoc {
    pub origin: Origin,
    /// The document without `kind` and `apiVersion`: what the control plane reads.
    pub text: String,
    pub config: MeshConfig,
}

impl MeshConfigDoc {
    /// The trust domain of the mesh.
    pub fn trust_domain(doc: Option<&Self>) -> &str {
        doc.and_then(|d| d.config.trust_domain.as_deref())
            .unwrap_or(DEFAULT_TRUST_DOMAIN)
    }
}

pub(super) fn is_mesh_config(value: &Value) -> bool {
    value.get("kind").and_then(Value::as_str) == Some(KIND)
}

/// Checks one MeshConfig document with the control plane's parser.
pub(super) fn parse(origin: &Origin, value: &Value) -> Result<MeshConfigDoc, ManifestError> {
    let mut value = value.clone();
    if let Value::Mapping(m) = &mut value {
        m.remove("kind");
        m.remove("apiVersion");
    }
    let bad = |source| ManifestError::BadMeshConfig {
        origin: origin.clone(),
        source,
    };
    let text = serde_norway::to_string(&value).map_err(|e| {
        bad(ambit_control::mesh_config::MeshConfigError::Yaml {
            origin: origin.to_string(),
            reason: e.to_string(),
        })
    })?;
    let config = MeshConfig::parse(&origin.to_string(), &text).map_err(bad)?;
    Ok(MeshConfigDoc {
        origin: origin.clone(),
        text,
        config,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{ManifestError, Manifests};

    const PODS: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  nodeName: n1\n  containers: [{name: c, command: [sleep]}]\n";

    fn load(texts: &[(&str, String)]) -> Result<Manifests, ManifestError> {
        let texts: Vec<(String, String)> = texts
            .iter()
            .map(|(a, b)| (a.to_string(), b.clone()))
            .collect();
        Manifests::from_texts(&texts)
    }

    /// (case, files, Ok(trust domain, root namespace) or the error's parts)
    type Case = (
        &'static str,
        Vec<(&'static str, String)>,
        Result<(&'static str, Option<&'static str>), &'static [&'static str]>,
    );

    #[test]
    fn at_most_one_good_mesh_config() {
        let mesh = |body: &str| format!("{PODS}---\nkind: MeshConfig\n{body}");
        let cases: Vec<Case> = vec![
            (
                "none",
                vec![("a.yaml", PODS.into())],
                Ok(("cluster.local", None)),
            ),
            (
                "trust domain and root namespace",
                vec![(
                    "a.yaml",
                    mesh(
                        "apiVersion: v1alpha1\ntrustDomain: example.org\nrootNamespace: r\nenableTracing: true\n",
                    ),
                )],
                Ok(("example.org", Some("r"))),
            ),
            (
                "a bad field, named with file and document",
                vec![("a.yaml", mesh("rootNamespace: 7\n"))],
                Err(&["a.yaml", "document 2", "rootNamespace", "expected a string"]),
            ),
            (
                "two documents",
                vec![
                    ("a.yaml", mesh("")),
                    ("b.yaml", "kind: MeshConfig\n".into()),
                ],
                Err(&["b.yaml", "a second MeshConfig", "a.yaml"]),
            ),
        ];
        for (case, files, want) in cases {
            match (load(&files), want) {
                (Ok(m), Ok((td, ns))) => {
                    let doc = m.mesh_config();
                    assert_eq!(super::MeshConfigDoc::trust_domain(doc), td, "{case}");
                    assert_eq!(
                        doc.and_then(|d| d.config.root_namespace.as_deref()),
                        ns,
                        "{case}"
                    );
                    assert_eq!(m.pods().len(), 1, "{case}: the pod is still loaded");
                    if let Some(d) = doc {
                        assert!(!d.text.contains("kind"), "{case}: {}", d.text);
                    }
                }
                (Err(e), Err(parts)) => {
                    let msg = e.to_string();
                    assert!(parts.iter().all(|p| msg.contains(p)), "{case}: {msg}");
                }
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn apply_changes_all_but_the_trust_domain() {
        let m = load(&[(
            "a.yaml",
            format!("{PODS}---\nkind: MeshConfig\ntrustDomain: example.org\n"),
        )])
        .unwrap();
        let (next, change) = m
            .apply(
                "<stdin>",
                "kind: MeshConfig\ntrustDomain: example.org\nrootNamespace: r\n",
            )
            .expect("a root namespace change applies");
        assert_eq!(change.configured, ["MeshConfig"]);
        assert_eq!(
            next.mesh_config().unwrap().config.root_namespace.as_deref(),
            Some("r")
        );
        assert_eq!(next.pods().len(), 1);
        for text in [
            "kind: MeshConfig\ntrustDomain: other.org\n",
            // Leaving the trust domain out is the default one: a change too.
            "kind: MeshConfig\nrootNamespace: r\n",
        ] {
            let err = next.apply("<stdin>", text).expect_err(text).to_string();
            assert!(
                err.contains("trust domain") && err.contains("example.org"),
                "{err}"
            );
        }
        let err = next
            .delete("<stdin>", "kind: MeshConfig\n")
            .expect_err("a MeshConfig is not deleted")
            .to_string();
        assert!(err.contains("MeshConfig"), "{err}");
    }
}
