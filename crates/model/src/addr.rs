//! Addresses with their meaning attached: an IP on a named network (`network/IP`, the key
//! services and workloads are looked up by), CIDR ranges used by policies, and the decoding of
//! the raw 4/16-byte addresses xDS carries.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

/// Why a string or byte string is not an address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    #[error("address must be 4 or 16 bytes, got {0}")]
    BadLength(usize),
    #[error("{0:?} is not an IP address")]
    BadIp(String),
    #[error("{0:?} is not a CIDR (IP or IP/prefix-length)")]
    BadCidr(String),
    #[error("prefix length {len} is too long for {ip}")]
    PrefixTooLong { ip: IpAddr, len: u32 },
    #[error("{0:?} must have the form network/address")]
    MissingNetwork(String),
}

/// Decodes an xDS address (4 bytes = IPv4, 16 bytes = IPv6).
pub fn ip_from_bytes(raw: &[u8]) -> Result<IpAddr, AddrError> {
    if let Ok(v4) = <[u8; 4]>::try_from(raw) {
        return Ok(IpAddr::from(v4));
    }
    if let Ok(v6) = <[u8; 16]>::try_from(raw) {
        return Ok(IpAddr::from(v6));
    }
    Err(AddrError::BadLength(raw.len()))
}

/// Encodes an address the way xDS carries it.
pub fn ip_to_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// An IP range. Parsed from `IP/len` or a bare IP (a single host).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr(IpNet);

impl Cidr {
    pub fn new(ip: IpAddr, prefix_len: u32) -> Result<Self, AddrError> {
        let len = u8::try_from(prefix_len).map_err(|_| AddrError::PrefixTooLong {
            ip,
            len: prefix_len,
        })?;
        IpNet::new(ip, len)
            .map(Cidr)
            .map_err(|_| AddrError::PrefixTooLong {
                ip,
                len: prefix_len,
            })
    }

    /// Whether `ip` is inside the range. IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`, what a
    /// dual-stack socket reports for IPv4 peers) are compared as the IPv4 address they carry,
    /// so an IPv4 range can not be sidestepped by the socket family.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&ip.to_canonical())
    }

    pub fn addr(&self) -> IpAddr {
        self.0.addr()
    }

    pub fn prefix_len(&self) -> u8 {
        self.0.prefix_len()
    }

    pub fn as_ipnet(&self) -> &IpNet {
        &self.0
    }
}

impl From<IpNet> for Cidr {
    fn from(net: IpNet) -> Self {
        Cidr(net)
    }
}

impl From<IpAddr> for Cidr {
    fn from(ip: IpAddr) -> Self {
        Cidr(IpNet::from(ip))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for Cidr {
    type Err = AddrError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(net) = s.parse::<IpNet>() {
            return Ok(Cidr(net));
        }
        s.parse::<IpAddr>()
            .map(Cidr::from)
            .map_err(|_| AddrError::BadCidr(s.to_string()))
    }
}

/// An IP on a named network; written `network/IP` (the default network is the empty string,
/// so `/10.0.0.1`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetworkAddr {
    pub network: String,
    pub ip: IpAddr,
}

impl NetworkAddr {
    pub fn new(network: impl Into<String>, ip: IpAddr) -> Self {
        Self {
            network: network.into(),
            ip,
        }
    }
}

impl fmt::Display for NetworkAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.ip)
    }
}

impl FromStr for NetworkAddr {
    type Err = AddrError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // An IP never contains '/', so the last '/' separates even a network name with one.
        let (network, ip) = s
            .rsplit_once('/')
            .ok_or_else(|| AddrError::MissingNetwork(s.to_string()))?;
        let ip = ip.parse().map_err(|_| AddrError::BadIp(ip.to_string()))?;
        Ok(Self::new(network, ip))
    }
}

/// A range on a named network (a service's CIDR VIP); written `network/IP/len`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetworkCidr {
    pub network: String,
    pub cidr: Cidr,
}

impl fmt::Display for NetworkCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.cidr)
    }
}

impl FromStr for NetworkCidr {
    type Err = AddrError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let missing = || AddrError::MissingNetwork(s.to_string());
        let (rest, len) = s.rsplit_once('/').ok_or_else(missing)?;
        let (network, ip) = rest.rsplit_once('/').ok_or_else(missing)?;
        let cidr: Cidr = format!("{ip}/{len}").parse()?;
        Ok(Self {
            network: network.to_string(),
            cidr,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_decode_by_length() {
        let cases: &[(&[u8], Result<&str, AddrError>)] = &[
            (&[127, 0, 0, 1], Ok("127.0.0.1")),
            (&[0; 16], Ok("::")),
            (&[], Err(AddrError::BadLength(0))),
            (&[1, 2, 3], Err(AddrError::BadLength(3))),
            (&[0; 5], Err(AddrError::BadLength(5))),
            (&[0; 17], Err(AddrError::BadLength(17))),
        ];
        for (raw, want) in cases {
            let got = ip_from_bytes(raw).map(|ip| ip.to_string());
            assert_eq!(
                got.as_deref().map_err(Clone::clone),
                want.clone(),
                "{raw:?}"
            );
            if let Ok(ip) = ip_from_bytes(raw) {
                assert_eq!(&ip_to_bytes(ip), raw);
            }
        }
    }

    #[test]
    fn network_addresses_parse_and_print() {
        let cases = [
            ("/127.10.0.1", "", "127.10.0.1"),
            ("remote/127.10.0.2", "remote", "127.10.0.2"),
            ("net/::1", "net", "::1"),
            ("a/b/10.0.0.1", "a/b", "10.0.0.1"),
        ];
        for (input, network, ip) in cases {
            let addr: NetworkAddr = input.parse().unwrap();
            assert_eq!(addr.network, network);
            assert_eq!(addr.ip.to_string(), ip);
            assert_eq!(addr.to_string(), input);
        }
        for bad in ["127.0.0.1", "net/", "net/notanip", ""] {
            assert!(bad.parse::<NetworkAddr>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cidrs_parse_and_contain() {
        let cases = [
            ("10.0.0.0/8", "10.255.1.1", true),
            ("10.0.0.0/8", "11.0.0.1", false),
            ("10.0.0.5", "10.0.0.5", true),
            ("10.0.0.5", "10.0.0.6", false),
            ("10.0.0.0/8", "::ffff:10.1.2.3", true),
            ("10.0.0.0/8", "::1", false),
            ("fd00::/8", "fd00::1", true),
            ("0.0.0.0/0", "1.2.3.4", true),
        ];
        for (cidr, ip, want) in cases {
            let cidr: Cidr = cidr.parse().unwrap();
            assert_eq!(
                cidr.contains(ip.parse().unwrap()),
                want,
                "{cidr} contains {ip}"
            );
        }
        for bad in ["10.0.0.0/33", "x", "10.0.0.0/", "::/129"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad:?}");
        }
        assert!(Cidr::new("10.0.0.0".parse().unwrap(), 300).is_err());
        let nc: NetworkCidr = "net/10.0.0.0/16".parse().unwrap();
        assert_eq!(
            (nc.network.as_str(), nc.cidr.to_string().as_str()),
            ("net", "10.0.0.0/16")
        );
        assert_eq!(nc.to_string(), "net/10.0.0.0/16");
    }
}
