use std::collections::{BTreeMap, HashMap};

use ambit_proto::security as ps;
use ambit_proto::workload as pw;
use proptest::prelude::*;

use super::*;
use crate::authz::{
    Action, Authorization, Clause, Match, Rule, Scope, ServiceAccountMatch, StringMatch,
};
use crate::service::{
    AppProtocol, HealthPolicy, IpFamilies, LoadBalancing, LoadBalancingMode, LoadBalancingScope,
    Visibility,
};
use crate::workload::{
    AppTunnelProtocol, ApplicationTunnel, HealthStatus, Locality, NetworkMode, TunnelProtocol,
    WorkloadType,
};

fn full_workload() -> Workload {
    let mut w = Workload::new(
        "Kubernetes//Pod/ns1/pod1".parse().unwrap(),
        "pod1",
        "spiffe://td.example/ns/ns1/sa/sa1".parse().unwrap(),
    );
    w.addresses = vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()];
    w.hostname = "pod1.example".into();
    w.network = "net1".into();
    w.protocol = TunnelProtocol::Hbone;
    w.waypoint = Some(GatewayAddress {
        destination: GatewayDestination::Hostname(
            "ns1/waypoint.ns1.svc.cluster.local".parse().unwrap(),
        ),
        hbone_mtls_port: 15008,
    });
    w.network_gateway = Some(GatewayAddress {
        destination: GatewayDestination::Address("net2/192.168.0.1".parse().unwrap()),
        hbone_mtls_port: 15009,
    });
    w.node = "node1".into();
    w.canonical_name = "app".into();
    w.canonical_revision = "v1".into();
    w.workload_type = WorkloadType::CronJob;
    w.workload_name = "app-job".into();
    w.native_tunnel = true;
    w.application_tunnel = Some(ApplicationTunnel {
        protocol: AppTunnelProtocol::Proxy,
        port: Some(15088),
    });
    w.services = BTreeMap::from([
        (
            "ns1/svc1.example".parse().unwrap(),
            BTreeMap::from([(80, 8080), (443, 8443)]),
        ),
        ("ns2/svc2.example".parse().unwrap(), BTreeMap::new()),
    ]);
    w.authorization_policies = vec![
        "ns1/p1".parse().unwrap(),
        "istio-system/p2".parse().unwrap(),
    ];
    w.status = HealthStatus::Unhealthy;
    w.cluster_id = "c1".into();
    w.locality = Locality {
        region: "r".into(),
        zone: "z".into(),
        subzone: "s".into(),
    };
    w.network_mode = NetworkMode::HostNetwork;
    w.capacity = 7;
    w
}

fn minimal_workload() -> Workload {
    Workload::new(
        "u".parse().unwrap(),
        "",
        "spiffe://cluster.local/ns/n/sa/default".parse().unwrap(),
    )
}

fn full_service() -> Service {
    let mut s = Service::new("svc1", "ns1/svc1.example".parse().unwrap());
    s.vips = vec![
        "/10.96.0.1".parse().unwrap(),
        "remote/fd00::10".parse().unwrap(),
    ];
    s.cidr_vips = vec!["net/10.97.0.0/16".parse().unwrap()];
    s.ports = BTreeMap::from([(80, 8080), (443, 0)]);
    s.app_protocols = BTreeMap::from([(80, AppProtocol::Http2)]);
    s.subject_alt_names = vec!["spiffe://td/ns/ns1/sa/svc".into()];
    s.waypoint = Some(GatewayAddress {
        destination: GatewayDestination::Address("/10.0.0.9".parse().unwrap()),
        hbone_mtls_port: 15008,
    });
    s.load_balancing = Some(LoadBalancing {
        routing_preferences: vec![LoadBalancingScope::Network, LoadBalancingScope::Zone],
        mode: LoadBalancingMode::Failover,
        health_policy: HealthPolicy::AllowAll,
    });
    s.ip_families = Some(IpFamilies::Dual);
    s.canonical = true;
    s.ingress_use_waypoint = true;
    s.visibility = Visibility::Namespace;
    s
}

