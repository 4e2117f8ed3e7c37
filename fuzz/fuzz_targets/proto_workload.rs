//! xDS `istio.workload.Address` resources: prost decoding, then the wire → model conversion
//! (`AddressResource::try_from`), exactly what the ADS client does with a resource body.
//!
//! Properties: never panics; a resource that converts survives model → wire → model
//! unchanged (the guarantee `crates/model/src/convert/tests.rs` checks with proptest).
#![no_main]

use ambit_model::AddressResource;
use ambit_proto::prost::Message;
use ambit_proto::workload as pw;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(proto) = pw::Address::decode(data) else {
        return;
    };
    let Ok(model) = AddressResource::try_from(proto) else {
        return;
    };
    let wire = pw::Address::from(&model);
    assert_eq!(
        AddressResource::try_from(wire.clone()).as_ref(),
        Ok(&model),
        "model {model:?} emitted as {wire:?}"
    );
});
