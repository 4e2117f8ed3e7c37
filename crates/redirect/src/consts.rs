//! Wire constants shared with upstream istio-cni and ztunnel (`spec/cni.md` §0).
//!
//! These values are part of the interop contract: ztunnel marks its sockets with
//! [`INPOD_MARK`], and an upstream agent on the same node must see identical rules.

use std::net::{Ipv4Addr, Ipv6Addr};

/// ztunnel's outbound capture port; app-originated TCP is redirected here.
pub const ZTUNNEL_OUTBOUND_PORT: u16 = 15001;
/// ztunnel's plaintext inbound port; non-HBONE inbound TCP is redirected here.
pub const ZTUNNEL_INBOUND_PORT: u16 = 15006;
/// ztunnel's HBONE inbound port; never redirected.
pub const ZTUNNEL_INBOUND_HBONE_PORT: u16 = 15008;
/// ztunnel's DNS proxy port (bound on localhost inside the pod).
pub const DNS_CAPTURE_PORT: u16 = 15053;
/// The DNS port whose traffic is captured.
pub const DNS_PORT: u16 = 53;

/// Packet mark ztunnel sets (SO_MARK) on every socket it opens in a pod netns.
pub const INPOD_MARK: u32 = 0x539;
/// Connection mark put on connections whose packets carried [`INPOD_MARK`].
pub const INPOD_CONN_MARK: u32 = 0x111;
/// Mask for both marks above.
pub const INPOD_MASK: u32 = 0xfff;
/// nfmask/ctmask used when restoring the connmark into the packet mark.
pub const RESTORE_MASK: u32 = 0xffff_ffff;
/// conntrack zone for ztunnel's own DNS upstream flows.
pub const DNS_CT_ZONE: u16 = 1;

/// Policy routing table holding `local default dev lo`.
pub const ROUTE_TABLE: u32 = 100;
/// Priority of the `fwmark 0x111/0xfff lookup 100` rule.
pub const RULE_PRIORITY: u32 = 32764;

/// Default IPv4 source kubelet probes are SNATed to (`HOST_PROBE_SNAT_IP`).
pub const DEFAULT_PROBE_SNAT_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 7, 127);
/// Default IPv6 source kubelet probes are SNATed to (`HOST_PROBE_SNAT_IPV6`).
pub const DEFAULT_PROBE_SNAT_V6: Ipv6Addr = Ipv6Addr::new(
    0xfd16, 0x9254, 0x7127, 0x1337, 0xffff, 0xffff, 0xffff, 0xffff,
);

/// Host probe set for IPv4 pod addresses (ipset or nft set).
pub const PROBE_SET_V4: &str = "istio-inpod-probes-v4";
/// Host probe set for IPv6 pod addresses (ipset or nft set).
pub const PROBE_SET_V6: &str = "istio-inpod-probes-v6";
/// Comment upstream puts on the nft probe sets.
pub const PROBE_SET_COMMENT: &str = "UUID of the pods that are part of ambient mesh";

/// nft table names (identical in pod and host netns).
pub const NFT_NAT_TABLE: &str = "istio-ambient-nat";
/// nft mangle-equivalent table.
pub const NFT_MANGLE_TABLE: &str = "istio-ambient-mangle";
/// nft raw-equivalent table.
pub const NFT_RAW_TABLE: &str = "istio-ambient-raw";
