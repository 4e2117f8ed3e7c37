//! SPIFFE identities as ztunnel understands them: exactly `spiffe://TD/ns/NS/sa/SA`.
//!
//! Parsing is strict and matching is literal (byte equality of the parts): an identity that
//! does not have exactly this shape is not an identity at all, so it can never widen a policy.

use std::fmt;
use std::str::FromStr;

const SCHEME: &str = "spiffe://";

/// A parsed SPIFFE id of the Istio form `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpiffeId {
    trust_domain: String,
    namespace: String,
    service_account: String,
}

/// Why a string is not an Istio SPIFFE id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpiffeIdError {
    #[error("SPIFFE id is not valid UTF-8")]
    NotUtf8,
    #[error("SPIFFE id {0:?} does not start with \"spiffe://\"")]
    MissingScheme(String),
    #[error("SPIFFE id {0:?} contains a NUL byte or control character")]
    ControlCharacter(String),
    #[error("SPIFFE id {id:?} must be spiffe://TD/ns/NS/sa/SA (got {segments} path segments)")]
    WrongShape { id: String, segments: usize },
    #[error("SPIFFE id {id:?} has an empty {part}")]
    EmptySegment { id: String, part: &'static str },
    #[error("SPIFFE id {id:?}: expected literal {expected:?} where {found:?} is")]
    WrongKeyword {
        id: String,
        expected: &'static str,
        found: String,
    },
}

impl SpiffeId {
    /// Builds an id from its parts, applying the same checks as parsing.
    pub fn new(
        trust_domain: impl Into<String>,
        namespace: impl Into<String>,
        service_account: impl Into<String>,
    ) -> Result<Self, SpiffeIdError> {
        let (td, ns, sa) = (
            trust_domain.into(),
            namespace.into(),
            service_account.into(),
        );
        let id = format!("{SCHEME}{td}/ns/{ns}/sa/{sa}");
        let parsed = Self::parse(&id)?;
        // A part containing '/' would have changed the segment count and been refused above.
        Ok(parsed)
    }

    /// Parses raw bytes (for example a certificate URI SAN); non-UTF-8 is refused.
    pub fn parse_bytes(raw: &[u8]) -> Result<Self, SpiffeIdError> {
        let s = std::str::from_utf8(raw).map_err(|_| SpiffeIdError::NotUtf8)?;
        Self::parse(s)
    }

    /// Parses `spiffe://TD/ns/NS/sa/SA` exactly.
    pub fn parse(s: &str) -> Result<Self, SpiffeIdError> {
        if s.chars().any(|c| c.is_control()) {
            return Err(SpiffeIdError::ControlCharacter(
                s.escape_debug().to_string(),
            ));
        }
        let rest = s
            .strip_prefix(SCHEME)
            .ok_or_else(|| SpiffeIdError::MissingScheme(s.to_string()))?;
        let parts: Vec<&str> = rest.split('/').collect();
        if parts.len() != 5 {
            return Err(SpiffeIdError::WrongShape {
                id: s.to_string(),
                segments: parts.len(),
            });
        }
        let names = [
            "trust domain",
            "\"ns\" keyword",
            "namespace",
            "\"sa\" keyword",
            "service account",
        ];
        for (part, name) in parts.iter().zip(names) {
            if part.is_empty() {
                return Err(SpiffeIdError::EmptySegment {
                    id: s.to_string(),
                    part: name,
                });
            }
        }
        for (idx, expected) in [(1, "ns"), (3, "sa")] {
            if parts[idx] != expected {
                return Err(SpiffeIdError::WrongKeyword {
                    id: s.to_string(),
                    expected,
                    found: parts[idx].to_string(),
                });
            }
        }
        Ok(SpiffeId {
            trust_domain: parts[0].to_string(),
            namespace: parts[2].to_string(),
            service_account: parts[4].to_string(),
        })
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn service_account(&self) -> &str {
        &self.service_account
    }

    /// The id without `spiffe://`, the form AuthorizationPolicy `principals` are compared with.
    pub fn principal(&self) -> String {
        format!(
            "{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}", self.principal())
    }
}

impl FromStr for SpiffeId {
    type Err = SpiffeIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_istio_form() {
        let id = SpiffeId::parse("spiffe://cluster.local/ns/default/sa/pod1").unwrap();
        assert_eq!(id.trust_domain(), "cluster.local");
        assert_eq!(id.namespace(), "default");
        assert_eq!(id.service_account(), "pod1");
        assert_eq!(id.principal(), "cluster.local/ns/default/sa/pod1");
        assert_eq!(id.to_string(), "spiffe://cluster.local/ns/default/sa/pod1");
        assert_eq!(
            SpiffeId::new("cluster.local", "default", "pod1").unwrap(),
            id
        );
    }

