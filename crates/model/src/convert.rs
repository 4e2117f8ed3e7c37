//! Conversions between the xDS protobuf types (`ambit_proto`) and the model, both ways.
//!
//! Wire → model (`TryFrom`) applies xDS defaults (trust domain `cluster.local`, service
//! account `default`, cluster id `Kubernetes`, capacity 1) and refuses anything malformed with a
//! [`ConversionError`] naming the resource, the field and what is wrong — never a panic, never
//! a silently dropped entry (upstream drops unparsable CIDRs and string matches, which can widen
//! a policy; a refused resource is NACKed instead). Model → wire (`From`) is what the control
//! plane emits; it writes every default out explicitly.

mod authz;
mod service;
mod workload;

use std::fmt;

use ambit_proto::workload as pw;

use std::net::IpAddr;

use crate::addr::{self, Cidr, NetworkAddr};
use crate::identity::SpiffeIdError;
use crate::names::{NameError, NamespacedHostname};
use crate::service::Service;
use crate::workload::{GatewayAddress, GatewayDestination, Workload};

/// Which kind of xDS resource failed to convert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceType {
    Address,
    Workload,
    Service,
    Authorization,
}

impl fmt::Display for ResourceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ResourceType::Address => "address",
            ResourceType::Workload => "workload",
            ResourceType::Service => "service",
            ResourceType::Authorization => "authorization",
        })
    }
}

/// A resource that can not be converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{resource_type} {resource:?}: field {field}: {kind}")]
pub struct ConversionError {
    pub resource_type: ResourceType,
    /// The resource's name: workload uid (or `namespace/name` when the uid is missing),
    /// service `namespace/hostname`, policy `namespace/name`.
    pub resource: String,
    /// The offending field, as named in the .proto (nested fields joined with `.`).
    pub field: &'static str,
    pub kind: ConversionErrorKind,
}

/// What is wrong with the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConversionErrorKind {
    #[error("address must be 4 or 16 bytes, got {0}")]
    BadAddressLength(usize),
    #[error("unknown enum value {0}")]
    UnknownEnum(i32),
    #[error("workload has no uid")]
    MissingUid,
    #[error("required field is not set")]
    Missing,
    #[error("prefix length {len} is too long for {ip}")]
    BadCidr { ip: std::net::IpAddr, len: u32 },
    #[error("invalid identity: {0}")]
    BadSpiffe(SpiffeIdError),
    #[error("invalid name: {0}")]
    BadName(NameError),
    #[error("port {0} is out of range (max 65535)")]
    PortOutOfRange(u32),
    #[error("tunnel protocol LEGACY_ISTIO_MTLS is not supported")]
    LegacyIstioMtls,
}

impl From<NameError> for ConversionErrorKind {
    fn from(e: NameError) -> Self {
        ConversionErrorKind::BadName(e)
    }
}

impl From<SpiffeIdError> for ConversionErrorKind {
    fn from(e: SpiffeIdError) -> Self {
        ConversionErrorKind::BadSpiffe(e)
    }
}

/// Builds errors for one resource; keeps call sites to `ctx.err(field, kind)`.
struct Ctx {
    resource_type: ResourceType,
    resource: String,
}

impl Ctx {
    fn new(resource_type: ResourceType, resource: String) -> Self {
        Self {
            resource_type,
            resource,
        }
    }

    fn err(&self, field: &'static str, kind: impl Into<ConversionErrorKind>) -> ConversionError {
        ConversionError {
            resource_type: self.resource_type,
            resource: self.resource.clone(),
            field,
            kind: kind.into(),
        }
    }

    /// `Result<T, impl Into<kind>>` → `Result<T, ConversionError>` for `field`.
    fn at<T, E: Into<ConversionErrorKind>>(
        &self,
        field: &'static str,
        r: Result<T, E>,
    ) -> Result<T, ConversionError> {
        r.map_err(|e| self.err(field, e))
    }

    fn port(&self, field: &'static str, p: u32) -> Result<u16, ConversionError> {
        u16::try_from(p).map_err(|_| self.err(field, ConversionErrorKind::PortOutOfRange(p)))
    }

