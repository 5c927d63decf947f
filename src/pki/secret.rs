//! The Secret objects: type `cluster.x-k8s.io/secret`, label
//! `cluster.x-k8s.io/cluster-name: <cluster>`, one owner reference (the
//! KThreesControlPlane, as controller). Names of the etcd CA and kubeconfig
//! Secrets are in `workload::secrets`.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::{CertKeyPem, PkiError};
use crate::api::names::{
    CLIENT_CA_SECRET_SUFFIX, CLUSTER_NAME_LABEL, CLUSTER_SECRET_TYPE, KUBECONFIG_SECRET_KEY,
    SERVER_CA_SECRET_SUFFIX, TLS_CERT_KEY, TLS_KEY_KEY, TOKEN_SECRET_KEY, TOKEN_SECRET_SUFFIX,
};

/// `<cluster>-ca`: the server CA.
pub fn server_ca_secret_name(cluster: &str) -> String {
    format!("{cluster}{SERVER_CA_SECRET_SUFFIX}")
}

/// `<cluster>-cca`: the client CA.
pub fn client_ca_secret_name(cluster: &str) -> String {
    format!("{cluster}{CLIENT_CA_SECRET_SUFFIX}")
}

/// `<cluster>-token`: the join token.
pub fn token_secret_name(cluster: &str) -> String {
    format!("{cluster}{TOKEN_SECRET_SUFFIX}")
}

/// A CAPI cluster Secret: `name` in `namespace`, type `cluster.x-k8s.io/secret`,
/// label `cluster.x-k8s.io/cluster-name=<cluster>`, `owner` as the single owner
/// reference (the caller sets controller and blockOwnerDeletion), `data` as given.
pub fn cluster_secret(
    namespace: &str,
    cluster: &str,
    name: &str,
    data: BTreeMap<String, Vec<u8>>,
    owner: OwnerReference,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                CLUSTER_NAME_LABEL.to_string(),
                cluster.to_string(),
            )])),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        type_: Some(CLUSTER_SECRET_TYPE.to_string()),
        data: Some(
            data.into_iter()
                .map(|(key, value)| (key, ByteString(value)))
                .collect(),
        ),
        ..Secret::default()
    }
}

/// A CA Secret (`<cluster>-ca`, `-cca` or `-etcd`): keys `tls.crt` and `tls.key`.
pub fn ca_secret(
    namespace: &str,
    cluster: &str,
    name: &str,
    ca: &CertKeyPem,
    owner: OwnerReference,
) -> Secret {
    let data = BTreeMap::from([
        (TLS_CERT_KEY.to_string(), ca.cert_pem.clone().into_bytes()),
        (TLS_KEY_KEY.to_string(), ca.key_pem.clone().into_bytes()),
    ]);
    cluster_secret(namespace, cluster, name, data, owner)
}

/// `<cluster>-token` with the token under key `value`.
pub fn token_secret(namespace: &str, cluster: &str, token: &str, owner: OwnerReference) -> Secret {
    let data = BTreeMap::from([(TOKEN_SECRET_KEY.to_string(), token.as_bytes().to_vec())]);
    cluster_secret(namespace, cluster, &token_secret_name(cluster), data, owner)
}

/// `<cluster>-kubeconfig` with the kubeconfig under key `value`.
pub fn kubeconfig_secret(
    namespace: &str,
    cluster: &str,
    kubeconfig_yaml: &str,
    owner: OwnerReference,
) -> Secret {
    let data = BTreeMap::from([(
        KUBECONFIG_SECRET_KEY.to_string(),
        kubeconfig_yaml.as_bytes().to_vec(),
    )]);
    let name = crate::api::names::kubeconfig_secret_name(cluster);
    cluster_secret(namespace, cluster, &name, data, owner)
}

