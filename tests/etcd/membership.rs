//! The etcd engine against real etcd clusters (harness): snapshot, leadership
//! moves, removals, unhealthy members, learners.

use std::time::{Duration, Instant};

use k3s_control_plane::etcd::{
    EtcdCluster, EtcdError, LeaderMove, MembershipSnapshot, Removal, Timeouts, Transport,
};
use k3s_control_plane::harness::EtcdTestCluster;
use k3s_control_plane::quorum::Blocker;

fn init() {
    k3s_control_plane::install_crypto_provider();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

async fn cluster(n: usize) -> EtcdTestCluster {
    init();
    EtcdTestCluster::start(n).await.expect("start etcd cluster")
}

/// Index (in the harness) of the current leader.
async fn leader_index(c: &EtcdTestCluster, etcd: &EtcdCluster) -> usize {
    let snap = etcd.snapshot().await.unwrap();
    c.index_of(snap.leader.expect("a leader")).unwrap()
}

#[tokio::test]
async fn snapshot_of_a_three_member_cluster() {
    let c = cluster(3).await;
    let etcd = c.connect();
    let snap = etcd.snapshot().await.unwrap();
    assert_eq!(snap.members.len(), 3);
    assert_ne!(snap.cluster_id, 0);
    let leader = snap.leader.expect("leader");
    for (i, m) in c.members().iter().enumerate() {
        let got = snap
            .member(m.id)
            .unwrap_or_else(|| panic!("member {i} listed"));
        assert_eq!(got.name, m.name);
        assert!(got.name.starts_with(&format!("{}-", m.node_name)));
        assert_eq!(got.client_urls, vec![m.client_url()]);
        assert_eq!(got.peer_urls, vec![m.peer_url()]);
        assert!(!got.learner);
        assert!(got.is_healthy(), "{:?}", got.probe_error);
        let status = got.status.as_ref().unwrap();
        assert_eq!(
            status.leader, leader,
            "every member follows the same leader"
        );
        assert!(status.version.starts_with("3."));
        assert!(got.alarms.is_empty());
    }
    let q = snap.assess_cluster();
    assert_eq!(
        (q.voters, q.healthy, q.size, q.fault_tolerance),
        (3, 3, 2, 1)
    );
    let views = snap.member_views();
    assert_eq!(views.len(), 3);
    assert!(views.iter().all(|v| v.probe_error.is_none()));
}

/// The members are the etcd the harness names (its `--version`), run with
/// k3s's settings: metrics on the loopback-only `:2381` (k3s: `127.0.0.1`),
/// and, where the binary has the flag (etcd 3.5.x later than 3.5.1, 3.6), the
/// plain HTTP client listener on `:2382`.
#[tokio::test]
async fn members_are_the_named_etcd_with_k3s_listeners() {
    use k3s_control_plane::harness::etcd::EtcdBinary;
    let binary = EtcdBinary::find().unwrap();
    eprintln!(
        "etcd under test: {} ({})",
        binary.version_string(),
        binary.path.display()
    );
    let c = cluster(3).await;
    let snap = c.connect().snapshot().await.unwrap();
    for m in c.members() {
        let status = snap.member(m.id).and_then(|s| s.status.clone()).unwrap();
        assert_eq!(status.version, binary.version_string(), "{}", m.name);
        let metrics = http_get(m.loopback_ip(), 2381, "/metrics").await;
        assert!(
            metrics.contains("etcd_server_has_leader 1"),
            "{}: metrics on the loopback-only listener:\n{}",
            m.name,
            &metrics[..metrics.len().min(400)]
        );
        if binary.offers("--listen-client-http-urls") {
            let health = http_get(m.loopback_ip(), 2382, "/health").await;
            assert!(
                health.contains("\"health\":\"true\""),
                "{}: {health}",
                m.name
            );
        }
    }
}

/// A plain HTTP/1.0 GET (the loopback-only listeners speak no TLS).
async fn http_get(ip: std::net::Ipv4Addr, port: u16, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect((ip, port))
        .await
        .unwrap_or_else(|e| panic!("connect {ip}:{port}: {e}"));
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).await.unwrap();
    body
}

