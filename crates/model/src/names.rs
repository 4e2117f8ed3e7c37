//! Names that key resources: workload uids, `namespace/hostname` service keys and
//! `namespace/name` policy keys.
//!
//! Each is parsed once (from xDS, from the local config file, or from a control-plane object)
//! and is then known to be well formed, so indexes can key on it without re-checking.

use std::fmt;
use std::str::FromStr;

/// Why a string is not a valid resource name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{what} must not be empty")]
    Empty { what: &'static str },
    #[error("{what} {value:?} must have the form {form}")]
    WrongShape {
        what: &'static str,
        value: String,
        form: &'static str,
    },
    #[error("{what} {value:?} contains a control character")]
    ControlCharacter { what: &'static str, value: String },
}

fn check_part(what: &'static str, value: &str) -> Result<(), NameError> {
    if value.is_empty() {
        return Err(NameError::Empty { what });
    }
    if value.chars().any(char::is_control) {
        return Err(NameError::ControlCharacter {
            what,
            value: value.escape_debug().to_string(),
        });
    }
    Ok(())
}

/// Splits `a/b` into two non-empty parts; `b` may not contain another `/`.
fn split_pair<'a>(
    what: &'static str,
    form: &'static str,
    value: &'a str,
) -> Result<(&'a str, &'a str), NameError> {
    let shape = || NameError::WrongShape {
        what,
        value: value.to_string(),
        form,
    };
    let (a, b) = value.split_once('/').ok_or_else(shape)?;
    if a.is_empty() || b.is_empty() || b.contains('/') {
        return Err(shape());
    }
    check_part(what, value)?;
    Ok((a, b))
}

/// The primary key of a workload (xDS resource name), e.g. `Kubernetes//Pod/default/pod1`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadUid(String);

impl WorkloadUid {
    /// Any non-empty string without control characters is a uid; its structure is the
    /// control plane's business.
    pub fn new(uid: impl Into<String>) -> Result<Self, NameError> {
        let uid = uid.into();
        check_part("workload uid", &uid)?;
        Ok(Self(uid))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkloadUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for WorkloadUid {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl std::borrow::Borrow<str> for WorkloadUid {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// A service key, `namespace/hostname` (xDS resource name of a Service).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespacedHostname {
    namespace: String,
    hostname: String,
}

impl NamespacedHostname {
    pub fn new(
        namespace: impl Into<String>,
        hostname: impl Into<String>,
    ) -> Result<Self, NameError> {
        let (namespace, hostname) = (namespace.into(), hostname.into());
        check_part("namespace", &namespace)?;
        check_part("hostname", &hostname)?;
        if namespace.contains('/') || hostname.contains('/') {
            return Err(NameError::WrongShape {
                what: "namespaced hostname",
                value: format!("{namespace}/{hostname}"),
                form: "namespace/hostname",
            });
        }
        Ok(Self {
            namespace,
            hostname,
        })
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn hostname(&self) -> &str {
        &self.hostname
    }
}

impl fmt::Display for NamespacedHostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.hostname)
    }
}

impl FromStr for NamespacedHostname {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (ns, host) = split_pair("namespaced hostname", "namespace/hostname", s)?;
        Self::new(ns, host)
    }
}

/// An authorization policy key, `namespace/name` (xDS resource name of an Authorization).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyKey {
    namespace: String,
    name: String,
}

impl PolicyKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Result<Self, NameError> {
        let (namespace, name) = (namespace.into(), name.into());
        check_part("policy namespace", &namespace)?;
        check_part("policy name", &name)?;
        if namespace.contains('/') || name.contains('/') {
            return Err(NameError::WrongShape {
                what: "policy key",
                value: format!("{namespace}/{name}"),
                form: "namespace/name",
            });
        }
        Ok(Self { namespace, name })
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for PolicyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl FromStr for PolicyKey {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (ns, name) = split_pair("policy key", "namespace/name", s)?;
        Self::new(ns, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_parse_and_print_back() {
        for input in ["default/example.com", "a/b"] {
            let nh: NamespacedHostname = input.parse().unwrap();
            assert_eq!(nh.to_string(), input);
            let key: PolicyKey = input.parse().unwrap();
            assert_eq!(key.to_string(), input);
        }
        let nh: NamespacedHostname = "ns/host.example".parse().unwrap();
        assert_eq!((nh.namespace(), nh.hostname()), ("ns", "host.example"));
    }

    #[test]
    fn pairs_reject_bad_shapes() {
        for input in ["", "nohost", "/host", "ns/", "a/b/c", "ns/ho\nst"] {
            assert!(input.parse::<NamespacedHostname>().is_err(), "{input:?}");
            assert!(input.parse::<PolicyKey>().is_err(), "{input:?}");
        }
    }

    #[test]
    fn uids_must_be_non_empty_and_printable() {
        assert!(WorkloadUid::new("cluster1//v1/Pod/default/local").is_ok());
        assert_eq!(
            WorkloadUid::new(""),
            Err(NameError::Empty {
                what: "workload uid"
            })
        );
        assert!(matches!(
            WorkloadUid::new("a\0b"),
            Err(NameError::ControlCharacter { .. })
        ));
    }
}
