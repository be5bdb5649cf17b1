//! Synthetic flows that mimic the traffic of DP/PP training jobs, with ground truth,
//! for tests, examples and benchmarks (no I/O, deterministic for a seed).
//!
//! Layout: job `j` runs `dp × pp` machines, one per (replica d, stage s), each with
//! `tp` GPUs/NICs; tensor parallelism stays inside a machine (invisible), so the
//! network sees, per TP lane t, PP send/recv between (d, s, t) and (d, s+1, t) and a
//! ring all-reduce among (·, s, t) — i.e. `tp` cross-machine clusters over the same
//! machines, which Algorithm 1 must merge.
//!
//! Schedules a job can follow (LLMPrism §IV-B/C must hold on each; the tests run
//! every combination):
//! - pipeline ([`PipelineSchedule`]): GPipe (`m` micro-batch forwards with
//!   activation sends s → s+1, then `m` backwards with gradient sends s+1 → s) or
//!   1F1B (each stage warms up with p−1−s forwards, then alternates one forward and
//!   one backward, then drains: stage-dependent timing, PP traffic spread over the
//!   step);
//! - data parallelism ([`DpSchedule`]): a ring all-reduce of each gradient bucket
//!   after the last backward (2(D−1) rounds of chunk flows of bucket/D bytes); DDP's
//!   bucketed all-reduce overlapping the last backward (bucket b leaves when the
//!   backward has produced it); or ZeRO: a reduce-scatter of each bucket after the
//!   backward, the optimizer on the shard, then an all-gather of the parameters
//!   (two DP phases per step, D−1 rounds each);
//! - ring chunks of varying size (`chunk_spread`), an optimizer gap, a checkpoint
//!   gap every `checkpoint_every` steps, compute and bandwidth jitter, and the
//!   faults of [`Fault`] (a slow step among them).
//!
//! The next step starts when every DP group is done. Ground truth step end of a
//! rank = end of its DP group's last DP flow of the step.
//!
//! Machines hang under leaf switches (`machines_per_leaf` each) joined by one spine;
//! a flow's path is `[leaf]` or `[leaf_a, spine, leaf_b]`.

#![allow(clippy::needless_range_loop)] // index loops mirror the (stage, micro-batch) schedule

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use whyslow_model::rng::SplitMix64;

use whyslow_model::flow::{FlowRecord, PairType};
use whyslow_model::topology::{Machine, Switch, Topology};

/// One synthetic job.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthJob {
    /// Data-parallel degree.
    pub dp: usize,
    /// Pipeline stages.
    pub pp: usize,
    /// GPUs (NIC addresses) per machine = tensor-parallel degree.
    pub tp: usize,
    /// Training steps.
    pub steps: usize,
    /// Micro-batches per step.
    pub microbatches: usize,
    /// Forward compute per micro-batch per stage, µs.
    pub fwd_us: u64,
    /// Backward compute per micro-batch per stage, µs.
    pub bwd_us: u64,
    /// Bytes of one activation / gradient PP message.
    pub pp_bytes: u64,
    /// Gradient bucket sizes all-reduced per DP group per step.
    pub dp_buckets: Vec<u64>,
    /// Optimizer time after the all-reduce (ZeRO: between reduce-scatter and
    /// all-gather), µs.
    pub optimizer_us: u64,
    /// Pipeline schedule.
    pub schedule: PipelineSchedule,
    /// Data-parallel communication schedule.
    pub dp_schedule: DpSchedule,
    /// Relative spread of ring chunk sizes (uniform ±; 0 = every chunk bucket/D).
    pub chunk_spread: f64,
    /// A checkpoint every this many steps (0 = never)…
    pub checkpoint_every: usize,
    /// …stalls the job this long before the next step, µs.
    pub checkpoint_us: u64,
    /// The first step's compute is this many times longer (compilation, cache
    /// and allocator warm-up); 1 (or 0) = like the others.
    pub warmup_factor: f64,
    /// An evaluation pass after every this many steps (0 = never): …
    pub eval_every: usize,
    /// …of this many forward-only micro-batches through the pipeline
    /// (activation sends only, no DP traffic).
    pub eval_microbatches: usize,
    /// Compute of each stage relative to `fwd_us`/`bwd_us` (the first stage
    /// holds the embedding, the last the loss head); empty = all 1.
    pub stage_compute: Vec<f64>,
    /// DP bytes of each stage's groups relative to `dp_buckets` (embedding and
    /// output layer parameters); empty = all 1.
    pub stage_dp_bytes: Vec<f64>,
    /// Compute grows linearly by this fraction from the first step to the
    /// last (step-to-step drift); 0 = none.
    pub drift: f64,
}