    #[test]
    fn rejects_everything_else() {
        type Check = fn(&SpiffeIdError) -> bool;
        let cases: &[(&str, Check)] = &[
            ("", |e| matches!(e, SpiffeIdError::MissingScheme(_))),
            ("http://cluster.local/ns/a/sa/b", |e| {
                matches!(e, SpiffeIdError::MissingScheme(_))
            }),
            ("SPIFFE://cluster.local/ns/a/sa/b", |e| {
                matches!(e, SpiffeIdError::MissingScheme(_))
            }),
            ("spiffe:///ns/a/sa/b", |e| {
                matches!(e, SpiffeIdError::EmptySegment { .. })
            }),
            ("spiffe://td/ns//sa/b", |e| {
                matches!(e, SpiffeIdError::EmptySegment { .. })
            }),
            ("spiffe://td/ns/a/sa/", |e| {
                matches!(e, SpiffeIdError::EmptySegment { .. })
            }),
            ("spiffe://td/ns/a/sa/b/", |e| {
                matches!(e, SpiffeIdError::WrongShape { .. })
            }),
            ("spiffe://td/ns/a/sa/b/extra", |e| {
                matches!(e, SpiffeIdError::WrongShape { .. })
            }),
            ("spiffe://td/ns/a/sa", |e| {
                matches!(e, SpiffeIdError::WrongShape { .. })
            }),
            ("spiffe://td/ns/a", |e| {
                matches!(e, SpiffeIdError::WrongShape { .. })
            }),
            ("spiffe://td/NS/a/sa/b", |e| {
                matches!(e, SpiffeIdError::WrongKeyword { .. })
            }),
            ("spiffe://td/ns/a/SA/b", |e| {
                matches!(e, SpiffeIdError::WrongKeyword { .. })
            }),
            ("spiffe://td/namespace/a/sa/b", |e| {
                matches!(e, SpiffeIdError::WrongKeyword { .. })
            }),
            ("spiffe://td/ns/a\0/sa/b", |e| {
                matches!(e, SpiffeIdError::ControlCharacter(_))
            }),
            ("spiffe://td/ns/a/sa/b\n", |e| {
                matches!(e, SpiffeIdError::ControlCharacter(_))
            }),
        ];
        for (input, check) in cases {
            let err = SpiffeId::parse(input).expect_err(input);
            assert!(check(&err), "{input:?} gave {err:?}");
        }
    }

    #[test]
    fn rejects_non_utf8_bytes() {
        let raw = b"spiffe://td/ns/\xff/sa/b";
        assert_eq!(SpiffeId::parse_bytes(raw), Err(SpiffeIdError::NotUtf8));
        assert!(SpiffeId::parse_bytes(b"spiffe://td/ns/a/sa/b").is_ok());
    }

    #[test]
    fn new_refuses_parts_with_slashes() {
        assert!(SpiffeId::new("td", "a/b", "c").is_err());
        assert!(SpiffeId::new("td", "", "c").is_err());
    }
}
