//! Pure mapping of etcd members to Machines (and Machines to members).
//!
//! Rules, in order, for each member:
//! 1. the Machine's Node carries `etcd.k3s.cattle.io/node-name` == member name;
//! 2. the member name is `<node>-<8 hex>` (k3s) and `<node>` is the Machine's Node name,
//!    unless its peer address is another Machine's (then it is an ambiguity);
//! 3. a peer-URL host of the member is one of the Machine's addresses.
//!
//! The first rule that finds any Machine decides. Two Machines claiming one
//! member, or one Machine claimed by two members, is reported as an ambiguity
//! and nothing in it is paired: we never guess. Members that have not started
//! (empty name) can only match by peer URL.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::LazyLock;

use regex::Regex;
use serde::Serialize;

use crate::etcd::transport::url_host;

/// The Node annotation k3s sets to the exact etcd member name.
pub const NODE_NAME_ANNOTATION: &str = "etcd.k3s.cattle.io/node-name";

static K3S_MEMBER_NAME: LazyLock<Regex> =
    LazyLock::new(|| Regex::new("^(.+)-[0-9a-f]{8}$").expect("valid regex"));

/// A Machine as the mapping needs it (with its Node, when it has one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineRef {
    pub machine: String,
    pub node_name: Option<String>,
    /// Machine and Node addresses (IPs or host names).
    pub addresses: Vec<String>,
    pub node_annotations: BTreeMap<String, String>,
}

/// An etcd member as the mapping needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberRef {
    #[serde(serialize_with = "hex_id")]
    pub id: u64,
    /// Empty while the member has not started.
    pub name: String,
    #[serde(rename = "peerURLs")]
    pub peer_urls: Vec<String>,
}

impl MemberRef {
    pub fn label(&self) -> String {
        crate::quorum::member_label(self.id, &self.name)
    }
}

/// Which rule paired a member with a Machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum MatchRule {
    NodeAnnotation,
    NamePattern,
    PeerAddress,
}

/// A member paired with exactly one Machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pairing {
    pub machine: String,
    pub member: MemberRef,
    pub rule: MatchRule,
}

/// A conflict the mapping refuses to resolve.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Ambiguity {
    /// One member matches several Machines by the same rule.
    #[serde(rename_all = "camelCase")]
    MemberMatchesSeveralMachines {
        member: MemberRef,
        machines: Vec<String>,
        rule: MatchRule,
    },
    /// Several members claim the same Machine.
    #[serde(rename_all = "camelCase")]
    MachineClaimedBySeveralMembers {
        machine: String,
        members: Vec<MemberRef>,
    },
    /// The member's name points at one Machine's Node, its peer address at
    /// another's (older k3s named members after the short host name).
    #[serde(rename_all = "camelCase")]
    NameAndAddressDisagree {
        member: MemberRef,
        by_name: Vec<String>,
        by_address: Vec<String>,
    },
}

impl std::fmt::Display for Ambiguity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ambiguity::MemberMatchesSeveralMachines {
                member,
                machines,
                rule,
            } => write!(
                f,
                "member {} matches machines {} (by {rule:?})",
                member.label(),
                machines.join(", ")
            ),
            Ambiguity::MachineClaimedBySeveralMembers { machine, members } => write!(
                f,
                "machine {machine} is claimed by members {}",
                members
                    .iter()
                    .map(MemberRef::label)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Ambiguity::NameAndAddressDisagree {
                member,
                by_name,
                by_address,
            } => write!(
                f,
                "member {} is named after the Node of machine {} but its peer address is machine {}'s (give the Node the annotation {NODE_NAME_ANNOTATION})",
                member.label(),
                by_name.join(", "),
                by_address.join(", ")
            ),
        }
    }
}

/// The result of the mapping.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MembershipMap {
    pub pairs: Vec<Pairing>,
    pub members_without_machine: Vec<MemberRef>,
    pub machines_without_member: Vec<String>,
    pub ambiguities: Vec<Ambiguity>,
}

impl MembershipMap {
    /// The member paired with `machine`, if exactly one is.
    pub fn member_of(&self, machine: &str) -> Option<&Pairing> {
        self.pairs.iter().find(|p| p.machine == machine)
    }

