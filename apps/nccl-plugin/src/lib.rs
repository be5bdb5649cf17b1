//! whyslow's NCCL profiler plugin (SysOM-AI §3.2: collective tracing for GPU
//! jobs). Loaded by NCCL from `NCCL_PROFILER_PLUGIN=/path/libwhyslow_nccl.so`,
//! it records every collective of every communicator of the process — its
//! GPU-side start and end (kernel-channel events with the GPU's global
//! timer), sequence number, operation and bytes — as whyslow collective
//! records (`*.collectives.jsonl`, one
//! [`whyslow_model::collective::CollectiveRecord`] per line), the same input
//! `whyslow diagnose` reads from the gloo tracer. [`assemble`] turns events
//! into records (pure); this module is the C ABI around it.
//!
//! API: `ncclProfiler_v4` (NCCL 2.27 and later load it, newer releases
//! after looking for v5/v6 first; PyTorch's wheels ship 2.27). Records go to
//! `WHYSLOW_NCCL_DIR` (else `$WHYSLOW_AGENT_DIR/nccl`), one file per process:
//! `<host>-rank<R>-pid<P>.collectives.jsonl`. The group of a record is the
//! communicator's hash (`nccl-<hash>`), equal on all its ranks; `RANK` gives
//! the job-wide rank.
//!
//! Never hurts the job: without an output directory, on any I/O error, a
//! poisoned lock or a panic (caught at the boundary), the plugin turns
//! itself off with one line on stderr and answers NCCL with success and an
//! empty activation mask. Handles given to NCCL are numbers, not pointers:
//! a late or repeated call with a handle already finished is ignored, never
//! a read of freed memory. Collectives waiting for channel events are
//! capped (the oldest are written with their host times).
#![deny(missing_docs)]

pub mod assemble;

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_ulong, c_void, CStr};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use assemble::{Comm, GpuClock, Pending};

/// `ncclSuccess`.
const NCCL_SUCCESS: c_int = 0;
/// Event types (`ncclProfileColl`, …) of NCCL's `profiler.h`.
const PROFILE_COLL: u8 = 1 << 1;
const PROFILE_P2P: u8 = 1 << 2;
const PROFILE_KERNEL_CH: u8 = 1 << 6;
/// `ncclProfilerKernelChStop`.
const STATE_KERNEL_CH_STOP: c_int = 22;
/// Collectives kept waiting for their channels per communicator.
const MAX_PENDING: usize = 4096;

/// NCCL's logger (`ncclDebugLogger_t`); not called: the plugin's one line
/// goes to stderr.
pub type DebugLogger =
    Option<unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...)>;

/// `ncclProfilerEventDescr_v4_t.coll`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollDescrV4 {
    /// Sequence number in the communicator.
    pub seq_number: u64,
    /// `AllReduce`, …
    pub func: *const c_char,
    /// Send buffer.
    pub send_buff: *const c_void,
    /// Receive buffer.
    pub recv_buff: *mut c_void,
    /// Elements.
    pub count: usize,
    /// Root rank.
    pub root: c_int,
    /// `ncclFloat32`, …
    pub datatype: *const c_char,
    /// Channels that run it.
    pub n_channels: u8,
    /// Warps.
    pub n_warps: u8,
    /// Algorithm.
    pub algo: *const c_char,
    /// Protocol.
    pub proto: *const c_char,
}

/// `ncclProfilerEventDescr_v4_t.p2p`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2pDescrV4 {
    /// `Send` or `Recv`.
    pub func: *const c_char,
    /// Buffer.
    pub buff: *mut c_void,
    /// Datatype.
    pub datatype: *const c_char,
    /// Elements.
    pub count: usize,
    /// Peer rank.
    pub peer: c_int,
    /// Channels.
    pub n_channels: u8,
}

/// `ncclProfilerEventDescr_v4_t.kernelCh`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelChDescrV4 {
    /// Channel.
    pub channel_id: u8,
    /// GPU global timer at the channel's start, ns.
    pub p_timer: u64,
}

/// The union of `ncclProfilerEventDescr_v4_t` (the members read here; the
/// padding member keeps the union as large as NCCL's).
#[repr(C)]
#[derive(Clone, Copy)]
pub union DescrV4 {
    /// `coll`.
    pub coll: CollDescrV4,
    /// `p2p`.
    pub p2p: P2pDescrV4,
    /// `kernelCh`.
    pub kernel_ch: KernelChDescrV4,
    /// As large as the largest member.
    pub pad: [u64; 12],
}

