//! ambit-control: the ambient control plane — translation of Kubernetes-shaped objects to
//! workload xDS, the xDS server, and the certificate authority (`IstioCertificateService`).

#![forbid(unsafe_code)]

pub mod autoregister;
pub mod ca;
pub mod grpc;
pub mod kube_auth;
pub mod kube_source;
pub mod mesh_config;
pub mod monitoring;
pub mod objects;
pub mod server;
pub mod source;
pub mod translate;
pub mod xds;
