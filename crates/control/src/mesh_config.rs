//! Istio's MeshConfig (the `mesh` key of the `istio` ConfigMap, or a file of the same YAML):
//! the three fields `ambit control` reads, `trustDomain`, `rootNamespace` and
//! `defaultConfig.proxyMetadata`.
//!
//! MeshConfig has many fields for istiod and Envoy that have no meaning for an L4 ambient
//! control plane (tracing, access logs, outbound traffic policy, …). A real mesh config carries
//! them, so they are accepted and ignored; the three fields read here are type-checked and
//! validated, and any problem is an error naming the input and the field (for example
//! `ConfigMap istio-system/istio key mesh: defaultConfig.proxyMetadata.A: expected a string,
//! found a boolean`). Strict where it matters, tolerant where upstream's writers differ.
//!
//! Precedence ([`MeshSettings::effective`]): a field set in the mesh config wins over the
//! `--trust-domain` / `--root-namespace` flags (istiod takes both from the mesh config); a
//! field absent or empty there falls back to the flag, so the flags are the mesh defaults.

pub mod watch;

use std::collections::BTreeMap;

use serde_norway::Value;

/// The most bytes of mesh config read (the size limit of a ConfigMap).
pub const MAX_BYTES: usize = 1024 * 1024;

/// The fields of one mesh config document that ambit reads; `None` / empty when absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MeshConfig {
    /// `trustDomain`.
    pub trust_domain: Option<String>,
    /// `rootNamespace`.
    pub root_namespace: Option<String>,
    /// `defaultConfig.proxyMetadata`.
    pub proxy_metadata: BTreeMap<String, String>,
}

/// Why a mesh config was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MeshConfigError {
    /// Not YAML, or bigger than [`MAX_BYTES`].
    #[error("{origin}: {reason}")]
    Yaml { origin: String, reason: String },
    /// A field ambit reads has the wrong type or value.
    #[error("{origin}: {field}: {reason}")]
    Field {
        origin: String,
        field: String,
        reason: String,
    },
    /// The source could not be read (file, ConfigMap without the `mesh` key, …).
    #[error("{origin}: {reason}")]
    Read { origin: String, reason: String },
    /// A running control plane was given another trust domain: its CA and every issued
    /// identity belong to the old one, so this takes a restart.
    #[error(
        "{origin}: trustDomain {new:?} differs from the running {running:?}; \
         refused (a trust domain change takes a restart); the last good mesh config stays"
    )]
    TrustDomainChange {
        origin: String,
        running: String,
        new: String,
    },
}

/// What kind of YAML value `v` is, for error messages.
fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