/// A version difference the controller must not depend on, in the shape of
/// Cluster API issue #10125 (five servers, two dead, the first one's member
/// removed): with the second dead voter still a member, etcd 3.4.23 and
/// 3.5.1 refuse even a learner's `MemberAdd` ("unhealthy cluster"), while
/// the 3.6.13 we ran (OpenShift's build) accepts the learner and it starts.
/// (With three members and one dead, 3.6.13 refuses too.) The remediation
/// rule never waits on a join while a dead voter is the target (the #10125
/// table case in decide::remediation), whichever way etcd answers.
#[tokio::test]
async fn a_learner_beside_a_dead_voter_is_refused_before_etcd_3_6_and_accepted_on_it() {
    use k3s_control_plane::harness::etcd::EtcdBinary;
    let version = EtcdBinary::find().unwrap().version;
    let mut c = EtcdTestCluster::builder()
        .members(5)
        .ready_timeout(Duration::from_secs(8))
        .start()
        .await
        .unwrap();
    let admin = c.connect();
    let leader = admin.snapshot().await.unwrap().leader.unwrap();
    let dead: Vec<usize> = (0..5)
        .rev()
        .filter(|i| c.member(*i).id != leader)
        .take(2)
        .collect();
    for i in &dead {
        c.kill(*i).unwrap();
    }
    admin.remove_member(c.member(dead[0]).id).await.unwrap();
    // etcd's 5 s health interval: the dead voter counts as disconnected.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let added = c.add_learner().await;
    if version >= (3, 6, 0) {
        let index = added.expect("etcd 3.6 accepts a learner beside a dead voter");
        let snap = c.connect().snapshot().await.unwrap();
        let learner = snap.member(c.member(index).id).expect("listed");
        assert!(learner.learner && learner.status.is_some(), "{learner:?}");
    } else {
        let err = added
            .expect_err("etcd before 3.6 refuses the learner")
            .to_string();
        assert!(err.contains("unhealthy cluster"), "{err}");
    }
}

#[tokio::test]
async fn leadership_moves_to_the_chosen_member() {
    let c = cluster(3).await;
    let etcd = c.connect();
    let from = leader_index(&c, &etcd).await;
    let to = (from + 1) % 3;
    let moved = etcd
        .move_leader_off(c.member(from).id, Some(c.member(to).id))
        .await
        .unwrap();
    assert!(
        matches!(&moved, LeaderMove::Moved { from: f, to: t, .. } if *f == c.member(from).name && *t == c.member(to).name),
        "{moved:?}"
    );
    let snap = etcd.snapshot().await.unwrap();
    assert_eq!(snap.leader, Some(c.member(to).id));
    // Idempotent: the old leader no longer leads, so moving off it is a no-op.
    let again = etcd.move_leader_off(c.member(from).id, None).await.unwrap();
    assert!(matches!(again, LeaderMove::NotLeader { .. }), "{again:?}");
    // A learner or the target itself cannot take over.
    let err = etcd
        .move_leader_off(c.member(to).id, Some(c.member(to).id))
        .await
        .unwrap_err();
    assert!(matches!(err, EtcdError::InvalidTransferee { .. }), "{err}");
}

#[tokio::test]
async fn removing_a_follower_then_again_is_idempotent() {
    let mut c = cluster(3).await;
    let etcd = c.connect();
    let leader = leader_index(&c, &etcd).await;
    let follower = (leader + 1) % 3;
    let id = c.member(follower).id;
    let outcome = etcd.safe_remove(id).await.unwrap();
    assert!(outcome.assessment.is_safe());
    assert_eq!(
        outcome.leader_move, None,
        "a follower needs no leadership move"
    );
    assert!(
        matches!(outcome.removal, Removal::Removed { .. }),
        "{outcome:?}"
    );
    let snap = etcd.snapshot().await.unwrap();
    assert_eq!(snap.members.len(), 2);
    assert!(snap.member(id).is_none());
    c.wait_exited(follower, Duration::from_secs(15))
        .await
        .unwrap();

    // Removing it again is success, not an error, both ways.
    let again = etcd.remove_member(id).await.unwrap();
    assert!(matches!(again, Removal::AlreadyGone { .. }), "{again:?}");
    let again = etcd.safe_remove(id).await.unwrap();
    assert!(matches!(again.removal, Removal::AlreadyGone { .. }));
}

