//! Retry limits of MHC remediation (`spec.remediation`), as CAPI KCP applies them.
//!
//! A replacement Machine carries `remediation-for` (the remediation it replaced).
//! If it fails again within `minHealthyPeriod`, that is a retry of the same
//! sequence: it must wait `retryPeriod` since the last remediation, and gives up
//! after `maxRetry` retries. After `minHealthyPeriod` a new sequence starts.

use chrono::{DateTime, Utc};

use super::model::{MachineView, RemediationData, RemediationStrategy, format_duration};

/// The outcome of the retry limits for one machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RetryVerdict {
    /// Remediate; this is the new `remediation-in-progress` value.
    Go(RemediationData),
    /// Not yet: the last attempt is younger than `retryPeriod`.
    Defer { message: String },
    /// Never (until a human intervenes): `maxRetry` reached.
    Refuse { message: String },
}

/// Apply the retry limits to `machine` at time `now`.
pub fn check_retry_limits(
    machine: &MachineView,
    strategy: &RemediationStrategy,
    now: DateTime<Utc>,
) -> RetryVerdict {
    let mut next = RemediationData {
        machine: machine.name.clone(),
        // Kubernetes times have seconds precision; keep what we record comparable.
        timestamp: Some(truncate_to_seconds(now)),
        retry_count: 0,
    };
    let Some(last) = &machine.remediation_for else {
        return RetryVerdict::Go(next);
    };

    let min_healthy = chrono_duration(strategy.min_healthy_period);
    let retry_period = chrono_duration(strategy.retry_period);
    // A missing timestamp counts as long ago (both periods expired), as upstream.
    let last_time = last
        .timestamp
        .unwrap_or_else(|| now - min_healthy.max(retry_period) * 2);

    if last_time + min_healthy <= now {
        // Healthy long enough since the last remediation: a new sequence.
        return RetryVerdict::Go(next);
    }
    next.retry_count = last.retry_count;

    if last_time + retry_period > now {
        return RetryVerdict::Defer {
            message: format!(
                "KThreesControlPlane can't remediate this machine because the operation already failed in the latest {} (RetryPeriod)",
                format_duration(strategy.retry_period)
            ),
        };
    }
    if let Some(max_retry) = strategy.max_retry
        && next.retry_count >= max_retry
    {
        return RetryVerdict::Refuse {
            message: format!(
                "KThreesControlPlane can't remediate this machine because the operation already failed {max_retry} times (MaxRetry)"
            ),
        };
    }
    next.retry_count += 1;
    RetryVerdict::Go(next)
}

fn chrono_duration(d: std::time::Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

fn truncate_to_seconds(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(t.timestamp(), 0).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use std::time::Duration;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2024, 5, 1, 12, 0, 0).unwrap()
    }

    fn machine_remediated(ago: chrono::Duration, retry_count: u32) -> MachineView {
        let mut m = MachineView::new("m1", now() - chrono::Duration::minutes(1));
        m.remediation_for = Some(RemediationData {
            machine: "m0".into(),
            timestamp: Some(now() - ago),
            retry_count,
        });
        m
    }

    #[test]
    fn retry_limit_table() {
        struct Case {
            name: &'static str,
            last: Option<(chrono::Duration, u32)>,
            strategy: RemediationStrategy,
            want: Result<u32, &'static str>,
        }
        let half_hour = chrono::Duration::minutes(30);
        let two_hours = chrono::Duration::hours(2);
        let cases = [
            Case {
                name: "no remediation-for: first try of a new sequence",
                last: None,
                strategy: RemediationStrategy::default(),
                want: Ok(0),
            },
            Case {
                name: "min healthy period (default 1h) expired: new sequence despite retry count 3",
                last: Some((two_hours, 3)),
                strategy: RemediationStrategy {
                    max_retry: Some(3),
                    ..Default::default()
                },
                want: Ok(0),
            },
            Case {
                name: "custom min healthy period (4h) expired: new sequence",
                last: Some((chrono::Duration::hours(8), 3)),
                strategy: RemediationStrategy {
                    max_retry: Some(3),
                    min_healthy_period: Duration::from_secs(4 * 3600),
                    ..Default::default()
                },
                want: Ok(0),
            },
            Case {
                name: "custom min healthy period (4h) not expired after 2h: retry of the same sequence",
                last: Some((two_hours, 1)),
                strategy: RemediationStrategy {
                    min_healthy_period: Duration::from_secs(4 * 3600),
                    ..Default::default()
                },
                want: Ok(2),
            },
            Case {
                name: "retry period not expired: defer",
                last: Some((half_hour, 2)),
                strategy: RemediationStrategy {
                    max_retry: Some(3),
                    retry_period: Duration::from_secs(3600),
                    ..Default::default()
                },
                want: Err("already failed in the latest 1h0m0s (RetryPeriod)"),
            },
            Case {
                name: "max retry reached: refuse",
                last: Some((half_hour, 3)),
                strategy: RemediationStrategy {
                    max_retry: Some(3),
                    ..Default::default()
                },
                want: Err("already failed 3 times (MaxRetry)"),
            },
            Case {
                name: "below max retry: retry count + 1",
                last: Some((half_hour, 2)),
                strategy: RemediationStrategy {
                    max_retry: Some(3),
                    ..Default::default()
                },
                want: Ok(3),
            },
            Case {
                name: "no max retry: retry forever",
                last: Some((half_hour, 41)),
                strategy: RemediationStrategy::default(),
                want: Ok(42),
            },
        ];
        for case in cases {
            let machine = match case.last {
                None => MachineView::new("m1", now()),
                Some((ago, count)) => machine_remediated(ago, count),
            };
            let got = check_retry_limits(&machine, &case.strategy, now());
            match (&got, case.want) {
                (RetryVerdict::Go(data), Ok(count)) => {
                    assert_eq!(data.retry_count, count, "{}", case.name);
                    assert_eq!(data.machine, "m1", "{}", case.name);
                    assert_eq!(data.timestamp, Some(now()), "{}", case.name);
                }
                (RetryVerdict::Defer { message } | RetryVerdict::Refuse { message }, Err(text)) => {
                    assert!(message.contains(text), "{}: {message}", case.name)
                }
                _ => panic!("{}: got {got:?}", case.name),
            }
        }
    }

    #[test]
    fn a_missing_timestamp_counts_as_long_ago() {
        let mut m = MachineView::new("m1", now());
        m.remediation_for = Some(RemediationData {
            machine: "m0".into(),
            timestamp: None,
            retry_count: 5,
        });
        let strategy = RemediationStrategy {
            max_retry: Some(1),
            ..Default::default()
        };
        assert!(matches!(
            check_retry_limits(&m, &strategy, now()),
            RetryVerdict::Go(RemediationData { retry_count: 0, .. })
        ));
    }

    #[test]
    fn recorded_timestamp_has_seconds_precision() {
        let m = MachineView::new("m1", now());
        let at = now() + chrono::Duration::milliseconds(750);
        let RetryVerdict::Go(data) = check_retry_limits(&m, &RemediationStrategy::default(), at)
        else {
            panic!("expected go");
        };
        assert_eq!(data.timestamp, Some(now()));
    }
}
