//! A k3s server restoring an etcd snapshot, as k3s does it (docs/k3s.md
//! "Snapshot restore", rows SR1 to SR10), for the sandbox: a control-plane
//! Machine whose KThreesConfig carries the restore commands boots, runs them
//! the way cloud-init and k3s would, and becomes the first server of a
//! cluster rebuilt from the snapshot, which later Machines join.
//!
//! Two halves:
//! - [`parse_restore`] reads a KThreesConfig's `preK3sCommands`,
//!   `postK3sCommands` and `files` as the node's shell and k3s's CLI
//!   (urfave/cli over Go's `flag`) read them, into a [`RestorePlan`] whose
//!   [`RestoreRequest`] says what is restored from where;
//! - [`provision_restore`] carries the plan out on real etcd: the install
//!   script's first start (a new one-member cluster on the node's address),
//!   `systemctl stop k3s`, the reset run (snapshot fetched from a file or
//!   from S3, the data dir moved aside as `etcd-old-<unix time>`, etcd's own
//!   restore tool, `--force-new-cluster` under a new member name, the
//!   `reset-flag` written), `systemctl start k3s`, then the Node registered
//!   with k3s's etcd annotations and the Machine's nodeRef. Every step goes
//!   into a [`RestoreRecord`] on the sandbox, failed restores included.
//!
//! Node files: the paths a KThreesConfig's `files` name are the node's own
//! (kept in memory, with their content resolved as the bootstrap provider
//! resolves it); any other absolute path (a snapshot file) is read from the
//! host, as if the sandbox's nodes shared a volume with it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};

use crate::api::bootstrap::KThreesConfigSpec;
use crate::api::{Cluster, KThreesConfig, Machine};

pub use super::restore_record::{
    RestoreAction, RestoreRecord, RestoreRequest, S3Settings, object_key,
};
use super::sandbox::{NAMESPACE, Sandbox, SandboxError};

/// The contract the controller writes and the simulation reads: the keys
/// file, the endpoint's CA, and the one shell edit of the k3s configuration
/// the simulation knows ([`SERVER_TO_CLUSTER_INIT`]: `server:` becomes
/// `cluster-init: true`, docs/k3s.md SR9).
pub use crate::backup::restore_boot::{
    S3_CA_PATH as RESTORE_S3_CA_PATH, S3_ENV_PATH as RESTORE_S3_ENV_PATH, SERVER_TO_CLUSTER_INIT,
};
/// Where the bootstrap provider writes the k3s configuration.
pub const K3S_CONFIG_PATH: &str = "/etc/rancher/k3s/config.yaml";

/// Why a KThreesConfig's restore commands cannot be carried out; each
/// names the field and, where k3s or the shell would refuse, says it as
/// they do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    /// k3s's CLI refuses the command line (its own message).
    #[error("KThreesConfig {config} {field}: k3s refuses `{command}`: {message}")]
    K3sRefuses {
        config: String,
        field: String,
        command: String,
        message: String,
    },
    /// The shell could not read the command.
    #[error("KThreesConfig {config} {field}: {message}")]
    Shell {
        config: String,
        field: String,
        message: String,
    },
    /// The commands reset but restore nothing, or restore twice differently.
    #[error("KThreesConfig {config} {field}: {message}")]
    Plan {
        config: String,
        field: String,
        message: String,
    },
}

/// One `k3s server` run a command line makes, with the flags k3s reads
/// (from the command line, then from the environment variables that back
/// them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerRun {
    /// Where it was written (`spec.postK3sCommands[i]`).
    pub field: String,
    pub command: String,
    pub cluster_reset: bool,
    pub restore: Option<RestoreRequest>,
}

/// One thing the node's cloud-init runs, as the simulation understands it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlannedStep {
    /// [`SERVER_TO_CLUSTER_INIT`], before the install script.
    ServerToClusterInit,
    /// The install script: k3s installed and started (`k3s server` with
    /// the rendered configuration), then the bootstrap sentinel written.
    Install,
    StopK3s,
    StartK3s,
    K3sServer(Box<ServerRun>),
    /// A shell builtin or command with no effect the simulation models.
    Other(String),
}

/// A step, and whether it runs only if the one before it succeeded (`&&`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub step: PlannedStep,
    pub after_success_of_previous: bool,
}

/// What a restore Machine's cloud-init will run, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestorePlan {
    pub config: String,
    pub steps: Vec<Planned>,
    /// What the (first) restoring `k3s server` run restores.
    pub request: RestoreRequest,
}

/// A file the bootstrap provider writes, with its content resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFile {
    pub path: String,
    pub permissions: String,
    pub content: String,
}

