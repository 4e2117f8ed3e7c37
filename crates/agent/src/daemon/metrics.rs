//! The agent's Prometheus metrics (`spec/cni.md` §6.3 names plus ambit's protection
//! metrics). prometheus-client appends `_total` to counters on exposition.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// `response_code` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    /// HTTP status of a `/cmdadd`.
    pub response_code: String,
}

/// `type` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabel {
    /// add / update / delete.
    pub r#type: String,
}

/// `result` label of `istio_cni_installs_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// SUCCESS, COPY_BINARIES_FAILURE, CREATE_KUBECONFIG_FAILURE, CREATE_CNI_CONFIG_FAILURE.
    pub result: &'static str,
}

/// Every metric the agent exports.
#[derive(Debug, Default)]
pub struct Metrics {
    /// `istio_cni_install_ready`.
    pub install_ready: Gauge,
    /// `istio_cni_installs_total{result}`: installer passes that (re)installed something
    /// (SUCCESS), and failure episodes by kind (a failure repeating every pass counts once).
    pub installs: Family<ResultLabel, Counter>,
    /// `istio_cni_plugin_requests_total{response_code}`.
    pub plugin_requests: Family<CodeLabel, Counter>,
    /// `nodeagent_reconcile_events_total{type}`.
    pub reconcile_events: Family<TypeLabel, Counter>,
    /// `ztunnel_connected`.
    pub ztunnel_connected: Gauge,
    /// `ambit_enrolled_unprotected_pods`: enrolled pods whose rules or ztunnel listeners
    /// were missing after the last verification pass (and its repairs).
    pub unprotected: Gauge,
    /// `ambit_pod_repairs_total`: rules re-applied or ztunnel re-adds by verification.
    pub repairs: Counter,
    /// `ambit_verify_pod_checks_total`: enrolled pods checked by verification passes.
    pub pod_checks: Counter,
    /// `ambit_verify_unchanged_pod_checks_total`: of those, checks that found the pod's
    /// nf_tables state unchanged since its last clean check and did not read its rules
    /// again (routing, guard and listeners are read on every check).
    pub unchanged_checks: Counter,
    /// The registry holding all of the above.
    pub registry: Registry,
}

impl Metrics {
    /// Creates and registers everything.
    pub fn new() -> Self {
        let mut m = Self::default();
        let mut r = Registry::default();
        r.register(
            "istio_cni_install_ready",
            "Whether the CNI install is ready",
            m.install_ready.clone(),
        );
        r.register(
            "istio_cni_installs",
            "CNI installs by result",
            m.installs.clone(),
        );
        r.register(
            "istio_cni_plugin_requests",
            "Plugin /cmdadd requests by response code",
            m.plugin_requests.clone(),
        );
        r.register(
            "nodeagent_reconcile_events",
            "Pod events handled by type",
            m.reconcile_events.clone(),
        );
        r.register(
            "ztunnel_connected",
            "Number of ZDS connections",
            m.ztunnel_connected.clone(),
        );
        r.register(
            "ambit_enrolled_unprotected_pods",
            "Enrolled pods that were not protected after the last verification",
            m.unprotected.clone(),
        );
        r.register(
            "ambit_pod_repairs",
            "Repairs done by the verification loop",
            m.repairs.clone(),
        );
        r.register(
            "ambit_verify_pod_checks",
            "Enrolled pods checked by verification passes",
            m.pod_checks.clone(),
        );
        r.register(
            "ambit_verify_unchanged_pod_checks",
            "Pod checks that found the pod's nf_tables state unchanged since its last clean check",
            m.unchanged_checks.clone(),
        );
        m.registry = r;
        m
    }

    /// Text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    pub(crate) fn event(&self, t: &str) {
        self.reconcile_events
            .get_or_create(&TypeLabel { r#type: t.into() })
            .inc();
    }
}
