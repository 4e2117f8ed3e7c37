//! Metrics read at scrape time: file descriptors of the process and tokio runtime gauges.

use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// `process_open_fds` and `process_max_fds`, from `/proc/self`. Absent where `/proc` is not
/// readable (non-Linux), rather than reported as a misleading zero.
#[derive(Debug)]
pub(crate) struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if let Some(open) = open_fds() {
            let g = ConstGauge::new(open);
            let m = encoder.encode_descriptor(
                "process_open_fds",
                "Number of open file descriptors",
                None,
                g.metric_type(),
            )?;
            g.encode(m)?;
        }
        if let Some(max) = max_fds() {
            let g = ConstGauge::new(max);
            let m = encoder.encode_descriptor(
                "process_max_fds",
                "Maximum number of open file descriptors",
                None,
                g.metric_type(),
            )?;
            g.encode(m)?;
        }
        Ok(())
    }
}

fn open_fds() -> Option<i64> {
    let dir = std::fs::read_dir("/proc/self/fd").ok()?;
    // The directory handle itself is one of the entries; do not count it.
    let n = dir.count().saturating_sub(1);
    i64::try_from(n).ok()
}

fn max_fds() -> Option<i64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_max_open_files(&limits)
}

/// The soft limit from the "Max open files" row of `/proc/self/limits`.
fn parse_max_open_files(limits: &str) -> Option<i64> {
    let row = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = row
        .trim_start_matches("Max open files")
        .split_whitespace()
        .next()?;
    match soft {
        // Reported as the largest gauge value rather than dropped.
        "unlimited" => Some(i64::MAX),
        n => n.parse().ok(),
    }
}

/// `tokio_*` gauges of the registered runtimes, labelled by `runtime`.
#[derive(Debug, Clone, Default)]
pub(crate) struct TokioCollector {
    runtimes: Arc<Mutex<Vec<(String, tokio::runtime::Handle)>>>,
}

impl TokioCollector {
    pub(crate) fn add(&self, name: &str, handle: tokio::runtime::Handle) {
        let mut rts = self.runtimes.lock().unwrap_or_else(|e| e.into_inner());
        rts.retain(|(n, _)| n != name);
        rts.push((name.to_owned(), handle));
    }
}

type Sample = (Vec<(&'static str, String)>, f64);

impl Collector for TokioCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rts = self
            .runtimes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if rts.is_empty() {
            return Ok(());
        }
        let mut workers: Vec<Sample> = Vec::new();
        let mut queue: Vec<Sample> = Vec::new();
        let mut alive: Vec<Sample> = Vec::new();
        let mut busy: Vec<Sample> = Vec::new();
        let mut parks: Vec<Sample> = Vec::new();
        for (name, handle) in &rts {
            let m = handle.metrics();
            let rt = || vec![("runtime", name.clone())];
            workers.push((rt(), m.num_workers() as f64));
            queue.push((rt(), m.global_queue_depth() as f64));
            alive.push((rt(), m.num_alive_tasks() as f64));
            for w in 0..m.num_workers() {
                let labels = vec![("runtime", name.clone()), ("worker", w.to_string())];
                busy.push((
                    labels.clone(),
                    m.worker_total_busy_duration(w).as_secs_f64(),
                ));
                parks.push((labels, m.worker_park_count(w) as f64));
            }
        }
        let gauges = [
            ("tokio_num_workers", "Number of worker threads", workers),
            (
                "tokio_global_queue_depth",
                "Tasks in the global queue",
                queue,
            ),
            ("tokio_num_alive_tasks", "Tasks alive in the runtime", alive),
        ];
        for (name, help, samples) in gauges {
            let mut m = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (labels, v) in &samples {
                ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
            }
        }
        let counters = [
            (
                "tokio_worker_busy_duration_seconds",
                "Time each worker was busy",
                busy,
            ),
            ("tokio_worker_park_count", "Times each worker parked", parks),
        ];
        for (name, help, samples) in counters {
            let mut m = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (labels, v) in &samples {
                ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_max_open_files() {
        let cases = [
            (
                "Max open files            1024                 1048576              files\n",
                Some(1024),
            ),
            (
                "Max open files            unlimited            unlimited            files\n",
                Some(i64::MAX),
            ),
            (
                "Max processes             63704                63704                processes\n",
                None,
            ),
        ];
        for (input, want) in cases {
            assert_eq!(parse_max_open_files(input), want, "{input}");
        }
    }
}
