// SPDX-License-Identifier: GPL-2.0 OR MIT
//
// User stacks without frame pointers, in the kernel: SysOM-AI §3.3's hybrid
// unwinding (Algorithm 1). Userspace (whyslow_stacks::ebpf::UnwindTables)
// compiles every executable module's .eh_frame into rows (one per change of
// rule: how to find the canonical frame address, where the caller's rbp was
// saved), stores them once per file in `cfi_rows`, and gives each target
// process its executable mappings sorted by address in `proc_maps`, each with
// the slice of rows that describes it. Per frame the program finds the
// mapping (binary search), the row (binary search), computes the CFA, reads
// the return address at CFA − 8 and the saved rbp, and moves on.
//
// Where a module has no row for an address (no CFI: JIT code, hand-written
// assembly, a module whose rows did not fit), the hybrid mode takes a
// frame-pointer step instead, validated as the paper's Algorithm 1 does: the
// frame address must lie above the stack pointer and the return address must
// fall in an executable mapping of the process, else the walk stops there.
// DWARF rows are tried first where they exist: CPython here is built without
// frame pointers, and a frame-pointer step through such code can pass that
// validation with a wrong caller (rbp holds data).
//
// Rules the program does not evaluate (DWARF expressions such as the
// stack-realigning prologue's CFA = *(rbp − 8), the CFA in another register)
// end the walk in the kernel; on-CPU samples then go to userspace whole
// instead of being counted: the frames found so far, the registers of the
// frame that stopped the walk and up to 16 KiB of the stack above it, through
// the `copied` ring buffer. The drain unwinds the rest with gimli's complete
// CFI evaluator on that copy (whyslow_stacks::cfi_eval) and counts the
// sample there. A full ring buffer keeps the partial stack, counted.
//
// The per-frame loop runs under bpf_loop (Linux 5.17+): the verifier checks
// the step once instead of unrolling 127 frames of two binary searches,
// which is what the paper's tail calls work around.

#ifndef WHYSLOW_UNWIND_BPF_H
#define WHYSLOW_UNWIND_BPF_H

#include <asm/ptrace.h>

/* UNWIND: how user stacks are taken. */
#define UNWIND_KERNEL_FP 0 /* the kernel's frame-pointer walk (bpf_get_stack) */
#define UNWIND_DWARF 1     /* CFI rows only; stop where there are none */
#define UNWIND_HYBRID 2    /* CFI rows, else a validated frame-pointer step */
volatile const __u32 UNWIND = UNWIND_KERNEL_FP;

/* Kinds of rows (whyslow_stacks::cfi::CfaKind). */
#define CFA_NO_CFI 0
#define CFA_RSP 1
#define CFA_RBP 2
#define CFA_PLT 3
#define CFA_UNSUPPORTED 4
#define CFA_END 5
#define RBP_SAME 0
#define RBP_AT_CFA 1

#define MAX_MAPPINGS 512

struct cfi_row {
	__u32 pc; /* SVMA of the module, below 4 GiB */
	__u8 cfa;
	__u8 rbp;
	__u16 pad;
	__s32 cfa_offset;
	__s32 rbp_offset;
};

struct exec_mapping {
	__u64 start;
	__u64 end;
	__u64 bias; /* address − SVMA */
	__u32 rows_start;
	__u32 rows_len; /* 0: no rows (frame-pointer steps only) */
};

struct proc_mappings {
	__u32 n;
	__u32 pad;
	struct exec_mapping m[MAX_MAPPINGS];
};

/* max_entries is set by the loader; memory-mapped by userspace, which
 * writes a module's rows with one copy instead of a syscall per row. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cfi_row);
} cfi_rows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct proc_mappings);
} proc_maps SEC(".maps");

/* The walk's state between bpf_loop iterations. A frame takes one per
 * halving of the mapping search (≤ 9) and of the row search (≤ 25), and one
 * to step to the caller: small pieces the verifier checks once each, instead of
 * unrolled loops whose states multiply. */
