//! `spec.version` against the versions the Machines run. The CRD's transition
//! rule sees only the old and new object; the controller must not trust that
//! the installed CRD carries it, nor that the last accepted version is what
//! runs (a rollout may be half done). So on every reconcile: no Machine may be
//! asked to go down (the highest running version is the floor), and none may
//! skip a minor (the lowest running version is the base). Pure.

use crate::api::validate::{
    K3sVersion, ValidationError, ValidationErrors, VersionChangeError, check_version_change,
};

/// Check `spec_version` against `machines` (name, `spec.version`); `object`
/// names the control plane (`namespace/name`) in the error. Unparseable or
/// missing Machine versions are skipped: nothing can be said about them.
pub fn check_against_machines(
    object: &str,
    spec_version: &str,
    machines: &[(&str, Option<&str>)],
) -> Result<(), ValidationErrors> {
    let parsed: Vec<(&str, &str, K3sVersion)> = machines
        .iter()
        .filter_map(|(name, v)| {
            let v = (*v)?;
            K3sVersion::parse(v).map(|p| (*name, v, p))
        })
        .collect();
    let highest = parsed.iter().max_by_key(|(_, _, p)| *p);
    let lowest = parsed.iter().min_by_key(|(_, _, p)| *p);
    let mut errors = Vec::new();
    let mut refuse = |machine: &str, e: VersionChangeError| {
        errors.push(ValidationError {
            object: object.to_string(),
            rule: e.rule,
            message: format!("{} (Machine {machine} runs it)", e.message),
        })
    };
    if let Some((name, version, _)) = highest
        && let Err(e) = check_version_change(version, spec_version)
        && e.rule == crate::api::validate::Rule::VersionNoDowngrade
    {
        refuse(name, e);
    }
    if let Some((name, version, _)) = lowest
        && let Err(e) = check_version_change(version, spec_version)
        && e.rule == crate::api::validate::Rule::VersionNoMinorSkip
    {
        refuse(name, e);
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(errors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::validate::Rule;

    fn check(spec: &str, machines: &[(&str, Option<&str>)]) -> Vec<Rule> {
        match check_against_machines("ns/cp", spec, machines) {
            Ok(()) => vec![],
            Err(e) => e.rules(),
        }
    }

    /// name, spec.version, Machines (name, version), broken rules.
    type Case = (
        &'static str,
        &'static str,
        Vec<(&'static str, Option<&'static str>)>,
        Vec<Rule>,
    );

    #[test]
    fn table() {
        let v130 = Some("v1.30.2+k3s2");
        let v131 = Some("v1.31.4+k3s1");
        let cases: Vec<Case> = vec![
            (
                "steady",
                "v1.30.2+k3s2",
                vec![("a", v130), ("b", v130)],
                vec![],
            ),
            ("one_minor_up", "v1.31.4+k3s1", vec![("a", v130)], vec![]),
            (
                "half_done_rollout_continues",
                "v1.31.4+k3s1",
                vec![("a", v130), ("b", v131)],
                vec![],
            ),
            (
                "back_down_mid_rollout_would_downgrade_the_new_machine",
                "v1.30.2+k3s2",
                vec![("a", v130), ("b", v131)],
                vec![Rule::VersionNoDowngrade],
            ),
            (
                "skip_from_the_lowest",
                "v1.32.0+k3s1",
                vec![("a", v130), ("b", v131)],
                vec![Rule::VersionNoMinorSkip],
            ),
            (
                "downgrade_below_everything",
                "v1.29.9+k3s1",
                vec![("a", v130)],
                vec![Rule::VersionNoDowngrade],
            ),
            ("no_machines", "v1.33.0+k3s1", vec![], vec![]),
            (
                "unparseable_machine_versions_are_skipped",
                "v1.31.4+k3s1",
                vec![("a", Some("latest")), ("b", None), ("c", v130)],
                vec![],
            ),
        ];
        for (name, spec, machines, want) in cases {
            assert_eq!(check(spec, &machines), want, "{name}");
        }
    }

    #[test]
    fn the_error_names_field_versions_and_machine() {
        let err =
            check_against_machines("ns/cp", "v1.30.2+k3s2", &[("cp-new", Some("v1.31.4+k3s1"))])
                .unwrap_err()
                .to_string();
        assert_eq!(
            err,
            "ns/cp: spec.version: cannot downgrade from v1.31.4+k3s1 to v1.30.2+k3s2 (Machine cp-new runs it)"
        );
    }
}
