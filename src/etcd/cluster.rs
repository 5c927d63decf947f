//! A handle on one etcd cluster: seeds to start from, TLS, per-member clients,
//! and the membership snapshot.

use std::collections::BTreeMap;
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
    pub members: Vec<ListedMember>,
    pub listed_by: EtcdEndpoint,
    /// Other clusters that answered on the seeds while this one was chosen.
    pub foreign: Vec<ForeignCluster>,
}

impl MemberList {
    fn voters(&self) -> usize {
        self.members.iter().filter(|m| !m.learner).count()
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
}

/// Which of the clusters that answered on the seeds is ours. Pure.
///
/// A removed k3s server can come back as a cluster of its own on the same
/// address (the first server has no `server:` to rejoin: k3s T3), so the
/// first endpoint that answers is not trusted blindly:
/// - once a snapshot has proven a cluster id, only that cluster is ours; if
///   none of its endpoints answered, nothing is (refused, never guessed);
/// - before that, the cluster with the most voters is ours, and a tie is
///   refused.
pub(crate) fn choose_cluster(
    proven: Option<u64>,
    answers: Vec<MemberList>,
) -> Result<MemberList, EtcdError> {
    let mut clusters: Vec<MemberList> = Vec::new();
    for answer in answers {
        if !clusters.iter().any(|c| c.cluster_id == answer.cluster_id) {
            clusters.push(answer);
        }
    }
    let describe = |c: &MemberList| {
        format!(
            "{:016x} with {} voter(s), answered by {}",
            c.cluster_id,
            c.voters(),
            c.listed_by.dial
        )
    };
    let chosen = match proven {
        Some(id) => match clusters.iter().position(|c| c.cluster_id == id) {
            Some(index) => index,
            None => {
                return Err(EtcdError::KnownClusterGone {
                    known: id,
                    found: clusters.iter().map(describe).collect(),
                });
            }
        },
        None => {
            let most = clusters.iter().map(MemberList::voters).max().unwrap_or(0);
            let best: Vec<usize> = (0..clusters.len())
                .filter(|&i| clusters[i].voters() == most)
                .collect();
            match best.as_slice() {
                [one] => *one,
                [] => {
                    return Err(EtcdError::NoReceiver {
                        reason: "no endpoint answered the member list".into(),
                    });
                }
                _ => {
                    return Err(EtcdError::SplitClusters {
                        clusters: clusters.iter().map(describe).collect(),
                    });
                }
            }
        }
    };
    let mut list = clusters.remove(chosen);
    list.foreign
        .extend(clusters.iter().map(MemberList::as_foreign));
    Ok(list)
}

/// Connection to one etcd cluster over verified mutual TLS.
pub struct EtcdCluster {
    pub(crate) clients: MemberClients,
    /// Client URLs to start from: the given seeds, then members learnt since.
    seeds: Mutex<Vec<String>>,
    /// The cluster id a snapshot proved (its lister reached a quorum): from
    /// then on, an endpoint answering for another cluster is never listed from.
    proven_cluster_id: Mutex<Option<u64>>,
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
            proven_cluster_id: Mutex::new(None),
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

