//! Sets of ranks as sorted runs: the ranks of a large job that left
//! nothing (a million-rank world with sixteen dumps is one run, not a
//! million entries), so that a report stays linear in the evidence.

/// Disjoint, sorted, non-adjacent inclusive runs `[first, last]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RankRuns(Vec<(u32, u32)>);

impl RankRuns {
    /// `[0, world)` less the sorted, distinct ranks in `known`.
    pub fn complement(world: u32, known: impl IntoIterator<Item = u32>) -> RankRuns {
        let mut out = Vec::new();
        let mut next = 0u32;
        for r in known {
            if r >= world {
                break;
            }
            if r > next {
                out.push((next, r - 1));
            }
            next = r.saturating_add(1);
        }
        if next < world {
            out.push((next, world - 1));
        }
        RankRuns(out)
    }

    /// From any ranks.
    pub fn from_ranks(ranks: impl IntoIterator<Item = u32>) -> RankRuns {
        let mut v: Vec<u32> = ranks.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        let mut out: Vec<(u32, u32)> = Vec::new();
        for r in v {
            match out.last_mut() {
                Some((_, last)) if *last + 1 == r => *last = r,
                _ => out.push((r, r)),
            }
        }
        RankRuns(out)
    }

    /// The runs.
    pub fn runs(&self) -> &[(u32, u32)] {
        &self.0
    }

    /// No rank.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many ranks.
    pub fn len(&self) -> u64 {
        self.0.iter().map(|(a, b)| u64::from(b - a) + 1).sum()
    }

    /// Whether `r` is in a run.
    pub fn contains(&self, r: u32) -> bool {
        let i = self.0.partition_point(|&(_, last)| last < r);
        self.0.get(i).is_some_and(|&(first, _)| first <= r)
    }

    /// The ranks of both.
    pub fn union(&self, other: &RankRuns) -> RankRuns {
        let mut all: Vec<(u32, u32)> = self.0.iter().chain(&other.0).copied().collect();
        all.sort_unstable();
        let mut out: Vec<(u32, u32)> = Vec::new();
        for (a, b) in all {
            match out.last_mut() {
                Some((_, last)) if a <= last.saturating_add(1) => *last = (*last).max(b),
                _ => out.push((a, b)),
            }
        }
        RankRuns(out)
    }

    /// The ranks in both.
    pub fn intersect(&self, other: &RankRuns) -> RankRuns {
        let (mut i, mut j) = (0, 0);
        let mut out = Vec::new();
        while i < self.0.len() && j < other.0.len() {
            let (a0, a1) = self.0[i];
            let (b0, b1) = other.0[j];
            let (lo, hi) = (a0.max(b0), a1.min(b1));
            if lo <= hi {
                out.push((lo, hi));
            }
            if a1 < b1 {
                i += 1;
            } else {
                j += 1;
            }
        }
        RankRuns(out)
    }

    /// Short runs rank by rank, long ones (over `listed`) as ranges.
    pub fn split_listed(&self, listed: u32) -> (Vec<u32>, Vec<[u32; 2]>) {
        let mut one = Vec::new();
        let mut ranges = Vec::new();
        for &(a, b) in &self.0 {
            if b - a < listed {
                one.extend(a..=b);
            } else {
                ranges.push([a, b]);
            }
        }
        (one, ranges)
    }

    /// `0-3,7`.
    pub fn label(&self) -> String {
        self.0
            .iter()
            .map(|&(a, b)| match b - a {
                0 => a.to_string(),
                1 => format!("{a},{b}"),
                _ => format!("{a}-{b}"),
            })
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complement_union_intersect() {
        let c = RankRuns::complement(10, [0, 1, 5, 9]);
        assert_eq!(c.runs(), &[(2, 4), (6, 8)]);
        assert_eq!(c.len(), 6);
        assert!(c.contains(3) && !c.contains(5) && !c.contains(9));
        let u = c.union(&RankRuns::from_ranks([5, 0]));
        assert_eq!(u.runs(), &[(0, 0), (2, 8)]);
        let i = u.intersect(&RankRuns::from_ranks([0, 1, 2, 8, 9]));
        assert_eq!(i.runs(), &[(0, 0), (2, 2), (8, 8)]);
        assert_eq!(i.label(), "0,2,8");
        assert_eq!(RankRuns::complement(0, []).len(), 0);
        let big = RankRuns::complement(4_194_304, [0, 1]);
        assert_eq!(big.split_listed(16), (vec![], vec![[2, 4_194_303]]));
    }
}
