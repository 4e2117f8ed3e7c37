//! Host-level redirection for a VM or bare host running ztunnel in dedicated mode
//! (`docs/vm.md`): the rules `ambit vm up` writes into the VM's own network namespace.
//!
//! Unlike the in-pod rules there is no upstream ambient counterpart to be byte-identical
//! with; the capture choices follow the keys upstream's `istio-iptables` reads from a VM's
//! `cluster.env` (`ISTIO_SERVICE_CIDR`, `ISTIO_SERVICE_EXCLUDE_CIDR`,
//! `ISTIO_INBOUND_PORTS`, `ISTIO_LOCAL_EXCLUDE_PORTS`, `ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE`,
//! DNS capture), with ztunnel's own sockets recognised by their packet mark (0x539, ztunnel's
//! `PACKET_MARK`) instead of a proxy uid:
//!
//! - nat `PREROUTING` → `ISTIO_VM_PRERT`: the excluded interfaces, HBONE (15008) and the excluded ports return; every
//!   other inbound TCP port (or only the listed ones) is redirected to 15006;
//! - nat `OUTPUT` → `ISTIO_VM_OUTPUT`: the excluded interfaces and ztunnel's marked traffic
//!   return; DNS (UDP leaving
//!   the host, TCP not to 127.0.0.1) goes to 15053 when captured; loopback, the excluded
//!   CIDRs and ports return; TCP to the service CIDRs (or everywhere) goes to 15001;
//! - raw: ztunnel's own DNS upstream flows get conntrack zone 1, as in the pod rules.
//!
//! nftables writes the same in `inet istio-vm-nat` / `inet istio-vm-raw`. Delete removes
//! both backends' objects, so `ambit vm down` needs no record of what `up` used.

mod iptables;
mod nft;

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

pub use self::iptables::{vm_delete_commands, vm_rules};
pub use self::nft::{vm_delete_transaction, vm_tables, vm_transaction};

use crate::apply::{ApplyError, VerifyReport, nftables, xtables};
use crate::config::{Backend, Family, IfaceName};
use crate::iptables::AddrSpec;
use crate::runner::NetnsRunner;

/// nft table of the VM's nat rules.
pub const NFT_VM_NAT_TABLE: &str = "istio-vm-nat";
/// nft table of the VM's raw rules (DNS conntrack zone).
pub const NFT_VM_RAW_TABLE: &str = "istio-vm-raw";

/// An IP network (`10.96.0.0/12`), host bits cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    addr: IpAddr,
    len: u8,
}

/// Why a CIDR was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a CIDR (like 10.96.0.0/12 or fd00::/8): {reason}")]
pub struct CidrError {
    /// The refused text.
    pub value: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl Cidr {
    /// The network of `addr/len`; `None` if `len` is too long for the family.
    pub fn new(addr: IpAddr, len: u8) -> Option<Self> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if len > max {
            return None;
        }
        let addr = match addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
                IpAddr::V4((u32::from(a) & mask).into())
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
                IpAddr::V6((u128::from(a) & mask).into())
            }
        };
        Some(Self { addr, len })
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    /// The family of the network.
    pub fn family(&self) -> Family {
        if self.addr.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }

    pub(crate) fn spec(&self) -> AddrSpec {
        AddrSpec::Net(self.addr, self.len)
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason| CidrError {
            value: s.to_owned(),
            reason,
        };
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|_| bad("bad address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => max,
            Some(l) => l
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|l| *l <= max)
                .ok_or(bad("bad prefix length"))?,
        };
        Self::new(addr, len).ok_or(bad("bad prefix length"))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// Which inbound TCP ports go to ztunnel's plaintext listener (`ISTIO_INBOUND_PORTS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboundCapture {
    /// `*`: every port except these (`ISTIO_LOCAL_EXCLUDE_PORTS`) and HBONE.
    All {
        /// Ports left alone, in order.
        except: Vec<u16>,
    },
    /// Only these ports.
    Ports(Vec<u16>),
    /// Nothing (an empty `ISTIO_INBOUND_PORTS`).
    None,
}

/// Which outbound TCP destinations go to ztunnel's outbound listener (`ISTIO_SERVICE_CIDR`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutboundCapture {
    /// `*`: everywhere.
    All,
    /// Only these networks.
    Cidrs(Vec<Cidr>),
    /// Nothing (an empty `ISTIO_SERVICE_CIDR`).
    None,
}

/// What `ambit vm up` decided for the VM's rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmRedirectConfig {
    /// Also write IPv6 rules.
    pub ipv6: bool,
    /// Inbound capture.
    pub inbound: InboundCapture,
    /// Outbound capture.
    pub outbound: OutboundCapture,
    /// Destinations never captured (`ISTIO_SERVICE_EXCLUDE_CIDR`).
    pub outbound_exclude_cidrs: Vec<Cidr>,
    /// Destination ports never captured (`ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE`).
    pub outbound_exclude_ports: Vec<u16>,
    /// DNS (port 53) to ztunnel's DNS proxy (`ISTIO_META_DNS_CAPTURE`).
    pub dns_capture: bool,
    /// Interfaces whose traffic is never captured either way (`ISTIO_EXCLUDE_INTERFACES`).
    pub exclude_interfaces: Vec<IfaceName>,
}

impl Default for VmRedirectConfig {
    /// What `istioctl x workload entry configure` writes: everything captured both ways
    /// except SSH and the agent ports, DNS captured.
    fn default() -> Self {
        Self {
            ipv6: true,
            inbound: InboundCapture::All {
                except: vec![22, 15090, 15021, 15020],
            },
            outbound: OutboundCapture::All,
            outbound_exclude_cidrs: Vec::new(),
            outbound_exclude_ports: Vec::new(),
            dns_capture: true,
            exclude_interfaces: Vec::new(),
        }
    }
}