/// Order of micro-batch forwards and backwards on the pipeline stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PipelineSchedule {
    /// All forwards, then all backwards.
    #[default]
    GPipe,
    /// One forward, one backward (PipeDream-Flush / Megatron's default).
    OneFOneB,
}

/// When the data-parallel collectives of a step run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DpSchedule {
    /// Ring all-reduce of every bucket after the last backward.
    #[default]
    AllReduceAfterBackward,
    /// DDP: each bucket's all-reduce starts when the last backward has produced it.
    OverlappedBuckets,
    /// ZeRO: reduce-scatter after the backward, optimizer, then all-gather.
    ZeroReduceScatterAllGather,
}

impl Default for SynthJob {
    fn default() -> Self {
        SynthJob {
            dp: 4,
            pp: 2,
            tp: 2,
            steps: 20,
            microbatches: 4,
            fwd_us: 20_000,
            bwd_us: 40_000,
            pp_bytes: 8 << 20,
            dp_buckets: vec![25 << 20, 25 << 20, 12 << 20],
            optimizer_us: 10_000,
            schedule: PipelineSchedule::GPipe,
            dp_schedule: DpSchedule::AllReduceAfterBackward,
            chunk_spread: 0.0,
            checkpoint_every: 0,
            checkpoint_us: 0,
            warmup_factor: 1.0,
            eval_every: 0,
            eval_microbatches: 0,
            stage_compute: Vec::new(),
            stage_dp_bytes: Vec::new(),
            drift: 0.0,
        }
    }
}

/// Factor of stage `s` in a per-stage list (1 where the list is short).
fn stage_factor(v: &[f64], s: usize) -> f64 {
    v.get(s).copied().unwrap_or(1.0)
}

/// Times indexed `[stage][micro-batch]`, µs.
type StageTimes = Vec<Vec<u64>>;

/// Per micro-batch compute end times of one step: `(fwd_end, bwd_start, bwd_end)`,
/// from the step's start `t0`; `dur(fwd, stage)` draws one compute time.
fn pipeline_times(
    schedule: PipelineSchedule,
    p: usize,
    m: usize,
    t0: u64,
    mut dur: impl FnMut(bool, usize) -> u64,
) -> (StageTimes, StageTimes, StageTimes) {
    // Per stage, its operations in order: (is_forward, micro-batch).
    let order: Vec<Vec<(bool, usize)>> = (0..p)
        .map(|s| match schedule {
            PipelineSchedule::GPipe => (0..m)
                .map(|i| (true, i))
                .chain((0..m).map(|i| (false, i)))
                .collect(),
            PipelineSchedule::OneFOneB => {
                let warm = (p - 1 - s).min(m);
                let mut ops: Vec<(bool, usize)> = (0..warm).map(|i| (true, i)).collect();
                let (mut f, mut b) = (warm, 0);
                while b < m {
                    if f < m {
                        ops.push((true, f));
                        f += 1;
                    }
                    ops.push((false, b));
                    b += 1;
                }
                ops
            }
        })
        .collect();
    const UNSET: u64 = u64::MAX;
    let mut fwd_end = vec![vec![UNSET; m]; p];
    let mut bwd_start = vec![vec![UNSET; m]; p];
    let mut bwd_end = vec![vec![UNSET; m]; p];
    let mut next = vec![0usize; p];
    let mut free = vec![t0; p];
    // Each pass runs every stage's next operations whose inputs are ready; the
    // schedules are deadlock-free, so every pass makes progress.
    while (0..p).any(|s| next[s] < order[s].len()) {
        for s in 0..p {
            while next[s] < order[s].len() {
                let (fwd, i) = order[s][next[s]];
                let ready = if fwd {
                    if s == 0 {
                        t0
                    } else {
                        fwd_end[s - 1][i]
                    }
                } else if s == p - 1 {
                    fwd_end[s][i]
                } else {
                    bwd_end[s + 1][i]
                };
                if ready == UNSET {
                    break;
                }
                let start = ready.max(free[s]);
                let end = start + dur(fwd, s);
                if fwd {
                    fwd_end[s][i] = end;
                } else {
                    bwd_start[s][i] = start;
                    bwd_end[s][i] = end;
                }
                free[s] = end;
                next[s] += 1;
            }
        }
    }
    (fwd_end, bwd_start, bwd_end)
}

