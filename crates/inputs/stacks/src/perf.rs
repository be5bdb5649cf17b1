//! perf_event sampling of a process's threads: the software CPU clock (these
//! machines have no hardware PMU), each sample carrying the kernel callchain,
//! the user registers the unwinder needs (ip, sp, bp) and a copy of the top of
//! the user stack, which [`crate::unwind`] walks with DWARF CFI in userspace.
//!
//! This is the path SysOM-AI §3.3 keeps for nodes without usable eBPF; the
//! target is never stopped or ptraced (perf copies the stack at the tick).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use perf_event_open_sys as sys;
use sys::bindings as b;

use crate::StackError;

/// x86_64 perf register numbers (arch/x86/include/uapi/asm/perf_regs.h).
const REG_BP: u64 = 6;
const REG_SP: u64 = 7;
const REG_IP: u64 = 8;
/// Callchain entries at or above this are context markers, not addresses.
const PERF_CONTEXT_MAX: u64 = u64::MAX - 4094;

/// One sample as the kernel delivered it.
#[derive(Debug, Clone, Default)]
pub struct RawSample {
    /// Thread id.
    pub tid: u32,
    /// CLOCK_MONOTONIC, ns (as [`monotonic_ns`]).
    pub time: u64,
    /// Kernel frames, leaf first (empty when the tick hit user code).
    pub kernel: Vec<u64>,
    /// User registers (ip, sp, bp) when the thread was interrupted with a user
    /// context (a kernel-mode tick gives the registers at kernel entry).
    pub user_regs: Option<[u64; 3]>,
    /// The top of the user stack, from `sp` up.
    pub stack: Vec<u8>,
}

struct ThreadEvent {
    tid: i32,
    fd: OwnedFd,
    map: *mut u8,
    map_len: usize,
}

// SAFETY: the mapping is owned by the event and only touched through &mut self.
unsafe impl Send for ThreadEvent {}

impl Drop for ThreadEvent {
    fn drop(&mut self) {
        // SAFETY: map/map_len come from a successful mmap in `open_thread`.
        unsafe { libc::munmap(self.map as *mut libc::c_void, self.map_len) };
    }
}

/// Samples every thread of one process.
pub struct PerfSampler {
    pid: i32,
    hz: u64,
    stack_bytes: u32,
    data_pages: usize,
    events: Vec<ThreadEvent>,
    /// Records lost by the kernel (ring full).
    pub lost: u64,
    /// Threads perf refused (exited in between, permissions).
    pub refused: u64,
}

/// CLOCK_MONOTONIC now, ns: the clock of [`RawSample::time`].
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Data pages per thread's ring: room for ~100 ms of samples (drained every
/// 20 ms), a power of two between 8 and 256.
fn ring_pages(hz: u64, stack_bytes: u32) -> usize {
    let bytes = hz.clamp(1, 999) as f64 * 0.1 * (stack_bytes as f64 + 1024.0);
    ((bytes / page_size() as f64).ceil() as usize)
        .next_power_of_two()
        .clamp(8, 256)
}

/// The thread ids of `pid` now.
pub fn threads(pid: i32) -> Result<Vec<i32>, StackError> {
    let dir = format!("/proc/{pid}/task");
    let rd = std::fs::read_dir(&dir).map_err(|e| StackError::Io(dir.clone(), e))?;
    let mut out: Vec<i32> = rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    out.sort_unstable();
    Ok(out)
}

impl PerfSampler {
    /// Opens a sampling event on every thread of `pid` at `hz` (1..=999),
    /// copying `stack_bytes` of user stack per sample (a multiple of 8,
    /// ≤ 65528). Fails when perf_event_open is refused for the first thread.
    pub fn open(pid: i32, hz: u64, stack_bytes: u32) -> Result<Self, StackError> {
        let mut s = PerfSampler {
            pid,
            hz: hz.clamp(1, 999),
            stack_bytes: (stack_bytes.min(65528) / 8) * 8,
            data_pages: ring_pages(hz, stack_bytes),
            events: Vec::new(),
            lost: 0,
            refused: 0,
        };
        let tids = threads(pid)?;
        let mut first_err = None;
        for tid in tids {
            if let Err(e) = s.open_thread(tid) {
                s.refused += 1;
                first_err.get_or_insert(e);
            }
        }
        if s.events.is_empty() {
            return Err(first_err.unwrap_or(StackError::NoProcess(pid)));
        }
        Ok(s)
    }

