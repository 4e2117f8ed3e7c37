//! Holding a new pod until it is captured (`spec/windows.md` §4, docs/windows.md): the
//! init container's side. On Windows nodes before Windows Server 2025 a pod's network
//! compartment only exists once its sandbox runs, so nothing can capture the pod at CNI ADD
//! time. Its manifest gets an init container, `ambit wait-enrolled`, that reads the pod's own
//! annotations through a downward-API volume and exits only once the agent has marked the
//! pod `ambient.istio.io/redirection: enabled` (policies on every endpoint and ztunnel
//! listening in the compartment); until then the app containers do not start. No network
//! and no API access are needed, so the hold cannot be bypassed by the pod's own traffic
//! being redirected to a ztunnel that is not there yet.
//!
//! The downward-API file has one `key="value"` line per annotation, the value quoted as Go's
//! `%q` prints it. Pure parsing, tested on every platform.

use std::collections::BTreeMap;

use crate::pods::{ENABLED, PENDING, REDIRECTION_ANNOTATION};

/// A line of the annotations file that is not `key="quoted value"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotations line {line}: {reason}: {text:?}")]
pub struct AnnotationsError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub reason: &'static str,
    /// The line.
    pub text: String,
}

/// Parses a downward-API `metadata.annotations` file.
pub fn parse_annotations(text: &str) -> Result<BTreeMap<String, String>, AnnotationsError> {
    let mut out = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let err = |reason| AnnotationsError {
            line: i + 1,
            reason,
            text: raw.to_owned(),
        };
        if raw.trim().is_empty() {
            continue;
        }
        let (key, quoted) = raw.split_once('=').ok_or_else(|| err("no '='"))?;
        if key.is_empty() {
            return Err(err("empty key"));
        }
        let value = unquote(quoted).ok_or_else(|| err("value is not a quoted string"))?;
        out.insert(key.to_owned(), value);
    }
    Ok(out)
}

/// Go's `strconv.Unquote` for double-quoted strings.
fn unquote(s: &str) -> Option<String> {
    let inner = s.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return None,
            '\\' => {
                let e = chars.next()?;
                let hex = |chars: &mut std::str::Chars<'_>, n: usize| -> Option<u32> {
                    let digits: String = chars.by_ref().take(n).collect();
                    (digits.len() == n).then(|| u32::from_str_radix(&digits, 16).ok())?
                };
                out.push(match e {
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    'a' => '\u{7}',
                    'b' => '\u{8}',
                    'f' => '\u{c}',
                    'v' => '\u{b}',
                    '\\' => '\\',
                    '"' => '"',
                    '\'' => '\'',
                    'x' => char::from(u8::try_from(hex(&mut chars, 2)?).ok()?),
                    'u' => char::from_u32(hex(&mut chars, 4)?)?,
                    'U' => char::from_u32(hex(&mut chars, 8)?)?,
                    d @ '0'..='7' => {
                        let rest: String = chars.by_ref().take(2).collect();
                        let v = u32::from_str_radix(&format!("{d}{rest}"), 8).ok()?;
                        (rest.len() == 2).then_some(())?;
                        char::from(u8::try_from(v).ok()?)
                    }
                    _ => return None,
                });
            }
            c => out.push(c),
        }
    }
    Some(out)
}

/// Where the pod stands, as its annotations say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enrolment {
    /// Captured: the app may start.
    Enrolled,
    /// Policies in place, ztunnel not yet listening (partially enrolled).
    Partial,
    /// Nothing yet.
    NotYet,
}

/// The pod's enrolment from its annotations.
pub fn enrolment(annotations: &BTreeMap<String, String>) -> Enrolment {
    match annotations.get(REDIRECTION_ANNOTATION).map(String::as_str) {
        Some(ENABLED) => Enrolment::Enrolled,
        Some(PENDING) => Enrolment::Partial,
        _ => Enrolment::NotYet,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn reads_what_kubelet_writes() {
        let text = concat!(
            "ambient.istio.io/redirection=\"enabled\"\n",
            "kubectl.kubernetes.io/last-applied-configuration=\"{\\\"a\\\":\\\"b\\\\n\\\"}\\n\"\n",
            "odd=\"tab\\there \\x41\\u00e9\\101\"\n",
            "\n",
        );
        let m = parse_annotations(text).unwrap();
        assert_eq!(m["ambient.istio.io/redirection"], "enabled");
        assert_eq!(
            m["kubectl.kubernetes.io/last-applied-configuration"],
            "{\"a\":\"b\\n\"}\n"
        );
        assert_eq!(m["odd"], "tab\there AéA");
        assert_eq!(enrolment(&m), Enrolment::Enrolled);
    }

    #[test]
    fn enrolment_states() {
        let with = |v: &str| -> BTreeMap<String, String> {
            [(REDIRECTION_ANNOTATION.to_owned(), v.to_owned())].into()
        };
        assert_eq!(enrolment(&with("enabled")), Enrolment::Enrolled);
        assert_eq!(enrolment(&with("pending")), Enrolment::Partial);
        assert_eq!(enrolment(&with("Enabled")), Enrolment::NotYet);
        assert_eq!(enrolment(&BTreeMap::new()), Enrolment::NotYet);
    }

    #[test]
    fn bad_lines_name_themselves() {
        for (text, line) in [
            ("a=\"1\"\nnoequals\n", 2),
            ("=\"x\"", 1),
            ("a=unquoted", 1),
            ("a=\"open", 1),
            ("a=\"bad \\q escape\"", 1),
            ("a=\"inner \" quote\"", 1),
            ("a=\"\\x4\"", 1),
        ] {
            let err = parse_annotations(text).unwrap_err();
            assert_eq!(err.line, line, "{text:?}: {err}");
        }
    }
}