/// An injected performance problem.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Compute of one step of one job is `factor` times slower.
    SlowStep {
        /// Job index.
        job: usize,
        /// Step index.
        step: usize,
        /// Slowdown factor.
        factor: f64,
    },
    /// The DP flows of one DP group (stage, TP lane) get `1/factor` of the bandwidth.
    SlowDpGroup {
        /// Job index.
        job: usize,
        /// Pipeline stage.
        stage: usize,
        /// TP lane.
        lane: usize,
        /// Slowdown factor.
        factor: f64,
    },
    /// Every flow through this switch gets `1/factor` of the bandwidth.
    ThrottledSwitch {
        /// Switch name.
        name: String,
        /// Slowdown factor.
        factor: f64,
    },
}

/// A synthetic cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthCluster {
    /// Jobs.
    pub jobs: Vec<SynthJob>,
    /// Machines under one leaf switch.
    pub machines_per_leaf: usize,
    /// Link bandwidth, Gb/s.
    pub link_gbps: f64,
    /// Relative jitter of compute times and bandwidth (uniform ±).
    pub jitter: f64,
    /// Probability that a PP message is accompanied by a small noise flow of random size.
    pub noise: f64,
    /// Seed.
    pub seed: u64,
    /// Time of the first step, µs.
    pub start_us: u64,
    /// Injected faults.
    pub faults: Vec<Fault>,
}

impl Default for SynthCluster {
    fn default() -> Self {
        SynthCluster {
            jobs: vec![SynthJob::default()],
            machines_per_leaf: 2,
            link_gbps: 100.0,
            jitter: 0.02,
            noise: 0.0,
            seed: 1,
            start_us: 1_700_000_000_000_000,
            faults: Vec::new(),
        }
    }
}

/// Ground truth of a synthetic cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Truth {
    /// Addresses of each job, sorted.
    pub jobs: Vec<Vec<IpAddr>>,
    /// Each communicating pair (lower address first) and its type.
    pub pairs: BTreeMap<(IpAddr, IpAddr), PairType>,
    /// Step end times of each address.
    pub step_ends: BTreeMap<IpAddr, Vec<u64>>,
    /// The capture window `(from, to)` in µs when the flows were clipped to
    /// one ([`Synth::clip`]).
    pub capture: Option<(u64, u64)>,
}

/// Generated flows, topology and truth.
#[derive(Debug, Clone)]
pub struct Synth {
    /// Flow records, sorted by start (one record per flow, full switch path).
    pub records: Vec<FlowRecord>,
    /// Topology of the machines and switches.
    pub topology: Topology,
    /// Ground truth.
    pub truth: Truth,
}

