//! The metrics registry: upstream's names and labels (§8.1, §7, §2.4) plus a few `ambit_`
//! extras.
//!
//! [`Metrics`] is a cheap clone (one `Arc`) shared by every component. Traffic is recorded
//! through a [`ConnectionGuard`]: the label set is hashed once when the connection opens
//! (into a per-thread table of the registry's counters for that label set, so the five
//! families are searched only for a label set's first connection on a thread), the byte
//! counters are then plain atomics shared with the registry, so bytes are visible to scrapes
//! while the connection is still running.
//!
//! # Byte direction (Istio's convention)
//!
//! For both reporters `istio_tcp_received_bytes_total` counts the **request** direction
//! (client → server) and `istio_tcp_sent_bytes_total` the **response** direction
//! (server → client). That is natural for the destination reporter (the server "received"
//! the request) and flipped for the source reporter: the bytes the client's ztunnel *sends*
//! upstream are counted as *received*. [`ConnectionGuard::add_received`] and
//! [`ConnectionGuard::add_sent`] take exactly those meanings, whichever side calls them:
//! call `add_received` for bytes copied client → server and `add_sent` for server → client.

mod labels;

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use labels::OneLabel;
pub use labels::{
    ConnectionSecurityPolicy, DnsLabels, Reporter, RequestProtocol, ResponseFlag, TrafficLabels,
    UNKNOWN, XdsTerminationReason, unknown,
};

use super::process::{ProcessCollector, TokioCollector};

/// Buckets of `istio_dns_upstream_request_duration_seconds`, as upstream.
pub const DNS_DURATION_BUCKETS: [f64; 6] = [0.0005, 0.001, 0.01, 0.1, 1.0, 5.0];
/// Buckets of `ambit_tcp_connection_duration_seconds`.
pub const CONNECTION_DURATION_BUCKETS: [f64; 10] =
    [0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 3600.0];

/// How a scrape wants its metrics encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposition {
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
    /// The classic Prometheus text format `text/plain; version=0.0.4`.
    Prometheus,
}

