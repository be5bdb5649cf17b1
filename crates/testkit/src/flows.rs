//! Synthetic flows that mimic the traffic of DP/PP training jobs, with ground truth,
//! for tests, examples and benchmarks (no I/O, deterministic for a seed).
//!
//! Layout: job `j` runs `dp × pp` machines, one per (replica d, stage s), each with
//! `tp` GPUs/NICs; tensor parallelism stays inside a machine (invisible), so the
//! network sees, per TP lane t, PP send/recv between (d, s, t) and (d, s+1, t) and a
//! ring all-reduce among (·, s, t) — i.e. `tp` cross-machine clusters over the same
//! machines, which Algorithm 1 must merge. Schedule per step (GPipe-like): `m`
//! micro-batch forwards (activation sends s → s+1), `m` backwards (gradient sends
//! s+1 → s), then per DP group a ring all-reduce of each gradient bucket (2(D−1)
//! rounds of chunk flows of bucket/D bytes), then the optimizer; the next step starts
//! when every DP group is done. Ground truth step end of a rank = end of its group's
//! all-reduce.
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
    /// Optimizer time after the all-reduce, µs.
    pub optimizer_us: u64,
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
        }
    }
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
            r.switches = p;
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
            let mut stage_done = vec![0u64; p];
            // Forward.
            let mut fwd_end = vec![vec![0u64; m]; p];
            for s in 0..p {
                for i in 0..m {
                    let ready = if s == 0 {
                        if i == 0 {
                            t0
                        } else {
                            fwd_end[0][i - 1]
                        }
                    } else {
                        fwd_end[s - 1][i].max(if i == 0 { 0 } else { fwd_end[s][i - 1] })
                    };
                    fwd_end[s][i] = ready + jit(&mut rng, job.fwd_us);
                }
            }
            let mut bwd_end = vec![vec![0u64; m]; p];
            for s in (0..p).rev() {
                for i in 0..m {
                    let ready = if s == p - 1 {
                        if i == 0 {
                            fwd_end[p - 1][m - 1]
                        } else {
                            bwd_end[s][i - 1]
                        }
                    } else {
                        bwd_end[s + 1][i].max(if i == 0 { 0 } else { bwd_end[s][i - 1] })
                    };
                    bwd_end[s][i] = ready + jit(&mut rng, job.bwd_us);
                }
                stage_done[s] = bwd_end[s][m - 1];
            }
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
                    if job.dp >= 2 {
                        for &bucket in &job.dp_buckets {
                            let chunk = (bucket / job.dp as u64).max(1);
                            for _round in 0..2 * (job.dp - 1) {
                                let mut round_end = clock;
                                for d in 0..job.dp {
                                    let (ma, mb) = (d * p + s, ((d + 1) % job.dp) * p + s);
                                    let dur =
                                        emit(&mut records, &mut rng, clock, ma, mb, t, chunk, slow);
                                    round_end = round_end.max(clock + dur);
                                }
                                clock = round_end + 5;
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
            t0 = job_end + jit(&mut rng, job.optimizer_us);
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
