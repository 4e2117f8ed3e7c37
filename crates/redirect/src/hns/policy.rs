//! The `L4WFPPROXY` policies and their envelopes (`spec/windows.md` §3.1–§3.3). Field names
//! and order are hcsshim's (`hcn/hcnpolicy.go`), and so is its `omitempty`: empty strings,
//! empty lists and a zero priority are left out, the nested objects never.

use std::net::Ipv4Addr;

use ambit_contract::{ports, windows::LOCAL_SYSTEM_SID};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// HNS's name of the policy type.
pub const POLICY_TYPE: &str = "L4WFPPROXY";

/// hcsshim `FiveTuple` as the WFP proxy policy uses it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct FilterTuple {
    /// IANA protocol numbers, comma-separated ("6" = TCP).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub protocols: String,
    /// Local addresses.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub local_addresses: String,
    /// Remote addresses.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub remote_addresses: String,
    /// Local ports.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub local_ports: String,
    /// Remote ports.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub remote_ports: String,
    /// Filter priority (0 = HNS default).
    #[serde(skip_serializing_if = "is_zero")]
    pub priority: u16,
}

fn is_zero(p: &u16) -> bool {
    *p == 0
}

/// hcsshim `ProxyExceptions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Exceptions {
    /// Addresses never redirected.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ip_address_exceptions: Vec<String>,
    /// Ports never redirected.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub port_exceptions: Vec<String>,
}

/// hcsshim `L4WfpProxyPolicySetting`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct L4WfpProxySettings {
    /// Where inbound connections go (a port of the pod's compartment, as text).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub inbound_proxy_port: String,
    /// Where outbound connections go.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub outbound_proxy_port: String,
    /// Which connections the policy takes.
    pub filter_tuple: FilterTuple,
    /// Connections of processes running as this SID are not redirected.
    #[serde(rename = "UserSID", skip_serializing_if = "String::is_empty")]
    pub user_sid: String,
    /// Inbound connections left alone.
    pub inbound_exceptions: Exceptions,
    /// Outbound connections left alone.
    pub outbound_exceptions: Exceptions,
}

/// What the policies depend on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WfpPolicyConfig {
    /// `HOST_PROBE_SNAT_IP`: kubelet probes arrive from it and are not redirected.
    pub probe_snat_v4: Ipv4Addr,
    /// Whose connections are exempt (ztunnel's user).
    pub user_sid: String,
}

impl Default for WfpPolicyConfig {
    fn default() -> Self {
        Self {
            probe_snat_v4: crate::consts::DEFAULT_PROBE_SNAT_V4,
            user_sid: LOCAL_SYSTEM_SID.to_owned(),
        }
    }
}

/// The two policies of `spec/windows.md` §3.2, settings only: P1 sends connections to the
/// HBONE port to ztunnel's HBONE listener, P2 every other inbound connection to the
/// plaintext listener (HBONE excepted) and, like P1, every outbound connection to the
/// outbound listener. TCP only, probe source and localhost exempt, ztunnel's user exempt.
pub fn policies(cfg: &WfpPolicyConfig) -> [L4WfpProxySettings; 2] {
    let exempt_ips = vec![
        cfg.probe_snat_v4.to_string(),
        Ipv4Addr::LOCALHOST.to_string(),
    ];
    let outbound = Exceptions {
        ip_address_exceptions: exempt_ips.clone(),
        port_exceptions: vec![],
    };
    let hbone = ports::INBOUND_HBONE.to_string();
    let p1 = L4WfpProxySettings {
        inbound_proxy_port: hbone.clone(),
        outbound_proxy_port: ports::OUTBOUND.to_string(),
        filter_tuple: FilterTuple {
            protocols: "6".into(),
            remote_ports: hbone.clone(),
            ..FilterTuple::default()
        },
        user_sid: cfg.user_sid.clone(),
        inbound_exceptions: Exceptions {
            ip_address_exceptions: exempt_ips.clone(),
            port_exceptions: vec![],
        },
        outbound_exceptions: outbound.clone(),
    };
    let p2 = L4WfpProxySettings {
        inbound_proxy_port: ports::INBOUND_PLAINTEXT.to_string(),
        outbound_proxy_port: ports::OUTBOUND.to_string(),
        filter_tuple: FilterTuple {
            protocols: "6".into(),
            ..FilterTuple::default()
        },
        user_sid: cfg.user_sid.clone(),
        inbound_exceptions: Exceptions {
            ip_address_exceptions: exempt_ips,
            port_exceptions: vec![hbone],
        },
        outbound_exceptions: outbound,
    };
    [p1, p2]
}

/// An `HcnModifyEndpoint` request, serialised in hcsshim's field order.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct ModifyRequest<'a, P> {
    resource_type: &'a str,
    request_type: &'a str,
    settings: PolicyList<P>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct PolicyList<P> {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    policies: Vec<P>,
}

#[derive(Serialize)]
struct Policy<'a> {
    #[serde(rename = "Type")]
    kind: &'a str,
    #[serde(rename = "Settings")]
    settings: &'a L4WfpProxySettings,
}

fn envelope<P: Serialize>(request: &str, policies: Vec<P>) -> String {
    let req = ModifyRequest {
        resource_type: "Policy",
        request_type: request,
        settings: PolicyList { policies },
    };
    // Plain structs of strings and lists: serialising cannot fail.
    serde_json::to_string(&req).unwrap_or_default()
}

/// `HcnModifyEndpoint` settings adding both policies.
pub fn add_request(cfg: &WfpPolicyConfig) -> String {
    let settings = policies(cfg);
    let list = settings
        .iter()
        .map(|settings| Policy {
            kind: POLICY_TYPE,
            settings,
        })
        .collect();
    envelope("Add", list)
}

/// `HcnModifyEndpoint` settings removing `existing` (the policies exactly as HNS returned
/// them, so HNS matches them).
pub fn remove_request(existing: &[Value]) -> String {
    envelope("Remove", existing.to_vec())
}