/// Read a KThreesConfig's commands (`files`: its files with their content
/// resolved, [`resolve_files`]). `Ok(None)`: no `postK3sCommands` entry runs
/// `k3s server --cluster-reset`, the Machine joins as any other.
pub fn parse_restore(
    config: &str,
    spec: &KThreesConfigSpec,
    files: &[NodeFile],
) -> Result<Option<RestorePlan>, RestoreError> {
    let mut shell = ShellState::default();
    let mut steps = Vec::new();
    let mut any_reset = false;
    let sections = [
        ("spec.preK3sCommands", &spec.pre_k3s_commands),
        ("spec.postK3sCommands", &spec.post_k3s_commands),
    ];
    for (section, commands) in sections {
        if section == "spec.postK3sCommands" {
            steps.push(Planned {
                step: PlannedStep::Install,
                after_success_of_previous: false,
            });
        }
        for (i, line) in commands.iter().enumerate() {
            let field = format!("{section}[{i}]");
            let shell_err = |message: String| RestoreError::Shell {
                config: config.into(),
                field: field.clone(),
                message,
            };
            // A line the simulation cannot split (a pipe, `||`) matters
            // only if it runs k3s or sources a file; any other is left alone.
            let chain = match split_line(line) {
                Ok(chain) => chain,
                Err(_) if !line.contains("k3s") && !line.contains(". /") => {
                    steps.push(Planned {
                        step: PlannedStep::Other(line.clone()),
                        after_success_of_previous: false,
                    });
                    continue;
                }
                Err(message) => return Err(shell_err(message)),
            };
            for (n, (words, and)) in chain.into_iter().enumerate() {
                let step = shell
                    .plan(config, &field, &words, line, files)
                    .inspect(|s| {
                        if let PlannedStep::K3sServer(run) = s {
                            any_reset |= run.cluster_reset;
                        }
                    })?;
                steps.push(Planned {
                    step,
                    after_success_of_previous: n > 0 && and,
                });
            }
        }
    }
    if !any_reset {
        return Ok(None);
    }
    let Some(request) = steps.iter().find_map(|p| match &p.step {
        PlannedStep::K3sServer(run) => run.restore.clone(),
        _ => None,
    }) else {
        return Err(RestoreError::Plan {
            config: config.into(),
            field: "spec.postK3sCommands".into(),
            message: "`k3s server --cluster-reset` without --cluster-reset-restore-path \
                      resets the new server's own empty cluster: nothing is restored"
                .into(),
        });
    };
    Ok(Some(RestorePlan {
        config: config.into(),
        steps,
        request,
    }))
}

/// Shell state across the lines of one runcmd script (cloud-init runs
/// them all in one `sh`): `set -a` and the variables it exports.
#[derive(Default)]
struct ShellState {
    allexport: bool,
    /// name -> (value, exported)
    vars: BTreeMap<String, (String, bool)>,
}

impl ShellState {
    fn exported(&self, name: &str) -> Option<&str> {
        self.vars
            .get(name)
            .filter(|(_, exported)| *exported)
            .map(|(v, _)| v.as_str())
    }

    fn plan(
        &mut self,
        config: &str,
        field: &str,
        words: &[String],
        line: &str,
        files: &[NodeFile],
    ) -> Result<PlannedStep, RestoreError> {
        let shell_err = |message: String| RestoreError::Shell {
            config: config.into(),
            field: field.into(),
            message,
        };
        let joined = words.join(" ");
        let w: Vec<&str> = words.iter().map(String::as_str).collect();
        Ok(match w.as_slice() {
            ["set", "-a"] => {
                self.allexport = true;
                PlannedStep::Other(joined)
            }
            ["set", "+a"] => {
                self.allexport = false;
                PlannedStep::Other(joined)
            }
            ["." | "source", path] => {
                let file = files.iter().find(|f| f.path == *path).ok_or_else(|| {
                    shell_err(format!(
                        "`. {path}`: no such file (not among the KThreesConfig's files)"
                    ))
                })?;
                for (n, raw) in file.content.lines().enumerate() {
                    let Some((name, value)) = parse_assignment(raw)
                        .map_err(|m| shell_err(format!("{path} line {}: {m}", n + 1)))?
                    else {
                        continue;
                    };
                    let exported = self.allexport || self.vars.get(&name).is_some_and(|(_, e)| *e);
                    self.vars.insert(name, (value, exported));
                }
                PlannedStep::Other(joined)
            }
            ["export", rest @ ..] => {
                for item in rest {
                    match item.split_once('=') {
                        Some((name, value)) => {
                            self.vars.insert(name.into(), (value.into(), true));
                        }
                        None => {
                            let value = self.vars.get(*item).map(|(v, _)| v.clone());
                            self.vars
                                .insert((*item).into(), (value.unwrap_or_default(), true));
                        }
                    }
                }
                PlannedStep::Other(joined)
            }
            ["systemctl", "stop", "k3s" | "k3s.service"] => PlannedStep::StopK3s,
            ["systemctl", "start", "k3s" | "k3s.service"] => PlannedStep::StartK3s,
            ["k3s", "server", ..] => {
                let run = self.server_run(&words[2..], files).map_err(|message| {
                    RestoreError::K3sRefuses {
                        config: config.into(),
                        field: field.into(),
                        command: joined.clone(),
                        message,
                    }
                })?;
                PlannedStep::K3sServer(Box::new(ServerRun {
                    field: field.into(),
                    command: joined,
                    ..run
                }))
            }
            _ if line.trim() == SERVER_TO_CLUSTER_INIT => PlannedStep::ServerToClusterInit,
            _ => PlannedStep::Other(joined),
        })
    }

    /// `k3s server <args>` as k3s reads it, with this shell's exported
    /// variables as its environment.
    fn server_run(&self, args: &[String], files: &[NodeFile]) -> Result<ServerRun, String> {
        let flags = parse_flags(args, |env| self.exported(env).map(str::to_string))?;
        let restore_path = flags.string("cluster-reset-restore-path");
        let cluster_reset = flags.bool("cluster-reset");
        if !restore_path.is_empty() && !cluster_reset {
            return Err(
                "invalid flag use; --cluster-reset required with --cluster-reset-restore-path"
                    .into(),
            );
        }
        let restore = if restore_path.is_empty() {
            None
        } else {
            let s3 = if flags.bool("etcd-s3") {
                Some(s3_settings(&flags, files)?)
            } else {
                None
            };
            Some(RestoreRequest { restore_path, s3 })
        };
        Ok(ServerRun {
            field: String::new(),
            command: String::new(),
            cluster_reset,
            restore,
        })
    }
}