#define LOOPS_PER_FRAME 38
#define PHASE_MAPPING 0
#define PHASE_ROW 1
#define PHASE_STEP 2

struct unwind_state {
	__u64 ip;
	__u64 sp;
	__u64 bp;
	__u64 pc; /* ip as an SVMA of its module (one byte back for callers) */
	__u32 tgid;
	__u32 phase;
	__u32 rows_start;
	__u32 rows_len;
	__u32 lo; /* the row search's bounds */
	__u32 hi;
	__u32 unsupported; /* the walk stopped at a rule the program does not evaluate */
	struct cfi_row row;
};

/* A walk stopped at an unsupported rule, for userspace to finish
 * (whyslow_stacks::ebpf's CopiedStack has the same layout). */
#define PAGE_BYTES 4096
#define STACK_COPY (4 * PAGE_BYTES)
struct copied_stack {
	__u32 tgid;
	__u32 tid;
	__u64 kernel;
	__u32 generation;
	__u32 depth; /* frames found; the last one is the frame at ip */
	__u64 ip;
	__u64 sp;
	__u64 bp;
	__u64 len; /* bytes of stack copied from sp */
	__u64 python; /* the Python stack's hash (python.bpf.h) */
	__u64 ips[MAX_DEPTH];
	/* Up to STACK_COPY bytes, plus the rest of sp's page. */
	__u8 stack[STACK_COPY + PAGE_BYTES];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);
} copied SEC(".maps");

/* take_user_stack's answer for a sample handed to userspace whole. */
#define COPIED_TO_USERSPACE (~0ULL)

static __always_inline int read_user(__u64 *out, __u64 addr)
{
	if (bpf_probe_read_user(out, sizeof(*out), (const void *)addr)) {
		count(STAT_UNW_READ_ERR);
		return -1;
	}
	return 0;
}

/* Records ip and finds its executable mapping. */
static __always_inline long find_mapping(struct unwind_state *st)
{
	__u32 zero = 0;
	struct stack *s = bpf_map_lookup_elem(&scratch, &zero);
	struct proc_mappings *pm = bpf_map_lookup_elem(&proc_maps, &st->tgid);
	if (!s || !pm)
		return 1;
	/* The frame count lives in the map value, not in st: the verifier
	 * then reads it as any number each iteration (a counter on the stack
	 * stays exact, so iterations never look alike and it never ends). */
	__u64 n = s->depth;
	if (n >= MAX_DEPTH) {
		count(STAT_UNW_TRUNCATED);
		return 1;
	}
	__u64 ip = st->ip;
	/* One halving of the search for the last mapping starting at or
	 * below ip per iteration. */
	__u32 lo = st->lo, hi = st->hi;
	if (hi > pm->n)
		hi = pm->n;
	if (lo < hi) {
		__u32 mid = ((lo + hi) / 2) & (MAX_MAPPINGS - 1);
		if (pm->m[mid].start <= ip)
			st->lo = mid + 1;
		else
			st->hi = mid;
		return 0;
	}
	__u32 k = (lo - 1) & (MAX_MAPPINGS - 1);
	if (lo == 0 || ip >= pm->m[k].end) {
		/* A return address outside executable code: not a frame (the
		 * previous step was wrong). The sampled ip itself is kept. */
		if (n == 0) {
			s->ips[0] = ip;
			s->depth = 1;
		}
		count(STAT_UNW_BAD_IP);
		return 1;
	}
	s->ips[n] = ip;
	s->depth = n + 1;
	/* A return address points after the call: its row is the call's. */
	st->pc = ip - pm->m[k].bias - (n > 0 ? 1 : 0);
	st->rows_start = pm->m[k].rows_start;
	st->rows_len = st->pc < 0xffffffffULL ? pm->m[k].rows_len : 0;
	st->row.cfa = CFA_NO_CFI;
	st->lo = 0;
	st->hi = st->rows_len;
	st->phase = st->rows_len ? PHASE_ROW : PHASE_STEP;
	return 0;
}