/// Generate the cluster's flows.
pub fn generate(c: &SynthCluster) -> Synth {
    let mut rng = SplitMix64::new(c.seed);
    let mut machines = Vec::new();
    let mut leaf_of_machine = Vec::new();
    let mut truth = Truth::default();
    let mut records = Vec::new();
    // Address of (job, d, s, t).
    // Up to 255 jobs, 254 machines per job and 254 NICs per machine.
    let addr = |j: usize, m: usize, t: usize| {
        IpAddr::V4(Ipv4Addr::new(
            10,
            j as u8,
            (m % 254 + 1) as u8,
            (t % 254 + 1) as u8,
        ))
    };
    let mut gm = 0usize;
    let mut job_machine0 = Vec::new();
    for (j, job) in c.jobs.iter().enumerate() {
        job_machine0.push(gm);
        let mut members = Vec::new();
        for d in 0..job.dp {
            for s in 0..job.pp {
                let m = d * job.pp + s;
                let addrs: Vec<IpAddr> = (0..job.tp).map(|t| addr(j, m, t)).collect();
                members.extend_from_slice(&addrs);
                let leaf = format!("leaf{}", gm / c.machines_per_leaf.max(1));
                machines.push(Machine {
                    name: format!("j{j}-d{d}-s{s}"),
                    addresses: addrs,
                    switch: Some(leaf.clone()),
                });
                leaf_of_machine.push(leaf);
                gm += 1;
            }
        }
        members.sort();
        truth.jobs.push(members);
    }
    let mut leaves: Vec<String> = leaf_of_machine.clone();
    leaves.dedup();
    let mut switches: Vec<Switch> = leaves
        .iter()
        .map(|l| Switch {
            name: l.clone(),
            links: vec!["spine".into()],
            exporters: vec![],
        })
        .collect();
    switches.push(Switch {
        name: "spine".into(),
        links: vec![],
        exporters: vec![],
    });
    let topology = Topology::new(machines, switches).expect("synthetic addresses are unique");

    let throttle = |path: &[String]| -> f64 {
        let mut f = 1.0;
        for fault in &c.faults {
            if let Fault::ThrottledSwitch { name, factor } = fault {
                if path.iter().any(|p| p == name) {
                    f *= factor.max(1e-3);
                }
            }
        }
        f
    };
    for (j, job) in c.jobs.iter().enumerate() {
        let m0 = job_machine0[j];
        let path = |ma: usize, mb: usize| -> Vec<String> {
            let (la, lb) = (&leaf_of_machine[m0 + ma], &leaf_of_machine[m0 + mb]);
            if la == lb {
                vec![la.clone()]
            } else {
                vec![la.clone(), "spine".into(), lb.clone()]
            }
        };
        let mut t0 = c.start_us;
        let emit = |records: &mut Vec<FlowRecord>,
                    rng: &mut SplitMix64,
                    start: u64,
                    ma: usize,
                    mb: usize,
                    t: usize,
                    bytes: u64,
                    slow: f64|
         -> u64 {
            let p = path(ma, mb);
            let bw = c.link_gbps / (throttle(&p) * slow) * (1.0 + c.jitter * rng.symmetric());
            let dur = ((bytes as f64 * 8.0) / (bw * 1e3)).max(1.0) as u64;
            let (src, dst) = (addr(j, ma, t), addr(j, mb, t));
            let mut r = FlowRecord::new(start, src, dst, bytes, dur);
            r.src_port = Some(40_000 + (ma % 1000) as u16);
            r.dst_port = Some(29_500 + (mb % 1000) as u16);
            r.proto = Some(6);
            r.switches = p.into();
            records.push(r);
            dur
        };
        for k in 0..job.steps {
            let slow_step: f64 = c
                .faults
                .iter()
                .map(|f| match f {
                    Fault::SlowStep {
                        job: fj,
                        step,
                        factor,
                    } if *fj == j && *step == k => *factor,
                    _ => 1.0,
                })
                .product();
            let jit = |rng: &mut SplitMix64, us: u64| {
                ((us as f64) * slow_step * (1.0 + c.jitter * rng.symmetric())) as u64
            };
            let (m, p) = (job.microbatches, job.pp);
            // Warm-up and drift scale this step's compute, `stage_compute` each
            // stage's (exactly 1 when unset: the draws stay those of before).
            let mut step_compute = 1.0;
            if k == 0 && job.warmup_factor > 0.0 {
                step_compute *= job.warmup_factor;
            }
            if job.steps > 1 {
                step_compute *= 1.0 + job.drift * k as f64 / (job.steps - 1) as f64;
            }
            let compute = |fwd: bool, s: usize| {
                let base = if fwd { job.fwd_us } else { job.bwd_us };
                (base as f64 * step_compute * stage_factor(&job.stage_compute, s)) as u64
            };
            let (fwd_end, bwd_start, bwd_end) = pipeline_times(job.schedule, p, m, t0, |fwd, s| {
                jit(&mut rng, compute(fwd, s))
            });
            let stage_done: Vec<u64> = (0..p)
                .map(|s| bwd_end[s].iter().copied().max().unwrap_or(t0))
                .collect();
            for d in 0..job.dp {
                for t in 0..job.tp {
                    for s in 0..p.saturating_sub(1) {
                        let (ma, mb) = (d * p + s, d * p + s + 1);
                        for i in 0..m {
                            emit(
                                &mut records,
                                &mut rng,
                                fwd_end[s][i],
                                ma,
                                mb,
                                t,
                                job.pp_bytes,
                                1.0,
                            );
                            emit(
                                &mut records,
                                &mut rng,
                                bwd_end[s + 1][i],
                                mb,
                                ma,
                                t,
                                job.pp_bytes,
                                1.0,
                            );
                            for (start, a, b) in
                                [(fwd_end[s][i], ma, mb), (bwd_end[s + 1][i], mb, ma)]
                            {
                                if c.noise > 0.0 && rng.unit() < c.noise {
                                    let sz = 64 + rng.next_u64() % 4096;
                                    emit(&mut records, &mut rng, start + 50, a, b, t, sz, 1.0);
                                }
                            }
                        }
                    }
                }
            }
            // DP ring all-reduce per group (stage s, lane t).
            let mut job_end = 0u64;
            for s in 0..p {
                for t in 0..job.tp {
                    let slow: f64 = c
                        .faults
                        .iter()
                        .map(|f| match f {
                            Fault::SlowDpGroup {
                                job: fj,
                                stage,
                                lane,
                                factor,
                            } if *fj == j && *stage == s && *lane == t => *factor,
                            _ => 1.0,
                        })
                        .product();
                    let mut clock = stage_done[s] + 200;
                    let last_bwd = (bwd_start[s][m - 1], bwd_end[s][m - 1]);
                    let nb = job.dp_buckets.len().max(1) as u64;
                    let scale = stage_factor(&job.stage_dp_bytes, s);
                    let buckets: Vec<u64> = job
                        .dp_buckets
                        .iter()
                        .map(|&b| (b as f64 * scale) as u64)
                        .collect();
                    let spread = job.chunk_spread;
                    // One ring phase over `bucket`: `rounds` rounds of chunk flows.
                    let ring = |records: &mut Vec<FlowRecord>,
                                rng: &mut SplitMix64,
                                mut clock: u64,
                                bucket: u64,
                                rounds: usize|
                     -> u64 {
                        for _round in 0..rounds {
                            let mut round_end = clock;
                            for d in 0..job.dp {
                                let (ma, mb) = (d * p + s, ((d + 1) % job.dp) * p + s);
                                let chunk = ((bucket / job.dp as u64) as f64
                                    * (1.0 + spread * rng.symmetric()))
                                .max(1.0) as u64;
                                let dur = emit(records, rng, clock, ma, mb, t, chunk, slow);
                                round_end = round_end.max(clock + dur);
                            }
                            clock = round_end + 5;
                        }
                        clock
                    };
                    if job.dp >= 2 {
                        let rounds = job.dp - 1;
                        match job.dp_schedule {
                            DpSchedule::AllReduceAfterBackward => {
                                for &bucket in &buckets {
                                    clock = ring(&mut records, &mut rng, clock, bucket, 2 * rounds);
                                }
                            }
                            DpSchedule::OverlappedBuckets => {
                                clock = last_bwd.0;
                                for (b, &bucket) in buckets.iter().enumerate() {
                                    let produced = last_bwd.0
                                        + (last_bwd.1 - last_bwd.0) * (b as u64 + 1) / nb;
                                    clock = ring(
                                        &mut records,
                                        &mut rng,
                                        clock.max(produced + 100),
                                        bucket,
                                        2 * rounds,
                                    );
                                }
                            }
                            DpSchedule::ZeroReduceScatterAllGather => {
                                for &bucket in &buckets {
                                    clock = ring(&mut records, &mut rng, clock, bucket, rounds);
                                }
                                clock += jit(&mut rng, job.optimizer_us);
                                for &bucket in &buckets {
                                    clock = ring(&mut records, &mut rng, clock, bucket, rounds);
                                }
                            }
                        }
                    }
                    let end = if job.dp >= 2 {
                        clock - 5
                    } else {
                        stage_done[s]
                    };
                    for d in 0..job.dp {
                        truth
                            .step_ends
                            .entry(addr(j, d * p + s, t))
                            .or_default()
                            .push(end);
                    }
                    job_end = job_end.max(end);
                }
            }
            t0 = job_end
                + match job.dp_schedule {
                    // ZeRO's optimizer ran between its two phases.
                    DpSchedule::ZeroReduceScatterAllGather => jit(&mut rng, 500),
                    _ => jit(&mut rng, job.optimizer_us),
                };
            if job.checkpoint_every > 0 && (k + 1) % job.checkpoint_every == 0 {
                t0 += jit(&mut rng, job.checkpoint_us);
            }
            if job.eval_every > 0
                && job.eval_microbatches > 0
                && (k + 1) % job.eval_every == 0
                && k + 1 < job.steps
            {
                // Evaluation: forward-only micro-batches down the pipeline.
                let me = job.eval_microbatches;
                let mut free = vec![t0; p];
                let mut done = vec![vec![t0; me]; p];
                for s in 0..p {
                    for i in 0..me {
                        let ready = if s == 0 { t0 } else { done[s - 1][i] };
                        let start = ready.max(free[s]);
                        done[s][i] = start + jit(&mut rng, compute(true, s));
                        free[s] = done[s][i];
                    }
                }
                for d in 0..job.dp {
                    for t in 0..job.tp {
                        for s in 0..p.saturating_sub(1) {
                            for i in 0..me {
                                let (ma, mb) = (d * p + s, d * p + s + 1);
                                emit(
                                    &mut records,
                                    &mut rng,
                                    done[s][i],
                                    ma,
                                    mb,
                                    t,
                                    job.pp_bytes,
                                    1.0,
                                );
                            }
                        }
                    }
                }
                t0 = free[p - 1] + jit(&mut rng, job.optimizer_us);
            }
        }
        // Truth pairs.
        for d in 0..job.dp {
            for t in 0..job.tp {
                for s in 0..job.pp {
                    let me = addr(j, d * job.pp + s, t);
                    if s + 1 < job.pp {
                        let o = addr(j, d * job.pp + s + 1, t);
                        truth.pairs.insert((me.min(o), me.max(o)), PairType::Pp);
                    }
                    if job.dp >= 2 {
                        let o = addr(j, ((d + 1) % job.dp) * job.pp + s, t);
                        truth.pairs.insert((me.min(o), me.max(o)), PairType::Dp);
                    }
                }
            }
        }
    }
    records.sort_by_key(|r| r.start_us);
    Synth {
        records,
        topology,
        truth,
    }
}

