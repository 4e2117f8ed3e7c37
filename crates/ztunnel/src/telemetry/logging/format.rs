//! Log lines in upstream ztunnel's formats (`LOG_FORMAT`), so the same log pipelines parse
//! both:
//!
//! - **plain**: `TIME\tlevel\tscope[:span{fields}…]\tmessage\tkey=value key=value`, the
//!   crate prefix (`ambit_ztunnel::`) stripped from the scope, the level coloured only when
//!   the output is a terminal;
//! - **json**: one flat object per line, `{"level":"info","time":"…","scope":"…",
//!   "message":"…", key: value, …}` (span fields are added flat, event fields win).

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Target prefixes not worth repeating on every line.
const STRIPPED: [&str; 2] = ["ambit_ztunnel::", "ambit_"];

fn scope(target: &str) -> &str {
    STRIPPED
        .iter()
        .find_map(|p| target.strip_prefix(p))
        .unwrap_or(target)
}

/// Upstream's plain format.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlainFormat {
    /// Colour the level (only for a terminal).
    pub ansi: bool,
}

/// Upstream's JSON format.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonFormat;

/// Collects an event's fields: the message apart, the rest as `key=value` or JSON.
#[derive(Default)]
struct Fields {
    message: Option<String>,
    pairs: Vec<(&'static str, Value)>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = Some(text);
        } else {
            self.pairs.push((field.name(), Value::String(text)));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = Some(value.to_owned());
        } else {
            self.pairs
                .push((field.name(), Value::String(value.to_owned())));
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.pairs.push((field.name(), Value::Bool(value)));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.pairs.push((field.name(), value.into()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.pairs.push((field.name(), value.into()));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.pairs.push((field.name(), value.into()));
    }
}

fn level_colour(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "\x1b[31m",
        Level::WARN => "\x1b[33m",
        Level::INFO => "\x1b[32m",
        Level::DEBUG => "\x1b[34m",
        Level::TRACE => "\x1b[35m",
    }
}

fn plain_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl<S, N> FormatEvent<S, N> for PlainFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        SystemTime.format_time(&mut w)?;
        let level = meta.level().as_str().to_ascii_lowercase();
        if self.ansi {
            write!(w, "\t{}{level}\x1b[0m\t", level_colour(meta.level()))?;
        } else {
            write!(w, "\t{level}\t")?;
        }
        w.write_str(scope(meta.target()))?;
        if let Some(spans) = ctx.event_scope() {
            for span in spans.from_root() {
                write!(w, ":{}", span.metadata().name())?;
                let ext = span.extensions();
                if let Some(fields) = ext.get::<FormattedFields<N>>()
                    && !fields.is_empty()
                {
                    write!(w, "{{{fields}}}")?;
                }
            }
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        if fields.message.is_some() || !fields.pairs.is_empty() {
            w.write_char('\t')?;
        }
        if let Some(m) = &fields.message {
            w.write_str(m)?;
            if !fields.pairs.is_empty() {
                w.write_char('\t')?;
            }
        }
        let pairs: Vec<String> = fields
            .pairs
            .iter()
            .map(|(k, v)| format!("{k}={}", plain_value(v)))
            .collect();
        w.write_str(&pairs.join(" "))?;
        writeln!(w)
    }
}

impl<S, N> FormatEvent<S, N> for JsonFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut time = String::new();
        SystemTime.format_time(&mut Writer::new(&mut time))?;
        let mut out = Map::new();
        out.insert(
            "level".into(),
            Value::String(meta.level().as_str().to_ascii_lowercase()),
        );
        out.insert("time".into(), Value::String(time));
        out.insert("scope".into(), Value::String(meta.target().to_owned()));
        let mut fields = Fields::default();
        event.record(&mut fields);
        if let Some(m) = fields.message {
            out.insert("message".into(), Value::String(m));
        }
        for (k, v) in fields.pairs {
            out.insert(k.to_owned(), v);
        }
        if let Some(spans) = ctx.event_scope() {
            for span in spans.from_root() {
                let ext = span.extensions();
                if let Some(f) = ext.get::<FormattedFields<N>>() {
                    // Span fields as `k=v` text under the span's name (event fields win).
                    let name = span.metadata().name().to_owned();
                    if !f.is_empty() {
                        out.entry(name)
                            .or_insert_with(|| Value::String(f.to_string()));
                    }
                }
            }
        }
        let line = serde_json::to_string(&Value::Object(out)).map_err(|_| fmt::Error)?;
        writeln!(w, "{line}")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buf {
        type Writer = Buf;
        fn make_writer(&'a self) -> Buf {
            self.clone()
        }
    }

    fn emit(format: crate::config::LogFormat) -> String {
        let buf = Buf::default();
        let (dispatch, _) =
            super::super::subscriber(format, "info", buf.clone()).unwrap_or_else(|e| panic!("{e}"));
        tracing::dispatcher::with_default(&dispatch, || {
            let span = tracing::info_span!("inbound", peer = "10.0.0.1");
            let _g = span.enter();
            tracing::info!(target: "ambit_ztunnel::proxy", port = 8080u64, ok = true, "connection opened");
        });
        let bytes = buf.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        String::from_utf8(bytes).unwrap_or_default()
    }

    #[test]
    fn plain_is_upstreams_tab_separated_line() {
        let line = emit(crate::config::LogFormat::Plain);
        let cols: Vec<&str> = line.trim_end().split('\t').collect();
        assert_eq!(cols.len(), 5, "{line:?}");
        assert!(cols[0].ends_with('Z') && cols[0].contains('T'), "{line:?}");
        assert_eq!(cols[1], "info");
        assert_eq!(cols[2], "proxy:inbound{peer=\"10.0.0.1\"}");
        assert_eq!(cols[3], "connection opened");
        assert_eq!(cols[4], "port=8080 ok=true");
        assert!(!line.contains('\x1b'), "no colour when not a terminal");
    }

    #[test]
    fn json_is_flat_with_scope() {
        let line = emit(crate::config::LogFormat::Json);
        let v: Value =
            serde_json::from_str(line.trim_end()).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(v["level"], "info");
        assert_eq!(v["scope"], "ambit_ztunnel::proxy");
        assert_eq!(v["message"], "connection opened");
        assert_eq!(v["port"], 8080);
        assert_eq!(v["ok"], true);
        assert!(v["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{v}");
        assert!(
            v.get("fields").is_none() && v.get("target").is_none(),
            "flat: {v}"
        );
    }
}