#[tokio::test]
async fn removing_the_leader_moves_leadership_first() {
    let c = cluster(3).await;
    let etcd = c.connect();
    let leader = leader_index(&c, &etcd).await;
    let id = c.member(leader).id;
    let outcome = etcd.safe_remove(id).await.unwrap();
    assert!(
        matches!(outcome.leader_move, Some(LeaderMove::Moved { .. })),
        "{outcome:?}"
    );
    assert!(matches!(outcome.removal, Removal::Removed { .. }));
    let snap = etcd.snapshot().await.unwrap();
    assert_eq!(snap.members.len(), 2);
    let new_leader = snap.leader.expect("a leader remains");
    assert_ne!(new_leader, id);
    assert!(snap.members.iter().all(|m| m.is_healthy()));
}

#[tokio::test]
async fn a_stopped_member_blocks_removing_a_healthy_one_but_can_itself_be_removed() {
    let mut c = cluster(3).await;
    let etcd = c.connect();
    let leader = leader_index(&c, &etcd).await;
    let stopped = (leader + 1) % 3;
    let healthy = (leader + 2) % 3;
    c.stop(stopped).await.unwrap();

    let snap = etcd.snapshot().await.unwrap();
    let down = snap.member(c.member(stopped).id).unwrap();
    assert!(!down.is_healthy());
    assert!(
        down.probe_error.as_deref().unwrap().contains("unreachable"),
        "{:?}",
        down.probe_error
    );

    let err = etcd.safe_remove(c.member(healthy).id).await.unwrap_err();
    let EtcdError::UnsafeRemoval { assessment } = &err else {
        panic!("expected a refusal, got {err}");
    };
    assert_eq!(
        (assessment.voters, assessment.healthy, assessment.size),
        (2, 1, 2)
    );
    assert!(
        err.to_string()
            .contains("would leave 1 of 2 voters healthy, quorum needs 2"),
        "{err}"
    );
    assert_eq!(
        etcd.snapshot().await.unwrap().members.len(),
        3,
        "nothing removed"
    );

    let outcome = etcd.safe_remove(c.member(stopped).id).await.unwrap();
    assert!(
        matches!(outcome.removal, Removal::Removed { .. }),
        "{outcome:?}"
    );
    assert_eq!(etcd.snapshot().await.unwrap().members.len(), 2);
}

/// The removal steps decide on a snapshot some milliseconds old; the act
/// checks again on a snapshot taken when it runs, sends MemberRemove to the
/// member the decision chose, and moves leadership off a target that leads
/// again.
#[tokio::test]
async fn a_planned_removal_is_checked_again_when_carried_out_and_sent_where_planned() {
    let mut c = cluster(3).await;
    let etcd = c.connect();
    let leader = leader_index(&c, &etcd).await;
    let (a, b) = ((leader + 1) % 3, (leader + 2) % 3);

    // Planned while all three were healthy; one of the stayers stopped since.
    c.stop(b).await.unwrap();
    let err = etcd
        .safe_remove_via(c.member(a).id, c.member(leader).id)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, EtcdError::UnsafeRemoval { .. }),
        "expected a refusal at act time, got {err}"
    );
    assert!(
        err.to_string()
            .contains("would leave 1 of 2 voters healthy, quorum needs 2"),
        "{err}"
    );
    assert_eq!(etcd.snapshot().await.unwrap().members.len(), 3);
    c.restart(b).await.unwrap();
    poll_snapshot(
        &etcd,
        "every member healthy again",
        Duration::from_secs(30),
        |s: &MembershipSnapshot| match s.members.iter().find(|m| !m.is_healthy()) {
            None => Ok(()),
            Some(m) => Err(format!("{} unhealthy", m.name)),
        },
    )
    .await;

    // Sent to the member the plan chose, not the first in list order.
    let leader = leader_index(&c, &etcd).await;
    let follower = (leader + 1) % 3;
    let via = (leader + 2) % 3;
    let done = etcd
        .safe_remove_via(c.member(follower).id, c.member(via).id)
        .await
        .unwrap();
    match &done.removal {
        Removal::Removed { via: asked, .. } => assert_eq!(asked, &c.member(via).name),
        other => panic!("{other:?}"),
    }
    assert!(done.leader_move.is_none(), "a follower: no move");

    // The target leads (again) at act time: leadership moves off it first.
    let snap = etcd.snapshot().await.unwrap();
    let leader_id = snap.leader.expect("a leader");
    let other = snap.members.iter().find(|m| m.id != leader_id).unwrap().id;
    let done = etcd.safe_remove_via(leader_id, other).await.unwrap();
    assert!(
        matches!(done.leader_move, Some(LeaderMove::Moved { .. })),
        "{done:?}"
    );
    let after = etcd.snapshot().await.unwrap();
    assert_eq!(after.members.len(), 1);
    assert_ne!(after.leader, Some(leader_id));
}

