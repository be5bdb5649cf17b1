mod common;

use common::{count, fixtures};
use whyslow_ingest::read_kineto;
use whyslow_model::FunctionKind::*;

#[test]
fn dump_all() {
    let Some(dir) = fixtures() else { return };
    let mut files: Vec<_> = walk(&dir.join("kineto"));
    files.sort();
    for f in files {
        let t = read_kineto(&f).unwrap_or_else(|e| panic!("{e}"));
        println!(
            "{}: rank {} {:?} dev {:?} gpu {} mem {} comm {} py {} cpu {} fns {} steps {} tt {:?} span {:?} warn {:?}",
            f.display(),
            t.meta.rank,
            t.meta.rank_source,
            t.device,
            count(&t, GpuKernel),
            count(&t, Memory),
            count(&t, Comm),
            count(&t, Python),
            count(&t, CpuOp),
            t.functions.len(),
            t.steps.len(),
            t.training_thread,
            t.span,
            t.warnings
        );
    }
}

fn walk(d: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(d).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.to_string_lossy().ends_with(".gz") {
            out.push(p);
        }
    }
    out
}
