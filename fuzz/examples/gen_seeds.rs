//! Writes the small seed corpus of every fuzz target into `corpus/<target>/seed-NNN` (the
//! seeds are committed; what a fuzzing run adds is not).
//!
//! Run from `fuzz/`: `cargo run --example gen_seeds`. Text seeds are the shapes the parsers'
//! unit tests use; protobuf seeds are the example local config (`crates/model/tests/data/
//! localhost.yaml`) converted model → wire and encoded, plus every ZDS request shape with
//! each descriptor choice; DNS seeds are queries built with hickory; manifest seeds are the
//! `examples/basic` mesh.

use std::fs;
use std::path::Path;
use std::str::FromStr;

use ambit_model::{AddressResource, LocalConfig};
use ambit_proto::prost::Message as _;
use ambit_proto::{security as ps, workload as pw, zds};

use hickory_proto::op::{Edns, Message, OpCode, Query};
use hickory_proto::rr::{DNSClass, Name, RecordType};

const EXAMPLE: &str = include_str!("../../crates/model/tests/data/localhost.yaml");
const NAMESPACES: &str = include_str!("../../examples/basic/namespaces.yaml");
const WORKLOADS: &str = include_str!("../../examples/basic/workloads.yaml");
const POLICIES: &str = include_str!("../../examples/basic/policies.yaml");
const ALLOW_INTRUDER: &str = include_str!("../../examples/basic/changes/allow-intruder.yaml");

fn write(target: &str, seeds: impl IntoIterator<Item = Vec<u8>>) -> std::io::Result<()> {
    let dir = Path::new("corpus").join(target);
    if dir.exists() {
        for old in fs::read_dir(&dir)? {
            let old = old?.path();
            if old
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("seed-"))
            {
                fs::remove_file(old)?;
            }
        }
    }
    fs::create_dir_all(&dir)?;
    let mut n = 0;
    for (i, seed) in seeds.into_iter().enumerate() {
        fs::write(dir.join(format!("seed-{i:03}")), seed)?;
        n += 1;
    }
    eprintln!("{target}: {n} seeds");
    Ok(())
}

fn text(seeds: &[&str]) -> Vec<Vec<u8>> {
    seeds.iter().map(|s| s.as_bytes().to_vec()).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    write(
        "hbone_authority",
        text(&[
            "10.0.0.1:8080",
            "[fd00::2]:65535",
            "[::ffff:1.2.3.4]:1",
            "Svc1.Default.svc.cluster.local:80",
            "svc.:1",
            "a-b:9",
            "[fe80::1%eth0]:80",
        ]),
    )?;
    write(
        "hbone_baggage",
        text(&[
            "k8s.namespace.name=default,k8s.deployment.name=pod1-deploy,service.name=pod1-app,service.version=v1",
            " k8s.cluster.name = c1 ;prop=x, ,k8s.job.name=j,cloud.region=r,cloud.availability_zone=z,other=ignored",
            "k8s.pod.name=a,k8s.cronjob.name=b",
            "k8s.pod.name=",
        ]),
    )?;
    write(
        "hbone_forwarded",
        text(&[
            "for=\"10.99.0.2:53352\";host=remote.default.svc.cluster.local",
            "for=\"[2001:db8::1]:80\";host=\"we\\\"ird host\"",
            "for=unknown, for=_hidden;by=\"_h:_p\"",
            "for=1.2.3.4;proto=https;by=\"[::1]:9\";ext=\"x,;y\" , for=\"5.6.7.8:1\"",
        ]),
    )?;
    write(
        "spiffe_id",
        text(&[
            "spiffe://cluster.local/ns/default/sa/default",
            "spiffe://td/ns/n/sa/s",
            "spiffe://cluster.local/ns/default/sa/default/extra",
        ]),
    )?;
    write("local_config", [EXAMPLE.as_bytes().to_vec()])?;

    let config = LocalConfig::from_yaml(EXAMPLE)?;
    let addresses = config
        .workloads
        .iter()
        .cloned()
        .map(|w| AddressResource::Workload(Box::new(w)))
        .chain(
            config
                .services
                .iter()
                .cloned()
                .map(|s| AddressResource::Service(Box::new(s))),
        );
    write(
        "proto_workload",
        addresses.map(|a| pw::Address::from(&a).encode_to_vec()),
    )?;
    write(
        "proto_authorization",
        config
            .policies
            .iter()
            .map(|p| ps::Authorization::from(p).encode_to_vec()),
    )?;

    zds_seeds()?;
    dns_seeds()?;
    cni_seeds()?;
    write(
        "manifests",
        [
            [NAMESPACES, WORKLOADS, POLICIES].join("---\n"),
            [NAMESPACES, WORKLOADS].join("---\n") + "\n#apply\n" + ALLOW_INTRUDER,
        ]
        .map(String::into_bytes),
    )?;
    Ok(())
}

