//! The waterline and the temporal baseline (SysOM-AI §3.1) on synthetic
//! profiles whose samples are drawn at random from known shares: what was
//! injected is found, first; healthy groups and unchanged periods, drawn
//! again with other seeds, stay silent.

use std::collections::BTreeMap;

use whyslow_diagnose::{function_of, regressions, waterline, Config, Shares};
use whyslow_model::rng::SplitMix64;
use whyslow_model::stack::{Frame, FrameKind, StackProfile, StackProfileBuilder};

fn py(name: &str) -> Frame {
    Frame {
        kind: FrameKind::Python,
        name: Some(name.to_string()),
        module: Some("train.py".to_string()),
        build_id: None,
        offset: 0,
        line: Some(10),
    }
}

fn native(name: &str) -> Frame {
    Frame {
        kind: FrameKind::Native,
        name: Some(name.to_string()),
        module: Some("/usr/lib/libtorch_cpu.so".to_string()),
        build_id: None,
        offset: 0,
        line: None,
    }
}

/// `samples` samples drawn from `paths` (stacks of names, root first; a name
/// starting with `k:` is a kernel frame, `n:` native, else Python) weighted by
/// their shares.
fn draw(paths: &[(&[&str], f64)], samples: u64, rng: &mut SplitMix64) -> StackProfile {
    let mut b = StackProfileBuilder::new();
    let total: f64 = paths.iter().map(|p| p.1).sum();
    for _ in 0..samples {
        let mut x = rng.unit() * total;
        let mut pick = paths.len() - 1;
        for (i, p) in paths.iter().enumerate() {
            if x < p.1 {
                pick = i;
                break;
            }
            x -= p.1;
        }
        let mut ids = vec![b.frame(Frame::label("MainThread"))];
        for n in paths[pick].0 {
            let f = if let Some(k) = n.strip_prefix("k:") {
                Frame {
                    kind: FrameKind::Kernel,
                    name: Some(k.to_string()),
                    module: Some("[kernel]".into()),
                    build_id: None,
                    offset: 0,
                    line: None,
                }
            } else if let Some(c) = n.strip_prefix("n:") {
                native(c)
            } else {
                py(n)
            };
            ids.push(b.frame(f));
        }
        b.add(ids, 1);
    }
    b.finish(99.0, 0, 1)
}

const HEALTHY: &[(&[&str], f64)] = &[
    (
        &["main", "train_step", "forward", "n:at::native::addmm"],
        0.45,
    ),
    (
        &["main", "train_step", "backward", "n:at::native::mm"],
        0.35,
    ),
    (&["main", "train_step", "optimizer_step"], 0.12),
    (&["main", "load_batch", "k:__x64_sys_read"], 0.08),
];

#[test]
fn a_new_per_iteration_call_is_the_first_regression() {
    for seed in 0..10 {
        for (cost, samples) in [(0.05, 3000), (0.2, 1500), (0.5, 800)] {
            let mut rng = SplitMix64::new(seed);
            let before = draw(HEALTHY, samples, &mut rng);
            let mut after_paths = HEALTHY.to_vec();
            after_paths.push((
                &[
                    "main",
                    "train_step",
                    "log_tensor_stats",
                    "n:at::native::std_var",
                ],
                cost,
            ));
            let after = draw(&after_paths, samples, &mut rng);
            let r = regressions(
                "job",
                &Shares::of([&before]),
                &Shares::of([&after]),
                &Config::default(),
            );
            assert!(!r.is_empty(), "seed {seed}, cost {cost}: nothing found");
            assert_eq!(
                r[0].function, "log_tensor_stats (train.py)",
                "seed {seed}: {r:#?}"
            );
            assert_eq!(
                r[0].stack,
                "main (train.py);train_step (train.py);log_tensor_stats (train.py)"
            );
            assert!(
                r[0].before_share == 0.0 && r[0].after_share > 0.03,
                "{:?}",
                r[0]
            );
            // Only the new path (and, by a hair, its callers) rose.
            for x in &r {
                assert!(
                    [
                        "log_tensor_stats (train.py)",
                        "at::native::std_var",
                        "train_step (train.py)"
                    ]
                    .contains(&x.function.as_str()),
                    "seed {seed}: stray {x:?}"
                );
            }
        }
    }
}

