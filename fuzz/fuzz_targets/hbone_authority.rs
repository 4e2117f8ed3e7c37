//! CONNECT `:authority` parser (`ambit_hbone::parse_authority`), fed straight from a peer.
//!
//! Properties: never panics; an accepted authority prints (Display, the wire form we send)
//! to a string that parses back to the same target; a `Host` target is lower-case, has no
//! trailing dot, and no target has port 0.
#![no_main]

use ambit_hbone::{ConnectTarget, parse_authority};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The parser takes `&str` (http's `Authority` is already valid UTF-8).
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(target) = parse_authority(s) else {
        return;
    };
    assert_ne!(target.port(), 0, "port 0 accepted from {s:?}");
    if let ConnectTarget::Host { host, .. } = &target {
        assert!(!host.ends_with('.'), "trailing dot kept from {s:?}");
        assert_eq!(
            host,
            &host.to_ascii_lowercase(),
            "host not lower-cased from {s:?}"
        );
    }
    let printed = target.to_string();
    assert_eq!(
        parse_authority(&printed).as_ref(),
        Ok(&target),
        "{s:?} parsed to {target:?}, printed as {printed:?}"
    );
});