/// Every payload shape (with and without uid and workload info) with each descriptor choice
/// (the target's first byte: 0 none, 1 a netns, 2 a file that is not one).
fn zds_seeds() -> std::io::Result<()> {
    use zds::workload_request::Payload as Req;
    let info = zds::WorkloadInfo {
        name: "pod".into(),
        namespace: "default".into(),
        service_account: "sa".into(),
        windows_namespace: None,
    };
    let mut payloads = Vec::new();
    for uid in ["uid-1", ""] {
        for workload_info in [Some(info.clone()), None] {
            payloads.push(Some(Req::Add(zds::AddWorkload {
                uid: uid.into(),
                workload_info,
            })));
        }
        payloads.push(Some(Req::Keep(zds::KeepWorkload { uid: uid.into() })));
        payloads.push(Some(Req::Del(zds::DelWorkload { uid: uid.into() })));
    }
    payloads.push(Some(Req::SnapshotSent(zds::SnapshotSent {})));
    payloads.push(None);
    let mut seeds = Vec::new();
    for payload in payloads {
        let bytes = zds::WorkloadRequest { payload }.encode_to_vec();
        for fd in 0..3u8 {
            seeds.push([&[fd][..], &bytes].concat());
        }
    }
    write("zds_request", seeds)
}

fn query(name: &str, ty: RecordType, edns: bool) -> Message {
    let mut m = Message::new();
    m.set_id(0x1234).set_recursion_desired(true);
    m.add_query(Query::query(Name::from_str(name).expect("seed name"), ty));
    if edns {
        let mut e = Edns::new();
        e.set_max_payload(1232);
        m.set_edns(e);
    }
    m
}

