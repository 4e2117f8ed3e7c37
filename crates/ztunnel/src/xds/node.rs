//! The xDS `Node` ztunnel presents (spec §4.1): its id and metadata, built from the config.

use ambit_proto::core::Node;
use prost_types::value::Kind;
use prost_types::{Struct, Value};

use crate::config::Config;

/// `ztunnel~<INSTANCE_IP>~<POD_NAME>.<POD_NAMESPACE>~<POD_NAMESPACE>.svc.cluster.local`.
pub fn node_id(instance_ip: &str, pod_name: &str, pod_namespace: &str) -> String {
    format!("ztunnel~{instance_ip}~{pod_name}.{pod_namespace}~{pod_namespace}.svc.cluster.local")
}

/// The node for `cfg`: id as above; metadata = every `ISTIO_META_*` (prefix stripped), every
/// `ISTIO_METAJSON_*` as its JSON value (prefix stripped; `LABELS` is what auto-registration
/// copies onto a VM's WorkloadEntry), then `NAME`, `NAMESPACE`, `INSTANCE_IPS`, `NODE_NAME` (those set) and `CLUSTER_ID` (the
/// effective cluster id, which already honours `ISTIO_META_CLUSTER_ID`).
pub fn node_from_config(cfg: &Config) -> Node {
    let pod_name = cfg.pod_name.as_deref().unwrap_or_default();
    let pod_namespace = cfg.pod_namespace.as_deref().unwrap_or_default();
    let instance_ip = cfg.instance_ip.to_string();
    let mut fields: std::collections::BTreeMap<String, Value> = cfg
        .proxy_metadata
        .iter()
        .map(|(k, v)| (k.clone(), string(v)))
        .collect();
    for (k, v) in &cfg.proxy_metadata_json {
        fields.insert(k.clone(), json(v));
    }
    let explicit = [
        ("NAME", cfg.pod_name.as_deref()),
        ("NAMESPACE", cfg.pod_namespace.as_deref()),
        ("INSTANCE_IPS", Some(instance_ip.as_str())),
        ("NODE_NAME", cfg.node_name.as_deref()),
        ("CLUSTER_ID", Some(cfg.cluster_id.as_str())),
    ];
    for (key, value) in explicit {
        if let Some(v) = value {
            fields.insert(key.to_string(), string(v));
        }
    }
    Node {
        id: node_id(&instance_ip, pod_name, pod_namespace),
        metadata: Some(Struct { fields }),
        ..Default::default()
    }
}

fn json(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    let kind = match v {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(*b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        J::String(s) => Kind::StringValue(s.clone()),
        J::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(json).collect(),
        }),
        J::Object(map) => Kind::StructValue(Struct {
            fields: map.iter().map(|(k, v)| (k.clone(), json(v))).collect(),
        }),
    };
    Value { kind: Some(kind) }
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}
