//! The plugin as NCCL uses it: `dlopen` of the built `libwhyslow_nccl.so`,
//! `dlsym("ncclProfiler_v4")`, then init / startEvent / recordEventState /
//! stopEvent / finalize with v4 descriptors laid out as NCCL's
//! `profiler_v4.h` (the crate's `#[repr(C)]` types), in the orders NCCL
//! calls them: a collective's channels starting before and after its
//! host-side event stopped, two communicators, handles reused after they
//! finished, null pointers. Then the records file, read back as
//! `CollectiveRecord`s.

use std::ffi::{c_int, c_void, CString};
use std::ptr::null_mut;

use whyslow_model::collective::CollectiveRecord;
use whyslow_nccl::{CollDescrV4, DescrV4, EventDescrV4, KernelChDescrV4, ProfilerV4, StateArgsV4};

const COLL: u8 = 1 << 1;
const KERNEL_CH: u8 = 1 << 6;
const KERNEL_CH_STOP: c_int = 22;
/// The GPU's global timer: the Unix clock less a constant, as a real one
/// runs (its epoch is the GPU's own).
const GPU_BEHIND: u64 = 1_700_000_000_000_000_000;

fn library() -> std::path::PathBuf {
    // `cargo test` builds the cdylib beside this test, in target/<profile>/deps
    // (it is copied up to target/<profile> only by `cargo build`, which may
    // be stale or absent): the one in deps is this build's.
    let exe = std::env::current_exe().expect("test path");
    let deps = exe.parent().expect("deps dir");
    let lib = deps.join("libwhyslow_nccl.so");
    assert!(
        lib.exists(),
        "{} was not built (crate-type cdylib)",
        lib.display()
    );
    lib
}

fn load() -> &'static ProfilerV4 {
    let path = CString::new(library().to_str().expect("utf-8 path")).expect("no NUL");
    // SAFETY: dlopen/dlsym with valid C strings; the symbol is the static
    // the plugin exports, which lives as long as the library (never closed).
    unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null(), "dlopen failed");
        let sym = libc::dlsym(h, c"ncclProfiler_v4".as_ptr());
        assert!(!sym.is_null(), "ncclProfiler_v4 is not exported");
        &*(sym as *const ProfilerV4)
    }
}

fn coll(seq: u64, func: &'static std::ffi::CStr, count: usize, channels: u8) -> EventDescrV4 {
    EventDescrV4 {
        kind: COLL,
        parent_obj: null_mut(),
        rank: 0,
        u: DescrV4 {
            coll: CollDescrV4 {
                seq_number: seq,
                func: func.as_ptr(),
                send_buff: std::ptr::null(),
                recv_buff: null_mut(),
                count,
                root: 0,
                datatype: c"ncclFloat32".as_ptr(),
                n_channels: channels,
                n_warps: 8,
                algo: c"RING".as_ptr(),
                proto: c"SIMPLE".as_ptr(),
            },
        },
    }
}

