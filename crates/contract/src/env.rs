//! The one environment reader every component's configuration goes through (design §5:
//! "each binary reads env/flags in one place, reports every bad variable at once").
//!
//! [`Env`] reads `KEY=VALUE` pairs handed to it (normally the process environment, read by the
//! binary; libraries never read it themselves): the last assignment of a name wins, and a set
//! but empty variable counts as unset except through [`Env::raw`]. Every parse failure is
//! recorded as an [`EnvError`] naming the variable, its value and what was expected, and the
//! default is used meanwhile, so [`Env::finish`] reports every bad variable at once.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::values::{parse_bool, parse_duration};

/// One bad variable: its name, its value and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?}: {expected}")]
pub struct EnvError {
    /// The variable's name.
    pub var: String,
    /// Its value (empty when the problem is that it is missing).
    pub value: String,
    /// What was expected instead.
    pub expected: String,
}

/// Every bad variable of one component's configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct EnvErrors {
    /// The component (`ztunnel`, `agent`), for the message.
    pub component: &'static str,
    /// The bad variables, in the order they were read.
    pub errors: Vec<EnvError>,
}

impl EnvErrors {
    /// The bad variables.
    pub fn iter(&self) -> std::slice::Iter<'_, EnvError> {
        self.errors.iter()
    }

    /// How many variables are bad.
    pub fn len(&self) -> usize {
        self.errors.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }
}

impl<'a> IntoIterator for &'a EnvErrors {
    type Item = &'a EnvError;
    type IntoIter = std::slice::Iter<'a, EnvError>;

    fn into_iter(self) -> Self::IntoIter {
        self.errors.iter()
    }
}

impl fmt::Display for EnvErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "invalid {} configuration ({} problems):",
            self.component,
            self.errors.len()
        )?;
        for e in &self.errors {
            writeln!(f, "  - {e}")?;
        }
        Ok(())
    }
}

/// Reads variables and records every bad one.
#[derive(Debug)]
pub struct Env<'a> {
    vars: BTreeMap<&'a str, &'a str>,
    errors: Vec<EnvError>,
}

impl<'a> Env<'a> {
    /// A reader over `KEY=VALUE` pairs; a later pair overrides an earlier one of the same name.
    pub fn new(vars: &'a [(String, String)]) -> Self {
        Self {
            vars: vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
            errors: Vec::new(),
        }
    }

    /// The value when the variable is set, even to the empty string.
    pub fn raw(&self, var: &str) -> Option<&'a str> {
        self.vars.get(var).copied()
    }

    /// The value when the variable is set and not empty.
    pub fn get(&self, var: &str) -> Option<&'a str> {
        self.raw(var).filter(|v| !v.is_empty())
    }

    /// The value, or `default` when unset or empty.
    pub fn string(&self, var: &str, default: &str) -> String {
        self.get(var).unwrap_or(default).to_owned()
    }

    /// Records a bad variable.
    pub fn fail(&mut self, var: &str, value: &str, expected: impl fmt::Display) {
        self.errors.push(EnvError {
            var: var.to_owned(),
            value: value.to_owned(),
            expected: expected.to_string(),
        });
    }

    /// The variable parsed by `parse`, `None` when unset or empty; a parse failure is
    /// recorded (the error's text says what was expected) and gives `None`.
    pub fn parse_opt<T, E: fmt::Display>(
        &mut self,
        var: &str,
        parse: impl FnOnce(&str) -> Result<T, E>,
    ) -> Option<T> {
        let value = self.get(var)?;
        match parse(value) {
            Ok(t) => Some(t),
            Err(e) => {
                self.fail(var, value, e);
                None
            }
        }
    }

    /// The variable parsed by `parse`, or `default` when unset, empty or bad (a bad value is
    /// recorded).
    pub fn parse<T, E: fmt::Display>(
        &mut self,
        var: &str,
        default: T,
        parse: impl FnOnce(&str) -> Result<T, E>,
    ) -> T {
        self.parse_opt(var, parse).unwrap_or(default)
    }

    /// A Go `strconv.ParseBool` boolean ([`parse_bool`]).
    pub fn bool(&mut self, var: &str, default: bool) -> bool {
        self.parse(var, default, parse_bool)
    }

    /// A duration in the one grammar ([`parse_duration`]).
    pub fn duration(&mut self, var: &str, default: Duration) -> Duration {
        self.parse(var, default, parse_duration)
    }

    /// A number (`FromStr`, surrounding whitespace ignored).
    pub fn number<T: std::str::FromStr>(&mut self, var: &str, default: T) -> T
    where
        T::Err: fmt::Display,
    {
        self.parse(var, default, |v| v.trim().parse::<T>())
    }

    /// Every variable named `PREFIX…`, by the rest of its name (an empty rest is skipped).
    pub fn prefixed(&self, prefix: &str) -> BTreeMap<String, String> {
        self.vars
            .iter()
            .filter_map(|(k, v)| {
                k.strip_prefix(prefix)
                    .map(|n| (n.to_owned(), (*v).to_owned()))
            })
            .filter(|(k, _)| !k.is_empty())
            .collect()
    }

    /// `value` when no variable was bad, else every bad one for `component`.
    pub fn finish<T>(self, component: &'static str, value: T) -> Result<T, EnvErrors> {
        if self.errors.is_empty() {
            Ok(value)
        } else {
            Err(EnvErrors {
                component,
                errors: self.errors,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn pairs(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_bad_variable_is_reported_with_its_value_and_expectation() {
        let vars = pairs(&[
            ("FLAG", "maybe"),
            ("WAIT", "10 parsecs"),
            ("PORT", "70000"),
            ("GOOD", "1h"),
        ]);
        let mut env = Env::new(&vars);
        assert!(env.bool("FLAG", true));
        assert_eq!(
            env.duration("WAIT", Duration::from_secs(1)),
            Duration::from_secs(1)
        );
        assert_eq!(env.number("PORT", 8000u16), 8000);
        assert_eq!(
            env.duration("GOOD", Duration::ZERO),
            Duration::from_secs(3600)
        );
        let errs = env.finish("test", ()).unwrap_err();
        let named: Vec<&str> = errs.iter().map(|e| e.var.as_str()).collect();
        assert_eq!(named, ["FLAG", "WAIT", "PORT"]);
        let text = errs.to_string();
        assert!(
            text.starts_with("invalid test configuration (3 problems):"),
            "{text}"
        );
        assert!(
            text.contains("FLAG=\"maybe\": expected a boolean"),
            "{text}"
        );
        assert!(text.contains("WAIT=\"10 parsecs\": unknown unit"), "{text}");
        assert!(text.contains("PORT=\"70000\": number too large"), "{text}");
    }

    #[test]
    fn last_assignment_wins_and_empty_is_unset() {
        let vars = pairs(&[("A", "1"), ("A", "2"), ("E", ""), ("P_X", "x"), ("P_", "y")]);
        let env = Env::new(&vars);
        assert_eq!(env.get("A"), Some("2"));
        assert_eq!((env.raw("E"), env.get("E")), (Some(""), None));
        assert_eq!(env.string("E", "d"), "d");
        assert_eq!(
            env.prefixed("P_").into_iter().collect::<Vec<_>>(),
            [("X".to_string(), "x".to_string())]
        );
        assert!(env.finish("test", ()).is_ok());
    }
}
