//! `hack/grafana/k3s-control-plane.json` queries only what the controller
//! really exports: every metric name in every PromQL expression is a series
//! of a `Metrics::register`ed registry (as prometheus-client's text encoder
//! writes it, with its `_total`, `_bucket`, `_count`, `_sum` suffixes), every
//! label a query groups, joins or matches by is a label of that series, and
//! the panels operators rely on are there. Renaming a metric or a label
//! fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use k3s_control_plane::api::kcp::EtcdQuorumStatus;
use k3s_control_plane::controller::metrics::Metrics;
use prometheus_client::registry::Registry;
use serde_json::Value;

fn dashboard() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/grafana/k3s-control-plane.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every series name the controller exports, with its label names, from the
/// text exposition of a registry where each family was touched once.
fn exported() -> BTreeMap<String, BTreeSet<String>> {
    let mut registry = Registry::default();
    let m = Metrics::register(&mut registry);
    m.reconciles.inc();
    m.reconcile_seconds.observe(0.01);
    m.error("observe");
    m.remediation("completed");
    m.etcd_operation("snapshot", Duration::from_millis(3));
    m.leader.set(1);
    m.etcd_transport("ns/c", "direct");
    m.etcd_quorum(
        "ns/c",
        Some(&EtcdQuorumStatus {
            members: 3,
            voters: 3,
            healthy_voters: 3,
            quorum: 2,
            quorum_margin: 1,
            voter_health: "3/3".into(),
        }),
    );
    m.etcd_space(
        "ns/c",
        Some(&k3s_control_plane::space_rule::ClusterSpace {
            members: vec![k3s_control_plane::space_rule::MemberSpace {
                id: 1,
                label: "cp-0".into(),
                leader: true,
                learner: false,
                sizes: Some(k3s_control_plane::space_rule::Sizes {
                    db_size: 4096,
                    in_use: 1024,
                }),
                quota: Some(2 << 30),
                quota_source: k3s_control_plane::space_rule::QuotaSource::Default,
                problem: None,
                nospace: false,
                measured: false,
            }],
            nospace: false,
            alarms_unknown: None,
            quota_error: None,
            history: None,
            busy: None,
        }),
    );
    m.etcd_space_step("defragment");
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    // Every registered family has a sample: nothing here is left untouched.
    let families: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let mut series: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, labels) = match line.split_once('{') {
            Some((name, rest)) => (name, rest.split_once('}').unwrap().0),
            None => (line.split_whitespace().next().unwrap(), ""),
        };
        let have = series.entry(name.to_string()).or_default();
        for pair in labels.split(',').filter(|p| !p.is_empty()) {
            have.insert(pair.split_once('=').unwrap().0.to_string());
        }
    }
    for family in &families {
        assert!(
            series.keys().any(|s| s.starts_with(family)),
            "family {family} has no sample: touch it in this test\n{text}"
        );
    }
    series
}

#[derive(Debug, PartialEq)]
enum Token {
    Ident(String),
    Open,
    Close,
    Other,
}

/// PromQL as tokens, without strings, durations (`[5m]`, `[$__rate_interval]`),
/// numbers and Grafana variables.
fn tokens(expr: &str) -> Vec<Token> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i += 1;
            while i < chars.len() && chars[i] != c {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(Token::Other);
        } else if c == '[' {
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c == '$' {
            i += 1;
            if chars.get(i) == Some(&'{') {
                while i < chars.len() && chars[i] != '}' {
                    i += 1;
                }
                i += 1;
            } else {
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_:".contains(chars[i])) {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit() || c == '.' {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c == '(' || c == '{' {
            out.push(Token::Open);
            i += 1;
        } else if c == ')' || c == '}' {
            out.push(Token::Close);
            i += 1;
        } else {
            if !c.is_whitespace() {
                out.push(Token::Other);
            }
            i += 1;
        }
    }
    out
}

const GROUPING: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
const KEYWORDS: &[&str] = &["and", "or", "unless", "bool", "offset", "inf", "nan"];

/// The metric names and the label names (grouping, joins, matchers) of one
/// PromQL expression.
fn parse(expr: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let t = tokens(expr);
    let (mut metrics, mut labels) = (BTreeSet::new(), BTreeSet::new());
    let mut i = 0;
    while i < t.len() {
        if let Token::Ident(name) = &t[i] {
            let next_open = t.get(i + 1) == Some(&Token::Open);
            let next_grouping =
                matches!(t.get(i + 1), Some(Token::Ident(k)) if GROUPING.contains(&k.as_str()));
            if GROUPING.contains(&name.as_str()) && next_open {
                // `by (a, b)`: label names up to the closing parenthesis.
                i += 2;
                while i < t.len() && t[i] != Token::Close {
                    if let Token::Ident(l) = &t[i] {
                        labels.insert(l.clone());
                    }
                    i += 1;
                }
            } else if next_open && expr.contains(&format!("{name}{{")) {
                // `metric{label=~"..."}`: a metric, then matcher label names.
                metrics.insert(name.clone());
                i += 2;
                while i < t.len() && t[i] != Token::Close {
                    if let (Token::Ident(l), Some(Token::Other)) = (&t[i], t.get(i + 1)) {
                        labels.insert(l.clone());
                    }
                    i += 1;
                }
            } else if !next_open && !next_grouping && !KEYWORDS.contains(&name.as_str()) {
                metrics.insert(name.clone());
            }
            // Otherwise a function or an aggregation: `rate(`, `sum(`,
            // `sum by (...)`.
        }
        i += 1;
    }
    (metrics, labels)
}

/// Every panel, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().unwrap() {
        out.push(p);
        if let Some(nested) = p["panels"].as_array() {
            out.extend(nested);
        }
    }
    out
}

