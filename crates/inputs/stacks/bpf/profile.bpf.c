// SPDX-License-Identifier: GPL-2.0 OR MIT
//
// whyslow's in-kernel CPU stack sampler (SysOM-AI §3.3): one program on a
// software cpu-clock perf event per CPU. On each tick it filters the current
// task (registered processes, cgroups or the whole host), keeps a fraction of
// the ticks (the paper's "sampling rate"), takes the kernel stack, the user
// stack and, in a CPython process, the Python frames (python.bpf.h), stores
// each stack once under its 64-bit hash and counts (process, thread, kernel
// stack, user stack, Python stack) in a hash map. Userspace
// reads the counts of one generation while the program counts into the other
// (double buffering), so there is no per-sample wake-up.
//
// Only UAPI types are used (struct bpf_perf_event_data, helper calls): no
// kernel structure is read, so the object needs no CO-RE relocation and loads
// on any kernel with bpf_get_stack (4.18+) and bpf_get_current_cgroup_id.
//
// Built by scripts/build-bpf (clang -target bpf); the object is checked in
// next to this file and CI checks that it is current.

#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>

#include "stacks.bpf.h"
#include "unwind.bpf.h"
#include "python.bpf.h"

SEC("perf_event")
int on_cpu_clock(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	__u32 tid = (__u32)id;
	count(STAT_TICKS);
	if (tid == 0) {
		count(STAT_IDLE);
		return 0;
	}
	if (!wanted(tgid)) {
		count(STAT_FILTERED);
		return 0;
	}
	if (RATE_PER_MILLE < 1000 && bpf_get_prandom_u32() % 1000 >= RATE_PER_MILLE) {
		count(STAT_SKIPPED);
		return 0;
	}
	__u32 zero = 0;
	struct stack *s = bpf_map_lookup_elem(&scratch, &zero);
	__u32 *generation = bpf_map_lookup_elem(&control, &zero);
	if (!s || !generation || *generation == GENERATION_STOPPED)
		return 0;
	struct count_key key = {};
	key.tgid = tgid;
	key.tid = tid;
	key.generation = *generation;
	key.kernel = take_stack(ctx, s, 0, STAT_KSTACK_ERR);
	key.python = take_python_stack(s, tgid, tid);
	key.user = take_user_stack(ctx, (struct pt_regs *)&ctx->regs, s, tgid, &key);
	count(STAT_SAMPLES);
	if (key.user == COPIED_TO_USERSPACE)
		return 0; /* counted by the drain */
	__u64 *c = bpf_map_lookup_elem(&counts, &key);
	if (c) {
		__sync_fetch_and_add(c, 1);
		return 0;
	}
	__u64 one = 1;
	if (bpf_map_update_elem(&counts, &key, &one, BPF_NOEXIST)) {
		c = bpf_map_lookup_elem(&counts, &key);
		if (c)
			__sync_fetch_and_add(c, 1);
		else
			count(STAT_COUNTS_FULL);
	}
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
