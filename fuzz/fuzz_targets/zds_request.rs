//! ZDS `istio.workload.zds.WorkloadRequest` (CNI agent → ztunnel), decoded with prost as the
//! ztunnel side of the ZDS socket does.
//!
//! Properties: never panics; whatever decodes re-encodes to bytes that decode to the same
//! message (unknown fields are dropped on the first decode, so the check is on the second).
#![no_main]

use ambit_proto::prost::Message;
use ambit_proto::zds;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(req) = zds::WorkloadRequest::decode(data) else {
        return;
    };
    let bytes = req.encode_to_vec();
    assert_eq!(bytes.len(), req.encoded_len());
    assert_eq!(
        zds::WorkloadRequest::decode(bytes.as_slice()).as_ref(),
        Ok(&req),
        "re-encoded as {bytes:02x?}"
    );
});
