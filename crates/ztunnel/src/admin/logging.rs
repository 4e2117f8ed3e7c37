//! `/logging`: read or change the log filter at run time (POST only).
//!
//! - no query: report the current filter;
//! - `?level=debug`: set the default level;
//! - `?level=mod:lvl,other:lvl[,lvl]`: per-target levels (upstream's `:` syntax; `=` works too).
//!   When no bare level is given, the current default level is kept, so asking for one
//!   target's debug logs does not silence every other target;
//! - `?reset`: back to the filter the process started with; `?level=L&reset` applies `L`
//!   on top of it, and an empty `?level=` reports the current filter (what `istioctl
//!   ztunnel-config log` sends), as upstream does.
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
    let mut level: Option<&str> = None;
    let mut reset = false;
    for (k, v) in query {
        match k.as_str() {
            "level" if level.is_none() => level = Some(v),
            "reset" if !reset => reset = true,
            _ => {
                return (
                    StatusCode::BAD_REQUEST,
                    format!("invalid parameters\n{USAGE}"),
                );
            }
        }
    }
    // `level=` with nothing in it asks for the current filter, as upstream answers it
    // (istioctl sends it when no --level is given).
    let level = level.filter(|l| !l.is_empty());
    let before = log.current();
    if reset && let Err(e) = log.reset() {
        return (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n"));
    }
    // With reset, the level applies on top of the start-up filter (istioctl's
    // `level=info&reset`).
    if let Some(v) = level {
        let Some(filter) = to_filter(v, &log.default_level()) else {
            // A refused request changes nothing, the reset included.
            let _ = log.set(&before);
            return (
                StatusCode::BAD_REQUEST,
                format!("invalid level {v:?}\n{USAGE}"),
            );
        };
        if let Err(e) = log.set(&filter) {
            let _ = log.set(&before);
            return (StatusCode::BAD_REQUEST, format!("{e}\n{USAGE}"));
        }
    }
    (StatusCode::OK, current(log))
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
