//! ambit-ztunnel: the node L4 proxy library — inbound, outbound, authorization, DNS, in-pod
//! (ZDS client), xDS and CA clients, metrics, admin, readiness and drain.
//!
//! The library never reads the process environment: the binary hands it a typed [`Config`]
//! built by [`config::Config::from_vars`].

pub mod admin;
pub mod config;
pub mod dns;
pub mod drain;
pub mod grpc;
pub mod app;
pub mod identity;
pub mod inpod;
pub mod proxy;
pub mod readiness;
pub mod state;
pub mod telemetry;

pub use config::Config;
pub mod xds;