#[test]
fn an_unchanged_job_has_no_regression() {
    for seed in 0..40 {
        for samples in [300, 2000, 20_000] {
            let mut rng = SplitMix64::new(1000 + seed);
            let before = draw(HEALTHY, samples, &mut rng);
            let after = draw(HEALTHY, samples, &mut rng);
            let r = regressions(
                "job",
                &Shares::of([&before]),
                &Shares::of([&after]),
                &Config::default(),
            );
            assert!(r.is_empty(), "seed {seed}, {samples} samples: {r:#?}");
        }
    }
    // Too few samples to judge.
    let mut rng = SplitMix64::new(5);
    let tiny = draw(HEALTHY, 50, &mut rng);
    assert!(regressions(
        "job",
        &Shares::of([&tiny]),
        &Shares::of([&tiny]),
        &Config::default()
    )
    .is_empty());
}

fn group(
    extra: Option<(usize, &'static [&'static str], f64)>,
    seed: u64,
    samples: u64,
) -> BTreeMap<String, Shares> {
    let mut rng = SplitMix64::new(seed);
    (0..4)
        .map(|r| {
            let mut paths = HEALTHY.to_vec();
            if let Some((rank, path, share)) = extra {
                if rank == r {
                    paths.push((path, share));
                }
            }
            (
                format!("{r}"),
                Shares::of([&draw(&paths, samples, &mut rng)]),
            )
        })
        .collect()
}

#[test]
fn the_waterline_flags_the_rank_with_the_extra_work() {
    for seed in 0..10 {
        for (path, share) in [
            (
                &["main", "train_step", "k:net_rx_action", "k:__napi_poll"][..],
                0.15,
            ),
            (&["main", "load_batch", "k:path_lookupat"][..], 0.3),
            (
                &["main", "train_step", "forward", "n:at::native::addmm"][..],
                0.6,
            ),
        ] {
            let g = group(Some((2, path, share)), seed, 2000);
            let flags = waterline("job", &g, &Config::default());
            assert!(!flags.is_empty(), "seed {seed}, {path:?}: nothing flagged");
            assert!(
                flags.iter().all(|f| f.rank == "2"),
                "seed {seed}: {flags:#?}"
            );
            let leaf = path
                .last()
                .unwrap()
                .trim_start_matches("k:")
                .trim_start_matches("n:");
            // The injected path's own function first, not its callers,
            // whose excess is the same work seen from above.
            assert!(
                flags[0].function.starts_with(leaf),
                "seed {seed}: {leaf} not first in {flags:#?}"
            );
        }
    }
}

#[test]
fn a_healthy_group_is_below_its_waterline() {
    for seed in 0..40 {
        for samples in [300, 3000] {
            let flags = waterline(
                "job",
                &group(None, 2000 + seed, samples),
                &Config::default(),
            );
            assert!(flags.is_empty(), "seed {seed}: {flags:#?}");
        }
    }
    // Two ranks are not a group to draw a line from.
    let mut g = group(Some((1, &["main", "k:x"], 0.5)), 1, 2000);
    g.retain(|r, _| r == "0" || r == "1");
    assert!(waterline("job", &g, &Config::default()).is_empty());
}

#[test]
fn peers_that_mostly_wait_still_draw_the_line() {
    // A job whose ranks mostly wait for an accelerator: the peers of a
    // straggler have few samples (they wait for it off the CPU), the
    // straggler many more. Its extra work is flagged; ranks that all have
    // few samples are judged by nobody.
    let extra: &[&str] = &["main", "train_step", "slow_python_work"];
    for seed in 0..20 {
        let mut rng = SplitMix64::new(4000 + seed);
        let mut g: BTreeMap<String, Shares> = BTreeMap::new();
        for r in 0..4 {
            let (paths, samples) = if r == 3 {
                let mut p = HEALTHY.to_vec();
                p.push((extra, 0.8));
                (p, 200)
            } else {
                (HEALTHY.to_vec(), 15 + rng.below(30))
            };
            g.insert(
                format!("{r}"),
                Shares::of([&draw(&paths, samples, &mut rng)]),
            );
        }
        let flags = waterline("job", &g, &Config::default());
        assert!(
            flags
                .first()
                .is_some_and(|f| f.rank == "3" && f.function.starts_with("slow_python_work")),
            "seed {seed}: {flags:#?}"
        );
        assert!(
            flags.iter().all(|f| f.rank == "3"),
            "seed {seed}: {flags:#?}"
        );
        // Healthy, all of them mostly waiting.
        let quiet: BTreeMap<String, Shares> = (0..4)
            .map(|r| {
                let n = 15 + rng.below(60);
                (format!("{r}"), Shares::of([&draw(HEALTHY, n, &mut rng)]))
            })
            .collect();
        let flags = waterline("job", &quiet, &Config::default());
        assert!(flags.is_empty(), "seed {seed}: {flags:#?}");
    }
}

