//! Physical topology: machines ↔ their GPU/NIC addresses, and the switch graph.
//!
//! Which address is which rank is unknown (black box); the topology only says which
//! addresses share a machine (needed by Algorithm 1 to merge the cross-machine
//! clusters of one job, LLMPrism §IV-A) and which switches exist.
//!
//! File format (JSON; `//` comments are not allowed):
//!
//! ```json
//! {
//!   "machines": [
//!     {"name": "host-a", "addresses": ["10.0.1.1", "10.0.1.2"], "switch": "leaf1"},
//!     {"name": "host-b", "addresses": ["10.0.2.1", "10.0.2.2"], "switch": "leaf2"}
//!   ],
//!   "switches": [
//!     {"name": "leaf1", "links": ["spine"], "exporters": ["192.0.2.11"]},
//!     {"name": "leaf2", "links": ["spine"], "exporters": ["192.0.2.12"]},
//!     {"name": "spine"}
//!   ]
//! }
//! ```
//!
//! * `machines[].addresses`: the addresses that appear as flow endpoints (one per
//!   GPU NIC, or one per host); `switch` (optional): the switch the machine is
//!   attached to.
//! * `switches[].links` (optional): neighbours in the switch graph (undirected; listing
//!   a link on one side is enough). Used to infer a flow's switch path when the flow
//!   records carry none.
//! * `switches[].exporters` (optional): names under which the switch exports flows
//!   (the exporter's IP address as the collector sees it, e.g. `192.0.2.11`, or
//!   `192.0.2.11/5` with an IPFIX observation domain / NetFlow v9 source id); flow
//!   records naming an exporter are attributed to the switch.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// A machine (server) and its addresses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// Machine name.
    pub name: String,
    /// GPU/NIC addresses of the machine.
    pub addresses: Vec<IpAddr>,
    /// The switch the machine is attached to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch: Option<String>,
}

/// A switch of the network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Switch {
    /// Switch name.
    pub name: String,
    /// Neighbouring switches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<String>,
    /// Exporter names of this switch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exporters: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct TopologyFile {
    #[serde(default)]
    machines: Vec<Machine>,
    #[serde(default)]
    switches: Vec<Switch>,
}

/// Error of [`Topology::from_json_str`].
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// Not JSON of the documented shape.
    #[error("topology: {0}")]
    Json(#[from] serde_json::Error),
    /// An address listed for two machines.
    #[error("topology: address {addr} belongs to both {a:?} and {b:?}")]
    DuplicateAddress {
        /// The address.
        addr: IpAddr,
        /// First machine.
        a: String,
        /// Second machine.
        b: String,
    },
}

/// The physical topology with its lookup tables.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Topology {
    /// Machines.
    pub machines: Vec<Machine>,
    /// Switches.
    pub switches: Vec<Switch>,
    /// Exporter name → switch name.
    pub exporters: HashMap<String, String>,
    machine_of: HashMap<IpAddr, usize>,
    adjacency: BTreeMap<String, Vec<String>>,
}

impl Topology {
    /// Build the lookup tables.
    pub fn new(machines: Vec<Machine>, switches: Vec<Switch>) -> Result<Self, TopologyError> {
        let mut machine_of: HashMap<IpAddr, usize> = HashMap::new();
        for (i, m) in machines.iter().enumerate() {
            for a in &m.addresses {
                if let Some(&j) = machine_of.get(a) {
                    if j != i {
                        return Err(TopologyError::DuplicateAddress {
                            addr: *a,
                            a: machines[j].name.clone(),
                            b: m.name.clone(),
                        });
                    }
                }
                machine_of.insert(*a, i);
            }
        }
        let mut exporters = HashMap::new();
        let mut adjacency: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for s in &switches {
            adjacency.entry(s.name.clone()).or_default();
            for e in &s.exporters {
                exporters.insert(e.clone(), s.name.clone());
            }
            for l in &s.links {
                adjacency.entry(s.name.clone()).or_default().push(l.clone());
                adjacency.entry(l.clone()).or_default().push(s.name.clone());
            }
        }
        for v in adjacency.values_mut() {
            v.sort();
            v.dedup();
        }
        Ok(Topology {
            machines,
            switches,
            exporters,
            machine_of,
            adjacency,
        })
    }

    /// Parse the JSON file format (see the module docs).
    pub fn from_json_str(s: &str) -> Result<Self, TopologyError> {
        let f: TopologyFile = serde_json::from_str(s)?;
        Topology::new(f.machines, f.switches)
    }