impl Synth {
    /// The flows a capture from `from_us` to `to_us` (absolute) saw: those
    /// starting in the window, a flow running past its end cut there (a
    /// collector exports what it has counted). A window not aligned with the
    /// steps cuts the first and last step short. The truth keeps every step
    /// end and records the window ([`Truth::capture`]).
    pub fn clip(&self, from_us: u64, to_us: u64) -> Synth {
        let records = self
            .records
            .iter()
            .filter(|r| r.start_us >= from_us && r.start_us < to_us)
            .map(|r| {
                let mut r = r.clone();
                if r.end_us() > to_us {
                    let keep = (to_us - r.start_us).max(1);
                    r.bytes =
                        (r.bytes as f64 * keep as f64 / r.dur_us.max(1) as f64).max(1.0) as u64;
                    r.dur_us = keep;
                }
                r
            })
            .collect();
        let mut truth = self.truth.clone();
        truth.capture = Some((from_us, to_us));
        Synth {
            records,
            topology: self.topology.clone(),
            truth,
        }
    }
}

impl Truth {
    /// Step ends of `a` inside the capture window (all of them without one):
    /// the steps a division of the captured flows can find are those between
    /// consecutive ends here.
    pub fn captured_ends(&self, a: &IpAddr) -> Vec<u64> {
        let ends = self.step_ends.get(a).map(Vec::as_slice).unwrap_or(&[]);
        match self.capture {
            Some((from, to)) => ends
                .iter()
                .copied()
                .filter(|&e| e >= from && e <= to)
                .collect(),
            None => ends.to_vec(),
        }
    }

