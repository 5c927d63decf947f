//! The API version of a kind referenced by group and kind only (a v1beta2
//! contract `infrastructureRef`): found through discovery (the kind's plural)
//! and its CRD's contract labels ([`crate::api::contract`]), as CAPI finds
//! it. Answers are kept for a while: a provider upgrade that moves the
//! contract version is seen within [`KEEP_FOR`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};

use crate::api::contract::version_for_contract;

/// How long an answer is reused.
pub const KEEP_FOR: Duration = Duration::from_secs(300);

/// Why the version could not be told; names the kind and what was missing.
#[derive(Debug, thiserror::Error)]
pub enum ContractVersionError {
    #[error(
        "{kind} in group {group:?}: the API server does not serve this kind (discovery): {reason}"
    )]
    NotServed {
        group: String,
        kind: String,
        reason: String,
    },
    #[error("{kind} in group {group:?}: reading CustomResourceDefinition {crd}: {source}")]
    Crd {
        group: String,
        kind: String,
        crd: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "{kind} in group {group:?}: CustomResourceDefinition {crd} lists no version under a cluster.x-k8s.io/v1beta2 or cluster.x-k8s.io/v1beta1 contract label"
    )]
    NoContractLabel {
        group: String,
        kind: String,
        crd: String,
    },
}

/// Looks versions up and remembers them.
pub struct ContractVersions {
    client: Client,
    known: Mutex<HashMap<(String, String), (String, Instant)>>,
}

impl ContractVersions {
    pub fn new(client: Client) -> Self {
        ContractVersions {
            client,
            known: Mutex::new(HashMap::new()),
        }
    }

    /// `<group>/<version>` of `kind` in `group`.
    pub async fn api_version(
        &self,
        group: &str,
        kind: &str,
    ) -> Result<String, ContractVersionError> {
        let key = (group.to_string(), kind.to_string());
        if let Some((version, at)) = self
            .known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            && at.elapsed() < KEEP_FOR
        {
            return Ok(version.clone());
        }
        let not_served = |reason: String| ContractVersionError::NotServed {
            group: group.into(),
            kind: kind.into(),
            reason,
        };
        let discovered = kube::discovery::group(&self.client, group)
            .await
            .map_err(|e| not_served(e.to_string()))?;
        let (resource, _) = discovered
            .recommended_kind(kind)
            .ok_or_else(|| not_served("no such kind in the group".into()))?;
        let crd = format!("{}.{group}", resource.plural);
        let metadata = Api::<CustomResourceDefinition>::all(self.client.clone())
            .get_metadata(&crd)
            .await
            .map_err(|source| ContractVersionError::Crd {
                group: group.into(),
                kind: kind.into(),
                crd: crd.clone(),
                source,
            })?;
        let labels: BTreeMap<String, String> = metadata.metadata.labels.unwrap_or_default();
        let version =
            version_for_contract(&labels).ok_or(ContractVersionError::NoContractLabel {
                group: group.into(),
                kind: kind.into(),
                crd,
            })?;
        let api_version = format!("{group}/{version}");
        self.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, (api_version.clone(), Instant::now()));
        Ok(api_version)
    }
}