impl VmRedirectConfig {
    /// The families rules are written for.
    pub fn families(&self) -> &'static [Family] {
        if self.ipv6 {
            &[Family::V4, Family::V6]
        } else {
            &[Family::V4]
        }
    }
}

/// A VM's redirection: which backend writes it and what it contains.
#[derive(Debug, Clone)]
pub struct VmRules {
    /// iptables or nftables (`NATIVE_NFTABLES`).
    pub backend: Backend,
    /// The rules' content.
    pub config: VmRedirectConfig,
}

impl VmRules {
    /// Removes whatever VM rules the namespace holds (either backend, a previous run's), then
    /// writes these. The iptables families go one restore each; nftables is one transaction.
    pub fn apply(&self, r: &dyn NetnsRunner) -> Result<(), ApplyError> {
        delete_all(r)?;
        match self.backend {
            Backend::Iptables => {
                for &family in self.config.families() {
                    xtables::restore(r, family, &vm_rules(&self.config, family))?;
                }
            }
            Backend::Nftables => {
                nftables::run_tx(r, &vm_transaction(&self.config), "nft apply")?;
            }
        }
        Ok(())
    }

    /// Compares what the kernel holds with the plan.
    pub fn verify(&self, r: &dyn NetnsRunner) -> Result<VerifyReport, ApplyError> {
        let findings = match self.backend {
            Backend::Iptables => {
                let mut f = Vec::new();
                for &family in self.config.families() {
                    f.extend(xtables::verify(r, family, &vm_rules(&self.config, family))?);
                }
                f
            }
            Backend::Nftables => nftables::verify(
                r,
                &vm_tables(&self.config),
                &[NFT_VM_NAT_TABLE, NFT_VM_RAW_TABLE],
            )?,
        };
        Ok(VerifyReport { findings })
    }
}

/// Removes every VM rule of both backends and both families from the namespace `r` runs in.
/// Absent objects are not an error. A jump written twice (a restore run twice) is removed
/// as often as it is found, up to [`MAX_DUPLICATE_JUMPS`], before the chains go.
pub fn delete_all(r: &dyn NetnsRunner) -> Result<(), ApplyError> {
    for family in [Family::V4, Family::V6] {
        if family == Family::V6 && !kernel_has_ipv6() {
            continue;
        }
        if !tool_present(r, crate::iptables::save_binary(family)) {
            continue;
        }
        let cmds = vm_delete_commands(family);
        let (jumps, chains) = cmds.split_at(VM_JUMPS);
        for jump in jumps {
            for _ in 0..MAX_DUPLICATE_JUMPS {
                let out = r
                    .run(&jump.cmd())
                    .map_err(crate::apply::step("iptables -D"))?;
                if !out.success() {
                    break;
                }
            }
        }
        xtables::delete(r, chains)?;
    }
    if tool_present(r, "nft") {
        nftables::run_tx(r, &vm_delete_transaction(), "nft delete")?;
    }
    Ok(())
}

/// How many of [`vm_delete_commands`] are jump deletions (the rest flush and delete chains).
const VM_JUMPS: usize = 4;
/// Bound on removing one jump repeatedly.
pub const MAX_DUPLICATE_JUMPS: usize = 8;

/// Whether the namespace holds any VM rule (either backend, either family), for `vm down`
/// and the tests that check nothing is left behind.
pub fn any_present(r: &dyn NetnsRunner) -> Result<bool, ApplyError> {
    use crate::runner::Cmd;
    for family in [Family::V4, Family::V6] {
        let bin = crate::iptables::save_binary(family);
        if (family == Family::V6 && !kernel_has_ipv6()) || !tool_present(r, bin) {
            continue;
        }
        let out = r
            .run_ok(&Cmd::new([bin]))
            .map_err(crate::apply::step("iptables-save"))?;
        if out.stdout.contains("ISTIO_VM_") {
            return Ok(true);
        }
    }
    if tool_present(r, "nft") {
        for table in [NFT_VM_NAT_TABLE, NFT_VM_RAW_TABLE] {
            if nftables::list_table(r, table)?.is_some() {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Whether `program` can be started in the namespace (a host may have only one backend).
fn tool_present(r: &dyn NetnsRunner, program: &str) -> bool {
    let arg = if program == "nft" { "-v" } else { "--version" };
    r.run(&crate::runner::Cmd::new([program, arg]))
        .is_ok_and(|o| o.success())
}

fn kernel_has_ipv6() -> bool {
    std::path::Path::new("/proc/sys/net/ipv6").exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs() {
        let cases: &[(&str, Option<&str>)] = &[
            ("10.96.0.0/12", Some("10.96.0.0/12")),
            ("10.96.1.7/12", Some("10.96.0.0/12")),
            ("10.0.0.1", Some("10.0.0.1/32")),
            ("0.0.0.0/0", Some("0.0.0.0/0")),
            ("fd00::1/8", Some("fd00::/8")),
            ("::/0", Some("::/0")),
            ("10.0.0.0/33", None),
            ("fd00::/129", None),
            ("10.0.0.0/", None),
            ("x/8", None),
            ("", None),
        ];
        for (text, want) in cases {
            let got = text.parse::<Cidr>().ok().map(|c| c.to_string());
            assert_eq!(got.as_deref(), *want, "{text:?}");
        }
    }
}
