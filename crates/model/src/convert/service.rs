//! `istio.workload.Service` ↔ [`Service`].

use ambit_proto::workload as pw;
use ambit_proto::workload::load_balancing as plb;

use super::{
    ConversionError, ConversionErrorKind, Ctx, ResourceType, gateway_to_proto,
    network_address_to_proto,
};
use crate::addr::{self, NetworkCidr};
use crate::names::NamespacedHostname;
use crate::service::{
    AppProtocol, HealthPolicy, IpFamilies, LoadBalancing, LoadBalancingMode, LoadBalancingScope,
    Service, Visibility,
};

impl TryFrom<pw::Service> for Service {
    type Error = ConversionError;

    fn try_from(s: pw::Service) -> Result<Self, Self::Error> {
        let ctx = Ctx::new(
            ResourceType::Service,
            format!("{}/{}", s.namespace, s.hostname),
        );
        if s.namespace.is_empty() {
            return Err(ctx.err("namespace", ConversionErrorKind::Missing));
        }
        if s.hostname.is_empty() {
            return Err(ctx.err("hostname", ConversionErrorKind::Missing));
        }
        let key = ctx.at(
            "namespace/hostname",
            NamespacedHostname::new(s.namespace, s.hostname),
        )?;
        let mut out = Service::new(s.name, key);
        for a in &s.addresses {
            match a.length {
                None => out.vips.push(ctx.network_addr("addresses", a)?),
                Some(len) => out.cidr_vips.push(NetworkCidr {
                    network: a.network.clone(),
                    cidr: ctx.cidr("addresses", &a.address, len)?,
                }),
            }
        }
        for p in &s.ports {
            let port = ctx.port("ports.service_port", p.service_port)?;
            out.ports
                .insert(port, ctx.port("ports.target_port", p.target_port)?);
            let proto = ctx.enumeration(
                "ports.app_protocol",
                p.app_protocol,
                |a: pw::AppProtocol| match a {
                    pw::AppProtocol::Unknown => None,
                    pw::AppProtocol::Http11 => Some(AppProtocol::Http11),
                    pw::AppProtocol::Http2 => Some(AppProtocol::Http2),
                    pw::AppProtocol::Grpc => Some(AppProtocol::Grpc),
                    pw::AppProtocol::Tcp => Some(AppProtocol::Tcp),
                    pw::AppProtocol::Tls => Some(AppProtocol::Tls),
                },
            )?;
            if let Some(proto) = proto {
                out.app_protocols.insert(port, proto);
            }
        }
        out.subject_alt_names = s.subject_alt_names;
        out.waypoint = s
            .waypoint
            .as_ref()
            .map(|g| ctx.gateway("waypoint", g))
            .transpose()?;
        out.load_balancing = match s.load_balancing {
            None => None,
            Some(lb) => Some(load_balancing(&ctx, &lb)?),
        };
        out.ip_families =
            ctx.enumeration("ip_families", s.ip_families, |f: pw::IpFamilies| match f {
                pw::IpFamilies::Automatic => None,
                pw::IpFamilies::Ipv4Only => Some(IpFamilies::Ipv4Only),
                pw::IpFamilies::Ipv6Only => Some(IpFamilies::Ipv6Only),
                pw::IpFamilies::Dual => Some(IpFamilies::Dual),
            })?;
        out.canonical = s.canonical;
        out.ingress_use_waypoint = s.ingress_use_waypoint;
        out.visibility =
            ctx.enumeration("visibility", s.visibility, |v: pw::Visibility| match v {
                pw::Visibility::Public => Visibility::Public,
                pw::Visibility::Namespace => Visibility::Namespace,
            })?;
        Ok(out)
    }
}

