//! `baggage` header parser (`ambit_hbone::Baggage::parse`).
//!
//! Properties: never panics; `encode()` of an accepted value parses back to the same
//! `Baggage`, with one documented normalisation: `encode` skips empty fields, so a workload
//! kind whose name is empty (`k8s.pod.name=`) is not re-emitted and comes back as `None`.
#![no_main]

use ambit_hbone::headers::{Baggage, MAX_BAGGAGE_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(mut parsed) = Baggage::parse(s) else {
        return;
    };
    if parsed.workload_name.is_empty() {
        parsed.workload_kind = None;
    }
    let encoded = parsed.encode();
    assert!(
        encoded.len() <= MAX_BAGGAGE_LEN,
        "encode grew {s:?} past the limit"
    );
    assert_eq!(
        Baggage::parse(&encoded).as_ref(),
        Ok(&parsed),
        "{s:?} parsed to {parsed:?}, encoded as {encoded:?}"
    );
});