impl MeshConfig {
    /// Parses one mesh config document; `origin` names the input in errors. An empty
    /// document is an empty mesh config (every field from the flags).
    pub fn parse(origin: &str, text: &str) -> Result<MeshConfig, MeshConfigError> {
        if text.len() > MAX_BYTES {
            return Err(MeshConfigError::Yaml {
                origin: origin.to_owned(),
                reason: format!("{} bytes, more than the {MAX_BYTES} allowed", text.len()),
            });
        }
        let field = |field: &str, reason: String| MeshConfigError::Field {
            origin: origin.to_owned(),
            field: field.to_owned(),
            reason,
        };
        let root: Value = serde_norway::from_str(text).map_err(|e| MeshConfigError::Yaml {
            origin: origin.to_owned(),
            reason: format!("not a YAML document: {e}"),
        })?;
        let root = match root {
            Value::Null => return Ok(MeshConfig::default()),
            Value::Mapping(m) => m,
            other => {
                return Err(field(
                    "(document)",
                    format!("expected a mapping, found {}", kind_of(&other)),
                ));
            }
        };
        let string = |name: &str, v: Option<&Value>| -> Result<Option<String>, MeshConfigError> {
            match v {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if s.is_empty() => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(field(
                    name,
                    format!("expected a string, found {}", kind_of(other)),
                )),
            }
        };
        let trust_domain = string("trustDomain", root.get("trustDomain"))?;
        if let Some(td) = &trust_domain {
            check_trust_domain(td).map_err(|reason| field("trustDomain", reason))?;
        }
        let root_namespace = string("rootNamespace", root.get("rootNamespace"))?;
        if let Some(ns) = &root_namespace {
            check_namespace(ns).map_err(|reason| field("rootNamespace", reason))?;
        }
        let mut proxy_metadata = BTreeMap::new();
        let metadata = match root.get("defaultConfig") {
            None | Some(Value::Null) => None,
            Some(Value::Mapping(dc)) => dc.get("proxyMetadata"),
            Some(other) => {
                return Err(field(
                    "defaultConfig",
                    format!("expected a mapping, found {}", kind_of(other)),
                ));
            }
        };
        match metadata {
            None | Some(Value::Null) => {}
            Some(Value::Mapping(m)) => {
                for (k, v) in m {
                    let Value::String(key) = k else {
                        return Err(field(
                            "defaultConfig.proxyMetadata",
                            format!("a key is {}, expected a string", kind_of(k)),
                        ));
                    };
                    let name = format!("defaultConfig.proxyMetadata.{key}");
                    if key.is_empty() || key.contains(['=', '\0', '\n']) {
                        return Err(field(&name, "not an environment variable name".into()));
                    }
                    match v {
                        Value::String(s) if !s.contains('\0') => {
                            proxy_metadata.insert(key.clone(), s.clone());
                        }
                        Value::String(_) => {
                            return Err(field(&name, "contains a NUL character".into()));
                        }
                        other => {
                            return Err(field(
                                &name,
                                format!(
                                    "expected a string, found {} (quote it, as Kubernetes env values)",
                                    kind_of(other)
                                ),
                            ));
                        }
                    }
                }
            }
            Some(other) => {
                return Err(field(
                    "defaultConfig.proxyMetadata",
                    format!("expected a mapping, found {}", kind_of(other)),
                ));
            }
        }
        Ok(MeshConfig {
            trust_domain,
            root_namespace,
            proxy_metadata,
        })
    }
}

/// A SPIFFE trust domain: lowercase letters, digits, `.`, `-`, `_`, at most 255 bytes.
fn check_trust_domain(td: &str) -> Result<(), String> {
    if td.len() > 255 {
        return Err("longer than 255 characters".into());
    }
    match td
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-' | '_')))
    {
        Some(c) => Err(format!(
            "{td:?} is not a trust domain (character {c:?}; lowercase letters, digits, '.', '-', '_')"
        )),
        None => Ok(()),
    }
}

/// A Kubernetes namespace name (an RFC 1123 label).
fn check_namespace(ns: &str) -> Result<(), String> {
    let ok = ns.len() <= 63
        && ns
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !ns.starts_with('-')
        && !ns.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{ns:?} is not a namespace name (RFC 1123 label: at most 63 lowercase letters, digits, '-')"
        ))
    }
}

/// The settings in force: the flags overlaid with the mesh config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshSettings {
    pub trust_domain: String,
    pub root_namespace: String,
    pub proxy_metadata: BTreeMap<String, String>,
}

impl MeshSettings {
    /// `mesh`'s fields where it sets them, else the flags' `defaults` (see the module docs).
    pub fn effective(defaults: &crate::translate::ClusterConfig, mesh: &MeshConfig) -> Self {
        Self {
            trust_domain: mesh
                .trust_domain
                .clone()
                .unwrap_or_else(|| defaults.trust_domain.clone()),
            root_namespace: mesh
                .root_namespace
                .clone()
                .unwrap_or_else(|| defaults.root_namespace.clone()),
            proxy_metadata: mesh.proxy_metadata.clone(),
        }
    }
}

#[cfg(test)]
mod tests;
