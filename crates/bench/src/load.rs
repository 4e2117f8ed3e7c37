//! The traffic: servers run in the server pod's namespace, load generators in the client
//! pod's. Every socket comes from a [`SocketFactory`] of its pod (unmarked, so the in-pod
//! rules capture the client's traffic exactly as they capture an application's).
//!
//! Every generator runs for a bounded time and every blocking read has a timeout, so a
//! stuck proxy makes a measurement fail instead of hanging the run.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ambit_netns::{NetnsSocketFactory, SocketFactory, SocketOptions};
use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;

/// Port of the discard server (throughput).
pub const DISCARD_PORT: u16 = 5001;
/// Port of the echo server (latency, connection rate, idle connections).
pub const ECHO_PORT: u16 = 5002;
/// Size of a latency request and of its echoed response.
pub const MESSAGE: usize = 1024;
/// Size of the reused buffer the throughput writers send.
const WRITE_BUF: usize = 128 * 1024;
/// Bound on any single blocking step (connect, one echo) of a generator.
const STEP_TIMEOUT: Duration = Duration::from_secs(5);

/// Set on Ctrl-C: generators stop early and the run unwinds, tearing everything down.
pub static STOP: AtomicBool = AtomicBool::new(false);

fn stopped() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Starts the discard and echo servers in the namespace of `factory`, owned by `tasks`.
/// `received` counts every byte the discard server reads.
pub fn start_servers(
    factory: &NetnsSocketFactory,
    rt: &tokio::runtime::Handle,
    tasks: &mut JoinSet<()>,
    received: Arc<AtomicU64>,
) -> Result<()> {
    let opts = SocketOptions {
        nodelay: true,
        ..SocketOptions::default()
    };
    let any = |port| SocketAddr::from(([0, 0, 0, 0], port));
    let discard = factory
        .new_tcp_listener(any(DISCARD_PORT), &opts)
        .context("discard listener")?;
    let echo = factory
        .new_tcp_listener(any(ECHO_PORT), &opts)
        .context("echo listener")?;
    tasks.spawn_on(
        async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(discard) else {
                return;
            };
            let mut conns = JoinSet::new();
            while let Ok((mut s, _)) = listener.accept().await {
                let received = received.clone();
                conns.spawn(async move {
                    let mut buf = vec![0u8; 256 * 1024];
                    while let Ok(n @ 1..) = s.read(&mut buf).await {
                        received.fetch_add(n as u64, Ordering::Relaxed);
                    }
                });
                while conns.try_join_next().is_some() {}
            }
        },
        rt,
    );
    tasks.spawn_on(
        async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(echo) else {
                return;
            };
            let mut conns = JoinSet::new();
            while let Ok((s, _)) = listener.accept().await {
                conns.spawn(async move {
                    let (mut r, mut w) = s.into_split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
                while conns.try_join_next().is_some() {}
            }
        },
        rt,
    );
    Ok(())
}

/// A connected, blocking stream from the factory's namespace (for the latency threads).
pub fn connect_blocking(factory: &NetnsSocketFactory, dst: SocketAddr) -> Result<TcpStream> {
    let sock = factory
        .new_tcp_stream_socket(dst, None, &SocketOptions::default())
        .context("client socket")?;
    sock.set_nonblocking(false)?;
    sock.set_tcp_nodelay(true)?;
    sock.connect_timeout(&dst.into(), STEP_TIMEOUT)
        .with_context(|| format!("connecting to {dst}"))?;
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(STEP_TIMEOUT))?;
    s.set_write_timeout(Some(STEP_TIMEOUT))?;
    Ok(s)
}

/// A connected tokio stream from the factory's namespace.
pub async fn connect(
    factory: &NetnsSocketFactory,
    dst: SocketAddr,
) -> Result<tokio::net::TcpStream> {
    let sock = factory
        .new_tcp_stream_socket(dst, None, &SocketOptions::default())
        .context("client socket")?;
    sock.set_tcp_nodelay(true)?;
    let sock = tokio::net::TcpSocket::from_std_stream(sock.into());
    let s = tokio::time::timeout(STEP_TIMEOUT, sock.connect(dst))
        .await
        .with_context(|| format!("connecting to {dst}: timed out"))?
        .with_context(|| format!("connecting to {dst}"))?;
    Ok(s)
}