#[test]
fn addresses_in_no_file_are_one_function_whatever_the_process() {
    // A frame-pointer walk that strays into the stack gives `[stack]+0x…`
    // frames whose offsets differ per process: as functions they are one,
    // or every rank would have "its own" above the others' zero.
    let at = |module: &str, offset: u64| Frame {
        kind: FrameKind::Native,
        name: None,
        module: Some(module.into()),
        build_id: None,
        offset,
        line: None,
    };
    assert_eq!(
        function_of(&at("[stack]", 0x1bfbf)),
        function_of(&at("[stack]", 0x1d0bf))
    );
    assert_eq!(
        function_of(&at("[anon]", 0x18c7)).as_deref(),
        Some("[anon]")
    );
    // A file's offsets stay apart: two places in one stripped library.
    assert_ne!(
        function_of(&at("dash", 0xae76)),
        function_of(&at("dash", 0x9fa2))
    );
}

#[test]
fn interpreter_frames_left_by_late_python_reads_are_no_rank_difference() {
    // One rank's profiler reads its Python stacks late more often (a busy
    // host): 30 % of its samples keep the interpreter's loop instead of the
    // Python frames, against 2 % on its peers. The same work on every rank.
    let unstitched = |late: f64| -> Vec<(&'static [&'static str], f64)> {
        vec![
            (
                &["main", "train_step", "forward", "n:at::native::addmm"],
                0.45 * (1.0 - late),
            ),
            (
                &["n:_PyEval_EvalFrameDefault", "n:at::native::addmm"],
                0.45 * late,
            ),
            (
                &["main", "train_step", "backward", "n:at::native::mm"],
                0.35 * (1.0 - late),
            ),
            (
                &["n:_PyEval_EvalFrameDefault", "n:at::native::mm"],
                0.35 * late,
            ),
            (&["main", "train_step", "optimizer_step"], 0.2),
        ]
    };
    for seed in 0..10 {
        let mut rng = SplitMix64::new(900 + seed);
        let g: BTreeMap<String, Shares> = (0..4)
            .map(|r| {
                let late = if r == 1 { 0.3 } else { 0.02 };
                (
                    format!("{r}"),
                    Shares::of([&draw(&unstitched(late), 2000, &mut rng)]),
                )
            })
            .collect();
        let flags = waterline("job", &g, &Config::default());
        assert!(
            flags
                .iter()
                .all(|f| !f.function.contains("_PyEval_EvalFrameDefault")),
            "seed {seed}: {flags:#?}"
        );
    }
}

/// Issue 45: a bad period is refused whichever door built the config (the
/// Python package passes numbers, not `A..B` text), before any evidence is
/// looked at.
#[test]
fn a_bad_period_is_refused_by_diagnose_itself() {
    let evidence = whyslow_diagnose::DiagnoseEvidence::default();
    for cfg in [
        whyslow_diagnose::DiagnoseConfig {
            baseline: Some((5.0, 2.0)),
            ..Default::default()
        },
        whyslow_diagnose::DiagnoseConfig {
            window: Some((-1.0, 3.0)),
            ..Default::default()
        },
        whyslow_diagnose::DiagnoseConfig {
            window: Some((0.0, f64::NAN)),
            ..Default::default()
        },
        whyslow_diagnose::DiagnoseConfig {
            until: Some(-4.0),
            ..Default::default()
        },
    ] {
        let e = whyslow_diagnose::diagnose(&evidence, &cfg).unwrap_err();
        assert!(
            matches!(e, whyslow_diagnose::DiagnoseError::BadRange { .. }),
            "{cfg:?}: {e}"
        );
    }
    // A good one gets as far as the evidence.
    let e = whyslow_diagnose::diagnose(
        &evidence,
        &whyslow_diagnose::DiagnoseConfig {
            baseline: Some((0.0, 10.0)),
            window: Some((20.0, 30.0)),
            until: Some(40.0),
        },
    )
    .unwrap_err();
    assert_eq!(e, whyslow_diagnose::DiagnoseError::NothingToDiagnose);
}

