//! ambit-model: workloads, services, authorization policies and identities in memory, their
//! conversion from the wire (protobuf) types, and the upstream local-config YAML.
//! No sockets, no tokio.

#![forbid(unsafe_code)]

pub mod addr;
pub mod authz;
pub mod convert;
pub mod identity;
pub mod index;
pub mod local;
pub mod names;
pub mod service;
pub mod workload;

mod text;

pub use addr::{AddrError, Cidr, NetworkAddr, NetworkCidr};
pub use authz::{Authorization, PolicySet};
pub use convert::{AddressResource, ConversionError, ConversionErrorKind};
pub use identity::{SpiffeId, SpiffeIdError};
pub use index::WorkloadIndex;
pub use local::{LocalConfig, LocalConfigError};
pub use names::{NameError, NamespacedHostname, PolicyKey, WorkloadUid};
pub use service::Service;
pub use workload::Workload;
