//! `/config_dump`: the proxy's view of the world as one JSON object (§8.3).
//!
//! The admin server does not know the proxy state; it asks a [`ConfigDumpSource`] for each
//! top-level section, so the owner of the state decides how to snapshot it.

use futures_util::future::BoxFuture;
use serde_json::{Map, Value};

/// The top-level keys of `/config_dump`, in upstream's spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DumpSection {
    Workloads,
    Services,
    Policies,
    StagedServices,
    /// The local config YAML (`LOCAL_XDS_PATH` / `LOCAL_XDS`), as JSON.
    StaticConfig,
    Version,
    /// The effective configuration.
    Config,
    Certificates,
    /// uid → {state, info, connections} of in-pod workload proxies (§2.4).
    WorkloadState,
}

impl DumpSection {
    /// Every section, in output order.
    pub const ALL: [DumpSection; 9] = [
        DumpSection::Workloads,
        DumpSection::Services,
        DumpSection::Policies,
        DumpSection::StagedServices,
        DumpSection::StaticConfig,
        DumpSection::Version,
        DumpSection::Config,
        DumpSection::Certificates,
        DumpSection::WorkloadState,
    ];

    /// The JSON key of the section.
    pub fn key(self) -> &'static str {
        match self {
            DumpSection::Workloads => "workloads",
            DumpSection::Services => "services",
            DumpSection::Policies => "policies",
            DumpSection::StagedServices => "stagedServices",
            DumpSection::StaticConfig => "staticConfig",
            DumpSection::Version => "version",
            DumpSection::Config => "config",
            DumpSection::Certificates => "certificates",
            DumpSection::WorkloadState => "workloadState",
        }
    }
}

/// Supplies the sections of `/config_dump`. Async because some state (certificates) sits
/// behind async locks; plain closures `Fn(DumpSection) -> Value` implement it too.
pub trait ConfigDumpSource: Send + Sync + 'static {
    fn dump(&self, section: DumpSection) -> BoxFuture<'_, Value>;
}

impl<F> ConfigDumpSource for F
where
    F: Fn(DumpSection) -> Value + Send + Sync + 'static,
{
    fn dump(&self, section: DumpSection) -> BoxFuture<'_, Value> {
        let v = self(section);
        Box::pin(std::future::ready(v))
    }
}

/// The empty source: every section `null` (before the state is plugged in).
pub fn empty_source(_: DumpSection) -> Value {
    Value::Null
}

/// A `version` section describing this build.
pub fn build_version(istio_version: &str) -> Value {
    serde_json::json!({
        "buildVersion": env!("CARGO_PKG_VERSION"),
        "istioVersion": istio_version,
        "implementation": "ambit",
    })
}

/// `t` as RFC 3339 in UTC with whole seconds (`2024-02-29T12:30:45Z`), as upstream's
/// certificate dump shows `validFrom` / `expirationTime`; times before 1970 print as the epoch.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
    let rem = secs % 86_400;
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Collects every section into one object.
pub(crate) async fn collect(source: &dyn ConfigDumpSource) -> Value {
    let mut out = Map::new();
    for section in DumpSection::ALL {
        out.insert(section.key().to_owned(), source.dump(section).await);
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn rfc3339_times() {
        let cases = [
            (0, "1970-01-01T00:00:00Z"),
            (1_709_209_845, "2024-02-29T12:30:45Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (4_102_444_799, "2099-12-31T23:59:59Z"),
        ];
        for (secs, want) in cases {
            assert_eq!(super::rfc3339(UNIX_EPOCH + Duration::from_secs(secs)), want);
        }
    }
}
