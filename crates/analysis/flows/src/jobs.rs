//! Training job recognition (LLMPrism §IV-A, Algorithm 1).
//!
//! 1. A disjoint-set over flow endpoints: every flow unions its source and destination
//!    (lines 3–6); the sets are the *cross-machine clusters* (line 7).
//! 2. Each cluster's set of machines comes from the physical topology (lines 9–10);
//!    clusters whose machine sets have Jaccard similarity 1 — i.e. are equal — are
//!    merged (lines 11–13): the tensor-parallel ranks of one machine talk over NVLink
//!    and never show up in flows, so each TP index of a job forms its own
//!    cross-machine cluster over the same machines.
//!
//! Equal sets are found by hashing the sorted machine set, so step 2 is linear rather
//! than the pairwise loop of the paper; the result is identical.

use std::collections::HashMap;

use crate::{FlowIndex, Topology};

/// Disjoint-set (union-find) with path halving and union by size.
#[derive(Debug, Clone)]
pub struct DisjointSet {
    parent: Vec<u32>,
    size: Vec<u32>,
}

impl DisjointSet {
    /// `n` singleton sets.
    pub fn new(n: usize) -> Self {
        DisjointSet {
            parent: (0..n as u32).collect(),
            size: vec![1; n],
        }
    }

    /// Representative of `x`'s set.
    pub fn find(&mut self, mut x: u32) -> u32 {
        while self.parent[x as usize] != x {
            let p = self.parent[x as usize];
            self.parent[x as usize] = self.parent[p as usize];
            x = self.parent[x as usize];
        }
        x
    }

    /// Merge the sets of `a` and `b`.
    pub fn union(&mut self, a: u32, b: u32) {
        let (mut ra, mut rb) = (self.find(a), self.find(b));
        if ra == rb {
            return;
        }
        if self.size[ra as usize] < self.size[rb as usize] {
            std::mem::swap(&mut ra, &mut rb);
        }
        self.parent[rb as usize] = ra;
        self.size[ra as usize] += self.size[rb as usize];
    }
}

/// Jobs found in a [`FlowIndex`].
#[derive(Debug, Clone, Default)]
pub struct Jobs {
    /// Job of each address id.
    pub job_of: Vec<usize>,
    /// Address ids of each job, ascending by address.
    pub members: Vec<Vec<u32>>,
    /// Machine names of each job, sorted.
    pub machines: Vec<Vec<String>>,
    /// Cross-machine clusters merged into each job.
    pub clusters: Vec<usize>,
}

/// Algorithm 1 over the indexed flows.
pub fn recognize(index: &FlowIndex<'_>, topology: Option<&Topology>) -> Jobs {
    let n = index.addrs.len();
    let mut ds = DisjointSet::new(n);
    for &(a, b) in &index.pairs {
        ds.union(a, b);
    }
    // Cross-machine clusters.
    let mut cluster_of_root: HashMap<u32, usize> = HashMap::new();
    let mut clusters: Vec<Vec<u32>> = Vec::new();
    for id in 0..n as u32 {
        let r = ds.find(id);
        let c = *cluster_of_root.entry(r).or_insert_with(|| {
            clusters.push(Vec::new());
            clusters.len() - 1
        });
        clusters[c].push(id);
    }
    // Machine set of each cluster (an address without a machine is its own machine).
    let machine_name = |id: u32| -> String {
        let a = index.addrs[id as usize];
        match topology.and_then(|t| t.machine_of(&a)) {
            Some(m) => m.name.clone(),
            None => a.to_string(),
        }
    };
    let mut by_set: HashMap<Vec<String>, usize> = HashMap::new();
    let mut jobs = Jobs {
        job_of: vec![0; n],
        ..Default::default()
    };
    for c in clusters {
        let mut set: Vec<String> = c.iter().map(|&id| machine_name(id)).collect();
        set.sort();
        set.dedup();
        // Jaccard similarity 1 ⇔ equal sets.
        let j = match by_set.get(&set) {
            Some(&j) => j,
            None => {
                let j = jobs.members.len();
                by_set.insert(set.clone(), j);
                jobs.members.push(Vec::new());
                jobs.machines.push(set);
                jobs.clusters.push(0);
                j
            }
        };
        jobs.members[j].extend_from_slice(&c);
        jobs.clusters[j] += 1;
    }
    // Deterministic order: by smallest address.
    for m in &mut jobs.members {
        m.sort_by_key(|&id| index.addrs[id as usize]);
    }
    let mut order: Vec<usize> = (0..jobs.members.len()).collect();
    order.sort_by_key(|&j| jobs.members[j].first().map(|&id| index.addrs[id as usize]));
    let members: Vec<Vec<u32>> = order
        .iter()
        .map(|&j| std::mem::take(&mut jobs.members[j]))
        .collect();
    let machines: Vec<Vec<String>> = order
        .iter()
        .map(|&j| std::mem::take(&mut jobs.machines[j]))
        .collect();
    let nclusters: Vec<usize> = order.iter().map(|&j| jobs.clusters[j]).collect();
    for (j, m) in members.iter().enumerate() {
        for &id in m {
            jobs.job_of[id as usize] = j;
        }
    }
    jobs.members = members;
    jobs.machines = machines;
    jobs.clusters = nclusters;
    jobs
}