fn full_policy() -> Authorization {
    let m = Match {
        namespaces: vec![StringMatch::Exact("a".into())],
        not_namespaces: vec![StringMatch::Prefix("b".into())],
        principals: vec![StringMatch::Suffix("/sa/c".into())],
        not_principals: vec![StringMatch::Presence],
        source_ips: vec!["10.0.0.0/8".parse().unwrap()],
        not_source_ips: vec!["10.1.0.0/16".parse().unwrap()],
        destination_ips: vec!["fd00::/64".parse().unwrap()],
        not_destination_ips: vec!["10.0.0.1".parse().unwrap()],
        destination_ports: vec![80, 65535],
        not_destination_ports: vec![9999],
        service_accounts: vec![ServiceAccountMatch {
            namespace: "n".into(),
            service_account: "s".into(),
        }],
        not_service_accounts: vec![ServiceAccountMatch {
            namespace: "x".into(),
            service_account: "y".into(),
        }],
    };
    Authorization {
        key: "ns1/policy".parse().unwrap(),
        scope: Scope::WorkloadSelector,
        action: Action::Deny,
        dry_run: true,
        rules: vec![
            Rule {
                clauses: vec![
                    Clause {
                        matches: vec![m, Match::default()],
                    },
                    Clause::default(),
                ],
            },
            Rule::default(),
        ],
    }
}

#[test]
fn model_round_trips_through_protobuf() {
    for w in [full_workload(), minimal_workload()] {
        let back = Workload::try_from(pw::Workload::from(&w)).unwrap();
        assert_eq!(back, w);
        let addr = AddressResource::Workload(Box::new(w));
        assert_eq!(
            AddressResource::try_from(pw::Address::from(&addr)).unwrap(),
            addr
        );
    }
    for s in [full_service(), Service::new("", "n/h".parse().unwrap())] {
        let back = Service::try_from(pw::Service::from(&s)).unwrap();
        assert_eq!(back, s);
        let addr = AddressResource::Service(Box::new(s));
        assert_eq!(
            AddressResource::try_from(pw::Address::from(&addr)).unwrap(),
            addr
        );
    }
    let minimal_policy = Authorization {
        key: "a/b".parse().unwrap(),
        scope: Scope::Global,
        action: Action::Allow,
        dry_run: false,
        rules: vec![],
    };
    for p in [full_policy(), minimal_policy] {
        assert_eq!(
            Authorization::try_from(ps::Authorization::from(&p)).unwrap(),
            p
        );
    }
}

#[test]
fn xds_defaults_apply() {
    let proto = pw::Workload {
        uid: "u".into(),
        namespace: "ns".into(),
        capacity: None,
        ..Default::default()
    };
    let w = Workload::try_from(proto).unwrap();
    assert_eq!(
        w.identity.to_string(),
        "spiffe://cluster.local/ns/ns/sa/default"
    );
    assert_eq!(w.cluster_id, "Kubernetes");
    assert_eq!(w.capacity, 1);
    assert_eq!(w.protocol, TunnelProtocol::None);
    let tunnel = pw::ApplicationTunnel {
        protocol: 0,
        port: 0,
    };
    let w = Workload::try_from(pw::Workload {
        application_tunnel: Some(tunnel),
        ..pw::Workload::from(&w)
    })
    .unwrap();
    assert_eq!(
        w.application_tunnel,
        Some(ApplicationTunnel {
            protocol: AppTunnelProtocol::None,
            port: None
        })
    );
}

fn gw(
    destination: Option<pw::gateway_address::Destination>,
    port: u32,
) -> Option<pw::GatewayAddress> {
    Some(pw::GatewayAddress {
        hbone_mtls_port: port,
        destination,
    })
}

