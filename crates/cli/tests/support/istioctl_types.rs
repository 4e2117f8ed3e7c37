//! A parser of `istioctl ztunnel-config`'s types: the structs of istio/istio
//! `istioctl/pkg/writer/ztunnel/configdump/api.go`, written from their Go field types and
//! JSON names (facts only). Decoding goes as istioctl's does: YAML is turned into JSON
//! (sigs.k8s.io/yaml), then decoded into typed fields, where a value of the wrong type (a
//! string for a `uint16` port, a number for a string) is an error and unknown fields are
//! ignored (Go's `encoding/json`). Map keys of Go integer maps must parse as those integers.
//!
//! Stricter than Go in one way: key names must match exactly (Go matches case-insensitively).

#![allow(dead_code)] // fields exist to be type-checked, not read

use std::collections::BTreeMap;

use serde::Deserialize;

/// Go's `encoding/json` decodes `null` into a zero value; serde needs `Option` or a default.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[derive(Debug, Default, Deserialize)]
pub struct Locality {
    #[serde(default, deserialize_with = "nullable")]
    pub region: String,
    #[serde(default, deserialize_with = "nullable")]
    pub zone: String,
    #[serde(default, deserialize_with = "nullable")]
    pub subzone: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ZtunnelWorkload {
    #[serde(default, deserialize_with = "nullable")]
    pub uid: String,
    #[serde(default, deserialize_with = "nullable")]
    pub workload_ips: Vec<String>,
    #[serde(default)]
    pub waypoint: Option<GatewayAddress>,
    #[serde(default)]
    pub network_gateway: Option<GatewayAddress>,
    #[serde(default, deserialize_with = "nullable")]
    pub protocol: String,
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub namespace: String,
    #[serde(default, deserialize_with = "nullable")]
    pub service_account: String,
    #[serde(default, deserialize_with = "nullable")]
    pub workload_name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub workload_type: String,
    #[serde(default, deserialize_with = "nullable")]
    pub canonical_name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub canonical_revision: String,
    #[serde(default, rename = "clusterId", deserialize_with = "nullable")]
    pub cluster_id: String,
    #[serde(default, deserialize_with = "nullable")]
    pub trust_domain: String,
    #[serde(default, deserialize_with = "nullable")]
    pub locality: Locality,
    #[serde(default, deserialize_with = "nullable")]
    pub node: String,
    #[serde(default, deserialize_with = "nullable")]
    pub network: String,
    #[serde(default, deserialize_with = "nullable")]
    pub status: String,
    #[serde(default, deserialize_with = "nullable")]
    pub hostname: String,
    #[serde(default, deserialize_with = "nullable")]
    pub capacity: u32,
    #[serde(default, deserialize_with = "nullable")]
    pub application_tunnel: ApplicationTunnel,
    #[serde(default, deserialize_with = "nullable")]
    pub authorization_policies: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ApplicationTunnel {
    #[serde(default, deserialize_with = "nullable")]
    pub protocol: String,
    #[serde(default)]
    pub port: Option<u16>,
}

#[derive(Debug, Deserialize)]
pub struct GatewayAddress {
    #[serde(default, deserialize_with = "nullable")]
    pub destination: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancer {
    #[serde(default, deserialize_with = "nullable")]
    pub mode: String,
    #[serde(default, deserialize_with = "nullable")]
    pub routing_preferences: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub health_policy: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ZtunnelEndpoint {
    #[serde(default, deserialize_with = "nullable")]
    pub workload_uid: String,
    #[serde(default, deserialize_with = "nullable")]
    pub service: String,
    #[serde(default, deserialize_with = "nullable")]
    pub address: String,
    /// Go `map[uint16]uint16`.
    #[serde(default, deserialize_with = "nullable")]
    pub port: BTreeMap<u16, u16>,
}

/// Go `CIDRVIP`: an object, or a `"network/cidr"` string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum CidrVip {
    Object {
        cidr: String,
        #[serde(default)]
        network: String,
    },
    Text(String),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ZtunnelService {
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub namespace: String,
    #[serde(default, deserialize_with = "nullable")]
    pub hostname: String,
    #[serde(default, rename = "vips", deserialize_with = "nullable")]
    pub addresses: Vec<String>,
    #[serde(default, rename = "cidrVips", deserialize_with = "nullable")]
    pub cidr_vips: Vec<CidrVip>,
    /// Go `map[string]int`.
    #[serde(default, deserialize_with = "nullable")]
    pub ports: BTreeMap<String, i64>,
    #[serde(default)]
    pub load_balancer: Option<LoadBalancer>,
    #[serde(default)]
    pub waypoint: Option<GatewayAddress>,
    #[serde(default, deserialize_with = "nullable")]
    pub endpoints: BTreeMap<String, Option<ZtunnelEndpoint>>,
    #[serde(default, deserialize_with = "nullable")]
    pub subject_alt_names: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub ip_families: String,
    #[serde(default, deserialize_with = "nullable")]
    pub canonical: bool,
    #[serde(default, deserialize_with = "nullable")]
    pub visibility: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyMatch {
    #[serde(default, deserialize_with = "nullable")]
    pub namespaces: Vec<StringMatch>,
    #[serde(default, deserialize_with = "nullable")]
    pub not_namespaces: Vec<StringMatch>,
    #[serde(default, deserialize_with = "nullable")]
    pub principals: Vec<StringMatch>,
    #[serde(default, deserialize_with = "nullable")]
    pub not_principals: Vec<StringMatch>,
    #[serde(default, deserialize_with = "nullable")]
    pub source_ips: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub not_source_ips: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub destination_ips: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub not_destination_ips: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub destination_ports: Vec<u16>,
    #[serde(default, deserialize_with = "nullable")]
    pub not_destination_ports: Vec<u16>,
    #[serde(default, deserialize_with = "nullable")]
    pub service_accounts: Vec<ServiceAccountMatch>,
    #[serde(default, deserialize_with = "nullable")]
    pub not_service_accounts: Vec<ServiceAccountMatch>,
}

#[derive(Debug, Deserialize)]
pub struct StringMatch {
    #[serde(rename = "Exact", default, deserialize_with = "nullable")]
    pub exact: String,
    #[serde(rename = "Suffix", default, deserialize_with = "nullable")]
    pub suffix: String,
    #[serde(rename = "Prefix", default, deserialize_with = "nullable")]
    pub prefix: String,
    /// Go `any`.
    #[serde(rename = "Presence", default)]
    pub presence: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountMatch {
    #[serde(default, deserialize_with = "nullable")]
    pub namespace: String,
    #[serde(default, deserialize_with = "nullable")]
    pub service_account: String,
}

#[derive(Debug, Deserialize)]
pub struct ZtunnelPolicy {
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub namespace: String,
    #[serde(default, deserialize_with = "nullable")]
    pub scope: String,
    #[serde(default, deserialize_with = "nullable")]
    pub action: String,
    /// Go `[][][]*PolicyMatch`.
    #[serde(default, deserialize_with = "nullable")]
    pub rules: Vec<Vec<Vec<Option<PolicyMatch>>>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ZtunnelDump {
    #[serde(default, deserialize_with = "nullable")]
    pub workloads: Vec<Option<ZtunnelWorkload>>,
    #[serde(default, deserialize_with = "nullable")]
    pub services: Vec<Option<ZtunnelService>>,
    #[serde(default, deserialize_with = "nullable")]
    pub policies: Vec<Option<ZtunnelPolicy>>,
    #[serde(default, deserialize_with = "nullable")]
    pub certificates: Vec<Option<CertsDump>>,
    #[serde(default, deserialize_with = "nullable")]
    pub workload_state: BTreeMap<String, WorkloadState>,
}

#[derive(Debug, Deserialize)]
pub struct CertsDump {
    #[serde(default, deserialize_with = "nullable")]
    pub identity: String,
    #[serde(default, deserialize_with = "nullable")]
    pub state: String,
    #[serde(rename = "certChain", default, deserialize_with = "nullable")]
    pub cert_chain: Vec<Option<Cert>>,
    #[serde(rename = "rootCerts", default, deserialize_with = "nullable")]
    pub root_cert: Vec<Option<Cert>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cert {
    #[serde(default, deserialize_with = "nullable")]
    pub pem: String,
    #[serde(default, deserialize_with = "nullable")]
    pub serial_number: String,
    #[serde(default, deserialize_with = "nullable")]
    pub valid_from: String,
    #[serde(default, deserialize_with = "nullable")]
    pub expiration_time: String,
}

#[derive(Debug, Default, Deserialize)]
pub struct WorkloadState {
    #[serde(default, deserialize_with = "nullable")]
    pub state: String,
    #[serde(default, deserialize_with = "nullable")]
    pub connections: WorkloadConnections,
    #[serde(default, deserialize_with = "nullable")]
    pub info: WorkloadInfo,
}

#[derive(Debug, Default, Deserialize)]
pub struct WorkloadConnections {
    #[serde(default, deserialize_with = "nullable")]
    pub inbound: Vec<Connection>,
    #[serde(default, deserialize_with = "nullable")]
    pub outbound: Vec<Connection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadInfo {
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub namespace: String,
    #[serde(default, deserialize_with = "nullable")]
    pub trust_domain: String,
    #[serde(default, deserialize_with = "nullable")]
    pub service_account: String,
}

/// Go `InboundConnection` / `OutboundConnection` (same fields).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Connection {
    #[serde(default, deserialize_with = "nullable")]
    pub src: String,
    #[serde(default, deserialize_with = "nullable")]
    pub original_dst: String,
    #[serde(default, deserialize_with = "nullable")]
    pub actual_dst: String,
    #[serde(default, deserialize_with = "nullable")]
    pub protocol: String,
}

/// Parses `ambit ztunnel-config all -o yaml` output as istioctl would.
pub fn parse_dump_yaml(yaml: &str) -> Result<ZtunnelDump, String> {
    let json: serde_json::Value =
        serde_norway::from_str(yaml).map_err(|e| format!("not YAML: {e}"))?;
    serde_json::from_value(json).map_err(|e| format!("not istioctl's ZtunnelDump: {e}"))
}
