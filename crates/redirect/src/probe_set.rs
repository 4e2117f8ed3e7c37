//! The host probe set: enrolled pod IPs, each tagged with its pod UID (`spec/cni.md` §3.10).
//!
//! Host rules SNAT kubelet probes only towards addresses in this set. Entries carry the pod
//! UID so a late removal for pod A cannot delete the entry of pod B that reused A's IP:
//! [`ProbeSet::upsert`] replaces the owner, [`ProbeSet::remove`] only deletes its own entry.
//! The same API drives an ipset (iptables backend) or an nft set (nftables backend).

mod ipset;
mod nftset;

use std::collections::HashSet;
use std::net::IpAddr;

use crate::config::{Backend, Family};
use crate::consts::{PROBE_SET_V4, PROBE_SET_V6};
use crate::runner::{NetnsRunner, RunError};

/// Failure maintaining the probe set.
#[derive(Debug, thiserror::Error)]
pub enum ProbeSetError {
    /// A set command failed; `step` says which operation.
    #[error("probe set {step}: {source}")]
    Command {
        /// Operation.
        step: &'static str,
        /// The command's failure.
        #[source]
        source: RunError,
    },
    /// An IPv6 address while the set is IPv4-only.
    #[error("IPv6 address {0} but the probe set is IPv4-only")]
    Ipv6Disabled(IpAddr),
    /// A UID that cannot be stored as a set comment.
    #[error("pod UID {0:?} is not usable as a set comment")]
    InvalidUid(String),
}

fn step(step: &'static str) -> impl FnOnce(RunError) -> ProbeSetError {
    move |source| ProbeSetError::Command { step, source }
}

/// ipset comments hold at most 255 bytes; UIDs are 36-byte UUIDs.
const MAX_UID_LEN: usize = 255;

fn check_uid(uid: &str) -> Result<(), ProbeSetError> {
    let ok = !uid.is_empty()
        && uid.len() <= MAX_UID_LEN
        && !uid.chars().any(|c| c.is_control() || c == '"' || c == '\\');
    if ok {
        Ok(())
    } else {
        Err(ProbeSetError::InvalidUid(uid.to_owned()))
    }
}

/// The probe sets of one host netns.
#[derive(Debug)]
pub struct ProbeSet<R> {
    runner: R,
    backend: Backend,
    ipv6: bool,
}

impl<R: NetnsRunner> ProbeSet<R> {
    /// Sets managed through `runner` (normally the host netns).
    pub fn new(runner: R, backend: Backend, ipv6: bool) -> Self {
        Self {
            runner,
            backend,
            ipv6,
        }
    }

    fn families(&self) -> &'static [Family] {
        if self.ipv6 {
            &[Family::V4, Family::V6]
        } else {
            &[Family::V4]
        }
    }

    /// Which set an address goes to; IPv4-mapped IPv6 addresses are stored as IPv4.
    fn route(&self, ip: IpAddr) -> Result<(IpAddr, Family, &'static str), ProbeSetError> {
        match ip.to_canonical() {
            v4 @ IpAddr::V4(_) => Ok((v4, Family::V4, PROBE_SET_V4)),
            v6 @ IpAddr::V6(_) if self.ipv6 => Ok((v6, Family::V6, PROBE_SET_V6)),
            v6 => Err(ProbeSetError::Ipv6Disabled(v6)),
        }
    }

    /// Create the sets if missing (keeps existing entries).
    pub fn ensure(&self) -> Result<(), ProbeSetError> {
        match self.backend {
            Backend::Iptables => ipset::ensure(&self.runner, self.families()),
            Backend::Nftables => nftset::ensure(&self.runner, self.ipv6),
        }
    }

    /// Remove every entry (startup, before re-adding the snapshot).
    pub fn flush(&self) -> Result<(), ProbeSetError> {
        for &f in self.families() {
            match self.backend {
                Backend::Iptables => ipset::flush(&self.runner, set_name(f))?,
                Backend::Nftables => nftset::flush(&self.runner, set_name(f))?,
            }
        }
        Ok(())
    }

    /// Add `ip` owned by `uid`, replacing any previous owner of the same IP.
    pub fn upsert(&self, ip: IpAddr, uid: &str) -> Result<(), ProbeSetError> {
        check_uid(uid)?;
        let (ip, _, set) = self.route(ip)?;
        match self.backend {
            Backend::Iptables => ipset::upsert(&self.runner, set, ip, uid),
            Backend::Nftables => {
                let current = self.owner(set, ip)?;
                nftset::upsert(&self.runner, set, ip, uid, current.as_deref())
            }
        }
    }

    /// Delete `ip` only if it is owned by `uid`. Returns whether an entry was deleted.
    pub fn remove(&self, ip: IpAddr, uid: &str) -> Result<bool, ProbeSetError> {
        let (ip, _, set) = self.route(ip)?;
        if self.owner(set, ip)?.as_deref() != Some(uid) {
            return Ok(false);
        }
        self.delete(set, ip)?;
        Ok(true)
    }

    /// Every entry: (address, owner UID). Entries without a comment have an empty UID.
    pub fn list(&self) -> Result<Vec<(IpAddr, String)>, ProbeSetError> {
        let mut out = Vec::new();
        for &f in self.families() {
            out.extend(self.list_set(set_name(f))?);
        }
        Ok(out)
    }

    /// Delete every entry whose address is not in `keep`. Returns how many were deleted.
    pub fn prune(&self, keep: &HashSet<IpAddr>) -> Result<usize, ProbeSetError> {
        let mut n = 0;
        for (ip, _) in self.list()? {
            if !keep.contains(&ip) {
                let (ip, _, set) = self.route(ip)?;
                self.delete(set, ip)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Remove the sets entirely (uninstall; host rules must be deleted first). For nftables
    /// this deletes the whole host table, as upstream's set manager does.
    pub fn destroy(&self) -> Result<(), ProbeSetError> {
        match self.backend {
            Backend::Iptables => ipset::destroy(&self.runner, self.families()),
            Backend::Nftables => nftset::destroy(&self.runner),
        }
    }

    fn list_set(&self, set: &'static str) -> Result<Vec<(IpAddr, String)>, ProbeSetError> {
        match self.backend {
            Backend::Iptables => ipset::list(&self.runner, set),
            Backend::Nftables => nftset::list(&self.runner, set),
        }
    }

    fn owner(&self, set: &'static str, ip: IpAddr) -> Result<Option<String>, ProbeSetError> {
        Ok(self
            .list_set(set)?
            .into_iter()
            .find(|(a, _)| *a == ip)
            .map(|(_, uid)| uid))
    }

    fn delete(&self, set: &'static str, ip: IpAddr) -> Result<(), ProbeSetError> {
        match self.backend {
            Backend::Iptables => ipset::delete(&self.runner, set, ip),
            Backend::Nftables => nftset::delete(&self.runner, set, ip),
        }
    }
}

fn set_name(f: Family) -> &'static str {
    match f {
        Family::V4 => PROBE_SET_V4,
        Family::V6 => PROBE_SET_V6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids() {
        for (uid, ok) in [
            ("0b3e5b3c-3a3f-4d2e-9f0e-1f2a3b4c5d6e", true),
            ("", false),
            ("a\"b", false),
            ("a\nb", false),
            ("a\\b", false),
        ] {
            assert_eq!(check_uid(uid).is_ok(), ok, "{uid:?}");
        }
        assert!(check_uid(&"x".repeat(256)).is_err());
    }
}
