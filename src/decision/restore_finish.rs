//! What the end of a restore clears from the KThreesControlPlane: the
//! acceptance always; the request (and its force) only while it still names
//! the snapshot restored. Pure; `controller::etcd_restore` writes it.

use std::collections::BTreeMap;

use crate::api::names::{
    ETCD_RESTORE_ACCEPTED_ANNOTATION, ETCD_RESTORE_ANNOTATION, ETCD_RESTORE_FORCE_ANNOTATION,
};

use super::etcd_restore::Attempt;

/// The annotations the finished restore `attempt` removes, given the
/// object's `annotations`. A request for another snapshot, made meanwhile,
/// stays: it is decided on its own (refused while quorum holds).
pub fn annotations_cleared(
    annotations: &BTreeMap<String, String>,
    attempt: &Attempt,
) -> Vec<&'static str> {
    let mut cleared = vec![ETCD_RESTORE_ACCEPTED_ANNOTATION];
    if annotations.get(ETCD_RESTORE_ANNOTATION).map(|s| s.trim()) == Some(attempt.snapshot.as_str())
    {
        cleared.extend([ETCD_RESTORE_ANNOTATION, ETCD_RESTORE_FORCE_ANNOTATION]);
    }
    cleared
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_restore_clears_its_acceptance_and_only_its_own_request() {
        let attempt = Attempt {
            snapshot: "capi-scheduled-cp-1-1764547200".into(),
            accepted_at: "2026-12-01T00:00:00Z".into(),
            forced: false,
            machines: vec!["m1".into()],
        };
        let all = vec![
            ETCD_RESTORE_ACCEPTED_ANNOTATION,
            ETCD_RESTORE_ANNOTATION,
            ETCD_RESTORE_FORCE_ANNOTATION,
        ];
        let cases = [
            (
                "the_request_names_the_snapshot_restored",
                Some("capi-scheduled-cp-1-1764547200"),
                all.clone(),
            ),
            (
                "the_request_names_it_with_blanks_around",
                Some(" capi-scheduled-cp-1-1764547200\n"),
                all,
            ),
            (
                "a_request_for_another_snapshot_made_meanwhile",
                Some("capi-scheduled-cp-1-1764550800"),
                vec![ETCD_RESTORE_ACCEPTED_ANNOTATION],
            ),
            (
                "the_request_already_gone",
                None,
                vec![ETCD_RESTORE_ACCEPTED_ANNOTATION],
            ),
        ];
        for (name, request, cleared) in cases {
            let annotations: BTreeMap<String, String> = request
                .map(|r| (ETCD_RESTORE_ANNOTATION.to_string(), r.to_string()))
                .into_iter()
                .collect();
            assert_eq!(
                annotations_cleared(&annotations, &attempt),
                cleared,
                "{name}"
            );
        }
    }
}
