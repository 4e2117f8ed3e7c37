//! ambit-ztunnel: the node L4 proxy library — inbound, outbound, authorization, DNS, in-pod
//! (ZDS client), xDS and CA clients, metrics, admin, readiness and drain.
//!
//! The library never reads the process environment: the binary hands it a typed [`Config`]
//! built by [`config::Config::from_vars`].
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | upstream's environment variables → [`Config`] |
//! | [`app`] | runtimes, servers, signals ([`signal`]), drain: the process |
//! | [`state`] | workloads, services, policies, indexed for the data path |
//! | [`proxy`] | outbound 15001, inbound HBONE 15008, inbound plaintext 15006 |
//! | [`inpod`] | shared mode: the ZDS client and per-pod proxies (a netns per pod on Linux, an HNS compartment on Windows: `inpod::platform`) |
//! | [`dns`] | the DNS proxy on 15053 |
//! | [`identity`] / [`grpc`] | CA client, certificate cache, control-plane channels |
//! | [`xds`] | the delta ADS client |
//! | [`telemetry`] / [`admin`] / [`readiness`] / [`drain`] | metrics, access logs, admin, readiness, shutdown |

#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod config;
pub mod dns;
pub mod drain;
pub mod grpc;
pub mod identity;
pub mod inpod;
pub mod proxy;
pub mod readiness;
pub mod signal;
pub mod state;
pub mod telemetry;
pub mod xds;

pub use config::Config;
