//! A handle on one etcd cluster: seeds to start from, TLS, per-member clients,
//! and the membership snapshot.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use etcd_client::{AlarmAction, AlarmType, GetOptions};
use futures::future::join_all;
use tracing::instrument;

use crate::etcd::client::{MemberClients, Timeouts};
use crate::etcd::error::EtcdError;
use crate::etcd::snapshot::{ForeignCluster, MemberSnapshot, MemberStatus, MembershipSnapshot};
use crate::etcd::tls::ClientTls;
use crate::etcd::transport::{EtcdEndpoint, Transport, parse_https_url};

/// A member as listed by `MemberList`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedMember {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub learner: bool,
}

/// The answer to `MemberList`, and who gave it.
#[derive(Clone, Debug)]
pub(crate) struct MemberList {
    pub cluster_id: u64,
    /// The id of the member that answered (the response header's).
    pub lister_id: u64,
    pub members: Vec<ListedMember>,
    pub listed_by: EtcdEndpoint,
    /// Other clusters that answered on the seeds while this one was chosen.
    pub foreign: Vec<ForeignCluster>,
}

impl MemberList {
    fn voters(&self) -> usize {
        self.members.iter().filter(|m| !m.learner).count()
    }

    fn ids(&self) -> BTreeSet<u64> {
        self.members.iter().map(|m| m.id).collect()
    }

    fn as_foreign(&self) -> ForeignCluster {
        ForeignCluster {
            endpoint: self.listed_by.dial.clone(),
            cluster_id: self.cluster_id,
            members: self.members.iter().map(|m| m.name.clone()).collect(),
        }
    }

    fn covers(&self, url: &str) -> bool {
        self.members
            .iter()
            .any(|m| m.client_urls.iter().any(|u| u == url))
    }

    /// Whether `self` and `other` can be one cluster: the same cluster id
    /// and a member in common that is not one we know was removed (a cluster
    /// id alone proves nothing, docs/k3s.md T3).
    fn same_cluster(&self, other: &MemberList, removed: &BTreeSet<u64>) -> bool {
        self.cluster_id == other.cluster_id
            && self
                .ids()
                .intersection(&other.ids())
                .any(|id| !removed.contains(id))
    }

    fn voter_ids(&self) -> BTreeSet<u64> {
        self.members
            .iter()
            .filter(|m| !m.learner)
            .map(|m| m.id)
            .collect()
    }

    /// For a person choosing: the cluster id, voters, member ids (what the
    /// annotation takes) and who answered.
    fn describe(&self) -> String {
        let ids: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{:016x}", m.id))
            .collect();
        format!(
            "{:016x} with {} voter(s), members {}, answered by {}",
            self.cluster_id,
            self.voters(),
            ids.join(","),
            self.listed_by.dial
        )
    }
}

/// What a handle knows of which cluster is ours: the cluster id and the
/// voters of the last snapshot that proved it (its lister reached a quorum;
/// learners are left out: k3s evicts a stalled one on its own), and the
/// members removed through this handle since it was made.
/// A cluster id alone is not an identity: k3s's first server bootstraps
/// alone with etcd's default cluster token, so when it restarts alone on its
/// old address from empty data it gets the same cluster id, and the removed
/// member's own id (docs/k3s.md T3). What it cannot share is the members.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KnownCluster {
    pub cluster_id: u64,
    pub members: BTreeSet<u64>,
    pub removed: BTreeSet<u64>,
}

impl KnownCluster {
    /// The known members that are still members as far as we know.
    fn live(&self) -> BTreeSet<u64> {
        self.members.difference(&self.removed).copied().collect()
    }
}

/// What tells which cluster is ours, strongest first: the members a person
/// pinned (annotation `controlplane.cluster.x-k8s.io/etcd-cluster-members`),
/// else what the handle proved, else nothing (a fresh handle).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Identity<'a> {
    pub pinned: Option<&'a BTreeSet<u64>>,
    pub known: Option<&'a KnownCluster>,
}

impl Identity<'_> {
    fn removed(&self) -> BTreeSet<u64> {
        self.known.map(|k| k.removed.clone()).unwrap_or_default()
    }

    /// How strongly `answer` is ours (`None`: it is not):
    /// - pinned: the pinned members it lists (at least one);
    /// - proven: the live known voters it lists, which must be at least half
    ///   of them, with the known cluster id, and not answered by a member
    ///   removed through this handle. Membership changes one member at a
    ///   time, so the real cluster keeps at least half of what the last
    ///   proven snapshot listed; a removed first server restarted alone
    ///   lists one member (itself), less than half of three or more. (A
    ///   cluster reset leaves the same shape and is refused too, until a
    ///   person pins its member or the controller restarts: a lone member
    ///   cannot prove the others left it.) With two known voters, one is
    ///   half: a scale-down to one seen by a handle that did not remove the
    ///   other; when both halves answer, that is a tie, refused.
    /// - fresh handle: its voters.
    fn score(&self, answer: &MemberList) -> Option<usize> {
        let ids = answer.ids();
        let score = match (self.pinned, self.known) {
            (Some(pinned), _) => ids.intersection(pinned).count(),
            (None, Some(known)) => {
                let live = known.live();
                let listed = ids.intersection(&live).count();
                if answer.cluster_id != known.cluster_id
                    || known.removed.contains(&answer.lister_id)
                    || listed * 2 < live.len()
                {
                    return None;
                }
                listed
            }
            (None, None) => answer.voters(),
        };
        (score > 0).then_some(score)
    }

    /// Whether `answer` is ours beyond doubt, so that no other seed need be
    /// asked (the steady state: one member list, as before): it lists a
    /// majority of the pinned, or of the live known, members (half leaves
    /// room for a rival half: the others are asked). A fresh handle asks the
    /// seeds the first answer does not list instead.
    fn settles(&self, answer: &MemberList) -> bool {
        let Some(score) = self.score(answer) else {
            return false;
        };
        match (self.pinned, self.known) {
            (Some(pinned), _) => score > pinned.len() / 2,
            (None, Some(known)) => score * 2 > known.live().len(),
            (None, None) => false,
        }
    }
}