/// `NAME=value` (optionally `export NAME=value`) as `sh` reads it from a
/// sourced file, quotes removed; `None` for blank and comment lines.
fn parse_assignment(raw: &str) -> Result<Option<(String, String)>, String> {
    let line = raw.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let line = line.strip_prefix("export ").unwrap_or(line).trim_start();
    let Some((name, value)) = line.split_once('=') else {
        return Err(format!("{line:?} is not NAME=value"));
    };
    let valid = name
        .chars()
        .enumerate()
        .all(|(i, c)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()));
    if name.is_empty() || !valid {
        return Err(format!("{name:?} is not a variable name"));
    }
    let words = split_words(value)?;
    match words.as_slice() {
        [] => Ok(Some((name.into(), String::new()))),
        [one] => Ok(Some((name.into(), one.clone()))),
        _ => Err(format!("the value of {name} has unquoted spaces")),
    }
}

/// A runcmd line split at `;` and `&&` (outside quotes) into words: each
/// command with whether it follows `&&`.
fn split_line(line: &str) -> Result<Vec<(Vec<String>, bool)>, String> {
    let mut out = Vec::new();
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut and = false;
    let mut chars = line.chars().peekable();
    let finish = |words: &mut Vec<String>, out: &mut Vec<(Vec<String>, bool)>, and: bool| {
        if !words.is_empty() {
            out.push((std::mem::take(words), and));
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err(format!("unterminated ' in {line:?}")),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => word.push(c),
                            Some(c) => {
                                word.push('\\');
                                word.push(c);
                            }
                            None => return Err(format!("unterminated \" in {line:?}")),
                        },
                        Some(c) => word.push(c),
                        None => return Err(format!("unterminated \" in {line:?}")),
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(c) = chars.next() {
                    word.push(c);
                }
            }
            ';' | '&' | '|' | '\n' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
                match c {
                    '&' if chars.peek() == Some(&'&') => {
                        chars.next();
                        finish(&mut words, &mut out, and);
                        and = true;
                    }
                    ';' | '\n' => {
                        finish(&mut words, &mut out, and);
                        and = false;
                    }
                    other => {
                        return Err(format!(
                            "{other:?} in {line:?}: only `;` and `&&` join commands here"
                        ));
                    }
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    finish(&mut words, &mut out, and);
    Ok(out)
}

/// Words of a single command (no operators).
fn split_words(text: &str) -> Result<Vec<String>, String> {
    let mut chain = split_line(text)?;
    match chain.len() {
        0 => Ok(Vec::new()),
        1 => Ok(chain.remove(0).0),
        _ => Err(format!("{text:?} is more than one command")),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bool,
    Text,
}

/// The `k3s server` flags the simulation reads (names, short aliases,
/// environment variables and defaults as `pkg/cli/cmds/server.go` declares
/// them); any other flag is refused as Go's `flag` refuses an undefined one.
/// A flag: name, short alias, kind, backing environment variable, default.
type FlagSpec = (
    &'static str,
    Option<&'static str>,
    Kind,
    Option<&'static str>,
    &'static str,
);

const FLAGS: &[FlagSpec] = &[
    (
        "cluster-reset",
        None,
        Kind::Bool,
        Some("K3S_CLUSTER_RESET"),
        "",
    ),
    ("cluster-reset-restore-path", None, Kind::Text, None, ""),
    (
        "cluster-init",
        None,
        Kind::Bool,
        Some("K3S_CLUSTER_INIT"),
        "",
    ),
    ("etcd-s3", None, Kind::Bool, None, ""),
    (
        "etcd-s3-endpoint",
        None,
        Kind::Text,
        None,
        "s3.amazonaws.com",
    ),
    ("etcd-s3-endpoint-ca", None, Kind::Text, None, ""),
    ("etcd-s3-skip-ssl-verify", None, Kind::Bool, None, ""),
    (
        "etcd-s3-access-key",
        None,
        Kind::Text,
        Some("AWS_ACCESS_KEY_ID"),
        "",
    ),
    (
        "etcd-s3-secret-key",
        None,
        Kind::Text,
        Some("AWS_SECRET_ACCESS_KEY"),
        "",
    ),
    ("etcd-s3-bucket", None, Kind::Text, None, ""),
    ("etcd-s3-region", None, Kind::Text, None, "us-east-1"),
    ("etcd-s3-folder", None, Kind::Text, None, ""),
    ("etcd-s3-insecure", None, Kind::Bool, None, ""),
    ("etcd-s3-timeout", None, Kind::Text, None, "5m0s"),
    ("etcd-s3-proxy", None, Kind::Text, None, ""),
    ("etcd-s3-config-secret", None, Kind::Text, None, ""),
    ("token", Some("t"), Kind::Text, Some("K3S_TOKEN"), ""),
    ("token-file", None, Kind::Text, Some("K3S_TOKEN_FILE"), ""),
    ("server", Some("s"), Kind::Text, Some("K3S_URL"), ""),
    ("data-dir", Some("d"), Kind::Text, None, ""),
    ("config", Some("c"), Kind::Text, Some("K3S_CONFIG_FILE"), ""),
    ("node-name", None, Kind::Text, Some("K3S_NODE_NAME"), ""),
    ("node-ip", Some("i"), Kind::Text, None, ""),
    ("debug", None, Kind::Bool, Some("K3S_DEBUG"), ""),
];

/// Parsed `k3s server` flags.
#[derive(Debug, Default)]
struct Flags {
    texts: BTreeMap<&'static str, String>,
    bools: BTreeMap<&'static str, bool>,
    /// Flags given on the command line (not from the environment).
    set: Vec<&'static str>,
}

impl Flags {
    fn string(&self, name: &str) -> String {
        self.texts.get(name).cloned().unwrap_or_else(|| {
            FLAGS
                .iter()
                .find(|f| f.0 == name)
                .map_or(String::new(), |f| f.4.to_string())
        })
    }

    fn bool(&self, name: &str) -> bool {
        self.bools.get(name).copied().unwrap_or(false)
    }
}

/// Go's `strconv.ParseBool`.
fn go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// urfave/cli v1 over Go's `flag`: `-name` or `--name`, `--name=value` or
/// `--name value` for a value flag, `--name` or `--name=<bool>` for a bool
/// flag (`--name false` leaves `false` as an argument); flags and arguments
/// may mix (urfave reorders them), `--` ends the flags. An environment
/// variable backing a flag applies when the command line does not set it.
/// Errors are Go's and k3s's messages.
fn parse_flags(args: &[String], env: impl Fn(&str) -> Option<String>) -> Result<Flags, String> {
    let mut flags = Flags::default();
    let mut positional = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            positional.extend(args[i..].iter().cloned());
            break;
        }
        let Some(body) = arg.strip_prefix('-').filter(|b| !b.is_empty()) else {
            positional.push(arg.clone());
            continue;
        };
        let body = body.strip_prefix('-').unwrap_or(body);
        if body.is_empty() || body.starts_with('-') || body.starts_with('=') {
            return Err(format!("bad flag syntax: {arg}"));
        }
        let (name, value) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (body, None),
        };
        let Some(spec) = FLAGS.iter().find(|f| f.0 == name || f.1 == Some(name)) else {
            return Err(format!("flag provided but not defined: -{name}"));
        };
        match spec.2 {
            Kind::Bool => {
                let v = match value {
                    None => true,
                    Some(v) => go_bool(&v).ok_or_else(|| {
                        format!("invalid boolean value {v:?} for -{name}: parse error")
                    })?,
                };
                flags.bools.insert(spec.0, v);
            }
            Kind::Text => {
                let v = match value {
                    Some(v) => v,
                    None if i < args.len() => {
                        i += 1;
                        args[i - 1].clone()
                    }
                    None => return Err(format!("flag needs an argument: -{name}")),
                };
                flags.texts.insert(spec.0, v);
            }
        }
        flags.set.push(spec.0);
    }
    if !positional.is_empty() {
        return Err("this command does not take any arguments".into());
    }
    for (name, _, kind, var, _) in FLAGS {
        let Some(var) = var else { continue };
        if flags.set.contains(name) {
            continue;
        }
        let Some(value) = env(var) else { continue };
        match kind {
            // urfave/cli v1 ignores a bool variable it cannot parse.
            Kind::Bool => {
                if let Some(v) = go_bool(value.trim()) {
                    flags.bools.insert(name, v);
                }
            }
            Kind::Text => {
                flags.texts.insert(name, value);
            }
        }
    }
    Ok(flags)
}

