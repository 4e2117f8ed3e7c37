//! Reading what the Host Networking Service says about namespaces (`spec/windows.md` §1.2,
//! §1.3, §3.3): the namespace properties JSON (its endpoints and compartment), the list an
//! enumeration returns, the queries we send, and error records. Pure functions on text, so
//! they are tested on Linux; the calls themselves are `hcn` (Windows only).

use serde::Deserialize;
use serde_json::{Value, json};

use crate::guid::{Guid, GuidError};

/// A pod's HNS namespace as ambit uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HnsNamespace {
    /// The namespace ID (what containerd's sandbox spec names).
    pub id: Guid,
    /// The network compartment; `None` while HNS has none for it yet (no container has
    /// started in the namespace: `spec/windows.md` §1.2), never `Some(0)`.
    pub compartment: Option<u32>,
    /// The HNS endpoints attached to the namespace, in the order HNS listed them.
    pub endpoints: Vec<Guid>,
}

/// HNS answered something we cannot read; names what.
#[derive(Debug, thiserror::Error)]
pub enum HnsParseError {
    /// Not JSON, or not the shape HNS documents.
    #[error("HNS {what} is not valid JSON of the expected shape: {source}")]
    Json {
        /// What was being read.
        what: &'static str,
        /// The parser's complaint.
        source: serde_json::Error,
    },
    /// A GUID field that is not a GUID.
    #[error("HNS {what}: {source}")]
    Guid {
        /// What was being read.
        what: &'static str,
        /// The bad value.
        source: GuidError,
    },
    /// `NamespaceId` and `CompartmentId` both present and different.
    #[error(
        "HNS namespace {id}: NamespaceId {namespace_id} and CompartmentId {compartment_id} disagree"
    )]
    CompartmentConflict {
        /// The namespace.
        id: Guid,
        /// `NamespaceId`.
        namespace_id: u32,
        /// `CompartmentId`.
        compartment_id: u32,
    },
}

#[derive(Deserialize)]
struct RawNamespace {
    #[serde(rename = "ID")]
    id: String,
    /// hcsshim's name for the compartment.
    #[serde(rename = "NamespaceId")]
    namespace_id: Option<u32>,
    /// The key upstream ztunnel's retry path reads; accepted too until a host shows which
    /// one HNS really sends (`spec/windows.md` §1.2).
    #[serde(rename = "CompartmentId")]
    compartment_id: Option<u32>,
    #[serde(rename = "Resources", default)]
    resources: Vec<RawResource>,
}

#[derive(Deserialize)]
struct RawResource {
    #[serde(rename = "Type", default)]
    kind: String,
    #[serde(rename = "Data", default)]
    data: Option<RawResourceData>,
}

#[derive(Deserialize)]
struct RawResourceData {
    #[serde(rename = "ID")]
    id: Option<String>,
}

/// Reads `HcnQueryNamespaceProperties` output. Endpoints are the `Data.ID` of resources of
/// type `Endpoint` (containers and other resources are ignored); a compartment of 0 or no
/// compartment key means "not created yet".
pub fn parse_namespace(json: &str) -> Result<HnsNamespace, HnsParseError> {
    let raw: RawNamespace = serde_json::from_str(json).map_err(|source| HnsParseError::Json {
        what: "namespace properties",
        source,
    })?;
    let guid = |what, s: &str| {
        s.parse::<Guid>()
            .map_err(|source| HnsParseError::Guid { what, source })
    };
    let id = guid("namespace ID", &raw.id)?;
    let compartment = match (raw.namespace_id, raw.compartment_id) {
        (Some(a), Some(b)) if a != b && a != 0 && b != 0 => {
            return Err(HnsParseError::CompartmentConflict {
                id,
                namespace_id: a,
                compartment_id: b,
            });
        }
        (a, b) => a.filter(|c| *c != 0).or(b.filter(|c| *c != 0)),
    };
    let mut endpoints = Vec::new();
    for r in raw.resources {
        if r.kind != "Endpoint" {
            continue;
        }
        if let Some(ep) = r.data.and_then(|d| d.id) {
            endpoints.push(guid("namespace endpoint ID", &ep)?);
        }
    }
    Ok(HnsNamespace {
        id,
        compartment,
        endpoints,
    })
}

/// Reads the list an `HcnEnumerate*` call returns: a JSON array of GUID strings (HNS
/// returns an empty string or `null` for none).
pub fn parse_enumeration(json: &str, what: &'static str) -> Result<Vec<Guid>, HnsParseError> {
    if json.trim().is_empty() {
        return Ok(Vec::new());
    }
    let ids: Option<Vec<String>> =
        serde_json::from_str(json).map_err(|source| HnsParseError::Json { what, source })?;
    ids.unwrap_or_default()
        .iter()
        .map(|s| {
            s.parse()
                .map_err(|source| HnsParseError::Guid { what, source })
        })
        .collect()
}

/// The query that makes `HcnEnumerate*` return only the object with this ID (hcsshim's
/// `defaultQuery` plus a filter; `Filter` is itself a JSON *string*).
pub fn query_by_id(id: Guid) -> String {
    let filter = json!({ "ID": id.to_string() }).to_string();
    json!({
        "SchemaVersion": { "Major": 2, "Minor": 0 },
        "Filter": filter,
    })
    .to_string()
}