/// Which of the clusters that answered on the seeds is ours. Pure.
///
/// A removed k3s server can come back as a cluster of its own on the same
/// address, with the same cluster id (the first server has no `server:` to
/// rejoin: k3s T3), so neither the first endpoint that answers nor the
/// cluster id is trusted alone. Each answer is scored ([`Identity::score`]):
/// - pinned members (a person's word): the answer listing most of them;
///   none listing any is refused ([`EtcdError::PinnedClusterGone`]);
/// - once a snapshot has proven the cluster: an answer with its cluster id,
///   not given by a member removed through this handle, listing a majority
///   of the members it knew and were not removed since (a rogue lists only
///   itself, the removed member); none is refused
///   ([`EtcdError::KnownClusterGone`]), never guessed;
/// - before that: the answer with the most voters.
///
/// The best answer wins unless an answer of another cluster (another id, or
/// no live member in common) scores as high: then it is refused
/// ([`EtcdError::SplitClusters`], naming the annotation that settles it).
/// Answers of the chosen cluster from other endpoints are not foreign.
pub(crate) fn choose_cluster(
    identity: Identity<'_>,
    answers: Vec<MemberList>,
) -> Result<MemberList, EtcdError> {
    if answers.is_empty() {
        return Err(EtcdError::NoReceiver {
            reason: "no endpoint answered the member list".into(),
        });
    }
    let removed = identity.removed();
    let scores: Vec<Option<usize>> = answers.iter().map(|a| identity.score(a)).collect();
    // The first answer with the best score (seeds are asked in order).
    let best = (0..answers.len())
        .filter(|&i| scores[i].is_some())
        .max_by_key(|&i| (scores[i], std::cmp::Reverse(i)));
    let Some(best) = best else {
        let found = distinct(&answers, &removed)
            .iter()
            .map(|a| a.describe())
            .collect();
        return Err(match (identity.pinned, identity.known) {
            (Some(pinned), _) => EtcdError::PinnedClusterGone {
                pinned: pinned.iter().copied().collect(),
                found,
            },
            (None, Some(known)) => EtcdError::KnownClusterGone {
                known: known.cluster_id,
                members: known.live().into_iter().collect(),
                found,
            },
            (None, None) => EtcdError::NoReceiver {
                reason: "no endpoint answered the member list".into(),
            },
        });
    };
    let rival = (0..answers.len()).find(|&i| {
        i != best && scores[i] == scores[best] && !answers[i].same_cluster(&answers[best], &removed)
    });
    if rival.is_some() {
        return Err(EtcdError::SplitClusters {
            clusters: distinct(&answers, &removed)
                .iter()
                .map(|a| a.describe())
                .collect(),
        });
    }
    let mut answers = answers;
    let mut list = answers.swap_remove(best);
    let others: Vec<MemberList> = answers
        .into_iter()
        .filter(|a| !a.same_cluster(&list, &removed))
        .collect();
    list.foreign.extend(
        distinct(&others, &removed)
            .into_iter()
            .map(MemberList::as_foreign),
    );
    Ok(list)
}

/// One answer per cluster (by [`MemberList::same_cluster`]), in order.
fn distinct<'a>(answers: &'a [MemberList], removed: &BTreeSet<u64>) -> Vec<&'a MemberList> {
    let mut out: Vec<&MemberList> = Vec::new();
    for answer in answers {
        if !out.iter().any(|o| {
            o.same_cluster(answer, removed)
                || (o.cluster_id == answer.cluster_id && o.ids() == answer.ids())
        }) {
            out.push(answer);
        }
    }
    out
}

/// The value of the annotation `controlplane.cluster.x-k8s.io/etcd-cluster-members`:
/// member ids in hex (as `etcd status` and `etcdctl member list` print
/// them, with or without leading zeros or `0x`), comma-separated. Pure;
/// the error says what is wrong with which item.
pub fn parse_pinned_members(value: &str) -> Result<BTreeSet<u64>, String> {
    let mut ids = BTreeSet::new();
    for item in value.split(',') {
        let item = item.trim();
        let digits = item
            .strip_prefix("0x")
            .or_else(|| item.strip_prefix("0X"))
            .unwrap_or(item);
        if digits.is_empty() {
            return Err(format!(
                "{value:?}: expected etcd member ids in hex, comma-separated; found an empty item"
            ));
        }
        match u64::from_str_radix(digits, 16) {
            Ok(0) => return Err(format!("{value:?}: {item:?} is not a member id (0)")),
            Ok(id) => {
                ids.insert(id);
            }
            Err(_) => {
                return Err(format!(
                    "{value:?}: {item:?} is not an etcd member id (up to 16 hex digits)"
                ));
            }
        }
    }
    Ok(ids)
}

/// Connection to one etcd cluster over verified mutual TLS.
pub struct EtcdCluster {
    pub(crate) clients: MemberClients,
    /// Client URLs to start from: the given seeds, then members learnt since.
    seeds: Mutex<Vec<String>>,
    /// The cluster a snapshot proved (its lister reached a quorum): its id
    /// and members. From then on, an endpoint answering for another cluster,
    /// or for the same id with none of these members, is never listed from.
    known: Mutex<Option<KnownCluster>>,
    /// Members removed through this handle: an answer they give is not ours.
    removed: Mutex<BTreeSet<u64>>,
    /// Members a person pinned as ours ([`Self::pin_members`]).
    pinned: Mutex<Option<BTreeSet<u64>>>,
    /// Foreign clusters already logged, by endpoint and cluster id.
    reported_foreign: Mutex<std::collections::HashSet<(String, u64)>>,
}