/// The S3 settings k3s builds from `--etcd-s3*` for a restore, refused as
/// k3s refuses them (`pkg/etcd/s3/s3.go (GetClient)`, `pkg/etcd/etcd.go
/// (Reset)`).
fn s3_settings(flags: &Flags, files: &[NodeFile]) -> Result<S3Settings, String> {
    let set_by_user = [
        "etcd-s3-endpoint",
        "etcd-s3-endpoint-ca",
        "etcd-s3-skip-ssl-verify",
        "etcd-s3-access-key",
        "etcd-s3-secret-key",
        "etcd-s3-bucket",
        "etcd-s3-region",
        "etcd-s3-folder",
        "etcd-s3-insecure",
        "etcd-s3-timeout",
        "etcd-s3-proxy",
    ]
    .iter()
    .any(|n| flags.texts.contains_key(n) || flags.bools.contains_key(n));
    if !set_by_user {
        return Err(if flags.string("etcd-s3-config-secret").is_empty() {
            "s3 configuration was not set".into()
        } else {
            "cannot use S3 config secret when restoring snapshot; configuration must be set in CLI or config file".into()
        });
    }
    let bucket = flags.string("etcd-s3-bucket");
    if bucket.is_empty() {
        return Err("s3 bucket name was not set".into());
    }
    let ca_path = flags.string("etcd-s3-endpoint-ca");
    let endpoint_ca_pem = if ca_path.is_empty() || flags.bool("etcd-s3-skip-ssl-verify") {
        None
    } else {
        let file = files.iter().find(|f| f.path == ca_path).ok_or_else(|| {
            format!(
                "etcd-s3-endpoint-ca {ca_path}: no such file (not among the KThreesConfig's files)"
            )
        })?;
        Some(file.content.clone())
    };
    Ok(S3Settings {
        endpoint: flags.string("etcd-s3-endpoint"),
        bucket,
        folder: flags.string("etcd-s3-folder"),
        region: flags.string("etcd-s3-region"),
        insecure: flags.bool("etcd-s3-insecure"),
        skip_ssl_verify: flags.bool("etcd-s3-skip-ssl-verify"),
        endpoint_ca_pem,
        access_key_id: flags.string("etcd-s3-access-key"),
        secret_access_key: flags.string("etcd-s3-secret-key"),
    })
}

