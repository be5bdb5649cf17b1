//! Renderings of CPU stack profiles ([`StackProfile`]): what the node agent
//! samples (SysOM-AI §3.3–§3.4: eBPF stack sampling with Build-ID + offset
//! frames and deferred symbolization) shown the ways §4 shows it, as flame
//! graphs (Fig. 6) and differential flame graphs that compare a slow period
//! with a baseline (Fig. 7), plus the interchange formats other tools read.
//!
//! | function | format | read by |
//! |---|---|---|
//! | [`to_folded`] / [`parse_folded`] | folded stacks, `root;…;leaf count` | `flamegraph.pl`, inferno, speedscope |
//! | [`to_pprof`] / [`from_pprof`] | gzip-compressed pprof protobuf | `go tool pprof`, Pyroscope, Parca |
//! | [`to_flamegraph_svg`] | self-contained SVG flame graph | any browser |
//! | [`to_diff_flamegraph_svg`] | differential (red/blue) SVG flame graph | any browser |
//! | [`to_speedscope_json`] | speedscope file format | speedscope.app |
//!
//! Everything here is a pure function from values to `String`/`Vec<u8>` and
//! back: no I/O. Nothing panics on any input: frame indices out of range
//! render as an unknown frame, counts add up saturating, and text from the
//! profile (function names, paths) is escaped in SVG and sanitized in
//! folded stacks.
#![deny(missing_docs)]

mod diagnosis;
mod flame;
mod speedscope;
mod tree;

pub use diagnosis::{diagnosis_html, diagnosis_table, diff_flamegraph};
pub use flame::{to_diff_flamegraph_svg, to_flamegraph_svg, FlameOptions};
// The formats live in whyslow-codec (below the inputs that decode them);
// re-exported so that a renderer's user has them in one place.
pub use speedscope::{to_speedscope_json, SPEEDSCOPE_SCHEMA};
pub use whyslow_codec::{
    from_pprof, from_pprof_limited, parse_folded, pprof_summary_inflated, pprof_summary_limited,
    to_folded, to_pprof, visit_pprof_limited, FoldedError, FrameRef, PprofError, PprofSummary,
    PprofView, MAX_PPROF_DECOMPRESSED,
};

#[doc(no_inline)]
pub use whyslow_model::stack::StackProfile;
