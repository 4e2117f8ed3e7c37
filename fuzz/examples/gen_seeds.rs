//! Writes a small seed corpus for every fuzz target into `corpus/<target>/` (git-ignored).
//!
//! Run from `fuzz/`: `cargo run --example gen_seeds`. Text seeds are the shapes the parsers'
//! unit tests use; protobuf seeds are the example local config (`crates/model/tests/data/
//! localhost.yaml`) converted model → wire and encoded, plus each ZDS request kind.

use std::fs;
use std::path::Path;

use ambit_model::{AddressResource, LocalConfig};
use ambit_proto::prost::Message;
use ambit_proto::{security as ps, workload as pw, zds};

const EXAMPLE: &str = include_str!("../../crates/model/tests/data/localhost.yaml");

fn write(target: &str, seeds: impl IntoIterator<Item = Vec<u8>>) -> std::io::Result<()> {
    let dir = Path::new("corpus").join(target);
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

    use zds::workload_request::Payload as Req;
    let requests = [
        Req::Add(zds::AddWorkload {
            uid: "uid-1".into(),
            workload_info: Some(zds::WorkloadInfo {
                name: "pod".into(),
                namespace: "default".into(),
                service_account: "sa".into(),
            }),
        }),
        Req::Keep(zds::KeepWorkload {
            uid: "uid-1".into(),
        }),
        Req::Del(zds::DelWorkload {
            uid: "uid-1".into(),
        }),
        Req::SnapshotSent(zds::SnapshotSent {}),
    ];
    write(
        "zds_request",
        requests
            .into_iter()
            .map(|p| zds::WorkloadRequest { payload: Some(p) }.encode_to_vec()),
    )?;
    Ok(())
}
