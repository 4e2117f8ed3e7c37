//! Well-known ports (`spec/ztunnel.md` §1.2, `spec/cni.md` §0, §6.4). They are part of the
//! interop contract: the in-pod rules redirect to the ztunnel ports, the agent checks that
//! ztunnel listens on them, and an upstream component on the same node uses the same numbers.

/// ztunnel's outbound capture listener in each pod netns (original destination).
pub const OUTBOUND: u16 = 15001;
/// ztunnel's plaintext inbound capture listener in each pod netns.
pub const INBOUND_PLAINTEXT: u16 = 15006;
/// ztunnel's HBONE (mTLS + HTTP/2 CONNECT) inbound listener; never redirected.
pub const INBOUND_HBONE: u16 = 15008;
/// ztunnel's DNS proxy, UDP and TCP on localhost inside each pod netns.
pub const DNS_PROXY: u16 = 15053;
/// The DNS port whose traffic the in-pod rules capture.
pub const DNS: u16 = 53;
/// ztunnel's SOCKS5 listener (`UNSTABLE_ENABLE_SOCKS5`).
pub const SOCKS5: u16 = 15080;
/// ztunnel's admin server (localhost only).
pub const ZTUNNEL_ADMIN: u16 = 15000;
/// ztunnel's Prometheus metrics.
pub const ZTUNNEL_STATS: u16 = 15020;
/// ztunnel's readiness server (`/healthz/ready`).
pub const ZTUNNEL_READINESS: u16 = 15021;
/// The control plane's xDS and CA (gRPC over TLS).
pub const CONTROL_PLANE: u16 = 15012;
/// The CNI agent's health server (`/healthz`, `/readyz`).
pub const AGENT_HEALTH: u16 = 8000;
/// The CNI agent's metrics (`MONITORING_PORT`).
pub const AGENT_METRICS: u16 = 15014;

/// The listeners ztunnel opens in every enrolled pod's netns that carry pod traffic (the
/// agent's "ztunnel listens there" check looks for these).
pub const INPOD_LISTENERS: [u16; 3] = [OUTBOUND, INBOUND_PLAINTEXT, INBOUND_HBONE];
