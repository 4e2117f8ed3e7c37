//! ipset-backed probe sets (`hash:ip` with `comment`).

use std::net::IpAddr;

use super::{ProbeSetError, set_name, step};
use crate::config::Family;
use crate::iptables::save::split_tokens;
use crate::runner::{Cmd, NetnsRunner};

pub(super) fn ensure(r: &dyn NetnsRunner, families: &[Family]) -> Result<(), ProbeSetError> {
    for &f in families {
        let mut argv = vec!["ipset", "create", set_name(f), "hash:ip"];
        if f == Family::V6 {
            argv.extend(["family", "inet6"]);
        }
        // `-exist`: creating an identical set again is not an error.
        argv.extend(["comment", "-exist"]);
        r.run_ok(&Cmd::new(argv)).map_err(step("create"))?;
    }
    Ok(())
}

pub(super) fn flush(r: &dyn NetnsRunner, set: &str) -> Result<(), ProbeSetError> {
    r.run_ok(&Cmd::new(["ipset", "flush", set]))
        .map_err(step("flush"))?;
    Ok(())
}

pub(super) fn upsert(
    r: &dyn NetnsRunner,
    set: &str,
    ip: IpAddr,
    uid: &str,
) -> Result<(), ProbeSetError> {
    // With `-exist`, adding an existing entry updates its comment: replace semantics.
    let ip = ip.to_string();
    r.run_ok(&Cmd::new([
        "ipset", "add", set, &ip, "comment", uid, "-exist",
    ]))
    .map_err(step("add"))?;
    Ok(())
}

pub(super) fn delete(r: &dyn NetnsRunner, set: &str, ip: IpAddr) -> Result<(), ProbeSetError> {
    let ip = ip.to_string();
    r.run_ok(&Cmd::new(["ipset", "del", set, &ip, "-exist"]))
        .map_err(step("del"))?;
    Ok(())
}

pub(super) fn list(r: &dyn NetnsRunner, set: &str) -> Result<Vec<(IpAddr, String)>, ProbeSetError> {
    let out = r
        .run_ok(&Cmd::new(["ipset", "save", set]))
        .map_err(step("save"))?;
    Ok(parse_save(&out.stdout, set))
}

pub(super) fn destroy(r: &dyn NetnsRunner, families: &[Family]) -> Result<(), ProbeSetError> {
    for &f in families {
        let out = r
            .run(&Cmd::new(["ipset", "destroy", set_name(f)]))
            .map_err(step("destroy"))?;
        if !out.success() {
            tracing::debug!(set = set_name(f), stderr = %out.stderr.trim(), "ipset destroy failed");
        }
    }
    Ok(())
}

/// Parse `ipset save` lines: `add SET ADDR comment "UID"`.
fn parse_save(text: &str, set: &str) -> Vec<(IpAddr, String)> {
    text.lines()
        .filter_map(|line| {
            let t = split_tokens(line);
            if t.first().map(String::as_str) != Some("add")
                || t.get(1).map(String::as_str) != Some(set)
            {
                return None;
            }
            let ip: IpAddr = t.get(2)?.parse().ok()?;
            let uid = t
                .windows(2)
                .find(|w| w[0] == "comment")
                .map(|w| w[1].clone())
                .unwrap_or_default();
            Some((ip, uid))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_save() {
        let text = "create istio-inpod-probes-v4 hash:ip family inet hashsize 1024 maxelem 65536 comment\n\
                    add istio-inpod-probes-v4 10.0.0.1 comment \"b\"\n\
                    add istio-inpod-probes-v4 10.0.0.2\n\
                    add other 10.0.0.3 comment \"x\"\n";
        assert_eq!(
            parse_save(text, "istio-inpod-probes-v4"),
            vec![
                ("10.0.0.1".parse().unwrap(), "b".to_owned()),
                ("10.0.0.2".parse().unwrap(), String::new()),
            ]
        );
    }
}
