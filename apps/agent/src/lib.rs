//! whyslow's node agent, run as `whyslow agent`: today the privileged
//! sampling sidecar of the training ranks (PerfTracker §5; the file protocol
//! in `docs/agent.md`, its records typed in `whyslow_model::wire`); the eBPF
//! profiler of SysOM-AI §3.3-§3.4 joins it here. Glue over the library
//! crates (`whyslow-sampler`); its events are typed ([`events`]).

mod daemon;
pub mod events;

pub use daemon::{run, AgentArgs, LogFormat};
