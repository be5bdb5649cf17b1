//! The call tree a flame graph draws: stacks merged by the path of
//! (displayed name, kind) from the root, with inclusive sample counts.
//! Built and walked without recursion, so any stack depth is fine.

use std::collections::HashMap;

use whyslow_model::stack::{FrameKind, StackProfile};

/// One node: a frame at one path.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    /// [`whyslow_model::stack::Frame::display`].
    pub name: String,
    /// The frame's kind (the root is a [`FrameKind::Label`]).
    pub kind: FrameKind,
    /// Inclusive samples.
    pub value: u64,
    /// Distance from the root (the root is 0).
    pub depth: usize,
    /// Children, sorted by (name, kind).
    pub children: Vec<usize>,
}

/// The call tree; `nodes[0]` is the root `all`.
#[derive(Debug, Clone)]
pub(crate) struct Tree {
    /// The nodes.
    pub nodes: Vec<Node>,
    /// (parent, name, kind) → child.
    index: HashMap<(usize, String, FrameKind), usize>,
}

impl Tree {
    /// The tree of `profile` (stacks with no samples left out).
    pub fn build(profile: &StackProfile) -> Tree {
        let mut tree = Tree {
            nodes: vec![Node {
                name: "all".to_string(),
                kind: FrameKind::Label,
                value: 0,
                depth: 0,
                children: Vec::new(),
            }],
            index: HashMap::new(),
        };
        let mut names: HashMap<u32, String> = HashMap::new();
        for stack in &profile.stacks {
            if stack.count == 0 {
                continue;
            }
            let mut cur = 0;
            tree.nodes[0].value = tree.nodes[0].value.saturating_add(stack.count);
            for &id in &stack.frames {
                let frame = profile.frame_or_unknown(id);
                let name = names.entry(id).or_insert_with(|| frame.display());
                let key = (cur, name.clone(), frame.kind);
                let next = tree.nodes.len();
                let child = *tree.index.entry(key).or_insert(next);
                if child == next {
                    let depth = tree.nodes[cur].depth + 1;
                    tree.nodes.push(Node {
                        name: name.clone(),
                        kind: frame.kind,
                        value: 0,
                        depth,
                        children: Vec::new(),
                    });
                    tree.nodes[cur].children.push(child);
                }
                tree.nodes[child].value = tree.nodes[child].value.saturating_add(stack.count);
                cur = child;
            }
        }
        let mut nodes = std::mem::take(&mut tree.nodes);
        for i in 0..nodes.len() {
            let mut children = std::mem::take(&mut nodes[i].children);
            children.sort_by(|&a, &b| {
                (&nodes[a].name, nodes[a].kind).cmp(&(&nodes[b].name, nodes[b].kind))
            });
            nodes[i].children = children;
        }
        tree.nodes = nodes;
        tree
    }

    /// The child of `parent` with `name` and `kind`.
    pub fn child(&self, parent: usize, name: &str, kind: FrameKind) -> Option<usize> {
        self.index.get(&(parent, name.to_string(), kind)).copied()
    }

    /// Total samples (the root's).
    pub fn total(&self) -> u64 {
        self.nodes[0].value
    }

    /// For each node of `self`, the node at the same path in `other`.
    pub fn match_in(&self, other: &Tree) -> Vec<Option<usize>> {
        let mut out = vec![None; self.nodes.len()];
        out[0] = Some(0);
        // Parents come before their children in `nodes`.
        for i in 0..self.nodes.len() {
            let Some(o) = out[i] else { continue };
            for &c in &self.nodes[i].children {
                let n = &self.nodes[c];
                out[c] = other.child(o, &n.name, n.kind);
            }
        }
        out
    }

    /// The names from the root's child down to `node`, following parents.
    pub fn path(&self, node: usize, parents: &[usize]) -> Vec<&str> {
        let mut path = Vec::new();
        let mut cur = node;
        while cur != 0 && cur < self.nodes.len() {
            path.push(self.nodes[cur].name.as_str());
            cur = parents[cur];
        }
        path.reverse();
        path
    }

    /// Each node's parent (the root's is 0).
    pub fn parents(&self) -> Vec<usize> {
        let mut parents = vec![0; self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for &c in &n.children {
                parents[c] = i;
            }
        }
        parents
    }
}
