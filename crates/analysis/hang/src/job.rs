//! The job as the evidence shows it: who is in which group, how far each
//! rank got in each, and which ranks left nothing at all.

use std::collections::{BTreeMap, BTreeSet};

use whyslow_model::hang::{CollectiveState, GroupInfo, HangEvidence, RankEvidence};
use whyslow_model::hang::{RecordedCollective, MAX_WORLD_SIZE};

use crate::ranks::RankRuns;

/// Per (rank, group): how far the rank got.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Progress {
    pub enqueued: Option<u64>,
    pub started: Option<u64>,
    pub completed: Option<u64>,
}

pub(crate) struct Job<'a> {
    pub ranks: BTreeMap<u32, &'a RankEvidence>,
    pub groups: BTreeMap<String, GroupInfo>,
    /// Members a dump, a stack file or an entry names (bounded by the
    /// evidence).
    pub members: BTreeMap<String, BTreeSet<u32>>,
    /// Groups that span the world (the default group): every rank of
    /// `[0, world)` is a member, named or not.
    pub whole_world: BTreeSet<String>,
    pub progress: BTreeMap<(u32, String), Progress>,
    /// Groups some dump lists the members of.
    pub listed: BTreeSet<String>,
    /// Ranks in `[0, world)` that left nothing.
    pub silent: RankRuns,
    /// Silent ranks some evidence names as a member of a group: known to
    /// the job, and gone quiet.
    pub named_silent: BTreeSet<u32>,
    pub world: u32,
}

fn is_default(g: &GroupInfo) -> bool {
    g.desc == "default_pg" || (g.name == "0" && g.desc.is_empty())
}

/// The world: the caller's, the evidence's, else one past the highest
/// rank any evidence names.
pub(crate) fn world_size(ev: &HangEvidence, asked: Option<u32>) -> u32 {
    let max_rank = ev
        .ranks
        .iter()
        .map(|r| r.rank.saturating_add(1))
        .max()
        .unwrap_or(0);
    let declared = ev
        .ranks
        .iter()
        .flat_map(|r| r.groups.iter())
        .filter_map(|g| g.ranks.as_ref())
        .flatten()
        .map(|r| r.saturating_add(1))
        .max()
        .unwrap_or(0);
    asked
        .or(ev.world_size)
        .unwrap_or(max_rank.max(declared))
        .max(max_rank)
        .min(MAX_WORLD_SIZE)
}