#[test]
fn bad_workloads_name_field_and_problem() {
    use ConversionErrorKind as K;
    type Edit = fn(&mut pw::Workload);
    let cases: Vec<(&str, Edit, &str, K)> = vec![
        ("no uid", |w| w.uid.clear(), "uid", K::MissingUid),
        (
            "no namespace",
            |w| w.namespace.clear(),
            "namespace",
            K::Missing,
        ),
        (
            "address length",
            |w| w.addresses.push(vec![1, 2, 3]),
            "addresses",
            K::BadAddressLength(3),
        ),
        (
            "legacy mtls",
            |w| w.tunnel_protocol = 2,
            "tunnel_protocol",
            K::LegacyIstioMtls,
        ),
        (
            "tunnel enum",
            |w| w.tunnel_protocol = 9,
            "tunnel_protocol",
            K::UnknownEnum(9),
        ),
        (
            "workload type",
            |w| w.workload_type = -1,
            "workload_type",
            K::UnknownEnum(-1),
        ),
        ("status", |w| w.status = 2, "status", K::UnknownEnum(2)),
        (
            "network mode",
            |w| w.network_mode = 5,
            "network_mode",
            K::UnknownEnum(5),
        ),
        (
            "waypoint without destination",
            |w| w.waypoint = gw(None, 15008),
            "waypoint",
            K::Missing,
        ),
        (
            "waypoint port",
            |w| {
                let dest = pw::gateway_address::Destination::Hostname(pw::NamespacedHostname {
                    namespace: "a".into(),
                    hostname: "b".into(),
                });
                w.waypoint = gw(Some(dest), 70000);
            },
            "waypoint",
            K::PortOutOfRange(70000),
        ),
        (
            "gateway address",
            |w| {
                let dest = pw::gateway_address::Destination::Address(pw::NetworkAddress {
                    network: String::new(),
                    address: vec![0; 5],
                    length: None,
                });
                w.network_gateway = gw(Some(dest), 15008);
            },
            "network_gateway",
            K::BadAddressLength(5),
        ),
        (
            "app tunnel protocol",
            |w| {
                w.application_tunnel = Some(pw::ApplicationTunnel {
                    protocol: 7,
                    port: 0,
                })
            },
            "application_tunnel.protocol",
            K::UnknownEnum(7),
        ),
        (
            "app tunnel port",
            |w| {
                w.application_tunnel = Some(pw::ApplicationTunnel {
                    protocol: 0,
                    port: 65536,
                })
            },
            "application_tunnel.port",
            K::PortOutOfRange(65536),
        ),
        (
            "service port",
            |w| {
                let port = pw::Port {
                    service_port: 80,
                    target_port: 100_000,
                    app_protocol: 0,
                };
                w.services
                    .insert("a/b".into(), pw::PortList { ports: vec![port] });
            },
            "services.ports",
            K::PortOutOfRange(100_000),
        ),
        (
            "service key",
            |w| {
                w.services.insert("nohost".into(), pw::PortList::default());
            },
            "services",
            K::BadName(crate::names::NameError::WrongShape {
                what: "namespaced hostname",
                value: "nohost".into(),
                form: "namespace/hostname",
            }),
        ),
        (
            "bad identity part",
            |w| w.service_account = "a/b".into(),
            "trust_domain/namespace/service_account",
            K::BadSpiffe(crate::identity::SpiffeIdError::WrongShape {
                id: "spiffe://td.example/ns/ns1/sa/a/b".into(),
                segments: 6,
            }),
        ),
    ];
    for (name, edit, field, kind) in cases {
        let mut proto = pw::Workload::from(&full_workload());
        proto.namespace = "ns1".into();
        edit(&mut proto);
        let err = Workload::try_from(proto).expect_err(name);
        assert_eq!(
            (err.resource_type, err.field, &err.kind),
            (ResourceType::Workload, field, &kind),
            "{name}"
        );
        assert!(err.to_string().contains(field), "{name}: {err}");
    }
    let err = Workload::try_from(pw::Workload {
        uid: "u1".into(),
        ..Default::default()
    })
    .unwrap_err();
    assert_eq!(err.resource, "u1");
    assert_eq!(
        err.to_string(),
        "workload \"u1\": field namespace: required field is not set"
    );
}

