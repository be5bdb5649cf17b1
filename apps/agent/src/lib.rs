//! whyslow's node agent, run as `whyslow agent`: today the privileged
//! sampling sidecar of the training ranks (PerfTracker §5; the file protocol
//! in `docs/agent.md`, its records typed in `whyslow_model::wire`); the eBPF
//! profiler of SysOM-AI §3.3-§3.4 joins it here. Glue over the library
//! crates (`whyslow-sampler`, `whyslow-stacks`); its events are typed
//! ([`events`]). The training processes that register are one
//! [`registry`]; every source of evidence about them (CPU, host and off-CPU
//! profiles, collectives, OS readings: [`sources`]) is a
//! [`collector::Collector`] run by one driver and writing into one
//! [`spool`]; [`profiler`] holds their options and starts them, and
//! [`collector`] says how to add one.

pub mod collector;
mod daemon;
pub mod events;
pub mod governor;
pub mod profiler;
pub mod registry;
pub mod sources;
pub mod spool;
pub mod symbols;
pub mod upload;

pub use daemon::{run, AgentArgs, LogFormat};