#[tokio::test]
async fn a_paused_member_is_unhealthy_within_the_probe_timeout() {
    let c = cluster(3).await;
    // The call timeout is far longer than the probe timeout: a snapshot that
    // finishes well under it proves the paused member was given up on after
    // the probe timeout, not after a call timeout (or never).
    let probe = Duration::from_secs(1);
    let call = Duration::from_secs(30);
    let leader = leader_index(&c, &c.connect()).await;
    let paused = (leader + 1) % 3;
    // The first seed is the paused member: listing must move on quickly too.
    let mut seeds = c.endpoints();
    seeds.rotate_left(paused);
    let etcd = EtcdCluster::with_options(
        &seeds,
        c.client_tls(),
        Transport::Direct,
        Timeouts {
            probe,
            call,
            ..Timeouts::default()
        },
    )
    .unwrap();
    c.pause(paused).unwrap();
    let started = Instant::now();
    let snap = etcd.snapshot().await.unwrap();
    let took = started.elapsed();
    c.resume(paused).unwrap();
    let m = snap.member(c.member(paused).id).unwrap();
    assert!(!m.is_healthy());
    assert!(
        m.probe_error
            .as_deref()
            .unwrap()
            .contains("timed out after 1s"),
        "{:?}",
        m.probe_error
    );
    assert!(took < call / 3, "snapshot took {took:?}");
    assert_eq!(snap.assess_cluster().healthy, 2);
}

#[tokio::test]
async fn five_members_one_down_is_safe_two_down_is_not() {
    let mut c = cluster(5).await;
    let etcd = c.connect();
    let leader = leader_index(&c, &etcd).await;
    let others: Vec<usize> = (0..5).filter(|i| *i != leader).collect();
    c.kill(others[0]).unwrap();
    let target = c.member(others[2]).id;

    let snap = etcd.snapshot().await.unwrap();
    let one_down = snap.assess_removal(target);
    assert!(one_down.is_safe(), "{one_down}");
    assert_eq!(
        (one_down.voters, one_down.healthy, one_down.size),
        (4, 3, 3)
    );

    c.kill(others[1]).unwrap();
    let err = etcd.safe_remove(target).await.unwrap_err();
    let EtcdError::UnsafeRemoval { assessment } = &err else {
        panic!("expected a refusal, got {err}");
    };
    assert_eq!(
        (assessment.voters, assessment.healthy, assessment.size),
        (4, 2, 3)
    );
    assert_eq!(assessment.unhealthy.len(), 2);
}

#[tokio::test]
async fn a_learner_makes_removal_unsafe() {
    init();
    let c = EtcdTestCluster::builder()
        .members(3)
        .learners(1)
        .start()
        .await
        .expect("start cluster with a learner");
    let etcd = c.connect();
    let snap = etcd.snapshot().await.unwrap();
    assert_eq!(snap.members.len(), 4);
    let learner = snap.member(c.member(3).id).unwrap();
    assert!(learner.learner);
    let leader = snap.leader.unwrap();
    let follower = snap
        .members
        .iter()
        .find(|m| !m.learner && m.id != leader)
        .unwrap();
    let err = etcd.safe_remove(follower.id).await.unwrap_err();
    let EtcdError::UnsafeRemoval { assessment } = &err else {
        panic!("expected a refusal, got {err}");
    };
    assert!(
        assessment.blockers.iter().any(
            |b| matches!(b, Blocker::LearnerPresent { member } if *member == c.member(3).name)
        ),
        "{assessment}"
    );
    assert!(
        err.to_string().contains("has not been promoted yet"),
        "{err}"
    );
    // The learner is never chosen to lead.
    assert_ne!(snap.choose_transferee(leader).unwrap().id, learner.id);
}