/* One halving of the search for pc's row (the last one at or below it):
 * one per bpf_loop iteration, so the verifier sees no loop here. */
static __always_inline long find_row(struct unwind_state *st)
{
	__u32 lo = st->lo, hi = st->hi;
	if (lo < hi) {
		__u32 mid = (lo + hi) / 2;
		__u32 idx = st->rows_start + mid;
		struct cfi_row *r = bpf_map_lookup_elem(&cfi_rows, &idx);
		if (!r)
			return 1;
		if (r->pc <= (__u32)st->pc)
			st->lo = mid + 1;
		else
			st->hi = mid;
		return 0;
	}
	if (lo > 0) {
		__u32 idx = st->rows_start + lo - 1;
		struct cfi_row *r = bpf_map_lookup_elem(&cfi_rows, &idx);
		if (!r)
			return 1;
		st->row = *r;
	}
	st->phase = PHASE_STEP;
	return 0;
}

/* From this frame to its caller with the row (or a frame pointer). */
static __always_inline long step(struct unwind_state *st)
{
	__u64 cfa, ra, bp = st->bp;
	st->phase = PHASE_MAPPING;
	st->lo = 0;
	st->hi = MAX_MAPPINGS;
	switch (st->row.cfa) {
	case CFA_END:
		count(STAT_UNW_END);
		return 1;
	case CFA_RSP:
		cfa = st->sp + (__s64)st->row.cfa_offset;
		break;
	case CFA_RBP:
		cfa = st->bp + (__s64)st->row.cfa_offset;
		break;
	case CFA_PLT:
		cfa = st->sp + 8 + (((st->ip & 15) >= (__u64)st->row.cfa_offset) ? 8 : 0);
		break;
	case CFA_NO_CFI:
		if (UNWIND != UNWIND_HYBRID) {
			count(STAT_UNW_NO_CFI);
			return 1;
		}
		/* Algorithm 1's frame-pointer step, validated: the frame lies
		 * above the stack pointer, aligned; the return address is
		 * checked against the mappings at the next frame. */
		if (bp < st->sp || (bp & 7) || bp == 0) {
			count(STAT_UNW_NO_CFI);
			return 1;
		}
		if (read_user(&ra, bp + 8) || read_user(&bp, bp))
			return 1;
		count(STAT_UNW_FP_STEPS);
		st->sp = st->bp + 16;
		st->bp = bp;
		st->ip = ra;
		return ra == 0;
	default:
		count(STAT_UNW_UNSUPPORTED);
		st->unsupported = 1;
		return 1;
	}
	if (cfa <= st->sp) {
		count(STAT_UNW_BAD_IP);
		return 1;
	}
	if (read_user(&ra, cfa - 8))
		return 1;
	if (st->row.rbp == RBP_AT_CFA && read_user(&bp, cfa + (__s64)st->row.rbp_offset))
		return 1;
	count(STAT_UNW_DWARF_STEPS);
	st->ip = ra;
	st->sp = cfa;
	st->bp = bp;
	if (ra == 0) {
		count(STAT_UNW_END);
		return 1;
	}
	return 0;
}

/* One piece of the walk: 0 goes on, 1 stops. */
static long unwind_step(__u32 i, void *arg)
{
	struct unwind_state *st = arg;
	if (st->phase == PHASE_MAPPING)
		return find_mapping(st);
	if (st->phase == PHASE_ROW)
		return find_row(st);
	return step(st);
}

/* The current task's user registers: the sample's own when it interrupted
 * user mode, else those saved on entry to the kernel. */