    /// Whether `machine` takes part in an ambiguity (then nothing may be decided about it).
    pub fn is_ambiguous(&self, machine: &str) -> bool {
        self.ambiguities.iter().any(|a| match a {
            Ambiguity::MemberMatchesSeveralMachines { machines, .. } => {
                machines.iter().any(|m| m == machine)
            }
            Ambiguity::MachineClaimedBySeveralMembers { machine: m, .. } => m == machine,
            Ambiguity::NameAndAddressDisagree {
                by_name,
                by_address,
                ..
            } => by_name.iter().chain(by_address).any(|m| m == machine),
        })
    }
}

/// The `<node>` of a k3s member name `<node>-<8 hex>`.
pub fn node_of_member_name(member_name: &str) -> Option<&str> {
    K3S_MEMBER_NAME
        .captures(member_name)
        .and_then(|c| c.get(1))
        .map(|m| m.as_str())
}

fn same_address(a: &str, b: &str) -> bool {
    match (a.parse::<IpAddr>(), b.parse::<IpAddr>()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a.eq_ignore_ascii_case(b),
    }
}

/// What the rules say of one member.
enum Candidates<'a> {
    None,
    /// The Machines matched by the first rule that matches any.
    Found(MatchRule, Vec<&'a MachineRef>),
    /// The name pattern and the peer address point at different Machines.
    Disagree {
        by_name: Vec<&'a MachineRef>,
        by_address: Vec<&'a MachineRef>,
    },
}

fn by_peer_address<'a>(member: &MemberRef, machines: &'a [MachineRef]) -> Vec<&'a MachineRef> {
    let hosts: Vec<String> = member
        .peer_urls
        .iter()
        .filter_map(|u| url_host(u))
        .collect();
    machines
        .iter()
        .filter(|m| {
            m.addresses
                .iter()
                .any(|a| hosts.iter().any(|h| same_address(a, h)))
        })
        .collect()
}

/// Machines matching `member` by the first rule that matches any, with that
/// rule. A name-pattern match is trusted only when the member's peer address
/// is not another Machine's: an older k3s member named after the short host
/// name (`cp-0` for Node `cp-0.example.com`) must not pair with a Node that
/// happens to be named `cp-0`.
fn candidates<'a>(member: &MemberRef, machines: &'a [MachineRef]) -> Candidates<'a> {
    if !member.name.is_empty() {
        let by_annotation: Vec<_> = machines
            .iter()
            .filter(|m| m.node_annotations.get(NODE_NAME_ANNOTATION) == Some(&member.name))
            .collect();
        if !by_annotation.is_empty() {
            return Candidates::Found(MatchRule::NodeAnnotation, by_annotation);
        }
        if let Some(node) = node_of_member_name(&member.name) {
            let by_name: Vec<_> = machines
                .iter()
                .filter(|m| m.node_name.as_deref() == Some(node))
                .collect();
            if !by_name.is_empty() {
                let by_address = by_peer_address(member, machines);
                let elsewhere = !by_address.is_empty()
                    && !by_address
                        .iter()
                        .any(|a| by_name.iter().any(|n| n.machine == a.machine));
                if elsewhere {
                    return Candidates::Disagree {
                        by_name,
                        by_address,
                    };
                }
                return Candidates::Found(MatchRule::NamePattern, by_name);
            }
        }
    }
    let by_address = by_peer_address(member, machines);
    if by_address.is_empty() {
        Candidates::None
    } else {
        Candidates::Found(MatchRule::PeerAddress, by_address)
    }
}

