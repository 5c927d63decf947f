//! The report as text: aligned tables and the summary lines.

use crate::membership::MatchRule;

use super::report::*;

/// A left-aligned text table with a header row.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The membership table alone (members <-> machines <-> nodes).
pub fn render_members(report: &Report) -> String {
    let rows: Vec<Vec<String>> = report
        .members
        .iter()
        .map(|m| {
            vec![
                m.name.clone(),
                m.id.clone(),
                if m.leader { "leader" } else { "-" }.to_string(),
                if m.learner { "learner" } else { "-" }.to_string(),
                match &m.error {
                    None => "healthy".to_string(),
                    Some(reason) => format!("UNHEALTHY: {reason}"),
                },
                if m.alarms.is_empty() {
                    "-".to_string()
                } else {
                    m.alarms.join(",")
                },
                m.db_size
                    .map_or_else(|| "-".into(), crate::space_rule::bytes),
                m.db_size_in_use
                    .map_or_else(|| "-".into(), crate::space_rule::bytes),
                m.fragmentation
                    .map_or_else(|| "-".into(), |f| format!("{:.0}%", f * 100.0)),
                m.quota.map_or_else(|| "?".into(), crate::space_rule::bytes),
                m.machine.clone().unwrap_or_else(|| "(none)".into()),
                m.node.clone().unwrap_or_else(|| "-".into()),
                m.matched_by.map_or("-", match_rule_name).to_string(),
            ]
        })
        .collect();
    table(
        &[
            "MEMBER",
            "ID",
            "LEADER",
            "LEARNER",
            "HEALTH",
            "ALARMS",
            "DB SIZE",
            "IN USE",
            "FREE",
            "QUOTA",
            "MACHINE",
            "NODE",
            "MATCHED BY",
        ],
        &rows,
    )
}

