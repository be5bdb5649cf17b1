//! The eBPF sampler (SysOM-AI §3.3) on the program of known shape
//! (`known_shape.py`: a zlib thread and a stat thread) and on a busy process
//! beside it: in-kernel filtering by process, whole-host sampling, the
//! sampling rate, aggregation in the kernel, and the kernel's path lookup
//! under the stat thread's samples.
//!
//! Needs root (CAP_BPF + CAP_PERFMON) and a kernel with BPF: it skips with the
//! reason where loading is refused, unless WHYSLOW_REQUIRE_BPF=1 (CI sets it),
//! which turns a refusal into a failure.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use whyslow_model::stack::{Frame, FrameKind, StackProfile};
use whyslow_stacks::ebpf::{self, EbpfOptions, EbpfSampler, Target};

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn known_shape() -> Kill {
    known_shape_on(&std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
}

fn known_shape_on(python: &str) -> Kill {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/known_shape.py");
    let mut child = Command::new(python)
        .arg(script)
        .arg("600") // killed when the test ends
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("ready line");
    assert_eq!(line.trim(), "ready", "known_shape.py did not start");
    Kill(child)
}

fn busy_loop() -> Kill {
    Kill(
        Command::new("sh")
            .arg("-c")
            .arg("while :; do :; done")
            .spawn()
            .expect("sh runs"),
    )
}

/// Whether this machine lets us load BPF programs; `None` to go on.
fn skip_reason() -> Option<String> {
    let opts = EbpfOptions {
        hz: 99,
        sampling_rate: 1.0,
        target: Target::Pids(vec![]),
        measure: false,
        off_cpu: false,
        unwind: Default::default(),
        max_cfi_rows: whyslow_stacks::ebpf::DEFAULT_MAX_CFI_ROWS,
        python: true,
    };
    match EbpfSampler::open(&opts) {
        Ok(_) => None,
        Err(e) if std::env::var("WHYSLOW_REQUIRE_BPF").as_deref() != Ok("1") => {
            Some(format!("BPF is not available here: {e}"))
        }
        Err(e) => panic!("WHYSLOW_REQUIRE_BPF=1 but the sampler cannot load: {e}"),
    }
}

fn stacks(p: &StackProfile) -> Vec<(Vec<&Frame>, u64)> {
    p.stacks
        .iter()
        .map(|s| {
            (
                s.frames.iter().map(|&i| &p.frames[i as usize]).collect(),
                s.count,
            )
        })
        .collect()
}

/// Profiles `target` until its processes have had `ticks` ticks of CPU
/// (taken or skipped by the rate), from `secs` seconds up, tripling, to 81 s:
/// on a loaded machine the target gets less CPU, not fewer samples per CPU
/// second.
fn run(target: Target, rate: f64, secs: f64, ticks: u64) -> (StackProfile, ebpf::EbpfStats) {
    run_with(target, rate, secs, ticks, Default::default())
}

/// [`run`] with a user stack walk of choice.
fn run_with(
    target: Target,
    rate: f64,
    secs: f64,
    ticks: u64,
    unwind: ebpf::UserUnwind,
) -> (StackProfile, ebpf::EbpfStats) {
    let mut secs = secs;
    loop {
        let opts = EbpfOptions {
            hz: 99,
            sampling_rate: rate,
            target: target.clone(),
            measure: true,
            off_cpu: false,
            unwind,
            max_cfi_rows: ebpf::DEFAULT_MAX_CFI_ROWS,
            python: true,
        };
        let got = ebpf::profile(
            &opts,
            Duration::from_secs_f64(secs),
            Duration::from_secs(1),
            &AtomicBool::new(false),
        )
        .expect("eBPF profile");
        if got.1.samples + got.1.skipped >= ticks || secs >= 81.0 {
            return got;
        }
        secs *= 3.0;
    }
}

#[test]
#[ignore = "system test (./scripts/test --all): eBPF sampling of live processes (root, BPF)"]
fn ebpf_sampler_filters_aggregates_and_takes_kernel_stacks() {
    if let Some(why) = skip_reason() {
        whyslow_testkit::skip(&why);
        return;
    }
    let shape = known_shape();
    let pid = shape.0.id();
    let _busy = busy_loop();
    std::thread::sleep(Duration::from_millis(300));

    // One process: only its threads, two of them busy.
    let (p, st) = run(Target::Pids(vec![pid]), 1.0, 3.0, 200);
    let all = stacks(&p);
    let total: u64 = all.iter().map(|(_, c)| c).sum();
    assert!(st.samples >= 200, "{st:?}");
    assert_eq!(
        total, st.samples,
        "every counted sample reached the profile"
    );
    assert!(
        st.filtered > 0,
        "the busy loop's ticks were filtered out: {st:?}"
    );
    assert!(
        st.runs >= st.ticks / 2 && st.run_time_ns > 0,
        "run time measured: {st:?}"
    );
    // Aggregated in the kernel: repeated stacks arrive as one count.
    assert!(
        (p.stacks.len() as u64) < total && p.stacks.iter().any(|s| s.count >= 5),
        "{} stacks for {total} samples",
        p.stacks.len()
    );
    let of = |thread: &str| -> Vec<&(Vec<&Frame>, u64)> {
        all.iter()
            .filter(|(f, _)| f.first().and_then(|f| f.name.as_deref()) == Some(thread))
            .collect()
    };
    let count = |v: &[&(Vec<&Frame>, u64)]| -> u64 { v.iter().map(|(_, c)| c).sum() };
    let stat = of("stat");
    let compress = of("compress");
    assert!(
        count(&stat) > total / 5,
        "stat thread: {} of {total}",
        count(&stat)
    );
    assert!(
        count(&compress) > total / 5,
        "compress: {} of {total}",
        count(&compress)
    );
    // The stat thread: in most samples the kernel's path walk, after the user
    // frames (root first: thread, user, kernel).
    let lookup = |f: &&Frame| {
        f.kind == FrameKind::Kernel
            && f.name.as_deref().is_some_and(|n| {
                [
                    "path_lookupat",
                    "filename_lookup",
                    "link_path_walk",
                    "walk_component",
                    "vfs_statx",
                ]
                .iter()
                .any(|k| n.contains(k))
            })
    };
    let in_lookup: u64 = stat
        .iter()
        .filter(|(f, _)| f.iter().any(lookup))
        .map(|(_, c)| c)
        .sum();
    assert!(
        in_lookup * 2 > count(&stat),
        "path lookup in {in_lookup} of {} stat samples",
        count(&stat)
    );
    for (f, _) in &stat {
        let first_kernel = f.iter().position(|f| f.kind == FrameKind::Kernel);
        let last_native = f.iter().rposition(|f| f.kind == FrameKind::Native);
        if let (Some(k), Some(n)) = (first_kernel, last_native) {
            assert!(n < k, "user frames before kernel frames");
        }
    }
    // The compress thread: its innermost user frame is in libz in most samples
    // (deflate's loops are leaf functions; frame pointers cannot see further
    // in this CPython, the perf engine's DWARF unwinding does).
    let in_libz: u64 = compress
        .iter()
        .filter(|(f, _)| {
            f.iter()
                .rev()
                .find(|f| f.kind == FrameKind::Native)
                .and_then(|f| f.module.as_deref())
                .is_some_and(|m| m.contains("libz"))
        })
        .map(|(_, c)| c)
        .sum();
    assert!(
        in_libz * 2 > count(&compress),
        "libz innermost in {in_libz} of {} compress samples",
        count(&compress)
    );

    // The whole host: the busy loop (not a target before) shows up, under a
    // process frame.
    let (host, hst) = run(Target::Host, 1.0, 2.0, 0);
    let busy_pid = _busy.0.id();
    let busy: u64 = stacks(&host)
        .iter()
        .filter(|(f, _)| {
            f.first()
                .and_then(|f| f.name.as_deref())
                .is_some_and(|n| n.ends_with(&format!("[{busy_pid}]")))
        })
        .map(|(_, c)| c)
        .sum();
    assert!(busy >= 5, "busy loop: {busy} of {hst:?}");
    assert_eq!(hst.filtered, 0, "{hst:?}");

    // The sampling rate: one tick in ten takes a stack.
    let (_, r) = run(Target::Pids(vec![pid]), 0.1, 3.0, 300);
    let kept = r.samples as f64 / (r.samples + r.skipped) as f64;
    assert!(
        (0.05..0.17).contains(&kept),
        "kept {kept:.3} of ticks: {r:?}"
    );
}

#[test]
#[ignore = "system test (./scripts/test --all): eBPF sampling of live processes (root, BPF)"]
fn bad_settings_are_refused_with_the_reason() {
    for (hz, rate) in [(5, 1.0), (1000, 1.0), (99, 0.0), (99, 1.5), (99, f64::NAN)] {
        let opts = EbpfOptions {
            hz,
            sampling_rate: rate,
            target: Target::Host,
            measure: false,
            off_cpu: false,
            unwind: Default::default(),
            max_cfi_rows: whyslow_stacks::ebpf::DEFAULT_MAX_CFI_ROWS,
            python: true,
        };
        let e = EbpfSampler::open(&opts).err().expect("refused");
        assert!(matches!(e, ebpf::EbpfError::Setting(_)), "{e}");
    }
    let e = ebpf::cgroup_id(std::path::Path::new("/nonexistent/cgroup")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/cgroup"), "{e}");
}

/// A fresh cgroup with the CPU controller, v2's unified tree where it has
/// one, else v1's cpu hierarchy (these VMs); removed on drop, its processes
/// moved back to the root first.
struct TempCgroup(std::path::PathBuf);

impl TempCgroup {
    fn new() -> Option<TempCgroup> {
        let root = ["/sys/fs/cgroup", "/sys/fs/cgroup/cpu"]
            .into_iter()
            .map(std::path::PathBuf::from)
            .find(|d| {
                std::fs::read_to_string(d.join("cgroup.controllers"))
                    .map(|c| c.split_whitespace().any(|x| x == "cpu"))
                    .unwrap_or_else(|_| d.join("cpu.cfs_quota_us").exists())
            })?;
        let d = root.join(format!("whyslow-ebpf-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).ok()?;
        Some(TempCgroup(d))
    }

    fn enter(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).expect("moving into cgroup");
    }
}

impl Drop for TempCgroup {
    fn drop(&mut self) {
        let root = self.0.parent().expect("parent").join("cgroup.procs");
        if let Ok(pids) = std::fs::read_to_string(self.0.join("cgroup.procs")) {
            for p in pids.split_whitespace() {
                let _ = std::fs::write(&root, p);
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
#[ignore = "system test (./scripts/test --all): eBPF sampling of live processes (root, BPF)"]
fn a_cgroup_target_keeps_only_its_processes_on_either_cgroup_version() {
    if let Some(why) = skip_reason() {
        whyslow_testkit::skip(&why);
        return;
    }
    let Some(cg) = TempCgroup::new() else {
        whyslow_testkit::skip("no writable cgroup with the CPU controller here");
        return;
    };
    let inside = busy_loop();
    let outside = busy_loop();
    cg.enter(inside.0.id());
    let (p, st) = run(Target::Cgroups(vec![cg.0.clone()]), 1.0, 2.0, 50);
    let by_process = |pid: u32| -> u64 {
        stacks(&p)
            .iter()
            .filter(|(f, _)| {
                f.first()
                    .and_then(|f| f.name.as_deref())
                    .is_some_and(|n| n.ends_with(&format!("[{pid}]")))
            })
            .map(|(_, c)| c)
            .sum()
    };
    let total: u64 = p.stacks.iter().map(|s| s.count).sum();
    assert!(
        by_process(inside.0.id()) >= 20,
        "the cgroup's busy loop: {} of {total} ({st:?}, {})",
        by_process(inside.0.id()),
        cg.0.display()
    );
    assert_eq!(
        by_process(outside.0.id()),
        0,
        "the other busy loop was kept"
    );
    assert_eq!(
        by_process(inside.0.id()),
        total,
        "only the cgroup's process"
    );
}

#[test]
#[ignore = "system test (./scripts/test --all): eBPF sampling of live processes (root, BPF)"]
fn off_cpu_time_is_counted_under_the_stack_that_blocked() {
    if let Some(why) = skip_reason() {
        whyslow_testkit::skip(&why);
        return;
    }
    // A reader blocked on a pipe that gets a byte every 50 ms: its thread
    // is off the CPU nearly all the time, in the kernel's pipe_read. The
    // busy loop beside it never blocks.
    use std::io::Write;
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let mut reader = Kill(
        Command::new(python)
            .arg("-c")
            .arg("import sys\nwhile sys.stdin.buffer.read(1): pass\n")
            .stdin(Stdio::piped())
            .spawn()
            .expect("python3 runs"),
    );
    let pid = reader.0.id();
    let mut feed = reader.0.stdin.take().expect("stdin");
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let feeder = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                if feed.write_all(b"x").and_then(|_| feed.flush()).is_err() {
                    break;
                }
            }
        })
    };
    let _busy = busy_loop();
    std::thread::sleep(Duration::from_millis(300));
    let opts = EbpfOptions {
        hz: 99,
        sampling_rate: 1.0,
        target: Target::Pids(vec![pid]),
        measure: false,
        off_cpu: true,
        unwind: Default::default(),
        max_cfi_rows: whyslow_stacks::ebpf::DEFAULT_MAX_CFI_ROWS,
        python: true,
    };
    let (p, st) = ebpf::profile(
        &opts,
        Duration::from_secs(2),
        Duration::from_secs(1),
        &AtomicBool::new(false),
    )
    .expect("off-CPU profile");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = feeder.join();
    let total_us: u64 = p.stacks.iter().map(|s| s.count).sum();
    assert_eq!(p.hz, 1e6, "counts are microseconds");
    // Blocked most of the 2 s of sampling: alone, 1.9-2.0 s; with the other
    // tests' busy loops on both cores, 1.4 s (the reader, preempted while it
    // runs, waits for a CPU again: run-queue delay, which is not blocked
    // time). Never more than the profile's span (which also holds loading
    // the program and the drains' symbolization).
    let span_us = p.duration_ns / 1_000;
    assert!(
        total_us <= span_us + 50_000 && total_us >= 500_000,
        "{total_us} µs off the CPU in a {span_us} µs profile: {st:?}"
    );
    let in_pipe_read: u64 = stacks(&p)
        .iter()
        .filter(|(f, _)| {
            f.iter().any(|f| {
                f.kind == FrameKind::Kernel
                    && f.name.as_deref().is_some_and(|n| n.contains("pipe_read"))
            })
        })
        .map(|(_, c)| c)
        .sum();
    assert!(
        in_pipe_read * 10 > total_us * 9,
        "pipe_read in {in_pipe_read} of {total_us} µs"
    );
    assert!(
        st.filtered > 0,
        "the busy loop and the rest were filtered: {st:?}"
    );
    // The Python code that blocked: the `-c` program's module frame,
    // walked at the switch (a CPython 3.10-3.13 with a shared libpython).
    if st.python_processes == 1 {
        let in_module: u64 = stacks(&p)
            .iter()
            .filter(|(f, _)| {
                f.iter()
                    .any(|f| f.kind == FrameKind::Python && f.name.as_deref() == Some("<module>"))
            })
            .map(|(_, c)| c)
            .sum();
        assert!(
            in_module * 10 > total_us * 9,
            "<module> in {in_module} of {total_us} µs"
        );
    } else {
        eprintln!("off-CPU Python frames not checked: the reader's CPython is not walked ({st:?})");
    }
    drop(reader);
}

/// Profiles `pid` with one user stack walk, until its threads had 300
/// samples (up to 81 s).
fn run_unwind(pid: u32, unwind: ebpf::UserUnwind) -> (StackProfile, ebpf::EbpfStats) {
    run_with(Target::Pids(vec![pid]), 1.0, 3.0, 300, unwind)
}

/// Share of `thread`'s samples whose user stack holds every one of `want`
/// (native frames, any order), and the mean number of native user frames.
fn reach(p: &StackProfile, thread: &str, want: &[&str]) -> (f64, f64, u64) {
    let (mut hit, mut total, mut frames) = (0u64, 0u64, 0u64);
    for (f, c) in stacks(p) {
        if f.first().and_then(|f| f.name.as_deref()) != Some(thread) {
            continue;
        }
        total += c;
        let user: Vec<&str> = f
            .iter()
            .filter(|f| f.kind == FrameKind::Native)
            .filter_map(|f| f.name.as_deref())
            .collect();
        frames += user.len() as u64 * c;
        if want.iter().all(|w| user.iter().any(|u| u.contains(w))) {
            hit += c;
        }
    }
    if std::env::var_os("WHYSLOW_SHOW_STACKS").is_some() {
        for (f, c) in stacks(p).iter().take(5) {
            let names: Vec<String> = f
                .iter()
                .map(|f| format!("{:?}:{}", f.kind, f.name.as_deref().unwrap_or("?")))
                .collect();
            eprintln!("{c} {}", names.join(";"));
        }
    }
    let t = total.max(1) as f64;
    (hit as f64 / t, frames as f64 / t, total)
}

/// SysOM-AI §3.3, Algorithm 1 in the kernel: CPython here has no frame
/// pointers, so the kernel's frame-pointer walk stops after 1–3 frames;
/// with `.eh_frame` rows in BPF maps the walk goes from libz's `deflate`
/// through the zlib extension and the interpreter's loop to the thread's
/// start, and the stat thread's from the syscall wrapper to the same root.
#[test]
#[ignore = "system test (./scripts/test --all): eBPF sampling of live processes (root, BPF)"]
fn cfi_rows_in_the_kernel_unwind_python_without_frame_pointers() {
    if let Some(why) = skip_reason() {
        whyslow_testkit::skip(&why);
        return;
    }
    let shape = known_shape();
    let pid = shape.0.id();
    // pythread_wrapper: CPython's thread entry, under libc's (stripped,
    // unnamed) start_thread and clone3. The interpreter's frames between it
    // and the extension are the Python functions they ran (see
    // python_frames_are_walked_in_the_kernel).
    let deflate = ["pythread_wrapper", "zlib_compress", "deflate"];
    let stat = ["pythread_wrapper"];
    let (fp, fp_stats) = run_unwind(pid, ebpf::UserUnwind::FramePointer);
    let (hy, hy_stats) = run_unwind(pid, ebpf::UserUnwind::Hybrid);
    let (fp_c, fp_c_frames, _) = reach(&fp, "compress", &deflate);
    let (hy_c, hy_c_frames, n_c) = reach(&hy, "compress", &deflate);
    let (hy_s, hy_s_frames, n_s) = reach(&hy, "stat", &stat);
    eprintln!(
        "frame pointers: compress {fp_c:.2} ({fp_c_frames:.1} frames); hybrid: compress {hy_c:.2} \
         ({hy_c_frames:.1} frames, {n_c} samples), stat {hy_s:.2} ({hy_s_frames:.1} frames, {n_s} samples)\n\
         fp {fp_stats:?}\nhybrid {hy_stats:?}"
    );
    assert!(
        hy_stats.tables.modules >= 3 && hy_stats.tables.rows > 1000,
        "{hy_stats:?}"
    );
    assert!(
        hy_stats.unwind.dwarf_steps > hy_stats.samples,
        "{hy_stats:?}"
    );
    assert!(
        n_c >= 30 && n_s >= 30,
        "too few samples: {n_c} compress, {n_s} stat"
    );
    assert!(
        hy_c >= 0.9,
        "hybrid: deflate .. interpreter .. thread start in {hy_c:.2} of compress samples"
    );
    assert!(
        hy_s >= 0.9,
        "hybrid: interpreter .. thread start in {hy_s:.2} of stat samples"
    );
    assert!(
        hy_c_frames > 3.0 * fp_c_frames.max(1.0),
        "{hy_c_frames} vs {fp_c_frames}"
    );
    assert!(
        fp_c < 0.1,
        "frame pointers reached the root in {fp_c:.2}: is this CPython built with them?"
    );
}

/// SysOM-AI §3.3, Algorithm 1's last resort: a frame whose CFI the kernel
/// side does not evaluate (gcc's stack-realigning prologue: CFA and rbp by
/// DWARF expressions) sends the sample to userspace with a copy of the
/// stack, and gimli's evaluator finishes the walk there. Samples in `spin`,
/// under `realigned`, reach `main`.
#[test]
#[ignore = "system test (./scripts/test --all): eBPF sampling of live processes (root, BPF)"]
fn complex_cfi_rules_are_finished_in_userspace_on_a_copied_stack() {
    if let Some(why) = skip_reason() {
        whyslow_testkit::skip(&why);
        return;
    }
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/realign.c");
    let dir = std::env::temp_dir().join(format!("whyslow-realign-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("realign");
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-fomit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(src)
        .status()
        .expect("gcc runs (apt-get install gcc)");
    assert!(status.success(), "gcc failed on {src}");
    // The premise: the binary holds rules the kernel side cannot evaluate.
    {
        use object::{Object, ObjectSection};
        let bytes = std::fs::read(&exe).unwrap();
        let obj = object::File::parse(&bytes[..]).unwrap();
        let eh = obj.section_by_name(".eh_frame").unwrap();
        let text = obj.section_by_name(".text").unwrap();
        let (_, summary) =
            whyslow_stacks::cfi::compile_eh_frame(eh.data().unwrap(), eh.address(), text.address());
        assert!(
            summary.unsupported > 0,
            "no DWARF expression in {exe:?}: {summary:?}"
        );
    }
    let child = Kill(Command::new(&exe).spawn().expect("the test program runs"));
    let (p, stats) = run_unwind(child.0.id(), ebpf::UserUnwind::Hybrid);
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
    let (mut in_spin, mut to_main) = (0u64, 0u64);
    for (frames, c) in stacks(&p) {
        let names: Vec<&str> = frames
            .iter()
            .filter(|f| f.kind == FrameKind::Native)
            .filter_map(|f| f.name.as_deref())
            .collect();
        if names.last() != Some(&"spin") {
            continue;
        }
        in_spin += c;
        if names.contains(&"realigned") && names.contains(&"main") {
            to_main += c;
        }
    }
    eprintln!("{in_spin} samples in spin, {to_main} reach main\n{stats:?}");
    assert!(
        in_spin >= 100,
        "too few samples in spin: {in_spin}\n{stats:?}"
    );
    assert!(stats.unwind.copied > 0, "{stats:?}");
    assert_eq!(
        stats.unwind.fallback.walks, stats.unwind.copied,
        "{stats:?}"
    );
    assert!(
        to_main as f64 >= 0.95 * in_spin as f64,
        "{to_main} of {in_spin} samples in spin reach main through realigned"
    );
}

/// Python functions of `thread`'s samples: the share whose stack holds the
/// Python frame `function` above the native frame `below` (None: anywhere),
/// the share still holding an interpreter frame, and the samples.
fn python_reach(
    p: &StackProfile,
    thread: &str,
    function: &str,
    below: Option<&str>,
) -> (f64, f64, u64) {
    let (mut hit, mut interp, mut total) = (0u64, 0u64, 0u64);
    for (f, c) in stacks(p) {
        if f.first().and_then(|f| f.name.as_deref()) != Some(thread) {
            continue;
        }
        total += c;
        let at = f
            .iter()
            .position(|f| f.kind == FrameKind::Python && f.name.as_deref() == Some(function));
        let under = |i: usize| match below {
            None => true,
            Some(b) => f[i..]
                .iter()
                .any(|f| f.kind == FrameKind::Native && f.name.as_deref() == Some(b)),
        };
        if at.is_some_and(under) {
            hit += c;
        }
        if f.iter()
            .any(|f| f.name.as_deref() == Some("_PyEval_EvalFrameDefault"))
        {
            interp += c;
        }
    }
    let t = total.max(1) as f64;
    (hit as f64 / t, interp as f64 / t, total)
}

/// SysOM-AI §3.3, one stack from Python to the kernel on the eBPF path: the
/// program walks each CPython thread's frame chain at the tick, and the
/// interpreter's evaluation frames become the Python functions they ran —
/// `compress_forever` above the zlib extension and libz, `stat_forever`
/// above the stat syscall — on every CPython 3.10–3.13 installed here (and
/// the distribution's stripped, statically linked one), with
/// DWARF-unwound native stacks (hybrid) and with frame pointers alone (the
/// Python frames then go at the root of the few native frames found).
#[test]
#[ignore = "system test (./scripts/test --all): eBPF sampling of live processes (root, BPF)"]
fn python_frames_are_walked_in_the_kernel() {
    if let Some(why) = skip_reason() {
        whyslow_testkit::skip(&why);
        return;
    }
    let mut pythons: Vec<String> = (10..=13)
        .filter_map(|minor| {
            let dir = std::fs::read_dir("/root/.pyenv/versions").ok()?;
            dir.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with(&format!("3.{minor}.")))
                })
                .map(|p| p.join(format!("bin/python3.{minor}")))
                .find(|p| p.exists())
                .map(|p| p.display().to_string())
        })
        .collect();
    if pythons.is_empty() {
        pythons.push(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()));
    }
    // The distribution's CPython: the runtime linked into the executable,
    // stripped (no DWARF): read by its layout table, checked live.
    if std::path::Path::new("/usr/bin/python3").exists() {
        pythons.push("/usr/bin/python3".into());
    }
    for python in &pythons {
        let shape = known_shape_on(python);
        let pid = shape.0.id();
        for unwind in [ebpf::UserUnwind::Hybrid, ebpf::UserUnwind::FramePointer] {
            let (p, st) = run_with(Target::Pids(vec![pid]), 1.0, 3.0, 300, unwind);
            // With frame pointers the few native frames found need not
            // reach libz's named code.
            let below = (unwind == ebpf::UserUnwind::Hybrid).then_some("deflate");
            let (c, c_interp, n_c) = python_reach(&p, "compress", "compress_forever", below);
            let (s, _, n_s) = python_reach(&p, "stat", "stat_forever", None);
            eprintln!(
                "{python} {unwind:?}: compress_forever above deflate in {c:.2} of {n_c} \
                 samples (interpreter frames left in {c_interp:.2}), stat_forever in {s:.2} \
                 of {n_s}; {:?}",
                st.python
            );
            if std::env::var_os("WHYSLOW_SHOW_STACKS").is_some() {
                reach(&p, "compress", &[]);
            }
            assert_eq!(st.python_processes, 1, "{python}: {st:?}");
            assert!(n_c >= 30 && n_s >= 30, "{python}: too few samples");
            assert!(c >= 0.9, "{python} {unwind:?}: compress_forever in {c:.2}");
            assert!(s >= 0.9, "{python} {unwind:?}: stat_forever in {s:.2}");
            if unwind == ebpf::UserUnwind::Hybrid {
                assert!(
                    c_interp <= 0.1,
                    "{python}: interpreter frames left in {c_interp:.2}"
                );
                assert!(
                    st.python.stitched * 10 >= st.python.samples * 9,
                    "{python}: {:?}",
                    st.python
                );
            }
        }
    }
}
