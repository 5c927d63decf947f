//! Which etcd the harness runs, and the flags k3s would give it.
//!
//! The binary is `ETCD_BIN`, else the etcd 3.5.1 that `hack/setup.sh` puts in
//! `.tools/etcd-v3.5.1/` of this checkout, else `etcd` on `PATH`. Its version
//! and the flags it offers are read from the binary itself (`--version`,
//! `--help`), once per path, so a flag that differs between etcd releases is
//! chosen from what this binary accepts, never from a guess.
//!
//! The member flags follow k3s's etcd configuration (docs/k3s.md R1, R2:
//! `k3s: pkg/etcd/etcd.go (cluster)`, `pkg/daemons/executor/executor.go
//! (ETCDConfig)`), with the harness's addresses in place of k3s's loopback.

use std::collections::{BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

/// Why the etcd binary could not be found or read.
#[derive(Debug, thiserror::Error)]
pub enum EtcdBinaryError {
    #[error(
        "etcd binary not found (set ETCD_BIN, or run hack/setup.sh, which installs etcd 3.5.1 into .tools/etcd-v3.5.1)"
    )]
    NotFound,
    #[error("{what}: {source}")]
    Unreadable {
        what: String,
        source: std::io::Error,
    },
}

/// Where `hack/setup.sh` installs the default etcd (relative to the crate).
pub const PINNED_ETCD_DIR: &str = ".tools/etcd-v3.5.1";
/// k3s's `SnapshotCount`.
pub const K3S_SNAPSHOT_COUNT: u32 = 10_000;
/// k3s's watch progress notify interval (`Datastore.NotifyInterval`, 5 s).
pub const K3S_WATCH_PROGRESS_NOTIFY: &str = "5s";
/// k3s's metrics listener port (`listenMetricsURLs`: loopback `:2381`).
pub const METRICS_PORT: u16 = 2381;
/// k3s's loopback-only plain HTTP client listener (`listenClientHTTPURLs`:
/// loopback `:2382`), where the binary offers `--listen-client-http-urls`.
pub const CLIENT_HTTP_PORT: u16 = 2382;

/// An etcd server binary, as it describes itself.
#[derive(Clone, Debug)]
pub struct EtcdBinary {
    pub path: PathBuf,
    /// `major.minor.patch` from `etcd --version`.
    pub version: (u32, u32, u32),
    /// The `--flag` names `etcd --help` lists.
    pub flags: BTreeSet<String>,
}

impl EtcdBinary {
    /// The binary the harness runs (see the module docs).
    pub fn find() -> Result<Arc<EtcdBinary>, EtcdBinaryError> {
        Self::at(&etcd_binary()?)
    }

    /// The binary at `path`, read once per process.
    pub fn at(path: &Path) -> Result<Arc<EtcdBinary>, EtcdBinaryError> {
        static KNOWN: OnceLock<Mutex<HashMap<PathBuf, Arc<EtcdBinary>>>> = OnceLock::new();
        let known = KNOWN.get_or_init(Default::default);
        if let Some(found) = known.lock().unwrap().get(path) {
            return Ok(found.clone());
        }
        let run = |arg: &str| -> Result<String, EtcdBinaryError> {
            let out = Command::new(path).arg(arg).output().map_err(|source| {
                EtcdBinaryError::Unreadable {
                    what: format!("run {} {arg}", path.display()),
                    source,
                }
            })?;
            // etcd prints its help on stderr and its version on stdout.
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            Ok(text)
        };
        let version_text = run("--version")?;
        let version = parse_version(&version_text).ok_or_else(|| EtcdBinaryError::Unreadable {
            what: format!("read the version of {}", path.display()),
            source: std::io::Error::other(format!(
                "no 'etcd Version: X.Y.Z' in {:?}",
                version_text.lines().next().unwrap_or("")
            )),
        })?;
        let binary = Arc::new(EtcdBinary {
            path: path.to_path_buf(),
            version,
            flags: parse_flags(&run("--help")?),
        });
        known
            .lock()
            .unwrap()
            .insert(path.to_path_buf(), binary.clone());
        Ok(binary)
    }