/// A KThreesConfig's `files` with their content, as the bootstrap provider
/// resolves them (`contentFrom.secret` from a Secret of the config's
/// namespace: capi-k3s `bootstrap/controllers/kthreesconfig_controller.go
/// (resolveFiles, resolveSecretFileContent)`), plus the k3s configuration
/// file it renders (only whether it has `server:` matters here).
pub async fn resolve_files(
    client: &kube::Client,
    config: &KThreesConfig,
) -> Result<Vec<NodeFile>, SandboxError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let name = config.name_any();
    let mut out = Vec::new();
    for (i, file) in config.spec.files.iter().enumerate() {
        let content = match &file.content_from {
            None => file.content.clone(),
            Some(from) => {
                let secret = &from.secret;
                let found = secrets.get(&secret.name).await.map_err(|e| {
                    SandboxError(format!(
                        "KThreesConfig {name} spec.files[{i}].contentFrom.secret: secret not found: {NAMESPACE}/{}: {e}",
                        secret.name
                    ))
                })?;
                let data = found
                    .data
                    .as_ref()
                    .and_then(|d| d.get(&secret.key))
                    .ok_or_else(|| {
                        SandboxError(format!(
                            "KThreesConfig {name} spec.files[{i}].contentFrom.secret: secret references non-existent secret key: {:?}",
                            secret.key
                        ))
                    })?;
                String::from_utf8(data.0.clone()).map_err(|_| {
                    SandboxError(format!(
                        "KThreesConfig {name} spec.files[{i}]: Secret {} key {} is not text",
                        secret.name, secret.key
                    ))
                })?
            }
        };
        let content = match file.encoding.as_str() {
            "" => content,
            "base64" => {
                use base64::Engine;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(content.trim())
                    .map_err(|e| {
                        SandboxError(format!(
                            "KThreesConfig {name} spec.files[{i}].content: not base64: {e}"
                        ))
                    })?;
                String::from_utf8(bytes).map_err(|_| {
                    SandboxError(format!(
                        "KThreesConfig {name} spec.files[{i}].content: not text once decoded"
                    ))
                })?
            }
            other => {
                return Err(SandboxError(format!(
                    "KThreesConfig {name} spec.files[{i}].encoding {other:?}: the simulation reads plain and base64 content only"
                )));
            }
        };
        out.push(NodeFile {
            path: file.path.clone(),
            permissions: file.permissions.clone(),
            content,
        });
    }
    Ok(out)
}

/// What a successful restore produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restored {
    pub machine: String,
    pub node: String,
    pub ip: String,
    pub index: usize,
    /// The member name after the reset (`<node>-<8 hex>`).
    pub member: String,
    pub member_id: u64,
    pub cluster_id: u64,
    pub took: Duration,
}

/// The restore plan of `machine`, if its KThreesConfig has one: `Ok(None)`
/// when the Machine has no KThreesConfig (yet) or no restore commands.
pub async fn restore_plan_of(
    client: &kube::Client,
    machine: &str,
) -> Result<Option<(RestorePlan, Vec<NodeFile>)>, SandboxError> {
    let machines: Api<Machine> = Api::namespaced(client.clone(), NAMESPACE);
    let m = machines
        .get(machine)
        .await
        .map_err(|e| SandboxError(format!("get Machine {machine}: {e}")))?;
    let Some(config_ref) = m.spec.bootstrap.config_ref.as_ref() else {
        return Ok(None);
    };
    let configs: Api<KThreesConfig> = Api::namespaced(client.clone(), NAMESPACE);
    let config = match configs.get(&config_ref.name).await {
        Ok(c) => c,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
        Err(e) => {
            return Err(SandboxError(format!(
                "get KThreesConfig {} of Machine {machine}: {e}",
                config_ref.name
            )));
        }
    };
    // Only a config that resets is read further: an ordinary server's
    // commands and files are none of the simulation's business.
    if !config
        .spec
        .post_k3s_commands
        .iter()
        .chain(&config.spec.pre_k3s_commands)
        .any(|c| c.contains("cluster-reset"))
    {
        return Ok(None);
    }
    let files = resolve_files(client, &config).await?;
    let plan = parse_restore(&config.name_any(), &config.spec, &files)
        .map_err(|e| SandboxError(e.to_string()))?;
    Ok(plan.map(|p| (p, files)))
}

