//! whyslow's wire formats, below every crate that reads or writes them
//! (the layer order of docs/architecture.md: model < codec < inputs < …):
//!
//! | function | format | read by |
//! |---|---|---|
//! | [`to_folded`] / [`parse_folded`] | folded stacks, `root;…;leaf count` | `flamegraph.pl`, inferno, speedscope |
//! | [`to_pprof`] / [`from_pprof`] | gzip-compressed pprof protobuf | `go tool pprof`, Pyroscope, Parca |
//! | [`parse_jsonl`] / [`JsonlValues`] | JSON lines (collective records, OS readings) | the agent's spool, the server's batches |
//!
//! The node agent writes its CPU and off-CPU profiles as pprof (SysOM-AI
//! §3.3–§3.4: Build-ID + offset frames, symbolized later); the spool reader,
//! the server's store and the renderers decode them here. Pure functions
//! from bytes to values and back, no I/O; decoding is bounded
//! ([`MAX_PPROF_DECOMPRESSED`], [`from_pprof_limited`]) and never panics.
#![deny(missing_docs)]

mod folded;
mod jsonl;
mod pprof;

pub use folded::{parse_folded, to_folded, FoldedError};
pub use jsonl::{parse_jsonl, JsonlValues};
pub use pprof::{
    from_pprof, from_pprof_limited, pprof_summary_inflated, pprof_summary_limited, to_pprof,
    visit_pprof_limited, FrameRef, PprofError, PprofSummary, PprofView, MAX_PPROF_DECOMPRESSED,
};
