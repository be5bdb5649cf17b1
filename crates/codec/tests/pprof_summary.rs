//! `pprof_summary_limited` (the server's ingest check) accepts and rejects
//! exactly what `from_pprof_limited` does, and reads the same labels, sample
//! total and start: on every real profile the agents recorded in the
//! repository's fixtures, and on thousands of damaged copies of them.

use std::io::Read;
use std::path::{Path, PathBuf};

use whyslow_codec::{from_pprof_limited, pprof_summary_limited, PprofError};

fn profiles(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            profiles(&p, out);
        } else if p.to_string_lossy().ends_with(".pb.gz") {
            out.push(p);
        }
    }
}

/// Both readers on `bytes`: the same verdict, and the same reading.
fn same(bytes: &[u8], what: &str) -> bool {
    const MAX: u64 = 8 << 20;
    let full = from_pprof_limited(bytes, MAX);
    let summary = pprof_summary_limited(bytes, MAX);
    match (full, summary) {
        (Ok(p), Ok(s)) => {
            assert_eq!(s.labels, p.labels, "{what}");
            assert_eq!(s.samples, p.total(), "{what}");
            assert_eq!(s.start_unix_ns, p.start_unix_ns, "{what}");
            assert!(s.stacks >= p.stacks.len(), "{what}");
            true
        }
        (Err(a), Err(b)) => {
            // prost names the field of a bad UTF-8 string; ours cannot.
            if !matches!((&a, &b), (PprofError::Decode(_), PprofError::Decode(_))) {
                assert_eq!(a.to_string(), b.to_string(), "{what}");
            }
            false
        }
        (a, b) => panic!("{what}: from_pprof {:?} but summary {:?}", a.err(), b.err()),
    }
}

#[test]
fn summary_reads_every_recorded_profile_as_the_full_reader() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let mut files = Vec::new();
    profiles(&root, &mut files);
    files.sort();
    assert!(
        files.len() > 100,
        "fixtures not found under {}",
        root.display()
    );
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        assert!(same(&bytes, &f.display().to_string()), "{}", f.display());
    }
}

/// SplitMix64, for damage that is the same on every run.
fn mix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e3779b97f4a7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^ (z >> 31)
}

#[test]
fn summary_rejects_exactly_what_the_full_reader_rejects() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let mut files = Vec::new();
    profiles(&root, &mut files);
    files.sort();
    let mut seed = 0x5eed_u64;
    let (mut accepted, mut rejected) = (0, 0);
    // Every 20th profile (CPU, off-CPU and host ones among them).
    for f in files.iter().step_by(20) {
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&std::fs::read(f).unwrap()[..])
            .read_to_end(&mut raw)
            .unwrap();
        for round in 0..300 {
            let mut b = raw.clone();
            match round % 4 {
                // Cut short.
                0 => b.truncate((mix(&mut seed) as usize) % b.len()),
                // A few bytes changed: ids, indices, lengths, wire types.
                1 | 2 => {
                    for _ in 0..1 + mix(&mut seed) % 3 {
                        let i = (mix(&mut seed) as usize) % b.len();
                        b[i] = mix(&mut seed) as u8;
                    }
                }
                // A byte that breaks UTF-8 in the string table's region.
                _ => {
                    let i = b.len() - 1 - (mix(&mut seed) as usize) % (b.len() / 2);
                    b[i] = 0xff;
                }
            }
            let what = format!("{} round {round}", f.display());
            if same(&b, &what) {
                accepted += 1;
            } else {
                rejected += 1;
            }
        }
    }
    eprintln!("{accepted} accepted, {rejected} rejected");
    // Both kinds must have been exercised for the test to mean anything.
    assert!(
        accepted > 50 && rejected > 50,
        "{accepted} accepted, {rejected} rejected"
    );
}
