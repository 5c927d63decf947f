//! Go duration text (`metav1.Duration`) <-> whole seconds (`*int32`), as
//! CAPI's conversions turn one into the other.

use serde_json::Value;

use super::{ConversionError, error};
use crate::api::refs::GoDuration;

/// Whole seconds of a Go duration, truncated as CAPI's conversion does;
/// negative, unparseable or too long for an int32 is an error.
pub fn duration_seconds(
    object: &Value,
    field: &str,
    value: &Value,
) -> Result<i64, ConversionError> {
    let text = value.as_str().ok_or_else(|| {
        error(
            object,
            field,
            format!("must be a duration like 90s, got {value}"),
        )
    })?;
    let duration = GoDuration::new(text).non_negative().ok_or_else(|| {
        error(
            object,
            field,
            format!("{text:?} is not a non-negative duration like 30s, 30m, 1h30m"),
        )
    })?;
    let seconds = duration.as_secs();
    if seconds > i32::MAX as u64 {
        return Err(error(
            object,
            field,
            format!("{text:?} is longer than {} seconds", i32::MAX),
        ));
    }
    Ok(seconds as i64)
}

/// Whole seconds as Go's `time.Duration.String()` writes them: `0s`, `45s`,
/// `1m30s`, `1h0m0s`.
pub fn canonical_duration(seconds: i64) -> String {
    let (hours, minutes, secs) = (seconds / 3600, seconds % 3600 / 60, seconds % 60);
    match (hours, minutes) {
        (0, 0) => format!("{secs}s"),
        (0, _) => format!("{minutes}m{secs}s"),
        _ => format!("{hours}h{minutes}m{secs}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn whole_seconds_print_as_go_prints_durations() {
        for (seconds, text) in [
            (0, "0s"),
            (45, "45s"),
            (90, "1m30s"),
            (3600, "1h0m0s"),
            (5400, "1h30m0s"),
        ] {
            assert_eq!(canonical_duration(seconds), text);
            assert_eq!(
                duration_seconds(&json!({}), "f", &json!(text)).unwrap(),
                seconds
            );
        }
    }

    #[test]
    fn durations_truncate_to_seconds_and_refuse_what_has_no_seconds() {
        let object =
            json!({"kind": "KThreesControlPlane", "metadata": {"name": "cp", "namespace": "ns"}});
        assert_eq!(duration_seconds(&object, "f", &json!("1.9s")).unwrap(), 1);
        assert_eq!(duration_seconds(&object, "f", &json!("500ms")).unwrap(), 0);
        for bad in [json!("-1s"), json!("1d"), json!(5), json!("1000000h")] {
            let err = duration_seconds(&object, "spec.x", &bad)
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("KThreesControlPlane ns/cp: spec.x: "),
                "{err}"
            );
        }
    }
}
