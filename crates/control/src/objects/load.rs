//! The multi-document YAML loader.
//!
//! Two passes over the text: the first reads each document as a generic value to learn its
//! `apiVersion`/`kind` (and catches syntax errors with their line); the second deserializes
//! each document straight into its typed struct, so a bad field is reported with its path and
//! line (a generic value has already lost the positions).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_norway::Value;

use super::meta::{check_dns_name, stable_uid};
use super::workload_entry::WorkloadEntrySpec;
use super::{Kind, Object, ObjectError, Origin, Resource};

/// Parses every document of `text` (named `file` in errors). Empty documents are skipped but
/// counted, so document numbers match what an editor shows between `---` lines.
/// Fails on the first bad document, and on two objects with the same kind, namespace and name.
pub fn load_documents(file: &str, text: &str) -> Result<Vec<Object>, ObjectError> {
    let origin = |document: usize| Origin {
        file: file.to_string(),
        document,
    };

    let mut kinds = Vec::new();
    // The YAML iterator repeats a failure forever: stop at the first error.
    for (i, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(doc).map_err(|e| yaml_error(origin(i + 1), None, &e))?;
        let kind = document_kind(origin(i + 1), &value)?;
        kinds.push(kind.map(|kind| (kind, object_label(kind, &value))));
    }

    let mut objects = Vec::new();
    let mut seen = BTreeMap::new();
    let docs = serde_norway::Deserializer::from_str(text);
    for (i, (doc, kind)) in docs.zip(kinds).enumerate() {
        let Some((kind, label)) = kind else { continue };
        let origin = origin(i + 1);
        let resource = typed(kind, doc).map_err(|e| yaml_error(origin.clone(), label, &e))?;
        let object = normalise(Object { origin, resource })?;
        let key = object.key();
        if let Some(first) = seen.get(&key) {
            return Err(ObjectError::Duplicate {
                key,
                first: Origin::clone(first),
                second: object.origin,
            });
        }
        seen.insert(key, object.origin.clone());
        objects.push(object);
    }
    Ok(objects)
}

fn yaml_error(origin: Origin, object: Option<String>, e: &serde_norway::Error) -> ObjectError {
    ObjectError::Yaml {
        origin,
        object,
        line: e.location().map(|l| l.line()),
        message: e.to_string(),
    }
}

/// The kind of a document, `None` for an empty one.
fn document_kind(origin: Origin, value: &Value) -> Result<Option<Kind>, ObjectError> {
    let map = match value {
        Value::Null => return Ok(None),
        Value::Mapping(map) => map,
        other => {
            let found = match other {
                Value::Bool(_) => "a boolean",
                Value::Number(_) => "a number",
                Value::String(_) => "a string",
                Value::Sequence(_) => "a sequence",
                _ => "a tagged value",
            };
            return Err(ObjectError::NotAMapping { origin, found });
        }
    };
    let text_field = |field: &'static str| match map.get(field) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.as_str()),
        _ => Err(ObjectError::Missing {
            origin: origin.clone(),
            field,
        }),
    };
    let kind = text_field("kind")?;
    let api_version = text_field("apiVersion")?;
    Kind::from_type(api_version, kind)
        .map(Some)
        .ok_or_else(|| ObjectError::UnknownKind {
            origin: origin.clone(),
            api_version: api_version.to_string(),
            kind: kind.to_string(),
        })
}

/// `Kind namespace/name` of a document whose kind is known, as far as its metadata can be
/// read (for errors; the typed pass checks the metadata properly).
fn object_label(kind: Kind, value: &Value) -> Option<String> {
    let meta = value.get("metadata")?;
    let text = |field: &str| match meta.get(field) {
        Some(Value::String(s)) if !s.is_empty() => Some(s.as_str()),
        _ => None,
    };
    let name = text("name")?;
    Some(match (kind.is_namespaced(), text("namespace")) {
        (false, _) => format!("{kind} {name}"),
        (true, ns) => format!("{kind} {}/{name}", ns.unwrap_or("default")),
    })
}