    /// `MemberList` from the first endpoint that answers for our cluster,
    /// skipping the client URLs in `avoid` (e.g. a member about to be
    /// removed). Which cluster is ours: [`choose_cluster`]. Once a cluster id
    /// is proven this costs nothing extra unless a seed answers for another
    /// cluster; before, the seeds the first answer does not list are asked
    /// too (none, on a steady cluster).
    pub(crate) async fn member_list(&self, avoid: &[String]) -> Result<MemberList, EtcdError> {
        let proven = *self
            .proven_cluster_id
            .lock()
            .unwrap_or_else(|p| p.into_inner());
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
                Ok(list) if proven.is_none_or(|id| id == list.cluster_id) => {
                    if proven.is_none() {
                        let unlisted: Vec<&String> =
                            seeds.iter().filter(|s| !list.covers(s)).collect();
                        answers.push(list);
                        answers.extend(self.other_answers(&unlisted).await);
                    } else {
                        answers.push(list);
                    }
                    break;
                }
                Ok(foreign) => answers.push(foreign),
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
        let list = choose_cluster(proven, answers)?;
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

    /// Remember `cluster_id` as ours: a snapshot proved it reaches a quorum.
    fn prove_cluster(&self, cluster_id: u64) {
        *self
            .proven_cluster_id
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(cluster_id);
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
            self.prove_cluster(list.cluster_id);
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

    /// A member list of `cluster` answered at `host`, with `voters` voters
    /// named `<host>-<n>` and one learner if `learner`.
    fn answer(cluster: u64, host: &str, voters: usize, learner: bool) -> MemberList {
        let member = |n: usize, learner: bool| ListedMember {
            id: cluster * 100 + n as u64,
            name: format!("{host}-{n}"),
            peer_urls: vec![],
            client_urls: vec![format!("https://{host}.{n}:2379")],
            learner,
        };
        let mut members: Vec<ListedMember> = (0..voters).map(|n| member(n, false)).collect();
        if learner {
            members.push(member(voters, true));
        }
        MemberList {
            cluster_id: cluster,
            members,
            listed_by: EtcdEndpoint {
                dial: format!("https://{host}:2379"),
                server_name: host.to_string(),
            },
            foreign: vec![],
        }
    }

    #[test]
    fn a_first_server_restarted_as_its_own_cluster_loses_to_the_real_one() {
        // The rogue answered first (its Node sorts first); the real cluster
        // came from a seed the rogue does not list.
        let chosen = choose_cluster(
            None,
            vec![answer(9, "rogue", 1, false), answer(7, "real", 2, false)],
        )
        .expect("the real cluster is chosen");
        assert_eq!(chosen.cluster_id, 7);
        assert_eq!(chosen.foreign.len(), 1);
        assert_eq!(chosen.foreign[0].cluster_id, 9);
        assert_eq!(chosen.foreign[0].members, vec!["rogue-0".to_string()]);
    }

    #[test]
    fn learners_do_not_count_towards_which_cluster_is_ours() {
        let result = choose_cluster(
            None,
            vec![answer(9, "rogue", 1, true), answer(7, "real", 1, false)],
        );
        assert!(
            matches!(result, Err(EtcdError::SplitClusters { ref clusters }) if clusters.len() == 2),
            "{result:?}"
        );
    }

    #[test]
    fn two_clusters_with_as_many_voters_are_refused_not_guessed() {
        let result = choose_cluster(
            None,
            vec![answer(9, "a", 2, false), answer(7, "b", 2, false)],
        );
        let err = result.expect_err("a tie is refused");
        let text = err.to_string();
        assert!(
            text.contains("0000000000000009") && text.contains("0000000000000007"),
            "{text}"
        );
    }

    #[test]
    fn a_proven_cluster_wins_even_against_a_larger_foreign_one() {
        let chosen = choose_cluster(
            Some(7),
            vec![answer(9, "other", 3, false), answer(7, "ours", 1, false)],
        )
        .expect("ours");
        assert_eq!(chosen.cluster_id, 7);
        assert_eq!(chosen.foreign[0].cluster_id, 9);
    }

    #[test]
    fn only_foreign_clusters_answering_is_refused_once_ours_is_proven() {
        let result = choose_cluster(Some(7), vec![answer(9, "rogue", 1, false)]);
        assert!(
            matches!(result, Err(EtcdError::KnownClusterGone { known: 7, ref found }) if found.len() == 1),
            "{result:?}"
        );
    }

    #[test]
    fn one_cluster_answering_is_ours_with_nothing_foreign() {
        let chosen = choose_cluster(
            None,
            vec![answer(7, "a", 3, false), answer(7, "b", 3, false)],
        )
        .expect("one cluster");
        assert_eq!(chosen.cluster_id, 7);
        assert!(chosen.foreign.is_empty());
        assert_eq!(chosen.listed_by.dial, "https://a:2379");
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
