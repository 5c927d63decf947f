//! What the Machine that restores a snapshot runs: the cluster's own
//! KThreesConfig spec with k3s's cluster-reset restore added, as k3s and the
//! bootstrap provider take it (docs/k3s.md SR1 to SR10). Pure.
//!
//! - `preK3sCommands` first turns the join configuration the bootstrap
//!   provider renders for an initialized cluster into a first server's
//!   (`server:` becomes `cluster-init: true`, SR9): k3s refuses a reset with
//!   a server URL (SR2), and the install script's start must be a new first
//!   server.
//! - `postK3sCommands` then stop k3s, run the reset from S3 with the keys
//!   sourced from a file (`set -a` exports them, SR7), and start k3s again
//!   only if the reset succeeded (`&&`: cloud-init's script has no `set -e`,
//!   SR10); the spec's own post commands follow, on the restored server.
//! - `files` add the keys file, its content from a Secret the controller
//!   derives from `spec.etcdBackup.target.s3.credentialsSecret`, and the
//!   endpoint's CA from `endpointCASecret` when one is set.

use crate::api::bootstrap::{File, FileSource, KThreesConfigSpec, SecretFileSource};
use crate::api::etcd_backup::{ACCESS_KEY_ID_KEY, SECRET_ACCESS_KEY_KEY, SecretKey};

use super::target::S3Config;

/// The file the restore command sources for the S3 keys.
pub const S3_ENV_PATH: &str = "/etc/rancher/k3s/restore-s3.env";
/// Where the endpoint's CA goes (`--etcd-s3-endpoint-ca`).
pub const S3_CA_PATH: &str = "/etc/rancher/k3s/restore-s3-ca.crt";
/// The key of the derived Secret that holds the keys file.
pub const S3_ENV_SECRET_KEY: &str = "s3.env";
/// Turns a join configuration into a first server's (SR9).
pub const SERVER_TO_CLUSTER_INIT: &str =
    "sed -i 's/^server:.*/cluster-init: true/' /etc/rancher/k3s/config.yaml";

/// The derived Secret with the keys file, per cluster.
pub fn s3_env_secret_name(cluster: &str) -> String {
    format!("{cluster}-etcd-restore-s3")
}

/// `value` as one shell word: as it is when it holds nothing the shell
/// reads, else single-quoted.
pub fn shell_word(value: &str) -> String {
    let plain = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@%+,".contains(&b));
    if plain {
        value.to_string()
    } else {
        format!("'{}'", value.replace('\'', r"'\''"))
    }
}

/// The keys file: the variables k3s reads its S3 keys from (SR7).
pub fn s3_env_file(s3: &S3Config) -> String {
    format!(
        "{ACCESS_KEY_ID_KEY}={}\n{SECRET_ACCESS_KEY_KEY}={}\n",
        shell_word(&s3.access_key_id),
        shell_word(&s3.secret_access_key)
    )
}

/// The endpoint as k3s's `--etcd-s3-endpoint` takes it: `host[:port]`.
fn k3s_endpoint(endpoint: &str) -> &str {
    endpoint
        .strip_prefix("https://")
        .or_else(|| endpoint.strip_prefix("http://"))
        .unwrap_or(endpoint)
        .trim_end_matches('/')
}

/// The reset run: `k3s server --cluster-reset` restoring `snapshot` from
/// `s3` (`folder` as the controller stores it, so k3s's object key
/// `path.Join(folder, name)` is the stored one), then the normal start.
pub fn restore_command(snapshot: &str, s3: &S3Config) -> String {
    let mut flags = vec![
        "--cluster-reset".to_string(),
        format!("--cluster-reset-restore-path={}", shell_word(snapshot)),
        "--etcd-s3".to_string(),
        format!(
            "--etcd-s3-endpoint={}",
            shell_word(k3s_endpoint(&s3.endpoint))
        ),
        format!("--etcd-s3-bucket={}", shell_word(&s3.bucket)),
    ];
    if !s3.folder.is_empty() {
        flags.push(format!("--etcd-s3-folder={}", shell_word(&s3.folder)));
    }
    if !s3.region.is_empty() {
        flags.push(format!("--etcd-s3-region={}", shell_word(&s3.region)));
    }
    if s3.insecure {
        flags.push("--etcd-s3-insecure".to_string());
    }
    if s3.endpoint_ca_pem.is_some() {
        flags.push(format!("--etcd-s3-endpoint-ca={S3_CA_PATH}"));
    }
    format!(
        "set -a; . {S3_ENV_PATH}; set +a; k3s server {} && systemctl start k3s",
        flags.join(" ")
    )
}