/// The whole report for people.
pub fn render_text(report: &Report) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!(
        "KThreesControlPlane {} (Cluster {})",
        report.control_plane,
        report.cluster.as_deref().unwrap_or("none")
    ));
    line(match &report.workload.reason {
        None => format!(
            "workload cluster: {} control-plane node(s)",
            report.workload.control_plane_nodes
        ),
        Some(reason) => format!("workload cluster: unavailable: {reason}"),
    });
    let etcd = &report.etcd;
    line(match etcd.state {
        "observed" => format!(
            "etcd: cluster {}, {} member(s), leader {}",
            etcd.cluster_id.as_deref().unwrap_or("?"),
            report.members.len(),
            etcd.leader.as_deref().unwrap_or("none")
        ),
        state => format!(
            "etcd: {state}: {}",
            etcd.reason.as_deref().unwrap_or_default()
        ),
    });
    if let Some(transport) = &etcd.transport {
        line(format!("etcd transport: {transport}"));
    }
    if let Some(reason) = &etcd.alarms_error {
        line(format!("etcd alarms: unknown ({reason})"));
    }
    for foreign in &etcd.foreign_clusters {
        line(format!(
            "another etcd cluster on the seeds, not used: {foreign}"
        ));
    }
    if let Some(space) = &report.space {
        line(format!(
            "etcd space: quota {}{}",
            space.quota,
            if space.nospace {
                "; NOSPACE raised: etcd refuses writes"
            } else {
                ""
            }
        ));
        line(match (&space.rule, &space.message) {
            (Some(rule), Some(message)) => format!("etcd space care: {message} ({rule})"),
            _ => "etcd space care: off (run --etcd-space-care)".to_string(),
        });
    }
    if !report.cluster_cas.is_empty() {
        line(format!(
            "cluster CAs: {}",
            report
                .cluster_cas
                .iter()
                .map(|ca| format!(
                    "{} until {}",
                    ca.secret,
                    ca.not_after
                        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !report.members.is_empty() {
        line(String::new());
        out.push_str(&render_members(report));
    }
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!(
        "members without a machine: {}{}",
        report.members_without_machine_count,
        list_suffix(&report.members_without_machine)
    ));
    line(format!(
        "machines without a member: {}{}",
        report.machines_without_member.len(),
        list_suffix(&report.machines_without_member)
    ));
    if report.ambiguities.is_empty() {
        line("ambiguities: none".into());
    } else {
        line(format!("ambiguities: {}", report.ambiguities.len()));
        for a in &report.ambiguities {
            line(format!("  - {}", a.message));
        }
    }
    let rows: Vec<Vec<String>> = report
        .machines
        .iter()
        .map(|m| {
            vec![
                m.name.clone(),
                m.node.clone().unwrap_or_else(|| "(none)".into()),
                m.member.clone().unwrap_or_else(|| "(none)".into()),
                if m.deleting { "yes" } else { "-" }.to_string(),
                yes_no(m.health_check_succeeded).to_string(),
                yes_no(m.owner_remediated).to_string(),
                m.version.clone().unwrap_or_else(|| "(none)".into()),
                if m.up_to_date { "yes" } else { "no" }.to_string(),
                m.certificates_expiry
                    .map(|e| {
                        format!(
                            "{} ({})",
                            e.at.format("%Y-%m-%d"),
                            e.source.certificate_label()
                        )
                    })
                    .unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    line(String::new());
    out.push_str(&table(
        &[
            "MACHINE",
            "NODE",
            "MEMBER",
            "DELETING",
            "HEALTHCHECK",
            "OWNERREMEDIATED",
            "VERSION",
            "UPTODATE",
            "CERTEXPIRY",
        ],
        &rows,
    ));
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(String::new());
    line(match &report.quorum {
        Some(q) => format!("quorum: {}", q.summary),
        None => "quorum: unknown (no etcd membership observed)".into(),
    });
    let surge = report
        .rollout
        .max_surge
        .map_or_else(|| "invalid".to_string(), |n| n.to_string());
    line(if report.rollout.outdated.is_empty() {
        format!("rollout: none, every machine is up to date (maxSurge {surge})")
    } else {
        format!(
            "rollout: {} outdated (maxSurge {surge}): {}",
            report.rollout.outdated.len(),
            report.rollout.outdated.join(", ")
        )
    });
    if let Some(backup) = &report.backup {
        line(format!(
            "etcd backup: {} to {}: {}",
            if backup.ready {
                "ready"
            } else {
                backup.reason.as_str()
            },
            backup.target,
            backup.message
        ));
    }
    if let Some(restore) = &report.restore {
        line(format!(
            "etcd restore: {}: {}",
            restore.reason, restore.message
        ));
    }
    let next = &report.next;
    line(format!("next: {}: {}", next.short(), next.message));
    out
}

/// `inspect -n NAMESPACE`: one line per control plane, then why etcd (or the
/// control plane) could not be read, for those lines that say so.
pub fn render_summary(rows: &[SummaryRow]) -> String {
    let dash = |v: Option<i32>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                r.cluster.clone().unwrap_or_else(|| "(none)".into()),
                r.replicas.clone(),
                r.version.clone(),
                r.etcd.clone(),
                dash(r.quorum),
                dash(r.quorum_margin),
                r.up_to_date.clone(),
                r.next.clone(),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "NAME", "CLUSTER", "REPLICAS", "VERSION", "ETCD", "QUORUM", "MARGIN", "UPTODATE",
            "NEXT",
        ],
        &cells,
    );
    let notes: Vec<&SummaryRow> = rows.iter().filter(|r| r.reason.is_some()).collect();
    if !notes.is_empty() {
        out.push('\n');
        for r in notes {
            let reason = r.reason.as_deref().unwrap_or_default();
            out.push_str(&if r.etcd == "error" {
                format!("{}: not observed: {reason}\n", r.name)
            } else {
                format!("{}: etcd {}: {reason}\n", r.name, r.etcd)
            });
        }
    }
    out
}

fn list_suffix(items: &[String]) -> String {
    if items.is_empty() {
        String::new()
    } else {
        format!(" ({})", items.join(", "))
    }
}

fn match_rule_name(rule: MatchRule) -> &'static str {
    match rule {
        MatchRule::NodeAnnotation => "node annotation",
        MatchRule::NamePattern => "name pattern",
        MatchRule::PeerAddress => "peer address",
    }
}

fn yes_no(flag: Option<bool>) -> &'static str {
    match flag {
        Some(true) => "True",
        Some(false) => "False",
        None => "-",
    }
}
