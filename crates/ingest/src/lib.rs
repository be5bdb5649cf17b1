//! whyslow-ingest (to be written).