/// A profile of `rank` in `group` over `[start_s, start_s + 3)` whose one
/// stack ends in `leaf`; `extra` labels (`kind`, `scope`) as the agents set.
fn timed(rank: u32, group: &str, start_s: u64, leaf: &str, extra: &[(&str, &str)]) -> StackProfile {
    let mut b = StackProfileBuilder::new();
    let ids = ["main", "train_step", leaf]
        .into_iter()
        .map(|n| b.frame(py(n)))
        .collect();
    b.add(ids, 90);
    let mut p = b.finish(99.0, start_s * 1_000_000_000, 3_000_000_000);
    p.labels.insert("rank".into(), rank.to_string());
    p.labels.insert("group".into(), group.into());
    for (k, v) in extra {
        p.labels.insert((*k).into(), (*v).into());
    }
    p
}

fn leaves(p: &StackProfile) -> Vec<String> {
    let mut names: Vec<String> = p
        .stacks
        .iter()
        .filter_map(|s| s.frames.last())
        .filter_map(|&f| p.frames[f as usize].name.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Issue 45: "what changed" has one meaning, the diagnosis's own periods —
/// the window against the baseline the verdict compared (SysOM-AI §3.1,
/// Fig. 7) — for each kind of profile the job has; the command line's
/// `--diff-svg` and the server's `diff.svg` draw this pair. Work that moved
/// from `old` to `new` halfway shows `old` in the baseline only and `new`
/// in the window only, whatever the number of groups.
#[test]
fn what_changed_is_the_window_against_the_verdicts_baseline() {
    for groups in [&["dp0"][..], &["dp0", "dp1"][..]] {
        let mut ev = whyslow_diagnose::DiagnoseEvidence::default();
        for (i, g) in groups.iter().enumerate() {
            for step in 0..10u64 {
                let leaf = if step < 5 { "old" } else { "new" };
                let rank = i as u32;
                ev.profiles.push(timed(rank, g, step * 3, leaf, &[]));
                let wait = if step < 5 { "wait_old" } else { "wait_new" };
                ev.profiles
                    .push(timed(rank, g, step * 3, wait, &[("kind", "offcpu")]));
            }
        }
        let d = whyslow_diagnose::diagnose(&ev, &Default::default()).unwrap();
        let (window, baseline) = (d.report.window, d.report.baseline);
        assert!(baseline.1 <= window.0, "{baseline:?} {window:?}");
        let cpu = d.what_changed(whyslow_diagnose::ProfileKind::Cpu).unwrap();
        assert_eq!(leaves(&cpu.base), ["old"], "{groups:?}");
        assert_eq!(leaves(&cpu.test), ["new"], "{groups:?}");
        // The group whose functions rose, when the verdict names one (here
        // every group did, in name order: the first); else every rank.
        match d.report.regressions.first() {
            Some(r) => {
                assert_eq!(cpu.group.as_deref(), Some(r.group.as_str()));
                assert_eq!(cpu.test.total(), 3 * 90, "one rank, 3 profiles");
            }
            None => assert_eq!(cpu.test.total(), 3 * 90 * groups.len() as u64),
        }
        assert!(
            cpu.title
                .contains(&format!("{:.0}..{:.0} s", window.0, window.1)),
            "{}",
            cpu.title
        );
        let blocked = d
            .what_changed(whyslow_diagnose::ProfileKind::OffCpu)
            .unwrap();
        assert_eq!(leaves(&blocked.base), ["wait_old"]);
        assert_eq!(leaves(&blocked.test), ["wait_new"]);
        assert!(d
            .what_changed(whyslow_diagnose::ProfileKind::Host)
            .is_none());
    }
}