impl Exposition {
    pub fn content_type(self) -> &'static str {
        match self {
            Exposition::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Exposition::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn dns_histogram() -> Histogram {
    Histogram::new(DNS_DURATION_BUCKETS)
}

fn connection_histogram() -> Histogram {
    Histogram::new(CONNECTION_DURATION_BUCKETS)
}

#[derive(Debug)]
struct Traffic {
    opened: Family<TrafficLabels, Counter>,
    closed: Family<TrafficLabels, Counter>,
    failed: Family<TrafficLabels, Counter>,
    received: Family<TrafficLabels, Counter>,
    sent: Family<TrafficLabels, Counter>,
    sockets_open: Family<OneLabel<&'static str>, Gauge>,
    duration: HistogramFamily<OneLabel<&'static str>>,
}

#[derive(Debug)]
struct Dns {
    requests: Family<DnsLabels, Counter>,
    upstream_requests: Family<DnsLabels, Counter>,
    upstream_failures: Family<DnsLabels, Counter>,
    upstream_duration: HistogramFamily<DnsLabels>,
}

#[derive(Debug)]
struct Xds {
    terminations: Family<OneLabel<&'static str>, Counter>,
    messages: Family<OneLabel<String>, Counter>,
    message_bytes: Family<OneLabel<String>, Counter>,
}

/// In-pod workload proxy manager metrics (§2.4): prefix `workload_manager_`, not `istio_`.
#[derive(Debug, Clone, Default)]
pub struct WorkloadManagerMetrics {
    /// `workload_manager_active_proxy_count`
    pub active_proxies: Gauge,
    /// `workload_manager_pending_proxy_count`
    pub pending_proxies: Gauge,
    /// `workload_manager_proxies_started_total`
    pub proxies_started: Counter,
    /// `workload_manager_proxies_stopped_total`
    pub proxies_stopped: Counter,
}

#[derive(Debug)]
struct Inner {
    /// Tells this registry's entries in the per-thread [`LabelSet`] tables from another's.
    id: u64,
    // Only written when a collector is added after start (tokio runtimes); scrapes read.
    registry: RwLock<Registry>,
    tokio: TokioCollector,
    traffic: Traffic,
    dns: Dns,
    xds: Xds,
    workload_manager: WorkloadManagerMetrics,
}

/// All metrics of one ztunnel process.
#[derive(Debug, Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl Metrics {
    /// A registry with every metric registered; `istio_version` is the `tag` of
    /// `istio_build` (`ISTIO_META_ISTIO_VERSION`).
    pub fn new(istio_version: &str) -> Self {
        let mut root = Registry::default();

        let traffic = Traffic {
            opened: Family::default(),
            closed: Family::default(),
            failed: Family::default(),
            received: Family::default(),
            sent: Family::default(),
            sockets_open: Family::default(),
            duration: Family::new_with_constructor(connection_histogram),
        };
        let dns = Dns {
            requests: Family::default(),
            upstream_requests: Family::default(),
            upstream_failures: Family::default(),
            upstream_duration: Family::new_with_constructor(dns_histogram),
        };
        let xds = Xds {
            terminations: Family::default(),
            messages: Family::default(),
            message_bytes: Family::default(),
        };
        let workload_manager = WorkloadManagerMetrics::default();
        let build: Family<[(&'static str, String); 2], Gauge> = Family::default();
        build
            .get_or_create(&[
                ("component", "ztunnel".to_owned()),
                ("tag", istio_version.to_owned()),
            ])
            .set(1);

        {
            let istio = root.sub_registry_with_prefix("istio");
            istio.register("build", "Istio component build info", build);
            istio.register(
                "tcp_connections_opened",
                "The total number of TCP connections opened",
                traffic.opened.clone(),
            );
            istio.register(
                "tcp_connections_closed",
                "The total number of TCP connections closed",
                traffic.closed.clone(),
            );
            istio.register(
                "tcp_connections_failed",
                "The total number of TCP connections that failed to establish or were denied",
                traffic.failed.clone(),
            );
            istio.register(
                "tcp_received_bytes",
                "The size of total bytes received during request in case of a TCP connection",
                traffic.received.clone(),
            );
            istio.register(
                "tcp_sent_bytes",
                "The size of total bytes sent during response in case of a TCP connection",
                traffic.sent.clone(),
            );
            istio.register(
                "tcp_sockets_open",
                "The number of TCP sockets currently open",
                traffic.sockets_open.clone(),
            );
            istio.register(
                "dns_requests",
                "Total number of DNS requests",
                dns.requests.clone(),
            );
            istio.register(
                "dns_upstream_requests",
                "Total number of DNS requests forwarded to upstream",
                dns.upstream_requests.clone(),
            );
            istio.register(
                "dns_upstream_failures",
                "Total number of failed DNS requests forwarded to upstream",
                dns.upstream_failures.clone(),
            );
            istio.register_with_unit(
                "dns_upstream_request_duration",
                "Duration of DNS requests forwarded to upstream",
                Unit::Seconds,
                dns.upstream_duration.clone(),
            );
            istio.register(
                "xds_connection_terminations",
                "The total number of completed xDS connections",
                xds.terminations.clone(),
            );
            istio.register(
                "xds_message",
                "Total number of xDS messages received",
                xds.messages.clone(),
            );
            istio.register_with_unit(
                "xds_message",
                "Total size of xDS messages received",
                Unit::Bytes,
                xds.message_bytes.clone(),
            );
        }
        {
            let wm = root.sub_registry_with_prefix("workload_manager");
            wm.register(
                "active_proxy_count",
                "The total number of active workload proxies",
                workload_manager.active_proxies.clone(),
            );
            wm.register(
                "pending_proxy_count",
                "The total number of workload proxies waiting to start",
                workload_manager.pending_proxies.clone(),
            );
            wm.register(
                "proxies_started",
                "The total number of workload proxies started",
                workload_manager.proxies_started.clone(),
            );
            wm.register(
                "proxies_stopped",
                "The total number of workload proxies stopped",
                workload_manager.proxies_stopped.clone(),
            );
        }
        {
            let ambit = root.sub_registry_with_prefix("ambit");
            ambit.register_with_unit(
                "tcp_connection_duration",
                "Lifetime of proxied TCP connections",
                Unit::Seconds,
                traffic.duration.clone(),
            );
        }
        root.register_collector(Box::new(ProcessCollector));
        let tokio = TokioCollector::default();
        root.register_collector(Box::new(tokio.clone()));

        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Metrics {
            inner: Arc::new(Inner {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                registry: RwLock::new(root),
                tokio,
                traffic,
                dns,
                xds,
                workload_manager,
            }),
        }
    }

    /// Starts recording one proxied connection: counts it opened and open; the returned
    /// guard records bytes live and counts it closed (and failed) when dropped.
    pub fn connection_opened(&self, labels: TrafficLabels) -> ConnectionGuard {
        let set = self.label_set(labels);
        set.opened.inc();
        set.sockets_open.inc();
        ConnectionGuard {
            metrics: self.clone(),
            flag: AtomicU8::new(set.labels.response_flags as u8),
            set,
            bytes_sent: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
            opened_at: Instant::now(),
        }
    }

    /// This registry's counters for `labels`, from this thread's table (one hash of the
    /// labels) or, for the label set's first connection on this thread, from the families.
    fn label_set(&self, labels: TrafficLabels) -> Arc<LabelSet> {
        super::share_by(
            &LABEL_SETS,
            labels,
            |set| set.registry == self.inner.id,
            |labels| self.new_label_set(labels),
        )
    }

    fn new_label_set(&self, labels: TrafficLabels) -> LabelSet {
        let t = &self.inner.traffic;
        let reporter = OneLabel {
            name: "reporter",
            value: labels.reporter.as_str(),
        };
        LabelSet {
            registry: self.inner.id,
            opened: t.opened.get_or_create(&labels).clone(),
            sent: t.sent.get_or_create(&labels).clone(),
            received: t.received.get_or_create(&labels).clone(),
            closed: OnceLock::new(),
            sockets_open: t.sockets_open.get_or_create(&reporter).clone(),
            duration: t.duration.get_or_create(&reporter).clone(),
            labels,
        }
    }

    /// `istio_dns_requests_total`
    pub fn dns_request(&self, labels: &DnsLabels) {
        self.inner.dns.requests.get_or_create(labels).inc();
    }

    /// `istio_dns_upstream_requests_total`
    pub fn dns_upstream_request(&self, labels: &DnsLabels) {
        self.inner.dns.upstream_requests.get_or_create(labels).inc();
    }

    /// `istio_dns_upstream_failures_total`
    pub fn dns_upstream_failure(&self, labels: &DnsLabels) {
        self.inner.dns.upstream_failures.get_or_create(labels).inc();
    }

    /// `istio_dns_upstream_request_duration_seconds`
    pub fn dns_upstream_duration(&self, labels: &DnsLabels, took: Duration) {
        self.inner
            .dns
            .upstream_duration
            .get_or_create(labels)
            .observe(took.as_secs_f64());
    }

    /// `istio_xds_connection_terminations_total{reason}`
    pub fn xds_connection_terminated(&self, reason: XdsTerminationReason) {
        let l = OneLabel {
            name: "reason",
            value: reason.as_str(),
        };
        self.inner.xds.terminations.get_or_create(&l).inc();
    }

    /// `istio_xds_message_total{url}` and `istio_xds_message_bytes_total{url}` for one
    /// received message of `type_url`.
    pub fn xds_message(&self, type_url: &str, bytes: u64) {
        let l = OneLabel {
            name: "url",
            value: type_url.to_owned(),
        };
        self.inner.xds.messages.get_or_create(&l).inc();
        self.inner.xds.message_bytes.get_or_create(&l).inc_by(bytes);
    }

    /// The `workload_manager_*` gauges and counters.
    pub fn workload_manager(&self) -> &WorkloadManagerMetrics {
        &self.inner.workload_manager
    }

    /// Adds a tokio runtime to the `tokio_*` metrics, labelled `runtime=<name>`.
    pub fn register_tokio_runtime(&self, name: &str, handle: tokio::runtime::Handle) {
        self.inner.tokio.add(name, handle);
    }

    /// Registers an extra collector (for components that own their metric source).
    pub fn register_collector(&self, collector: Box<dyn Collector>) {
        // A poisoned lock only means a scrape panicked mid-encode; the registry is intact.
        let mut reg = self
            .inner
            .registry
            .write()
            .unwrap_or_else(|e| e.into_inner());
        reg.register_collector(collector);
    }

    /// Encodes every metric in the requested exposition format.
    pub fn encode(&self, format: Exposition) -> Result<String, fmt::Error> {
        let mut out = String::with_capacity(16 * 1024);
        {
            let reg = self
                .inner
                .registry
                .read()
                .unwrap_or_else(|e| e.into_inner());
            prometheus_client::encoding::text::encode(&mut out, &reg)?;
        }
        Ok(match format {
            Exposition::OpenMetrics => out,
            Exposition::Prometheus => openmetrics_to_prometheus(&out),
        })
    }
}

/// Rewrites prometheus-client's OpenMetrics text into the classic 0.0.4 text format: no
/// `# EOF` or `# UNIT` lines, counter families named after their `_total` samples, and
/// `unknown` typed as `untyped`. Samples are identical in both formats.
fn openmetrics_to_prometheus(om: &str) -> String {
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len() + 16 * counters.len());
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = line.strip_prefix("# HELP ").map(|r| ("# HELP ", r));
        let meta = meta.or_else(|| line.strip_prefix("# TYPE ").map(|r| ("# TYPE ", r)));
        if let Some((tag, rest)) = meta {
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            out.push_str(tag);
            out.push_str(name);
            if counters.contains(name) {
                out.push_str("_total");
            }
            out.push(' ');
            out.push_str(if tag == "# TYPE " && tail == "unknown" {
                "untyped"
            } else {
                tail
            });
            out.push('\n');
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Records one proxied connection; see the module docs for the byte direction.
///
/// All methods take `&self` so the two copy directions can share one guard. Dropping it
/// counts the connection closed (with the final `response_flags`), failed if the flag is a
/// failure, decrements `istio_tcp_sockets_open` and observes the lifetime.
#[derive(Debug)]
pub struct ConnectionGuard {
    metrics: Metrics,
    /// Shared with every open connection of the same label set on the same thread (see
    /// [`Metrics::label_set`]): an idle connection keeps one pointer instead of the ~25
    /// (interned) label strings and the registry's handles of its own.
    set: Arc<LabelSet>,
    flag: AtomicU8,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    opened_at: Instant,
}

impl ConnectionGuard {
    /// Bytes copied server → client (Istio "sent", the response direction).
    pub fn add_sent(&self, n: u64) {
        self.set.sent.inc_by(n);
        self.bytes_sent.fetch_add(n, Ordering::Relaxed);
    }

    /// Bytes copied client → server (Istio "received", the request direction).
    pub fn add_received(&self, n: u64) {
        self.set.received.inc_by(n);
        self.bytes_received.fetch_add(n, Ordering::Relaxed);
    }

    /// Marks the connection failed with `flag` (recorded when the guard drops). The last
    /// call wins; [`ResponseFlag::None`] clears it.
    pub fn set_failed(&self, flag: ResponseFlag) {
        self.flag.store(flag as u8, Ordering::Relaxed);
    }

    /// The response flag the connection will be closed with.
    pub fn response_flag(&self) -> ResponseFlag {
        ResponseFlag::from_u8(self.flag.load(Ordering::Relaxed))
    }

    /// Total server → client bytes of this connection so far.
    pub fn bytes_sent(&self) -> u64 {
        self.bytes_sent.load(Ordering::Relaxed)
    }

    /// Total client → server bytes of this connection so far.
    pub fn bytes_received(&self) -> u64 {
        self.bytes_received.load(Ordering::Relaxed)
    }

    /// Time since the connection was opened.
    pub fn elapsed(&self) -> Duration {
        self.opened_at.elapsed()
    }

    /// The labels the connection was opened with.
    pub fn labels(&self) -> &TrafficLabels {
        &self.set.labels
    }
}

/// The registry's handles for one label set: what a connection records into, looked up
/// once per label set and thread instead of hashing its 25 labels into five families for
/// every connection (BENCHMARKS.md, "Micro-benchmarks"). Families never drop an entry, so
/// the handles stay the registry's own.
#[derive(Debug)]
struct LabelSet {
    /// [`Inner::id`] of the registry the handles belong to.
    registry: u64,
    labels: TrafficLabels,
    opened: Counter,
    sent: Counter,
    received: Counter,
    /// Created at the first close with the opening flag, as the family entry would be: a
    /// label set's closed series appears only once a connection closed.
    closed: OnceLock<Counter>,
    sockets_open: Gauge,
    duration: Histogram,
}

/// Equal and hashed as its labels, so a table of label sets is searched by labels alone.
impl PartialEq for LabelSet {
    fn eq(&self, other: &Self) -> bool {
        self.labels == other.labels
    }
}

impl Eq for LabelSet {}

impl Hash for LabelSet {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.labels.hash(state)
    }
}

impl Borrow<TrafficLabels> for Arc<LabelSet> {
    fn borrow(&self) -> &TrafficLabels {
        &self.labels
    }
}

thread_local! {
    /// A full table starts over (handed-out sets stay valid); outside a thread-local
    /// context a connection gets a set of its own.
    static LABEL_SETS: super::ShareTable<LabelSet> = Default::default();
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        let set = &self.set;
        set.sockets_open.dec();
        set.duration.observe(self.opened_at.elapsed().as_secs_f64());
        let flag = self.response_flag();
        let t = &self.metrics.inner.traffic;
        if flag == set.labels.response_flags {
            set.closed
                .get_or_init(|| t.closed.get_or_create(&set.labels).clone())
                .inc();
            if flag.is_failure() {
                t.failed.get_or_create(&set.labels).inc();
            }
        } else {
            let mut labels = set.labels.clone();
            labels.response_flags = flag;
            t.closed.get_or_create(&labels).inc();
            if flag.is_failure() {
                t.failed.get_or_create(&labels).inc();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(prefix)).collect()
    }

    #[test]
    fn connections_with_equal_labels_share_one_label_set() {
        let m = Metrics::new("1.0");
        let labels = |w: &str| {
            let mut l = TrafficLabels::new(Reporter::Source);
            l.source_workload = w.into();
            l
        };
        let (a, b, c) = (
            m.connection_opened(labels("client")),
            m.connection_opened(labels("client")),
            m.connection_opened(labels("other")),
        );
        assert!(std::ptr::eq(a.labels(), b.labels()));
        assert!(!std::ptr::eq(a.labels(), c.labels()));
        assert_eq!(c.labels().source_workload.as_ref(), "other");
    }

    /// The value of the one series of `family` whose labels contain `label`.
    fn series(text: &str, family: &str, label: &str) -> Option<u64> {
        let found: Vec<_> = sample(text, &format!("{family}{{"))
            .into_iter()
            .filter(|l| l.contains(label))
            .collect();
        assert!(found.len() <= 1, "{found:?}");
        found
            .first()
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
    }

    #[test]
    fn cached_label_sets_count_into_their_own_registry() {
        let labels = |w: &str| {
            let mut l = TrafficLabels::new(Reporter::Source);
            l.source_workload = w.into();
            l
        };
        // Two registries on one thread (as in tests, or a restarted proxy), and more label
        // sets than a thread's table holds, so it starts over in between.
        let (a, b) = (Metrics::new("1.0"), Metrics::new("1.0"));
        let (a1, a2) = (
            a.connection_opened(labels("w")),
            a.connection_opened(labels("w")),
        );
        let b1 = b.connection_opened(labels("w"));
        for i in 0..crate::telemetry::SHARE_CAPACITY + 1 {
            drop(a.connection_opened(labels(&format!("other-{i}"))));
        }
        let a3 = a.connection_opened(labels("w"));
        for g in [&a1, &a2, &a3, &b1] {
            g.add_received(7);
        }
        drop((a1, a2, b1));
        let closed_before_last = a.encode(Exposition::OpenMetrics).unwrap();
        drop(a3);
        let (ta, tb) = (
            a.encode(Exposition::OpenMetrics).unwrap(),
            b.encode(Exposition::OpenMetrics).unwrap(),
        );
        let w = r#"source_workload="w""#;
        let cases = [
            (&ta, "istio_tcp_connections_opened_total", Some(3)),
            (&ta, "istio_tcp_received_bytes_total", Some(21)),
            (&ta, "istio_tcp_connections_closed_total", Some(3)),
            (&tb, "istio_tcp_connections_opened_total", Some(1)),
            (&tb, "istio_tcp_received_bytes_total", Some(7)),
            (&tb, "istio_tcp_connections_closed_total", Some(1)),
            (
                &closed_before_last,
                "istio_tcp_connections_closed_total",
                Some(2),
            ),
            (&ta, "istio_tcp_connections_failed_total", None),
        ];
        for (text, family, want) in cases {
            assert_eq!(series(text, family, w), want, "{family}");
        }
        for (text, open) in [(&ta, 0), (&tb, 0)] {
            assert_eq!(
                sample(text, r#"istio_tcp_sockets_open{reporter="source"} "#),
                [format!(r#"istio_tcp_sockets_open{{reporter="source"}} {open}"#).as_str()]
            );
        }
    }

    #[test]
    fn guard_counts_bytes_live_and_closes_on_drop() {
        let m = Metrics::new("1.0");
        let mut labels = TrafficLabels::new(Reporter::Source);
        labels.source_workload = "client".into();
        let guard = m.connection_opened(labels);
        guard.add_received(10);
        guard.add_sent(3);
        guard.add_received(5);
        let text = m.encode(Exposition::OpenMetrics).unwrap();
        let rx = sample(&text, "istio_tcp_received_bytes_total{");
        assert_eq!(rx.len(), 1);
        assert!(rx[0].ends_with(" 15"), "{}", rx[0]);
        assert!(rx[0].contains(r#"source_workload="client""#));
        assert!(rx[0].contains(r#"destination_zone="unknown""#));
        assert!(sample(&text, "istio_tcp_connections_closed_total{").is_empty());
        assert_eq!(
            sample(&text, r#"istio_tcp_sockets_open{reporter="source"} 1"#).len(),
            1
        );

        guard.set_failed(ResponseFlag::Deny);
        drop(guard);
        let text = m.encode(Exposition::OpenMetrics).unwrap();
        let closed = sample(&text, "istio_tcp_connections_closed_total{");
        assert_eq!(closed.len(), 1);
        assert!(closed[0].contains(r#"response_flags="DENY""#));
        assert_eq!(
            sample(&text, "istio_tcp_connections_failed_total{").len(),
            1
        );
        assert_eq!(
            sample(&text, r#"istio_tcp_sockets_open{reporter="source"} 0"#).len(),
            1
        );
    }

    #[test]
    fn label_values_are_escaped_and_empty_is_unknown() {
        let m = Metrics::new("1.0");
        let mut labels = TrafficLabels::new(Reporter::Destination);
        labels.source_app = "a\"b\\c\nd".into();
        labels.source_version = "".into();
        drop(m.connection_opened(labels));
        let text = m.encode(Exposition::OpenMetrics).unwrap();
        let line = sample(&text, "istio_tcp_connections_opened_total{")[0];
        assert!(line.contains(r#"source_app="a\"b\\c\nd""#), "{line}");
        assert!(line.contains(r#"source_version="unknown""#), "{line}");
    }

    #[test]
    fn prometheus_text_has_no_eof_and_total_families() {
        let m = Metrics::new("1.2.3");
        m.xds_message("type.googleapis.com/istio.workload.Address", 100);
        let om = m.encode(Exposition::OpenMetrics).unwrap();
        let prom = m.encode(Exposition::Prometheus).unwrap();
        assert!(om.ends_with("# EOF\n"));
        assert!(!prom.contains("# EOF"));
        assert!(!prom.contains("# UNIT"));
        for (text, want) in [
            (&om, "# TYPE istio_xds_message_bytes counter"),
            (&prom, "# TYPE istio_xds_message_bytes_total counter"),
            (&prom, "# HELP istio_xds_message_bytes_total Total size"),
            (&prom, "# TYPE istio_build gauge"),
            (&prom, r#"istio_build{component="ztunnel",tag="1.2.3"} 1"#),
            (
                &prom,
                r#"istio_xds_message_bytes_total{url="type.googleapis.com/istio.workload.Address"} 100"#,
            ),
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(want)),
                "missing {want:?} in\n{text}"
            );
        }
    }
}
