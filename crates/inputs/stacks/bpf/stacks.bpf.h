// SPDX-License-Identifier: GPL-2.0 OR MIT
//
// What whyslow's two stack programs share (profile.bpf.c: on-CPU samples;
// offcpu.bpf.c: blocked time): the target filter, the double-buffered
// counts keyed by (process, thread, kernel stack, user stack, generation),
// the stacks stored once under their hash, the counters, and the helpers
// that take a stack and bump a counter. One layout, so userspace drains both
// the same way (`whyslow_stacks::ebpf`).

#ifndef WHYSLOW_STACKS_BPF_H
#define WHYSLOW_STACKS_BPF_H

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
/* The in-kernel unwinder (unwind.bpf.h): how walks ended, steps taken. */
#define STAT_UNW_END 9         /* reached the outermost frame */
#define STAT_UNW_TRUNCATED 10  /* MAX_DEPTH frames */
#define STAT_UNW_NO_CFI 11     /* no row and no valid frame pointer */
#define STAT_UNW_UNSUPPORTED 12 /* a rule the program does not evaluate */
#define STAT_UNW_BAD_IP 13     /* a return address outside executable code */
#define STAT_UNW_READ_ERR 14   /* user memory not readable */
#define STAT_UNW_NOT_LOADED 15 /* no tables for the process yet: kernel FP walk */
#define STAT_UNW_DWARF_STEPS 16
#define STAT_UNW_FP_STEPS 17
#define STAT_UNW_COPIED 18     /* stopped at an unsupported rule: stack copied to userspace */
#define STAT_UNW_COPY_LOST 19  /* ... but the ring buffer was full: the partial stack is counted */
#define N_STATS 20

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
	__u64 python; /* the Python stack's hash (python.bpf.h), 0: none */
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

/* [0]: the generation samples are counted into (userspace flips it), or
 * GENERATION_STOPPED: count nothing more (the last drain is exact). */
#define GENERATION_STOPPED 2
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
	/* 0: no stack; ~0: COPIED_TO_USERSPACE (unwind.bpf.h). */
	return (h == 0 || h == ~0ULL) ? 1 : h;
}

/* Stores the first `depth` addresses of s under their hash and returns the
 * hash. */
static __always_inline __u64 store_stack(struct stack *s, __u32 depth)
{
	s->depth = depth;
	__u64 h = stack_hash(s, depth);
	if (!bpf_map_lookup_elem(&stacks, &h)) {
		if (bpf_map_update_elem(&stacks, &h, s, BPF_NOEXIST) && !bpf_map_lookup_elem(&stacks, &h))
			count(STAT_STACKS_FULL);
	}
	return h;
}

/* Takes one stack into the scratch buffer, stores it under its hash and
 * returns the hash (0 when there is none). */
static __always_inline __u64 take_stack(void *ctx, struct stack *s, __u64 flags, __u32 err_stat)
{
	long n = bpf_get_stack(ctx, s->ips, sizeof(s->ips), flags);
	if (n < 0) {
		count(err_stat);
		return 0;
	}
	__u32 depth = (__u32)n / sizeof(__u64);
	if (depth == 0)
		return 0;
	return store_stack(s, depth);
}


/* Whether the current task is a target of the filter. */
static __always_inline int wanted(__u32 tgid)
{
	if (FILTER == FILTER_PIDS)
		return bpf_map_lookup_elem(&pids, &tgid) != 0;
	if (FILTER == FILTER_CGROUPS) {
		__u64 cg = bpf_get_current_cgroup_id();
		return bpf_map_lookup_elem(&cgroups, &cg) != 0;
	}
	return 1;
}

#endif