/// The query for `HcnQuery*Properties`: schema 2.0, no filter.
pub fn properties_query() -> String {
    json!({ "SchemaVersion": { "Major": 2, "Minor": 0 } }).to_string()
}

/// An HCN call's error record: empty means none (hcsshim treats a non-empty record as a
/// failure even when the HRESULT says success). The message is HNS's `Error` field when the
/// record is the usual JSON, the whole text otherwise.
pub fn error_record_message(record: &str) -> Option<String> {
    let record = record.trim();
    if record.is_empty() {
        return None;
    }
    let msg = serde_json::from_str::<Value>(record)
        .ok()
        .and_then(|v| v.get("Error").and_then(Value::as_str).map(str::to_owned))
        .filter(|m| !m.is_empty());
    Some(msg.unwrap_or_else(|| record.to_owned()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const NS: &str = "5e0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b";
    const EP1: &str = "11111111-2222-4333-8444-555555555555";
    const EP2: &str = "66666666-7777-4888-8999-aaaaaaaaaaaa";

    fn ns_json(compartment_keys: &str) -> String {
        format!(
            r#"{{"ID":"{NS}",{compartment_keys}"Type":"Guest","Resources":[
                {{"Type":"Container","Data":{{"ID":"{EP2}"}}}},
                {{"Type":"Endpoint","Data":{{"ID":"{EP1}"}}}},
                {{"Type":"Endpoint","Data":{{"ID":"{}"}}}}],
               "SchemaVersion":{{"Major":2,"Minor":0}},"Unknown":[1]}}"#,
            EP2.to_uppercase()
        )
    }

    #[test]
    fn namespace_compartment_and_endpoints() {
        // (compartment keys, expected compartment)
        let cases = [
            (r#""NamespaceId":7,"#, Some(7)),
            (r#""CompartmentId":9,"#, Some(9)),
            (r#""NamespaceId":7,"CompartmentId":7,"#, Some(7)),
            (r#""NamespaceId":0,"CompartmentId":4,"#, Some(4)),
            (r#""NamespaceId":0,"#, None),
            ("", None),
        ];
        for (keys, want) in cases {
            let ns = parse_namespace(&ns_json(keys)).unwrap();
            assert_eq!(ns.id.to_string(), NS);
            assert_eq!(ns.compartment, want, "{keys}");
            let eps: Vec<String> = ns.endpoints.iter().map(ToString::to_string).collect();
            assert_eq!(eps, [EP1, EP2], "only Endpoint resources, in order");
        }
    }

    #[test]
    fn bad_namespace_json_is_an_error_naming_it() {
        let cases = [
            ("not json".to_owned(), "namespace properties"),
            (r#"{"NamespaceId":3}"#.to_owned(), "namespace properties"),
            (r#"{"ID":"x"}"#.to_owned(), "namespace ID"),
            (
                format!(
                    r#"{{"ID":"{NS}","Resources":[{{"Type":"Endpoint","Data":{{"ID":"y"}}}}]}}"#
                ),
                "namespace endpoint ID",
            ),
            (
                format!(r#"{{"ID":"{NS}","NamespaceId":"7"}}"#),
                "namespace properties",
            ),
        ];
        for (json, what) in cases {
            let err = parse_namespace(&json).unwrap_err();
            assert!(err.to_string().contains(what), "{json}: {err}");
        }
        let conflict = parse_namespace(&ns_json(r#""NamespaceId":3,"CompartmentId":4,"#));
        assert!(matches!(
            conflict,
            Err(HnsParseError::CompartmentConflict { .. })
        ));
    }

    #[test]
    fn enumerations() {
        assert_eq!(parse_enumeration("", "x").unwrap(), []);
        assert_eq!(parse_enumeration("null", "x").unwrap(), []);
        assert_eq!(parse_enumeration("[]", "x").unwrap(), []);
        let two = parse_enumeration(&format!(r#"["{EP1}","{{{EP2}}}"]"#), "x").unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(two[1].to_string(), EP2);
        assert!(parse_enumeration(r#"["nope"]"#, "endpoints").is_err());
        assert!(parse_enumeration("{}", "endpoints").is_err());
    }

    #[test]
    fn queries_are_hcsshims() {
        let id: Guid = NS.parse().unwrap();
        let q: Value = serde_json::from_str(&query_by_id(id)).unwrap();
        assert_eq!(q["SchemaVersion"], json!({"Major": 2, "Minor": 0}));
        // The filter is a JSON string holding JSON.
        let filter: Value = serde_json::from_str(q["Filter"].as_str().unwrap()).unwrap();
        assert_eq!(filter, json!({"ID": NS}));
        let p: Value = serde_json::from_str(&properties_query()).unwrap();
        assert_eq!(p, json!({"SchemaVersion": {"Major": 2, "Minor": 0}}));
    }

    #[test]
    fn error_records() {
        assert_eq!(error_record_message(""), None);
        assert_eq!(error_record_message("  \n"), None);
        assert_eq!(
            error_record_message(
                r#"{"Success":false,"Error":"Element not found.","ErrorCode":2147943568}"#
            ),
            Some("Element not found.".into())
        );
        assert_eq!(
            error_record_message("plain text"),
            Some("plain text".into())
        );
        assert_eq!(
            error_record_message(r#"{"Error":""}"#),
            Some(r#"{"Error":""}"#.into())
        );
    }
}