impl std::fmt::Debug for EtcdCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCluster")
            .field(
                "seeds",
                &*self.seeds.lock().unwrap_or_else(|p| p.into_inner()),
            )
            .finish_non_exhaustive()
    }
}

impl EtcdCluster {
    /// A cluster reached through `seeds` (client URLs, `https://ip:2379`),
    /// directly, with default timeouts. Fails only on malformed seeds.
    pub fn new(seeds: &[String], tls: ClientTls) -> Result<Self, EtcdError> {
        Self::with_options(seeds, tls, Transport::Direct, Timeouts::default())
    }

    pub fn with_options(
        seeds: &[String],
        tls: ClientTls,
        transport: Transport,
        timeouts: Timeouts,
    ) -> Result<Self, EtcdError> {
        if seeds.is_empty() {
            return Err(EtcdError::InvalidEndpoint {
                url: String::new(),
                reason: "no endpoint given".into(),
            });
        }
        for seed in seeds {
            transport.resolve(seed)?;
        }
        Ok(Self {
            clients: MemberClients::new(tls, transport, timeouts),
            seeds: Mutex::new(seeds.to_vec()),
            known: Mutex::new(None),
            removed: Mutex::new(BTreeSet::new()),
            pinned: Mutex::new(None),
            reported_foreign: Mutex::new(Default::default()),
        })
    }

