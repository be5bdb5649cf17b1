//! whyslow's node agent, run as `whyslow agent`: today the privileged
//! sampling sidecar of the training ranks (PerfTracker §5; the file protocol
//! in `docs/agent.md`, its records typed in `whyslow_model::wire`); the eBPF
//! profiler of SysOM-AI §3.3-§3.4 joins it here. Glue over the library
//! crates (`whyslow-sampler`, `whyslow-stacks`); its events are typed
//! ([`events`]); [`profiler`] profiles registered processes continuously.

mod daemon;
pub mod events;
pub mod governor;
pub mod profiler;
pub mod symbols;
pub mod upload;

pub use daemon::{run, AgentArgs, LogFormat};
