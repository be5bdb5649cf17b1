//! whyslow-report (to be written).
