//! Names and values of the rules shared with upstream istio-cni (`spec/cni.md` §0, §3): an
//! upstream agent on the same node must see identical rules. The ports and marks ztunnel
//! shares with the rules are in [`ambit_contract::ports`] and [`ambit_contract::marks`].

use std::net::{Ipv4Addr, Ipv6Addr};

/// nfmask/ctmask used when restoring the connmark into the packet mark.
pub const RESTORE_MASK: u32 = 0xffff_ffff;
/// conntrack zone for ztunnel's own DNS upstream flows.
pub const DNS_CT_ZONE: u16 = 1;

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
/// Beyond upstream: the in-pod fail-closed guard, an nft table owned by the agent's socket
/// (`kernel::guard`).
pub const NFT_GUARD_TABLE: &str = "ambit-guard";
/// Beyond upstream: the guard's standby copy, an ordinary table that outlives the agent
/// (`kernel::guard`).
pub const NFT_GUARD_STANDBY_TABLE: &str = "ambit-guard-standby";
