//! `/logging`: read or change the log filter at run time (POST only).
//!
//! - no query: report the current filter;
//! - `?level=debug`: set the default level;
//! - `?level=mod:lvl,other:lvl[,lvl]`: per-target levels (upstream's `:` syntax; `=` works too).
//!   When no bare level is given, the current default level is kept, so asking for one
//!   target's debug logs does not silence every other target;
//! - `?reset`: back to the filter the process started with.
//!
//! A GET is refused with **405 Method Not Allowed** (`Allow: POST`) and the body
//! "Invalid HTTP method" plus the usage text: the request is well-formed, only the method is
//! wrong, which is what 405 means. Bad parameters or levels get 400 and the usage text.

use http::StatusCode;

use crate::telemetry::LogHandle;

pub(crate) const USAGE: &str = "usage: POST /logging\t\t\t\t(print current log level)
       POST /logging?level=<level>\t\t(set the default level: off, error, warn, info, debug, trace)
       POST /logging?level=<module>:<level>,...\t(set levels per module)
       POST /logging?reset\t\t\t(reset to the start-up level)
";

/// Outcome of a `/logging` POST: status and body.
pub(crate) fn handle(log: &LogHandle, query: &[(String, String)]) -> (StatusCode, String) {
    let current = |log: &LogHandle| format!("current log level is {}\n", log.current());
    match query {
        [] => (StatusCode::OK, current(log)),
        [(k, _)] if k == "reset" => match log.reset() {
            Ok(()) => (StatusCode::OK, current(log)),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
        },
        [(k, v)] if k == "level" => {
            let Some(filter) = to_filter(v, &log.default_level()) else {
                return (
                    StatusCode::BAD_REQUEST,
                    format!("invalid level {v:?}\n{USAGE}"),
                );
            };
            match log.set(&filter) {
                Ok(()) => (StatusCode::OK, current(log)),
                Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n{USAGE}")),
            }
        }
        _ => (
            StatusCode::BAD_REQUEST,
            format!("invalid parameters\n{USAGE}"),
        ),
    }
}

/// `mod:lvl,lvl` → `lvl,mod=lvl`; keeps `default_level` when no bare level is given.
fn to_filter(level: &str, default_level: &str) -> Option<String> {
    let mut bare: Option<&str> = None;
    let mut targets = Vec::new();
    for entry in level.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        match entry.split_once([':', '=']) {
            Some((target, lvl)) if !target.is_empty() && !lvl.is_empty() => {
                targets.push(format!("{target}={lvl}"));
            }
            Some(_) => return None,
            None => bare = Some(entry),
        }
    }
    if bare.is_none() && targets.is_empty() {
        return None;
    }
    let mut directives = vec![bare.unwrap_or(default_level).to_owned()];
    directives.extend(targets);
    Some(directives.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_query_to_filter() {
        let cases = [
            ("debug", Some("debug")),
            ("access:debug", Some("info,access=debug")),
            ("access:debug,warn", Some("warn,access=debug")),
            ("a=trace,b:off", Some("info,a=trace,b=off")),
            ("", None),
            (":debug", None),
        ];
        for (input, want) in cases {
            assert_eq!(to_filter(input, "info").as_deref(), want, "{input:?}");
        }
    }
}
