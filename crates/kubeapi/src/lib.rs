//! ambit-kubeapi: the small Kubernetes API client ambit's agent and control plane use to
//! read objects and write pod annotations.
//!
//! # On kube-rs
//!
//! The transport is [`kube::Client`] (kube-rs + k8s-openapi, measured and adopted:
//! docs/upstream-differences.md): TLS on aws-lc-rs, connection reuse, bearer tokens, rotated
//! token files and client certificates are kube-rs's. `exec` credential plugins are run here
//! ([`exec`]), with a deadline, because kube-rs runs them with none. This crate
//! keeps the boundary ambit's roles program against: objects stay `serde_json::Value` and each
//! consumer deserializes them into its own types (the control plane reuses its manifest
//! structs, the agent its `Pod`), errors are this crate's [`Error`] / [`ConfigError`], and
//! every body, line and wait is bounded by [`Limits`].
//!
//! # Layout
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | [`KubeConfig`]: in-cluster service account or kubeconfig file (server, CA, client certificate, token, exec plugin); [`KubeConfig::from_environment`] picks one by the one rule every ambit role uses |
//! | [`exec`] | the kubeconfig's `exec` block and one bounded run of its plugin ([`ExecConfig::run`]: deadline, output limits, the process group killed) |
//! | [`client`] | [`Client`]: `list` (paged), `watch`, `get`, `merge_patch`, `create` over a [`kube::Client`]; typed [`Error`]s; size and time [`Limits`] |
//! | [`watch`] | [`WatchStream`] of [`WatchEvent`]s: newline-delimited JSON with a bounded line size |
//! | [`reflector`] | [`Reflector`]: list + watch with a map by (namespace, name), relist on 410 |
//! | `testing` | `testing::FakeApiServer`: a real HTTP server with the API server's JSON shapes, for tests (feature `testing`, dev-dependencies only) |
//!
//! Nothing here panics on what the server sends: malformed JSON, wrong shapes, oversized
//! bodies or lines and error statuses all come back as [`Error`] values.
//!
//! Lists are paged (`limit` / `continue`); connections are reused across requests
//! (hyper-util's pool inside kube-rs, one per [`Client`] and its clones); kubeconfig client
//! certificates and `exec` credential plugins are supported.

#![forbid(unsafe_code)]

pub mod client;
pub mod config;
pub mod exec;
pub mod reflector;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod watch;

pub use client::{Client, Error, Limits, MERGE_PATCH, ObjectList};
pub use config::{
    Auth, ClientIdentity, ConfigError, KubeConfig, SERVICE_ACCOUNT_DIR, Scheme, ServerUrl,
};
pub use exec::{ExecConfig, ExecCredential, ExecError, ExecFailure};
pub use reflector::{ObjectKey, Reflector, ReflectorEvent, object_key};
pub use watch::{EventType, WatchEvent, WatchStream};

/// Objects are `serde_json::Value`s; re-exported so consumers use the same version.
pub use serde_json;
