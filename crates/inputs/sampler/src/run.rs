//! The sampling loop (background thread).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

use whyslow_model::{Resource, SampleSeries};

use crate::clock::{
    monotonic_ns, realtime_ns, sleep_until_monotonic, thread_cpu_ns, tighten_timer_slack,
};
use crate::cpu::{list_tids, CpuSource, ThreadClock};
use crate::cpufreq::{CpuFreqReader, CpuFreqStatus, CPU_FREQ_MAX_HZ};
use crate::gpu::{throttle_reason_names, GpuSampler, GpuStatus, GPU_SLOW_MAX_HZ};
use crate::net::NicCounter;
use crate::{ExtraSeries, InterfaceSeries, SamplerConfig, Samples, ThreadSeries};

fn push(s: &mut SampleSeries, ts: i64, v: f32) {
    s.ts_ns.push(ts);
    s.values.push(v);
}

/// Most samples one reading is spread over: a second's worth at 1 kHz.
const MAX_FILL: i64 = 1000;

/// Timestamps of the samples that stand for one reading over `[from, to]`:
/// one per sampling `period` it covers, at the midpoints of equal parts.
///
/// PerfTracker's μ and σ (§4.2, Eq. 4 and 5) weigh a span by its number of
/// samples, which is its length in time only when every sample covers one
/// period. A sampler kept off the CPU reads late, and one late reading then
/// covers many periods: written once it would count as one period, and
/// the short readings taken while the starved process does get the CPU would
/// outweigh it (measured: a spinner in a throttled cgroup with 8 busy loops
/// ran 0.061 of its busy phases, its in-process samples said 0.082).
fn fill_stamps(from: i64, to: i64, period: i64) -> impl Iterator<Item = i64> {
    let len = (to - from).max(0);
    let k = ((len + period / 2) / period.max(1)).clamp(1, MAX_FILL);
    (0..k).map(move |j| from + (len * (2 * j + 1)) / (2 * k))
}

/// `Samples::extra`, indexed by (kind, id).
#[derive(Default)]
struct Extra {
    index: HashMap<(&'static str, u32), usize>,
}

impl Extra {
    fn push(&mut self, out: &mut Samples, kind: &'static str, id: u32, ts: i64, v: f32) {
        let i = *self.index.entry((kind, id)).or_insert_with(|| {
            out.extra.push(ExtraSeries {
                kind: kind.to_string(),
                id: id.to_string(),
                series: SampleSeries::default(),
            });
            out.extra.len() - 1
        });
        push(&mut out.extra[i].series, ts, v);
    }
}

/// Every how many ticks a counter limited to `max_hz` is read at `rate_hz`.
fn every(rate_hz: f64, max_hz: f64) -> u64 {
    (rate_hz / max_hz).ceil().max(1.0) as u64
}

struct Cpu {
    pid: i32,
    training_tid: i32,
    all: bool,
    prefer: CpuSource,
    /// Open threads and their index in `Samples::threads`.
    open: Vec<(ThreadClock, usize)>,
    known: HashSet<i32>,
    coarse_noted: bool,
    training_gone_noted: bool,
}

impl Cpu {
    fn rescan(&mut self, out: &mut Samples) {
        let tids = if self.all {
            list_tids(self.pid)
        } else {
            vec![self.training_tid]
        };
        for tid in tids {
            if !self.known.insert(tid) {
                continue;
            }
            let Some(tc) = ThreadClock::open(self.pid, tid, self.prefer) else {
                continue;
            };
            if tc.source() == CpuSource::StatTicks && !self.coarse_noted {
                self.coarse_noted = true;
                out.notes.push(format!(
                    "cpu: /proc/{}/task/*/schedstat unreadable: using stat ticks ({} Hz), \
                     utilization is quantized to {} ms",
                    self.pid,
                    crate::cpu::user_hz(),
                    1000 / crate::cpu::user_hz()
                ));
            }
            out.threads.push(ThreadSeries {
                tid,
                name: tc.name.clone(),
                training: tid == self.training_tid,
                series: SampleSeries::default(),
            });
            self.open.push((tc, out.threads.len() - 1));
        }
    }