/// The restore Machine's KThreesConfig spec: `base` (the control plane's
/// `kthreesConfigSpec`) with the restore added. `env_secret`: the derived
/// Secret with [`S3_ENV_SECRET_KEY`]; `endpoint_ca`: the spec's
/// `endpointCASecret`, when set.
pub fn restore_config(
    base: &KThreesConfigSpec,
    snapshot: &str,
    s3: &S3Config,
    env_secret: &str,
    endpoint_ca: Option<&SecretKey>,
) -> KThreesConfigSpec {
    let mut spec = base.clone();
    spec.pre_k3s_commands
        .insert(0, SERVER_TO_CLUSTER_INIT.to_string());
    let mut post = vec![
        "systemctl stop k3s".to_string(),
        restore_command(snapshot, s3),
    ];
    post.append(&mut spec.post_k3s_commands);
    spec.post_k3s_commands = post;
    let from_secret = |path: &str, name: &str, key: &str| File {
        path: path.to_string(),
        permissions: "0600".to_string(),
        content_from: Some(FileSource {
            secret: SecretFileSource {
                name: name.to_string(),
                key: key.to_string(),
            },
        }),
        ..File::default()
    };
    spec.files
        .push(from_secret(S3_ENV_PATH, env_secret, S3_ENV_SECRET_KEY));
    if let Some(ca) = endpoint_ca {
        spec.files.push(from_secret(S3_CA_PATH, &ca.name, &ca.key));
    }
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3() -> S3Config {
        S3Config {
            endpoint: "minio.example:9000".into(),
            bucket: "backups".into(),
            folder: "prod/ns/c1".into(),
            region: String::new(),
            insecure: false,
            skip_tls_verify: false,
            endpoint_ca_pem: None,
            access_key_id: "AKID".into(),
            secret_access_key: "s3cr3t/with'quote".into(),
            session_token: None,
        }
    }

    #[test]
    fn shell_words_are_quoted_only_when_the_shell_would_read_them() {
        for (value, word) in [
            (
                "capi-before-removal-cp-0-1733500000",
                "capi-before-removal-cp-0-1733500000",
            ),
            ("prod/etcd", "prod/etcd"),
            ("10.0.0.5:9000", "10.0.0.5:9000"),
            ("a b", "'a b'"),
            ("$(reboot)", "'$(reboot)'"),
            ("it's", r"'it'\''s'"),
            ("", "''"),
        ] {
            assert_eq!(shell_word(value), word, "{value}");
        }
    }

    #[test]
    fn the_restore_command_names_every_setting_k3s_needs() {
        let cases = [
            (
                "plain_tls_endpoint",
                s3(),
                "set -a; . /etc/rancher/k3s/restore-s3.env; set +a; k3s server --cluster-reset --cluster-reset-restore-path=snap-cp-0-1 --etcd-s3 --etcd-s3-endpoint=minio.example:9000 --etcd-s3-bucket=backups --etcd-s3-folder=prod/ns/c1 && systemctl start k3s",
            ),
            (
                "http_url_region_ca_and_no_folder",
                S3Config {
                    endpoint: "http://127.0.0.1:9000/".into(),
                    folder: String::new(),
                    region: "eu-west-1".into(),
                    insecure: true,
                    endpoint_ca_pem: Some("PEM".into()),
                    ..s3()
                },
                "set -a; . /etc/rancher/k3s/restore-s3.env; set +a; k3s server --cluster-reset --cluster-reset-restore-path=snap-cp-0-1 --etcd-s3 --etcd-s3-endpoint=127.0.0.1:9000 --etcd-s3-bucket=backups --etcd-s3-region=eu-west-1 --etcd-s3-insecure --etcd-s3-endpoint-ca=/etc/rancher/k3s/restore-s3-ca.crt && systemctl start k3s",
            ),
        ];
        for (name, s3, command) in cases {
            assert_eq!(restore_command("snap-cp-0-1", &s3), command, "{name}");
        }
    }

    #[test]
    fn the_keys_file_is_sourced_safely() {
        assert_eq!(
            s3_env_file(&s3()),
            "AWS_ACCESS_KEY_ID=AKID\nAWS_SECRET_ACCESS_KEY='s3cr3t/with'\\''quote'\n"
        );
    }

    #[test]
    fn the_restore_goes_first_and_the_spec_follows() {
        let base = KThreesConfigSpec {
            pre_k3s_commands: vec!["echo pre".into()],
            post_k3s_commands: vec!["echo post".into()],
            files: vec![File {
                path: "/etc/x".into(),
                content: "x".into(),
                ..File::default()
            }],
            ..KThreesConfigSpec::default()
        };
        let ca = SecretKey {
            name: "minio-ca".into(),
            key: "ca.crt".into(),
        };
        let spec = restore_config(&base, "snap-cp-0-1", &s3(), "c1-etcd-restore-s3", Some(&ca));
        assert_eq!(spec.pre_k3s_commands, [SERVER_TO_CLUSTER_INIT, "echo pre"]);
        assert_eq!(spec.post_k3s_commands[0], "systemctl stop k3s");
        assert!(spec.post_k3s_commands[1].contains("--cluster-reset-restore-path=snap-cp-0-1"));
        assert_eq!(spec.post_k3s_commands[2], "echo post");
        let files: Vec<(&str, Option<(&str, &str)>)> = spec
            .files
            .iter()
            .map(|f| {
                (
                    f.path.as_str(),
                    f.content_from
                        .as_ref()
                        .map(|c| (c.secret.name.as_str(), c.secret.key.as_str())),
                )
            })
            .collect();
        assert_eq!(
            files,
            [
                ("/etc/x", None),
                (S3_ENV_PATH, Some(("c1-etcd-restore-s3", S3_ENV_SECRET_KEY))),
                (S3_CA_PATH, Some(("minio-ca", "ca.crt"))),
            ]
        );
        assert!(spec.files[1..].iter().all(|f| f.permissions == "0600"));
    }
}