/// Read a CA pair from a Secret (keys `tls.crt` / `tls.key`); errors name the
/// Secret and key (`default/demo-ca[tls.key]`). Only presence and UTF-8 are
/// checked: follow with [`super::validate_ca`].
pub fn ca_from_secret(secret: &Secret) -> Result<CertKeyPem, PkiError> {
    let secret_ref = format!(
        "{}/{}",
        secret.metadata.namespace.as_deref().unwrap_or_default(),
        secret.metadata.name.as_deref().unwrap_or_default()
    );
    let text = |key: &str| -> Result<String, PkiError> {
        let field = format!("{secret_ref}[{key}]");
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| PkiError::Missing {
                field: field.clone(),
            })?;
        String::from_utf8(bytes.0.clone()).map_err(|_| PkiError::NotText { field })
    };
    Ok(CertKeyPem {
        cert_pem: text(TLS_CERT_KEY)?,
        key_pem: text(TLS_KEY_KEY)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{CA_LIFETIME, generate_ca, validate_ca};

    fn owner() -> OwnerReference {
        OwnerReference {
            api_version: "controlplane.cluster.x-k8s.io/v1beta2".into(),
            kind: "KThreesControlPlane".into(),
            name: "demo-control-plane".into(),
            uid: "0f8e6c1a-0000-4000-8000-000000000001".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    fn data(secret: &Secret, key: &str) -> Vec<u8> {
        secret.data.as_ref().unwrap()[key].0.clone()
    }

    #[test]
    fn cluster_secret_has_type_label_owner_and_data() {
        let data_in = BTreeMap::from([("a".to_string(), vec![0u8, 255])]);
        let secret = cluster_secret("default", "demo", "demo-x", data_in, owner());
        assert_eq!(secret.metadata.name.as_deref(), Some("demo-x"));
        assert_eq!(secret.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(secret.type_.as_deref(), Some("cluster.x-k8s.io/secret"));
        assert_eq!(
            secret.metadata.labels,
            Some(BTreeMap::from([(
                "cluster.x-k8s.io/cluster-name".to_string(),
                "demo".to_string()
            )]))
        );
        assert_eq!(secret.metadata.owner_references, Some(vec![owner()]));
        assert_eq!(data(&secret, "a"), vec![0u8, 255]);
        assert_eq!(secret.data.as_ref().unwrap().len(), 1);
        assert!(secret.string_data.is_none());
    }

    #[test]
    fn ca_secret_round_trips_through_ca_from_secret() {
        let ca = generate_ca("k3s-server-ca@1", CA_LIFETIME).unwrap();
        let name = server_ca_secret_name("demo");
        assert_eq!(name, "demo-ca");
        let secret = ca_secret("default", "demo", &name, &ca, owner());
        assert_eq!(data(&secret, "tls.crt"), ca.cert_pem.as_bytes());
        assert_eq!(data(&secret, "tls.key"), ca.key_pem.as_bytes());
        assert_eq!(secret.type_.as_deref(), Some("cluster.x-k8s.io/secret"));
        let read = ca_from_secret(&secret).unwrap();
        assert_eq!(read, ca);
        validate_ca(&read, "default/demo-ca").unwrap();
    }

    #[test]
    fn ca_from_secret_names_the_secret_and_key() {
        let ca = generate_ca("k3s-client-ca@1", CA_LIFETIME).unwrap();
        let mut secret = ca_secret("default", "demo", "demo-cca", &ca, owner());
        secret.data.as_mut().unwrap().remove("tls.key");
        assert_eq!(
            ca_from_secret(&secret).unwrap_err().to_string(),
            "default/demo-cca[tls.key]: missing"
        );
        secret
            .data
            .as_mut()
            .unwrap()
            .insert("tls.crt".into(), ByteString(vec![0xff, 0xfe]));
        assert_eq!(
            ca_from_secret(&secret).unwrap_err().to_string(),
            "default/demo-cca[tls.crt]: not UTF-8 text"
        );
        secret.data = None;
        assert_eq!(
            ca_from_secret(&secret).unwrap_err().to_string(),
            "default/demo-cca[tls.crt]: missing"
        );
    }

    #[test]
    fn token_and_kubeconfig_secrets_use_the_upstream_names_and_key() {
        let token = token_secret(
            "default",
            "demo",
            "0123456789abcdef0123456789abcdef",
            owner(),
        );
        assert_eq!(token.metadata.name.as_deref(), Some("demo-token"));
        assert_eq!(data(&token, "value"), b"0123456789abcdef0123456789abcdef");
        assert_eq!(token.type_.as_deref(), Some("cluster.x-k8s.io/secret"));
        let kubeconfig = kubeconfig_secret("default", "demo", "apiVersion: v1\n", owner());
        assert_eq!(kubeconfig.metadata.name.as_deref(), Some("demo-kubeconfig"));
        assert_eq!(data(&kubeconfig, "value"), b"apiVersion: v1\n");
        assert_eq!(kubeconfig.metadata.owner_references, Some(vec![owner()]));
        assert_eq!(client_ca_secret_name("demo"), "demo-cca");
        assert_eq!(token_secret_name("demo"), "demo-token");
    }
}
