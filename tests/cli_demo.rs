//! `k3s-control-plane demo` end to end: the built binary, as a user runs it.

use std::process::Stdio;
use std::time::Duration;

use k3s_control_plane::harness::sandbox::Sandbox;
use regex::Regex;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

const BIN: &str = env!("CARGO_BIN_EXE_k3s-control-plane");
/// A bound for the whole demo run, far above its usual ~10 s, so a loaded
/// machine does not fail the test; the demo itself fails after 45 s of waiting.
const RUN_LIMIT: Duration = Duration::from_secs(120);

fn capture(text: &str, pattern: &str) -> Vec<String> {
    let re = Regex::new(pattern).unwrap();
    let caps = re
        .captures(text)
        .unwrap_or_else(|| panic!("no line matches {pattern:?} in:\n{text}"));
    caps.iter()
        .skip(1)
        .map(|c| c.map(|m| m.as_str().to_string()).unwrap_or_default())
        .collect()
}

/// Index of the first line containing all of `parts`.
fn line_index(lines: &[&str], parts: &[&str]) -> usize {
    lines
        .iter()
        .position(|l| parts.iter().all(|p| l.contains(p)))
        .unwrap_or_else(|| panic!("no line with {parts:?} in:\n{}", lines.join("\n")))
}

/// Processes whose command line mentions `needle` (e.g. an etcd data dir).
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(needle) {
                found.push(cmdline);
            }
        }
    }
    found
}

#[tokio::test]
async fn demo_replaces_the_etcd_leaders_machine_and_ends_with_a_healthy_cluster() {
    let run = tokio::process::Command::new(BIN)
        .arg("demo")
        .env_remove("RUST_LOG")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(RUN_LIMIT, run)
        .await
        .expect("the demo finishes")
        .expect("run the binary");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "demo failed: {err}\n{text}");
    let lines: Vec<&str> = text.lines().collect();

    // It says what is real and what is simulated, first.
    let real = line_index(&lines, &["What is real:"]);
    let simulated = line_index(&lines, &["What is simulated:"]);
    assert!(real < simulated);
    for part in [
        "3 real etcd 3.4 processes, mutual TLS",
        "the controller: the real code",
        "in-process test API",
        "Cluster API's Machine controller",
        "machines' infrastructure",
    ] {
        assert!(text.contains(part), "missing {part:?}:\n{text}");
    }

    let [target, member] = capture(
        &text,
        r"Marking Machine (\S+) \(it runs the etcd LEADER (cp-\d+-[0-9a-f]{8})\)",
    )
    .try_into()
    .unwrap();

    // The timeline: leadership leaves the target before its member is removed,
    // the hook is released after, and only then is the replacement created
    // (all one Event stream, so their order is the order they happened).
    let moved = line_index(
        &lines,
        &["] EtcdLeadershipMoved: moved etcd leadership from", &member],
    );
    let [new_leader] = capture(
        lines[moved],
        &format!(r"from {member} to (cp-\d+-[0-9a-f]{{8}}) \(removing {target}\)"),
    )
    .try_into()
    .unwrap();
    assert_ne!(new_leader, member, "leadership must go elsewhere");
    let removed = line_index(
        &lines,
        &["] EtcdMemberRemoved: removed etcd member", &member],
    );
    let released = line_index(&lines, &["] PreTerminateHookReleased:", &target]);
    let replacement_event = line_index(&lines, &["] ReplacementCreated: created Machine"]);
    assert!(moved < removed && removed < released && released < replacement_event);
    let timestamped = Regex::new(r"^\[\s*\d+\.\d\ds\] ").unwrap();
    assert!(timestamped.is_match(lines[moved]), "{}", lines[moved]);
    line_index(&lines, &[&format!("Machine {target}: deleted")]);

    // The summary.
    let [replacement] = capture(
        &text,
        &format!(r"Machine replaced: +{target} -> (\S+), created at \d+\.\d\ds"),
    )
    .try_into()
    .unwrap();
    assert_ne!(replacement, target);
    line_index(&lines, &[&format!("Machine {replacement}: created")]);
    capture(
        &text,
        &format!(r"member removed: +{member} at \d+\.\d\ds .*; new leader (cp-\d+-[0-9a-f]{{8}})"),
    );
    capture(&text, &format!(r"Machine deleted: +{target} at \d+\.\d\ds"));
    capture(&text, r"healthy again: +at \d+\.\d\ds");

    // The final membership: three healthy voters, the replacement in, the
    // removed member out, nothing left to do.
    let fin = line_index(&lines, &["Final membership:"]);
    let rows: Vec<&str> = lines[fin..]
        .iter()
        .filter(|l| l.starts_with("cp-"))
        .copied()
        .collect();
    assert_eq!(rows.len(), 3, "{rows:#?}");
    assert!(rows.iter().all(|r| r.contains("healthy")));
    assert!(rows.iter().any(|r| r.contains(&replacement)));
    assert!(!rows.iter().any(|r| r.contains(&member)));
    assert_eq!(rows.iter().filter(|r| r.contains(" leader ")).count(), 1);
    assert!(
        lines[fin..].contains(&"quorum: 3 of 3 voters healthy, quorum needs 2, fault tolerance 1"),
        "{text}"
    );
    line_index(&lines[fin..], &["next action: idle (rule steady)"]);

    // Cleaned up: no etcd process of this run is left, its files are gone.
    let [dir] = capture(&text, r"etcd data and certificates: (\S+)")
        .try_into()
        .unwrap();
    assert!(!std::path::Path::new(&dir).exists(), "{dir} left behind");
    assert_eq!(processes_mentioning(&dir), Vec::<String>::new());
}

