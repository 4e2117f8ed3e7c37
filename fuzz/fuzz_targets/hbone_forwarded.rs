//! `forwarded` header parser (`ambit_hbone::parse_forwarded`).
//!
//! Properties: never panics; an accepted value has at most 64 elements; and when the first
//! element names a client `IP:port`, re-building the header the way ztunnel does
//! (`build_forwarded(client, host)`) parses back to the same client address and host,
//! whatever characters the host holds (quoting and escaping round-trip).
#![no_main]

use ambit_hbone::headers::build_forwarded;
use ambit_hbone::parse_forwarded;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(parsed) = parse_forwarded(s) else {
        return;
    };
    assert!(
        parsed.elements.len() <= 64,
        "{s:?}: too many elements accepted"
    );
    let Some(client) = parsed.client_addr() else {
        return;
    };
    let host = parsed.elements[0].host.as_deref();
    let built = build_forwarded(client, host);
    let reparsed = match parse_forwarded(&built) {
        Ok(f) => f,
        Err(e) => panic!("{s:?}: rebuilt header {built:?} does not parse: {e}"),
    };
    assert_eq!(reparsed.client_addr(), Some(client), "{s:?} -> {built:?}");
    assert_eq!(
        reparsed.elements[0].host.as_deref(),
        host.filter(|h| !h.is_empty()),
        "{s:?} -> {built:?}"
    );
});
