//! Kubernetes timestamps as chrono, the clock type of the pure rules.

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// A Kubernetes timestamp as chrono (the remediation model's clock type).
pub fn to_chrono(time: &Time) -> DateTime<Utc> {
    let ts = time.0;
    DateTime::from_timestamp(ts.as_second(), ts.subsec_nanosecond().max(0) as u32)
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}
