//! Merging the same flow reported by several switches.
//!
//! Every switch on a flow's path may export its own record of the flow (LLMPrism's
//! flows carry the list of involved switches, §II-B). Records are the same flow when
//! they have the same 5-tuple (source, destination, ports, protocol; absent fields
//! compare equal), their time intervals overlap (within [`MERGE_SLACK_US`]), they come
//! from different switches, and their byte counts agree within [`MERGE_BYTES_REL`]
//! (two distinct messages between the same ports at the same time through the same
//! switches are thereby kept apart). The merged flow starts at the earliest start,
//! ends at the latest end, carries the largest byte count and lists the switches in the
//! order they first saw the flow (ties by name).

use std::net::IpAddr;

use crate::{FlowRecord, FxHashMap, SwitchPath, Topology};

/// Slack added to interval ends when testing overlap, microseconds.
pub const MERGE_SLACK_US: u64 = 1_000;
/// Relative byte-count difference tolerated between reports of one flow.
pub const MERGE_BYTES_REL: f64 = 0.05;

type Key = (IpAddr, IpAddr, Option<u16>, Option<u16>, Option<u8>);

struct Cluster {
    start: u64,
    end: u64,
    bytes: u64,
    /// The first member (record index).
    first: u32,
    /// Members after the first (empty, unallocated, for most clusters).
    more: Vec<u32>,
    /// Switch ids of the first member (a range of `SwitchIds::ids`).
    first_sw: (u32, u32),
    /// Switch ids of the later members.
    more_sw: Vec<u32>,
}

/// Switch names interned to small ids, per record a range of `ids`.
struct SwitchIds<'a> {
    names: FxHashMap<&'a str, u32>,
    ids: Vec<u32>,
}

impl<'a> SwitchIds<'a> {
    fn intern(&mut self, r: &'a FlowRecord) -> (u32, u32) {
        let from = self.ids.len() as u32;
        for s in &r.switches {
            let n = self.names.len() as u32;
            let id = *self.names.entry(s.as_str()).or_insert(n);
            self.ids.push(id);
        }
        (from, self.ids.len() as u32)
    }

    fn get(&self, (a, b): (u32, u32)) -> &[u32] {
        &self.ids[a as usize..b as usize]
    }
}

/// What becomes of each input record.
const KEEP: u32 = u32::MAX;
/// Merged into an earlier member of its cluster.
const DROP: u32 = u32::MAX - 1;

/// Merge duplicate reports (see the module docs); output sorted by start time
/// (records starting together keep their input order). Records without
/// switches are never merged.
pub fn merge_switch_reports(records: &[FlowRecord]) -> Vec<FlowRecord> {
    merge_if_any(records).unwrap_or_else(|| records.to_vec())
}

