//! Packet marks and policy routing (`spec/cni.md` §3): ztunnel marks every socket it opens in
//! a pod netns with [`INPOD_MARK`] (`SO_MARK`); the in-pod rules skip marked packets, put
//! [`INPOD_CONN_MARK`] on their connections and route replies through [`ROUTE_TABLE`]. An
//! upstream agent and an upstream ztunnel on the same node use the same values.

/// The mark ztunnel sets (`SO_MARK`) on its sockets in a pod netns (`PACKET_MARK` default).
pub const INPOD_MARK: u32 = 0x539;
/// The connection mark the rules put on connections whose packets carried [`INPOD_MARK`].
pub const INPOD_CONN_MARK: u32 = 0x111;
/// The mask of both marks.
pub const INPOD_MASK: u32 = 0xfff;
/// The policy-routing table holding `local default dev lo`.
pub const ROUTE_TABLE: u32 = 100;
/// The priority of the `fwmark 0x111/0xfff lookup 100` rule.
pub const RULE_PRIORITY: u32 = 32764;