/// Jaccard similarity |A ∩ B| / |A ∪ B| of two sorted, deduplicated slices (1 for two
/// empty sets).
pub fn jaccard<T: Ord>(a: &[T], b: &[T]) -> f64 {
    let (mut i, mut j, mut inter) = (0, 0, 0usize);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                inter += 1;
                i += 1;
                j += 1;
            }
        }
    }
    let union = a.len() + b.len() - inter;
    if union == 0 {
        1.0
    } else {
        inter as f64 / union as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Machine;
    use crate::FlowRecord;
    use std::net::IpAddr;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn disjoint_set_unions() {
        let mut d = DisjointSet::new(5);
        d.union(0, 1);
        d.union(3, 4);
        d.union(1, 4);
        assert_eq!(d.find(0), d.find(3));
        assert_ne!(d.find(0), d.find(2));
    }

    #[test]
    fn jaccard_values() {
        assert_eq!(jaccard(&[1, 2, 3], &[1, 2, 3]), 1.0);
        assert_eq!(jaccard(&[1, 2], &[2, 3]), 1.0 / 3.0);
        assert_eq!(jaccard::<u8>(&[], &[]), 1.0);
    }

    #[test]
    fn merges_tp_lanes_by_machine_set() {
        // Two machines with two NICs each; lane 0 and lane 1 talk only within the lane.
        let recs = vec![
            FlowRecord::new(0, ip("10.0.0.1"), ip("10.0.1.1"), 10, 1),
            FlowRecord::new(0, ip("10.0.0.2"), ip("10.0.1.2"), 10, 1),
            // Another job on two other machines.
            FlowRecord::new(0, ip("10.0.2.1"), ip("10.0.3.1"), 10, 1),
        ];
        let topo = Topology::new(
            vec![
                Machine {
                    name: "m0".into(),
                    addresses: vec![ip("10.0.0.1"), ip("10.0.0.2")],
                    switch: None,
                },
                Machine {
                    name: "m1".into(),
                    addresses: vec![ip("10.0.1.1"), ip("10.0.1.2")],
                    switch: None,
                },
                Machine {
                    name: "m2".into(),
                    addresses: vec![ip("10.0.2.1")],
                    switch: None,
                },
                Machine {
                    name: "m3".into(),
                    addresses: vec![ip("10.0.3.1")],
                    switch: None,
                },
            ],
            vec![],
        )
        .unwrap();
        let idx = FlowIndex::build(&recs);
        let jobs = recognize(&idx, Some(&topo));
        assert_eq!(jobs.members.len(), 2);
        assert_eq!(jobs.members[0].len(), 4);
        assert_eq!(jobs.clusters[0], 2);
        assert_eq!(jobs.machines[0], vec!["m0", "m1"]);
        // Without a topology the two lanes stay apart.
        assert_eq!(recognize(&idx, None).members.len(), 3);
    }
}
