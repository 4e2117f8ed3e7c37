//! DNS over UDP: one datagram as ztunnel's DNS proxy reads it (`dns::message::classify`),
//! answered locally against a fixed mesh (see `common/dns.rs` for the checks).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common/dns.rs"]
mod dns;

fuzz_target!(|data: &[u8]| {
    dns::answer(data, None);
});
