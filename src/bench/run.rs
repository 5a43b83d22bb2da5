//! Load drivers: a closed loop (N reservations in flight) and an open loop (R
//! requests per second, latency measured from each request's intended send time,
//! so a stalled service cannot hide its queue — no coordinated omission).
//! Allowed reservations are settled after the simulated upstream time, without
//! holding up the next reservation.
//! Size: both drivers, the ticker and the settle path work on one `Shared`
//! (stats, ledger, in-flight count); apart, each file would take all of it.

use super::ledger::Ledger;
use super::target::Target;
use super::workload::Reply;
use super::workload::{Item, Workload};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The longest extra wait for calls still upstream at a run's end.
const SETTLE_WAIT_MAX: Duration = Duration::from_secs(120);

/// How to drive one phase.
#[derive(Clone, Copy, Debug)]
pub struct Drive {
    /// Closed loop: reservations in flight.
    pub concurrency: usize,
    /// Open loop: requests per second (overrides the closed loop).
    pub rate: Option<f64>,
    /// Measured time.
    pub duration: Duration,
    /// Unmeasured time before it (the overspend check still counts it).
    pub warmup: Duration,
    /// Show a live progress bar.
    pub progress: bool,
}

/// The RPCs a bench measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rpc {
    /// CheckAndReserve.
    Reserve,
    /// Commit.
    Commit,
    /// Refund.
    Refund,
}

impl Rpc {
    /// The RPC's proto name.
    pub fn name(self) -> &'static str {
        match self {
            Rpc::Reserve => "CheckAndReserve",
            Rpc::Commit => "Commit",
            Rpc::Refund => "Refund",
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid histogram bounds")
}

/// Everything measured in one phase.
pub struct Stats {
    hist: Mutex<BTreeMap<Rpc, Histogram<u64>>>,
    window: Mutex<Histogram<u64>>,
    window_count: AtomicU64,
    window_denied: AtomicU64,
    decisions: Mutex<BTreeMap<&'static str, u64>>,
    errors: Mutex<BTreeMap<String, u64>>,
    dropped: AtomicU64,
}

impl Stats {
    fn new() -> Self {
        Stats {
            hist: Mutex::new(BTreeMap::new()),
            window: Mutex::new(histogram()),
            window_count: AtomicU64::new(0),
            window_denied: AtomicU64::new(0),
            decisions: Mutex::new(BTreeMap::new()),
            errors: Mutex::new(BTreeMap::new()),
            dropped: AtomicU64::new(0),
        }
    }

