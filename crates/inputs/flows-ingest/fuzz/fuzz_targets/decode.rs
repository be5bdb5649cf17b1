//! Feeds arbitrary bytes to every flow reader: the IPFIX / NetFlow v9 decoder (as UDP
//! datagrams from two exporters, so template state carries over between inputs of one
//! run), raw capture files, pcap, and CSV; then analyses whatever came out.
#![no_main]

use std::net::SocketAddr;
use std::sync::Mutex;

use libfuzzer_sys::fuzz_target;
use whyslow_flows_ingest::{pcap, read_csv, read_netflow_bytes, FlowDecoder};

static DECODER: Mutex<Option<FlowDecoder>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    let mut out = Vec::new();
    {
        let mut g = DECODER.lock().unwrap_or_else(|e| e.into_inner());
        let dec = g.get_or_insert_with(FlowDecoder::new);
        let src: SocketAddr = if data.first().is_some_and(|b| b & 1 == 1) {
            "192.0.2.1:4739".parse().unwrap()
        } else {
            "192.0.2.2:2055".parse().unwrap()
        };
        dec.decode(src, data, &mut out);
    }
    let (more, _) = read_netflow_bytes(data);
    out.extend(more);
    if let Ok(p) = pcap::read_pcap_bytes(data, 1000) {
        out.extend(p);
    }
    if let Ok(c) = read_csv(data, "fuzz.csv") {
        out.extend(c);
    }
    out.truncate(2000);
    let report = whyslow_flows::analyze(&out, None, &whyslow_flows::FlowConfig::default());
    let _ = whyslow_report::flows::render_table(&report);
});
