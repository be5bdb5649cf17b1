//! The Flight Recorder reader on real dumps (tests/fixtures/hang): torch's
//! pickle and the same dump as JSON agree; damage never panics.

use whyslow_hang_inputs::read_dump;
use whyslow_model::hang::CollectiveState;
use whyslow_testkit::SplitMix64;

fn fixture(path: &str) -> Vec<u8> {
    std::fs::read(whyslow_testkit::fixtures().join("hang").join(path)).unwrap()
}

#[test]
fn a_real_gloo_dump_decodes() {
    let d = read_dump(&fixture("sleep/fr_trace_rank_0")).unwrap();
    assert_eq!(d.version, "2.10");
    assert!(d.collectives.len() > 200, "{}", d.collectives.len());
    // gloo's pg_config names no group; the entries do.
    let names: Vec<(&str, &str)> = d
        .groups
        .iter()
        .map(|g| (g.name.as_str(), g.desc.as_str()))
        .collect();
    assert!(names.contains(&("0", "default_pg")), "{names:?}");
    assert!(names.contains(&("1", "tp")), "{names:?}");
    assert!(names.contains(&("3", "dp")), "{names:?}");
    // pg_status, keyed by the process's group index, mapped to names.
    let dp = d.progress.iter().find(|p| p.group == "3").unwrap();
    assert_eq!(dp.last_enqueued, Some(dp.last_completed.unwrap() + 1));
    let last = d.collectives.last().unwrap();
    assert_eq!(last.state, CollectiveState::Scheduled);
    assert_eq!(last.op, "all_reduce");
    assert!(last.created_ns.unwrap() > 1_700_000_000_000_000_000);
    assert_eq!(last.call_site().unwrap().function, "main");
}

#[test]
fn json_and_pickle_encodings_agree() {
    let p = read_dump(&fixture("json/fr_trace_rank_0")).unwrap();
    let j = read_dump(&fixture("json/fr_trace_rank_0.json")).unwrap();
    assert_eq!(p, j);
    assert_eq!(p.collectives.len(), 20);
}

#[test]
fn damaged_dumps_are_errors_never_panics() {
    let good = fixture("json/fr_trace_rank_0");
    let mut rng = SplitMix64::new(27);
    for _ in 0..3000 {
        let mut b = good.clone();
        match rng.below(3) {
            0 => b.truncate(rng.below(b.len() as u64) as usize),
            1 => {
                for _ in 0..1 + rng.below(8) {
                    let i = rng.below(b.len() as u64) as usize;
                    b[i] = rng.next_u64() as u8;
                }
            }
            _ => {
                let i = rng.below(b.len() as u64) as usize;
                let junk: Vec<u8> = (0..rng.below(64)).map(|_| rng.next_u64() as u8).collect();
                b.splice(i..i, junk);
            }
        }
        let _ = read_dump(&b);
    }
    for junk in [
        &b""[..],
        b"   ",
        b"\x80",
        b"\x80\x02",
        b"{",
        b"[]",
        b"not a dump",
    ] {
        assert!(read_dump(junk).is_err(), "{junk:?}");
    }
}
