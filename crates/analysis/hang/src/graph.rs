//! The waits-for graph over the ranks that left evidence, linear in it:
//! the waiters of one collective instance share one node that points at
//! the members they wait for (16,384 ranks waiting in the default group
//! are 16,384 edges, not 16,384²). Ranks that left nothing have no edges
//! out and are handled as runs by the caller.

use std::collections::{BTreeMap, BTreeSet};

use crate::waits::Wait;

pub(crate) struct WaitGraph {
    /// Nodes 0..ranks.len() are ranks (ascending), the rest instances.
    ranks: Vec<u32>,
    index: BTreeMap<u32, usize>,
    out: Vec<Vec<usize>>,
    back: Vec<Vec<usize>>,
    /// Rank nodes with a wait that points at a silent rank.
    to_silent: Vec<bool>,
}

impl WaitGraph {
    pub fn new(ranks: impl IntoIterator<Item = u32>, waits: &[Wait]) -> WaitGraph {
        let ranks: Vec<u32> = ranks.into_iter().collect();
        let index: BTreeMap<u32, usize> = ranks.iter().enumerate().map(|(i, &r)| (r, i)).collect();
        let mut out: Vec<Vec<usize>> = vec![Vec::new(); ranks.len()];
        let mut to_silent = vec![false; ranks.len()];
        let mut shared: BTreeMap<(&str, u64, bool), usize> = BTreeMap::new();
        for w in waits {
            let Some(&from) = index.get(&w.rank) else {
                continue;
            };
            to_silent[from] |= !w.silent.is_empty();
            let targets = || {
                w.waits_for
                    .iter()
                    .chain(&w.not_started)
                    .filter_map(|t| index.get(t).copied())
            };
            if w.p2p || w.not_started.len() + w.waits_for.len() <= 1 {
                out[from].extend(targets());
                continue;
            }
            // Every waiter of one instance waits for the same members, but
            // a member that waits in it itself does not wait for itself:
            // the shared node holds the members, the waiter skips itself.
            let key = (w.group.as_str(), w.seq, false);
            let node = match shared.get(&key) {
                Some(&n) => n,
                None => {
                    let n = out.len();
                    out.push(targets().collect());
                    shared.insert(key, n);
                    n
                }
            };
            let holds_self = out[node].contains(&from);
            if holds_self {
                out[from].extend(targets().filter(|&t| t != from));
            } else {
                out[from].push(node);
            }
        }
        for o in &mut out {
            o.sort_unstable();
            o.dedup();
        }
        let mut back = vec![Vec::new(); out.len()];
        for (from, o) in out.iter().enumerate() {
            for &to in o {
                back[to].push(from);
            }
        }
        WaitGraph {
            ranks,
            index,
            out,
            back,
            to_silent,
        }
    }

    fn is_rank(&self, n: usize) -> bool {
        n < self.ranks.len()
    }

    /// Ranks waited for that wait for nobody.
    pub fn roots(&self) -> BTreeSet<u32> {
        (0..self.ranks.len())
            .filter(|&n| !self.back[n].is_empty() && self.out[n].is_empty() && !self.to_silent[n])
            .map(|n| self.ranks[n])
            .collect()
    }

    /// Ranks in cycles that reach no root (nor a silent rank): Tarjan's
    /// components, then which components can get out, successors first.
    pub fn cyclic(&self, roots: &BTreeSet<u32>) -> BTreeSet<u32> {
        let comps = self.components();
        let mut comp_of = vec![0usize; self.out.len()];
        for (c, nodes) in comps.iter().enumerate() {
            for &n in nodes {
                comp_of[n] = c;
            }
        }
        let mut escapes = vec![false; comps.len()];
        for (c, nodes) in comps.iter().enumerate() {
            escapes[c] = nodes.iter().any(|&n| {
                (self.is_rank(n) && (roots.contains(&self.ranks[n]) || self.to_silent[n]))
                    || self.out[n]
                        .iter()
                        .any(|&m| comp_of[m] != c && escapes[comp_of[m]])
            });
        }
        let mut out = BTreeSet::new();
        for (c, nodes) in comps.iter().enumerate() {
            let cycle = nodes.len() > 1 || nodes.iter().any(|&n| self.out[n].contains(&n));
            if cycle && !escapes[c] {
                out.extend(
                    nodes
                        .iter()
                        .filter(|&&n| self.is_rank(n))
                        .map(|&n| self.ranks[n]),
                );
            }
        }
        out
    }

    /// Strongly connected components, each after every component it
    /// reaches (iterative Tarjan).
    fn components(&self) -> Vec<Vec<usize>> {
        let n = self.out.len();
        let mut index = vec![usize::MAX; n];
        let mut low = vec![0usize; n];
        let mut on_stack = vec![false; n];
        let mut stack = Vec::new();
        let mut comps = Vec::new();
        let mut next = 0;
        for start in 0..n {
            if index[start] != usize::MAX {
                continue;
            }
            let mut call: Vec<(usize, usize)> = vec![(start, 0)];
            index[start] = next;
            low[start] = next;
            next += 1;
            stack.push(start);
            on_stack[start] = true;
            while let Some(&mut (v, ref mut i)) = call.last_mut() {
                if let Some(&w) = self.out[v].get(*i) {
                    *i += 1;
                    if index[w] == usize::MAX {
                        index[w] = next;
                        low[w] = next;
                        next += 1;
                        stack.push(w);
                        on_stack[w] = true;
                        call.push((w, 0));
                    } else if on_stack[w] {
                        low[v] = low[v].min(index[w]);
                    }
                    continue;
                }
                call.pop();
                if let Some(&(u, _)) = call.last() {
                    low[u] = low[u].min(low[v]);
                }
                if low[v] == index[v] {
                    let mut comp = Vec::new();
                    while let Some(w) = stack.pop() {
                        on_stack[w] = false;
                        comp.push(w);
                        if w == v {
                            break;
                        }
                    }
                    comps.push(comp);
                }
            }
        }
        comps
    }

    /// Ranks that wait, directly or through others, for any of `from`
    /// (those included when `with_start`).
    pub fn waiting_on(&self, from: &[u32], with_start: bool) -> Vec<u32> {
        let mut seen = vec![false; self.out.len()];
        let mut todo: Vec<usize> = from
            .iter()
            .filter_map(|r| self.index.get(r).copied())
            .collect();
        for &n in &todo {
            seen[n] = true;
        }
        let start: BTreeSet<usize> = todo.iter().copied().collect();
        while let Some(x) = todo.pop() {
            for &y in &self.back[x] {
                if !seen[y] {
                    seen[y] = true;
                    todo.push(y);
                }
            }
        }
        (0..self.ranks.len())
            .filter(|&n| seen[n] && (with_start || !start.contains(&n)))
            .map(|n| self.ranks[n])
            .collect()
    }
}
