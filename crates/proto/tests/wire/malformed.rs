//! Decoding bytes from a peer must fail cleanly, never panic: random bytes and
//! mutated valid encodings are fed to the decoder of every message type.

use std::collections::BTreeSet;

use ambit_proto::prost::{Message, Name};
use ambit_proto::{ca, core, cri, discovery, rpc, security, workload, zds};
use proptest::prelude::*;

type Decoder = fn(&[u8]);

/// (full name, decoder) for every message type; the result is dropped because only
/// "returns at all" is under test.
macro_rules! decoders {
    ($($t:ty),* $(,)?) => {
        vec![$((<$t>::full_name(), (|b: &[u8]| drop(<$t>::decode(b))) as Decoder)),*]
    };
}

fn all_decoders() -> Vec<(String, Decoder)> {
    decoders![
        zds::ZdsHello,
        zds::WorkloadInfo,
        zds::WindowsNamespace,
        zds::AddWorkload,
        zds::KeepWorkload,
        zds::DelWorkload,
        zds::SnapshotSent,
        zds::Ack,
        zds::WorkloadRequest,
        zds::WorkloadResponse,
        workload::Address,
        workload::Service,
        workload::LoadBalancing,
        workload::NamespacedHostname,
        workload::NetworkAddress,
        workload::GatewayAddress,
        workload::WeightedWaypoint,
        workload::Workload,
        workload::Locality,
        workload::ApplicationTunnel,
        workload::Extension,
        workload::PortList,
        workload::Port,
        security::Authorization,
        security::Rule,
        security::Clause,
        security::Match,
        security::Address,
        security::ServiceAccountMatch,
        security::StringMatch,
        rpc::Status,
        core::Locality,
        core::Node,
        core::Metadata,
        core::ControlPlane,
        discovery::DeltaDiscoveryRequest,
        discovery::DeltaDiscoveryResponse,
        discovery::Resource,
        discovery::resource::CacheControl,
        ca::IstioCertificateRequest,
        ca::IstioCertificateResponse,
        cri::PodSandboxMetadata,
        cri::PodSandboxStatusRequest,
        cri::PodSandboxStatus,
        cri::PodSandboxStatusResponse,
        cri::PodSandboxStateValue,
        cri::PodSandboxFilter,
        cri::ListPodSandboxRequest,
        cri::PodSandbox,
        cri::ListPodSandboxResponse,
    ]
}

#[test]
fn every_declared_message_has_a_decoder_under_test() {
    let tested: BTreeSet<String> = all_decoders().into_iter().map(|(n, _)| n).collect();
    let declared = crate::roundtrip::declared_messages();
    let missing: Vec<_> = declared.difference(&tested).collect();
    assert!(missing.is_empty(), "not fuzzed: {missing:?}");
}

/// Valid encodings of the round-trip samples, the seeds for mutation.
fn seeds() -> Vec<Vec<u8>> {
    crate::roundtrip::cases()
        .into_iter()
        .map(|c| c.encoded)
        .filter(|e| !e.is_empty())
        .collect()
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        for (_, decode) in all_decoders() {
            decode(&bytes);
        }
    }

    #[test]
    fn mutated_encodings_never_panic(
        seed in any::<prop::sample::Index>(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let seeds = seeds();
        let mut bytes = seeds[seed.index(seeds.len())].clone();
        for (at, value) in edits {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        // Truncation exercises length prefixes that point past the end.
        bytes.truncate(cut.index(bytes.len() + 1));
        for (_, decode) in all_decoders() {
            decode(&bytes);
        }
    }
}
