//! A bundle directory as istioctl writes it, for the `vm up` tests.

#![allow(dead_code)] // each test binary uses part of it

use std::path::Path;

/// `KEY='value'` lines (istioctl's quoting) for WorkloadGroup `foo` in `bar`, with `ca` as
/// `CA_ADDR` and `extra` lines appended.
pub fn write_bundle(dir: &Path, ca: &str, extra: &str) {
    let env = format!(
        "CANONICAL_REVISION='latest'\nCANONICAL_SERVICE='foo'\nCA_ADDR='{ca}'\nISTIO_INBOUND_PORTS='*'\nISTIO_LOCAL_EXCLUDE_PORTS='22,15090,15021,15020'\nISTIO_METAJSON_LABELS='{{\"app\":\"foo\"}}'\nISTIO_META_CLUSTER_ID='Kubernetes'\nISTIO_META_DNS_CAPTURE='true'\nISTIO_META_NETWORK=''\nISTIO_META_WORKLOAD_NAME='foo'\nISTIO_NAMESPACE='bar'\nISTIO_SERVICE='foo.bar'\nISTIO_SERVICE_CIDR='*'\nPOD_NAMESPACE='bar'\nSERVICE_ACCOUNT='vm-sa'\nTRUST_DOMAIN=''\n{extra}"
    );
    std::fs::write(dir.join("cluster.env"), env).unwrap();
    std::fs::write(
        dir.join("mesh.yaml"),
        format!("defaultConfig:\n  discoveryAddress: {ca}\n"),
    )
    .unwrap();
    std::fs::write(dir.join("hosts"), "127.0.0.1 istiod.istio-system.svc\n").unwrap();
    let ca = ambit_tls::LocalCa::generate("cluster.local").unwrap();
    std::fs::write(dir.join("root-cert.pem"), ca.root_pem()).unwrap();
    std::fs::write(dir.join("istio-token"), "vm-token-0123456789\n").unwrap();
}
