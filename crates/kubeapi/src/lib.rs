//! ambit-kubeapi: the small Kubernetes API client ambit's agent and control plane use to
//! read objects and write pod annotations.
//!
//! # Why not kube-rs (yet)
//!
//! The design names `kube` + `k8s-openapi` as building blocks, to be replaced only when they
//! cost more than two minutes of a clean CI build. Measured (docs/upstream-differences.md):
//! +84.5 s of CPU for the workspace's test build on the 2-core machine, below that bar, so the
//! switch to kube-rs is due; until it lands this crate is the client, on the hyper / rustls
//! stack the workspace already builds: objects stay `serde_json::Value` here and each
//! consumer deserializes them into its own types (the control plane reuses its manifest
//! structs, the agent its `Pod`).
//!
//! # Layout
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | [`KubeConfig`]: in-cluster service account or kubeconfig file (server, CA, client certificate, token, exec plugin); [`KubeConfig::from_environment`] picks one by the one rule every ambit role uses |
//! | [`exec`] | `exec` credential plugins: run with a deadline and bounded output, tokens cached until they expire |
//! | [`client`] | [`Client`]: `list` (paged), `watch`, `get`, `merge_patch`, `create`; connection reuse; typed [`Error`]s; size and time [`Limits`] |
//! | [`watch`] | [`WatchStream`] of [`WatchEvent`]s: newline-delimited JSON with a bounded line size |
//! | [`reflector`] | [`Reflector`]: list + watch with a map by (namespace, name), relist on 410 |
//! | [`testing`] | [`testing::FakeApiServer`]: a real HTTP server with the API server's JSON shapes, for tests |
//!
//! Nothing here panics on what the server sends: malformed JSON, wrong shapes, oversized
//! bodies or lines and error statuses all come back as [`Error`] values.
//!
//! Lists are paged (`limit` / `continue`); connections are reused across requests (one HTTP/2
//! connection, or a few idle HTTP/1.1 ones); kubeconfig client certificates and `exec`
//! credential plugins ([`exec`]) are supported.

#![forbid(unsafe_code)]

pub mod client;
pub mod config;
pub mod exec;
pub mod reflector;
pub mod testing;
pub mod watch;

pub use client::{Client, Error, Limits, MERGE_PATCH, ObjectList};
pub use config::{
    Auth, ClientIdentity, ConfigError, KubeConfig, SERVICE_ACCOUNT_DIR, Scheme, ServerUrl,
};
pub use exec::{ExecConfig, ExecCredential, ExecError};
pub use reflector::{ObjectKey, Reflector, ReflectorEvent, object_key};
pub use watch::{EventType, WatchEvent, WatchStream};

/// Objects are `serde_json::Value`s; re-exported so consumers use the same version.
pub use serde_json;
