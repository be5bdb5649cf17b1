// SPDX-License-Identifier: GPL-2.0 OR MIT
//
// whyslow's NCCL fallback tracer (SysOM-AI §3.2): uprobes on the entry and
// return of NCCL's exported collective calls (ncclAllReduce, ncclBroadcast,
// ncclReduce, ncclAllGather, ncclReduceScatter, ncclSend, ncclRecv) in the
// process's libnccl. For when the profiler plugin (apps/nccl-plugin) is not
// loaded: what it sees is the host side — when the rank called into NCCL
// to enqueue the collective and when the call returned — not the kernel's
// execution on the GPU. A rank that is late to call is late here too.
//
// Each call becomes one ring-buffer event: process, thread, operation, the
// communicator's address (one per communicator in a process), element
// count, datatype, peer (send/recv), the call's result and entry/return
// times (CLOCK_MONOTONIC). Arguments come from the System V x86-64 calling
// convention (ncclReduce's communicator is its 7th argument, on the stack).
//
// Only UAPI types: no kernel structure is read. Built by scripts/build-bpf;
// the object is checked in next to this file.

#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

/* Operations: the index userspace gives each probe pair (NCCL_OPS). */
#define OP_ALLREDUCE 0
#define OP_BROADCAST 1
#define OP_REDUCE 2
#define OP_ALLGATHER 3
#define OP_REDUCESCATTER 4
#define OP_SEND 5
#define OP_RECV 6

#define STAT_ENTRIES 0
#define STAT_EVENTS 1
#define STAT_NO_ENTRY 2
#define STAT_RING_FULL 3
#define STAT_READ_ERR 4
#define N_STATS 5

/* Older libbpf headers (Debian 12's) stop at the 5th argument. */
#if !defined(PT_REGS_PARM6) && defined(__TARGET_ARCH_x86)
#define PT_REGS_PARM6(x) ((x)->r9)
#endif

volatile const __u32 FILTER_PIDS = 1;

struct entry {
	__u64 entry_ns;
	__u64 comm;
	__u64 count;
	__s32 datatype;
	__s32 peer;
	__u32 op;
	__u32 pad;
};

struct event {
	__u32 tgid;
	__u32 tid;
	__u32 op;
	__s32 result;
	__u64 comm;
	__u64 count;
	__s32 datatype;
	__s32 peer;
	__u64 entry_ns;
	__u64 exit_ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} targets SEC(".maps");

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
	e.peer = -1;
	switch (op) {
	case OP_SEND:
	case OP_RECV:
		/* (buff, count, datatype, peer, comm, stream) */
		e.count = PT_REGS_PARM2(ctx);
		e.datatype = (__s32)PT_REGS_PARM3(ctx);
		e.peer = (__s32)PT_REGS_PARM4(ctx);
		e.comm = PT_REGS_PARM5(ctx);
		break;
	case OP_ALLGATHER:
		/* (send, recv, sendcount, datatype, comm, stream) */
		e.count = PT_REGS_PARM3(ctx);
		e.datatype = (__s32)PT_REGS_PARM4(ctx);
		e.comm = PT_REGS_PARM5(ctx);
		break;
	case OP_REDUCE: {
		/* (send, recv, count, datatype, op, root, comm, stream): comm is
		 * the 7th argument, just above the return address. */
		__u64 comm = 0;
		e.count = PT_REGS_PARM3(ctx);
		e.datatype = (__s32)PT_REGS_PARM4(ctx);
		if (bpf_probe_read_user(&comm, sizeof(comm), (void *)(PT_REGS_SP(ctx) + 8)))
			bump(STAT_READ_ERR);
		e.comm = comm;
		break;
	}
	default:
		/* allreduce, reducescatter (send, recv, count, datatype, op, comm,
		 * stream); broadcast (send, recv, count, datatype, root, comm,
		 * stream) */
		e.count = PT_REGS_PARM3(ctx);
		e.datatype = (__s32)PT_REGS_PARM4(ctx);
		e.comm = PT_REGS_PARM6(ctx);
		break;
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
	out->result = (__s32)PT_REGS_RC(ctx);
	out->comm = e->comm;
	out->count = e->count;
	out->datatype = e->datatype;
	out->peer = e->peer;
	out->entry_ns = e->entry_ns;
	out->exit_ns = bpf_ktime_get_ns();
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

PROBES(ncclAllReduce, OP_ALLREDUCE)
PROBES(ncclBroadcast, OP_BROADCAST)
PROBES(ncclReduce, OP_REDUCE)
PROBES(ncclAllGather, OP_ALLGATHER)
PROBES(ncclReduceScatter, OP_REDUCESCATTER)
PROBES(ncclSend, OP_SEND)
PROBES(ncclRecv, OP_RECV)

char LICENSE[] SEC("license") = "Dual MIT/GPL";