#[tokio::test]
async fn demo_without_etcd_says_how_to_install_it() {
    let out = tokio::process::Command::new(BIN)
        .arg("demo")
        .env("ETCD_BIN", "/nonexistent/etcd")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("etcd binary not found"), "{err}");
    assert!(err.contains("hack/setup.sh"), "{err}");
}

/// Lines of a child's stdout, as they come.
fn lines_of(stdout: tokio::process::ChildStdout) -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

async fn wait_line(
    rx: &mut mpsc::UnboundedReceiver<String>,
    seen: &mut Vec<String>,
    parts: &[&str],
) {
    let found = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = rx.recv().await {
            let hit = parts.iter().all(|p| line.contains(p));
            seen.push(line);
            if hit {
                return true;
            }
        }
        false
    })
    .await;
    assert!(
        matches!(found, Ok(true)),
        "no line with {parts:?}; output so far:\n{}",
        seen.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_against_a_management_cluster_runs_the_controller_until_interrupted() {
    // A management cluster with the objects and CRDs in place (the sandbox),
    // and no controller: the demo process is the controller.
    let sandbox = Sandbox::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("management.yaml");
    std::fs::write(
        &kubeconfig,
        serde_yaml::to_string(&sandbox.management.kubeconfig()).unwrap(),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(BIN)
        .arg("demo")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        // The controller's own warnings (e.g. a retried 409) are not the
        // subject here; keep the test output clean.
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut rx = lines_of(child.stdout.take().unwrap());
    let mut seen = Vec::new();
    wait_line(&mut rx, &mut seen, &["default/demo-control-plane"]).await;
    wait_line(&mut rx, &mut seen, &["Controller running"]).await;

    let admin = sandbox.etcd.connect();
    let leader = admin.snapshot().await.unwrap().leader.unwrap();
    let index = sandbox.etcd.index_of(leader).unwrap();
    let member = sandbox.etcd.member(index).name.clone();
    sandbox
        .mark_unhealthy(&sandbox.machines[index])
        .await
        .unwrap();
    wait_line(&mut rx, &mut seen, &["EtcdLeadershipMoved", &member]).await;
    wait_line(&mut rx, &mut seen, &["EtcdMemberRemoved", &member]).await;
    assert!(
        admin
            .snapshot()
            .await
            .unwrap()
            .member_by_name(&member)
            .is_none()
    );

    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    wait_line(&mut rx, &mut seen, &["Stopped."]).await;
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the demo stops on Ctrl-C")
        .unwrap();
    assert!(status.success(), "{status}");
}