static __always_inline int user_regs(struct pt_regs *sampled, struct unwind_state *st)
{
	if (sampled && (sampled->cs & 3) == 3) {
		st->ip = sampled->rip;
		st->sp = sampled->rsp;
		st->bp = sampled->rbp;
		return 0;
	}
	struct task_struct *task = bpf_get_current_task_btf();
	struct pt_regs *saved = (struct pt_regs *)bpf_task_pt_regs(task);
	struct pt_regs regs;
	if (!saved || bpf_probe_read_kernel(&regs, sizeof(regs), saved))
		return -1;
	if ((regs.cs & 3) != 3)
		return -1; /* a kernel thread */
	st->ip = regs.rip;
	st->sp = regs.rsp;
	st->bp = regs.rbp;
	return 0;
}

/* Hands the sample to userspace: the frames found, the registers of the
 * frame at which the walk stopped and the stack above it, page by page up to
 * the first unreadable one. 0 when it went. */
static __always_inline int copy_to_userspace(const struct count_key *key, const struct stack *s,
					     const struct unwind_state *st)
{
	struct copied_stack *c = bpf_ringbuf_reserve(&copied, sizeof(*c), 0);
	if (!c) {
		count(STAT_UNW_COPY_LOST);
		return -1;
	}
	c->tgid = key->tgid;
	c->tid = key->tid;
	c->kernel = key->kernel;
	c->generation = key->generation;
	c->python = key->python;
	__u64 n = s->depth;
	c->depth = n > MAX_DEPTH ? MAX_DEPTH : n;
	bpf_probe_read_kernel(c->ips, sizeof(c->ips), s->ips);
	c->ip = st->ip;
	c->sp = st->sp;
	c->bp = st->bp;
	/* The rest of sp's page first: the stack's top may be anywhere. */
	__u64 first = PAGE_BYTES - (st->sp & (PAGE_BYTES - 1));
	__u64 len = 0;
	if (!bpf_probe_read_user(c->stack, first, (const void *)st->sp)) {
		len = first;
		for (int i = 0; i < STACK_COPY / PAGE_BYTES; i++) {
			if (bpf_probe_read_user(c->stack + first + i * PAGE_BYTES, PAGE_BYTES,
						(const void *)(st->sp + first + i * PAGE_BYTES)))
				break;
			len += PAGE_BYTES;
		}
	}
	c->len = len;
	bpf_ringbuf_submit(c, 0);
	count(STAT_UNW_COPIED);
	return 0;
}

/* The user stack into s (innermost first), stored under its hash; 0 when
 * there is none, COPIED_TO_USERSPACE when the walk met a rule the program
 * does not evaluate and the sample went to userspace (only with a `key`:
 * on-CPU samples, whose count is one). `sampled`: the registers of the
 * interrupted context (NULL when there are none, e.g. in a tracepoint). */
static __always_inline __u64 take_user_stack(void *ctx, struct pt_regs *sampled, struct stack *s,
					      __u32 tgid, const struct count_key *key)
{
	if (UNWIND == UNWIND_KERNEL_FP || !bpf_map_lookup_elem(&proc_maps, &tgid)) {
		if (UNWIND != UNWIND_KERNEL_FP)
			count(STAT_UNW_NOT_LOADED);
		return take_stack(ctx, s, BPF_F_USER_STACK, STAT_USTACK_ERR);
	}
	struct unwind_state st = {};
	if (user_regs(sampled, &st)) {
		count(STAT_USTACK_ERR);
		return 0;
	}
	st.tgid = tgid;
	st.hi = MAX_MAPPINGS;
	s->depth = 0;
	bpf_loop(LOOPS_PER_FRAME * MAX_DEPTH, unwind_step, &st, 0);
	if (key && st.unsupported && !copy_to_userspace(key, s, &st))
		return COPIED_TO_USERSPACE;
	__u64 n = s->depth;
	if (n == 0 || n > MAX_DEPTH)
		return 0;
	return store_stack(s, n);
}

#endif
