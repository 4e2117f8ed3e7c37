//! `ambit ztunnel-config log`: a ztunnel's log levels, read or changed through its admin
//! `/logging` (always a POST), as `istioctl ztunnel-config log` does: `--level` takes
//! istioctl's names (`trace debug info warning warn error critical off`, bare or as
//! `SCOPE:LEVEL`, comma-separated; `warning` and `critical` become ztunnel's `warn` and
//! `error`), `-r/--reset` returns to the start-up level. Each answer is printed under its
//! ztunnel's name (`NAME.NAMESPACE:` on a cluster, `NODE:` in the embedded mesh).

/// The level names istioctl accepts.
pub const LEVELS: [&str; 8] = [
    "trace", "debug", "info", "warning", "warn", "error", "critical", "off",
];

/// A `--level` / `--reset` that is refused before any ztunnel is asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LevelError {
    #[error(
        "--level {given:?}: unrecognized logging level {level:?} (one of trace, debug, info, \
         warning, error, critical, off)"
    )]
    Unknown { given: String, level: String },
    #[error("--level {given:?}: {entry:?} has no logger name before its level")]
    NoScope { given: String, entry: String },
    #[error(
        "--level {given:?}: logger name {scope:?} may hold only letters, digits, `_`, `-`, `.` and `::`"
    )]
    BadScope { given: String, scope: String },
    #[error("--level cannot be combined with --reset")]
    WithReset,
}

/// ztunnel's name of an istioctl level.
fn ztunnel_level(level: &str) -> &str {
    match level {
        "warning" => "warn",
        "critical" => "error",
        other => other,
    }
}

/// The `/logging` query for `--level` / `--reset`: empty (read the levels), `level=…`, or
/// `reset`.
pub fn logging_query(
    level: Option<&str>,
    reset: bool,
) -> Result<Vec<(&'static str, String)>, LevelError> {
    let given = match (level, reset) {
        (Some(_), true) => return Err(LevelError::WithReset),
        (None, true) => return Ok(vec![("reset", String::new())]),
        (None, false) => return Ok(Vec::new()),
        (Some(l), false) => l,
    };
    let mut entries = Vec::new();
    for entry in given.split(',').map(str::trim) {
        // `SCOPE:LEVEL` or `SCOPE=LEVEL`; a scope may be a module path (`a::b:debug`).
        let (scope, lvl) = match entry.rsplit_once([':', '=']) {
            Some((scope, lvl)) => (Some(scope.trim_end_matches(':')), lvl),
            None => (None, entry),
        };
        if !LEVELS.contains(&lvl) {
            return Err(LevelError::Unknown {
                given: given.to_string(),
                level: lvl.to_string(),
            });
        }
        let lvl = ztunnel_level(lvl);
        entries.push(match scope {
            Some("") => {
                return Err(LevelError::NoScope {
                    given: given.to_string(),
                    entry: entry.to_string(),
                });
            }
            Some(scope)
                if !scope
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c)) =>
            {
                return Err(LevelError::BadScope {
                    given: given.to_string(),
                    scope: scope.to_string(),
                });
            }
            Some(scope) => format!("{scope}:{lvl}"),
            None => lvl.to_string(),
        });
    }
    Ok(vec![("level", entries.join(","))])
}

/// The query as sent to the admin port (the values need no escaping: levels and logger
/// names are checked by [`logging_query`]).
pub fn query_string(query: &[(&'static str, String)]) -> String {
    query
        .iter()
        .map(|(k, v)| {
            if v.is_empty() {
                k.to_string()
            } else {
                format!("{k}={v}")
            }
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// The answers printed as istioctl prints them.
pub fn render(answers: &[(String, String)]) -> String {
    answers
        .iter()
        .map(|(name, body)| format!("{name}:\n{}\n", body.trim_end()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_as_istioctl_takes_them() {
        let q = |level: Option<&str>, reset: bool| logging_query(level, reset);
        let ok =
            |pairs: &[(&'static str, &str)]| -> Result<Vec<(&'static str, String)>, LevelError> {
                Ok(pairs.iter().map(|(k, v)| (*k, v.to_string())).collect())
            };
        // (level, reset, query)
        let cases = [
            (None, false, ok(&[])),
            (None, true, ok(&[("reset", "")])),
            (Some("debug"), false, ok(&[("level", "debug")])),
            (Some("warning"), false, ok(&[("level", "warn")])),
            (
                Some("access:debug,info"),
                false,
                ok(&[("level", "access:debug,info")]),
            ),
            (
                Some("access=critical"),
                false,
                ok(&[("level", "access:error")]),
            ),
            (
                Some("hickory_proto::udp:warning"),
                false,
                ok(&[("level", "hickory_proto::udp:warn")]),
            ),
            (
                Some("loud"),
                false,
                Err(LevelError::Unknown {
                    given: "loud".into(),
                    level: "loud".into(),
                }),
            ),
            (
                Some("access:verbose"),
                false,
                Err(LevelError::Unknown {
                    given: "access:verbose".into(),
                    level: "verbose".into(),
                }),
            ),
            (
                Some(":debug"),
                false,
                Err(LevelError::NoScope {
                    given: ":debug".into(),
                    entry: ":debug".into(),
                }),
            ),
            (
                Some("a&reset:info"),
                false,
                Err(LevelError::BadScope {
                    given: "a&reset:info".into(),
                    scope: "a&reset".into(),
                }),
            ),
            (Some("info"), true, Err(LevelError::WithReset)),
        ];
        for (level, reset, want) in cases {
            assert_eq!(q(level, reset), want, "{level:?} reset={reset}");
        }
        let sent = |level, reset| query_string(&q(level, reset).expect("valid"));
        assert_eq!(sent(None, false), "");
        assert_eq!(sent(None, true), "reset");
        assert_eq!(
            sent(Some("access:warning,info"), false),
            "level=access:warn,info"
        );
    }

    #[test]
    fn answers_under_their_ztunnel() {
        let answers = [
            (
                "ztunnel-a.istio-system".to_string(),
                "current log level is info\n".to_string(),
            ),
            (
                "ztunnel-b.istio-system".to_string(),
                "current log level is debug".to_string(),
            ),
        ];
        assert_eq!(
            render(&answers),
            "ztunnel-a.istio-system:\ncurrent log level is info\n\
             ztunnel-b.istio-system:\ncurrent log level is debug\n"
        );
    }
}
