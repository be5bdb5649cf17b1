// SPDX-License-Identifier: GPL-2.0 OR MIT
//
// whyslow's off-CPU profiler (beyond SysOM-AI, which lists blocked time as a
// limitation of on-CPU sampling): a raw tracepoint on sched_switch. When a
// target thread leaves the CPU blocked (prev_state != running: a read, a
// lock, a sleep), its kernel and frame-pointer user stacks are taken and kept
// with the time; when it runs again, the time it was off the CPU is added,
// in microseconds, to (process, thread, kernel stack, user stack) in the
// same double-buffered counts as profile.bpf.c. A preempted thread (still
// runnable) is not counted: that is run-queue delay, which the OS signals
// measure.
//
// A user stack that meets a CFI rule the in-kernel unwinder does not
// evaluate is kept as far as it got (the userspace fallback of on-CPU samples
// needs the stack copied when the thread blocks, and the count comes later).
//
// `next`'s pid and tgid are read from its task_struct with CO-RE (the
// loader relocates the field offsets against the kernel's BTF); prev_state
// is the tracepoint's fourth argument (Linux 5.18 and later).

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#include "stacks.bpf.h"
#include "unwind.bpf.h"
#include "python.bpf.h"

/* `stats` here (stacks.bpf.h's indices): TICKS switches seen, FILTERED left
 * out by the filter, SKIPPED preempted (still runnable), SAMPLES off-CPU
 * intervals counted, IDLE unused. */

struct task_struct {
	int pid;
	int tgid;
} __attribute__((preserve_access_index));

struct blocked {
	__u64 since_ns;
	__u64 kernel;
	__u64 user;
	__u64 python;
	__u32 tgid;
	__u32 pad;
};

/* Threads off the CPU now: tid → since when, with which stacks. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct blocked);
} off SEC(".maps");

/* TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next,
 *          unsigned int prev_state) */
SEC("raw_tp/sched_switch")
int on_sched_switch(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 now = bpf_ktime_get_ns();
	__u64 id = bpf_get_current_pid_tgid();
	__u32 prev_tgid = id >> 32;
	__u32 prev_tid = (__u32)id;
	unsigned int prev_state = (unsigned int)ctx->args[3];
	struct task_struct *next = (struct task_struct *)ctx->args[2];
	__u32 zero = 0;
	count(STAT_TICKS);

	/* The thread leaving: blocked (not merely preempted) and a target. */
	if (prev_tid != 0) {
		if (prev_state == 0) {
			count(STAT_SKIPPED);
		} else if (!wanted(prev_tgid)) {
			count(STAT_FILTERED);
		} else {
			struct stack *s = bpf_map_lookup_elem(&scratch, &zero);
			if (s) {
				struct blocked b = {};
				b.since_ns = now;
				b.tgid = prev_tgid;
				b.kernel = take_stack(ctx, s, 0, STAT_KSTACK_ERR);
				b.python = take_python_stack(s, prev_tgid, prev_tid);
				b.user = take_user_stack(ctx, 0, s, prev_tgid, 0);
				bpf_map_update_elem(&off, &prev_tid, &b, BPF_ANY);
			}
		}
	}

	/* The thread coming back: how long it was off the CPU, under the
	 * stacks it left with. */
	__u32 next_tid = (__u32)BPF_CORE_READ(next, pid);
	if (next_tid == 0)
		return 0;
	struct blocked *b = bpf_map_lookup_elem(&off, &next_tid);
	if (!b)
		return 0;
	__u64 us = (now - b->since_ns) / 1000;
	__u32 *generation = bpf_map_lookup_elem(&control, &zero);
	if (!generation || *generation == GENERATION_STOPPED) {
		bpf_map_delete_elem(&off, &next_tid);
		return 0;
	}
	struct count_key key = {};
	key.tgid = b->tgid;
	key.tid = next_tid;
	key.kernel = b->kernel;
	key.user = b->user;
	key.python = b->python;
	key.generation = *generation;
	bpf_map_delete_elem(&off, &next_tid);
	if (us == 0)
		return 0;
	count(STAT_SAMPLES);
	__u64 *c = bpf_map_lookup_elem(&counts, &key);
	if (c) {
		__sync_fetch_and_add(c, us);
		return 0;
	}
	if (bpf_map_update_elem(&counts, &key, &us, BPF_NOEXIST)) {
		c = bpf_map_lookup_elem(&counts, &key);
		if (c)
			__sync_fetch_and_add(c, us);
		else
			count(STAT_COUNTS_FULL);
	}
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
