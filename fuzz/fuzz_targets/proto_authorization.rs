//! xDS `istio.security.Authorization` resources: prost decoding, then the wire → model
//! conversion (`Authorization::try_from`), exactly what the ADS client does with a resource.
//!
//! Properties: never panics; a policy that converts survives model → wire → model
//! unchanged (the guarantee `crates/model/src/convert/tests.rs` checks with proptest).
#![no_main]

use ambit_model::Authorization;
use ambit_proto::prost::Message;
use ambit_proto::security as ps;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(proto) = ps::Authorization::decode(data) else {
        return;
    };
    let Ok(model) = Authorization::try_from(proto) else {
        return;
    };
    let wire = ps::Authorization::from(&model);
    assert_eq!(
        Authorization::try_from(wire.clone()).as_ref(),
        Ok(&model),
        "model {model:?} emitted as {wire:?}"
    );
});