#[test]
fn bad_services_and_policies_name_field_and_problem() {
    use ConversionErrorKind as K;
    type SvcEdit = fn(&mut pw::Service);
    let cases: Vec<(&str, SvcEdit, &str, K)> = vec![
        (
            "no namespace",
            |s| s.namespace.clear(),
            "namespace",
            K::Missing,
        ),
        (
            "no hostname",
            |s| s.hostname.clear(),
            "hostname",
            K::Missing,
        ),
        (
            "vip length",
            |s| s.addresses[0].address = vec![1],
            "addresses",
            K::BadAddressLength(1),
        ),
        (
            "cidr vip",
            |s| s.addresses[0].length = Some(33),
            "addresses",
            K::BadCidr {
                ip: "10.96.0.1".parse().unwrap(),
                len: 33,
            },
        ),
        (
            "port",
            |s| s.ports[0].service_port = 65536,
            "ports.service_port",
            K::PortOutOfRange(65536),
        ),
        (
            "target port",
            |s| s.ports[0].target_port = u32::MAX,
            "ports.target_port",
            K::PortOutOfRange(u32::MAX),
        ),
        (
            "app protocol",
            |s| s.ports[0].app_protocol = 6,
            "ports.app_protocol",
            K::UnknownEnum(6),
        ),
        (
            "ip families",
            |s| s.ip_families = 4,
            "ip_families",
            K::UnknownEnum(4),
        ),
        (
            "visibility",
            |s| s.visibility = 2,
            "visibility",
            K::UnknownEnum(2),
        ),
        (
            "unspecified scope",
            |s| s.load_balancing.as_mut().unwrap().routing_preference = vec![0],
            "load_balancing.routing_preference",
            K::UnknownEnum(0),
        ),
        (
            "lb mode",
            |s| s.load_balancing.as_mut().unwrap().mode = 4,
            "load_balancing.mode",
            K::UnknownEnum(4),
        ),
        (
            "lb health",
            |s| s.load_balancing.as_mut().unwrap().health_policy = 2,
            "load_balancing.health_policy",
            K::UnknownEnum(2),
        ),
    ];
    for (name, edit, field, kind) in cases {
        let mut proto = pw::Service::from(&full_service());
        edit(&mut proto);
        let err = Service::try_from(proto).expect_err(name);
        assert_eq!(
            (err.resource_type, err.field, &err.kind),
            (ResourceType::Service, field, &kind),
            "{name}"
        );
    }

    type PolEdit = fn(&mut ps::Authorization);
    fn first_match(a: &mut ps::Authorization) -> &mut ps::Match {
        &mut a.rules[0].clauses[0].matches[0]
    }
    let cases: Vec<(&str, PolEdit, &str, K)> = vec![
        ("no name", |a| a.name.clear(), "name", K::Missing),
        (
            "no namespace",
            |a| a.namespace.clear(),
            "namespace",
            K::Missing,
        ),
        ("scope", |a| a.scope = 3, "scope", K::UnknownEnum(3)),
        ("action", |a| a.action = 2, "action", K::UnknownEnum(2)),
        (
            "empty string match",
            |a| {
                first_match(a)
                    .principals
                    .push(ps::StringMatch { match_type: None })
            },
            "rules.clauses.matches.principals",
            K::Missing,
        ),
        (
            "cidr too long",
            |a| {
                first_match(a).not_source_ips.push(ps::Address {
                    address: vec![10, 0, 0, 0],
                    length: 40,
                })
            },
            "rules.clauses.matches.not_source_ips",
            K::BadCidr {
                ip: "10.0.0.0".parse().unwrap(),
                len: 40,
            },
        ),
        (
            "cidr bytes",
            |a| {
                first_match(a).destination_ips.push(ps::Address {
                    address: vec![],
                    length: 0,
                })
            },
            "rules.clauses.matches.destination_ips",
            K::BadAddressLength(0),
        ),
        (
            "port",
            |a| first_match(a).not_destination_ports.push(65536),
            "rules.clauses.matches.not_destination_ports",
            K::PortOutOfRange(65536),
        ),
    ];
    for (name, edit, field, kind) in cases {
        let mut proto = ps::Authorization::from(&full_policy());
        edit(&mut proto);
        let err = Authorization::try_from(proto).expect_err(name);
        assert_eq!(
            (err.resource_type, err.field, &err.kind),
            (ResourceType::Authorization, field, &kind),
            "{name}"
        );
    }

    let err = AddressResource::try_from(pw::Address { r#type: None }).unwrap_err();
    assert_eq!(
        (err.resource_type, err.field, err.kind),
        (ResourceType::Address, "type", K::Missing)
    );
}

// ---- property tests: arbitrary (wire-valid) protobuf never panics, and what converts is stable.

fn small_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z]{1,6}",
        "[a-z/.]{0,8}",
        "\\PC{0,6}"
    ]
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 4),
        proptest::collection::vec(any::<u8>(), 16),
        proptest::collection::vec(any::<u8>(), 0..20)
    ]
}