/// Whether the bootstrap provider renders a join configuration (`server:`)
/// for a new control-plane Machine: once the Cluster's control plane is
/// initialized (capi-k3s `bootstrap/controllers/kthreesconfig_controller.go
/// (Reconcile)`). The sandbox runs no CAPI Cluster controller, so the
/// control plane's own `initialized` (which that controller copies to the
/// Cluster) counts too.
pub async fn renders_join(client: &kube::Client) -> Result<Option<String>, SandboxError> {
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), NAMESPACE);
    let cluster = clusters
        .get(super::sandbox::CLUSTER)
        .await
        .map_err(|e| SandboxError(format!("get Cluster {}: {e}", super::sandbox::CLUSTER)))?;
    let value = serde_json::to_value(&cluster).unwrap_or_default();
    let initialized = |v: &serde_json::Value| {
        v.pointer("/status/initialization/controlPlaneInitialized")
            .and_then(|b| b.as_bool())
            == Some(true)
            || v.pointer("/status/initialized").and_then(|b| b.as_bool()) == Some(true)
            || v.pointer("/status/conditions")
                .and_then(|c| c.as_array())
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "ControlPlaneInitialized" && c["status"] == "True")
                })
    };
    let mut join = initialized(&value);
    if !join
        && let Some(kcp) = value
            .pointer("/spec/controlPlaneRef/name")
            .and_then(|n| n.as_str())
    {
        let kcps: Api<crate::api::KThreesControlPlane> = Api::namespaced(client.clone(), NAMESPACE);
        if let Ok(obj) = kcps.get(kcp).await {
            join = initialized(&serde_json::to_value(&obj).unwrap_or_default());
        }
    }
    let endpoint = value
        .pointer("/spec/controlPlaneEndpoint")
        .map(|e| format!("{}:{}", e["host"].as_str().unwrap_or(""), e["port"]))
        .unwrap_or_else(|| "<control-plane endpoint>".into());
    Ok(join.then(|| format!("https://{endpoint}")))
}

/// The node's k3s, as far as the restore needs it.
struct NodeK3s {
    index: Option<usize>,
    running: bool,
    /// `server:` in the k3s configuration file.
    server: Option<String>,
    /// `<data-dir>/server/db/reset-flag` exists.
    reset_flag: bool,
    /// The current member name (the name file).
    member: Option<String>,
}

/// Boot `machine` from its restore plan on real etcd (module docs): on
/// success the sandbox's etcd cluster is the restored one (the members of
/// the cluster it replaces are retired, their processes left as they are),
/// the Node is registered, the Machine has its nodeRef, and `machine` sits
/// at its member's index in `sandbox.machines`. The record of what
/// happened is pushed to `sandbox.restores` either way.
pub async fn provision_restore(
    sandbox: &mut Sandbox,
    machine: &str,
    plan: &RestorePlan,
    files: &[NodeFile],
    limit: Duration,
) -> Result<Restored, SandboxError> {
    let started = tokio::time::Instant::now();
    let mut actions = Vec::new();
    let mut node = NodeK3s {
        index: None,
        running: false,
        server: renders_join(&sandbox.client()).await?,
        reset_flag: false,
        member: None,
    };
    actions.push(RestoreAction::ConfigRendered {
        server: node.server.clone(),
    });
    let result = tokio::time::timeout(
        limit,
        run_plan(sandbox, plan, files, &mut node, &mut actions),
    )
    .await
    .unwrap_or_else(|_| Err(format!("restore not done within {limit:?}")));
    let node_name = node
        .index
        .map(|i| sandbox.etcd.member(i).node_name.clone())
        .unwrap_or_default();
    let finish = async {
        let index = result?;
        let (ip, member, member_id) = {
            let m = sandbox.etcd.member(index);
            (m.ip.to_string(), m.name.clone(), m.id)
        };
        let own = sandbox
            .etcd
            .own_member_list(index)
            .await
            .map_err(|e| format!("member list of the restored member {member}: {e}"))?;
        // k3s registers the Node with the new member name (N1), and CAPI
        // sets the Machine's nodeRef.
        let proxied = sandbox.etcd.member(index).listen_client_addr();
        sandbox
            .add_node(&node_name, &ip, Some(&member))
            .await
            .map_err(|e| e.0)?;
        sandbox
            .add_etcd_proxy(&node_name, proxied)
            .await
            .map_err(|e| e.0)?;
        sandbox
            .provision(machine, &node_name, &ip)
            .await
            .map_err(|e| e.0)?;
        actions.push(RestoreAction::NodeRegistered {
            node: node_name.clone(),
            member: member.clone(),
        });
        while sandbox.machines.len() < index {
            sandbox.machines.push(String::new());
        }
        if sandbox.machines.len() == index {
            sandbox.machines.push(machine.to_string());
        } else {
            sandbox.machines[index] = machine.to_string();
        }
        Ok::<_, String>(Restored {
            machine: machine.to_string(),
            node: node_name.clone(),
            ip,
            index,
            member,
            member_id,
            cluster_id: own.cluster_id,
            took: started.elapsed(),
        })
    };
    let outcome = finish.await;
    sandbox.restores.push(RestoreRecord {
        machine: machine.to_string(),
        node: node_name,
        member_index: node.index,
        request: plan.request.clone(),
        actions,
        outcome: outcome
            .as_ref()
            .map(|r| r.member.clone())
            .map_err(Clone::clone),
    });
    outcome.map_err(|e| {
        SandboxError(format!(
            "restore on Machine {machine} (KThreesConfig {}): {e}",
            plan.config
        ))
    })
}