#[tokio::test]
async fn a_stopped_member_is_healthy_again_after_restart() {
    let mut c = cluster(3).await;
    let etcd = c.connect();
    let leader = leader_index(&c, &etcd).await;
    let member = (leader + 1) % 3;
    c.stop(member).await.unwrap();
    let snap = etcd.snapshot().await.unwrap();
    assert!(!snap.member(c.member(member).id).unwrap().is_healthy());
    assert_eq!(snap.assess_cluster().healthy, 2);

    c.restart(member).await.unwrap();
    let snap = etcd.snapshot().await.unwrap();
    assert!(snap.members.iter().all(|m| m.is_healthy()), "{snap:?}");
    assert_eq!(snap.assess_cluster().fault_tolerance, 1);
}

/// `MemberPromote` as k3s sends it, retried while etcd says the learner is not
/// in sync yet.
async fn promote(c: &EtcdTestCluster, id: u64) {
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(c.ca_pem()))
        .identity(etcd_client::Identity::from_pem(
            c.pki.client.cert_pem.clone(),
            c.pki.client.key_pem.clone(),
        ));
    let options = etcd_client::ConnectOptions::new()
        .with_tls(tls)
        .with_timeout(Duration::from_secs(3));
    let mut client = etcd_client::Client::connect([c.member(0).client_url()], Some(options))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client.member_promote(id).await {
            Ok(_) => return,
            Err(err) if Instant::now() < deadline => {
                tracing::debug!(%err, "promote retried");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(err) => panic!("promote {id:016x}: {err}"),
        }
    }
}

/// A cluster grown from one member by learners promoted outside the harness
/// (as k3s and the simulated infrastructure do) takes a new learner once its
/// first member is gone: the member receiving `MemberAdd` is chosen from the
/// live membership, not from learner flags cached before the promotions.
#[tokio::test]
async fn learners_promoted_elsewhere_receive_the_next_member_add_once_the_first_is_gone() {
    init();
    let mut c = EtcdTestCluster::builder()
        .members(1)
        .start()
        .await
        .expect("start a one-member cluster");
    for expected in 1..=2 {
        let index = c.add_learner().await.unwrap();
        assert_eq!(index, expected);
        promote(&c, c.member(index).id).await;
    }
    let etcd = c.connect();
    let outcome = etcd.safe_remove(c.member(0).id).await.unwrap();
    assert!(
        matches!(outcome.removal, Removal::Removed { .. }),
        "{outcome:?}"
    );
    c.stop(0).await.unwrap();

    let index = c
        .add_learner()
        .await
        .expect("a promoted member receives MemberAdd");
    let snap = etcd.snapshot().await.unwrap();
    assert_eq!(snap.members.len(), 3, "{snap:?}");
    assert!(snap.member(c.member(index).id).unwrap().learner);
    for voter in [1, 2] {
        assert!(!snap.member(c.member(voter).id).unwrap().learner);
    }
}