    /// `3.5.1`, as messages and test reports name it.
    pub fn version_string(&self) -> String {
        let (a, b, c) = self.version;
        format!("{a}.{b}.{c}")
    }

    /// The etcdctl of the same installation: beside the server, else on PATH.
    pub fn etcdctl(&self) -> PathBuf {
        let beside = self.path.with_file_name("etcdctl");
        if beside.is_file() {
            beside
        } else {
            PathBuf::from("etcdctl")
        }
    }

    pub fn offers(&self, flag: &str) -> bool {
        self.flags.contains(flag)
    }
}

/// The etcd binary's path: `ETCD_BIN`, else the pinned one `hack/setup.sh`
/// installs, else `etcd` on PATH.
pub fn etcd_binary() -> Result<PathBuf, EtcdBinaryError> {
    if let Some(bin) = std::env::var_os("ETCD_BIN") {
        let bin = PathBuf::from(bin);
        return if bin.is_file() {
            Ok(bin)
        } else {
            Err(EtcdBinaryError::NotFound)
        };
    }
    let pinned = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(PINNED_ETCD_DIR)
        .join("etcd");
    if pinned.is_file() {
        return Ok(pinned);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("etcd"))
        .find(|p| p.is_file())
        .ok_or(EtcdBinaryError::NotFound)
}

fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let line = text.lines().find(|l| l.starts_with("etcd Version:"))?;
    let mut parts = line
        .trim_start_matches("etcd Version:")
        .trim()
        .split(['.', '-', '+'])
        .map(str::parse::<u32>);
    Some((
        parts.next()?.ok()?,
        parts.next()?.ok()?,
        parts.next()?.ok()?,
    ))
}

fn parse_flags(help: &str) -> BTreeSet<String> {
    help.split_whitespace()
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| {
            w.trim_end_matches([',', '\'', '"', ':'])
                .split(['=', '['])
                .next()
                .unwrap_or(w)
                .to_string()
        })
        .collect()
}

