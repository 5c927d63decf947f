//! How soon a waiting plan is looked at again, from the rule that made it
//! wait. Pure.

use std::time::Duration;

/// How soon a wait under `rule` is looked at again, `configured` being
/// `run`'s pace for waits: a leadership move under way is confirmed within
/// about a heartbeat, so soon; a new member waiting to be promoted from
/// learner (k3s's leader promotes on its 15 s tick) every second, so a
/// scale-up or rollout goes on within a second of it rather than up to a
/// whole wait later (measured: about 5.4 s of a bring-up of 3,
/// docs/bench-history.md fifth round); any other wait at the configured pace,
/// never slower.
pub fn wait_pace(configured: Duration, rule: &str) -> Duration {
    let moving = crate::remediation::steps::WaitReason::LeadershipMoving.as_str();
    let settling = crate::remediation::steps::WaitReason::EtcdSettling.as_str();
    let learner = crate::rollout::preflight::Check::EtcdLearner.as_str();
    // Settling passes within a few heartbeats (500 ms on k3s).
    if rule.ends_with(&format!(".wait.{moving}")) || rule.ends_with(&format!(".{settling}")) {
        configured.min(Duration::from_millis(250))
    } else if rule.ends_with(&format!(".{learner}")) {
        configured.min(Duration::from_secs(1))
    } else {
        configured
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_wait_is_looked_at_again_at_its_own_pace() {
        let configured = Duration::from_secs(10);
        let cases = [
            (
                "a_leadership_move_under_way",
                "remediation.wait.leadership-moving",
                250,
            ),
            (
                "a_scale_up_waiting_for_a_learner",
                "scale-up.etcd-learner",
                1000,
            ),
            (
                "a_rollout_waiting_for_a_learner",
                "rollout.etcd-learner",
                1000,
            ),
            ("a_drain", "remediation.wait.drain", 10_000),
            ("quorum_at_risk", "remediation.wait.quorum-at-risk", 10_000),
            ("a_node_not_ready", "scale-up.node-not-ready", 10_000),
        ];
        for (name, rule, millis) in cases {
            assert_eq!(
                wait_pace(configured, rule),
                Duration::from_millis(millis),
                "{name}"
            );
        }
        assert_eq!(
            wait_pace(Duration::from_millis(500), "scale-up.etcd-learner"),
            Duration::from_millis(500),
            "never slower than configured"
        );
    }
}
