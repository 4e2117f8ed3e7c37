//! The local-config YAML: the example file loads into the expected model, and broken files
//! are refused with the line and the key named.

use std::collections::BTreeMap;

use ambit_model::authz::{Action, Connection, Match, PolicySet, Scope, StringMatch};
use ambit_model::local::LocalConfig;
use ambit_model::workload::{
    GatewayDestination, HealthStatus, NetworkMode, TunnelProtocol, WorkloadType,
};
use ambit_model::{NamespacedHostname, NetworkAddr};

const EXAMPLE: &str = include_str!("data/localhost.yaml");

#[test]
fn example_file_loads() {
    let cfg = LocalConfig::from_yaml(EXAMPLE).unwrap();

    let summary: Vec<(&str, &str, String, TunnelProtocol)> = cfg
        .workloads
        .iter()
        .map(|w| {
            (
                w.uid.as_str(),
                w.name.as_str(),
                w.identity.to_string(),
                w.protocol,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "cluster1//v1/Pod/default/local",
                "local",
                "spiffe://cluster.local/ns/default/sa/default".to_string(),
                TunnelProtocol::Hbone
            ),
            (
                "cluster1//v1/Pod/default/local-tcp",
                "local-tcp",
                "spiffe://cluster.local/ns/default/sa/default".to_string(),
                TunnelProtocol::None
            ),
        ]
    );
    let ports = BTreeMap::from([(80, 8080)]);
    for (w, ip) in cfg.workloads.iter().zip(["127.0.0.1", "127.0.0.2"]) {
        assert_eq!(w.addresses, [ip.parse::<std::net::IpAddr>().unwrap()]);
        assert_eq!(w.node, "local");
        assert_eq!(w.namespace(), "default");
        assert_eq!(w.network, "");
        // No xDS defaulting in file mode, but the model defaults that are not identity apply.
        assert_eq!(w.cluster_id, "");
        assert_eq!(w.capacity, 1);
        assert_eq!(w.status, HealthStatus::Healthy);
        let services: Vec<String> = w.services.keys().map(ToString::to_string).collect();
        assert_eq!(services, ["default/example.com", "default/example2.com"]);
        assert!(w.services.values().all(|p| *p == ports));
    }

    let services: Vec<(String, Vec<NetworkAddr>, Vec<String>)> = cfg
        .services
        .iter()
        .map(|s| {
            (
                s.key.to_string(),
                s.vips.clone(),
                s.subject_alt_names.clone(),
            )
        })
        .collect();
    assert_eq!(
        services,
        [
            (
                "default/example.com".to_string(),
                vec![NetworkAddr::new("", "127.10.0.1".parse().unwrap())],
                vec!["spiffe://cluster.local/ns/default/sa/local".to_string()]
            ),
            (
                "default/example2.com".to_string(),
                vec![NetworkAddr::new("remote", "127.10.0.2".parse().unwrap())],
                vec![]
            ),
        ]
    );
    assert!(cfg.services.iter().all(|s| s.ports == ports));

    assert_eq!(cfg.policies.len(), 1);
    let p = &cfg.policies[0];
    assert_eq!(p.key.to_string(), "default/deny-9999");
    assert_eq!(
        (p.scope, p.action, p.dry_run),
        (Scope::Namespace, Action::Allow, false)
    );
    let only = Match {
        not_destination_ports: vec![9999],
        ..Match::default()
    };
    assert_eq!(p.rules.len(), 1);
    assert_eq!(p.rules[0].clauses.len(), 1);
    assert_eq!(p.rules[0].clauses[0].matches, [only]);

    // And the policy does what its name says for the local workload.
    let mut set = PolicySet::new();
    for p in cfg.policies.iter().cloned() {
        set.insert(p);
    }
    for (port, allowed) in [(8080, true), (9999, false)] {
        let conn = Connection {
            src_identity: None,
            src_ip: "127.0.0.2".parse().unwrap(),
            dst_ip: "127.0.0.1".parse().unwrap(),
            dst_port: port,
        };
        assert_eq!(
            set.evaluate(&cfg.workloads[0], &conn).is_allowed(),
            allowed,
            "port {port}"
        );
    }
}