/// Poll `etcd`'s snapshot until `done` accepts one; panic with the last
/// reason once `limit` has passed. Returns the snapshot and when it was taken.
async fn poll_snapshot(
    etcd: &EtcdCluster,
    what: &str,
    limit: Duration,
    done: impl Fn(&MembershipSnapshot) -> Result<(), String>,
) -> MembershipSnapshot {
    let deadline = Instant::now() + limit;
    loop {
        let last = match etcd.snapshot().await {
            Ok(snap) => match done(&snap) {
                Ok(()) => return snap,
                Err(why) => why,
            },
            Err(err) => err.to_string(),
        };
        assert!(
            Instant::now() < deadline,
            "{what} within {limit:?}; last: {last}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn partitionable_cluster(n: usize) -> EtcdTestCluster {
    init();
    EtcdTestCluster::builder()
        .members(n)
        .partitionable()
        .start()
        .await
        .expect("start a partitionable etcd cluster")
}

fn healthy(snap: &MembershipSnapshot, id: u64) -> bool {
    snap.member(id).is_some_and(|m| m.is_healthy())
}

#[tokio::test]
async fn a_partitioned_follower_is_unhealthy_until_healed() {
    let c = partitionable_cluster(3).await;
    let etcd = c.connect();
    let leader = leader_index(&c, &etcd).await;
    // Member 0 is the first seed: the snapshot must not trust its list either.
    let follower = if leader == 0 { 1 } else { 0 };
    let id = c.member(follower).id;

    let cut = Instant::now();
    c.isolate(follower).unwrap();
    let snap = poll_snapshot(
        &etcd,
        "partitioned follower unhealthy",
        Duration::from_secs(10),
        |s| {
            if healthy(s, id) {
                Err("still counted healthy".into())
            } else {
                Ok(())
            }
        },
    )
    .await;
    eprintln!(
        "partitioned follower counted unhealthy after {:?}",
        cut.elapsed()
    );
    let m = snap.member(id).unwrap();
    assert!(m.status.is_some(), "it is alive and answers Status: {m:?}");
    let reason = m.unhealthy_reason().unwrap();
    assert!(
        reason.contains("cannot serve a linearizable read"),
        "{reason}"
    );
    assert_eq!(snap.leader, Some(c.member(leader).id), "the leader stays");
    let q = snap.assess_cluster();
    assert_eq!((q.voters, q.healthy, q.size), (3, 2, 2));
    assert!(q.has_quorum());
    assert_ne!(
        snap.listed_by,
        c.member(follower).client_url(),
        "listed by a healthy member"
    );
    // Removing a healthy member now would lose quorum: refused.
    let other = (0..3).find(|i| *i != leader && *i != follower).unwrap();
    let err = etcd.safe_remove(c.member(other).id).await.unwrap_err();
    assert!(matches!(err, EtcdError::UnsafeRemoval { .. }), "{err}");

    let healed = Instant::now();
    c.heal(follower).unwrap();
    poll_snapshot(
        &etcd,
        "healed follower healthy",
        Duration::from_secs(15),
        |s| {
            if s.members.iter().all(|m| m.is_healthy()) {
                Ok(())
            } else {
                Err(format!("{:?}", s.member(id).unwrap().unhealthy_reason()))
            }
        },
    )
    .await;
    eprintln!("healed follower healthy again after {:?}", healed.elapsed());
}

#[tokio::test]
async fn a_partitioned_leader_is_replaced_and_counted_unhealthy() {
    let c = partitionable_cluster(3).await;
    let etcd = c.connect();
    let old = leader_index(&c, &etcd).await;
    let old_id = c.member(old).id;

    let cut = Instant::now();
    c.isolate(old).unwrap();
    // It still believes it leads, but cannot confirm it with a quorum.
    poll_snapshot(
        &etcd,
        "the partitioned leader unhealthy",
        Duration::from_secs(10),
        |s| {
            if healthy(s, old_id) {
                Err("still counted healthy".into())
            } else {
                Ok(())
            }
        },
    )
    .await;
    eprintln!(
        "partitioned leader counted unhealthy after {:?}",
        cut.elapsed()
    );
    let snap = poll_snapshot(
        &etcd,
        "a new leader, the old one unhealthy",
        Duration::from_secs(20),
        |s| match s.leader {
            Some(id) if id != old_id && !healthy(s, old_id) && s.assess_cluster().healthy == 2 => {
                Ok(())
            }
            leader => Err(format!(
                "leader {leader:?}, old leader {:?}",
                s.member(old_id).and_then(|m| m.unhealthy_reason())
            )),
        },
    )
    .await;
    eprintln!(
        "partitioned leader replaced and counted unhealthy after {:?}",
        cut.elapsed()
    );
    let m = snap.member(old_id).unwrap();
    let status = m
        .status
        .as_ref()
        .expect("the old leader is alive and answers Status");
    let new_term = snap
        .leader_member()
        .unwrap()
        .status
        .as_ref()
        .unwrap()
        .raft_term;
    assert!(
        status.raft_term < new_term || status.leader != snap.leader.unwrap(),
        "{status:?}"
    );
    assert!(snap.assess_cluster().has_quorum());

    c.heal(old).unwrap();
    poll_snapshot(
        &etcd,
        "old leader healthy again",
        Duration::from_secs(20),
        |s| {
            if s.members.iter().all(|m| m.is_healthy()) {
                Ok(())
            } else {
                Err(format!(
                    "{:?}",
                    s.member(old_id).unwrap().unhealthy_reason()
                ))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn with_two_of_three_down_quorum_is_lost_and_said_fast() {
    let mut c = cluster(3).await;
    let etcd = c.connect();
    let leader = leader_index(&c, &etcd).await;
    // The leader goes too: the survivor must not be trusted for believing it
    // still follows someone.
    let survivor = (leader + 1) % 3;
    let down = (leader + 2) % 3;
    c.stop(down).await.unwrap();
    c.stop(leader).await.unwrap();

    let started = Instant::now();
    let snap = tokio::time::timeout(Duration::from_secs(10), etcd.snapshot())
        .await
        .expect("snapshot within 10 s")
        .unwrap();
    eprintln!("snapshot without quorum took {:?}", started.elapsed());
    let alive = snap.member(c.member(survivor).id).unwrap();
    assert!(alive.status.is_some(), "the survivor answers Status");
    assert!(!alive.is_healthy(), "but has no quorum: {alive:?}");
    assert_eq!(snap.leader, None, "no healthy voter follows a leader");
    let q = snap.assess_cluster();
    assert_eq!(
        (q.voters, q.healthy, q.size),
        (3, 0, 2),
        "the survivor does not count"
    );
    assert!(!q.has_quorum());

    // Removal and leadership moves say quorum is lost, not that alarms are unknown.
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(10), etcd.safe_remove(c.member(down).id))
        .await
        .expect("refused within 10 s")
        .unwrap_err();
    eprintln!(
        "safe_remove without quorum refused after {:?}",
        started.elapsed()
    );
    assert!(matches!(err, EtcdError::QuorumLost { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("quorum lost: 0 of 3 voters healthy, quorum needs 2; unhealthy: "),
        "{err}"
    );
    let err = tokio::time::timeout(
        Duration::from_secs(10),
        etcd.move_leader_off(c.member(survivor).id, None),
    )
    .await
    .expect("refused within 10 s")
    .unwrap_err();
    assert!(matches!(err, EtcdError::QuorumLost { .. }), "{err}");
}

/// docs/k3s.md E5 and T3: the harness bootstraps as k3s does (the first
/// member alone, with etcd's default cluster token; the others added as
/// learners and promoted), so a first server whose member was removed and
/// which restarts alone on its old address, from an empty data dir, comes
/// back with the same cluster id as the real cluster and the removed
/// member's id: etcd derives a bootstrapping member's id from its peer URLs
/// and the cluster token, and the cluster id from the ids of the members it
/// bootstrapped with. Nothing but the member list tells the two apart.
#[tokio::test]
async fn the_first_server_restarted_alone_shares_the_cluster_id_and_its_old_member_id() {
    init();
    let started = Instant::now();
    let mut c = EtcdTestCluster::start(3).await.expect("start etcd cluster");
    println!("start-up of 3 members: {:?}", started.elapsed());
    let voters: Vec<bool> = c.members().iter().map(|m| m.learner).collect();
    assert_eq!(voters, vec![false; 3], "every member promoted");
    let etcd = c.connect();
    let real = etcd.snapshot().await.unwrap();
    let old_id = c.member(0).id;
    etcd.safe_remove(old_id).await.unwrap();
    c.wait_exited(0, Duration::from_secs(30)).await.unwrap();

    let rogue_name = c.restart_as_new_cluster(0).await.unwrap();
    let rogue = EtcdCluster::with_options(
        &[c.member(0).client_url()],
        c.client_tls(),
        c.transport(),
        Timeouts::default(),
    )
    .unwrap()
    .snapshot()
    .await
    .unwrap();
    assert_eq!(
        rogue.cluster_id, real.cluster_id,
        "the rogue shares the real cluster's id"
    );
    let ids: Vec<(u64, &str)> = rogue
        .members
        .iter()
        .map(|m| (m.id, m.name.as_str()))
        .collect();
    assert_eq!(
        ids,
        vec![(old_id, rogue_name.as_str())],
        "one member, with the removed member's id under a new name"
    );
    // The real cluster, reached through its remaining members, is still
    // there with the same id and without the removed member.
    let others: Vec<String> = (1..3).map(|i| c.member(i).client_url()).collect();
    let still =
        EtcdCluster::with_options(&others, c.client_tls(), c.transport(), Timeouts::default())
            .unwrap()
            .snapshot()
            .await
            .unwrap();
    assert_eq!(still.cluster_id, real.cluster_id);
    assert_eq!(still.members.len(), 2);
    assert!(still.member(old_id).is_none());
}
