//! What the controller benches share: the real `k3s-control-plane run` binary
//! in its own process against a test API server, and what /proc and its
//! /metrics say about it.

#![allow(dead_code)] // each bench uses its part

use std::collections::{BTreeMap, HashSet};
use std::process::Stdio;
use std::time::Duration;

use k3s_control_plane::apiserver::TestApiServer;
use kube::config::Kubeconfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// VmRSS and VmHWM of `pid`, in KiB.
pub fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// utime + stime of `pid`, in clock ticks (/proc/<pid>/stat fields 14 and 15).
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc stat");
    // The command name (field 2) is in parentheses and may hold spaces.
    let after = &stat[stat.rfind(')').expect("comm in /proc stat") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state): utime is field 14, stime field 15.
    let utime: u64 = fields[11].parse().expect("utime");
    let stime: u64 = fields[12].parse().expect("stime");
    utime + stime
}

/// Clock ticks per second (`getconf CLK_TCK`, 100 on Linux).
pub fn clock_ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// The established TCP connections of `pid` to remote `port`: (local, remote)
/// address pairs, from /proc/<pid>/net/tcp filtered by the process's socket inodes.
pub fn established_to_port(pid: u32, port: u16) -> HashSet<(String, String)> {
    let port_hex = format!(":{port:04X}");
    established(pid)
        .into_iter()
        .filter(|(_, remote)| remote.ends_with(&port_hex))
        .collect()
}

/// Every established TCP connection of `pid`: (local, remote) address pairs
/// as /proc writes them (hex `addr:PORT`).
pub fn established(pid: u32) -> HashSet<(String, String)> {
    let mut inodes = HashSet::new();
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path())
                && let Some(inode) = target
                    .to_str()
                    .and_then(|t| t.strip_prefix("socket:["))
                    .and_then(|t| t.strip_suffix(']'))
            {
                inodes.insert(inode.to_string());
            }
        }
    }
    let mut out = HashSet::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if f.len() > 9 && f[3] == "01" && inodes.contains(f[9]) {
                out.insert((f[1].to_string(), f[2].to_string()));
            }
        }
    }
    out
}

/// A plain HTTP/1.0 GET on loopback: (status code, body).
pub async fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// `K3SCP_BENCH_WRAP`: a command line the controller binary is started under
/// (e.g. `heaptrack -o /tmp/scale`), split on whitespace; unset or empty: none.
pub const WRAP_ENV: &str = "K3SCP_BENCH_WRAP";

/// A wrapper set by the bench itself ([`count_instructions`]); it wins over [`WRAP_ENV`].
static WRAP_OVERRIDE: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
/// Where [`count_instructions`] has callgrind write: `<dir>/callgrind.<pid>[.<dump>]`.
static CALLGRIND_DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

fn profiler_wrapper() -> Vec<String> {
    if let Some(wrapper) = WRAP_OVERRIDE.get() {
        return wrapper.clone();
    }
    std::env::var(WRAP_ENV)
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Every controller process started from now on runs under callgrind with
/// its instrumentation off (valgrind's base slowdown only), its output in
/// `dir`; [`ControllerProcess::instructions_start`] and
/// [`ControllerProcess::instructions_end`] count the instructions (Ir) it
/// executes between them, whatever else the machine is doing. Call once,
/// before the first spawn.
pub fn count_instructions(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).expect("callgrind output directory");
    let dir = std::fs::canonicalize(dir).expect("callgrind output directory");
    let wrapper = vec![
        "valgrind".to_string(),
        "--tool=callgrind".to_string(),
        "--instr-atstart=no".to_string(),
        format!("--callgrind-out-file={}/callgrind.%p", dir.display()),
    ];
    assert!(
        WRAP_OVERRIDE.set(wrapper).is_ok() && CALLGRIND_DIR.set(dir).is_ok(),
        "count_instructions called twice"
    );
}

/// Controller processes run under callgrind ([`count_instructions`]).
pub fn counting_instructions() -> bool {
    CALLGRIND_DIR.get().is_some()
}

