//! Every fix-evaluation case's known fix (eval/fix/cases/*/reference.patch)
//! applies to the case's files as they stand: a file edited since (the
//! shipped examples/train.py) would otherwise turn the reference row of
//! scripts/eval-fix into "does not apply" without anyone noticing.

use std::path::{Path, PathBuf};

fn cases() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../eval/fix/cases")
}

#[test]
fn every_known_fix_applies_to_its_case() {
    let mut checked = 0;
    for entry in std::fs::read_dir(cases()).unwrap() {
        let dir = entry.unwrap().path();
        let case: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
        let patch = std::fs::read_to_string(dir.join("reference.patch")).unwrap();
        let files: Vec<PathBuf> = case["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| dir.join(f.as_str().unwrap()))
            .collect();
        // The harness copies each file flat into the case's scratch root.
        let read = |p: &str| {
            files
                .iter()
                .find(|f| f.file_name().is_some_and(|n| n == p))
                .and_then(|f| std::fs::read_to_string(f).ok())
        };
        let applied = whyslow_fix::apply_patch(&patch, &read);
        assert!(applied.is_ok(), "{}: {:?}", dir.display(), applied.err());
        checked += 1;
    }
    assert!(checked >= 6, "{checked} cases");
}
