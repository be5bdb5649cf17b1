// SPDX-License-Identifier: GPL-2.0 OR MIT
//
// Python frames in the kernel (SysOM-AI §3.3: one stack from Python down to
// the kernel, for every process of the host). CPython 3.10–3.13 keep each
// thread's frames on the heap: _PyRuntime → interpreters → thread states
// (matched to the sampled thread by `native_thread_id`, the Linux tid; on
// 3.10 by `thread_id`, its pthread_self(), which on x86-64 is the thread's
// FS base) → current frame → previous → …, each frame naming its code
// object. At the
// tick the program records the chain's code object addresses, innermost
// first, as a stack of its own (stored under its hash in `stacks`, as native
// stacks are); userspace reads each code object's name, file and first line
// from the process's memory (whyslow_stacks::python) and puts the Python
// frames in place of the interpreter's evaluation frames.
//
// Field offsets come from libpython's DWARF (whyslow_stacks::python::Layout),
// written per process in `py_procs`; a process without an entry has no Python
// stack. Bit 0 of a recorded address (code objects are 8-byte aligned) marks
// the frame that began a C-level evaluation call (3.10: every frame; 3.11:
// `is_entry`; 3.12+: the frame below a C-stack shim frame), which splits the chain into one group
// per `_PyEval_EvalFrameDefault` frame of the native stack.
//
// The walk runs under bpf_loop, one pointer step per iteration, so the
// verifier checks the step once.

#ifndef WHYSLOW_PYTHON_BPF_H
#define WHYSLOW_PYTHON_BPF_H

#include <bpf/bpf_core_read.h>

/* One process's interpreter (whyslow_stacks::ebpf_python's PyProcC). */
struct py_proc {
	__u64 runtime; /* address of _PyRuntime */
	__u32 interp_head; /* _PyRuntimeState.interpreters.head */
	__u32 interp_next; /* PyInterpreterState.next */
	__u32 interp_threads; /* PyInterpreterState.threads.head */
	__u32 tstate_next; /* PyThreadState.next */
	__u32 tstate_tid; /* PyThreadState.native_thread_id */
	__u32 tstate_frame; /* .cframe (3.11, 3.12) or .current_frame (3.13) */
	__u32 cframe_frame; /* _PyCFrame.current_frame; PY_NO_CFRAME on 3.13 */
	__u32 frame_code; /* _PyInterpreterFrame.f_code / f_executable */
	__u32 frame_previous; /* _PyInterpreterFrame.previous */
	__u32 frame_entry; /* .is_entry (3.11) or .owner (3.12+) */
	__u32 entry_is_flag; /* 1: is_entry; 0: owner, PY_OWNED_BY_CSTACK a shim;
			      * 2: every frame (3.10) */
	__u32 tid_is_pthread; /* 3.10: tstate_tid holds pthread_self() */
};

/* The kernel's record of the thread's FS base (x86-64: pthread_self()),
 * found by CO-RE: only these fields are relocated. */
struct thread_struct___py {
	unsigned long fsbase;
} __attribute__((preserve_access_index));
struct task_struct___py {
	struct thread_struct___py thread;
} __attribute__((preserve_access_index));

#define PY_NO_CFRAME 0xffffffff
#define PY_OWNED_BY_CSTACK 3
/* The walk's bound, in pointer steps: thread states searched and
 * interpreters followed, then frames (at most MAX_DEPTH of them). */
#define PY_MAX_STEPS 512

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct py_proc);
} py_procs SEC(".maps");

#define PY_PHASE_THREADS 0
#define PY_PHASE_FRAMES 1

struct py_walk {
	struct py_proc p;
	__u64 interp;
	__u64 ts;
	__u64 frame;
	__u64 self; /* the thread's id as tstate_tid holds it */
	__u32 phase;
	__u32 pad;
};

static __always_inline __u64 py_read(__u64 addr)
{
	__u64 v = 0;
	if (bpf_probe_read_user(&v, sizeof(v), (const void *)addr))
		return 0;
	return v;
}

/* One step: the next thread state, or the next frame. 0 goes on. No step
 * counter lives in the state (bpf_loop bounds the walk): an exact counter
 * makes every iteration a new state to the verifier, which then never
 * finishes (see unwind.bpf.h's find_mapping). */
static long py_step(__u32 i, void *arg)
{
	struct py_walk *w = arg;
	if (w->phase == PY_PHASE_THREADS) {
		if (w->ts == 0) {
			if (w->interp == 0)
				return 1;
			w->interp = py_read(w->interp + w->p.interp_next);
			w->ts = w->interp ? py_read(w->interp + w->p.interp_threads) : 0;
			return w->interp == 0;
		}
		__u64 id = py_read(w->ts + w->p.tstate_tid);
		if (!w->p.tid_is_pthread)
			id = (__u32)id;
		if (id != w->self) {
			w->ts = py_read(w->ts + w->p.tstate_next);
			return 0;
		}
		__u64 f = py_read(w->ts + w->p.tstate_frame);
		if (w->p.cframe_frame != PY_NO_CFRAME && f)
			f = py_read(f + w->p.cframe_frame);
		w->frame = f;
		w->phase = PY_PHASE_FRAMES;
		return f == 0;
	}
	__u32 zero = 0;
	struct stack *s = bpf_map_lookup_elem(&scratch, &zero);
	if (!s || w->frame == 0)
		return 1;
	/* The depth lives in the map value (see unwind.bpf.h's find_mapping). */
	__u64 n = s->depth;
	if (n >= MAX_DEPTH)
		return 1;
	__u64 frame = w->frame;
	__u8 entry = 0;
	bpf_probe_read_user(&entry, 1, (const void *)(frame + w->p.frame_entry));
	w->frame = py_read(frame + w->p.frame_previous);
	if (!w->p.entry_is_flag && entry == PY_OWNED_BY_CSTACK) {
		/* A shim: the frame pushed before it began a C-level call. */
		if (n > 0)
			s->ips[n - 1] |= 1;
		return 0;
	}
	__u64 code = py_read(frame + w->p.frame_code);
	if (code == 0)
		return 0;
	__u64 starts = w->p.entry_is_flag == 2 || (w->p.entry_is_flag == 1 && entry);
	s->ips[n] = (code & ~1ULL) | starts;
	s->depth = n + 1;
	return 0;
}

/* The current thread's Python stack (code object addresses, innermost first)
 * stored under its hash; 0 when the process runs no known CPython or the
 * thread has no Python frames. Uses the scratch stack s. */
static __always_inline __u64 take_python_stack(struct stack *s, __u32 tgid, __u32 tid)
{
	struct py_proc *p = bpf_map_lookup_elem(&py_procs, &tgid);
	if (!p)
		return 0;
	struct py_walk w = {};
	w.p = *p;
	w.self = tid;
	if (p->tid_is_pthread) {
#if defined(__TARGET_ARCH_x86)
		struct task_struct___py *task = (void *)bpf_get_current_task();
		w.self = BPF_CORE_READ(task, thread.fsbase);
#else
		return 0;
#endif
	}
	w.interp = py_read(p->runtime + p->interp_head);
	if (w.interp == 0)
		return 0;
	w.ts = py_read(w.interp + p->interp_threads);
	s->depth = 0;
	bpf_loop(PY_MAX_STEPS, py_step, &w, 0);
	__u64 n = s->depth;
	if (n == 0 || n > MAX_DEPTH)
		return 0;
	return store_stack(s, n);
}

#endif