/// [`merge_switch_reports`], or `None` when nothing merges and the records are
/// already in start order (the output would equal the input).
pub fn merge_if_any(records: &[FlowRecord]) -> Option<Vec<FlowRecord>> {
    let sorted = |v: &[FlowRecord]| v.windows(2).all(|w| w[0].start_us <= w[1].start_us);
    let mut groups: FxHashMap<Key, Vec<u32>> = FxHashMap::default();
    // Records all seen through one path (one exporter) have no duplicates to merge.
    if one_path(records) {
        if sorted(records) {
            return None;
        }
        let mut out = records.to_vec();
        out.sort_by_key(|r| r.start_us);
        return Some(out);
    }
    for (i, r) in records.iter().enumerate() {
        if !r.switches.is_empty() {
            groups
                .entry((r.src, r.dst, r.src_port, r.dst_port, r.proto))
                .or_default()
                .push(i as u32);
        }
    }
    // Per record: KEEP, DROP, or the index of its cluster's merged record
    // (placed where the cluster's first member was).
    let mut fate: Vec<u32> = Vec::new();
    let mut merged: Vec<FlowRecord> = Vec::new();
    let mut sw = SwitchIds {
        names: FxHashMap::default(),
        ids: Vec::new(),
    };
    let mut open: Vec<Cluster> = Vec::new();
    let mut done: Vec<Cluster> = Vec::new();
    for (_, mut idx) in groups {
        // Reports of one flow come from different switches: a 5-tuple that
        // every report saw through the same switches has no duplicates.
        let first = &records[idx[0] as usize].switches;
        if idx.iter().all(|&i| records[i as usize].switches == *first) {
            continue;
        }
        idx.sort_by_key(|&i| (records[i as usize].start_us, i));
        sw.ids.clear();
        open.clear();
        done.clear();
        for i in idx {
            let r = &records[i as usize];
            let r_sw = sw.intern(r);
            // Close clusters that ended before this record starts.
            let mut k = 0;
            while k < open.len() {
                if open[k].end.saturating_add(MERGE_SLACK_US) < r.start_us {
                    done.push(open.swap_remove(k));
                } else {
                    k += 1;
                }
            }
            let mine = sw.get(r_sw);
            // Fits: byte counts agree, and no member came from one of r's switches.
            let fits = |c: &Cluster| {
                let (a, b) = (c.bytes.max(r.bytes) as f64, c.bytes.min(r.bytes) as f64);
                let bytes_ok = a == 0.0 || (a - b) / a <= MERGE_BYTES_REL;
                bytes_ok
                    && !sw
                        .get(c.first_sw)
                        .iter()
                        .chain(&c.more_sw)
                        .any(|s| mine.contains(s))
            };
            match open.iter().position(fits) {
                Some(k) => {
                    let c = &mut open[k];
                    c.end = c.end.max(r.end_us());
                    c.bytes = c.bytes.max(r.bytes);
                    c.more.push(i);
                    c.more_sw.extend_from_slice(sw.get(r_sw));
                }
                None => open.push(Cluster {
                    start: r.start_us,
                    end: r.end_us(),
                    bytes: r.bytes,
                    first: i,
                    more: Vec::new(),
                    first_sw: r_sw,
                    more_sw: Vec::new(),
                }),
            }
        }
        done.append(&mut open);
        for c in done.drain(..).filter(|c| !c.more.is_empty()) {
            if fate.is_empty() {
                fate = vec![KEEP; records.len()];
            }
            let first = &records[c.first as usize];
            let mut seen: Vec<(u64, &str)> = Vec::new();
            for &m in std::iter::once(&c.first).chain(&c.more) {
                let o = &records[m as usize];
                for s in &o.switches {
                    match seen.iter_mut().find(|(_, n)| *n == s.as_str()) {
                        Some(e) => e.0 = e.0.min(o.start_us),
                        None => seen.push((o.start_us, s.as_str())),
                    }
                }
                fate[m as usize] = DROP;
            }
            seen.sort();
            fate[c.first as usize] = merged.len() as u32;
            merged.push(FlowRecord {
                start_us: c.start,
                dur_us: c.end - c.start,
                src: first.src,
                dst: first.dst,
                bytes: c.bytes,
                src_port: first.src_port,
                dst_port: first.dst_port,
                proto: first.proto,
                switches: seen.into_iter().map(|(_, s)| s).collect(),
            });
        }
    }
    if merged.is_empty() {
        if sorted(records) {
            return None;
        }
        let mut out = records.to_vec();
        out.sort_by_key(|r| r.start_us);
        return Some(out);
    }
    let none = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
    let mut out: Vec<FlowRecord> =
        Vec::with_capacity(records.len() - fate.iter().filter(|&&f| f == DROP).count());
    for (r, &f) in records.iter().zip(&fate) {
        match f {
            KEEP => out.push(r.clone()),
            DROP => {}
            // Each merged record is placed once: move it out.
            k => out.push(std::mem::replace(
                &mut merged[k as usize],
                FlowRecord::new(0, none, none, 0, 0),
            )),
        }
    }
    // Stable: records starting together keep their input order.
    if !sorted(&out) {
        out.sort_by_key(|r| r.start_us);
    }
    Some(out)
}

/// Whether every record that names switches names the same ones (the
/// records of a single exporter): then no flow was reported twice, and no hop
/// can be measured. Shared paths compare by pointer.
pub(crate) fn one_path(records: &[FlowRecord]) -> bool {
    let mut named = records.iter().filter(|r| !r.switches.is_empty());
    match named.next() {
        Some(first) => named.all(|r| r.switches == first.switches),
        None => true,
    }
}

