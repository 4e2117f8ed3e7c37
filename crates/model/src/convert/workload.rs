//! `istio.workload.Workload` ↔ [`Workload`].

use std::collections::{BTreeMap, HashMap};

use ambit_proto::workload as pw;

use super::{ConversionError, ConversionErrorKind, Ctx, ResourceType, gateway_to_proto};
use crate::addr;
use crate::identity::SpiffeId;
use crate::names::{NamespacedHostname, PolicyKey, WorkloadUid};
use crate::workload::{
    AppTunnelProtocol, ApplicationTunnel, DEFAULT_CAPACITY, DEFAULT_CLUSTER_ID,
    DEFAULT_SERVICE_ACCOUNT, DEFAULT_TRUST_DOMAIN, HealthStatus, Locality, NetworkMode, PortMap,
    TunnelProtocol, Workload, WorkloadType,
};

fn or_default(value: String, default: &str) -> String {
    if value.is_empty() {
        default.to_string()
    } else {
        value
    }
}

impl TryFrom<pw::Workload> for Workload {
    type Error = ConversionError;

    fn try_from(w: pw::Workload) -> Result<Self, Self::Error> {
        let resource = if w.uid.is_empty() {
            format!("{}/{}", w.namespace, w.name)
        } else {
            w.uid.clone()
        };
        let ctx = Ctx::new(ResourceType::Workload, resource);

        if w.uid.is_empty() {
            return Err(ctx.err("uid", ConversionErrorKind::MissingUid));
        }
        let uid = ctx.at("uid", WorkloadUid::new(w.uid))?;
        if w.namespace.is_empty() {
            return Err(ctx.err("namespace", ConversionErrorKind::Missing));
        }
        let identity = ctx.at(
            "trust_domain/namespace/service_account",
            SpiffeId::new(
                or_default(w.trust_domain, DEFAULT_TRUST_DOMAIN),
                w.namespace,
                or_default(w.service_account, DEFAULT_SERVICE_ACCOUNT),
            ),
        )?;

        let mut out = Workload::new(uid, w.name, identity);
        out.addresses = w
            .addresses
            .iter()
            .map(|a| ctx.ip("addresses", a))
            .collect::<Result<_, _>>()?;
        out.hostname = w.hostname;
        out.network = w.network;
        out.protocol = match pw::TunnelProtocol::try_from(w.tunnel_protocol) {
            Ok(pw::TunnelProtocol::None) => TunnelProtocol::None,
            Ok(pw::TunnelProtocol::Hbone) => TunnelProtocol::Hbone,
            Ok(pw::TunnelProtocol::LegacyIstioMtls) => {
                return Err(ctx.err("tunnel_protocol", ConversionErrorKind::LegacyIstioMtls));
            }
            Err(_) => {
                return Err(ctx.err(
                    "tunnel_protocol",
                    ConversionErrorKind::UnknownEnum(w.tunnel_protocol),
                ));
            }
        };
        out.waypoint = w
            .waypoint
            .as_ref()
            .map(|g| ctx.gateway("waypoint", g))
            .transpose()?;
        out.network_gateway = w
            .network_gateway
            .as_ref()
            .map(|g| ctx.gateway("network_gateway", g))
            .transpose()?;
        out.node = w.node;
        out.canonical_name = w.canonical_name;
        out.canonical_revision = w.canonical_revision;
        out.workload_type = ctx.enumeration(
            "workload_type",
            w.workload_type,
            |t: pw::WorkloadType| match t {
                pw::WorkloadType::Deployment => WorkloadType::Deployment,
                pw::WorkloadType::Cronjob => WorkloadType::CronJob,
                pw::WorkloadType::Pod => WorkloadType::Pod,
                pw::WorkloadType::Job => WorkloadType::Job,
            },
        )?;
        out.workload_name = w.workload_name;
        out.native_tunnel = w.native_tunnel;
        out.application_tunnel = match w.application_tunnel {
            None => None,
            Some(t) => Some(ApplicationTunnel {
                protocol: ctx.enumeration(
                    "application_tunnel.protocol",
                    t.protocol,
                    |p: pw::application_tunnel::Protocol| match p {
                        pw::application_tunnel::Protocol::None => AppTunnelProtocol::None,
                        pw::application_tunnel::Protocol::Proxy => AppTunnelProtocol::Proxy,
                    },
                )?,
                port: match ctx.port("application_tunnel.port", t.port)? {
                    0 => None,
                    p => Some(p),
                },
            }),
        };
        out.services = w
            .services
            .into_iter()
            .map(|(key, list)| {
                let key: NamespacedHostname = ctx.at("services", key.parse())?;
                let ports = list
                    .ports
                    .iter()
                    .map(|p| {
                        Ok((
                            ctx.port("services.ports", p.service_port)?,
                            ctx.port("services.ports", p.target_port)?,
                        ))
                    })
                    .collect::<Result<PortMap, ConversionError>>()?;
                Ok((key, ports))
            })
            .collect::<Result<BTreeMap<_, _>, ConversionError>>()?;
        out.authorization_policies = w
            .authorization_policies
            .iter()
            .map(|k| ctx.at("authorization_policies", k.parse::<PolicyKey>()))
            .collect::<Result<_, _>>()?;
        out.status = ctx.enumeration("status", w.status, |s: pw::WorkloadStatus| match s {
            pw::WorkloadStatus::Healthy => HealthStatus::Healthy,
            pw::WorkloadStatus::Unhealthy => HealthStatus::Unhealthy,
        })?;
        out.cluster_id = or_default(w.cluster_id, DEFAULT_CLUSTER_ID);
        out.locality = w
            .locality
            .map(|l| Locality {
                region: l.region,
                zone: l.zone,
                subzone: l.subzone,
            })
            .unwrap_or_default();
        out.network_mode = ctx.enumeration(
            "network_mode",
            w.network_mode,
            |m: pw::NetworkMode| match m {
                pw::NetworkMode::Standard => NetworkMode::Standard,
                pw::NetworkMode::HostNetwork => NetworkMode::HostNetwork,
            },
        )?;
        out.capacity = w.capacity.unwrap_or(DEFAULT_CAPACITY);
        Ok(out)
    }
}