/// `ncclProfilerEventDescr_v4_t`.
#[repr(C)]
pub struct EventDescrV4 {
    /// Event type (`ncclProfileColl`, …).
    pub kind: u8,
    /// The parent event's handle (for a kernel channel: its collective's).
    pub parent_obj: *mut c_void,
    /// Originating rank.
    pub rank: c_int,
    /// Type-specific part.
    pub u: DescrV4,
}

/// `ncclProfilerEventStateArgs_v4_t` (the kernel channel's end timer read
/// here).
#[repr(C)]
#[derive(Clone, Copy)]
pub union StateArgsV4 {
    /// `kernelCh.pTimer`: GPU global timer at the channel's end, ns.
    pub kernel_ch_p_timer: u64,
    /// `proxyStep.transSize` and the others.
    pub other: usize,
}

/// `ncclProfiler_v4_t`.
#[repr(C)]
pub struct ProfilerV4 {
    /// Plugin name.
    pub name: *const c_char,
    /// `init(context, eActivationMask, commName, commHash, nNodes, nranks, rank, logfn)`.
    pub init: unsafe extern "C" fn(
        *mut *mut c_void,
        *mut c_int,
        *const c_char,
        u64,
        c_int,
        c_int,
        c_int,
        DebugLogger,
    ) -> c_int,
    /// `startEvent(context, eHandle, eDescr)`.
    pub start_event:
        unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut EventDescrV4) -> c_int,
    /// `stopEvent(eHandle)`.
    pub stop_event: unsafe extern "C" fn(*mut c_void) -> c_int,
    /// `recordEventState(eHandle, eState, eStateArgs)`.
    pub record_event_state: unsafe extern "C" fn(*mut c_void, c_int, *mut StateArgsV4) -> c_int,
    /// `finalize(context)`.
    pub finalize: unsafe extern "C" fn(*mut c_void) -> c_int,
}

// SAFETY: the struct holds a pointer to a static string and function
// pointers, all immutable for the life of the process.
unsafe impl Sync for ProfilerV4 {}

/// What NCCL looks up (`dlsym(lib, "ncclProfiler_v4")`).
#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclProfiler_v4: ProfilerV4 = ProfilerV4 {
    name: c"whyslow".as_ptr(),
    init,
    start_event,
    stop_event,
    record_event_state,
    finalize,
};

static DISABLED: AtomicBool = AtomicBool::new(false);
static STATE: Mutex<Option<State>> = Mutex::new(None);

/// Turns the plugin off for the rest of the process, saying why once.
fn disable(why: &str) {
    if !DISABLED.swap(true, Ordering::SeqCst) {
        eprintln!("whyslow-nccl: disabled ({why}); training goes on without collective records");
    }
}

/// Runs `f` on the state unless the plugin is off; a panic or a poisoned
/// lock turns it off.
fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> Option<R> {
    if DISABLED.load(Ordering::Relaxed) {
        return None;
    }
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut guard = STATE.lock().ok()?;
        let state = guard.get_or_insert_with(State::default);
        Some(f(state))
    }));
    match out {
        Ok(Some(r)) => Some(r),
        Ok(None) => {
            disable("a lock was poisoned");
            None
        }
        Err(_) => {
            disable("a panic in the plugin");
            None
        }
    }
}

enum Event {
    Coll {
        ctx: u64,
        pending: Pending,
        expected_channels: u32,
        seen_channels: u32,
    },
    Channel {
        ctx: u64,
        coll: u64,
        gpu_end: u64,
    },
}

struct Context {
    comm: Comm,
    clock: GpuClock,
    /// Collective event ids in start order, for the cap.
    order: std::collections::VecDeque<u64>,
    /// Collective and point-to-point events NCCL started.
    started: u64,
}

#[derive(Default)]
struct State {
    next_id: u64,
    contexts: HashMap<u64, Context>,
    events: HashMap<u64, Event>,
    out: Option<std::io::BufWriter<std::fs::File>>,
    written: u64,
}

fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A C string, or "" for a null pointer or bytes that are not UTF-8.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string.
unsafe fn text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    CStr::from_ptr(p).to_str().unwrap_or("").to_string()
}

