//! `k3s-control-plane demo` end to end: the built binary, as a user runs it.

use std::process::Stdio;
use std::time::Duration;

use k3s_control_plane::harness::sandbox::Sandbox;
use regex::Regex;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

const BIN: &str = env!("CARGO_BIN_EXE_k3s-control-plane");
/// A bound for the whole demo run, far above its usual ~15 s, so a loaded
/// machine does not fail the test; the demo itself fails after 45 s of waiting
/// in either phase.
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

/// Indexes of the timeline lines `[  t.tts] Machine NAME: created...`, with
/// the names.
fn machines_created(lines: &[&str]) -> Vec<(usize, String)> {
    let re = Regex::new(r"^\[\s*\d+\.\d\ds\] Machine (\S+): created").unwrap();
    lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| re.captures(l).map(|c| (i, c[1].to_string())))
        .collect()
}

/// The membership table rows (`cp-...`) after `lines[from]`, up to the next
/// `quorum:` line.
fn table_rows<'a>(lines: &[&'a str], from: usize) -> Vec<&'a str> {
    lines[from..]
        .iter()
        .take_while(|l| !l.starts_with("quorum:"))
        .filter(|l| l.starts_with("cp-"))
        .copied()
        .collect()
}

fn seconds(text: &str, pattern: &str) -> f64 {
    let [t] = capture(text, pattern).try_into().unwrap();
    t.parse().unwrap()
}

