//! Reads what the ranks of a hung job left behind into
//! [`HangEvidence`] (PerfTracker §4.1: a blocked job; `whyslow hang`):
//!
//! * PyTorch Flight Recorder dumps, in torch's pickle format (versions 2.x,
//!   NCCL and gloo process groups; decoded as data by [`pickle`], never by
//!   running an unpickler) or as JSON (`_dump_fr_trace_json`). The rank is
//!   the trailing integer of the file name, as torch names them
//!   (`nccl_trace_rank_3`), unless the dump carries its own `rank`;
//! * whyslow's own files: `stacks-rank<r>.json` (every thread's stack,
//!   the rank's process groups, when it was taken) and the older
//!   `blocked-rank<r>-<time>.txt`;
//! * a node agent's collective records (`*.collectives.jsonl`).
//!
//! A damaged or foreign file gets one note naming it; the rest are still
//! read. Only a folder that cannot be listed is an error.
#![deny(missing_docs)]

mod agent;
mod dump;
mod folder;
pub mod pickle;
mod stacks;

use std::path::PathBuf;

#[cfg(doc)]
use whyslow_model::hang::HangEvidence;

pub use dump::{read_dump, trailing_rank, DumpError, FlightRecorderDump};
pub use folder::{compact, read_dir};
pub use stacks::read_blocked_text;

/// A folder that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("{}: cannot list the folder: {cause}", path.display())]
pub struct HangInputError {
    /// The folder.
    pub path: PathBuf,
    /// Why (in the message, not a second link of the error chain: one
    /// cause, said once).
    pub cause: std::io::Error,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailing_rank_as_torch_names_files() {
        assert_eq!(trailing_rank("nccl_trace_rank_12"), Some(12));
        assert_eq!(trailing_rank("fr_trace_rank_0.json"), Some(0));
        assert_eq!(trailing_rank("README"), None);
    }

    #[test]
    fn blocked_text_is_innermost_first() {
        let t = "--- thread main\n  File \"/a/train.py\", line 10, in <module>\n    main()\n  File \"/a/train.py\", line 5, in main\n    time.sleep(1)\n\n--- thread 1234\n  File \"/x.py\", line 1, in run\n";
        let s = read_blocked_text(t);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].thread, "main");
        assert_eq!(s[0].frames[0].function, "main");
        assert_eq!(s[0].frames[0].line, 5);
        assert_eq!(s[0].frames[1].function, "<module>");
        assert_eq!(s[1].frames[0].file, "/x.py");
    }
}