/// One byte out, the same byte back.
async fn echo_byte(s: &mut tokio::net::TcpStream) -> Result<()> {
    let step = async {
        s.write_all(b"x").await?;
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await?;
        anyhow::Ok(())
    };
    tokio::time::timeout(STEP_TIMEOUT, step)
        .await
        .context("echo timed out")?
}

/// Waits until one echo through the whole path works (certificates fetched, rules in
/// place), up to `timeout`.
pub async fn wait_path(
    factory: &NetnsSocketFactory,
    dst: SocketAddr,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let attempt = async {
            let mut s = connect(factory, dst).await?;
            echo_byte(&mut s).await
        };
        match attempt.await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline || stopped() => {
                return Err(e.context(format!("no echo from {dst} within {timeout:?}")));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Bytes and CPU of one throughput window.
#[derive(Clone, Copy, Debug)]
pub struct Throughput {
    /// Bytes the server received inside the window.
    pub bytes: u64,
    /// Window length.
    pub seconds: f64,
    /// CPU seconds the proxies used inside the window.
    pub proxy_cpu: f64,
}

impl Throughput {
    /// Bytes per second.
    pub fn rate(&self) -> f64 {
        self.bytes as f64 / self.seconds
    }
}

/// `streams` connections bulk-writing a reused buffer to the discard server. The window
/// opens after `warmup` (slow start, pool setup) and lasts `duration`; bytes are counted
/// where they arrive, so socket buffers do not inflate the figure.
pub async fn throughput(
    factory: &NetnsSocketFactory,
    dst: SocketAddr,
    streams: usize,
    warmup: Duration,
    duration: Duration,
    received: &AtomicU64,
    proxy_cpu: impl Fn() -> f64,
) -> Result<Throughput> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = JoinSet::new();
    for _ in 0..streams {
        let mut s = connect(factory, dst).await?;
        let stop = stop.clone();
        writers.spawn(async move {
            let buf = vec![0xa5u8; WRITE_BUF];
            while !stop.load(Ordering::Relaxed) && !stopped() {
                s.write_all(&buf).await?;
            }
            anyhow::Ok(())
        });
    }
    tokio::time::sleep(warmup).await;
    let (b0, c0, t0) = (
        received.load(Ordering::Relaxed),
        proxy_cpu(),
        Instant::now(),
    );
    tokio::time::sleep(duration).await;
    let (b1, c1, t1) = (
        received.load(Ordering::Relaxed),
        proxy_cpu(),
        Instant::now(),
    );
    stop.store(true, Ordering::Relaxed);
    let joined = tokio::time::timeout(STEP_TIMEOUT, async {
        let mut first_err = None;
        while let Some(r) = writers.join_next().await {
            if let Ok(Err(e)) = r {
                first_err.get_or_insert(e);
            }
        }
        first_err
    })
    .await;
    match joined {
        Ok(Some(e)) => return Err(e.context("throughput writer")),
        Ok(None) => {}
        Err(_) => bail!("throughput writers did not stop within {STEP_TIMEOUT:?}"),
    }
    if b1 == b0 {
        bail!("no bytes arrived at {dst} during the window");
    }
    Ok(Throughput {
        bytes: b1 - b0,
        seconds: (t1 - t0).as_secs_f64(),
        proxy_cpu: c1 - c0,
    })
}

/// Result of one fixed-rate latency run.
#[derive(Debug)]
pub struct Latency {
    /// Latency from each request's *intended* send time to its response, in nanoseconds.
    pub histogram: Histogram<u64>,
    /// Responses received per second over the run.
    pub achieved_rate: f64,
}

/// Open-loop request/response at `rate` requests/s over one connection for `duration`:
/// a sender thread writes request `i` at `t0 + i/rate` (or at once if it is late), a
/// receiver thread reads the echoes in order and records `now - (t0 + i/rate)`. Measuring
/// from the intended time corrects coordinated omission: a stall delays every request
/// scheduled during it, and all of them are charged for it.
pub fn latency(
    factory: &NetnsSocketFactory,
    dst: SocketAddr,
    rate: u32,
    duration: Duration,
) -> Result<Latency> {
    let mut stream = connect_blocking(factory, dst)?;
    // One exchange first, so connection and stream setup are not in the figures.
    let mut msg = [0u8; MESSAGE];
    stream.write_all(&msg)?;
    stream.read_exact(&mut msg).context("warm-up echo")?;

    let total = (f64::from(rate) * duration.as_secs_f64()).ceil().max(1.0) as u64;
    let period = Duration::from_secs(1) / rate.max(1);
    let mut writer = stream.try_clone()?;
    let t0 = Instant::now() + Duration::from_millis(5);
    let intended = move |i: u64| t0 + period * u32::try_from(i).unwrap_or(u32::MAX);
    let sender = std::thread::Builder::new()
        .name("bench-sender".into())
        .spawn(move || -> Result<()> {
            let mut msg = [0x5au8; MESSAGE];
            for i in 0..total {
                if stopped() {
                    break;
                }
                let at = intended(i);
                let now = Instant::now();
                if at > now {
                    std::thread::sleep(at - now);
                }
                msg[..8].copy_from_slice(&i.to_le_bytes());
                writer.write_all(&msg).context("sending a request")?;
            }
            Ok(())
        })?;
    // 1 µs .. 60 s at 3 significant digits.
    let mut histogram = Histogram::<u64>::new_with_bounds(1_000, 60_000_000_000, 3)?;
    let mut buf = [0u8; MESSAGE];
    let mut last = t0;
    let mut received = 0u64;
    let mut failure = None;
    for i in 0..total {
        if stopped() {
            break;
        }
        if let Err(e) = stream.read_exact(&mut buf) {
            failure = Some(anyhow::Error::new(e).context(format!("reading response {i}")));
            break;
        }
        last = Instant::now();
        let seq = u64::from_le_bytes(buf[..8].try_into().unwrap_or_default());
        if seq != i {
            failure = Some(anyhow::anyhow!("response {i} carried sequence {seq}"));
            break;
        }
        let ns = last.saturating_duration_since(intended(i)).as_nanos();
        histogram.saturating_record(u64::try_from(ns).unwrap_or(u64::MAX).max(1_000));
        received += 1;
    }
    // Unblocks a sender stuck in write_all if we stopped reading early.
    let _ = stream.shutdown(std::net::Shutdown::Both);
    let sent = sender
        .join()
        .map_err(|_| anyhow::anyhow!("sender thread panicked"))?;
    if let Some(e) = failure {
        return Err(e);
    }
    sent?;
    let span = last.saturating_duration_since(t0).as_secs_f64();
    Ok(Latency {
        histogram,
        achieved_rate: if span > 0.0 {
            received as f64 / span
        } else {
            0.0
        },
    })
}

/// Completed connections of one connection-rate run.
#[derive(Clone, Copy, Debug)]
pub struct ConnRate {
    /// Connections that completed {connect, echo, close}.
    pub connections: u64,
    /// Length of the run.
    pub seconds: f64,
}

impl ConnRate {
    /// Connections per second.
    pub fn rate(&self) -> f64 {
        self.connections as f64 / self.seconds
    }
}

/// `concurrency` workers each looping {connect, 1-byte echo, close} for `duration`.
/// Any failed iteration fails the measurement (0 errors or no figure).
pub async fn connection_rate(
    factory: Arc<NetnsSocketFactory>,
    dst: SocketAddr,
    concurrency: usize,
    duration: Duration,
) -> Result<ConnRate> {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + duration;
    let mut workers = JoinSet::new();
    for _ in 0..concurrency {
        let (factory, done) = (factory.clone(), done.clone());
        workers.spawn(async move {
            while Instant::now() < deadline && !stopped() {
                let mut s = connect(&factory, dst).await?;
                echo_byte(&mut s).await?;
                drop(s);
                done.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = workers.join_next().await {
        r.context("connection-rate worker")??;
    }
    Ok(ConnRate {
        connections: done.load(Ordering::Relaxed),
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Completions of one sustained connection-rate run, step by step.
#[derive(Clone, Debug)]
pub struct Sustained {
    /// Connections completed in each step, in order.
    pub per_step: Vec<u64>,
    /// Length of a step.
    pub step: Duration,
    /// Iterations that failed (connect, echo or a step timeout).
    pub errors: u64,
    /// The first failure, for the report.
    pub first_error: Option<String>,
    /// Time of each completed connection (connect to the echo's return), nanoseconds.
    pub conn_time: Histogram<u64>,
}

impl Sustained {
    /// Connections per second over the whole run.
    pub fn rate(&self) -> f64 {
        let total: u64 = self.per_step.iter().sum();
        total as f64 / (self.step.as_secs_f64() * self.per_step.len().max(1) as f64)
    }

    /// Connections per second in the slowest step.
    pub fn slowest_step_rate(&self) -> f64 {
        let min = self.per_step.iter().copied().min().unwrap_or(0);
        min as f64 / self.step.as_secs_f64()
    }

    /// The 99th percentile of the connection times, microseconds (0 when none completed).
    pub fn conn_time_p99_us(&self) -> f64 {
        if self.conn_time.is_empty() {
            return 0.0;
        }
        self.conn_time.value_at_quantile(0.99) as f64 / 1e3
    }
}

/// A histogram of connection times in nanoseconds: 1 µs to a minute, 3 significant digits.
fn conn_time_histogram() -> Result<Histogram<u64>> {
    Ok(Histogram::<u64>::new_with_bounds(1_000, 60_000_000_000, 3)?)
}

/// When worker `i` of `workers` starts each iteration of a run offering `rate` connections
/// per second in all: every `workers / rate` seconds, worker `i` offset by `i / rate`, so
/// the workers' connections interleave evenly. `None` for a closed loop (`rate` 0).
fn pace(rate: u32, workers: usize, i: usize) -> Option<(Duration, Duration)> {
    if rate == 0 || workers == 0 {
        return None;
    }
    let rate = f64::from(rate);
    Some((
        Duration::from_secs_f64(i as f64 / rate),
        Duration::from_secs_f64(workers as f64 / rate),
    ))
}

/// `concurrency` workers each looping {connect, 1-byte echo, close} for `steps` steps of
/// `step`, counting completions per step and timing each connection. With `rate` > 0 the
/// workers together offer that many connections per second, each at most one in flight
/// (a connection that takes longer than its worker's period skips the ticks it overran:
/// the shortfall is the result); with 0 each starts the next as soon as one ends. Unlike
/// [`connection_rate`] a failed iteration is counted, not fatal: this run is long enough
/// (longer than TCP's TIME-WAIT) to exhaust what a proxy's sockets use up, and how it fails
/// is part of the result. A failed iteration of a closed loop waits 10 ms before the next,
/// so a failing path is not hammered in a tight loop.
pub async fn sustained_connection_rate(
    factory: Arc<NetnsSocketFactory>,
    dst: SocketAddr,
    concurrency: usize,
    rate: u32,
    step: Duration,
    steps: usize,
) -> Result<Sustained> {
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(std::sync::Mutex::new(None::<String>));
    let start = tokio::time::Instant::now();
    let deadline = start + step * steps as u32;
    let mut workers = JoinSet::new();
    for i in 0..concurrency {
        let (factory, done, errors, first_error) = (
            factory.clone(),
            done.clone(),
            errors.clone(),
            first_error.clone(),
        );
        let mut ticker = pace(rate, concurrency, i).map(|(offset, period)| {
            let mut t = tokio::time::interval_at(start + offset, period);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            t
        });
        let mut times = conn_time_histogram()?;
        workers.spawn(async move {
            loop {
                if let Some(t) = &mut ticker {
                    t.tick().await;
                }
                if tokio::time::Instant::now() >= deadline || stopped() {
                    break;
                }
                let began = Instant::now();
                let one = async {
                    let mut s = connect(&factory, dst).await?;
                    echo_byte(&mut s).await
                };
                match one.await {
                    Ok(()) => {
                        done.fetch_add(1, Ordering::Relaxed);
                        times.saturating_record(began.elapsed().as_nanos() as u64);
                    }
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        first_error
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_or_insert_with(|| format!("{e:#}"));
                        if ticker.is_none() {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
            }
            times
        });
    }
    let mut per_step = Vec::with_capacity(steps);
    let mut seen = 0;
    for i in 1..=steps {
        tokio::time::sleep_until(start + step * i as u32).await;
        let now = done.load(Ordering::Relaxed);
        per_step.push(now - seen);
        seen = now;
        if stopped() {
            break;
        }
    }
    // Connections that completed after the last step (a worker's iteration in flight at
    // the deadline) count in no step, but their times are in the histogram.
    let mut conn_time = conn_time_histogram()?;
    while let Some(r) = workers.join_next().await {
        conn_time
            .add(r.context("sustained connection-rate worker")?)
            .context("merging connection times")?;
    }
    let first_error = first_error.lock().unwrap_or_else(|p| p.into_inner()).take();
    Ok(Sustained {
        per_step,
        step,
        errors: errors.load(Ordering::Relaxed),
        first_error,
        conn_time,
    })
}

/// The `ambit-bench idle-conns` child process holding idle connections open; killed (and
/// reaped) on drop.
#[derive(Debug)]
pub struct IdleHolder {
    child: std::process::Child,
}

impl IdleHolder {
    /// Starts `cmd` (an `idle-conns` command for `n` connections) and waits until it
    /// reports every connection open and echoed.
    pub fn start(mut cmd: std::process::Command, n: usize) -> Result<Self> {
        use std::io::BufRead;
        use std::process::Stdio;
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut holder = Self {
            child: cmd.spawn().context("starting the idle-connection holder")?,
        };
        let stdout = holder.child.stdout.take().context("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        // Ends when the child's stdout closes (it exits, or is killed on drop).
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        // Generous: 10,000 connections through a debug-build mesh take seconds.
        let timeout =
            STEP_TIMEOUT.max(Duration::from_millis(5) * u32::try_from(n).unwrap_or(u32::MAX)) * 6;
        let line = rx.recv_timeout(timeout).unwrap_or_default();
        if line.trim() != format!("open {n}") {
            let _ = holder.child.kill();
            let mut err = String::new();
            if let Some(mut e) = holder.child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            bail!(
                "idle-connection holder did not open {n} connections within {timeout:?}: {:?} {}",
                line.trim(),
                err.trim()
            );
        }
        Ok(holder)
    }

    /// Closes the connections (stdin EOF) and checks that the holder exited cleanly.
    pub fn close(mut self) -> Result<()> {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("idle-connection holder exited with {status}");
                }
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("idle-connection holder did not exit within {STEP_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for IdleHolder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sustained_rates() {
        let run = |per_step: &[u64], step_ms: u64| Sustained {
            per_step: per_step.to_vec(),
            step: Duration::from_millis(step_ms),
            errors: 0,
            first_error: None,
            conn_time: conn_time_histogram().unwrap(),
        };
        // (completions per step, step, whole-run rate, slowest step's rate)
        let cases: [(&[u64], u64, f64, f64); 4] = [
            (&[500, 400, 600], 500, 1_000.0, 800.0),
            (&[3_000, 3_000, 15], 1_000, 2_005.0, 15.0),
            (&[7], 100, 70.0, 70.0),
            (&[], 100, 0.0, 0.0),
        ];
        for (per_step, step, rate, slowest) in cases {
            let s = run(per_step, step);
            assert!((s.rate() - rate).abs() < 1e-9, "{per_step:?}: {}", s.rate());
            assert!(
                (s.slowest_step_rate() - slowest).abs() < 1e-9,
                "{per_step:?}: {}",
                s.slowest_step_rate()
            );
        }
    }

    #[test]
    fn paced_workers_interleave_evenly() {
        let ms = |m: f64| Duration::from_secs_f64(m / 1e3);
        // (offered conn/s, workers, worker, expected (first start, period))
        let cases = [
            (400, 4, 0, Some((ms(0.0), ms(10.0)))),
            (400, 4, 3, Some((ms(7.5), ms(10.0)))),
            (1_000, 1, 0, Some((ms(0.0), ms(1.0)))),
            (3, 4, 1, Some((ms(1_000.0 / 3.0), ms(4_000.0 / 3.0)))),
            (0, 4, 0, None),
            (400, 0, 0, None),
        ];
        for (rate, workers, i, want) in cases {
            let got = pace(rate, workers, i);
            let close = |a: Duration, b: Duration| a.abs_diff(b) < Duration::from_micros(1);
            let ok = match (got, want) {
                (Some((o, p)), Some((wo, wp))) => close(o, wo) && close(p, wp),
                (None, None) => true,
                _ => false,
            };
            assert!(ok, "{rate}/s, {workers} workers, worker {i}: {got:?}");
        }
    }

    #[test]
    fn connection_time_p99() {
        let mut s = Sustained {
            per_step: vec![100],
            step: Duration::from_secs(1),
            errors: 0,
            first_error: None,
            conn_time: conn_time_histogram().unwrap(),
        };
        assert_eq!(s.conn_time_p99_us(), 0.0, "no connection completed");
        for _ in 0..98 {
            s.conn_time.record(300_000).unwrap();
        }
        s.conn_time.record(20_000_000).unwrap();
        s.conn_time.record(20_000_000).unwrap();
        // 2 of 100 took 20 ms: the 99th percentile is one of them.
        let p99 = s.conn_time_p99_us();
        assert!((p99 - 20_000.0).abs() < 20.0, "{p99}");
    }
}