impl<'a> Job<'a> {
    pub fn new(ev: &'a HangEvidence, world: u32) -> Job<'a> {
        let ranks: BTreeMap<u32, &RankEvidence> = ev.ranks.iter().map(|r| (r.rank, r)).collect();
        let mut groups: BTreeMap<String, GroupInfo> = BTreeMap::new();
        let mut members: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
        let mut progress: BTreeMap<(u32, String), Progress> = BTreeMap::new();
        // A group's member list as each member's dump repeats it: merged
        // once per distinct length (every member lists the same ranks).
        let mut listed: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
        let add_group = |groups: &mut BTreeMap<String, GroupInfo>, g: &GroupInfo| {
            let e = groups.entry(g.name.clone()).or_insert_with(|| GroupInfo {
                name: g.name.clone(),
                desc: String::new(),
                ranks: None,
            });
            if e.desc.is_empty() {
                e.desc = g.desc.clone();
            }
        };
        for r in &ev.ranks {
            for g in &r.groups {
                add_group(&mut groups, g);
                let m = members.entry(g.name.clone()).or_default();
                m.insert(r.rank);
                if let Some(rs) = &g.ranks {
                    if listed.entry(g.name.clone()).or_default().insert(rs.len()) {
                        m.extend(rs.iter().copied().filter(|&x| x < world));
                    }
                }
            }
            for p in &r.progress {
                let e = progress.entry((r.rank, p.group.clone())).or_default();
                e.enqueued = e.enqueued.max(p.last_enqueued);
                e.started = e.started.max(p.last_started);
                e.completed = e.completed.max(p.last_completed);
                members.entry(p.group.clone()).or_default().insert(r.rank);
            }
            for c in &r.collectives {
                members.entry(c.group.clone()).or_default().insert(r.rank);
                add_group(
                    &mut groups,
                    &GroupInfo {
                        name: c.group.clone(),
                        desc: String::new(),
                        ranks: None,
                    },
                );
                // Point-to-point counts apart (its own numbering): no
                // collective progress.
                if c.p2p {
                    continue;
                }
                let e = progress.entry((r.rank, c.group.clone())).or_default();
                e.enqueued = e.enqueued.max(Some(c.seq));
                if c.state >= CollectiveState::Started {
                    e.started = e.started.max(Some(c.seq));
                }
                if c.state == CollectiveState::Completed {
                    e.completed = e.completed.max(Some(c.seq));
                }
            }
        }
        let whole_world: BTreeSet<String> = groups
            .values()
            .filter(|g| is_default(g))
            .map(|g| g.name.clone())
            .collect();
        let silent = RankRuns::complement(world, ranks.keys().copied());
        let named_silent: BTreeSet<u32> = members
            .values()
            .flatten()
            .copied()
            .filter(|r| !ranks.contains_key(r))
            .collect();
        Job {
            ranks,
            groups,
            members,
            whole_world,
            progress,
            listed: listed.into_keys().collect(),
            silent,
            named_silent,
            world,
        }
    }

    /// Whether the rank left Flight Recorder state (a dump, even one with
    /// nothing pending, or collective records).
    pub fn has_fr(&self, r: u32) -> bool {
        self.ranks.get(&r).is_some_and(|e| {
            e.fr_version.is_some() || !e.collectives.is_empty() || !e.progress.is_empty()
        })
    }

    pub fn prog(&self, r: u32, g: &str) -> Progress {
        self.progress
            .get(&(r, g.to_string()))
            .copied()
            .unwrap_or_default()
    }

    /// The group's members that left evidence.
    pub fn known_members(&self, g: &str) -> impl Iterator<Item = u32> + '_ {
        self.members
            .get(g)
            .into_iter()
            .flatten()
            .copied()
            .filter(|r| self.ranks.contains_key(r))
    }

    /// The group's members that left nothing.
    pub fn silent_members(&self, g: &str) -> RankRuns {
        if self.whole_world.contains(g) {
            return self.silent.clone();
        }
        RankRuns::from_ranks(
            self.members
                .get(g)
                .into_iter()
                .flatten()
                .copied()
                .filter(|r| !self.ranks.contains_key(r)),
        )
    }

    /// Every member, for a report: listed when the group is not the world.
    pub fn member_list(&self, g: &str) -> Vec<u32> {
        if self.whole_world.contains(g) && self.world > 4096 {
            return Vec::new();
        }
        let mut m: BTreeSet<u32> = self.members.get(g).cloned().unwrap_or_default();
        if self.whole_world.contains(g) {
            m.extend(0..self.world);
        }
        m.into_iter().collect()
    }

    pub fn entry(&self, r: u32, g: &str, seq: u64) -> Option<&'a RecordedCollective> {
        self.ranks.get(&r).and_then(|e| {
            e.collectives
                .iter()
                .rev()
                .find(|c| !c.p2p && c.group == g && c.seq == seq)
        })
    }

    pub fn desc(&self, g: &str) -> String {
        self.groups
            .get(g)
            .map(|x| x.desc.clone())
            .unwrap_or_default()
    }

    pub fn label(&self, g: &str) -> String {
        match self.desc(g) {
            d if d.is_empty() => format!("group {g}"),
            d => format!("{d} (group {g})"),
        }
    }

    /// Groups no dump lists the members of (gloo leaves `pg_config`
    /// empty): what is known of them is who showed their name.
    pub fn unlisted(&self, g: &str) -> bool {
        !self.whole_world.contains(g) && !self.listed.contains(g)
    }

    /// A group's kind where its description does not say: the places its
    /// collectives were issued from and their ops (a tensor-parallel group
    /// of one job issues from where every other does).
    pub fn kind(&self, g: &str) -> BTreeSet<(String, String)> {
        let mut k = BTreeSet::new();
        for e in self.ranks.values() {
            for c in e.collectives.iter().filter(|c| !c.p2p && c.group == g) {
                let site = c
                    .call_site()
                    .map(|f| format!("{}:{}", f.file, f.line))
                    .unwrap_or_default();
                k.insert((c.op.clone(), site));
            }
        }
        k
    }
}
