//! Generated protobuf and gRPC types for every wire protocol ambit speaks.
//!
//! The `.proto` files under `crates/proto/proto/` are ours, but their package names,
//! message names, field numbers and enum values copy upstream Istio and Envoy exactly:
//! protobuf identifies a field on the wire only by its number, so renumbering (or
//! reusing a reserved number) would silently make ambit misread, or be misread by, a
//! real istiod, ztunnel or CNI agent. Change names freely; never numbers.
//!
//! | module | protobuf package | used for |
//! |---|---|---|
//! | [`zds`] | `istio.workload.zds` | CNI agent ↔ ztunnel pod enrolment (ZDS) |
//! | [`workload`] | `istio.workload` | xDS `Address` resources (workloads, services) |
//! | [`security`] | `istio.security` | xDS `Authorization` resources |
//! | [`discovery`] | `envoy.service.discovery.v3` | delta ADS messages and gRPC service |
//! | [`core`] | `envoy.config.core.v3` | the xDS `Node` and friends |
//! | [`rpc`] | `google.rpc` | `Status`, the error detail of a NACK |
//! | [`ca`] | `istio.v1.auth` | `IstioCertificateService` (CSR → chain) |
//! | [`cri`] | `runtime.v1` | the container runtime's sandboxes (Windows node agent) |
//!
//! Code is generated at build time by protox (a pure-Rust protobuf compiler, so no
//! system `protoc`) and tonic-prost-build; the gRPC services come with both the client
//! (`*_client`) and server (`*_server`) submodules. Well-known types map to
//! [`prost_types`] (`Any`, `Struct`, `Duration`), `google.protobuf.Empty` to `()`, and
//! `google.protobuf.UInt32Value` to `Option<u32>`. Every message implements
//! [`prost::Name`], so `Name::type_url()` yields the `type.googleapis.com/...` URL that
//! xDS puts in `Any` (e.g. [`ADDRESS_TYPE_URL`]).
//!
//! Enum naming: protobuf scopes enum values beside their enum, so enums whose values
//! would clash inside one package are nested in their message, as upstream does:
//! `workload::application_tunnel::Protocol` (`NONE` also names a `TunnelProtocol`
//! value) and `workload::load_balancing::{Scope, Mode, HealthPolicy}`. Nesting changes
//! names only; the encoded numbers are those of the specs. Enum-typed fields are `i32`
//! in prost (unknown values survive a round trip); use the generated getters or
//! `Enum::try_from(i32)` to read them.

#![forbid(unsafe_code)]

pub use prost;
pub use prost_types;

/// Type URL of workload/service resources on the ADS stream.
pub const ADDRESS_TYPE_URL: &str = "type.googleapis.com/istio.workload.Address";
/// Type URL of authorization policy resources on the ADS stream.
pub const AUTHORIZATION_TYPE_URL: &str = "type.googleapis.com/istio.security.Authorization";

/// Encoded `google.protobuf.FileDescriptorSet` of our `.proto` files plus their imports,
/// for gRPC reflection and for checking the generated code against the descriptors.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/file_descriptor_set.bin"));

/// The generated tree, one module per protobuf package segment. Kept private so the
/// public paths stay short and do not depend on how packages nest; the generated code
/// refers to sibling packages through `super::`, which this tree keeps valid.
#[allow(
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations,
    reason = "generated code"
)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/ambit_proto.rs"));
}

pub use generated::envoy::config::core::v3 as core;
pub use generated::envoy::service::discovery::v3 as discovery;
pub use generated::google::rpc;
pub use generated::istio::security;
pub use generated::istio::v1::auth as ca;
pub use generated::istio::workload;
pub use generated::istio::workload::zds;
pub use generated::runtime::v1 as cri;
