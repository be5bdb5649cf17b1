//! What the embedded store's columnar segments cost against the pprof files
//! they replace (issue 14): every `*.pb.gz` under the given files or
//! directories (an agent's spool, say) is read, grouped as the store groups
//! them (by job and kind, time order, at most 512 per
//! segment), and encoded; prints profiles, samples, bytes as pprof and as
//! segments, and the CPU time of encoding and decoding.
//!
//! ```sh
//! cargo build --release -p whyslow-server --example segment_size
//! target/release/examples/segment_size SPOOL_DIR
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use whyslow_model::stack::StackProfile;
use whyslow_server::segments;

fn pprof_files(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(p)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        entries.sort();
        for e in entries {
            pprof_files(&e, out);
        }
    } else if p.to_string_lossy().ends_with(".pb.gz") {
        out.push(p.to_path_buf());
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        eprintln!("usage: segment_size FILE_OR_DIR…");
        std::process::exit(2);
    }
    let mut files = Vec::new();
    for a in &args {
        pprof_files(Path::new(a), &mut files);
    }
    let mut groups: BTreeMap<(String, String), Vec<(String, StackProfile)>> = BTreeMap::new();
    let (mut pprof_bytes, mut samples, mut bad) = (0u64, 0u64, 0);
    let mut pprof_decode = 0.0f64;
    for f in &files {
        let Ok(bytes) = std::fs::read(f) else {
            bad += 1;
            continue;
        };
        let t = Instant::now();
        let Ok(p) = whyslow_stack_output::from_pprof(&bytes) else {
            bad += 1;
            continue;
        };
        pprof_decode += t.elapsed().as_secs_f64();
        pprof_bytes += bytes.len() as u64;
        samples += p.total();
        let key = (
            p.labels.get("job").cloned().unwrap_or_default(),
            whyslow_server::profile_meta("", &p).kind,
        );
        groups
            .entry(key)
            .or_default()
            .push((f.display().to_string(), p));
    }
    let profiles: usize = groups.values().map(Vec::len).sum();
    let (mut seg_bytes, mut segs) = (0u64, 0);
    let (mut enc, mut dec) = (0.0f64, 0.0f64);
    for ps in groups.values_mut() {
        ps.sort_by_key(|(_, p)| p.start_unix_ns);
        for chunk in ps.chunks(512) {
            let t = Instant::now();
            let bytes = segments::encode(chunk);
            enc += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let back = segments::decode(&bytes, 1 << 30).expect("a segment decodes");
            dec += t.elapsed().as_secs_f64();
            assert_eq!(back.len(), chunk.len());
            seg_bytes += bytes.len() as u64;
            segs += 1;
        }
    }
    println!(
        "{profiles} profiles ({bad} unreadable), {} groups, {samples} samples (µs for off-CPU)",
        groups.len()
    );
    let per = |b: u64| b as f64 / profiles.max(1) as f64;
    println!(
        "pprof: {pprof_bytes} bytes ({:.0} per profile); segments: {seg_bytes} bytes in {segs} \
         ({:.0} per profile), {:.1}x smaller",
        per(pprof_bytes),
        per(seg_bytes),
        pprof_bytes as f64 / seg_bytes.max(1) as f64
    );
    println!(
        "read back: segments {:.1} ms ({:.0} µs per profile), the pprof files {:.1} ms ({:.0} µs per \
         profile); encode {:.1} ms",
        dec * 1e3,
        dec * 1e6 / profiles.max(1) as f64,
        pprof_decode * 1e3,
        pprof_decode * 1e6 / profiles.max(1) as f64,
        enc * 1e3
    );
}