fn load_balancing(ctx: &Ctx, lb: &pw::LoadBalancing) -> Result<LoadBalancing, ConversionError> {
    let field = "load_balancing.routing_preference";
    let routing_preferences = lb
        .routing_preference
        .iter()
        .map(|raw| {
            let scope = ctx.enumeration(field, *raw, |s: plb::Scope| match s {
                // An unspecified scope can not be preferred; upstream refuses it too.
                plb::Scope::UnspecifiedScope => None,
                plb::Scope::Region => Some(LoadBalancingScope::Region),
                plb::Scope::Zone => Some(LoadBalancingScope::Zone),
                plb::Scope::Subzone => Some(LoadBalancingScope::Subzone),
                plb::Scope::Node => Some(LoadBalancingScope::Node),
                plb::Scope::Cluster => Some(LoadBalancingScope::Cluster),
                plb::Scope::Network => Some(LoadBalancingScope::Network),
            })?;
            scope.ok_or_else(|| ctx.err(field, ConversionErrorKind::UnknownEnum(*raw)))
        })
        .collect::<Result<_, _>>()?;
    Ok(LoadBalancing {
        routing_preferences,
        mode: ctx.enumeration("load_balancing.mode", lb.mode, |m: plb::Mode| match m {
            plb::Mode::UnspecifiedMode => LoadBalancingMode::Standard,
            plb::Mode::Strict => LoadBalancingMode::Strict,
            plb::Mode::Failover => LoadBalancingMode::Failover,
            plb::Mode::Passthrough => LoadBalancingMode::Passthrough,
        })?,
        health_policy: ctx.enumeration(
            "load_balancing.health_policy",
            lb.health_policy,
            |h: plb::HealthPolicy| match h {
                plb::HealthPolicy::OnlyHealthy => HealthPolicy::OnlyHealthy,
                plb::HealthPolicy::AllowAll => HealthPolicy::AllowAll,
            },
        )?,
    })
}

impl From<&Service> for pw::Service {
    fn from(s: &Service) -> Self {
        let vips = s.vips.iter().map(network_address_to_proto);
        let cidr_vips = s.cidr_vips.iter().map(|c| pw::NetworkAddress {
            network: c.network.clone(),
            address: addr::ip_to_bytes(c.cidr.addr()),
            length: Some(u32::from(c.cidr.prefix_len())),
        });
        let ports = s
            .ports
            .iter()
            .map(|(port, target)| pw::Port {
                service_port: u32::from(*port),
                target_port: u32::from(*target),
                app_protocol: match s.app_protocols.get(port) {
                    None => pw::AppProtocol::Unknown,
                    Some(AppProtocol::Http11) => pw::AppProtocol::Http11,
                    Some(AppProtocol::Http2) => pw::AppProtocol::Http2,
                    Some(AppProtocol::Grpc) => pw::AppProtocol::Grpc,
                    Some(AppProtocol::Tcp) => pw::AppProtocol::Tcp,
                    Some(AppProtocol::Tls) => pw::AppProtocol::Tls,
                } as i32,
            })
            .collect();
        pw::Service {
            name: s.name.clone(),
            namespace: s.namespace().to_string(),
            hostname: s.hostname().to_string(),
            addresses: vips.chain(cidr_vips).collect(),
            ports,
            subject_alt_names: s.subject_alt_names.clone(),
            waypoint: s.waypoint.as_ref().map(gateway_to_proto),
            load_balancing: s.load_balancing.as_ref().map(|lb| pw::LoadBalancing {
                routing_preference: lb
                    .routing_preferences
                    .iter()
                    .map(|scope| {
                        (match scope {
                            LoadBalancingScope::Region => plb::Scope::Region,
                            LoadBalancingScope::Zone => plb::Scope::Zone,
                            LoadBalancingScope::Subzone => plb::Scope::Subzone,
                            LoadBalancingScope::Node => plb::Scope::Node,
                            LoadBalancingScope::Cluster => plb::Scope::Cluster,
                            LoadBalancingScope::Network => plb::Scope::Network,
                        }) as i32
                    })
                    .collect(),
                mode: match lb.mode {
                    LoadBalancingMode::Standard => plb::Mode::UnspecifiedMode,
                    LoadBalancingMode::Strict => plb::Mode::Strict,
                    LoadBalancingMode::Failover => plb::Mode::Failover,
                    LoadBalancingMode::Passthrough => plb::Mode::Passthrough,
                } as i32,
                health_policy: match lb.health_policy {
                    HealthPolicy::OnlyHealthy => plb::HealthPolicy::OnlyHealthy,
                    HealthPolicy::AllowAll => plb::HealthPolicy::AllowAll,
                } as i32,
            }),
            ip_families: match s.ip_families {
                None => pw::IpFamilies::Automatic,
                Some(IpFamilies::Ipv4Only) => pw::IpFamilies::Ipv4Only,
                Some(IpFamilies::Ipv6Only) => pw::IpFamilies::Ipv6Only,
                Some(IpFamilies::Dual) => pw::IpFamilies::Dual,
            } as i32,
            extensions: Vec::new(),
            canonical: s.canonical,
            ingress_use_waypoint: s.ingress_use_waypoint,
            weighted_waypoints: Vec::new(),
            visibility: match s.visibility {
                Visibility::Public => pw::Visibility::Public,
                Visibility::Namespace => pw::Visibility::Namespace,
            } as i32,
        }
    }
}