#[test]
fn optional_fields_load() {
    let yaml = r#"
workloads:
- uid: u1
  name: w
  namespace: ns
  trustDomain: td
  serviceAccount: sa
  workloadIps: ["10.0.0.1", "fd00::1"]
  waypoint: {destination: "ns/waypoint.ns.svc.cluster.local", hboneMtlsPort: 15008}
  networkGateway: {destination: "net2/192.168.1.1", hboneMtlsPort: 15009}
  applicationTunnel: {protocol: PROXY, port: 15088}
  canonicalName: app
  canonicalRevision: v1
  workloadName: app-deploy
  workloadType: job
  clusterId: c1
  locality: {region: r, zone: z, subzone: s}
  status: Unhealthy
  networkMode: HostNetwork
  authorizationPolicies: ["ns/p1"]
  hostname: w.example
  nativeTunnel: true
  capacity: 3
policies:
- name: p1
  namespace: ns
  scope: WorkloadSelector
  action: Deny
  dryRun: true
  rules:
  - - - principals: [!Exact td/ns/a/sa/b, !Prefix td/, !Suffix /sa/b, !Presence []]
        notNamespaces:
        - !Presence
        serviceAccounts: [{namespace: a, serviceAccount: b}]
        sourceIps: ["10.0.0.0/8", "10.1.1.1"]
        destinationPorts: [80]
services:
- name: s
  namespace: ns
  hostname: s.example
  vips: []
  ports: {}
  ipFamilies: Dual
  visibility: Namespace
  loadBalancer: {routingPreferences: [Region, Zone], mode: Failover, healthPolicy: AllowAll}
  endpoints:
    u1: {workloadUid: u1, port: {80: 8080}, status: Healthy}
"#;
    let cfg = LocalConfig::from_yaml(yaml).unwrap();
    let w = &cfg.workloads[0];
    assert_eq!(w.identity.to_string(), "spiffe://td/ns/ns/sa/sa");
    assert_eq!(
        w.waypoint
            .as_ref()
            .map(|g| (&g.destination, g.hbone_mtls_port)),
        Some((
            &GatewayDestination::Hostname(
                NamespacedHostname::new("ns", "waypoint.ns.svc.cluster.local").unwrap()
            ),
            15008
        ))
    );
    assert_eq!(
        w.network_gateway
            .as_ref()
            .map(|g| g.destination.to_string()),
        Some("net2/192.168.1.1".to_string())
    );
    assert_eq!(
        w.application_tunnel.as_ref().and_then(|t| t.port),
        Some(15088)
    );
    assert_eq!(w.workload_type, WorkloadType::Job);
    assert_eq!(w.network_mode, NetworkMode::HostNetwork);
    assert_eq!(
        w.network_addrs().count(),
        0,
        "host-network workloads are not indexed by IP"
    );
    assert_eq!(
        (w.capacity, w.status, w.native_tunnel),
        (3, HealthStatus::Unhealthy, true)
    );
    assert_eq!(w.locality.subzone, "s");
    let m = &cfg.policies[0].rules[0].clauses[0].matches[0];
    assert_eq!(
        m.principals,
        [
            StringMatch::Exact("td/ns/a/sa/b".into()),
            StringMatch::Prefix("td/".into()),
            StringMatch::Suffix("/sa/b".into()),
            StringMatch::Presence
        ]
    );
    assert_eq!(m.not_namespaces, [StringMatch::Presence]);
    assert_eq!(m.source_ips.len(), 2);
    assert!(cfg.policies[0].dry_run);
    let s = &cfg.services[0];
    assert_eq!(s.endpoints.len(), 1);
    assert!(s.admits(HealthStatus::Unhealthy));
}

#[test]
fn empty_and_partial_files_load() {
    for yaml in ["{}", "workloads: []", "services: []\npolicies: []"] {
        assert_eq!(
            LocalConfig::from_yaml(yaml).unwrap(),
            LocalConfig::default(),
            "{yaml}"
        );
    }
}

/// Replaces the first occurrence of `from` in the example file, which must exist.
fn example_with(from: &str, to: &str) -> String {
    assert!(EXAMPLE.contains(from), "example lacks {from:?}");
    EXAMPLE.replacen(from, to, 1)
}

fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .map(|i| i + 1)
        .expect("test case names a line of its own text")
}

#[test]
fn broken_files_name_line_and_field() {
    // (case, broken text, text on the offending line, words the message must contain)
    let cases: Vec<(&str, String, &str, Vec<&str>)> = vec![
        (
            "unknown workload field",
            example_with("  node: local\n", "  nodeName: local\n"),
            "nodeName: local",
            vec!["workloads[0]", "unknown field `nodeName`"],
        ),
        (
            "unknown match field",
            example_with("notDestinationPorts: [9999]", "notDestinationPort: [9999]"),
            "notDestinationPort:",
            vec![
                "policies[0].rules[0][0][0]",
                "unknown field `notDestinationPort`",
            ],
        ),
        (
            "plain-map StringMatch",
            example_with(
                "notDestinationPorts: [9999]",
                "principals: [{Exact: cluster.local/ns/a/sa/b}]",
            ),
            "principals: [{Exact",
            vec!["policies[0].rules[0][0][0].principals[0]", "YAML tag"],
        ),
        (
            "bad workload IP",
            example_with("[\"127.0.0.2\"]", "[\"127.0.0.300\"]"),
            "127.0.0.300",
            vec!["workloads[1].workloadIps[0]"],
        ),
        (
            "bad VIP",
            example_with("remote/127.10.0.2", "remote/127.10.0"),
            "remote/127.10.0\"",
            vec!["services[1].vips[0]", "127.10.0"],
        ),
        (
            "port out of range",
            example_with(
                "notDestinationPorts: [9999]",
                "notDestinationPorts: [70000]",
            ),
            "70000",
            vec!["policies[0].rules[0][0][0].notDestinationPorts[0]", "70000"],
        ),
        (
            "service target port out of range",
            example_with("      80: 8080\n", "      80: 80800\n"),
            "80: 80800",
            vec!["workloads[0].services", "80800"],
        ),
        (
            "wrong type",
            example_with("  dryRun: false\n", "  dryRun: [false]\n"),
            "dryRun: [false]",
            vec!["policies[0].dryRun", "sequence"],
        ),
        (
            "unknown protocol",
            example_with("protocol: HBONE", "protocol: QUIC"),
            "protocol: QUIC",
            vec!["workloads[0].protocol", "QUIC"],
        ),
        (
            "missing trust domain",
            example_with("  trustDomain: cluster.local\n", ""),
            "- uid: cluster1//v1/Pod/default/local\n",
            vec!["workloads[0]", "trustDomain"],
        ),
        (
            "empty service account",
            example_with("  serviceAccount: default\n", "  serviceAccount: \"\"\n"),
            "serviceAccount: \"\"",
            vec!["workloads[0].serviceAccount"],
        ),
        (
            "bad CIDR",
            example_with(
                "notDestinationPorts: [9999]",
                "sourceIps: [\"10.0.0.0/40\"]",
            ),
            "10.0.0.0/40",
            vec!["sourceIps[0]", "10.0.0.0/40"],
        ),
        (
            "bad service key",
            example_with("\"default/example.com\":", "\"example.com\":"),
            "\"example.com\":",
            vec!["workloads[0].services", "namespace/hostname"],
        ),
        (
            "unknown scope",
            example_with("scope: Namespace", "scope: Cluster"),
            "scope: Cluster",
            vec!["policies[0].scope", "Cluster"],
        ),
    ];
    for (name, text, bad_line, words) in cases {
        let err = LocalConfig::from_yaml(&text).expect_err(name);
        let message = err.to_string();
        let line = line_of(&text, bad_line.trim_end_matches('\n'));
        // The parser reports the offending value, or for a missing key the mapping holding it.
        assert_eq!(err.line(), Some(line), "{name}: {message}");
        assert!(err.column().is_some(), "{name}");
        assert!(
            message.contains(&format!("line {line}")),
            "{name}: {message}"
        );
        for word in words {
            assert!(message.contains(word), "{name}: {message:?} lacks {word:?}");
        }
    }
}
