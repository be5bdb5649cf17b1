//! whyslow-summarize (to be written).
