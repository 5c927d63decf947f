//! Which certificate-expiry annotations this process has written and CAPI
//! has not copied yet, per control plane (kept in the [`super::Context`]).

use std::collections::{HashMap, HashSet};

/// The (`namespace/KThreesConfig`, value) pairs written and not yet copied by
/// CAPI, per control plane (`namespace/name`). Each control plane's pass
/// prunes only its own, so that no pass makes another write again (with 1,000
/// control planes in one namespace, a shared prune had every idle pass write).
#[derive(Debug, Default)]
pub struct WrittenAnnotations(HashMap<String, HashSet<(String, String)>>);

impl WrittenAnnotations {
    /// Forget this control plane's pairs that are no longer to be written (a
    /// value CAPI copied, a Machine gone), so the memory stays bounded.
    pub fn keep_only(&mut self, control_plane: &str, pending: &HashSet<(String, String)>) {
        if pending.is_empty() {
            self.0.remove(control_plane);
        } else if let Some(set) = self.0.get_mut(control_plane) {
            set.retain(|key| pending.contains(key));
        }
    }

    pub fn written(&self, control_plane: &str, key: &(String, String)) -> bool {
        self.0
            .get(control_plane)
            .is_some_and(|set| set.contains(key))
    }

    pub fn record(&mut self, control_plane: &str, key: (String, String)) {
        self.0
            .entry(control_plane.to_string())
            .or_default()
            .insert(key);
    }

    pub fn forget(&mut self, control_plane: &str) {
        self.0.remove(control_plane);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(config: &str, value: &str) -> (String, String) {
        (format!("ns/{config}"), value.to_string())
    }

    #[test]
    fn another_control_planes_pass_never_makes_this_one_write_again() {
        let mut written = WrittenAnnotations::default();
        let a = pair("a-0", "2027-01-01T00:00:00Z");
        written.record("ns/a", a.clone());
        // b's pass in the same namespace, with nothing pending of its own.
        written.keep_only("ns/b", &HashSet::new());
        assert!(written.written("ns/a", &a), "b's pass forgot a's write");
        // a's own pass with the value still pending keeps it.
        written.keep_only("ns/a", &HashSet::from([a.clone()]));
        assert!(written.written("ns/a", &a));
    }

    #[test]
    fn a_value_capi_copied_or_a_machine_gone_is_forgotten() {
        let mut written = WrittenAnnotations::default();
        let (old, new) = (
            pair("a-0", "2027-01-01T00:00:00Z"),
            pair("a-1", "2027-02-01T00:00:00Z"),
        );
        written.record("ns/a", old.clone());
        written.record("ns/a", new.clone());
        written.keep_only("ns/a", &HashSet::from([new.clone()]));
        assert!(!written.written("ns/a", &old));
        assert!(written.written("ns/a", &new));
        written.keep_only("ns/a", &HashSet::new());
        assert!(written.0.is_empty(), "nothing pending, nothing kept");
    }
}