/// Map members to machines; see the module docs for the rules.
pub fn map_members(machines: &[MachineRef], members: &[MemberRef]) -> MembershipMap {
    let mut result = MembershipMap::default();
    // machine -> members claiming it (with the rule)
    let mut claims: BTreeMap<&str, Vec<(&MemberRef, MatchRule)>> = BTreeMap::new();
    for member in members {
        match candidates(member, machines) {
            Candidates::None => result.members_without_machine.push(member.clone()),
            Candidates::Disagree {
                by_name,
                by_address,
            } => {
                let names =
                    |found: Vec<&MachineRef>| found.iter().map(|m| m.machine.clone()).collect();
                result.ambiguities.push(Ambiguity::NameAndAddressDisagree {
                    member: member.clone(),
                    by_name: names(by_name),
                    by_address: names(by_address),
                })
            }
            Candidates::Found(rule, found) if found.len() == 1 => {
                claims
                    .entry(found[0].machine.as_str())
                    .or_default()
                    .push((member, rule));
            }
            Candidates::Found(rule, found) => {
                result
                    .ambiguities
                    .push(Ambiguity::MemberMatchesSeveralMachines {
                        member: member.clone(),
                        machines: found.iter().map(|m| m.machine.clone()).collect(),
                        rule,
                    })
            }
        }
    }
    for (machine, claimants) in &claims {
        if let [(member, rule)] = claimants.as_slice() {
            result.pairs.push(Pairing {
                machine: machine.to_string(),
                member: (*member).clone(),
                rule: *rule,
            });
        } else {
            result
                .ambiguities
                .push(Ambiguity::MachineClaimedBySeveralMembers {
                    machine: machine.to_string(),
                    members: claimants.iter().map(|(m, _)| (*m).clone()).collect(),
                });
        }
    }
    let involved: BTreeSet<String> = machines
        .iter()
        .filter(|m| claims.contains_key(m.machine.as_str()) || result.is_ambiguous(&m.machine))
        .map(|m| m.machine.clone())
        .collect();
    result.machines_without_member = machines
        .iter()
        .filter(|m| !involved.contains(&m.machine))
        .map(|m| m.machine.clone())
        .collect();
    result
}