    /// Threads sampled now.
    pub fn thread_count(&self) -> usize {
        self.events.len()
    }

    /// Opens events for threads started since the last call and forgets
    /// exited ones; returns how many were added.
    pub fn refresh_threads(&mut self) -> usize {
        let Ok(now) = threads(self.pid) else {
            return 0;
        };
        self.events.retain(|e| now.binary_search(&e.tid).is_ok());
        let mut added = 0;
        for tid in now {
            if !self.events.iter().any(|e| e.tid == tid) {
                match self.open_thread(tid) {
                    Ok(()) => added += 1,
                    Err(_) => self.refused += 1,
                }
            }
        }
        added
    }

    fn open_thread(&mut self, tid: i32) -> Result<(), StackError> {
        let mut attr = b::perf_event_attr {
            type_: b::PERF_TYPE_SOFTWARE,
            size: std::mem::size_of::<b::perf_event_attr>() as u32,
            config: b::PERF_COUNT_SW_CPU_CLOCK as u64,
            ..Default::default()
        };
        attr.__bindgen_anon_1.sample_freq = self.hz;
        attr.set_freq(1);
        attr.sample_type = (b::PERF_SAMPLE_TID
            | b::PERF_SAMPLE_TIME
            | b::PERF_SAMPLE_CALLCHAIN
            | b::PERF_SAMPLE_REGS_USER
            | b::PERF_SAMPLE_STACK_USER) as u64;
        attr.sample_regs_user = (1 << REG_BP) | (1 << REG_SP) | (1 << REG_IP);
        attr.sample_stack_user = self.stack_bytes;
        attr.set_exclude_callchain_user(1);
        attr.set_exclude_hv(1);
        // Sample times on CLOCK_MONOTONIC, so the reader can tell how old
        // a sample is when it reads what the kernel cannot (Python frames).
        attr.set_use_clockid(1);
        attr.clockid = libc::CLOCK_MONOTONIC;
        // Wake a poller at every sample: what is read from the process
        // beside the sample is read as close to its tick as the reader runs.
        attr.__bindgen_anon_2.wakeup_events = 1;
        attr.set_disabled(0);
        // SAFETY: attr is a valid perf_event_attr; pid=tid, cpu=-1 samples
        // that thread on any CPU.
        let fd = unsafe {
            sys::perf_event_open(
                &mut attr,
                tid,
                -1,
                -1,
                sys::bindings::PERF_FLAG_FD_CLOEXEC as u64,
            )
        };
        if fd < 0 {
            return Err(StackError::Perf(tid, std::io::Error::last_os_error()));
        }
        // SAFETY: fd was just returned by the kernel and is owned here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let map_len = (1 + self.data_pages) * page_size();
        // SAFETY: mapping the event's ring buffer as perf_event_open(2) describes.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(StackError::Perf(tid, std::io::Error::last_os_error()));
        }
        self.events.push(ThreadEvent {
            tid,
            fd,
            map: map as *mut u8,
            map_len,
        });
        Ok(())
    }

    /// Blocks until a sample is waiting in some thread's ring or `timeout`
    /// passed (or a signal came).
    pub fn wait(&self, timeout: std::time::Duration) {
        let mut fds: Vec<libc::pollfd> = self
            .events
            .iter()
            .map(|e| libc::pollfd {
                fd: e.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        if fds.is_empty() {
            std::thread::sleep(timeout);
            return;
        }
        // SAFETY: fds is a valid array of fds.len() pollfd structs.
        unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                timeout.as_millis().min(i32::MAX as u128) as i32,
            )
        };
    }

    /// Moves every delivered sample into `out`.
    pub fn drain(&mut self, out: &mut Vec<RawSample>) {
        let page = page_size();
        let mut record = Vec::new();
        for ev in &mut self.events {
            let _ = &ev.fd;
            let meta = ev.map as *mut b::perf_event_mmap_page;
            let data = ev.map.wrapping_add(page);
            let size = (ev.map_len - page) as u64;
            // SAFETY: meta points at the mapped control page; data_head is
            // read with acquire ordering before the data it covers.
            let head = unsafe {
                let h = std::ptr::read_volatile(&(*meta).data_head);
                std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
                h
            };
            // SAFETY: as above.
            let mut tail = unsafe { std::ptr::read_volatile(&(*meta).data_tail) };
            while tail + 8 <= head {
                let copy = |from: u64, len: usize, buf: &mut Vec<u8>| {
                    buf.clear();
                    let start = (from % size) as usize;
                    let first = len.min(size as usize - start);
                    // SAFETY: both ranges lie inside the data area (the
                    // record wraps at its end at most once).
                    unsafe {
                        buf.extend_from_slice(std::slice::from_raw_parts(data.add(start), first));
                        buf.extend_from_slice(std::slice::from_raw_parts(data, len - first));
                    }
                };
                copy(tail, 8, &mut record);
                let kind = u32::from_ne_bytes(record[0..4].try_into().unwrap_or_default());
                let len = u16::from_ne_bytes(record[6..8].try_into().unwrap_or_default()) as u64;
                if len < 8 || tail + len > head {
                    break;
                }
                copy(tail, len as usize, &mut record);
                if kind == b::PERF_RECORD_SAMPLE {
                    if let Some(s) = parse_sample(&record[8..]) {
                        out.push(s);
                    }
                } else if kind == b::PERF_RECORD_LOST && record.len() >= 24 {
                    self.lost += u64::from_ne_bytes(record[16..24].try_into().unwrap_or_default());
                }
                tail += len;
            }
            std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
            // SAFETY: writing data_tail tells the kernel the space is free.
            unsafe { std::ptr::write_volatile(&mut (*meta).data_tail, tail) };
        }
    }
}

