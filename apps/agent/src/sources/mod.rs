//! The agent's sources, each a [`Collector`](crate::collector::Collector):
//!
//! * [`profile`]: CPU profiles of each registered process (perf events,
//!   one thread per process, period after period);
//! * [`host`]: CPU profiles of the whole host or of cgroups (eBPF);
//! * [`offcpu`]: off-CPU profiles of the registered processes (eBPF on
//!   `sched_switch`);
//! * [`collectives`]: gloo and NCCL collective calls (eBPF uprobes);
//! * [`os`]: OS signals of the registered processes (`/proc`).
//!
//! `collector.rs` says how to add one.

pub mod collectives;
pub mod host;
pub mod offcpu;
pub mod os;
pub mod profile;