/// (panel title, panel, expression) of every query, the template variables' too.
fn queries(dashboard: &Value) -> Vec<(String, &Value, String)> {
    let mut out = Vec::new();
    for p in panels(dashboard) {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push((
                p["title"].as_str().unwrap_or_default().to_string(),
                p,
                t["expr"]
                    .as_str()
                    .expect("every target has an expr")
                    .to_string(),
            ));
        }
    }
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(q) = v["query"]["query"].as_str().or(v["query"].as_str()) {
            // label_values(metric, label)
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'))
                .unwrap_or_else(|| panic!("variable {}: unexpected query {q}", v["name"]));
            let (metric, label) = inner.split_once(',').unwrap();
            out.push((
                format!("variable {}", v["name"]),
                v,
                format!("max by ({}) ({})", label.trim(), metric.trim()),
            ));
        }
    }
    out
}

#[test]
fn the_parser_finds_metrics_and_labels() {
    let (m, l) = parse(
        r#"histogram_quantile(0.99, sum by (operation, le) (rate(k3scp_x_bucket{cluster=~"$cluster"}[$__rate_interval]))) and on (cluster) k3scp_y == 1"#,
    );
    assert_eq!(
        m.into_iter().collect::<Vec<_>>(),
        ["k3scp_x_bucket", "k3scp_y"]
    );
    assert_eq!(
        l.into_iter().collect::<Vec<_>>(),
        ["cluster", "le", "operation"]
    );
}

#[test]
fn every_query_uses_exported_metrics_and_their_labels() {
    let exported = exported();
    let dashboard = dashboard();
    let queries = queries(&dashboard);
    assert!(queries.len() >= 8, "{queries:?}");
    for (title, _, expr) in &queries {
        let (metrics, labels) = parse(expr);
        assert!(!metrics.is_empty(), "{title}: no metric in {expr}");
        for metric in &metrics {
            let Some(have) = exported.get(metric) else {
                panic!(
                    "{title}: {metric} is not exported by the controller (exported: {:?})\n{expr}",
                    exported.keys().collect::<Vec<_>>()
                );
            };
            for label in &labels {
                assert!(
                    have.contains(label),
                    "{title}: label {label} is not on {metric} (it has {have:?})\n{expr}"
                );
            }
        }
    }
}

#[test]
fn the_panels_operators_rely_on_are_there() {
    let dashboard = dashboard();
    let queries = queries(&dashboard);
    let panel_using = |metric: &str| -> (&Value, Vec<&str>) {
        let found: Vec<&(String, &Value, String)> = queries
            .iter()
            .filter(|(title, _, expr)| {
                !title.starts_with("variable ") && parse(expr).0.contains(metric)
            })
            .collect();
        assert!(!found.is_empty(), "no panel queries {metric}");
        (
            found[0].1,
            found.iter().map(|(_, _, e)| e.as_str()).collect(),
        )
    };

    let (_, exprs) = panel_using("k3scp_remediations_total");
    assert!(
        exprs
            .iter()
            .any(|e| e.contains("rate(") && e.contains("by (outcome)")),
        "{exprs:?}"
    );
    let (_, exprs) = panel_using("k3scp_reconcile_errors_total");
    assert!(exprs.iter().any(|e| e.contains("by (stage)")), "{exprs:?}");
    let (_, exprs) = panel_using("k3scp_etcd_operation_duration_seconds_bucket");
    for q in ["histogram_quantile(0.5,", "histogram_quantile(0.99,"] {
        assert!(
            exprs
                .iter()
                .any(|e| e.contains(q) && e.contains("operation")),
            "{q}: {exprs:?}"
        );
    }
    // The quorum margin: a gauge per cluster, red below 0 (quorum lost),
    // orange at 0 (the next loss breaks quorum), green from 1.
    let (panel, exprs) = panel_using("k3scp_etcd_quorum_margin");
    assert_eq!(panel["type"], "gauge");
    assert!(
        exprs.iter().all(|e| e.contains("by (cluster)")),
        "{exprs:?}"
    );
    let steps: Vec<(String, Option<f64>)> = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["color"].as_str().unwrap().to_string(),
                s["value"].as_f64(),
            )
        })
        .collect();
    assert_eq!(
        steps,
        [
            ("red".to_string(), None),
            ("orange".to_string(), Some(0.0)),
            ("green".to_string(), Some(1.0))
        ]
    );
    panel_using("k3scp_leader");
    panel_using("k3scp_etcd_transport");
    // etcd's space: each member's file against its quota, and NOSPACE.
    let (_, exprs) = panel_using("k3scp_etcd_db_size_bytes");
    assert!(
        exprs
            .iter()
            .any(|e| e.contains("k3scp_etcd_quota_bytes") && e.contains("by (cluster, member)")),
        "{exprs:?}"
    );
    panel_using("k3scp_etcd_db_in_use_bytes");
    panel_using("k3scp_etcd_nospace");
}

#[test]
fn it_imports_with_a_prometheus_datasource_input() {
    let dashboard = dashboard();
    let inputs = dashboard["__inputs"].as_array().unwrap();
    assert!(
        inputs
            .iter()
            .any(|i| i["name"] == "DS_PROMETHEUS" && i["pluginId"] == "prometheus"),
        "{inputs:?}"
    );
    assert!(dashboard["title"].is_string() && dashboard["uid"].is_string());
    let mut ids = BTreeSet::new();
    for p in panels(&dashboard) {
        assert!(
            ids.insert(p["id"].as_i64().unwrap()),
            "duplicate id {}",
            p["id"]
        );
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${DS_PROMETHEUS}", "{}", p["title"]);
        for t in p["targets"].as_array().unwrap() {
            assert_eq!(t["datasource"]["uid"], "${DS_PROMETHEUS}", "{}", p["title"]);
        }
    }
}