/// Parses a PERF_RECORD_SAMPLE body laid out for this sampler's sample_type
/// (TID, TIME, CALLCHAIN, REGS_USER with 3 registers, STACK_USER).
pub fn parse_sample(body: &[u8]) -> Option<RawSample> {
    let mut at = 0usize;
    let u64_at = |at: &mut usize| -> Option<u64> {
        let v = u64::from_ne_bytes(body.get(*at..*at + 8)?.try_into().ok()?);
        *at += 8;
        Some(v)
    };
    let pid_tid = u64_at(&mut at)?;
    let tid = (pid_tid >> 32) as u32;
    let time = u64_at(&mut at)?;
    let nr = u64_at(&mut at)? as usize;
    if nr > 4096 {
        return None;
    }
    let mut kernel = Vec::with_capacity(nr);
    for _ in 0..nr {
        let ip = u64_at(&mut at)?;
        if ip < PERF_CONTEXT_MAX {
            kernel.push(ip);
        }
    }
    let abi = u64_at(&mut at)?;
    let user_regs = if abi != 0 {
        // Registers in ascending bit order: bp (6), sp (7), ip (8).
        let bp = u64_at(&mut at)?;
        let sp = u64_at(&mut at)?;
        let ip = u64_at(&mut at)?;
        Some([ip, sp, bp])
    } else {
        None
    };
    let size = u64_at(&mut at)? as usize;
    let mut stack = Vec::new();
    if size > 0 {
        let bytes = body.get(at..at + size)?;
        at += size;
        let dyn_size = (u64_at(&mut at)? as usize).min(size);
        stack.extend_from_slice(&bytes[..dyn_size]);
    }
    Some(RawSample {
        tid,
        time,
        kernel,
        user_regs,
        stack,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(v: &mut Vec<u8>, x: u64) {
        v.extend_from_slice(&x.to_ne_bytes());
    }

    #[test]
    fn a_sample_body_parses_and_truncated_ones_do_not() {
        let mut body = Vec::new();
        push(&mut body, (7u64 << 32) | 7); // pid, tid
        push(&mut body, 123); // time
        push(&mut body, 3); // callchain nr
        push(&mut body, u64::MAX - 127); // PERF_CONTEXT_KERNEL
        push(&mut body, 0xffff_ffff_8100_0010);
        push(&mut body, 0xffff_ffff_8100_0020);
        push(&mut body, 2); // abi 64
        push(&mut body, 0x7000); // bp
        push(&mut body, 0x6000); // sp
        push(&mut body, 0x401000); // ip
        push(&mut body, 16); // stack size
        body.extend_from_slice(&[1u8; 16]);
        push(&mut body, 8); // dyn_size
        let s = parse_sample(&body).unwrap();
        assert_eq!(s.tid, 7);
        assert_eq!(s.kernel, vec![0xffff_ffff_8100_0010, 0xffff_ffff_8100_0020]);
        assert_eq!(s.user_regs, Some([0x401000, 0x6000, 0x7000]));
        assert_eq!(s.stack.len(), 8);
        for cut in 0..body.len() - 8 {
            let _ = parse_sample(&body[..cut]); // never panics
        }
        assert!(parse_sample(&body[..20]).is_none());
    }
}
