//! The node contract: what the CNI agent, ztunnel, the rule renderer, the control plane and
//! the embedded mesh must agree on, in one place below all of them (`spec/cni.md` §0, §3, §4;
//! `spec/ztunnel.md` §1.2, §9). Nothing here depends on the agent or on ztunnel, so either end
//! can use it without depending on the other.
//!
//! | module | owns |
//! |---|---|
//! | [`ports`] | every well-known port: ztunnel's in-pod listeners, its admin/stats/readiness, the control plane, the agent's health and metrics |
//! | [`marks`] | the packet mark ztunnel puts on its sockets, the connection mark and the policy-routing table the in-pod rules use |
//! | [`env`] | the one environment reader: every bad variable at once, each error naming the variable, its value and what was expected |
//! | [`values`] | the value grammars of upstream's configuration: Go's ParseBool, Go's ParseDuration plus bare seconds |
//! | [`zds`] | ZDS framing: the pod uid, requests, answers and hello as bytes, the message size limit (the transport is `ambit_netns::zds`), on Linux and Windows |
//! | [`windows`] | the Windows node's pipe names and sizes, the exempt SID, compartment numbers |

#![forbid(unsafe_code)]

pub mod env;
pub mod marks;
pub mod ports;
pub mod values;
pub mod windows;
pub mod zds;
