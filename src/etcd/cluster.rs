//! A handle on one etcd cluster: seeds to start from, TLS, per-member clients,
//! and the membership snapshot.

use std::collections::BTreeMap;
use std::sync::Mutex;

use etcd_client::{AlarmAction, AlarmType};
use futures::future::join_all;
use tracing::instrument;

use crate::etcd::client::{MemberClients, Timeouts};
use crate::etcd::error::EtcdError;
use crate::etcd::snapshot::{MemberSnapshot, MemberStatus, MembershipSnapshot};
use crate::etcd::tls::ClientTls;
use crate::etcd::transport::{EtcdEndpoint, Transport};

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
}

/// Connection to one etcd cluster over verified mutual TLS.
pub struct EtcdCluster {
    pub(crate) clients: MemberClients,
    /// Client URLs to start from: the given seeds, then members learnt since.
    seeds: Mutex<Vec<String>>,
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
        })
    }

    pub fn timeouts(&self) -> Timeouts {
        self.clients.timeouts()
    }

    /// How many member connections this handle has opened so far; a steady
    /// cluster reuses them, so this stays put across snapshots.
    pub fn connections_opened(&self) -> u64 {
        self.clients.connections_opened()
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

    /// `MemberList` from the first endpoint that answers, skipping the client
    /// URLs in `avoid` (e.g. a member about to be removed).
    pub(crate) async fn member_list(&self, avoid: &[String]) -> Result<MemberList, EtcdError> {
        let mut errors = Vec::new();
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
                Ok(list) => {
                    self.learn_seeds(&list.members);
                    return Ok(list);
                }
                Err(err) => errors.push(err),
            }
        }
        Err(match errors.len() {
            0 => EtcdError::NoReceiver {
                reason: "every known endpoint belongs to the member being removed".into(),
            },
            1 => errors.remove(0),
            _ => EtcdError::AllEndpointsFailed(errors),
        })
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
                version: response.version().to_string(),
                errors: response.errors().to_vec(),
                is_learner: response.is_learner(),
            },
        ))
    }

    async fn alarms(
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

    /// Observe the membership: list members, probe each on its own endpoint
    /// (in parallel, each bounded by the probe timeout), read alarms, find the
    /// leader, and check every member belongs to the same cluster.
    #[instrument(skip(self), level = "debug")]
    pub async fn snapshot(&self) -> Result<MembershipSnapshot, EtcdError> {
        let list = self.member_list(&[]).await?;
        let probe_limit = self.timeouts().probe;
        let probes = join_all(list.members.iter().map(|m| self.probe(m, probe_limit))).await;
        // Alarms go through raft: ask members that just answered their probe
        // (the one that listed first, then the others), each within the probe
        // timeout, so a member being removed cannot hold the snapshot. Without
        // quorum they cannot be read, and the snapshot still shows what it can.
        let mut askers: Vec<EtcdEndpoint> = vec![list.listed_by.clone()];
        for (listed, probe) in list.members.iter().zip(&probes) {
            if probe.is_ok()
                && let Ok(endpoint) = self.member_endpoint(listed)
                && !askers.contains(&endpoint)
            {
                askers.push(endpoint);
            }
        }
        let mut alarms = BTreeMap::new();
        let mut alarms_error = None;
        for endpoint in &askers {
            match self.alarms(endpoint, probe_limit).await {
                Ok(found) => {
                    alarms = found;
                    alarms_error = None;
                    break;
                }
                Err(err) => alarms_error = Some(err.to_string()),
            }
        }

        let mut members = Vec::with_capacity(list.members.len());
        let mut leader: Option<(u64, u64)> = None; // (term, id)
        for (listed, probe) in list.members.iter().zip(probes) {
            let (status, probe_error) = match probe {
                Ok((cluster_id, status)) => {
                    if cluster_id != list.cluster_id {
                        return Err(EtcdError::ClusterIdMismatch {
                            first_endpoint: list.listed_by.dial.clone(),
                            first: list.cluster_id,
                            member: listed.name.clone(),
                            endpoint: listed.client_urls.first().cloned().unwrap_or_default(),
                            other: cluster_id,
                        });
                    }
                    if status.leader != 0 && leader.is_none_or(|(term, _)| status.raft_term > term)
                    {
                        leader = Some((status.raft_term, status.leader));
                    }
                    (Some(status), None)
                }
                Err(err) => (None, Some(err.to_string())),
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
        let leader = leader
            .map(|(_, id)| id)
            .filter(|id| members.iter().any(|m| m.id == *id));
        Ok(MembershipSnapshot {
            cluster_id: list.cluster_id,
            leader,
            members,
            listed_by: list.listed_by.dial,
            alarms_error,
        })
    }
}