impl From<&Workload> for pw::Workload {
    fn from(w: &Workload) -> Self {
        let services: HashMap<String, pw::PortList> = w
            .services
            .iter()
            .map(|(key, ports)| {
                let ports = ports
                    .iter()
                    .map(|(svc, target)| pw::Port {
                        service_port: u32::from(*svc),
                        target_port: u32::from(*target),
                        app_protocol: pw::AppProtocol::Unknown as i32,
                    })
                    .collect();
                (key.to_string(), pw::PortList { ports })
            })
            .collect();
        pw::Workload {
            uid: w.uid.to_string(),
            name: w.name.clone(),
            namespace: w.namespace().to_string(),
            addresses: w
                .addresses
                .iter()
                .map(|ip| addr::ip_to_bytes(*ip))
                .collect(),
            hostname: w.hostname.clone(),
            network: w.network.clone(),
            tunnel_protocol: match w.protocol {
                TunnelProtocol::None => pw::TunnelProtocol::None,
                TunnelProtocol::Hbone => pw::TunnelProtocol::Hbone,
            } as i32,
            trust_domain: w.trust_domain().to_string(),
            service_account: w.service_account().to_string(),
            waypoint: w.waypoint.as_ref().map(gateway_to_proto),
            network_gateway: w.network_gateway.as_ref().map(gateway_to_proto),
            node: w.node.clone(),
            canonical_name: w.canonical_name.clone(),
            canonical_revision: w.canonical_revision.clone(),
            workload_type: match w.workload_type {
                WorkloadType::Deployment => pw::WorkloadType::Deployment,
                WorkloadType::CronJob => pw::WorkloadType::Cronjob,
                WorkloadType::Pod => pw::WorkloadType::Pod,
                WorkloadType::Job => pw::WorkloadType::Job,
            } as i32,
            workload_name: w.workload_name.clone(),
            native_tunnel: w.native_tunnel,
            application_tunnel: w
                .application_tunnel
                .as_ref()
                .map(|t| pw::ApplicationTunnel {
                    protocol: match t.protocol {
                        AppTunnelProtocol::None => pw::application_tunnel::Protocol::None,
                        AppTunnelProtocol::Proxy => pw::application_tunnel::Protocol::Proxy,
                    } as i32,
                    port: t.port.map_or(0, u32::from),
                }),
            services,
            authorization_policies: w
                .authorization_policies
                .iter()
                .map(ToString::to_string)
                .collect(),
            status: match w.status {
                HealthStatus::Healthy => pw::WorkloadStatus::Healthy,
                HealthStatus::Unhealthy => pw::WorkloadStatus::Unhealthy,
            } as i32,
            cluster_id: w.cluster_id.clone(),
            locality: (w.locality != Locality::default()).then(|| pw::Locality {
                region: w.locality.region.clone(),
                zone: w.locality.zone.clone(),
                subzone: w.locality.subzone.clone(),
            }),
            network_mode: match w.network_mode {
                NetworkMode::Standard => pw::NetworkMode::Standard,
                NetworkMode::HostNetwork => pw::NetworkMode::HostNetwork,
            } as i32,
            extensions: Vec::new(),
            capacity: Some(w.capacity),
        }
    }
}