#[tokio::test]
async fn demo_brings_a_control_plane_up_from_nothing_then_replaces_the_etcd_leaders_machine() {
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
    let creating = line_index(&lines, &["Creating the management objects:"]);
    assert!(real < simulated && simulated < creating);
    let said = |from: usize, to: usize, part: &str| {
        assert!(
            lines[from..to].iter().any(|l| l.contains(part)),
            "missing {part:?} between {:?} and {:?}:\n{text}",
            lines[from],
            lines[to]
        );
    };
    // The etcd it names is the one it runs (hack/setup.sh's 3.5.1 unless
    // ETCD_BIN says otherwise).
    let etcd = k3s_control_plane::harness::etcd::EtcdBinary::find().unwrap();
    said(
        real,
        simulated,
        &format!("is a real etcd {} process", etcd.version_string()),
    );
    for part in [
        "joins as a learner and is promoted",
        "TLS: mutual TLS, from the Secrets the controller generates",
        "signed by <cluster>-cca",
        "the controller: the real code",
    ] {
        said(real, simulated, part);
    }
    for part in [
        "the management API: an in-process test API",
        "Cluster API's Machine controller",
        "the infrastructure: a Machine the controller creates boots a server",
        "k3s: no k3s binary runs",
    ] {
        said(simulated, creating, part);
    }

    // The bring-up, from a control plane with no Machine and no Secret.
    let bring_up = line_index(&lines, &["Bring-up: starting the controller"]);
    let remediation = line_index(&lines, &["Remediation: marking Machine"]);
    assert!(creating < bring_up && bring_up < remediation);
    let up = &lines[bring_up..remediation];
    let timestamped = Regex::new(r"^\[\s*\d+\.\d\ds\] ").unwrap();
    // The five Secrets the controller generated, by name and owner only.
    for name in [
        "demo-ca",
        "demo-cca",
        "demo-etcd",
        "demo-token",
        "demo-kubeconfig",
    ] {
        let i = line_index(
            up,
            &[&format!(
                "] Secret {name}: created (type cluster.x-k8s.io/secret, owned by KThreesControlPlane demo-control-plane)"
            )],
        );
        assert!(timestamped.is_match(up[i]), "{}", up[i]);
    }
    capture(
        &text,
        r"Secrets generated: +demo-ca at \d+\.\d\ds, demo-cca at \d+\.\d\ds, demo-etcd at \d+\.\d\ds, demo-token at \d+\.\d\ds, demo-kubeconfig at \d+\.\d\ds",
    );
    for content in [
        "BEGIN",
        "PRIVATE KEY",
        "certificate-authority-data",
        "client-key-data",
    ] {
        assert!(
            !text.contains(content),
            "Secret content {content:?} printed"
        );
    }
    assert!(
        !Regex::new(r"\b[0-9a-f]{32,}\b").unwrap().is_match(&text),
        "something like the join token was printed:\n{text}"
    );

    // The init node alone: one Machine, until the first server's API answers.
    let [init, waited_for] = capture(
        &text,
        r"\] 1 Machine \((\S+)\), the init node, alone: ScalingUp=True: .*waiting for the first server \((\S+)\)",
    )
    .try_into()
    .unwrap();
    assert_eq!(init, waited_for);
    let boots = line_index(
        up,
        &[
            "infrastructure (simulated): ",
            &init,
            "boots the first server from the controller's Secrets",
        ],
    );
    let created = machines_created(up);
    assert_eq!(created.len(), 3, "{created:?}");
    let before_boot: Vec<&String> = created
        .iter()
        .filter(|(i, _)| *i < boots)
        .map(|(_, name)| name)
        .collect();
    assert_eq!(
        before_boot,
        vec![&init],
        "Machines created before the first server booted"
    );
    let initialized = line_index(
        up,
        &["KThreesControlPlane demo-control-plane: Initialized=True (Initialized)"],
    );
    assert!(boots < initialized);

    // Each other server joins: a learner added with the token, promoted.
    let joined_re = Regex::new(
        r"infrastructure \(simulated\): (\S+) booted in \d+\.\d\ds: k3s joined etcd with demo-token, learner (cp-\d+-[0-9a-f]{8}) added.*, promoted to voter \([1-9]\d* MemberPromote attempt\(s\)\); Node (cp-\d+) registered",
    )
    .unwrap();
    let joined: Vec<String> = up
        .iter()
        .filter_map(|l| joined_re.captures(l).map(|c| c[1].to_string()))
        .collect();
    let others: Vec<String> = created
        .iter()
        .filter(|(_, name)| *name != init)
        .map(|(_, name)| name.clone())
        .collect();
    assert_eq!(joined, others, "every later Machine joins, in order");

    // Up: 3 healthy voters, Available=True, the controller idle.
    line_index(
        up,
        &[
            "] KThreesControlPlane demo-control-plane: Available=True (Available): 3 of 3 Machines ready; etcd: 3 of 3 voters healthy",
        ],
    );
    let table = line_index(up, &["Control plane up in"]);
    let rows = table_rows(up, table);
    assert_eq!(rows.len(), 3, "{rows:#?}");
    assert!(rows.iter().all(|r| r.contains(" healthy ")), "{rows:#?}");
    for (_, machine) in &created {
        assert!(
            rows.iter().any(|r| r.contains(machine.as_str())),
            "{machine}: {rows:#?}"
        );
    }
    assert!(
        up[table..].contains(&"quorum: 3 of 3 voters healthy, quorum needs 2, fault tolerance 1"),
        "{text}"
    );
    line_index(&up[table..], &["next action: idle (rule steady)"]);

    // The bring-up figures, in order.
    let first_at = seconds(
        &text,
        &format!(
            r"first Machine: +{init} at (\d+\.\d\d)s, the only one until the first server's API answered"
        ),
    );
    let initialized_at = seconds(&text, r"initialized: +at (\d+\.\d\d)s \(Initialized=True");
    let voters_at = seconds(&text, r"3 healthy voters: +at (\d+\.\d\d)s");
    let available_at = seconds(
        &text,
        r"Available: +at (\d+\.\d\d)s: Available=True: 3 of 3 Machines ready",
    );
    assert!(first_at <= initialized_at, "{text}");
    assert!(
        initialized_at <= voters_at && initialized_at <= available_at,
        "{text}"
    );
    let summary_joined = Regex::new(r"server joined: +(\S+) as etcd member cp-\d+-[0-9a-f]{8}")
        .unwrap()
        .captures_iter(&text)
        .map(|c| c[1].to_string())
        .collect::<Vec<_>>();
    assert_eq!(summary_joined, others);

    // The remediation of the etcd leader's Machine (one of those brought up).
    let [target, member] = capture(
        &text,
        r"marking Machine (\S+) \(it runs the etcd LEADER (cp-\d+-[0-9a-f]{8})\)",
    )
    .try_into()
    .unwrap();
    assert!(created.iter().any(|(_, name)| *name == target), "{target}");

    // The timeline: leadership leaves the target before its member is removed,
    // the hook is released after, and only then is the replacement created
    // (all one Event stream, so their order is the order they happened).
    let moved = line_index(
        &lines,
        &["] EtcdLeadershipMoved: moved etcd leadership from", &member],
    );
    assert!(moved > remediation);
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
    let replacement_created = line_index(&lines, &[&format!("Machine {replacement}: created")]);
    assert!(replacement_created > remediation);
    // The same simulated infrastructure pass boots the replacement.
    let replacement_joined = lines[remediation..]
        .iter()
        .filter_map(|l| joined_re.captures(l).map(|c| c[1].to_string()))
        .collect::<Vec<_>>();
    assert_eq!(replacement_joined, vec![replacement.clone()]);
    line_index(
        &lines[remediation..],
        &[&format!(
            "infrastructure (simulated): {target}'s server is gone"
        )],
    );
    capture(
        &text,
        &format!(r"member removed: +{member} at \d+\.\d\ds .*; new leader (cp-\d+-[0-9a-f]{{8}})"),
    );
    capture(&text, &format!(r"Machine deleted: +{target} at \d+\.\d\ds"));
    capture(&text, r"healthy again: +at \d+\.\d\ds");

    // The final membership: three healthy voters, the replacement in, the
    // removed member out, nothing left to do.
    let fin = line_index(&lines, &["Final membership:"]);
    let rows = table_rows(&lines, fin);
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
        k3s_control_plane::yaml::to_string(&sandbox.management.kubeconfig()).unwrap(),
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