    /// Whether `report` recognized the jobs and pair types exactly; the
    /// error says what differs.
    pub fn check_structure(&self, report: &whyslow_model::flow::FlowReport) -> Result<(), String> {
        let parse = |a: &str| a.parse::<IpAddr>().map_err(|e| format!("{a}: {e}"));
        let mut got = Vec::new();
        for j in &report.jobs {
            let mut m = j
                .members
                .iter()
                .map(|a| parse(a))
                .collect::<Result<Vec<_>, _>>()?;
            m.sort();
            got.push(m);
        }
        got.sort();
        let mut want = self.jobs.clone();
        want.sort();
        if got != want {
            return Err(format!("jobs: got {got:?}, want {want:?}"));
        }
        let mut pairs = BTreeMap::new();
        for p in &report.pairs {
            pairs.insert((parse(&p.src)?, parse(&p.dst)?), p.kind);
        }
        if pairs != self.pairs {
            return Err(format!("pair types: got {pairs:?}, want {:?}", self.pairs));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stage 0's PP traffic of one step: (time, is activation send 0 → 1).
    fn stage0_pp(schedule: PipelineSchedule) -> Vec<(u64, bool)> {
        let c = SynthCluster {
            jobs: vec![SynthJob {
                dp: 1,
                pp: 4,
                tp: 1,
                steps: 1,
                microbatches: 8,
                schedule,
                ..Default::default()
            }],
            jitter: 0.0,
            ..Default::default()
        };
        let s = generate(&c);
        let (a, b) = ("10.0.1.1".parse().unwrap(), "10.0.2.1".parse().unwrap());
        s.records
            .iter()
            .filter(|r| (r.src, r.dst) == (a, b) || (r.src, r.dst) == (b, a))
            .map(|r| (r.start_us, r.src == a))
            .collect()
    }

    #[test]
    fn warm_up_evaluation_and_a_capture_window() {
        let job = SynthJob {
            dp: 2,
            pp: 2,
            tp: 1,
            steps: 6,
            ..Default::default()
        };
        let plain = generate(&SynthCluster {
            jobs: vec![job.clone()],
            ..Default::default()
        });
        let c = SynthCluster {
            jobs: vec![SynthJob {
                warmup_factor: 5.0,
                eval_every: 3,
                eval_microbatches: 4,
                ..job
            }],
            ..Default::default()
        };
        let s = generate(&c);
        let a: IpAddr = "10.0.1.1".parse().unwrap();
        let (p, w) = (&plain.truth.step_ends[&a], &s.truth.step_ends[&a]);
        // The first step is longer; the evaluation after step 3 lengthens step 4.
        assert!(w[0] - c.start_us > 3 * (p[0] - c.start_us), "{p:?} {w:?}");
        assert!(w[3] - w[2] > (p[3] - p[2]) + 4 * 20_000, "{p:?} {w:?}");
        // 4 activation sends of the evaluation on the one PP pair per replica.
        assert_eq!(s.records.len(), plain.records.len() + 2 * 4);
        // A capture cut mid-run keeps the flows starting inside it, cut at its end.
        let (from, to) = (w[1] + 1_000, w[4] - 1_000);
        let cut = s.clip(from, to);
        assert!(cut
            .records
            .iter()
            .all(|r| r.start_us >= from && r.end_us() <= to));
        assert_eq!(cut.truth.captured_ends(&a), vec![w[2], w[3]]);
    }

    #[test]
    fn one_f_one_b_interleaves_what_gpipe_keeps_apart() {
        // GPipe: all 8 activations leave stage 0 before any gradient comes back.
        let g = stage0_pp(PipelineSchedule::GPipe);
        assert_eq!(g.len(), 16);
        assert!(
            g[..8].iter().all(|f| f.1) && g[8..].iter().all(|f| !f.1),
            "{g:?}"
        );
        // 1F1B: stage 0 warms up with 3 forwards, then the first gradient
        // arrives before its 5th activation leaves.
        let o = stage0_pp(PipelineSchedule::OneFOneB);
        assert_eq!(o.len(), 16);
        let first_grad = o.iter().position(|f| !f.1).unwrap();
        assert!(first_grad < 8, "{o:?}");
        // Same work, same step time with equal micro-batches (1F1B saves memory).
        assert_eq!(g.last().unwrap().0, o.last().unwrap().0);
    }
}