/// The flags k3s gives its etcd beyond names, URLs and certificates, for a
/// binary offering `offered`, with the member's loopback-only address in
/// place of k3s's `127.0.0.1` (each test member has its own):
/// - `--snapshot-count 10000`;
/// - the initial corruption check on, and watch progress notifications every
///   5 s: k3s writes `experimental-initial-corrupt-check` and
///   `experimental-watch-progress-notify-interval`, which etcd 3.4 to 3.6
///   accept; a binary that no longer lists them gets their successors
///   (`--feature-gates=InitialCorruptCheck=true`,
///   `--watch-progress-notify-interval`), which etcd 3.6 introduced;
/// - metrics on `http://<loopback>:2381`;
/// - a plain HTTP client listener on `http://<loopback>:2382` where the
///   binary has `--listen-client-http-urls` (not in 3.4 nor 3.5.1).
///
/// Raft timing (500/5000 ms) is set by the caller, which may override it.
pub fn k3s_member_flags(offered: &BTreeSet<String>, loopback: Ipv4Addr) -> Vec<String> {
    let has = |f: &str| offered.contains(f);
    let mut flags = vec![format!("--snapshot-count={K3S_SNAPSHOT_COUNT}")];
    if has("--experimental-initial-corrupt-check") {
        flags.push("--experimental-initial-corrupt-check=true".into());
    } else if has("--feature-gates") {
        flags.push("--feature-gates=InitialCorruptCheck=true".into());
    }
    if has("--experimental-watch-progress-notify-interval") {
        flags.push(format!(
            "--experimental-watch-progress-notify-interval={K3S_WATCH_PROGRESS_NOTIFY}"
        ));
    } else if has("--watch-progress-notify-interval") {
        flags.push(format!(
            "--watch-progress-notify-interval={K3S_WATCH_PROGRESS_NOTIFY}"
        ));
    }
    if has("--listen-metrics-urls") {
        flags.push(format!(
            "--listen-metrics-urls=http://{loopback}:{METRICS_PORT}"
        ));
    }
    if has("--listen-client-http-urls") {
        flags.push(format!(
            "--listen-client-http-urls=http://{loopback}:{CLIENT_HTTP_PORT}"
        ));
    }
    flags
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offered(flags: &[&str]) -> BTreeSet<String> {
        flags.iter().map(|f| f.to_string()).collect()
    }

    #[test]
    fn versions_are_read_as_etcd_prints_them() {
        let cases = [
            (
                "etcd Version: 3.4.23\nGit SHA: Not provided\n",
                Some((3, 4, 23)),
            ),
            ("etcd Version: 3.5.1\nGit SHA: e8732fb5f\n", Some((3, 5, 1))),
            ("etcd Version: 3.6.5\n", Some((3, 6, 5))),
            ("etcd Version: 3.5.25-k3s1\n", Some((3, 5, 25))),
            ("something else\n", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_version(text), want, "{text:?}");
        }
    }

    #[test]
    fn flags_are_read_from_the_help_text() {
        let help = "  --snapshot-count '100000'\n  --listen-metrics-urls ''\n\
                    \t--feature-gates 'InitialCorruptCheck=true'\n  --log-outputs 'default'";
        let flags = parse_flags(help);
        for f in [
            "--snapshot-count",
            "--listen-metrics-urls",
            "--feature-gates",
            "--log-outputs",
        ] {
            assert!(flags.contains(f), "{f} in {flags:?}");
        }
    }

    /// Each etcd generation gets the flags k3s would pass it.
    #[test]
    fn k3s_flags_per_etcd_generation() {
        let lo = Ipv4Addr::new(127, 79, 3, 1);
        let etcd_3_4_and_3_5_1 = offered(&[
            "--listen-metrics-urls",
            "--experimental-initial-corrupt-check",
            "--experimental-watch-progress-notify-interval",
        ]);
        let etcd_3_6 = offered(&[
            "--listen-metrics-urls",
            "--listen-client-http-urls",
            "--feature-gates",
            "--watch-progress-notify-interval",
            "--experimental-initial-corrupt-check",
            "--experimental-watch-progress-notify-interval",
        ]);
        let without_experimental = offered(&[
            "--listen-metrics-urls",
            "--listen-client-http-urls",
            "--feature-gates",
            "--watch-progress-notify-interval",
        ]);
        let cases: [(&str, BTreeSet<String>, Vec<&str>); 3] = [
            (
                "etcd 3.4 and 3.5.1: k3s's experimental names, no HTTP listener",
                etcd_3_4_and_3_5_1,
                vec![
                    "--snapshot-count=10000",
                    "--experimental-initial-corrupt-check=true",
                    "--experimental-watch-progress-notify-interval=5s",
                    "--listen-metrics-urls=http://127.79.3.1:2381",
                ],
            ),
            (
                "etcd 3.6: still k3s's names, and the HTTP listener",
                etcd_3_6,
                vec![
                    "--snapshot-count=10000",
                    "--experimental-initial-corrupt-check=true",
                    "--experimental-watch-progress-notify-interval=5s",
                    "--listen-metrics-urls=http://127.79.3.1:2381",
                    "--listen-client-http-urls=http://127.79.3.1:2382",
                ],
            ),
            (
                "a binary without the experimental names: their successors",
                without_experimental,
                vec![
                    "--snapshot-count=10000",
                    "--feature-gates=InitialCorruptCheck=true",
                    "--watch-progress-notify-interval=5s",
                    "--listen-metrics-urls=http://127.79.3.1:2381",
                    "--listen-client-http-urls=http://127.79.3.1:2382",
                ],
            ),
        ];
        for (name, offered, want) in cases {
            assert_eq!(k3s_member_flags(&offered, lo), want, "{name}");
        }
    }
}