/// `callgrind_control ARGS PID` (through vgdb, which interrupts the process
/// with ptrace when it sits in a system call such as epoll_wait).
async fn callgrind_control(pid: u32, args: &[&str]) {
    let limit = Duration::from_secs(120);
    let run = tokio::process::Command::new("callgrind_control")
        .args(args)
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(limit, run)
        .await
        .unwrap_or_else(|_| panic!("callgrind_control {args:?} {pid}: no answer within {limit:?}"))
        .expect("run callgrind_control (valgrind installed?)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("OK"),
        "callgrind_control {args:?} {pid}: {}\n{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The dumps callgrind wrote so far for `pid`: `callgrind.<pid>.<n>`.
fn callgrind_dumps(dir: &std::path::Path, pid: u32) -> HashSet<std::path::PathBuf> {
    let prefix = format!("callgrind.{pid}.");
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| {
                    e.file_name()
                        .to_str()
                        .is_some_and(|n| n.starts_with(&prefix))
                })
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// The event total (`totals:`, else `summary:`) of a complete callgrind dump;
/// `None` while the file is not complete (callgrind writes `totals:` last).
fn callgrind_total(path: &std::path::Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let events = text.lines().find_map(|l| l.strip_prefix("events:"))?;
    assert_eq!(
        events.split_whitespace().next(),
        Some("Ir"),
        "{path:?}: the first event is not Ir"
    );
    let totals = text.lines().find_map(|l| l.strip_prefix("totals:"))?;
    totals.split_whitespace().next()?.parse().ok()
}

/// The descendant of `wrapper` that runs `binary` (a profiler such as
/// heaptrack starts it as a child of its own shell).
async fn wrapped_process(wrapper: u32, binary: &str, limit: Duration) -> u32 {
    let binary = std::fs::canonicalize(binary).expect("controller binary path");
    let deadline = Instant::now() + limit;
    loop {
        let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
            .expect("/proc")
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                let after = &stat[stat.rfind(')')? + 2..];
                let ppid = after.split_whitespace().nth(1)?.parse().ok()?;
                Some((pid, ppid))
            })
            .collect();
        let mut descendants = vec![wrapper];
        let mut i = 0;
        while i < descendants.len() {
            let parent = descendants[i];
            descendants.extend(
                parents
                    .iter()
                    .filter(|(_, p)| *p == parent)
                    .map(|(c, _)| *c),
            );
            i += 1;
        }
        if let Some(&pid) = descendants.iter().find(|&&pid| runs_binary(pid, &binary)) {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "{binary:?} not started under {WRAP_ENV} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `pid` runs `binary`: its executable, or (under valgrind, which execs its
/// tool binary in the wrapper's own process, so /proc/PID/exe is the tool)
/// a valgrind tool whose command line holds `binary` as an argument.
fn runs_binary(pid: u32, binary: &std::path::Path) -> bool {
    let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else {
        return false;
    };
    if exe == binary {
        return true;
    }
    let valgrind_tool = exe
        .to_str()
        .is_some_and(|e| e.contains("/valgrind/") && e.ends_with("-linux"));
    valgrind_tool
        && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
            cmdline
                .split(|&b| b == 0)
                .filter_map(|arg| std::str::from_utf8(arg).ok())
                .any(|arg| std::fs::canonicalize(arg).is_ok_and(|a| a == binary))
        })
}

/// `k3s-control-plane run` against a management API server, in its own process.
pub struct ControllerProcess {
    child: tokio::process::Child,
    pub pid: u32,
    pub probes: String,
    _dir: tempfile::TempDir,
    log: std::path::PathBuf,
    /// Started under [`WRAP_ENV`]: `child` is the wrapper, `pid` the controller.
    wrapped: bool,
}

impl ControllerProcess {
    /// With the server's own (admin) kubeconfig; ready within `ready_limit`.
    pub async fn spawn(server: &TestApiServer, ready_limit: Duration) -> Self {
        Self::spawn_with(&server.kubeconfig(), &[], ready_limit).await
    }

    /// With `kubeconfig` and extra `args` (after `run --kubeconfig .. --probe-address ..`).
    pub async fn spawn_with(kubeconfig: &Kubeconfig, args: &[&str], ready_limit: Duration) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            k3s_control_plane::yaml::to_string(kubeconfig).expect("kubeconfig yaml"),
        )
        .expect("write kubeconfig");
        // A free port, so the probes can be found (the binary only logs the one it got).
        let probes = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .to_string();
        let log = dir.path().join("controller.log");
        let out = std::fs::File::create(&log).expect("log file");
        let binary = env!("CARGO_BIN_EXE_k3s-control-plane");
        let wrapper = profiler_wrapper();
        let mut command = match wrapper.split_first() {
            Some((program, wrapper_args)) => {
                let mut command = tokio::process::Command::new(program);
                command.args(wrapper_args).arg(binary);
                command
            }
            None => tokio::process::Command::new(binary),
        };
        let child = command
            .arg("run")
            .arg("--kubeconfig")
            .arg(&path)
            .arg("--probe-address")
            .arg(&probes)
            .args(args)
            .env_remove("RUST_LOG")
            .stdout(Stdio::from(out.try_clone().expect("log file")))
            .stderr(Stdio::from(out))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn k3s-control-plane run");
        let mut pid = child.id().expect("child pid");
        if !wrapper.is_empty() {
            // /proc figures and signals are the controller's, not the wrapper's.
            pid = wrapped_process(pid, binary, ready_limit).await;
        }
        let process = ControllerProcess {
            child,
            pid,
            probes,
            _dir: dir,
            log,
            wrapped: !wrapper.is_empty(),
        };
        process.wait_ready(ready_limit).await;
        process
    }

    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Every line logged so far.
    pub fn log_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Lines of the log that contain `needle`.
    pub fn log_lines_with(&self, needle: &str) -> usize {
        self.log_lines_matching(&[needle]).len()
    }

    /// The lines of the log that contain any of `needles`.
    pub fn log_lines_matching(&self, needles: &[&str]) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| needles.iter().any(|n| l.contains(n)))
            .map(str::to_string)
            .collect()
    }

    async fn wait_ready(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok((200, _)) = http_get(&self.probes, "/readyz").await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "controller not ready within {limit:?}:\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn memory(&self) -> (u64, u64) {
        memory_kib(self.pid)
    }

    pub fn cpu_ticks(&self) -> u64 {
        cpu_ticks(self.pid)
    }

    /// Every sample of /metrics without labels-free parsing: `name{labels}` -> value.
    pub async fn metrics(&self) -> BTreeMap<String, f64> {
        let (_, body) = http_get(&self.probes, "/metrics").await.expect("/metrics");
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                Some((name.to_string(), value.trim().parse().ok()?))
            })
            .collect()
    }

    /// `k3scp_reconciles_total` from /metrics.
    pub async fn reconciles(&self) -> u64 {
        let metrics = self.metrics().await;
        metrics
            .get("k3scp_reconciles_total")
            .map(|v| *v as u64)
            .unwrap_or_else(|| panic!("no k3scp_reconciles_total in /metrics: {metrics:?}"))
    }

    /// Under callgrind ([`count_instructions`]): instrumentation on and the
    /// counters zeroed; what the process executes from here on counts until
    /// [`Self::instructions_end`].
    pub async fn instructions_start(&self) {
        assert!(counting_instructions(), "not under callgrind");
        callgrind_control(self.pid, &["--instr=on"]).await;
        callgrind_control(self.pid, &["--zero"]).await;
    }

    /// Under callgrind: the instructions (Ir) executed since
    /// [`Self::instructions_start`], from a dump (waited for, with a
    /// deadline, until complete); instrumentation off again after it.
    pub async fn instructions_end(&self) -> u64 {
        let dir = CALLGRIND_DIR.get().expect("not under callgrind");
        let before = callgrind_dumps(dir, self.pid);
        callgrind_control(self.pid, &["--dump=window"]).await;
        let limit = Duration::from_secs(120);
        let deadline = Instant::now() + limit;
        let total = loop {
            let new: Vec<_> = callgrind_dumps(dir, self.pid)
                .difference(&before)
                .cloned()
                .collect();
            assert!(
                new.len() <= 1,
                "more than one new dump of {}: {new:?}",
                self.pid
            );
            if let Some(total) = new.first().and_then(|p| callgrind_total(p)) {
                break total;
            }
            assert!(
                Instant::now() < deadline,
                "no complete callgrind dump of {} in {dir:?} within {limit:?}",
                self.pid
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        callgrind_control(self.pid, &["--instr=off"]).await;
        total
    }

    /// SIGINT (the binary's shutdown signal), then wait for it to exit.
    pub async fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.pid as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        // A wrapper (profiler) may still be writing its output after the exit.
        let grace = Duration::from_secs(if self.wrapped { 300 } else { 10 });
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}