    /// `direct`, or the relay's kind (`port-forward`).
    pub fn transport_kind(&self) -> &'static str {
        self.clients.transport().kind()
    }

    pub fn timeouts(&self) -> Timeouts {
        self.clients.timeouts()
    }

    /// How many member connections this handle has opened so far; a steady
    /// cluster reuses them, so this stays put across snapshots.
    pub fn connections_opened(&self) -> u64 {
        self.clients.connections_opened()
    }

    /// When the serving certificate `member` last presented to us expires:
    /// from the handshakes this handle made, never a new connection. `None`
    /// before a full handshake with it (or without a client URL).
    pub fn serving_cert_not_after(
        &self,
        member: &crate::etcd::MemberSnapshot,
    ) -> Option<std::time::SystemTime> {
        let url = member.client_urls.first()?;
        let (host, _) = parse_https_url(url).ok()?;
        self.clients.tls().serving_certs().not_after(&host)
    }

    fn seeds(&self) -> Vec<String> {
        self.seeds.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn learn_seeds(&self, members: &[ListedMember]) {
        let mut seeds = self.seeds.lock().unwrap_or_else(|p| p.into_inner());
        for url in members.iter().filter_map(|m| m.client_urls.first()) {
            if !seeds.contains(url) {
                seeds.push(url.clone());
            }
        }
    }

    /// Stop starting from these client URLs (their member was removed).
    pub(crate) fn forget_seeds(&self, urls: &[String]) {
        let mut seeds = self.seeds.lock().unwrap_or_else(|p| p.into_inner());
        if seeds.iter().any(|s| !urls.contains(s)) {
            seeds.retain(|s| !urls.contains(s));
        }
    }

    /// Say which cluster is ours by its members' ids (the annotation
    /// `controlplane.cluster.x-k8s.io/etcd-cluster-members`), or stop saying
    /// so (`None`). Takes precedence over what the handle proved.
    pub fn pin_members(&self, pinned: Option<BTreeSet<u64>>) {
        *self.pinned.lock().unwrap_or_else(|p| p.into_inner()) = pinned;
    }

    /// Member `id` was removed through this handle: an endpoint answering as
    /// it (a removed server restarted as a cluster of its own) is not ours.
    pub(crate) fn note_removed(&self, id: u64) {
        self.removed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id);
    }

    /// What this handle knows of its cluster, with the removals it made.
    fn known_cluster(&self) -> Option<KnownCluster> {
        let known = self.known.lock().unwrap_or_else(|p| p.into_inner()).clone();
        known.map(|mut k| {
            k.removed = self
                .removed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            k
        })
    }

    /// `MemberList` from the first endpoint that answers for our cluster,
    /// skipping the client URLs in `avoid` (e.g. a member about to be
    /// removed). Which cluster is ours: [`choose_cluster`]. Once a cluster is
    /// proven (or members pinned), the first answer listing a majority of
    /// its members settles it, so a steady cluster costs one member list as
    /// before; an answer that does not (a rogue lists only itself) makes the
    /// next seeds be asked. A fresh handle asks the seeds the first answer
    /// does not list too (none, on a steady cluster).
    pub(crate) async fn member_list(&self, avoid: &[String]) -> Result<MemberList, EtcdError> {
        let known = self.known_cluster();
        let pinned = self
            .pinned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let identity = Identity {
            pinned: pinned.as_ref(),
            known: known.as_ref(),
        };
        let fresh = identity.pinned.is_none() && identity.known.is_none();
        let mut errors = Vec::new();
        let mut answers: Vec<MemberList> = Vec::new();
        let seeds: Vec<String> = self
            .seeds()
            .into_iter()
            .filter(|s| !avoid.contains(s))
            .collect();
        for (i, seed) in seeds.iter().enumerate() {
            let endpoint = self.clients.resolve(seed)?;
            // A stopped member must not hold us for the full call timeout
            // while others could answer: only the last attempt gets it.
            let limit = if i + 1 < seeds.len() {
                self.timeouts().probe
            } else {
                self.timeouts().call
            };
            match self.member_list_from(&endpoint, limit).await {
                Ok(list) if identity.settles(&list) => {
                    answers.push(list);
                    break;
                }
                Ok(list) if fresh => {
                    let unlisted: Vec<&String> = seeds.iter().filter(|s| !list.covers(s)).collect();
                    answers.push(list);
                    answers.extend(self.other_answers(&unlisted).await);
                    break;
                }
                Ok(unsettled) => answers.push(unsettled),
                Err(err) => errors.push(err),
            }
        }
        if answers.is_empty() {
            return Err(match errors.len() {
                0 => EtcdError::NoReceiver {
                    reason: "every known endpoint belongs to the member being removed".into(),
                },
                1 => errors.remove(0),
                _ => EtcdError::AllEndpointsFailed(errors),
            });
        }
        let list = choose_cluster(identity, answers)?;
        for foreign in &list.foreign {
            // Once per foreign cluster and endpoint: it answers on every pass.
            let first = self
                .reported_foreign
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert((foreign.endpoint.clone(), foreign.cluster_id));
            if first {
                tracing::warn!(
                    cluster_id = %format!("{:016x}", list.cluster_id),
                    foreign = %foreign,
                    "an endpoint on the seeds answers for another etcd cluster: not used"
                );
            }
        }
        self.learn_seeds(&list.members);
        Ok(list)
    }

    /// The member lists of `seeds` that answer, each within the probe
    /// timeout, concurrently (unreachable ones are left out).
    async fn other_answers(&self, seeds: &[&String]) -> Vec<MemberList> {
        let limit = self.timeouts().probe;
        join_all(seeds.iter().map(|seed| async move {
            let endpoint = self.clients.resolve(seed).ok()?;
            self.member_list_from(&endpoint, limit).await.ok()
        }))
        .await
        .into_iter()
        .flatten()
        .collect()
    }

    /// Remember `cluster_id` with these members as ours: a snapshot proved
    /// it reaches a quorum. Costs a set of ids per snapshot, no request.
    fn prove_cluster(&self, cluster_id: u64, members: BTreeSet<u64>) {
        *self.known.lock().unwrap_or_else(|p| p.into_inner()) = Some(KnownCluster {
            cluster_id,
            members,
            removed: BTreeSet::new(),
        });
    }

    pub(crate) async fn member_list_from(
        &self,
        endpoint: &EtcdEndpoint,
        limit: std::time::Duration,
    ) -> Result<MemberList, EtcdError> {
        let response = self
            .clients
            .call(endpoint, "member list", limit, |mut c| async move {
                c.member_list().await
            })
            .await?;
        Ok(MemberList {
            cluster_id: response.header().map_or(0, |h| h.cluster_id()),
            lister_id: response.header().map_or(0, |h| h.member_id()),
            members: response
                .members()
                .iter()
                .map(|m| ListedMember {
                    id: m.id(),
                    name: m.name().to_string(),
                    peer_urls: m.peer_urls().to_vec(),
                    client_urls: m.client_urls().to_vec(),
                    learner: m.is_learner(),
                })
                .collect(),
            listed_by: endpoint.clone(),
            foreign: Vec::new(),
        })
    }

    /// The endpoint of a member's own first client URL.
    pub(crate) fn member_endpoint(&self, member: &ListedMember) -> Result<EtcdEndpoint, EtcdError> {
        let url = member
            .client_urls
            .first()
            .ok_or_else(|| EtcdError::Unreachable {
                endpoint: format!("member {:016x}", member.id),
                reason: "member has not started (no client URL)".into(),
            })?;
        crate::etcd::transport::refuse_reset_loopback(url)?;
        self.clients.resolve(url)
    }

    /// `Status` of one member on its own endpoint, within `limit`; returns the
    /// cluster id it reported too.
    pub(crate) async fn probe(
        &self,
        member: &ListedMember,
        limit: std::time::Duration,
    ) -> Result<(u64, MemberStatus), EtcdError> {
        let endpoint = self.member_endpoint(member)?;
        let response = self
            .clients
            .call(&endpoint, "status", limit, |mut c| async move {
                c.status().await
            })
            .await?;
        Ok((
            response.header().map_or(0, |h| h.cluster_id()),
            MemberStatus {
                leader: response.leader(),
                raft_term: response.raft_term(),
                raft_index: response.raft_index(),
                raft_applied_index: response.raft_applied_index(),
                db_size: response.db_size(),
                db_size_in_use: response.raft_used_db_size(),
                db_size_quota: response.db_size_quota(),
                revision: response.header().map_or(0, |h| h.revision()),
                version: response.version().to_string(),
                errors: response.errors().to_vec(),
                is_learner: response.is_learner(),
            },
        ))
    }

    /// A linearizable read (`get health`, serializable = false, count only) on
    /// one member's own endpoint, within `limit`. etcd serves it only after
    /// confirming with its leader's quorum (ReadIndex) and applying up to that
    /// point, so a member cut off from its peers, or a leader cut off from its
    /// followers, cannot answer it. "Permission denied" comes after that
    /// confirmation, so it counts as answered (as `etcdctl endpoint health`).
    pub(crate) async fn linearizable_read(
        &self,
        member: &ListedMember,
        limit: std::time::Duration,
    ) -> Result<(), EtcdError> {
        let endpoint = self.member_endpoint(member)?;
        let result = self
            .clients
            .call_keeping_connection(&endpoint, "linearizable read", limit, |mut c| async move {
                c.get(HEALTH_KEY, Some(GetOptions::new().with_count_only()))
                    .await
            })
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(EtcdError::Grpc { code, .. }) if code == "PermissionDenied" => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// The health probe of one member: `Status` and, for a voter, a
    /// linearizable read, concurrently on its own endpoint, both within `limit`.
    pub(crate) async fn probe_health(
        &self,
        member: &ListedMember,
        limit: std::time::Duration,
    ) -> Result<Probe, EtcdError> {
        let read = async {
            if member.learner {
                // etcd serves learners only Status and serializable reads.
                Read::NotAsked
            } else {
                match self.linearizable_read(member, limit).await {
                    Ok(()) => Read::Served,
                    Err(err) => Read::Failed(err.to_string()),
                }
            }
        };
        let (status, read) = futures::join!(self.probe(member, limit), read);
        let (cluster_id, status) = status?;
        Ok(Probe {
            cluster_id,
            status,
            read,
        })
    }

    /// Probe every member of `members` concurrently, reusing `known` results.
    async fn probe_all(
        &self,
        members: &[ListedMember],
        mut known: BTreeMap<u64, Result<Probe, String>>,
        limit: std::time::Duration,
    ) -> Vec<Result<Probe, String>> {
        let fresh = join_all(
            members
                .iter()
                .filter(|m| !known.contains_key(&m.id))
                .map(|m| async move { (m.id, self.probe_health(m, limit).await) }),
        )
        .await;
        for (id, probe) in fresh {
            known.insert(id, probe.map_err(|e| e.to_string()));
        }
        members
            .iter()
            .map(|m| {
                known
                    .remove(&m.id)
                    .unwrap_or_else(|| Err("not probed".to_string()))
            })
            .collect()
    }

    pub(crate) async fn alarms(
        &self,
        endpoint: &EtcdEndpoint,
        limit: std::time::Duration,
    ) -> Result<BTreeMap<u64, Vec<String>>, EtcdError> {
        let response = self
            .clients
            .call(endpoint, "alarm list", limit, |mut c| async move {
                c.alarm(AlarmAction::Get, AlarmType::None, None).await
            })
            .await?;
        let mut alarms: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for alarm in response.alarms() {
            let name = match alarm.alarm() {
                AlarmType::Nospace => "NOSPACE".to_string(),
                AlarmType::Corrupt => "CORRUPT".to_string(),
                AlarmType::None => continue,
            };
            alarms.entry(alarm.member_id()).or_default().push(name);
        }
        Ok(alarms)
    }

    /// Observe the membership and decide each member's health.
    ///
    /// Lists the members, then probes each on its own endpoint, all
    /// concurrently and each bounded by the probe timeout: `Status` (is it
    /// alive, which term, which leader does it follow) and, for a voter, a
    /// linearizable read (can it reach a quorum *now*). A voter is healthy only
    /// if both answered and it reports no errors and has no alarm: a member
    /// that is alive but partitioned from its peers answers `Status` from its
    /// own stale state but cannot serve the read. A learner (which etcd does
    /// not let serve linearizable reads) is healthy if it answers `Status` and
    /// follows the leader the healthy voters follow. The leader is the one the
    /// healthy voters follow (at the highest term), so a deposed leader that
    /// still believes it leads is never named.
    ///
    /// The member list is taken again from a healthy voter if the member that
    /// answered it first is not one (its list may be stale). Alarms go through
    /// raft: they are read from the lister concurrently with the probes, and
    /// on failure from the healthy voters; with no healthy voter they are not
    /// asked for at all (and the quorum verdict says why).
    #[instrument(skip(self), level = "debug")]
    pub async fn snapshot(&self) -> Result<MembershipSnapshot, EtcdError> {
        let mut list = self.member_list(&[]).await?;
        let limit = self.timeouts().probe;
        let (mut probes, first_alarms) = futures::join!(
            self.probe_all(&list.members, BTreeMap::new(), limit),
            self.alarms(&list.listed_by, limit)
        );

        // The lister's view is only trusted if it proved it reaches a quorum.
        let proven = |list: &MemberList, probes: &[Result<Probe, String>]| -> Vec<EtcdEndpoint> {
            list.members
                .iter()
                .zip(probes)
                .filter(|(m, p)| !m.learner && p.as_ref().is_ok_and(Probe::served_read))
                .filter_map(|(m, _)| self.member_endpoint(m).ok())
                .collect()
        };
        let mut healthy_endpoints = proven(&list, &probes);
        if !healthy_endpoints.contains(&list.listed_by)
            && let Some(better) = healthy_endpoints.first()
            && let Ok(relisted) = self.member_list_from(better, limit).await
        {
            self.learn_seeds(&relisted.members);
            let known: BTreeMap<u64, Result<Probe, String>> =
                list.members.iter().map(|m| m.id).zip(probes).collect();
            probes = self.probe_all(&relisted.members, known, limit).await;
            let foreign = std::mem::take(&mut list.foreign);
            list = relisted;
            list.foreign = foreign;
            healthy_endpoints = proven(&list, &probes);
        }

        let mut alarms_error = None;
        let alarms = match first_alarms {
            Ok(found) => found,
            Err(first_err) => {
                let mut found = None;
                let mut last = first_err.to_string();
                for endpoint in healthy_endpoints.iter().filter(|e| **e != list.listed_by) {
                    match self.alarms(endpoint, limit).await {
                        Ok(alarms) => {
                            found = Some(alarms);
                            break;
                        }
                        Err(err) => last = err.to_string(),
                    }
                }
                found.unwrap_or_else(|| {
                    alarms_error = Some(if healthy_endpoints.is_empty() {
                        format!("no voter can reach a quorum to read them: {last}")
                    } else {
                        last
                    });
                    BTreeMap::new()
                })
            }
        };

        // The leader: the one the healthy voters follow, at the highest term.
        let mut leader: Option<(u64, u64)> = None; // (term, id)
        for (listed, probe) in list.members.iter().zip(&probes) {
            if let Ok(probe) = probe {
                if probe.cluster_id != list.cluster_id {
                    return Err(EtcdError::ClusterIdMismatch {
                        first_endpoint: list.listed_by.dial.clone(),
                        first: list.cluster_id,
                        member: listed.name.clone(),
                        endpoint: listed.client_urls.first().cloned().unwrap_or_default(),
                        other: probe.cluster_id,
                    });
                }
                let status = &probe.status;
                if !listed.learner
                    && probe.served_read()
                    && status.leader != 0
                    && leader.is_none_or(|(term, _)| status.raft_term > term)
                {
                    leader = Some((status.raft_term, status.leader));
                }
            }
        }
        let leader = leader
            .map(|(_, id)| id)
            .filter(|id| list.members.iter().any(|m| m.id == *id));

        let mut members = Vec::with_capacity(list.members.len());
        for (listed, probe) in list.members.iter().zip(probes) {
            let (status, probe_error) = match probe {
                Ok(probe) => {
                    let verdict = probe.verdict(listed.learner, leader);
                    (Some(probe.status), verdict)
                }
                Err(err) => (None, Some(err)),
            };
            members.push(MemberSnapshot {
                id: listed.id,
                name: listed.name.clone(),
                peer_urls: listed.peer_urls.clone(),
                client_urls: listed.client_urls.clone(),
                learner: listed.learner,
                status,
                probe_error,
                alarms: alarms.get(&listed.id).cloned().unwrap_or_default(),
            });
        }
        let voters = members.iter().filter(|m| !m.learner).count();
        if healthy_endpoints.len() > voters / 2 {
            self.prove_cluster(list.cluster_id, list.voter_ids());
        }
        Ok(MembershipSnapshot {
            cluster_id: list.cluster_id,
            leader,
            members,
            listed_by: list.listed_by.dial,
            alarms_error,
            foreign_clusters: list.foreign,
        })
    }
}