/// With a topology that places the flows' endpoints: every connection as the
/// switch where it enters the fabric reported it (the first switch of the
/// topology's path from its source to its destination), carrying that whole
/// path. Reports of the other switches on the path are dropped, and so are
/// records whose switch is not on their path. The entry switch sees the
/// sender's own timing; the switches behind a slow link see it re-paced and
/// cut into other flowlets, which byte-matching ([`merge_switch_reports`])
/// cannot pair with the entry's. What the hops do to the flows is measured
/// before, on all reports (`crate::hops`).
///
/// `None` when some multi-switch record's endpoints have no switch path in
/// the topology, or no record was reported by its entry switch.
pub fn entry_reports(records: &[FlowRecord], topology: &Topology) -> Option<Vec<FlowRecord>> {
    let mut paths: FxHashMap<(IpAddr, IpAddr), Option<SwitchPath>> = FxHashMap::default();
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        if r.switches.len() != 1 {
            out.push(r.clone());
            continue;
        }
        let path = paths
            .entry((r.src, r.dst))
            .or_insert_with(|| topology.switch_path(&r.src, &r.dst).map(SwitchPath::from))
            .as_ref()?;
        if path.first() == Some(&r.switches[0]) {
            out.push(FlowRecord {
                switches: path.clone(),
                ..r.clone()
            });
        }
    }
    if out.is_empty() {
        return None;
    }
    out.sort_by_key(|r| r.start_us);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(start: u64, sw: &str, bytes: u64) -> FlowRecord {
        let mut r = FlowRecord::new(
            start,
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            bytes,
            100,
        );
        r.src_port = Some(5000);
        r.dst_port = Some(6000);
        r.proto = Some(6);
        r.switches = SwitchPath::one(sw);
        r
    }

    #[test]
    fn merges_reports_of_one_flow() {
        let recs = vec![
            rec(1010, "spine", 500),
            rec(1000, "leaf1", 500),
            rec(1020, "leaf2", 500),
            rec(50_000, "leaf1", 500),
        ];
        let m = merge_switch_reports(&recs);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].switches, vec!["leaf1", "spine", "leaf2"]);
        assert_eq!(m[0].start_us, 1000);
        assert_eq!(m[0].end_us(), 1120);
        assert_eq!(m[1].switches, vec!["leaf1"]);
    }

    #[test]
    fn keeps_distinct_flows_apart() {
        // Same switch twice at the same time: two flows; different sizes: two flows.
        let recs = vec![
            rec(1000, "leaf1", 500),
            rec(1001, "leaf1", 500),
            rec(1002, "leaf2", 9000),
        ];
        assert_eq!(merge_switch_reports(&recs).len(), 3);
    }

    #[test]
    fn one_switch_per_tuple_merges_nothing_and_keeps_start_order() {
        // Every report of a 5-tuple from the same switch: nothing to merge.
        let sorted = vec![
            rec(1000, "leaf1", 500),
            rec(1000, "leaf1", 700),
            rec(1010, "leaf1", 500),
        ];
        assert!(merge_if_any(&sorted).is_none());
        assert_eq!(merge_switch_reports(&sorted), sorted);
        // Out of order: sorted by start, ties in input order.
        let shuffled = vec![sorted[2].clone(), sorted[1].clone(), sorted[0].clone()];
        let out = merge_switch_reports(&shuffled);
        assert_eq!(
            out.iter()
                .map(|r| (r.start_us, r.bytes))
                .collect::<Vec<_>>(),
            vec![(1000, 700), (1000, 500), (1010, 500)]
        );
    }

    #[test]
    fn merged_flow_takes_its_first_reports_place() {
        let mut other = rec(1005, "leaf1", 64);
        other.src_port = Some(1);
        let recs = vec![
            rec(1000, "leaf1", 500),
            other.clone(),
            rec(1010, "spine", 500),
            rec(1020, "leaf2", 500),
        ];
        let m = merge_switch_reports(&recs);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].switches, ["leaf1", "spine", "leaf2"]);
        assert_eq!(m[1], other);
    }
}
