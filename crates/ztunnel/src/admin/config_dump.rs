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

/// Collects every section into one object.
pub(crate) async fn collect(source: &dyn ConfigDumpSource) -> Value {
    let mut out = Map::new();
    for section in DumpSection::ALL {
        out.insert(section.key().to_owned(), source.dump(section).await);
    }
    Value::Object(out)
}
