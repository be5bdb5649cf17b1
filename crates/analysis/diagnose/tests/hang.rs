//! `diagnose` says "hang" when the agent's records hold calls in flight far
//! longer than any step while a member never entered them, and names the
//! rank the others wait for, as `whyslow hang` does.

use whyslow_model::collective::CollectiveRecord;
use whyslow_model::diagnosis::DiagnoseEvidence;

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

fn rec(gr: u32, seq: u64, entry: u64, exit: u64, open: bool) -> CollectiveRecord {
    CollectiveRecord {
        rank: gr,
        global_rank: Some(gr),
        group: "job/gloo4#0".into(),
        op: "allreduce".into(),
        seq: Some(seq),
        entry_ns: entry,
        exit_ns: exit,
        bytes: 1 << 20,
        source: "gloo-uprobe".into(),
        open,
    }
}

fn evidence(culprit: Option<u32>) -> DiagnoseEvidence {
    let mut collectives = Vec::new();
    for step in 1..=120u64 {
        for r in 0..4 {
            let t = step * 100 * MS;
            collectives.push(rec(
                r,
                step,
                t + r as u64 * MS,
                t + 20 * MS + r as u64 * 1000,
                false,
            ));
        }
    }
    if let Some(c) = culprit {
        let t = 121 * 100 * MS;
        for r in (0..4).filter(|&r| r != c) {
            collectives.push(rec(r, 121, t, t + 40 * S, true));
        }
    }
    DiagnoseEvidence {
        collectives,
        ..Default::default()
    }
}

#[test]
fn open_records_are_a_hang_with_its_culprit() {
    for culprit in [1, 3] {
        let d = whyslow_diagnose::diagnose(&evidence(Some(culprit)), &Default::default()).unwrap();
        let h = d.report.hang.as_ref().expect("a hang");
        assert_eq!(
            h.culprits.iter().map(|c| c.rank).collect::<Vec<_>>(),
            vec![culprit],
            "{h:?}"
        );
        // The open calls are not read as late entries.
        assert!(d.report.stragglers.is_empty(), "{:?}", d.report.stragglers);
        let table = whyslow_report::diagnose::render_diagnose_table(&d.report, (1.0, 5.0));
        assert!(table.contains("HANG"), "{table}");
    }
}

#[test]
fn finished_records_are_no_hang() {
    let d = whyslow_diagnose::diagnose(&evidence(None), &Default::default()).unwrap();
    assert!(d.report.hang.is_none());
    assert!(!d.report.names_anything(), "{:?}", d.report);
}