    /// Reads every thread's CPU time. Each value covers the time between
    /// that thread's own reads and is stamped at its midpoint (`to_trace`
    /// maps monotonic ns onto the trace clock): a sampler preempted between
    /// its tick and the reads would otherwise put a short interval's value
    /// under a long one's stamp (measured on a loaded 2-core VM: a spinner
    /// at 0.42 of a CPU read as 0.59).
    /// A reading that covers several sampling periods (the sampler ran late)
    /// is written as one sample per period ([`fill_stamps`]).
    fn sample(&mut self, out: &mut Samples, dt: i64, period: i64, to_trace: impl Fn(i64) -> i64) {
        let mut training_seen = false;
        let training_tid = self.training_tid;
        let mut cpu_value = None;
        self.open.retain_mut(|(tc, idx)| {
            let Some(ns) = tc.read_ns() else {
                return false; // exited: drop silently
            };
            let at = monotonic_ns();
            let prev = tc.last_read_at.replace(at).unwrap_or(at - dt);
            let u = tc.utilization(ns, at - prev);
            for ts in fill_stamps(prev, at, period) {
                push(&mut out.threads[*idx].series, to_trace(ts), u);
            }
            if tc.tid == training_tid {
                training_seen = true;
                cpu_value = Some((prev, at, u));
            }
            true
        });
        if let Some((prev, at, u)) = cpu_value {
            let s = out.series.entry(Resource::Cpu).or_default();
            for ts in fill_stamps(prev, at, period) {
                push(s, to_trace(ts), u);
            }
        }
        if !training_seen && !self.training_gone_noted && self.known.contains(&training_tid) {
            self.training_gone_noted = true;
            out.notes.push(format!(
                "cpu: training thread {training_tid} of process {} is gone",
                self.pid
            ));
        }
    }
}

/// Longest single sleep, so that a stop request is seen within 10 ms.
const STOP_POLL_NS: i64 = 10_000_000;

pub(crate) fn run(cfg: SamplerConfig, stop: &AtomicBool) -> Samples {
    tighten_timer_slack();
    let mut out = Samples::default();
    out.stats.rate_hz = cfg.rate_hz;
    let period = ((1e9 / cfg.rate_hz).round() as i64).max(1);
    let offset = cfg.time_base.offset_ns();

    let mut cpu = open_cpu(&cfg, &mut out);
    let mut extra = Extra::default();
    let mut freq = open_freq(&cfg, cpu.as_ref(), &mut out);
    let freq_every = every(cfg.rate_hz, CPU_FREQ_MAX_HZ);
    let gpu_slow_every = every(cfg.rate_hz, GPU_SLOW_MAX_HZ);

    let mut nics = open_nics(&cfg, &mut out);
    let mut gpu = open_gpu(&cfg, &mut out);

    let cpu0 = thread_cpu_ns();
    let start = monotonic_ns();
    let mut prev_mono = start;
    let mut prev_real = realtime_ns();
    let mut next = start + period;
    let mut last_rescan = start;
    let rescan_ns = cfg.thread_rescan.as_nanos().min(i64::MAX as u128) as i64;

    while !stop.load(Ordering::Acquire) {
        if out.stats.ticks as usize >= cfg.max_ticks {
            out.notes.push(format!(
                "stopped recording after max_ticks = {}",
                cfg.max_ticks
            ));
            break;
        }
        if !wait_for_tick(next, stop) {
            break;
        }
        let mono = monotonic_ns();
        let real = realtime_ns();
        if mono > next + period {
            out.stats.overruns += 1;
            next = mono + period;
        } else {
            next += period;
        }
        let dt = mono - prev_mono;
        if dt <= 0 {
            continue;
        }
        // Midpoint of the interval the sample stands for, on the trace clock.
        let ts = prev_real + (real - prev_real) / 2 - offset;

        if let Some(c) = cpu.as_mut() {
            c.sample(&mut out, dt, period, |m| m + (real - mono) - offset);
        }

        sample_nics(&mut nics, &mut out, dt, (prev_real, real), period, offset);

        if let Some(f) = freq.as_mut() {
            if out.stats.ticks % freq_every == 0 {
                if let Some((core, v)) = f.sample() {
                    extra.push(&mut out, "cpu_freq", core, ts, v);
                }
            }
        }

        if let Some(g) = gpu.as_mut() {
            let reading = g.sample(dt, out.stats.ticks % gpu_slow_every == 0);
            for (r, v) in reading.resources {
                push(out.series.entry(r).or_default(), ts, v);
            }
            let id = g.index();
            for (kind, v) in reading.extra {
                extra.push(&mut out, kind, id, ts, v);
            }
        }

        prev_mono = mono;
        prev_real = real;
        out.stats.ticks += 1;

        if let Some(c) = cpu.as_mut() {
            if mono - last_rescan >= rescan_ns {
                last_rescan = mono;
                if !crate::cpu::task_dir(c.pid).is_dir() {
                    out.notes.push(format!("cpu: process {} exited", c.pid));
                    cpu = None;
                } else {
                    c.rescan(&mut out);
                }
            }
        }
    }
    if let Some(g) = gpu.as_ref() {
        gpu_notes(g, &mut out);
    }
    out.stats.elapsed_ns = prev_mono - start;
    out.stats.sampler_cpu_ns = thread_cpu_ns() - cpu0;
    out
}

/// The training process's CPU reader, its threads scanned once.
fn open_cpu(cfg: &SamplerConfig, out: &mut Samples) -> Option<Cpu> {
    let mut cpu = cfg.pid.map(|pid| Cpu {
        pid,
        training_tid: cfg.training_tid.unwrap_or(pid),
        all: cfg.all_threads,
        prefer: cfg.cpu_source,
        open: Vec::new(),
        known: HashSet::new(),
        coarse_noted: false,
        training_gone_noted: false,
    });
    if let Some(c) = cpu.as_mut() {
        c.rescan(out);
        if !c.known.contains(&c.training_tid) {
            out.notes.push(format!(
                "cpu: training thread {} not found in process {}",
                c.training_tid, c.pid
            ));
        }
    }

    cpu
}

/// The training thread's core frequency reader, when asked for and
/// readable; `out.cpu_freq` says which.
fn open_freq(cfg: &SamplerConfig, cpu: Option<&Cpu>, out: &mut Samples) -> Option<CpuFreqReader> {
    let mut freq = None;
    out.cpu_freq = match cpu {
        Some(c) if cfg.cpu_freq => {
            let stat = crate::cpu::task_dir(c.pid)
                .join(c.training_tid.to_string())
                .join("stat");
            match CpuFreqReader::open(&stat, std::path::Path::new("/sys/devices/system/cpu")) {
                Ok(r) => {
                    freq = Some(r);
                    CpuFreqStatus::Sampling
                }
                Err(why) => {
                    out.notes.push(why.clone());
                    CpuFreqStatus::NotAvailable(why)
                }
            }
        }
        _ => CpuFreqStatus::NotRequested,
    };
    freq
}

/// A counter per interface asked for, each with its series in `out`.
fn open_nics(cfg: &SamplerConfig, out: &mut Samples) -> Vec<(NicCounter, usize)> {
    let mut nics: Vec<(NicCounter, usize)> = Vec::new();
    for iface in &cfg.interfaces {
        match NicCounter::open(iface) {
            Ok(c) => {
                out.interfaces.push(InterfaceSeries {
                    name: c.name.clone(),
                    ..Default::default()
                });
                nics.push((c, out.interfaces.len() - 1));
            }
            Err(note) => out.notes.push(note),
        }
    }

    nics
}

/// The GPU sampler, when asked for and available; `out.gpu` says which.
fn open_gpu(cfg: &SamplerConfig, out: &mut Samples) -> Option<GpuSampler> {
    let mut gpu = None;
    out.gpu = if cfg.gpu {
        match GpuSampler::open(cfg.gpu_index) {
            Ok(g) => {
                let st = GpuStatus::Sampling {
                    name: g.name().to_string(),
                    notes: g.notes().to_vec(),
                };
                gpu = Some(g);
                st
            }
            Err(why) => GpuStatus::NotAvailable(why),
        }
    } else {
        GpuStatus::NotRequested
    };

    gpu
}

/// Sleeps until `next` (monotonic ns) in slices of at most
/// [`STOP_POLL_NS`], so that stop() returns promptly at low rates (1 Hz);
/// `false` when a stop came first.
fn wait_for_tick(next: i64, stop: &AtomicBool) -> bool {
    loop {
        let now = monotonic_ns();
        if now >= next {
            return true;
        }
        if stop.load(Ordering::Acquire) {
            return false;
        }
        sleep_until_monotonic(next.min(now + STOP_POLL_NS));
    }
}

/// Each interface's tx/rx over the last `dt`, on every stamp of the
/// interval, and the busiest of them as the NIC resource.
fn sample_nics(
    nics: &mut [(NicCounter, usize)],
    out: &mut Samples,
    dt: i64,
    (prev_real, real): (i64, i64),
    period: i64,
    offset: i64,
) {
    if !nics.is_empty() {
        let mut any = false;
        let mut max = 0f32;
        for (c, idx) in nics.iter_mut() {
            if let Some((tx, rx)) = c.sample(dt) {
                let s = &mut out.interfaces[*idx];
                for t in fill_stamps(prev_real, real, period) {
                    push(&mut s.tx, t - offset, tx);
                    push(&mut s.rx, t - offset, rx);
                }
                max = max.max(tx.max(rx));
                any = true;
            }
        }
        if any {
            let s = out.series.entry(Resource::Nic).or_default();
            for t in fill_stamps(prev_real, real, period) {
                push(s, t - offset, max);
            }
        }
    }
}

/// What the GPU saw over the run: clock throttle reasons, the PCIe note.
fn gpu_notes(g: &GpuSampler, out: &mut Samples) {
    let seen = throttle_reason_names(g.throttle_seen());
    if !seen.is_empty() {
        out.notes.push(format!(
            "gpu {}: clock throttle reasons seen: {}",
            g.index(),
            seen.join(", ")
        ));
    }
    if let Some(n) = g.pcie_note() {
        out.notes.push(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_reading_stands_for_every_period_it_covers() {
        // On time: one sample at the midpoint.
        assert_eq!(
            fill_stamps(1_000, 2_000, 1_000).collect::<Vec<_>>(),
            [1_500]
        );
        // A little early or late still counts once.
        assert_eq!(fill_stamps(1_000, 2_400, 1_000).count(), 1);
        assert_eq!(fill_stamps(1_000, 1_300, 1_000).count(), 1);
        // Five periods late: five samples, evenly spread over the reading.
        assert_eq!(
            fill_stamps(0, 5_000, 1_000).collect::<Vec<_>>(),
            [500, 1_500, 2_500, 3_500, 4_500]
        );
        // Stalled for a minute: at most a second's worth at 1 kHz.
        let stamps: Vec<i64> = fill_stamps(0, 60_000_000_000, 1_000_000).collect();
        assert_eq!(stamps.len() as i64, MAX_FILL);
        assert!(stamps.windows(2).all(|w| w[0] < w[1]));
        assert!(*stamps.last().unwrap() < 60_000_000_000);
        // An empty or reversed interval still gives its one value a stamp.
        assert_eq!(fill_stamps(7, 7, 1_000).collect::<Vec<_>>(), [7]);
        assert_eq!(fill_stamps(9, 7, 1_000).collect::<Vec<_>>(), [9]);
    }
}
