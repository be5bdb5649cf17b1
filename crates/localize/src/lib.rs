//! whyslow-localize (to be written).
