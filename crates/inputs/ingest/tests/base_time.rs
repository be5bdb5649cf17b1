//! `read_kineto_base_time_ns`: the top-level `baseTimeNanoseconds` that puts
//! newer traces' relative `ts` on the Unix epoch (the samples' clock).

mod common;

use std::io::Write;

use common::fixtures;
use whyslow_ingest::{read_kineto_base_time_ns, ErrorKind};

#[test]
fn real_traces_with_and_without_a_base_time() {
    let single = fixtures().unwrap().join("kineto/single");
    for (file, want) in [
        (
            "a100-nccl-rank0of2.json.gz",
            Some(1_711_964_646_000_000_000),
        ),
        (
            "cpu-only-gloo-rank34of300.pt.trace.json.gz",
            Some(1_719_853_884_000_000_000),
        ),
        ("mi250-rocm.json.gz", Some(1_735_632_360_000_000_000)),
        ("a100-rank3of8.json.gz", None),
        ("v100-ns-resolution.pt.trace.json.gz", None),
    ] {
        assert_eq!(
            read_kineto_base_time_ns(&single.join(file)).unwrap(),
            want,
            "{file}"
        );
    }
}

#[test]
fn only_the_top_level_key_counts() {
    let dir = std::env::temp_dir().join(format!("whyslow-base-time-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::File::create(&p)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        p
    };
    // The key inside an event's args or a string is not the trace's base.
    let events = r#""traceEvents": [{"ph": "X", "name": "x \"baseTimeNanoseconds\": 9", "args": {"baseTimeNanoseconds": 5}}]"#;
    let with = write(
        "with.json",
        &format!("{{{events}, \"baseTimeNanoseconds\": 7}}"),
    );
    let without = write("without.json", &format!("{{{events}}}"));
    assert_eq!(read_kineto_base_time_ns(&with).unwrap(), Some(7));
    assert_eq!(read_kineto_base_time_ns(&without).unwrap(), None);
    // A file cut before its end: an error that names the file and the offset.
    let cut = write("cut.json", &format!("{{{events}, \"baseTimeNano"));
    let e = read_kineto_base_time_ns(&cut).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Truncated, "{e}");
    assert!(e.to_string().contains("cut.json"), "{e}");
    let garbage = write("garbage.json", "not json");
    assert!(read_kineto_base_time_ns(&garbage).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}