fn hex_id<S: serde::Serializer>(id: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{id:016x}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(name: &str, node: Option<&str>, addresses: &[&str]) -> MachineRef {
        MachineRef {
            machine: name.into(),
            node_name: node.map(Into::into),
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            node_annotations: BTreeMap::new(),
        }
    }

    fn annotated(mut m: MachineRef, member_name: &str) -> MachineRef {
        m.node_annotations
            .insert(NODE_NAME_ANNOTATION.into(), member_name.into());
        m
    }

    fn member(id: u64, name: &str, ip: &str) -> MemberRef {
        MemberRef {
            id,
            name: name.into(),
            peer_urls: vec![format!("https://{ip}:2380")],
        }
    }

    /// (machine, member id, rule) triples, sorted.
    fn pairs(map: &MembershipMap) -> Vec<(String, u64, MatchRule)> {
        let mut p: Vec<_> = map
            .pairs
            .iter()
            .map(|p| (p.machine.clone(), p.member.id, p.rule))
            .collect();
        p.sort();
        p
    }

    fn ids(members: &[MemberRef]) -> Vec<u64> {
        members.iter().map(|m| m.id).collect()
    }

    struct Case {
        name: &'static str,
        machines: Vec<MachineRef>,
        members: Vec<MemberRef>,
        pairs: Vec<(&'static str, u64, MatchRule)>,
        members_without_machine: Vec<u64>,
        machines_without_member: Vec<&'static str>,
        ambiguities: usize,
    }

    #[test]
    fn mapping_table() {
        use MatchRule::*;
        let cases = vec![
            Case {
                name: "three k3s nodes match by name pattern",
                machines: vec![
                    machine("m0", Some("cp-0"), &["10.0.0.1"]),
                    machine("m1", Some("cp-1"), &["10.0.0.2"]),
                    machine("m2", Some("cp-2"), &["10.0.0.3"]),
                ],
                members: vec![
                    member(1, "cp-0-0a1b2c3d", "10.0.0.1"),
                    member(2, "cp-1-1a1b2c3d", "10.0.0.2"),
                    member(3, "cp-2-2a1b2c3d", "10.0.0.3"),
                ],
                pairs: vec![
                    ("m0", 1, NamePattern),
                    ("m1", 2, NamePattern),
                    ("m2", 3, NamePattern),
                ],
                members_without_machine: vec![],
                machines_without_member: vec![],
                ambiguities: 0,
            },
            Case {
                name: "node annotation wins over name pattern and address",
                machines: vec![
                    annotated(machine("m0", Some("other"), &["10.9.9.9"]), "cp-0-0a1b2c3d"),
                    machine("m1", Some("cp-0"), &["10.0.0.1"]),
                ],
                members: vec![member(1, "cp-0-0a1b2c3d", "10.0.0.1")],
                pairs: vec![("m0", 1, NodeAnnotation)],
                members_without_machine: vec![],
                machines_without_member: vec!["m1"],
                ambiguities: 0,
            },
            Case {
                name: "cp-1 is not cp-10",
                machines: vec![
                    machine("m1", Some("cp-1"), &["10.0.0.1"]),
                    machine("m10", Some("cp-10"), &["10.0.0.10"]),
                ],
                members: vec![
                    member(10, "cp-10-0a1b2c3d", "10.0.0.10"),
                    member(1, "cp-1-0a1b2c3d", "10.0.0.1"),
                ],
                pairs: vec![("m1", 1, NamePattern), ("m10", 10, NamePattern)],
                members_without_machine: vec![],
                machines_without_member: vec![],
                ambiguities: 0,
            },
            Case {
                name: "node name that itself ends in dash-hex",
                machines: vec![
                    machine("mx", Some("cp-deadbeef"), &["10.0.0.1"]),
                    machine("my", Some("cp"), &["10.0.0.2"]),
                ],
                members: vec![
                    member(1, "cp-deadbeef-0a1b2c3d", "10.0.0.1"),
                    member(2, "cp-0b1b2c3d", "10.0.0.2"),
                ],
                pairs: vec![("mx", 1, NamePattern), ("my", 2, NamePattern)],
                members_without_machine: vec![],
                machines_without_member: vec![],
                ambiguities: 0,
            },
            Case {
                name: "a member that has not started matches by peer URL only",
                machines: vec![
                    machine("m0", Some("cp-0"), &["10.0.0.1"]),
                    machine("m3", None, &["10.0.0.4"]),
                ],
                members: vec![
                    member(1, "cp-0-0a1b2c3d", "10.0.0.1"),
                    member(4, "", "10.0.0.4"),
                ],
                pairs: vec![("m0", 1, NamePattern), ("m3", 4, PeerAddress)],
                members_without_machine: vec![],
                machines_without_member: vec![],
                ambiguities: 0,
            },
            Case {
                name: "uppercase hex or a short suffix is not a k3s name; falls back to address",
                machines: vec![machine("m0", Some("cp-0"), &["10.0.0.1"])],
                members: vec![member(1, "cp-0-0A1B2C3D", "10.0.0.1")],
                pairs: vec![("m0", 1, PeerAddress)],
                members_without_machine: vec![],
                machines_without_member: vec![],
                ambiguities: 0,
            },
            Case {
                name: "member without machine and machine without member (k3s --disable-etcd)",
                machines: vec![
                    machine("m0", Some("cp-0"), &["10.0.0.1"]),
                    machine("m-noetcd", Some("cp-9"), &["10.0.0.9"]),
                ],
                members: vec![
                    member(1, "cp-0-0a1b2c3d", "10.0.0.1"),
                    member(7, "gone-0a1b2c3d", "10.0.0.7"),
                ],
                pairs: vec![("m0", 1, NamePattern)],
                members_without_machine: vec![7],
                machines_without_member: vec!["m-noetcd"],
                ambiguities: 0,
            },
            Case {
                name: "two machines with the same address claim one member: ambiguous",
                machines: vec![
                    machine("ma", None, &["10.0.0.1"]),
                    machine("mb", None, &["10.0.0.1"]),
                ],
                members: vec![member(4, "", "10.0.0.1")],
                pairs: vec![],
                members_without_machine: vec![],
                machines_without_member: vec![],
                ambiguities: 1,
            },
            Case {
                name: "two members claim one machine: ambiguous, neither paired",
                machines: vec![machine("m0", Some("cp-0"), &["10.0.0.1"])],
                members: vec![
                    member(1, "cp-0-0a1b2c3d", "10.0.0.1"),
                    member(2, "cp-0-9f9f9f9f", "10.0.0.2"),
                ],
                pairs: vec![],
                members_without_machine: vec![],
                machines_without_member: vec![],
                ambiguities: 1,
            },
            Case {
                name: "two nodes annotated with the same member name: ambiguous",
                machines: vec![
                    annotated(machine("ma", Some("a"), &[]), "cp-0-0a1b2c3d"),
                    annotated(machine("mb", Some("b"), &[]), "cp-0-0a1b2c3d"),
                ],
                members: vec![member(1, "cp-0-0a1b2c3d", "10.0.0.1")],
                pairs: vec![],
                members_without_machine: vec![],
                machines_without_member: vec![],
                ambiguities: 1,
            },
            Case {
                name: "an older short-host-name member pairs with its FQDN Node by the annotation",
                machines: vec![
                    annotated(
                        machine("m-fqdn", Some("cp-0.example.com"), &["10.0.0.1"]),
                        "cp-0-0a1b2c3d",
                    ),
                    machine("m-short", Some("cp-0"), &["10.0.0.2"]),
                ],
                members: vec![member(1, "cp-0-0a1b2c3d", "10.0.0.1")],
                pairs: vec![("m-fqdn", 1, NodeAnnotation)],
                members_without_machine: vec![],
                machines_without_member: vec!["m-short"],
                ambiguities: 0,
            },
            Case {
                name: "an older short-host-name member without the annotation pairs by peer address",
                machines: vec![machine("m-fqdn", Some("cp-0.example.com"), &["10.0.0.1"])],
                members: vec![member(1, "cp-0-0a1b2c3d", "10.0.0.1")],
                pairs: vec![("m-fqdn", 1, PeerAddress)],
                members_without_machine: vec![],
                machines_without_member: vec![],
                ambiguities: 0,
            },
            Case {
                name: "a short-host-name member is never paired by name with another Node named like it",
                machines: vec![
                    machine("m-fqdn", Some("cp-0.example.com"), &["10.0.0.1"]),
                    machine("m-short", Some("cp-0"), &["10.0.0.2"]),
                ],
                members: vec![member(1, "cp-0-0a1b2c3d", "10.0.0.1")],
                pairs: vec![],
                members_without_machine: vec![],
                machines_without_member: vec![],
                ambiguities: 1,
            },
            Case {
                name: "IPv6 peer URL matches an equivalent address spelling",
                machines: vec![machine("m6", None, &["fd00:0:0::1"])],
                members: vec![MemberRef {
                    id: 6,
                    name: String::new(),
                    peer_urls: vec!["https://[fd00::1]:2380".into()],
                }],
                pairs: vec![("m6", 6, PeerAddress)],
                members_without_machine: vec![],
                machines_without_member: vec![],
                ambiguities: 0,
            },
        ];
        for case in cases {
            let map = map_members(&case.machines, &case.members);
            let want: Vec<_> = case
                .pairs
                .iter()
                .map(|(m, id, r)| (m.to_string(), *id, *r))
                .collect();
            assert_eq!(pairs(&map), want, "{}: pairs", case.name);
            assert_eq!(
                ids(&map.members_without_machine),
                case.members_without_machine,
                "{}: members without machine",
                case.name
            );
            assert_eq!(
                map.machines_without_member, case.machines_without_member,
                "{}: machines without member",
                case.name
            );
            assert_eq!(
                map.ambiguities.len(),
                case.ambiguities,
                "{}: {:?}",
                case.name,
                map.ambiguities
            );
        }
    }

    #[test]
    fn ambiguity_explains_itself() {
        let machines = [machine("m0", Some("cp-0"), &[])];
        let members = [
            member(1, "cp-0-0a1b2c3d", "10.0.0.1"),
            member(2, "cp-0-9f9f9f9f", "10.0.0.2"),
        ];
        let map = map_members(&machines, &members);
        assert_eq!(
            map.ambiguities[0].to_string(),
            "machine m0 is claimed by members cp-0-0a1b2c3d, cp-0-9f9f9f9f"
        );
        assert!(map.is_ambiguous("m0"));
        assert!(map.member_of("m0").is_none());
    }

    #[test]
    fn node_of_member_name_table() {
        for (name, node) in [
            ("cp-0-0a1b2c3d", Some("cp-0")),
            ("cp-deadbeef-0a1b2c3d", Some("cp-deadbeef")),
            ("cp-deadbeef", Some("cp")),
            ("cp-0", None),
            ("-0a1b2c3d", None),
            ("cp-0-0a1b2c3", None),
            ("", None),
        ] {
            assert_eq!(node_of_member_name(name), node, "{name}");
        }
    }
}
