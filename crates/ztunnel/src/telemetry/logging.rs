//! Process logging: a tracing subscriber whose filter can be changed at run time.
//!
//! The filter is an [`EnvFilter`] behind a `reload` layer; the [`LogHandle`] returned at
//! start is what admin `/logging` uses to change it. Whatever the user asks for, the
//! hickory DNS server's own logs stay off (they log every malformed packet a pod sends, as
//! upstream found), so `hickory_server=off` is always appended and user directives for it are
//! dropped.

use std::sync::{Arc, Mutex};

use tracing::Dispatch;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{EnvFilter, Layer, Registry, reload};

use super::TelemetryError;
use crate::config::LogFormat;

mod format;
pub use format::{JsonFormat, PlainFormat};

/// Target whose logs are always off.
const FORCED_OFF: &str = "hickory_server";

type Filtered = tracing_subscriber::layer::Layered<reload::Layer<EnvFilter, Registry>, Registry>;

/// Changes the process log filter at run time. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LogHandle {
    reload: reload::Handle<EnvFilter, Registry>,
    /// The filter given at start, for [`LogHandle::reset`].
    initial: Arc<str>,
    /// The user-facing filter currently applied (without the forced directives).
    current: Arc<Mutex<String>>,
}

impl LogHandle {
    /// Replaces the filter (`RUST_LOG` syntax: `info`, `access=debug,warn`, …).
    pub fn set(&self, filter: &str) -> Result<(), TelemetryError> {
        let f = build_filter(filter)?;
        self.reload
            .reload(f)
            .map_err(|_| TelemetryError::ReloadFailed)?;
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = filter.to_owned();
        Ok(())
    }

    /// Restores the filter the process started with.
    pub fn reset(&self) -> Result<(), TelemetryError> {
        let initial = self.initial.clone();
        self.set(&initial)
    }

    /// The filter currently applied.
    pub fn current(&self) -> String {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The bare default level of the current filter (`info` if it has none).
    pub fn default_level(&self) -> String {
        self.current()
            .split(',')
            .map(str::trim)
            .find(|d| !d.is_empty() && !d.contains('='))
            .unwrap_or("info")
            .to_owned()
    }
}

/// Installs the global subscriber writing to stdout; call once at process start. Plain lines
/// colour their level only when stdout is a terminal.
pub fn init_logging(format: LogFormat, filter: &str) -> Result<LogHandle, TelemetryError> {
    use std::io::IsTerminal;
    let ansi = std::io::stdout().is_terminal();
    let (dispatch, handle) = subscriber_with(format, filter, ansi, std::io::stdout)?;
    tracing::dispatcher::set_global_default(dispatch)
        .map_err(|_| TelemetryError::SubscriberAlreadySet)?;
    Ok(handle)
}

/// Builds (without installing) a subscriber writing to `writer` in upstream's line formats
/// ([`PlainFormat`] without colour, [`JsonFormat`]): for tests and for callers that scope
/// logging with `tracing::dispatcher::with_default`.
pub fn subscriber<W>(
    format: LogFormat,
    filter: &str,
    writer: W,
) -> Result<(Dispatch, LogHandle), TelemetryError>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    subscriber_with(format, filter, false, writer)
}

/// [`subscriber`], colouring plain levels when `ansi`.
pub fn subscriber_with<W>(
    format: LogFormat,
    filter: &str,
    ansi: bool,
    writer: W,
) -> Result<(Dispatch, LogHandle), TelemetryError>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let (filter_layer, reload) = reload::Layer::new(build_filter(filter)?);
    let fmt: Box<dyn Layer<Filtered> + Send + Sync> = match format {
        LogFormat::Plain => Box::new(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .event_format(PlainFormat { ansi })
                .with_writer(writer),
        ),
        LogFormat::Json => Box::new(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .event_format(JsonFormat)
                .with_writer(writer),
        ),
    };
    let subscriber = Registry::default().with(filter_layer).with(fmt);
    let handle = LogHandle {
        reload,
        initial: Arc::from(filter),
        current: Arc::new(Mutex::new(filter.to_owned())),
    };
    Ok((Dispatch::new(subscriber), handle))
}

fn build_filter(filter: &str) -> Result<EnvFilter, TelemetryError> {
    let mut directives: Vec<&str> = filter
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty() && !d.starts_with(FORCED_OFF))
        .collect();
    let forced = format!("{FORCED_OFF}=off");
    directives.push(&forced);
    EnvFilter::builder()
        .parse(directives.join(","))
        .map_err(|e| TelemetryError::InvalidFilter {
            filter: filter.to_owned(),
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_or_fail() {
        let cases = [
            ("info", true),
            ("access=debug,warn", true),
            ("hickory_server=trace", true),
            ("", true),
            ("info,foo=notalevel", false),
        ];
        for (filter, ok) in cases {
            assert_eq!(build_filter(filter).is_ok(), ok, "{filter:?}");
        }
    }
}
