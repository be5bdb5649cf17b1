//! Honest verdicts on input that cannot support one: garbage is never a clean
//! bill of health, missing ranks are named, traces of different jobs are
//! never pooled, and `--strict` refuses what it would otherwise warn about.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

fn whyslow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_whyslow"))
        .args(args)
        .output()
        .expect("run whyslow")
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("whyslow-verdict-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn single(name: &str) -> PathBuf {
    common::fixtures().unwrap().join("kineto/single").join(name)
}

fn gunzip(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(fs::File::open(path).unwrap())
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn empty_traces_could_not_be_judged() {
    let dir = temp_dir("empty");
    for (name, body) in [
        ("empty-list.json", "[]"),
        ("no-events.json", r#"{"traceEvents": []}"#),
    ] {
        let p = dir.join(name);
        fs::write(&p, body).unwrap();
        let out = whyslow(&["analyze", p.to_str().unwrap()]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(4), "{name}: {stdout}{stderr}");
        assert!(
            stdout.contains("Could not judge: none of the 1 worker(s) read had events"),
            "{stdout}"
        );
        assert!(!stdout.contains("No anomaly"), "{stdout}");
        let json = whyslow(&["analyze", p.to_str().unwrap(), "--format", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        assert_eq!(v["verdict"], "could_not_judge");
        // --strict refuses it with the file named.
        let out = whyslow(&["analyze", "--strict", p.to_str().unwrap()]);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1));
        assert!(
            stderr.contains(name) && stderr.contains("no events in its profiling window"),
            "{stderr}"
        );
    }
}

#[test]
fn a_truncated_trace_is_refused_under_strict_and_its_missing_ranks_are_named() {
    let dir = temp_dir("trunc");
    let p = dir.join("cut.json");
    let whole = gunzip(&single("a100-rank3of8.json.gz"));
    fs::write(&p, &whole[..5000]).unwrap();
    let out = whyslow(&["analyze", "--strict", p.to_str().unwrap()]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cut.json: the trace is truncated"),
        "{stderr}"
    );
    // Without --strict it is analyzed, and the world size the trace declares
    // (rank 3 of 8) names every other rank as missing, 4–7 included.
    let out = whyslow(&["analyze", p.to_str().unwrap()]);
    let (stdout, stderr) = text(&out);
    assert!(stderr.contains("trace is truncated"), "{stderr}");
    assert!(stdout.contains("missing: 7 {0-2,4-7}"), "{stdout}");
}

#[test]
fn one_rank_of_two_reports_the_other_missing_and_strict_refuses() {
    let p = single("a100-nccl-rank0of2.json.gz");
    let out = whyslow(&["analyze", p.to_str().unwrap()]);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("missing: 1 {1}"), "{stdout}");
    let out = whyslow(&["analyze", "--strict", p.to_str().unwrap()]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("1 rank(s) of the job have no data: {1}"),
        "{stderr}"
    );
}

#[test]
fn traces_of_different_jobs_are_refused_not_pooled() {
    let dir = temp_dir("mixed");
    for name in [
        "a100-rank3of8.json.gz",
        "b200-eager-rank0of8.json.gz",
        "mi250-rocm.json.gz",
        "v100-rank1of2.json.gz",
    ] {
        fs::copy(single(name), dir.join(name)).unwrap();
    }
    let out = whyslow(&["analyze", dir.to_str().unwrap()]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("traces of 4 different jobs")
            && stderr.contains("world size 2 on Tesla V100-SXM2-16GB")
            && stderr.contains("NVIDIA B200"),
        "{stderr}"
    );
    // Two ranks of the same model but different world sizes are two jobs too.
    let dir = temp_dir("sizes");
    fs::copy(single("a100-rank3of8.json.gz"), dir.join("a.json.gz")).unwrap();
    fs::copy(single("a100-nccl-rank0of2.json.gz"), dir.join("b.json.gz")).unwrap();
    let out = whyslow(&["analyze", dir.to_str().unwrap()]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("different jobs"), "{stderr}");
}

#[test]
fn duplicate_ranks_are_refused_under_strict() {
    let dir = temp_dir("dup");
    let src = single("v100-rank1of2.json.gz");
    fs::copy(&src, dir.join("first.json.gz")).unwrap();
    fs::copy(&src, dir.join("second.json.gz")).unwrap();
    let out = whyslow(&["analyze", dir.to_str().unwrap()]);
    let (_, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("duplicate fingerprint for worker 1"),
        "{stderr}"
    );
    let out = whyslow(&["analyze", "--strict", dir.to_str().unwrap()]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("rank 1 appears twice"), "{stderr}");
}
