//! From probe events to collective records (pure).

use std::collections::HashMap;

use whyslow_model::collective::CollectiveRecord;

use crate::{GlooEvent, OPS};

/// Names groups and numbers calls, for the events of one host's processes.
///
/// A group is one gloo context. Contexts are per process, so a name that
/// matches across ranks is built from what all ranks of the group share: the
/// job, the group's size and the order in which the process first used a
/// context of that size (`job/gloo4#0`: the first 4-rank group). Process
/// groups are created in the same order on every rank (PyTorch requires it)
/// and a job's first collective on each group comes in program order, so
/// the names agree. The sequence number is PyTorch's own collective tag
/// where it can be read ([`GlooEvent::tag`]), the same on every rank however
/// late the tracer attached; otherwise there is none and instances match by
/// overlap in time (counting calls from the attach would shift one rank's
/// numbers against the others').
#[derive(Debug, Default)]
pub struct Sequencer {
    /// (pid, context) → group name.
    groups: HashMap<(u32, u64), String>,
    /// (pid, size) → groups of that size seen so far.
    per_size: HashMap<(u32, i32), u32>,
    /// Added to the probes' CLOCK_MONOTONIC times.
    clock_offset_ns: i64,
}

impl Sequencer {
    /// A sequencer that has seen nothing; records keep the probes'
    /// CLOCK_MONOTONIC times.
    pub fn new() -> Self {
        Self::default()
    }

    /// A sequencer whose records are on CLOCK_MONOTONIC + `offset_ns`: with
    /// CLOCK_REALTIME − CLOCK_MONOTONIC read at start, on the Unix clock of
    /// the profiles and OS readings, so `whyslow diagnose` can put
    /// collectives and profiles on one time line (slow-rank detection itself
    /// aligns the ranks' clocks on its own).
    pub fn with_clock_offset(offset_ns: i64) -> Self {
        Sequencer {
            clock_offset_ns: offset_ns,
            ..Self::default()
        }
    }

    /// The record of `e`, for a process of job `job` with world rank
    /// `global_rank` (from its registration). Events must come in each
    /// process's order of entry; `None` when the event's context could not be
    /// read (no group to put it in).
    pub fn record(
        &mut self,
        e: &GlooEvent,
        job: &str,
        global_rank: Option<u32>,
    ) -> Option<CollectiveRecord> {
        if e.size <= 0 || e.rank < 0 || e.rank >= e.size || e.context == 0 {
            return None;
        }
        let group = match self.groups.get(&(e.pid, e.context)) {
            Some(g) => g.clone(),
            None => {
                let n = self.per_size.entry((e.pid, e.size)).or_insert(0);
                let g = format!("{job}/gloo{}#{n}", e.size);
                *n += 1;
                self.groups.insert((e.pid, e.context), g.clone());
                g
            }
        };
        Some(CollectiveRecord {
            rank: e.rank as u32,
            global_rank,
            group,
            op: OPS[e.op].to_string(),
            seq: e.tag(),
            entry_ns: e.entry_ns.saturating_add_signed(self.clock_offset_ns),
            exit_ns: e
                .exit_ns
                .max(e.entry_ns)
                .saturating_add_signed(self.clock_offset_ns),
            bytes: e.bytes(),
            source: "gloo-uprobe".into(),
            open: false,
        })
    }

    /// Forgets a process (it exited).
    pub fn forget(&mut self, pid: u32) {
        self.groups.retain(|k, _| k.0 != pid);
        self.per_size.retain(|k, _| k.0 != pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(pid: u32, context: u64, rank: i32, size: i32, op: usize, t: u64) -> GlooEvent {
        // An all-reduce of 1000 floats with tag t, as PyTorch lays it out.
        let mut options = [0u64; 20];
        (options[10], options[11], options[16], options[17]) = (1000, 4, t, 1 << 20);
        GlooEvent {
            pid,
            tid: pid,
            op,
            rank,
            size,
            context,
            entry_ns: t,
            exit_ns: t + 10,
            options,
        }
    }

    #[test]
    fn groups_are_named_alike_on_every_rank_and_calls_numbered_by_tag() {
        let mut s = Sequencer::new();
        // Two processes, different context addresses, same groups in the
        // same order: a 4-rank world group, then a 2-rank one.
        let a: Vec<_> = [
            ev(10, 0xa0, 0, 4, 0, 1),
            ev(10, 0xb0, 0, 2, 0, 2),
            ev(10, 0xa0, 0, 4, 0, 3),
            ev(10, 0xa0, 0, 4, 5, 4),
        ]
        .iter()
        .map(|e| s.record(e, "j", Some(0)).unwrap())
        .collect();
        let b: Vec<_> = [
            ev(11, 0x70, 1, 4, 0, 1),
            ev(11, 0x90, 1, 2, 0, 2),
            ev(11, 0x70, 1, 4, 0, 3),
        ]
        .iter()
        .map(|e| s.record(e, "j", Some(1)).unwrap())
        .collect();
        assert_eq!(a[0].group, "j/gloo4#0");
        assert_eq!(a[1].group, "j/gloo2#0");
        assert_eq!(b[0].group, a[0].group);
        assert_eq!(b[1].group, a[1].group);
        assert_eq!(
            a.iter().map(|r| r.seq).collect::<Vec<_>>(),
            [Some(1), Some(2), Some(3), None]
        );
        assert_eq!(b[2].seq, Some(3));
        assert_eq!(a[0].bytes, 4000);
        assert_eq!(a[3].op, "barrier");
        let mut shifted = Sequencer::with_clock_offset(1_000);
        let r = shifted
            .record(&ev(10, 0xa0, 0, 4, 0, 5), "j", None)
            .unwrap();
        assert_eq!((r.entry_ns, r.exit_ns), (1_005, 1_015));
    }

    #[test]
    fn unreadable_contexts_are_dropped() {
        let mut s = Sequencer::new();
        assert!(s.record(&ev(1, 0, 0, 2, 0, 1), "j", None).is_none());
        assert!(s.record(&ev(1, 8, 2, 2, 0, 1), "j", None).is_none());
        assert!(s.record(&ev(1, 8, -1, -1, 0, 1), "j", None).is_none());
    }
}
