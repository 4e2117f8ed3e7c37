//! Compiles `proto/**/*.proto` into Rust at build time.
//!
//! protox parses the files into a `FileDescriptorSet` in pure Rust, so building ambit
//! never needs a system `protoc`; tonic-prost-build then emits prost messages and tonic
//! client/server code into one nested module file (`ambit_proto.rs`) mirroring the
//! protobuf packages, which `src/lib.rs` re-exports under short names. The encoded
//! descriptor set is written too (`file_descriptor_set.bin`) for reflection and tests.

use std::error::Error;
use std::path::{Path, PathBuf};

/// Every file we own; imports (including google/protobuf well-known types, which protox
/// ships) are resolved from `proto/`.
const PROTOS: &[&str] = &[
    "istio/workload/zds/zds.proto",
    "istio/workload/workload.proto",
    "istio/security/authorization.proto",
    "istio/v1/auth/ca.proto",
    "google/rpc/status.proto",
    "envoy/config/core/v3/base.proto",
    "envoy/service/discovery/v3/discovery.proto",
    "runtime/v1/cri.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    let root = Path::new("proto");
    println!("cargo:rerun-if-changed=proto");
    for file in PROTOS {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
    }

    let mut compiler = protox::Compiler::new([root])?;
    // Source info carries the .proto comments into the generated rustdoc.
    compiler
        .include_source_info(true)
        .include_imports(true)
        .open_files(PROTOS)?;

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("file_descriptor_set.bin"),
        compiler.encode_file_descriptor_set(),
    )?;

    let mut config = prost_build::Config::new();
    // `prost::Name` gives every message its full name and the exact type URL xDS uses
    // inside `Any`, so callers never hand-write those strings.
    config
        .enable_type_names()
        .type_name_domain(["."], "type.googleapis.com");

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .include_file("ambit_proto.rs")
        .compile_fds_with_config(compiler.file_descriptor_set(), config)?;
    Ok(())
}
