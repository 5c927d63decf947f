//! Reading whether one key exists, on one member: how the restore rule tells
//! a member holding a snapshot's data from a fresh server's
//! (`decision::etcd_restore`).

use etcd_client::GetOptions;

use crate::etcd::cluster::EtcdCluster;
use crate::etcd::error::EtcdError;
use crate::etcd::ops::listed;
use crate::etcd::snapshot::MembershipSnapshot;

impl EtcdCluster {
    /// Whether `key` exists, read (count only, linearizable) from a healthy
    /// voter of `snap`.
    pub async fn key_exists(
        &self,
        snap: &MembershipSnapshot,
        key: &str,
    ) -> Result<bool, EtcdError> {
        let voter = snap
            .members
            .iter()
            .find(|m| !m.learner && m.is_healthy() && !m.client_urls.is_empty())
            .ok_or_else(|| EtcdError::NoReceiver {
                reason: format!("no healthy voter to read {key} from"),
            })?;
        let endpoint = self.member_endpoint(&listed(voter))?;
        let key = key.to_string();
        let response = self
            .clients
            .call(&endpoint, "key read", self.timeouts().call, |mut c| {
                let key = key.clone();
                async move { c.get(key, Some(GetOptions::new().with_count_only())).await }
            })
            .await?;
        Ok(response.count() > 0)
    }
}
