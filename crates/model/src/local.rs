//! The upstream local-config YAML (`LOCAL_XDS_PATH` / `LOCAL_XDS`, spec §4.4): top-level
//! `workloads`, `policies` and `services`, camelCase keys, unknown keys rejected, StringMatch as
//! a YAML-tagged enum (`!Exact x`, `!Prefix x`, `!Suffix x`, `!Presence []`).
//!
//! It loads into the same model types as xDS, but without xDS's defaulting: `trustDomain` and
//! `serviceAccount` are not filled in. Upstream would then build an identity such as
//! `spiffe:///ns/default/sa/x` that no certificate can carry; we refuse such a file at load time
//! instead (the keys are required), naming the line.
//!
//! Differences from upstream, all stricter: unknown keys inside match objects are rejected
//! (upstream ignores them, which can silently empty a match), and `workloadType` must be one
//! of `deployment`, `cronjob`, `pod`, `job`.

mod file;

use crate::authz::Authorization;
use crate::service::Service;
use crate::workload::Workload;

/// The contents of a local config file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalConfig {
    pub workloads: Vec<Workload>,
    pub services: Vec<Service>,
    pub policies: Vec<Authorization>,
}

/// A local config that does not parse. The message names the key path (for example
/// `workloads[1].workloadIps[0]`) and the line and column.
#[derive(Debug, thiserror::Error)]
#[error("invalid local config: {source}")]
pub struct LocalConfigError {
    #[source]
    source: serde_norway::Error,
}

impl LocalConfigError {
    /// 1-based line of the error, when the parser knows it.
    pub fn line(&self) -> Option<usize> {
        self.source.location().map(|l| l.line())
    }

    /// 1-based column of the error, when the parser knows it.
    pub fn column(&self) -> Option<usize> {
        self.source.location().map(|l| l.column())
    }
}

impl LocalConfig {
    /// Parses the YAML text of a local config (the caller reads the file or the variable).
    pub fn from_yaml(text: &str) -> Result<Self, LocalConfigError> {
        let parsed: file::ConfigFile =
            serde_norway::from_str(text).map_err(|source| LocalConfigError { source })?;
        Ok(parsed.into_model())
    }
}