fn output_path() -> Result<std::path::PathBuf, String> {
    let dir = match (
        std::env::var_os("WHYSLOW_NCCL_DIR"),
        std::env::var_os("WHYSLOW_AGENT_DIR"),
    ) {
        (Some(d), _) => std::path::PathBuf::from(d),
        (None, Some(a)) => std::path::PathBuf::from(a).join("nccl"),
        (None, None) => return Err("neither WHYSLOW_NCCL_DIR nor WHYSLOW_AGENT_DIR is set".into()),
    };
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().replace(['/', ' '], "_"))
        .unwrap_or_else(|_| "host".into());
    let rank = std::env::var("RANK").unwrap_or_else(|_| "x".into());
    Ok(dir.join(format!(
        "{host}-rank{rank}-pid{}.collectives.jsonl",
        std::process::id()
    )))
}

impl State {
    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn write(&mut self, line: &str) -> Result<(), String> {
        let out = self.out.as_mut().ok_or("no output file")?;
        writeln!(out, "{line}").map_err(|e| e.to_string())?;
        self.written += 1;
        if self.written.is_multiple_of(256) {
            out.flush().map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Writes the collective `id` if it is complete (or `force`d) and
    /// forgets it.
    fn finish_coll(&mut self, id: u64, force: bool) {
        let complete = match self.events.get(&id) {
            Some(Event::Coll {
                pending,
                expected_channels,
                seen_channels,
                ..
            }) => force || (pending.done() && seen_channels >= expected_channels),
            _ => false,
        };
        if !complete {
            return;
        }
        let Some(Event::Coll { ctx, pending, .. }) = self.events.remove(&id) else {
            return;
        };
        let Some(c) = self.contexts.get(&ctx) else {
            return;
        };
        let record = pending.record(&c.comm, c.clock.offset_ns());
        let line = match serde_json::to_string(&record) {
            Ok(l) => l,
            Err(e) => return disable(&e.to_string()),
        };
        if let Err(e) = self.write(&line) {
            disable(&format!("writing collective records: {e}"));
        }
    }
}

/// The line for a communicator that ended without NCCL starting a single
/// collective event: why there are no records of it. NCCL 2.28 runs the
/// collectives of a one-rank communicator as a local copy, without its
/// profiler (H100, torch 2.11, world size 1: the plugin was loaded,
/// initialized and closed, and never given an event).
fn silent_comm_line(c: &Comm) -> String {
    let why = if c.nranks <= 1 {
        ": NCCL runs a one-rank communicator's collectives without its profiler"
    } else {
        ""
    };
    format!(
        "whyslow-nccl: communicator {} ({:#x}, {} rank(s)) ended without NCCL reporting any \
         collective to the profiler{why}",
        if c.name.is_empty() { "-" } else { &c.name },
        c.hash,
        c.nranks
    )
}

unsafe extern "C" fn init(
    context: *mut *mut c_void,
    mask: *mut c_int,
    comm_name: *const c_char,
    comm_hash: u64,
    _n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    _log: DebugLogger,
) -> c_int {
    if !mask.is_null() {
        *mask = 0;
    }
    let name = text(comm_name);
    let got = with_state(|s| -> Result<u64, String> {
        if s.out.is_none() {
            let path = output_path()?;
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            s.out = Some(std::io::BufWriter::new(f));
        }
        let id = s.id();
        s.contexts.insert(
            id,
            Context {
                comm: Comm {
                    hash: comm_hash,
                    name,
                    rank: rank.max(0) as u32,
                    nranks: nranks.max(0) as u32,
                    global_rank: std::env::var("RANK").ok().and_then(|r| r.parse().ok()),
                },
                clock: GpuClock::default(),
                order: Default::default(),
                started: 0,
            },
        );
        Ok(id)
    });
    match got {
        Some(Ok(id)) => {
            if !context.is_null() {
                *context = id as usize as *mut c_void;
            }
            if !mask.is_null() {
                *mask = (PROFILE_COLL | PROFILE_P2P | PROFILE_KERNEL_CH) as c_int;
            }
        }
        Some(Err(why)) => disable(&why),
        None => {}
    }
    NCCL_SUCCESS
}

unsafe extern "C" fn start_event(
    context: *mut c_void,
    handle: *mut *mut c_void,
    descr: *mut EventDescrV4,
) -> c_int {
    if !handle.is_null() {
        *handle = std::ptr::null_mut();
    }
    if descr.is_null() {
        return NCCL_SUCCESS;
    }
    let ctx = context as usize as u64;
    let d = &*descr;
    let kind = d.kind;
    // Read the descriptor (NCCL's memory) before taking the lock.
    let coll = match kind {
        PROFILE_COLL => {
            let c = d.u.coll;
            Some((
                Some(c.seq_number),
                text(c.func),
                c.count as u64,
                text(c.datatype),
                c.n_channels as u32,
            ))
        }
        PROFILE_P2P => {
            let p = d.u.p2p;
            // Point-to-point calls have no sequence number of their own.
            Some((
                None,
                text(p.func),
                p.count as u64,
                text(p.datatype),
                p.n_channels as u32,
            ))
        }
        _ => None,
    };
    let channel = if kind == PROFILE_KERNEL_CH {
        Some((d.parent_obj as usize as u64, d.u.kernel_ch.p_timer))
    } else {
        None
    };
    let id = with_state(|s| -> Option<u64> {
        if !s.contexts.contains_key(&ctx) {
            return None;
        }
        if let Some((seq, func, count, datatype, channels)) = coll {
            let id = s.id();
            let pending = Pending::new(seq, &func, count, &datatype, unix_ns());
            s.events.insert(
                id,
                Event::Coll {
                    ctx,
                    pending,
                    expected_channels: channels,
                    seen_channels: 0,
                },
            );
            let c = s.contexts.get_mut(&ctx)?;
            c.started += 1;
            c.order.push_back(id);
            if c.order.len() > MAX_PENDING {
                let oldest = c.order.pop_front()?;
                s.finish_coll(oldest, true);
            }
            return Some(id);
        }
        let (parent, gpu_start) = channel?;
        match s.events.get_mut(&parent) {
            Some(Event::Coll {
                pending,
                seen_channels,
                ..
            }) => {
                pending.channel_started(gpu_start);
                *seen_channels += 1;
            }
            _ => return None,
        }
        let id = s.id();
        s.events.insert(
            id,
            Event::Channel {
                ctx,
                coll: parent,
                gpu_end: 0,
            },
        );
        Some(id)
    });
    if let (Some(Some(id)), false) = (id, handle.is_null()) {
        *handle = id as usize as *mut c_void;
    }
    NCCL_SUCCESS
}

unsafe extern "C" fn record_event_state(
    handle: *mut c_void,
    state: c_int,
    args: *mut StateArgsV4,
) -> c_int {
    if state != STATE_KERNEL_CH_STOP || args.is_null() || handle.is_null() {
        return NCCL_SUCCESS;
    }
    let gpu = (*args).kernel_ch_p_timer;
    let id = handle as usize as u64;
    let now = unix_ns();
    with_state(|s| {
        let Some(Event::Channel { ctx, gpu_end, .. }) = s.events.get_mut(&id) else {
            return;
        };
        *gpu_end = gpu;
        let ctx = *ctx;
        if let Some(c) = s.contexts.get_mut(&ctx) {
            c.clock.observe(gpu, now);
        }
    });
    NCCL_SUCCESS
}

unsafe extern "C" fn stop_event(handle: *mut c_void) -> c_int {
    if handle.is_null() {
        return NCCL_SUCCESS;
    }
    let id = handle as usize as u64;
    let now = unix_ns();
    with_state(|s| match s.events.get_mut(&id) {
        Some(Event::Coll { pending, .. }) => {
            pending.stopped(now);
            s.finish_coll(id, false);
        }
        Some(Event::Channel { .. }) => {
            let Some(Event::Channel { coll, gpu_end, .. }) = s.events.remove(&id) else {
                return;
            };
            if let Some(Event::Coll { pending, .. }) = s.events.get_mut(&coll) {
                pending.channel_stopped(gpu_end);
                s.finish_coll(coll, false);
            }
        }
        None => {}
    });
    NCCL_SUCCESS
}

unsafe extern "C" fn finalize(context: *mut c_void) -> c_int {
    let ctx = context as usize as u64;
    with_state(|s| {
        // What is still open is written with what it has.
        let open: Vec<u64> = s
            .events
            .iter()
            .filter(|(_, e)| matches!(e, Event::Coll { ctx: c, .. } if *c == ctx))
            .map(|(&id, _)| id)
            .collect();
        let mut open = open;
        open.sort_unstable();
        for id in open {
            s.finish_coll(id, true);
        }
        s.events
            .retain(|_, e| !matches!(e, Event::Channel { ctx: c, .. } if *c == ctx));
        if let Some(c) = s.contexts.remove(&ctx) {
            if c.started == 0 {
                eprintln!("{}", silent_comm_line(&c.comm));
            }
        }
        if let Some(out) = s.out.as_mut() {
            if let Err(e) = out.flush() {
                disable(&format!("writing collective records: {e}"));
            }
        }
    });
    NCCL_SUCCESS
}
