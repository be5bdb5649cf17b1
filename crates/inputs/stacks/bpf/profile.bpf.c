// SPDX-License-Identifier: GPL-2.0 OR MIT
//
// whyslow's in-kernel CPU stack sampler (SysOM-AI §3.3): one program on a
// software cpu-clock perf event per CPU. On each tick it filters the current
// task (registered processes, cgroups or the whole host), keeps a fraction of
// the ticks (the paper's "sampling rate"), takes the kernel stack and the
// frame-pointer user stack, stores each stack once under its 64-bit hash and
// counts (process, thread, kernel stack, user stack) in a hash map. Userspace
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

#define MAX_DEPTH 127

/* Filter modes (FILTER). */
#define FILTER_ALL 0
#define FILTER_PIDS 1
#define FILTER_CGROUPS 2

/* Indices of `stats`. */
#define STAT_TICKS 0
#define STAT_FILTERED 1
#define STAT_SKIPPED 2
#define STAT_SAMPLES 3
#define STAT_KSTACK_ERR 4
#define STAT_USTACK_ERR 5
#define STAT_STACKS_FULL 6
#define STAT_COUNTS_FULL 7
#define STAT_IDLE 8
#define N_STATS 9

/* Set at load time. */
volatile const __u32 FILTER = FILTER_ALL;
/* Ticks out of 1000 that take a stack. */
volatile const __u32 RATE_PER_MILLE = 1000;

struct stack {
	__u64 depth;
	__u64 ips[MAX_DEPTH];
};

struct count_key {
	__u32 tgid;
	__u32 tid;
	__u64 kernel;
	__u64 user;
	__u32 generation;
	__u32 pad;
};

/* Preallocated: an allocation from the timer interrupt can fail (the
 * no-prealloc maps' per-CPU caches run dry when many new stacks come at
 * once). Kernel memory: ≈ 2.5 MB for counts, 8.5 MB for stacks. Userspace
 * deletes what it has read, each drain. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, struct count_key);
	__type(value, __u64);
} counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u64);
	__type(value, struct stack);
} stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} pids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, __u8);
} cgroups SEC(".maps");

/* [0]: the generation samples are counted into (userspace flips it). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} control SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, N_STATS);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stack);
} scratch SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &which);
	if (v)
		*v += 1;
}

/* FNV-1a over the stack's addresses; 0 stands for "no stack". */
static __always_inline __u64 stack_hash(const struct stack *s, __u32 depth)
{
	__u64 h = 0xcbf29ce484222325ULL;
	for (__u32 i = 0; i < MAX_DEPTH; i++) {
		if (i >= depth)
			break;
		h ^= s->ips[i];
		h *= 0x100000001b3ULL;
	}
	return h ? h : 1;
}

/* Takes one stack into the scratch buffer, stores it under its hash and
 * returns the hash (0 when there is none). */
static __always_inline __u64 take_stack(struct bpf_perf_event_data *ctx, struct stack *s,
					__u64 flags, __u32 err_stat)
{
	long n = bpf_get_stack(ctx, s->ips, sizeof(s->ips), flags);
	if (n < 0) {
		count(err_stat);
		return 0;
	}
	__u32 depth = (__u32)n / sizeof(__u64);
	if (depth == 0)
		return 0;
	s->depth = depth;
	__u64 h = stack_hash(s, depth);
	if (!bpf_map_lookup_elem(&stacks, &h)) {
		if (bpf_map_update_elem(&stacks, &h, s, BPF_NOEXIST) && !bpf_map_lookup_elem(&stacks, &h))
			count(STAT_STACKS_FULL);
	}
	return h;
}

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
	if (FILTER == FILTER_PIDS) {
		if (!bpf_map_lookup_elem(&pids, &tgid)) {
			count(STAT_FILTERED);
			return 0;
		}
	} else if (FILTER == FILTER_CGROUPS) {
		__u64 cg = bpf_get_current_cgroup_id();
		if (!bpf_map_lookup_elem(&cgroups, &cg)) {
			count(STAT_FILTERED);
			return 0;
		}
	}
	if (RATE_PER_MILLE < 1000 && bpf_get_prandom_u32() % 1000 >= RATE_PER_MILLE) {
		count(STAT_SKIPPED);
		return 0;
	}
	__u32 zero = 0;
	struct stack *s = bpf_map_lookup_elem(&scratch, &zero);
	__u32 *generation = bpf_map_lookup_elem(&control, &zero);
	if (!s || !generation)
		return 0;
	struct count_key key = {};
	key.tgid = tgid;
	key.tid = tid;
	key.generation = *generation;
	key.kernel = take_stack(ctx, s, 0, STAT_KSTACK_ERR);
	key.user = take_stack(ctx, s, BPF_F_USER_STACK, STAT_USTACK_ERR);
	count(STAT_SAMPLES);
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