fn enum_value() -> impl Strategy<Value = i32> {
    prop_oneof![8 => 0..4i32, 1 => any::<i32>()]
}

fn port() -> impl Strategy<Value = u32> {
    prop_oneof![8 => 0..=65535u32, 1 => any::<u32>()]
}

fn gateway() -> impl Strategy<Value = Option<pw::GatewayAddress>> {
    use pw::gateway_address::Destination;
    let dest = prop_oneof![
        Just(None),
        (small_string(), small_string()).prop_map(|(namespace, hostname)| Some(
            Destination::Hostname(pw::NamespacedHostname {
                namespace,
                hostname
            })
        )),
        (small_string(), bytes()).prop_map(|(network, address)| Some(Destination::Address(
            pw::NetworkAddress {
                network,
                address,
                length: None
            }
        ))),
    ];
    proptest::option::of((dest, port()).prop_map(|(destination, hbone_mtls_port)| {
        pw::GatewayAddress {
            hbone_mtls_port,
            destination,
        }
    }))
}

prop_compose! {
    fn proto_workload()(
        uid in small_string(), name in small_string(), namespace in small_string(),
        trust_domain in small_string(), service_account in small_string(),
        addresses in proptest::collection::vec(bytes(), 0..3),
        enums in proptest::collection::vec(enum_value(), 5),
        waypoint in gateway(), network_gateway in gateway(),
        tunnel in proptest::option::of((enum_value(), port())),
        services in proptest::collection::hash_map(small_string(), proptest::collection::vec((port(), port()), 0..3), 0..3),
        policies in proptest::collection::vec(small_string(), 0..3),
        capacity in proptest::option::of(any::<u32>()),
    ) -> pw::Workload {
        pw::Workload {
            uid, name, namespace, trust_domain, service_account, addresses, waypoint, network_gateway,
            tunnel_protocol: enums[0], workload_type: enums[1], status: enums[2], network_mode: enums[3],
            application_tunnel: tunnel.map(|(protocol, port)| pw::ApplicationTunnel { protocol, port }),
            services: services.into_iter().map(|(k, ports)| (k, pw::PortList {
                ports: ports.into_iter().map(|(service_port, target_port)| pw::Port { service_port, target_port, app_protocol: enums[4] }).collect(),
            })).collect::<HashMap<_, _>>(),
            authorization_policies: policies,
            capacity,
            ..Default::default()
        }
    }
}

