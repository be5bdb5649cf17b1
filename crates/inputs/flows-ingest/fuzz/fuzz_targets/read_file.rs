//! Format detection as `whyslow flows analyze` meets a file: the first byte
//! picks the file's name (every extension the reader knows, and none), the
//! rest is its content; whatever is read is analyzed, and a report without
//! a job must say it could not judge.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use whyslow_flows::{analyze, FlowConfig};
use whyslow_flows_ingest::read_flow_bytes;

const NAMES: [&str; 12] = [
    "x.csv", "x.csv.gz", "x.parquet", "x.pcap", "x.pcapng", "x.ipfix", "x.nf", "x.v9",
    "x.netflow", "x.bin", "x", "x.gz",
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    let name = NAMES[pick as usize % NAMES.len()];
    if let Ok(records) = read_flow_bytes(Path::new(name), bytes.to_vec()) {
        let report = analyze(&records, None, &FlowConfig::default());
        assert!(report.could_not_judge.is_some() || !report.jobs.is_empty());
    }
});