    fn record(&self, rpc: Rpc, latency: Duration, measured: bool) {
        let us = (latency.as_micros() as u64).clamp(1, 120_000_000);
        if measured {
            let mut h = self.hist.lock().unwrap_or_else(|p| p.into_inner());
            let _ = h.entry(rpc).or_insert_with(histogram).record(us);
        }
        if rpc == Rpc::Reserve {
            let _ = self
                .window
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .record(us);
            self.window_count.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn decision(&self, reply: &Reply, measured: bool) {
        if !reply.allowed {
            self.window_denied.fetch_add(1, Ordering::Relaxed);
        }
        if measured {
            *self
                .decisions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(reply.reason)
                .or_default() += 1;
        }
    }

    fn error(&self, rpc: Rpc, code: String) {
        *self
            .errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(format!("{} {code}", rpc.name()))
            .or_default() += 1;
    }

    /// Latency histograms (µs) per RPC over the measured time.
    pub fn histograms(&self) -> BTreeMap<Rpc, Histogram<u64>> {
        self.hist.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Decisions by reason (`allowed` included).
    pub fn decisions(&self) -> BTreeMap<String, u64> {
        let d = self.decisions.lock().unwrap_or_else(|p| p.into_inner());
        d.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    /// Errors by RPC and code.
    pub fn errors(&self) -> BTreeMap<String, u64> {
        self.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Open-loop requests not sent because too many were outstanding.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Shared by every task of a phase.
struct Shared {
    target: Arc<Target>,
    workload: Arc<Workload>,
    ledger: Arc<Ledger>,
    stats: Arc<Stats>,
    measure_from: Instant,
    outstanding: AtomicUsize,
}

/// Outcome of a phase: stats plus its wall time (first send to last settle).
pub struct PhaseRun {
    /// Everything measured.
    pub stats: Arc<Stats>,
    /// Wall time including warmup and settling: what the overspend check allows.
    pub elapsed: Duration,
    /// Measured reservations per second.
    pub reserve_rate: f64,
}

/// Drives `target` with `workload` as `drive` says.
pub async fn phase(
    label: &str,
    target: Arc<Target>,
    workload: Arc<Workload>,
    ledger: Arc<Ledger>,
    drive: Drive,
) -> PhaseRun {
    let start = Instant::now();
    let shared = Arc::new(Shared {
        target,
        workload,
        ledger,
        stats: Arc::new(Stats::new()),
        measure_from: start + drive.warmup,
        outstanding: AtomicUsize::new(0),
    });
    let end = start + drive.warmup + drive.duration;
    let bar = progress(label, drive);
    let ticker = tokio::spawn(tick(shared.clone(), bar.clone(), end));
    match drive.rate {
        Some(rate) => open_loop(&shared, rate, end).await,
        None => closed_loop(&shared, drive.concurrency, end).await,
    }
    // Let the reservations still upstream settle, so the ledger is complete (calls
    // that outlast SETTLE_WAIT_MAX, e.g. a reserve-only ceiling's, are not waited for).
    let upstream = Duration::from_millis(shared.workload.args().upstream_ms * 3 / 2);
    let extra = Some(upstream)
        .filter(|u| *u <= SETTLE_WAIT_MAX)
        .unwrap_or_default();
    let settle_deadline = Instant::now() + Duration::from_secs(30) + extra;
    while shared.outstanding.load(Ordering::Acquire) > 0 && Instant::now() < settle_deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ticker.abort();
    bar.finish_and_clear();
    let elapsed = start.elapsed();
    let reserves = shared
        .stats
        .histograms()
        .get(&Rpc::Reserve)
        .map_or(0, |h| h.len());
    PhaseRun {
        stats: shared.stats.clone(),
        elapsed,
        reserve_rate: reserves as f64 / drive.duration.as_secs_f64(),
    }
}

fn progress(label: &str, drive: Drive) -> ProgressBar {
    if !drive.progress {
        return ProgressBar::hidden();
    }
    let total = (drive.warmup + drive.duration).as_millis() as u64;
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:30}] {elapsed:>4} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(label.to_string());
    bar
}

async fn tick(shared: Arc<Shared>, bar: ProgressBar, end: Instant) {
    let every = Duration::from_millis(500);
    let start = Instant::now();
    loop {
        tokio::time::sleep(every).await;
        let count = shared.stats.window_count.swap(0, Ordering::Relaxed);
        let denied = shared.stats.window_denied.swap(0, Ordering::Relaxed);
        let p99 = {
            let mut w = shared
                .stats
                .window
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let p = w.value_at_quantile(0.99);
            w.reset();
            p
        };
        let phase = if Instant::now() < shared.measure_from {
            "warmup "
        } else {
            ""
        };
        shared.ledger.sample(start.elapsed());
        bar.set_position(start.elapsed().as_millis() as u64);
        bar.set_message(format!(
            "{phase}{:>8.0} req/s  p99 {:>7.2} ms  denied {:>5.1}%  in flight {}",
            count as f64 / every.as_secs_f64(),
            p99 as f64 / 1000.0,
            if count == 0 {
                0.0
            } else {
                denied as f64 * 100.0 / count as f64
            },
            shared.outstanding.load(Ordering::Relaxed)
        ));
        if Instant::now() >= end {
            bar.set_position(bar.length().unwrap_or(0));
        }
    }
}

async fn closed_loop(shared: &Arc<Shared>, concurrency: usize, end: Instant) {
    let seed = shared.workload.args().seed;
    let workers: Vec<_> = (0..concurrency.max(1))
        .map(|w| {
            let shared = shared.clone();
            tokio::spawn(async move {
                let mut rng =
                    SmallRng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(w as u64));
                while Instant::now() < end {
                    let item = shared.workload.next(&mut rng);
                    let sent = Instant::now();
                    reserve_one(&shared, item, sent).await;
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.await;
    }
}

async fn open_loop(shared: &Arc<Shared>, rate: f64, end: Instant) {
    const MAX_OUTSTANDING: usize = 50_000;
    // Sends due within this window go out together: one cross-thread wake-up per
    // batch instead of per request.
    const BATCH: Duration = Duration::from_micros(200);
    let shared = shared.clone();
    let runtime = tokio::runtime::Handle::current();
    // A plain thread paces the sends: its sleeps are finer than the runtime's
    // 1 ms timer, so latency from the intended time measures the service, not
    // the pacing.
    let pacer = std::thread::spawn(move || {
        let interval = Duration::from_secs_f64(1.0 / rate.max(0.001));
        let mut rng = SmallRng::seed_from_u64(shared.workload.args().seed);
        let start = Instant::now();
        let mut sent: u32 = 0;
        loop {
            let now = Instant::now();
            let mut due = Vec::new();
            loop {
                let intended = start + interval * sent;
                if intended >= end || intended > now + BATCH {
                    break;
                }
                sent += 1;
                let item = shared.workload.next(&mut rng);
                if shared.outstanding.load(Ordering::Relaxed) + due.len() >= MAX_OUTSTANDING {
                    shared.stats.dropped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                due.push((item, intended));
            }
            if !due.is_empty() {
                shared.outstanding.fetch_add(due.len(), Ordering::AcqRel);
                let batch = shared.clone();
                runtime.spawn(async move {
                    for (item, intended) in due {
                        let task = batch.clone();
                        tokio::spawn(async move {
                            // Sent up to one batch early: time it from the send
                            // then; sent late: from when it should have gone.
                            let from = intended.max(Instant::now());
                            reserve_one(&task, item, from).await;
                            task.outstanding.fetch_sub(1, Ordering::AcqRel);
                        });
                    }
                });
            }
            let next = start + interval * sent;
            if next >= end {
                break;
            }
            let now = Instant::now();
            if next > now {
                std::thread::sleep((next - now).max(BATCH));
            }
        }
    });
    let _ = tokio::task::spawn_blocking(move || pacer.join()).await;
}

async fn reserve_one(shared: &Arc<Shared>, item: Item, intended: Instant) {
    let tier = shared.workload.tiers[item.tier].clone();
    let measured = intended >= shared.measure_from;
    match shared.target.reserve(&item, &tier).await {
        Ok(reply) => {
            shared
                .stats
                .record(Rpc::Reserve, intended.elapsed(), measured);
            shared.stats.decision(&reply, measured);
            if reply.allowed {
                let held = reply.reserved_output;
                shared.ledger.granted(&item, held);
                shared.outstanding.fetch_add(1, Ordering::AcqRel);
                let task = shared.clone();
                tokio::spawn(async move {
                    settle(&task, item, reply.reservation_id, held).await;
                    task.outstanding.fetch_sub(1, Ordering::AcqRel);
                });
            }
        }
        Err(code) => {
            shared
                .stats
                .record(Rpc::Reserve, intended.elapsed(), measured);
            shared.stats.error(Rpc::Reserve, code);
        }
    }
}

/// Settles `item` (reservation `id`, `held` output tokens reserved) once its
/// upstream time has passed.
async fn settle(shared: &Shared, item: Item, id: String, held: u64) {
    tokio::time::sleep(item.upstream).await;
    let started = Instant::now();
    let measured = started >= shared.measure_from;
    // The ledger frees the slot before the call: the service frees it later, so
    // the bench never counts fewer slots than the service holds.
    let (rpc, result) = if item.refund {
        shared.ledger.refunded(&item, held);
        (Rpc::Refund, shared.target.refund(&id).await)
    } else {
        shared.ledger.committed(&item, held);
        let tier = &shared.workload.tiers[item.tier];
        let r = shared.target.commit(&item, tier, &id).await;
        (Rpc::Commit, r)
    };
    shared.stats.record(rpc, started.elapsed(), measured);
    if let Err(code) = result {
        shared.stats.error(rpc, code);
    }
}