fn typed(kind: Kind, doc: serde_norway::Deserializer<'_>) -> Result<Resource, serde_norway::Error> {
    Ok(match kind {
        Kind::Namespace => Resource::Namespace(Deserialize::deserialize(doc)?),
        Kind::Pod => Resource::Pod(Deserialize::deserialize(doc)?),
        Kind::Service => Resource::Service(Deserialize::deserialize(doc)?),
        Kind::PeerAuthentication => Resource::PeerAuthentication(Deserialize::deserialize(doc)?),
        Kind::AuthorizationPolicy => Resource::AuthorizationPolicy(Deserialize::deserialize(doc)?),
        Kind::WorkloadEntry => Resource::WorkloadEntry(Deserialize::deserialize(doc)?),
        Kind::WorkloadGroup => Resource::WorkloadGroup(Deserialize::deserialize(doc)?),
    })
}

/// Applies the defaults and checks documented on [`super`].
fn normalise(mut object: Object) -> Result<Object, ObjectError> {
    let kind = object.kind();
    let origin = object.origin.clone();
    let meta = object.resource.metadata_mut();
    if meta.name.is_empty() {
        return Err(ObjectError::Missing {
            origin,
            field: "metadata.name",
        });
    }
    let invalid = |name: &str, field: &str, reason: String| ObjectError::Invalid {
        origin: origin.clone(),
        kind,
        name: name.to_string(),
        field: field.to_string(),
        reason,
    };
    // Namespaces are DNS labels; every other kind we read is a DNS subdomain.
    let max_name = if kind == Kind::Namespace { 63 } else { 253 };
    check_dns_name(&meta.name, max_name, kind != Kind::Namespace)
        .map_err(|r| invalid(&meta.name, "metadata.name", r))?;
    if kind.is_namespaced() {
        if meta.namespace.is_empty() {
            meta.namespace = "default".to_string();
        }
        check_dns_name(&meta.namespace, 63, false)
            .map_err(|r| invalid(&meta.name, "metadata.namespace", r))?;
    } else {
        meta.namespace.clear();
    }
    if meta.uid.is_empty() {
        meta.uid = stable_uid(kind.as_str(), &meta.namespace, &meta.name);
    }
    let name = meta.name.clone();
    match &mut object.resource {
        Resource::Pod(pod) => {
            let spec = &mut pod.spec;
            if spec.service_account_name.is_empty() {
                spec.service_account_name =
                    match std::mem::take(&mut spec.deprecated_service_account) {
                        sa if sa.is_empty() => "default".to_string(),
                        sa => sa,
                    };
            }
            check_dns_name(&spec.service_account_name, 253, true)
                .map_err(|r| invalid(&name, "spec.serviceAccountName", r))?;
        }
        Resource::WorkloadEntry(we) => {
            check_entry_spec(&mut we.spec, "spec").map_err(|(f, r)| invalid(&name, &f, r))?;
        }
        Resource::WorkloadGroup(wg) => {
            let template = &mut wg.spec.template;
            check_entry_spec(template, "spec.template").map_err(|(f, r)| invalid(&name, &f, r))?;
        }
        Resource::Service(svc) => {
            if let Some(reason) = svc.cluster_ip_conflict() {
                return Err(invalid(&name, "spec.clusterIPs", reason));
            }
        }
        _ => {}
    }
    Ok(object)
}

/// Defaults and checks of a WorkloadEntry spec (or a group's template): the service account
/// defaults to `default` and is a Kubernetes name; an address that is not an IP is kept (DNS
/// entries exist) but must not be blank or carry spaces. Returns the field path and reason.
fn check_entry_spec(spec: &mut WorkloadEntrySpec, at: &str) -> Result<(), (String, String)> {
    if spec.service_account.is_empty() {
        spec.service_account = "default".to_string();
    }
    check_dns_name(&spec.service_account, 253, true)
        .map_err(|r| (format!("{at}.serviceAccount"), r))?;
    if spec.address.chars().any(char::is_whitespace) {
        return Err((
            format!("{at}.address"),
            format!("{:?} is not an IP address or host name", spec.address),
        ));
    }
    if let Some((name, _)) = spec.ports.iter().find(|(_, p)| **p == 0) {
        return Err((
            format!("{at}.ports.{name}"),
            "must be a port number 1-65535".to_string(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_documents_are_counted_but_skipped() {
        let text = "---\n# nothing\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n";
        let objects = load_documents("f.yaml", text).unwrap();
        assert_eq!(objects.len(), 1);
        assert_eq!(objects[0].origin.document, 2);
        assert_eq!(load_documents("f.yaml", "").unwrap(), vec![]);
    }
}