/// The key of the health read (as `etcdctl endpoint health`); it need not exist.
const HEALTH_KEY: &str = "health";

/// What one member's own endpoint answered to the health probe.
#[derive(Debug)]
pub(crate) struct Probe {
    cluster_id: u64,
    status: MemberStatus,
    read: Read,
}

/// The linearizable read of a probe.
#[derive(Debug)]
enum Read {
    /// A learner: etcd would refuse it.
    NotAsked,
    Served,
    /// Why it was not served within the probe timeout.
    Failed(String),
}

impl Probe {
    pub(crate) fn status(&self) -> &MemberStatus {
        &self.status
    }

    /// Why the linearizable read was not served (`None`: served, or a
    /// learner, which is not asked).
    pub(crate) fn read_error(&self) -> Option<&str> {
        match &self.read {
            Read::Failed(why) => Some(why),
            Read::Served | Read::NotAsked => None,
        }
    }

    fn served_read(&self) -> bool {
        matches!(self.read, Read::Served)
    }

    /// Why the member is not healthy despite answering `Status` (errors it
    /// reports and alarms are judged by the quorum view).
    fn verdict(&self, learner: bool, leader: Option<u64>) -> Option<String> {
        match &self.read {
            Read::Failed(why) => Some(format!(
                "answers status but cannot serve a linearizable read, so it is not connected to a quorum: {why}"
            )),
            Read::Served => None,
            Read::NotAsked if learner => match (self.status.leader, leader) {
                (0, _) => Some("learner knows no leader".to_string()),
                (_, None) => {
                    Some("learner cannot be checked: no healthy voter names a leader".to_string())
                }
                (own, Some(leader)) if own != leader => Some(format!(
                    "learner follows {own:016x}, not the leader {leader:016x}"
                )),
                _ => None,
            },
            Read::NotAsked => Some("not probed".to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member list of `cluster` answered at `host` by member `lister`,
    /// listing `voters` and `learners` (by id).
    fn list(cluster: u64, host: &str, lister: u64, voters: &[u64], learners: &[u64]) -> MemberList {
        let member = |id: u64, learner: bool| ListedMember {
            id,
            name: format!("cp-{id}-0000000{id}"),
            peer_urls: vec![],
            client_urls: vec![format!("https://{host}.{id}:2379")],
            learner,
        };
        MemberList {
            cluster_id: cluster,
            lister_id: lister,
            members: voters
                .iter()
                .map(|&id| member(id, false))
                .chain(learners.iter().map(|&id| member(id, true)))
                .collect(),
            listed_by: EtcdEndpoint {
                dial: format!("https://{host}:2379"),
                server_name: host.to_string(),
            },
            foreign: vec![],
        }
    }

    fn known(cluster: u64, members: &[u64], removed: &[u64]) -> KnownCluster {
        KnownCluster {
            cluster_id: cluster,
            members: members.iter().copied().collect(),
            removed: removed.iter().copied().collect(),
        }
    }

    /// What `choose_cluster` should answer.
    #[derive(Debug, PartialEq)]
    enum Verdict {
        /// The answer listed by this host, with these foreign cluster ids.
        Chosen(&'static str, Vec<u64>),
        Split,
        KnownGone,
        PinnedGone,
    }
    use Verdict::*;

    /// The cluster id every case shares unless it says otherwise: k3s's
    /// first server bootstraps alone with etcd's default token, so a rogue
    /// made from it has the real cluster's id (docs/k3s.md T3).
    const C: u64 = 7;

    #[test]
    fn which_cluster_is_ours_table() {
        let pin = |ids: &[u64]| -> BTreeSet<u64> { ids.iter().copied().collect() };
        // (situation, pinned, known, answers in the order they came, verdict)
        type Case<'a> = (
            &'a str,
            Option<BTreeSet<u64>>,
            Option<KnownCluster>,
            Vec<MemberList>,
            Verdict,
        );
        let cases: Vec<Case> = vec![
            (
                "a fresh handle: the first server restarted alone (same cluster id, its old member id) loses to the real cluster",
                None,
                None,
                vec![
                    list(C, "rogue", 1, &[1], &[]),
                    list(C, "real", 2, &[2, 3, 4], &[]),
                ],
                Chosen("real", vec![C]),
            ),
            (
                "a fresh handle: a rogue with another cluster id loses to the real cluster too",
                None,
                None,
                vec![
                    list(9, "rogue", 1, &[1], &[]),
                    list(C, "real", 2, &[2, 3], &[]),
                ],
                Chosen("real", vec![9]),
            ),
            (
                "a fresh handle: one voter each, the same cluster id, no member in common: refused",
                None,
                None,
                vec![
                    list(C, "rogue", 1, &[1], &[]),
                    list(C, "real", 2, &[2], &[]),
                ],
                Split,
            ),
            (
                "a fresh handle: learners do not count towards which cluster is ours",
                None,
                None,
                vec![
                    list(C, "rogue", 1, &[1], &[5]),
                    list(C, "real", 2, &[2], &[]),
                ],
                Split,
            ),
            (
                "a fresh handle: two members of one cluster answering are one cluster, the first answer taken",
                None,
                None,
                vec![
                    list(C, "a", 1, &[1, 2, 3], &[]),
                    list(C, "b", 2, &[1, 2, 3], &[]),
                ],
                Chosen("a", vec![]),
            ),
            (
                "a fresh handle: a lagging member's list still naming a removed member is the same cluster",
                None,
                None,
                vec![
                    list(C, "a", 2, &[2, 3, 4], &[]),
                    list(C, "b", 3, &[1, 2, 3], &[]),
                ],
                Chosen("a", vec![]),
            ),
            (
                "proven: the steady state, the one answer is ours",
                None,
                Some(known(C, &[1, 2, 3], &[])),
                vec![list(C, "real", 1, &[1, 2, 3], &[])],
                Chosen("real", vec![]),
            ),
            (
                "proven: the rogue answering first as the member we removed is passed over",
                None,
                Some(known(C, &[1, 2, 3], &[1])),
                vec![
                    list(C, "rogue", 1, &[1], &[]),
                    list(C, "real", 2, &[2, 3, 4], &[4]),
                ],
                Chosen("real", vec![C]),
            ),
            (
                "proven: the rogue of a member removed elsewhere (k3s, another handle) lists a minority of the known members",
                None,
                Some(known(C, &[1, 2, 3], &[])),
                vec![
                    list(C, "rogue", 1, &[1], &[]),
                    list(C, "real", 2, &[2, 3], &[]),
                ],
                Chosen("real", vec![C]),
            ),
            (
                "proven: only the rogue answering is refused, never taken for the cluster",
                None,
                Some(known(C, &[1, 2, 3], &[])),
                vec![list(C, "rogue", 1, &[1], &[])],
                KnownGone,
            ),
            (
                "proven: a two-member cluster whose member was removed elsewhere, and its rogue: refused",
                None,
                Some(known(C, &[1, 2], &[])),
                vec![
                    list(C, "rogue", 1, &[1], &[]),
                    list(C, "real", 2, &[2], &[]),
                ],
                Split,
            ),
            (
                "proven: a scale-down from two to one by another handle, the removed member silent",
                None,
                Some(known(C, &[1, 2], &[])),
                vec![list(C, "real", 2, &[2], &[])],
                Chosen("real", vec![]),
            ),
            (
                "proven: the same two members, but we removed member 1: the real one",
                None,
                Some(known(C, &[1, 2], &[1])),
                vec![
                    list(C, "rogue", 1, &[1], &[]),
                    list(C, "real", 2, &[2], &[]),
                ],
                Chosen("real", vec![C]),
            ),
            (
                "proven: a larger cluster with another id is foreign, ours wins",
                None,
                Some(known(C, &[1], &[])),
                vec![
                    list(9, "other", 5, &[5, 6, 8], &[]),
                    list(C, "ours", 1, &[1], &[]),
                ],
                Chosen("ours", vec![9]),
            ),
            (
                "proven: a rollout in flight (a voter added, an old one removed by us, a learner joining) is still ours",
                None,
                Some(known(C, &[1, 2, 3, 4], &[1])),
                vec![list(C, "real", 2, &[2, 3, 4], &[5])],
                Chosen("real", vec![]),
            ),
            (
                "proven: k3s evicted a stalled learner and another handle removed a voter between two snapshots",
                None,
                Some(known(C, &[1, 2, 3], &[])),
                vec![list(C, "real", 1, &[1, 2], &[])],
                Chosen("real", vec![]),
            ),
            (
                "proven: a cluster reset leaves one known member alone: refused until pinned",
                None,
                Some(known(C, &[1, 2, 3], &[])),
                vec![list(C, "reset", 2, &[2], &[])],
                KnownGone,
            ),
            (
                "pinned: the reset member pinned is ours",
                Some(pin(&[2])),
                Some(known(C, &[1, 2, 3], &[])),
                vec![list(C, "reset", 2, &[2], &[])],
                Chosen("reset", vec![]),
            ),
            (
                "pinned: the pin picks the cluster a fresh handle would refuse",
                Some(pin(&[2])),
                None,
                vec![
                    list(C, "rogue", 1, &[1], &[]),
                    list(C, "real", 2, &[2], &[]),
                ],
                Chosen("real", vec![C]),
            ),
            (
                "pinned: members restored from a snapshot (a new cluster id) are ours once pinned",
                Some(pin(&[0x11, 0x12])),
                Some(known(C, &[1, 2, 3], &[])),
                vec![list(0x99, "restored", 0x11, &[0x11, 0x12, 0x13], &[])],
                Chosen("restored", vec![]),
            ),
            (
                "pinned: no answer lists a pinned member: refused, naming the pin",
                Some(pin(&[0x42])),
                None,
                vec![list(C, "real", 2, &[2, 3], &[])],
                PinnedGone,
            ),
            (
                "pinned: two clusters each listing one pinned member: refused",
                Some(pin(&[1, 2])),
                None,
                vec![
                    list(C, "rogue", 1, &[1], &[]),
                    list(C, "real", 2, &[2], &[]),
                ],
                Split,
            ),
        ];
        let mut failures = Vec::new();
        for (situation, pinned, known, answers, want) in cases {
            let identity = Identity {
                pinned: pinned.as_ref(),
                known: known.as_ref(),
            };
            let got = match choose_cluster(identity, answers) {
                Ok(list) => Chosen(
                    Box::leak(list.listed_by.server_name.clone().into_boxed_str()),
                    list.foreign.iter().map(|f| f.cluster_id).collect(),
                ),
                Err(EtcdError::SplitClusters { .. }) => Split,
                Err(EtcdError::KnownClusterGone { .. }) => KnownGone,
                Err(EtcdError::PinnedClusterGone { .. }) => PinnedGone,
                Err(other) => panic!("{situation}: {other}"),
            };
            if got != want {
                failures.push(format!("{situation}: got {got:?}, want {want:?}"));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn the_steady_state_asks_one_seed_and_a_rogue_first_makes_it_ask_the_next() {
        let steady = known(C, &[1, 2, 3], &[]);
        let identity = Identity {
            pinned: None,
            known: Some(&steady),
        };
        assert!(identity.settles(&list(C, "real", 1, &[1, 2, 3], &[])));
        assert!(identity.settles(&list(C, "real", 2, &[2, 3], &[])));
        assert!(!identity.settles(&list(C, "rogue", 1, &[1], &[])));
        let two = known(C, &[1, 2], &[]);
        let identity = Identity {
            pinned: None,
            known: Some(&two),
        };
        assert!(
            !identity.settles(&list(C, "half", 2, &[2], &[])),
            "half of two leaves room for a rival half: ask the others"
        );
        let fresh = Identity::default();
        assert!(!fresh.settles(&list(C, "real", 1, &[1, 2, 3], &[])));
    }

    #[test]
    fn refusals_name_the_clusters_member_ids_and_the_annotation_that_settles_it() {
        let err = choose_cluster(
            Identity::default(),
            vec![
                list(C, "rogue", 1, &[1], &[]),
                list(C, "real", 2, &[2], &[]),
            ],
        )
        .expect_err("a tie is refused");
        let text = err.to_string();
        for part in [
            "0000000000000007 with 1 voter(s), members 0000000000000001, answered by https://rogue:2379",
            "members 0000000000000002",
            "controlplane.cluster.x-k8s.io/etcd-cluster-members=",
        ] {
            assert!(text.contains(part), "{part:?} not in {text}");
        }
        let steady = known(C, &[1, 2, 3], &[]);
        let err = choose_cluster(
            Identity {
                pinned: None,
                known: Some(&steady),
            },
            vec![list(C, "rogue", 1, &[1], &[])],
        )
        .expect_err("refused");
        let text = err.to_string();
        assert!(
            text.contains("any of the members known of it (0000000000000001,0000000000000002,0000000000000003)")
                && text.contains("controlplane.cluster.x-k8s.io/etcd-cluster-members="),
            "{text}"
        );
    }

    #[test]
    fn pinned_members_parse_as_etcd_prints_them_and_bad_items_are_named() {
        assert_eq!(
            parse_pinned_members("8e9e05c52164694d, 0x91bc3c398fb3c146,a").unwrap(),
            [0x8e9e05c52164694d, 0x91bc3c398fb3c146, 0xa]
                .into_iter()
                .collect()
        );
        for (value, says) in [
            ("", "empty item"),
            ("8e9e05c52164694d,", "empty item"),
            (
                "cp-0-1a2b3c4d",
                "\"cp-0-1a2b3c4d\" is not an etcd member id",
            ),
            ("0", "is not a member id (0)"),
            ("1ffffffffffffffff", "up to 16 hex digits"),
        ] {
            let err = parse_pinned_members(value).expect_err(value);
            assert!(err.contains(says), "{value:?}: {err}");
        }
    }

    fn probe(leader: u64, read: Read) -> Probe {
        Probe {
            cluster_id: 7,
            status: MemberStatus {
                leader,
                raft_term: 3,
                raft_index: 10,
                raft_applied_index: 10,
                db_size: 0,
                db_size_in_use: 0,
                db_size_quota: 0,
                revision: 0,
                version: "3.4.23".into(),
                errors: vec![],
                is_learner: false,
            },
            read,
        }
    }

    #[test]
    fn a_voter_is_healthy_only_if_it_served_the_linearizable_read() {
        assert_eq!(probe(1, Read::Served).verdict(false, Some(1)), None);
        // Alive, believes in a leader, but cut off: not healthy.
        let why = probe(1, Read::Failed("range timed out after 2s".into()))
            .verdict(false, Some(1))
            .unwrap();
        assert!(
            why.starts_with("answers status but cannot serve a linearizable read")
                && why.ends_with("quorum: range timed out after 2s"),
            "{why}"
        );
        // Following another leader does not matter once the read was served.
        assert_eq!(probe(2, Read::Served).verdict(false, Some(1)), None);
    }

    #[test]
    fn a_learner_is_healthy_if_it_follows_the_voters_leader() {
        assert_eq!(probe(1, Read::NotAsked).verdict(true, Some(1)), None);
        assert_eq!(
            probe(0, Read::NotAsked).verdict(true, Some(1)).unwrap(),
            "learner knows no leader"
        );
        assert!(
            probe(2, Read::NotAsked)
                .verdict(true, Some(1))
                .unwrap()
                .contains("not the leader 0000000000000001")
        );
        assert!(probe(1, Read::NotAsked).verdict(true, None).is_some());
    }
}