fn channel(parent: *mut c_void, ch: u8, gpu_start: u64) -> EventDescrV4 {
    EventDescrV4 {
        kind: KERNEL_CH,
        parent_obj: parent,
        rank: 0,
        u: DescrV4 {
            kernel_ch: KernelChDescrV4 {
                channel_id: ch,
                p_timer: gpu_start,
            },
        },
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as u64
}

#[test]
fn records_every_collective_with_its_gpu_times() {
    let dir = std::env::temp_dir().join(format!("whyslow-nccl-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::env::set_var("WHYSLOW_NCCL_DIR", &dir);
    std::env::set_var("RANK", "5");
    let p = load();
    let mut gpu_starts = Vec::new();
    // SAFETY: the calls follow NCCL's contract: pointers to live
    // descriptors, handles the plugin returned.
    unsafe {
        let name = CString::new("whyslow").expect("no NUL");
        assert_eq!(std::ffi::CStr::from_ptr(p.name), name.as_c_str());
        let (mut ctx_a, mut ctx_b) = (null_mut(), null_mut());
        let (mut mask_a, mut mask_b) = (0, 0);
        assert_eq!(
            (p.init)(
                &mut ctx_a,
                &mut mask_a,
                c"dp".as_ptr(),
                0xfeed,
                1,
                4,
                1,
                None
            ),
            0
        );
        assert_eq!(
            (p.init)(
                &mut ctx_b,
                &mut mask_b,
                std::ptr::null(),
                0xbeef,
                1,
                2,
                0,
                None
            ),
            0
        );
        assert!(mask_a & (COLL as c_int) != 0 && mask_a & (KERNEL_CH as c_int) != 0);
        assert_eq!(mask_a, mask_b);
        let gpu_now = || unix_now() - GPU_BEHIND;
        let mut seen_handles = Vec::new();
        for seq in 0..50u64 {
            // Communicator A: an all-reduce on 2 channels; the host-side
            // event stops first (NCCL enqueues, the kernel runs later).
            let mut d = coll(seq, c"AllReduce", 1 << 18, 2);
            let mut h = null_mut();
            assert_eq!((p.start_event)(ctx_a, &mut h, &mut d), 0);
            assert!(!h.is_null());
            seen_handles.push(h);
            if seq % 2 == 0 {
                assert_eq!((p.stop_event)(h), 0);
            }
            // The channels started 2 ms ago and just ended.
            let t = gpu_now() - 2_000_000;
            for ch in 0..2u8 {
                let mut cd = channel(h, ch, t + ch as u64 * 1_000);
                let mut chh = null_mut();
                (p.start_event)(ctx_a, &mut chh, &mut cd);
                let mut args = StateArgsV4 {
                    kernel_ch_p_timer: t + 2_000_000 + ch as u64 * 500,
                };
                gpu_starts.push((seq, t));
                (p.record_event_state)(chh, KERNEL_CH_STOP, &mut args);
                (p.stop_event)(chh);
                // A repeated stop of a finished handle is ignored.
                (p.stop_event)(chh);
            }
            if seq % 2 == 1 {
                assert_eq!((p.stop_event)(h), 0);
            }
            // Communicator B: a broadcast whose channel events never come
            // (none activated there): written at finalize with host times.
            let mut db = coll(seq, c"Broadcast", 100, 0);
            let mut hb = null_mut();
            (p.start_event)(ctx_b, &mut hb, &mut db);
            (p.stop_event)(hb);
        }
        // Finished handles, nulls and an unknown context are ignored.
        for h in &seen_handles {
            (p.stop_event)(*h);
        }
        (p.stop_event)(null_mut());
        (p.start_event)(ctx_a, null_mut(), null_mut());
        let mut d = coll(99, c"AllReduce", 1, 1);
        let mut h = null_mut();
        (p.start_event)(12345usize as *mut c_void, &mut h, &mut d);
        assert!(h.is_null(), "no handle for an unknown context");
        assert_eq!((p.finalize)(ctx_a), 0);
        assert_eq!((p.finalize)(ctx_b), 0);
    }
    let files: Vec<_> = std::fs::read_dir(&dir)
        .expect("output dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().to_string();
    assert!(
        name.contains("-rank5-pid") && name.ends_with(".collectives.jsonl"),
        "{name}"
    );
    let records: Vec<CollectiveRecord> = std::fs::read_to_string(&files[0])
        .expect("records")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a CollectiveRecord per line"))
        .collect();
    let a: Vec<&CollectiveRecord> = records
        .iter()
        .filter(|r| r.group == "nccl-000000000000feed")
        .collect();
    let b: Vec<&CollectiveRecord> = records
        .iter()
        .filter(|r| r.group == "nccl-000000000000beef")
        .collect();
    assert_eq!((a.len(), b.len()), (50, 50), "{records:#?}");
    let mut seqs: Vec<u64> = a.iter().filter_map(|r| r.seq).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..50).collect::<Vec<_>>());
    let starts: std::collections::HashMap<u64, u64> = gpu_starts.into_iter().collect();
    for r in &a {
        assert_eq!(
            (r.rank, r.global_rank, r.op.as_str()),
            (1, Some(5), "allreduce")
        );
        assert_eq!(r.bytes, 4 << 18);
        assert_eq!(r.source, "nccl-plugin-gpu");
        // The channels' span on the GPU, 2 ms.
        assert_eq!(r.exit_ns - r.entry_ns, 2_000_500, "{r:?}");
        // On the Unix clock: the GPU start moved by the GPU's offset, give
        // or take how late the host heard of a channel's end.
        let truth = starts[&r.seq.unwrap()] + GPU_BEHIND;
        assert!(r.entry_ns.abs_diff(truth) < 5_000_000, "{r:?} vs {truth}");
    }
    for r in &b {
        assert_eq!((r.rank, r.op.as_str(), r.bytes), (0, "broadcast", 400));
        assert_eq!(r.source, "nccl-plugin-host");
        assert!(r.exit_ns >= r.entry_ns);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
