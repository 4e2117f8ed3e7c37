//! SPIFFE ids (`SpiffeId::parse_bytes`), as read from a peer certificate's URI SAN.
//!
//! Properties: never panics; parsing is exact, so an accepted id displays as exactly the
//! input bytes, re-parses to the same id, and `SpiffeId::new` of its parts rebuilds it.
#![no_main]

use ambit_model::SpiffeId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(id) = SpiffeId::parse_bytes(data) else {
        return;
    };
    let printed = id.to_string();
    assert_eq!(printed.as_bytes(), data, "{id:?} printed as {printed:?}");
    assert_eq!(SpiffeId::parse(&printed).as_ref(), Ok(&id));
    assert_eq!(
        SpiffeId::new(id.trust_domain(), id.namespace(), id.service_account()).as_ref(),
        Ok(&id)
    );
});