    /// Serialize to the JSON file format.
    pub fn to_json_string(&self) -> String {
        let f = TopologyFile {
            machines: self.machines.clone(),
            switches: self.switches.clone(),
        };
        serde_json::to_string_pretty(&f).unwrap_or_default()
    }

    /// The machine an address belongs to.
    pub fn machine_of(&self, addr: &IpAddr) -> Option<&Machine> {
        self.machine_of.get(addr).map(|&i| &self.machines[i])
    }

    /// Index of the machine of an address in [`Topology::machines`].
    pub fn machine_index(&self, addr: &IpAddr) -> Option<usize> {
        self.machine_of.get(addr).copied()
    }

    /// Whether switches `a` and `b` are linked: `None` when the topology does
    /// not know one of them or lists no links at all.
    pub fn linked(&self, a: &str, b: &str) -> Option<bool> {
        if self.adjacency.values().all(Vec::is_empty) {
            return None;
        }
        let next = self.adjacency.get(a)?;
        self.adjacency.get(b)?;
        Some(next.iter().any(|n| n == b))
    }

    /// Switch path between two addresses (shortest path in the switch graph between
    /// their machines' switches), when the topology knows it.
    pub fn switch_path(&self, a: &IpAddr, b: &IpAddr) -> Option<Vec<String>> {
        let sa = self.machine_of(a)?.switch.clone()?;
        let sb = self.machine_of(b)?.switch.clone()?;
        if sa == sb {
            return Some(vec![sa]);
        }
        let mut prev: HashMap<&str, &str> = HashMap::new();
        let mut q = VecDeque::new();
        q.push_back(sa.as_str());
        prev.insert(sa.as_str(), "");
        while let Some(u) = q.pop_front() {
            if u == sb {
                let mut path = vec![u.to_string()];
                let mut cur = u;
                while let Some(&p) = prev.get(cur) {
                    if p.is_empty() {
                        break;
                    }
                    path.push(p.to_string());
                    cur = p;
                }
                path.reverse();
                return Some(path);
            }
            for v in self.adjacency.get(u).into_iter().flatten() {
                if !prev.contains_key(v.as_str()) {
                    prev.insert(v.as_str(), u);
                    q.push_back(v.as_str());
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"{
      "machines": [
        {"name": "host-a", "addresses": ["10.0.1.1", "10.0.1.2"], "switch": "leaf1"},
        {"name": "host-b", "addresses": ["10.0.2.1", "10.0.2.2"], "switch": "leaf2"}
      ],
      "switches": [
        {"name": "leaf1", "links": ["spine"], "exporters": ["192.0.2.11"]},
        {"name": "leaf2", "links": ["spine"], "exporters": ["192.0.2.12"]},
        {"name": "spine"}
      ]
    }"#;

    #[test]
    fn parses_documented_example() {
        let t = Topology::from_json_str(EXAMPLE).unwrap();
        let a: IpAddr = "10.0.1.2".parse().unwrap();
        let b: IpAddr = "10.0.2.1".parse().unwrap();
        assert_eq!(t.machine_of(&a).unwrap().name, "host-a");
        assert_eq!(
            t.switch_path(&a, &b).unwrap(),
            vec!["leaf1", "spine", "leaf2"]
        );
        assert_eq!(t.exporters["192.0.2.12"], "leaf2");
        assert_eq!(t.linked("leaf1", "spine"), Some(true));
        assert_eq!(t.linked("spine", "leaf2"), Some(true));
        assert_eq!(t.linked("leaf1", "leaf2"), Some(false));
        assert_eq!(t.linked("leaf1", "core"), None);
        let again = Topology::from_json_str(&t.to_json_string()).unwrap();
        assert_eq!(again.machines, t.machines);
    }

    #[test]
    fn rejects_bad_input() {
        assert!(Topology::from_json_str("{").is_err());
        assert!(
            Topology::from_json_str(r#"{"machines":[{"name":"a","addresses":["x"]}]}"#).is_err()
        );
        let dup = r#"{"machines":[{"name":"a","addresses":["10.0.0.1"]},{"name":"b","addresses":["10.0.0.1"]}]}"#;
        assert!(matches!(
            Topology::from_json_str(dup),
            Err(TopologyError::DuplicateAddress { .. })
        ));
    }
}
