//! The istio-cni plugin's inputs: `CNI_ARGS` (`ambit_agent::plugin::cni_args`) and the
//! network configuration on stdin (`ambit_agent::plugin::parse_config`). The input's first
//! line is `CNI_ARGS`, the rest is stdin.
//!
//! Properties: never panics; a refused input is an error with a CNI code and a message; every
//! parsed `K=V` pair is one of the input's `;`-separated items; an accepted configuration has
//! a supported version, its ADD result encodes as JSON in that version, every address of its
//! `prevResult` has a mask of its family's length, and the `/cmdadd` body built from it
//! decodes to the same request on the agent's side.
#![no_main]

use std::net::IpAddr;

use ambit_agent::plugin::{CmdAddRequest, SUPPORTED_VERSIONS, cni_args, parse_config};
use base64::Engine as _;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (args, stdin) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&data[..0], data),
    };
    let args = std::str::from_utf8(args).unwrap_or("");
    match cni_args(args) {
        Ok(map) => {
            for (k, v) in &map {
                assert!(
                    args.split(';').any(|kv| kv == format!("{k}={v}")),
                    "{k}={v} is not an item of {args:?}"
                );
            }
        }
        Err(e) => assert!(e.code != 0 && !e.to_string().is_empty()),
    }

    let conf = match parse_config(stdin) {
        Ok(c) => c,
        Err(e) => {
            assert!(e.code != 0 && !e.msg.is_empty(), "{e:?}");
            return;
        }
    };
    assert!(SUPPORTED_VERSIONS.contains(&conf.cni_version.as_str()));
    let out = conf
        .result_output()
        .expect("the result of an accepted config encodes");
    let result: serde_json::Value = serde_json::from_slice(&out).expect("the result is JSON");
    assert_eq!(result["cniVersion"], conf.cni_version.as_str());

    let ips = conf.prev_ips();
    for ip in &ips {
        let addr: IpAddr = ip
            .address
            .ip
            .parse()
            .expect("prev_ips gives parsed addresses");
        let mask = base64::engine::general_purpose::STANDARD
            .decode(&ip.address.mask)
            .expect("the mask is base64");
        assert_eq!(mask.len(), if addr.is_ipv4() { 4 } else { 16 }, "{ip:?}");
    }
    let req = CmdAddRequest {
        netns: "/var/run/netns/cni-1".into(),
        pod_name: "web-0".into(),
        pod_namespace: "demo".into(),
        ips,
    };
    let body = serde_json::to_vec(&req).expect("a /cmdadd body encodes");
    let back: CmdAddRequest = serde_json::from_slice(&body).expect("the agent decodes it");
    assert_eq!(back, req);
});