/// Queries the fuzzed mesh answers locally (FQDN, search-list short name, wildcard, AAAA),
/// ones it forwards (SRV, CHAOS class, an unknown name, two questions, an UPDATE), and
/// broken ones; the TCP seeds are the same queries framed, one and several per connection.
fn dns_seeds() -> Result<(), Box<dyn std::error::Error>> {
    let mut chaos = query("version.bind.", RecordType::TXT, false);
    chaos.queries_mut()[0].set_query_class(DNSClass::CH);
    let mut two = query("svc1.default.svc.cluster.local.", RecordType::A, false);
    two.add_query(Query::query(Name::from_str("svc2.ns2.")?, RecordType::A));
    let mut update = query("svc1.", RecordType::A, false);
    update.set_op_code(OpCode::Update);
    let mut messages = [
        query("svc1.default.svc.cluster.local.", RecordType::A, false),
        query("svc1.", RecordType::AAAA, true),
        query("svc2.ns2.", RecordType::A, false),
        query("a.wild.example.com.", RecordType::A, true),
        query("external.example.org.", RecordType::AAAA, false),
        query("a.b.c.unknown.example.", RecordType::A, false),
        query(
            "_http._tcp.svc1.default.svc.cluster.local.",
            RecordType::SRV,
            false,
        ),
        chaos,
        two,
        update,
    ]
    .iter()
    .map(Message::to_vec)
    .collect::<Result<Vec<_>, _>>()?;
    let mut cut = messages[0].clone();
    cut.truncate(cut.len() - 3);
    messages.push(cut);
    messages.push(vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    write("dns_udp", messages.clone())?;

    let frame = |m: &[u8]| [&(m.len() as u16).to_be_bytes()[..], m].concat();
    let mut streams: Vec<Vec<u8>> = messages.iter().map(|m| frame(m)).collect();
    streams.push(messages[..4].iter().flat_map(|m| frame(m)).collect());
    streams.push([frame(&messages[0]), vec![0x00, 0x40, 0x12]].concat());
    write("dns_tcp", streams)?;
    // The VM bundle's text files: cluster.env as istioctl writes it, every quoting form,
    // every refusal, then a mesh.yaml and a hosts file.
    write(
        "vm_bundle",
        text(&[
            "CANONICAL_REVISION='latest'\nCANONICAL_SERVICE='foo'\nCA_ADDR='istiod.istio-system.svc:15012'\nISTIO_INBOUND_PORTS='*'\nISTIO_LOCAL_EXCLUDE_PORTS='22,15090,15021,15020'\nISTIO_METAJSON_LABELS='{\"app\":\"foo\"}'\nISTIO_META_DNS_CAPTURE='true'\nISTIO_META_NETWORK=''\nISTIO_NAMESPACE='bar'\nISTIO_SERVICE_CIDR='*'\nSERVICE_ACCOUNT='vm-sa'\nTRUST_DOMAIN=''\n",
            "# comment\nexport A=plain\nB=\"double \\\"quoted\\\" $\"\nC='it'\"'\"'s'\nD='spans\nlines'\nE=a'b'\"c\"\n",
            "A=1; rm -rf /\nB=$HOME\nC=`id`\nD='never closed\nA=again\n9X=bad\nF=one two\n",
            "defaultConfig:\n  discoveryAddress: istiod.istio-system.svc:15012\n  proxyMetadata:\n    ISTIO_META_DNS_CAPTURE: \"true\"\n",
            "127.0.0.1 istiod.istio-system.svc # the control plane\n::1 localhost ip6-localhost\nnot-an-address name\n10.0.0.1\n",
        ]),
    )?;
    Ok(())
}

/// Plugin configurations in every supported version shape, with and without `prevResult`
/// (0.3+ `ips`, 0.2 `ip4`/`ip6`), behind `CNI_ARGS`; and `/cmdadd` bodies as the plugin
/// sends them.
fn cni_seeds() -> std::io::Result<()> {
    const ARGS: &str =
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc";
    let prev_100 = r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/cni-1234"}],"ips":[{"interface":0,"address":"10.244.1.5/24","gateway":"10.244.1.1"},{"address":"fd00::5/64"}],"routes":[{"dst":"0.0.0.0/0"}],"dns":{}}"#;
    let prev_020 = r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.244.1.5/24","gateway":"10.244.1.1","routes":[{"dst":"0.0.0.0/0"}]},"ip6":{"ip":"fd00::5/64"},"dns":{"nameservers":["10.96.0.10"]}}"#;
    let conf = |version: &str, prev: Option<&str>| {
        let prev = prev.map_or(String::new(), |p| format!(r#","prevResult":{p}"#));
        format!(
            r#"{{"cniVersion":"{version}","name":"istio-cni","type":"istio-cni","cni_agent_run_dir":"/var/run/istio-cni","ambient_enabled":true,"exclude_namespaces":["kube-system"],"pod_namespace":"istio-system","plugin_log_level":"debug"{prev}}}"#
        )
    };
    let stdins = [
        conf("1.0.0", Some(prev_100)),
        conf("0.3.1", Some(prev_100)),
        conf("0.2.0", Some(prev_020)),
        conf("1.1.0", None),
        r#"{"type":"istio-cni"}"#.to_owned(),
        conf("9.9.9", None),
        r#"{"cniVersion":"1.0.0","prevResult":[]}"#.to_owned(),
    ];
    write(
        "cni_config",
        stdins.iter().enumerate().map(|(i, s)| {
            let args = if i % 2 == 0 { ARGS } else { "K8S_POD_NAME" };
            format!("{args}\n{s}").into_bytes()
        }),
    )?;
    write(
        "cmdadd_body",
        text(&[
            r#"{"Netns":"/var/run/netns/cni-1234","PodName":"web-0","PodNamespace":"demo","IPs":[{"Interface":0,"Address":{"IP":"10.244.1.5","Mask":"////AA=="},"Gateway":"10.244.1.1"},{"Interface":null,"Address":{"IP":"fd00::5","Mask":"//////////8AAAAAAAAAAA=="},"Gateway":""}]}"#,
            r#"{"Netns":"/proc/1/ns/net","PodName":"p","PodNamespace":"n"}"#,
            r#"{"Netns":"","PodName":"","PodNamespace":"","IPs":[{"Address":{"IP":"::ffff:10.0.0.1","Mask":""}}]}"#,
        ]),
    )
}
