//! `/cmdadd` request bodies as the agent's plugin event server reads them: JSON into
//! `ambit_agent::plugin::CmdAddRequest` (Go field names), then the pod addresses it uses.
//!
//! Properties: never panics; a refused body has an error message; an accepted one re-encodes
//! (as the plugin would send it) to a body that decodes to the same request.
#![no_main]

use std::net::IpAddr;

use ambit_agent::plugin::CmdAddRequest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let req: CmdAddRequest = match serde_json::from_slice(data) {
        Ok(r) => r,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    // What the server takes from it: the addresses that parse, in canonical form.
    let ips: Vec<IpAddr> = req
        .ips
        .iter()
        .filter_map(|ip| ip.address.ip.parse::<IpAddr>().ok())
        .map(|ip| ip.to_canonical())
        .collect();
    assert!(ips.len() <= req.ips.len());
    let body = serde_json::to_vec(&req).expect("an accepted body re-encodes");
    let back: CmdAddRequest = serde_json::from_slice(&body).expect("the re-encoded body decodes");
    assert_eq!(back, req);
});