/// The plan's steps in order; returns the restored member's index.
async fn run_plan(
    sandbox: &mut Sandbox,
    plan: &RestorePlan,
    files: &[NodeFile],
    node: &mut NodeK3s,
    actions: &mut Vec<RestoreAction>,
) -> Result<usize, String> {
    let mut previous_ok = true;
    let mut restored = false;
    for (n, planned) in plan.steps.iter().enumerate() {
        if planned.after_success_of_previous && !previous_ok {
            actions.push(RestoreAction::NotRun {
                command: describe(&planned.step),
                why: "after `&&` of a command that failed".into(),
            });
            continue;
        }
        previous_ok = true;
        match &planned.step {
            PlannedStep::Other(_) => {}
            PlannedStep::ServerToClusterInit => {
                if node.server.take().is_some() {
                    actions.push(RestoreAction::ServerReplacedByClusterInit);
                }
            }
            PlannedStep::Install => {
                if let Some(server) = &node.server {
                    // A join start: k3s asks `server` for the member list
                    // and retries while it cannot get it; the cluster it
                    // names lost quorum (docs/k3s.md SR9).
                    actions.push(RestoreAction::FirstStartJoins {
                        server: server.clone(),
                    });
                    node.running = true;
                } else {
                    let index = sandbox
                        .etcd
                        .start_first_server_beside()
                        .await
                        .map_err(|e| format!("first start of the new server: {e}"))?;
                    let member = sandbox.etcd.member(index).name.clone();
                    actions.push(RestoreAction::FirstStart {
                        member: member.clone(),
                    });
                    node.index = Some(index);
                    node.member = Some(member);
                    node.running = true;
                }
            }
            PlannedStep::StopK3s => {
                if let Some(index) = node.index.filter(|_| node.running) {
                    sandbox
                        .etcd
                        .stop(index)
                        .await
                        .map_err(|e| format!("systemctl stop k3s: {e}"))?;
                }
                node.running = false;
                actions.push(RestoreAction::Stopped);
            }
            PlannedStep::StartK3s => {
                let Some(index) = node.index else {
                    // Started again with `server:`: it joins again.
                    if let Some(server) = &node.server {
                        actions.push(RestoreAction::FirstStartJoins {
                            server: server.clone(),
                        });
                        node.running = true;
                        continue;
                    }
                    return Err("systemctl start k3s: the node never ran etcd of its own".into());
                };
                if !node.running {
                    // A normal start: the reset flag is cleared (docs/k3s.md
                    // SR5, CR2) and etcd starts on the restored data.
                    node.reset_flag = false;
                    let _ = std::fs::remove_file(reset_flag_path(sandbox, index));
                    sandbox
                        .etcd
                        .start_alone(index)
                        .await
                        .map_err(|e| format!("systemctl start k3s: {e}"))?;
                    node.running = true;
                }
                actions.push(RestoreAction::Started {
                    member: sandbox.etcd.member(index).name.clone(),
                });
            }
            PlannedStep::K3sServer(run) => {
                match reset_run(sandbox, run, files, node, actions).await {
                    Ok(true) => restored = true,
                    Ok(false) => previous_ok = false,
                    Err(error) => {
                        actions.push(RestoreAction::RestoreFailed {
                            error: error.clone(),
                        });
                        for rest in &plan.steps[n + 1..] {
                            actions.push(RestoreAction::NotRun {
                                command: describe(&rest.step),
                                why: "the restore failed part-way; cloud-init would go on \
                                      (runcmd has no `set -e`) on a half-restored data dir, \
                                      which is not simulated"
                                    .into(),
                            });
                        }
                        return Err(error);
                    }
                }
            }
        }
    }
    let index = node
        .index
        .ok_or("the node never ran etcd of its own (its first start joined)")?;
    if !restored {
        return Err(
            "no `k3s server --cluster-reset --cluster-reset-restore-path` run restored anything"
                .into(),
        );
    }
    if !node.running {
        return Err("k3s was left stopped after the restore (no `systemctl start k3s` ran)".into());
    }
    sandbox
        .etcd
        .adopt_restored(index)
        .map_err(|e| format!("adopt the restored member: {e}"))?;
    Ok(index)
}

impl PlannedStep {
    /// The command as the log names it.
    pub fn describe(&self) -> String {
        describe(self)
    }
}

fn describe(step: &PlannedStep) -> String {
    match step {
        PlannedStep::ServerToClusterInit => SERVER_TO_CLUSTER_INIT.into(),
        PlannedStep::Install => "the k3s install script".into(),
        PlannedStep::StopK3s => "systemctl stop k3s".into(),
        PlannedStep::StartK3s => "systemctl start k3s".into(),
        PlannedStep::K3sServer(run) => run.command.clone(),
        PlannedStep::Other(c) => c.clone(),
    }
}

fn reset_flag_path(sandbox: &Sandbox, index: usize) -> PathBuf {
    sandbox.etcd.member_dir(index).join("reset-flag")
}

