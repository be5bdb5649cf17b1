// SPDX-License-Identifier: GPL-2.0 OR MIT
//
// whyslow's collective tracer for gloo (SysOM-AI §3.2): uprobes on the entry
// and return of gloo's collective functions (gloo::allreduce, allgather,
// broadcast, ... as exported by PyTorch's libtorch_cpu.so). Each call of a
// traced process becomes one event on a ring buffer: process, thread, the
// operation, entry and exit times (CLOCK_MONOTONIC), the gloo::Context the
// call ran in (its address and first words: rank and size) and two words of the options
// from which userspace takes the payload size where the layout is known.
//
// The options object is read, never written; a call whose entry was not seen
// (the probe attached mid-call) is dropped at its return.
//
// Only UAPI types: no kernel structure is read (no CO-RE relocation).
// Built by scripts/build-bpf; the object is checked in next to this file.

#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

/* Operations: the index userspace gives each probe pair. */
#define OP_ALLREDUCE 0
#define OP_ALLGATHER 1
#define OP_ALLGATHERV 2
#define OP_BROADCAST 3
#define OP_REDUCE 4
#define OP_BARRIER 5
#define OP_GATHER 6
#define OP_SCATTER 7
#define OP_ALLTOALL 8
#define OP_ALLTOALLV 9

/* Indices of `stats`. */
#define STAT_ENTRIES 0
#define STAT_EVENTS 1
#define STAT_NO_ENTRY 2
#define STAT_RING_FULL 3
#define STAT_READ_ERR 4
#define N_STATS 5

/* Words of the options object copied for userspace. */
#define OPTION_WORDS 20

/* 1: trace only the processes in `targets`; 0: every process. */
volatile const __u32 FILTER_PIDS = 1;

struct entry {
	__u64 entry_ns;
	__u64 context;
	__s32 context_words[4];
	__u32 op;
	__u32 pad;
	__u64 options[OPTION_WORDS];
};

struct event {
	__u32 tgid;
	__u32 tid;
	__u32 op;
	__u32 pad;
	__s32 context_words[4];
	__u64 context;
	__u64 entry_ns;
	__u64 exit_ns;
	__u64 options[OPTION_WORDS];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} targets SEC(".maps");

/* Calls in flight, by thread (a collective runs on one thread). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct entry);
} inflight SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, N_STATS);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void bump(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &i);
	if (v)
		(*v)++;
}

static __always_inline int on_enter(struct pt_regs *ctx, __u32 op)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (FILTER_PIDS && !bpf_map_lookup_elem(&targets, &tgid))
		return 0;
	struct entry e = {};
	e.entry_ns = bpf_ktime_get_ns();
	e.op = op;
	/* Every gloo options class starts with std::shared_ptr<Context>: the
	 * Context's address, then its control block. The Context starts with
	 * `const int rank; const int size;` (after a vtable pointer in builds
	 * where it has one): userspace tells which from the words. */
	void *options = (void *)PT_REGS_PARM1(ctx);
	if (bpf_probe_read_user(e.options, sizeof(e.options), options) == 0) {
		e.context = e.options[0];
		if (e.context)
			bpf_probe_read_user(e.context_words, sizeof(e.context_words),
					    (void *)e.context);
	} else {
		bump(STAT_READ_ERR);
	}
	bpf_map_update_elem(&inflight, &tid, &e, BPF_ANY);
	bump(STAT_ENTRIES);
	return 0;
}

static __always_inline int on_exit(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	struct entry *e = bpf_map_lookup_elem(&inflight, &tid);
	if (!e) {
		if (!FILTER_PIDS || bpf_map_lookup_elem(&targets, &tgid))
			bump(STAT_NO_ENTRY);
		return 0;
	}
	struct event *out = bpf_ringbuf_reserve(&events, sizeof(*out), 0);
	if (!out) {
		bump(STAT_RING_FULL);
		bpf_map_delete_elem(&inflight, &tid);
		return 0;
	}
	out->tgid = tgid;
	out->tid = tid;
	out->op = e->op;
	out->pad = 0;
	__builtin_memcpy(out->context_words, e->context_words, sizeof(out->context_words));
	out->context = e->context;
	out->entry_ns = e->entry_ns;
	out->exit_ns = bpf_ktime_get_ns();
	__builtin_memcpy(out->options, e->options, sizeof(out->options));
	bpf_ringbuf_submit(out, 0);
	bpf_map_delete_elem(&inflight, &tid);
	bump(STAT_EVENTS);
	return 0;
}

#define PROBES(name, op)                                           \
	SEC("uprobe")                                              \
	int enter_##name(struct pt_regs *ctx) { return on_enter(ctx, op); } \
	SEC("uretprobe")                                           \
	int exit_##name(struct pt_regs *ctx) { return on_exit(ctx); }

PROBES(allreduce, OP_ALLREDUCE)
PROBES(allgather, OP_ALLGATHER)
PROBES(allgatherv, OP_ALLGATHERV)
PROBES(broadcast, OP_BROADCAST)
PROBES(reduce, OP_REDUCE)
PROBES(barrier, OP_BARRIER)
PROBES(gather, OP_GATHER)
PROBES(scatter, OP_SCATTER)
PROBES(alltoall, OP_ALLTOALL)
PROBES(alltoallv, OP_ALLTOALLV)

char LICENSE[] SEC("license") = "Dual MIT/GPL";