    /// An enum field: the generated enum's `TryFrom<i32>` then our mapping.
    fn enumeration<P, T>(
        &self,
        field: &'static str,
        raw: i32,
        map: impl FnOnce(P) -> T,
    ) -> Result<T, ConversionError>
    where
        P: TryFrom<i32>,
    {
        P::try_from(raw)
            .map(map)
            .map_err(|_| self.err(field, ConversionErrorKind::UnknownEnum(raw)))
    }

    fn ip(&self, field: &'static str, raw: &[u8]) -> Result<IpAddr, ConversionError> {
        addr::ip_from_bytes(raw)
            .map_err(|_| self.err(field, ConversionErrorKind::BadAddressLength(raw.len())))
    }

    fn cidr(&self, field: &'static str, raw: &[u8], len: u32) -> Result<Cidr, ConversionError> {
        let ip = self.ip(field, raw)?;
        Cidr::new(ip, len).map_err(|_| self.err(field, ConversionErrorKind::BadCidr { ip, len }))
    }

    fn network_addr(
        &self,
        field: &'static str,
        a: &pw::NetworkAddress,
    ) -> Result<NetworkAddr, ConversionError> {
        let ip = self.ip(field, &a.address)?;
        Ok(NetworkAddr::new(a.network.clone(), ip))
    }

    fn gateway(
        &self,
        field: &'static str,
        g: &pw::GatewayAddress,
    ) -> Result<GatewayAddress, ConversionError> {
        use pw::gateway_address::Destination;
        let destination = match &g.destination {
            None => return Err(self.err(field, ConversionErrorKind::Missing)),
            Some(Destination::Hostname(h)) => GatewayDestination::Hostname(self.at(
                field,
                NamespacedHostname::new(h.namespace.clone(), h.hostname.clone()),
            )?),
            Some(Destination::Address(a)) => {
                GatewayDestination::Address(self.network_addr(field, a)?)
            }
        };
        Ok(GatewayAddress {
            destination,
            hbone_mtls_port: self.port(field, g.hbone_mtls_port)?,
        })
    }
}

fn network_address_to_proto(a: &NetworkAddr) -> pw::NetworkAddress {
    pw::NetworkAddress {
        network: a.network.clone(),
        address: addr::ip_to_bytes(a.ip),
        length: None,
    }
}

fn gateway_to_proto(g: &GatewayAddress) -> pw::GatewayAddress {
    use pw::gateway_address::Destination;
    let destination = match &g.destination {
        GatewayDestination::Hostname(h) => Destination::Hostname(pw::NamespacedHostname {
            namespace: h.namespace().to_string(),
            hostname: h.hostname().to_string(),
        }),
        GatewayDestination::Address(a) => Destination::Address(network_address_to_proto(a)),
    };
    pw::GatewayAddress {
        hbone_mtls_port: u32::from(g.hbone_mtls_port),
        destination: Some(destination),
    }
}

/// The payload of an `istio.workload.Address` resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressResource {
    Workload(Box<Workload>),
    Service(Box<Service>),
}

impl TryFrom<pw::Address> for AddressResource {
    type Error = ConversionError;
    fn try_from(a: pw::Address) -> Result<Self, Self::Error> {
        match a.r#type {
            Some(pw::address::Type::Workload(w)) => {
                Workload::try_from(w).map(|w| AddressResource::Workload(Box::new(w)))
            }
            Some(pw::address::Type::Service(s)) => {
                Service::try_from(s).map(|s| AddressResource::Service(Box::new(s)))
            }
            None => Err(Ctx::new(ResourceType::Address, String::new())
                .err("type", ConversionErrorKind::Missing)),
        }
    }
}

impl From<&AddressResource> for pw::Address {
    fn from(a: &AddressResource) -> Self {
        let t = match a {
            AddressResource::Workload(w) => pw::address::Type::Workload(w.as_ref().into()),
            AddressResource::Service(s) => pw::address::Type::Service(s.as_ref().into()),
        };
        pw::Address { r#type: Some(t) }
    }
}

#[cfg(test)]
mod tests;