/// One `k3s server` run on the node (docs/k3s.md SR2 to SR5, SR9):
/// `Ok(true)` restored, `Ok(false)` refused with nothing changed (k3s
/// exits 1), `Err` failed part-way.
async fn reset_run(
    sandbox: &mut Sandbox,
    run: &ServerRun,
    files: &[NodeFile],
    node: &mut NodeK3s,
    actions: &mut Vec<RestoreAction>,
) -> Result<bool, String> {
    let refuse = |actions: &mut Vec<RestoreAction>, message: String| {
        actions.push(RestoreAction::Refused {
            command: run.command.clone(),
            message,
        });
        Ok(false)
    };
    if !run.cluster_reset {
        return refuse(
            actions,
            "a plain `k3s server` in a post command: the simulation runs k3s only through systemd and --cluster-reset".into(),
        );
    }
    if node.server.is_some() {
        return refuse(
            actions,
            "cannot perform cluster-reset while server URL is set - remove server from configuration before resetting".into(),
        );
    }
    let Some(index) = node.index else {
        return refuse(
            actions,
            "the node has no etcd data of its own to reset".into(),
        );
    };
    if node.running {
        let m = sandbox.etcd.member(index);
        return refuse(
            actions,
            format!(
                "k3s is still running (`systemctl stop k3s` first): etcd cannot listen on {}: address already in use",
                m.listen_peer_url()
            ),
        );
    }
    let Some(request) = &run.restore else {
        if node.reset_flag {
            let flag = reset_flag_path(sandbox, index);
            return refuse(
                actions,
                format!(
                    "Managed etcd cluster membership was previously reset, please remove the cluster-reset flag and start k3s normally. If you need to perform another cluster reset, you must first manually delete the file at {}",
                    flag.display()
                ),
            );
        }
        return refuse(
            actions,
            "a cluster reset without a snapshot is not simulated on a restoring node".into(),
        );
    };
    // With a restore path k3s does not look at the reset flag (SR5).
    let snapshot = fetch_snapshot(sandbox, index, request, files).await?;
    actions.push(RestoreAction::SnapshotFetched {
        source: match &request.s3 {
            None => request.restore_path.clone(),
            Some(s3) => format!(
                "s3://{}/{}",
                s3.bucket,
                s3.object_key(&request.restore_path)
            ),
        },
        path: snapshot.clone(),
    });
    let before = node.member.clone().unwrap_or_default();
    let to = sandbox
        .etcd
        .move_data_aside(index)
        .map_err(|e| e.to_string())?;
    actions.push(RestoreAction::DataMovedAside { to });
    let tool = sandbox
        .etcd
        .restore_snapshot(index, &snapshot)
        .map_err(|e| e.to_string())?;
    actions.push(RestoreAction::SnapshotRestored {
        tool: tool.into(),
        member: before,
    });
    let name = sandbox
        .etcd
        .start_reset_run(index)
        .await
        .map_err(|e| format!("reset run: {e}"))?;
    std::fs::write(reset_flag_path(sandbox, index), b"")
        .map_err(|e| format!("write the reset flag: {e}"))?;
    node.reset_flag = true;
    node.member = Some(name.clone());
    actions.push(RestoreAction::ResetRun { member: name });
    Ok(true)
}

/// The snapshot file the restore reads (docs/k3s.md SR2, SR6): a path on
/// the node, checked as k3s checks it, or the object `<folder>/<name>`
/// downloaded into the node's `<data-dir>/server/db/snapshots/<name>`.
async fn fetch_snapshot(
    sandbox: &Sandbox,
    index: usize,
    request: &RestoreRequest,
    files: &[NodeFile],
) -> Result<PathBuf, String> {
    let Some(s3) = &request.s3 else {
        let path = PathBuf::from(&request.restore_path);
        if files.iter().any(|f| f.path == request.restore_path) {
            return Err(format!(
                "etcd: snapshot path {} is a KThreesConfig file: the simulation reads snapshots from the host",
                request.restore_path
            ));
        }
        return match std::fs::metadata(&path) {
            Err(_) => Err(format!(
                "etcd: snapshot path does not exist: {}",
                request.restore_path
            )),
            Ok(m) if m.is_dir() => Err(format!(
                "etcd: snapshot path must be a file, not a directory: {}",
                request.restore_path
            )),
            Ok(_) => Ok(path),
        };
    };
    let dir = sandbox.etcd.member_dir(index).join("snapshots");
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let file = dir.join(&request.restore_path);
    let bytes = download(s3, &request.restore_path)
        .await
        .map_err(|e| format!("failed to download snapshot from S3: {e}"))?;
    std::fs::write(&file, &bytes).map_err(|e| format!("write {}: {e}", file.display()))?;
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600));
    Ok(file)
}

/// GET the object `<folder>/<name>` with the parsed settings.
pub async fn download(s3: &S3Settings, name: &str) -> Result<Vec<u8>, String> {
    use object_store::ObjectStoreExt;
    if s3.access_key_id.is_empty() && s3.secret_access_key.is_empty() {
        return Err(
            "failed to get IAM credentials: no S3 keys given, and the sandbox's nodes have no instance role".into(),
        );
    }
    let mut options = object_store::ClientOptions::new().with_allow_http(s3.insecure);
    if s3.skip_ssl_verify {
        options = options.with_allow_invalid_certificates(true);
    } else if let Some(pem) = &s3.endpoint_ca_pem {
        let ca = object_store::Certificate::from_pem(pem.as_bytes())
            .map_err(|e| format!("etcd-s3-endpoint-ca: {e}"))?;
        options = options.with_root_certificate(ca);
    }
    let store = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(s3.endpoint_url())
        .with_bucket_name(&s3.bucket)
        .with_region(&s3.region)
        .with_access_key_id(&s3.access_key_id)
        .with_secret_access_key(&s3.secret_access_key)
        .with_virtual_hosted_style_request(false)
        .with_client_options(options)
        .build()
        .map_err(|e| e.to_string())?;
    let key = object_store::path::Path::from(s3.object_key(name));
    let got = store.get(&key).await.map_err(|e| e.to_string())?;
    got.bytes()
        .await
        .map(|b| b.to_vec())
        .map_err(|e| e.to_string())
}