prop_compose! {
    fn proto_service()(
        name in small_string(), namespace in small_string(), hostname in small_string(),
        addresses in proptest::collection::vec((small_string(), bytes(), proptest::option::of(0..140u32)), 0..3),
        ports in proptest::collection::vec((port(), port(), enum_value()), 0..3),
        waypoint in gateway(),
        lb in proptest::option::of((proptest::collection::vec(enum_value(), 0..3), enum_value(), enum_value())),
        ip_families in enum_value(), visibility in enum_value(),
    ) -> pw::Service {
        pw::Service {
            name, namespace, hostname, waypoint, ip_families, visibility,
            addresses: addresses.into_iter().map(|(network, address, length)| pw::NetworkAddress { network, address, length }).collect(),
            ports: ports.into_iter().map(|(service_port, target_port, app_protocol)| pw::Port { service_port, target_port, app_protocol }).collect(),
            load_balancing: lb.map(|(routing_preference, mode, health_policy)| pw::LoadBalancing { routing_preference, mode, health_policy }),
            ..Default::default()
        }
    }
}

fn string_match() -> impl Strategy<Value = ps::StringMatch> {
    use ps::string_match::MatchType;
    prop_oneof![
        Just(None),
        small_string().prop_map(|s| Some(MatchType::Exact(s))),
        small_string().prop_map(|s| Some(MatchType::Prefix(s))),
        small_string().prop_map(|s| Some(MatchType::Suffix(s))),
        Just(Some(MatchType::Presence(()))),
    ]
    .prop_map(|match_type| ps::StringMatch { match_type })
}

fn proto_match() -> impl Strategy<Value = ps::Match> {
    let strings = || proptest::collection::vec(string_match(), 0..2);
    let addrs = || {
        proptest::collection::vec(
            (bytes(), 0..140u32).prop_map(|(address, length)| ps::Address { address, length }),
            0..2,
        )
    };
    let ports = || proptest::collection::vec(port(), 0..2);
    let accounts = || {
        proptest::collection::vec(
            (small_string(), small_string()).prop_map(|(namespace, service_account)| {
                ps::ServiceAccountMatch {
                    namespace,
                    service_account,
                }
            }),
            0..2,
        )
    };
    (
        (strings(), strings(), strings(), strings()),
        (addrs(), addrs(), addrs(), addrs()),
        (ports(), ports(), accounts(), accounts()),
    )
        .prop_map(
            |((ns, nns, p, np), (si, nsi, di, ndi), (dp, ndp, sa, nsa))| ps::Match {
                namespaces: ns,
                not_namespaces: nns,
                principals: p,
                not_principals: np,
                source_ips: si,
                not_source_ips: nsi,
                destination_ips: di,
                not_destination_ips: ndi,
                destination_ports: dp,
                not_destination_ports: ndp,
                service_accounts: sa,
                not_service_accounts: nsa,
                extensions: Vec::new(),
            },
        )
}

prop_compose! {
    fn proto_policy()(
        name in small_string(), namespace in small_string(), scope in enum_value(), action in enum_value(),
        dry_run in any::<bool>(),
        rules in proptest::collection::vec(proptest::collection::vec(proptest::collection::vec(proto_match(), 0..3), 0..3), 0..3),
    ) -> ps::Authorization {
        ps::Authorization {
            name, namespace, scope, action, dry_run,
            rules: rules.into_iter().map(|clauses| ps::Rule {
                clauses: clauses.into_iter().map(|matches| ps::Clause { matches }).collect(),
            }).collect(),
            extensions: Vec::new(),
        }
    }
}

proptest! {
    #[test]
    fn arbitrary_workloads_convert_without_panic(proto in proto_workload()) {
        if let Ok(w) = Workload::try_from(proto) {
            prop_assert_eq!(Workload::try_from(pw::Workload::from(&w)), Ok(w));
        }
    }

    #[test]
    fn arbitrary_services_convert_without_panic(proto in proto_service()) {
        if let Ok(s) = Service::try_from(proto) {
            prop_assert_eq!(Service::try_from(pw::Service::from(&s)), Ok(s));
        }
    }

    #[test]
    fn arbitrary_policies_convert_without_panic(proto in proto_policy()) {
        if let Ok(a) = Authorization::try_from(proto) {
            prop_assert_eq!(Authorization::try_from(ps::Authorization::from(&a)), Ok(a));
        }
    }
}
