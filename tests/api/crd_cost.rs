//! A guard against CEL rules a real kube-apiserver refuses to install.
//!
//! Before it accepts a CRD, the API server estimates the worst-case cost of
//! every `x-kubernetes-validations` rule and message expression from the
//! schema alone (k8s.io/apiextensions-apiserver's validation, with cel-go's
//! `checker/cost.go` and k8s.io/apiserver's `pkg/cel/library/cost.go`): at
//! most 10,000,000 units per expression and 100,000,000 for the whole CRD.
//! kube-cel, which the other tests use to evaluate our rules, evaluates but
//! does not estimate, so a rule it runs happily can make the CRD uninstallable
//! (it did: `split()` in the version transition rules).
//!
//! This is a re-statement of that estimator for the functions our rules use,
//! with the same cost factors: string traversal 0.1 per character, regex 0.25
//! per pattern character, sizes from `maxLength`/`maxItems`, a string no schema
//! bounds estimated at the API server's request limit. It fails on what the
//! API server cannot bound: a string with no `maxLength` that a rule traverses
//! (`matches`, `find`, `contains`, concatenation...), the elements of a list a
//! call returns (`split`) or a literal list being used, `string()` of a value
//! flowing into a traversal, a list without `maxItems` a rule iterates, and a
//! function it does not know. It is a guard, not a proof: docs/api.md records
//! the real API server runs.

use cel::common::ast::{Expr, IdedExpr, LiteralValue};
use serde_json::{Value, json};

/// cel-go `common.StringTraversalCostFactor`.
const STRING_TRAVERSAL: f64 = 0.1;
/// cel-go `common.RegexStringLengthCostFactor`.
const REGEX_LENGTH: f64 = 0.25;
/// apiextensions `StaticEstimatedCostLimit`: one expression.
const PER_EXPRESSION_LIMIT: f64 = 10_000_000.0;
/// apiextensions `StaticEstimatedCRDCostLimit`: the whole CRD.
const PER_CRD_LIMIT: f64 = 100_000_000.0;
/// The API server's request size limit (3 MiB): the length it assumes for a
/// string no schema bounds, and the count for a list with no `maxItems`.
const REQUEST_LIMIT: f64 = 3_145_728.0;

/// A size, or why the estimator sees no bound.
type Size = Result<f64, &'static str>;

const NO_MAX_LENGTH: &str = "a field with no maxLength";
const NO_MAX_ITEMS: &str = "a list with no maxItems";
const SPLIT_ELEMENT: &str = "an element of the list split() returns";
const LITERAL_ELEMENT: &str = "an element taken out of a literal list";
const STRING_RESULT: &str = "the result of string()";
const MAP_KEY: &str = "a map key";

#[derive(Clone, Debug)]
enum Kind {
    /// A string; its maximum length.
    String(Size),
    /// A list; its maximum count and what an element is.
    List { count: Size, element: Box<Kind> },
    /// A value with a schema (object, map, or a field not yet narrowed).
    Schema(Value),
    /// An int, bool, duration...: constant size.
    Scalar,
}

impl Kind {
    fn of_schema(schema: &Value) -> Kind {
        match schema.get("type").and_then(Value::as_str) {
            Some("string") => {
                let bounded = schema.get("maxLength").and_then(Value::as_f64).or_else(|| {
                    // An enum bounds the string too.
                    schema.get("enum").and_then(Value::as_array).map(|values| {
                        values
                            .iter()
                            .filter_map(Value::as_str)
                            .map(|s| s.chars().count() as f64)
                            .fold(0.0, f64::max)
                    })
                });
                Kind::String(bounded.ok_or(NO_MAX_LENGTH))
            }
            Some("array") => Kind::List {
                count: schema
                    .get("maxItems")
                    .and_then(Value::as_f64)
                    .ok_or(NO_MAX_ITEMS),
                element: Box::new(
                    schema
                        .get("items")
                        .map(Kind::of_schema)
                        .unwrap_or(Kind::Scalar),
                ),
            },
            Some("integer") | Some("number") | Some("boolean") => Kind::Scalar,
            _ if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) => {
                // string(self) of an int-or-string: a string of its length.
                Kind::Schema(schema.clone())
            }
            _ => Kind::Schema(schema.clone()),
        }
    }
}

#[derive(Clone, Debug)]
struct Estimate {
    cost: f64,
    kind: Kind,
}

impl Estimate {
    fn scalar(cost: f64) -> Estimate {
        Estimate {
            cost,
            kind: Kind::Scalar,
        }
    }
}

struct Estimator<'a> {
    /// Where the rule sits, for messages.
    at: &'a str,
    rule_self: &'a Value,
    bindings: Vec<(String, Kind)>,
    problems: Vec<String>,
}

impl Estimator<'_> {
    fn unbounded(&mut self, why: String) {
        self.problems.push(format!("{}: {why}", self.at));
    }

    /// The length of a string a call traverses; a problem when unbounded.
    fn traversed(&mut self, what: &str, kind: &Kind) -> f64 {
        match kind {
            Kind::String(Ok(n)) => *n,
            Kind::String(Err(why)) => {
                self.unbounded(format!(
                    "{what} traverses a string with no size bound ({why}); bound every string \
                     a rule traverses with maxLength, and cut strings with find(), not split()"
                ));
                REQUEST_LIMIT
            }
            Kind::Schema(s) if s.get("x-kubernetes-int-or-string").is_some() => 64.0,
            Kind::Schema(_) | Kind::Scalar => 1.0,
            Kind::List { .. } => {
                self.unbounded(format!("{what} traverses a list as a string"));
                REQUEST_LIMIT
            }
        }
    }

    fn list_count(&mut self, what: &str, count: Size) -> f64 {
        count.unwrap_or_else(|why| {
            self.unbounded(format!("{what} iterates {why}: give the field a maxItems"));
            REQUEST_LIMIT
        })
    }

    fn estimate(&mut self, e: &IdedExpr) -> Estimate {
        match &e.expr {
            Expr::Literal(LiteralValue::String(s)) => Estimate {
                cost: 0.0,
                kind: Kind::String(Ok(s.chars().count() as f64)),
            },
            Expr::Literal(_) => Estimate::scalar(0.0),
            Expr::Ident(name) => {
                if let Some((_, kind)) = self.bindings.iter().rev().find(|(n, _)| n == name) {
                    return Estimate {
                        cost: 1.0,
                        kind: kind.clone(),
                    };
                }
                match name.as_str() {
                    "self" | "oldSelf" => Estimate {
                        cost: 1.0,
                        kind: Kind::of_schema(self.rule_self),
                    },
                    other => {
                        self.unbounded(format!("unknown identifier `{other}`"));
                        Estimate::scalar(1.0)
                    }
                }
            }
            Expr::Select(select) => {
                let operand = self.estimate(&select.operand);
                if select.test {
                    return Estimate::scalar(operand.cost + 1.0);
                }
                let kind = match &operand.kind {
                    Kind::Schema(schema) => schema
                        .pointer(&format!("/properties/{}", select.field))
                        .or_else(|| schema.get("additionalProperties"))
                        .map(Kind::of_schema)
                        .unwrap_or_else(|| {
                            self.unbounded(format!(
                                "field `{}` is not in the schema",
                                select.field
                            ));
                            Kind::Scalar
                        }),
                    other => {
                        self.unbounded(format!("`.{}` on {other:?}", select.field));
                        Kind::Scalar
                    }
                };
                Estimate {
                    cost: operand.cost + 1.0,
                    kind,
                }
            }
            Expr::List(list) => {
                let elements: Vec<Estimate> =
                    list.elements.iter().map(|x| self.estimate(x)).collect();
                Estimate {
                    cost: 10.0 + elements.iter().map(|x| x.cost).sum::<f64>(),
                    kind: Kind::List {
                        count: Ok(elements.len() as f64),
                        // cel-go gives an element taken out of a literal list
                        // no size: only `in` and `size` are safe on it.
                        element: Box::new(Kind::String(Err(LITERAL_ELEMENT))),
                    },
                }
            }
            Expr::Comprehension(c) => {
                let range = self.estimate(&c.iter_range);
                let (count, element) = match range.kind {
                    Kind::List { count, element } => (count, *element),
                    Kind::Schema(ref s) => (
                        s.get("maxProperties")
                            .and_then(Value::as_f64)
                            .ok_or("a map with no maxProperties"),
                        Kind::String(Err(MAP_KEY)),
                    ),
                    other => {
                        self.unbounded(format!("iterating over {other:?}"));
                        (Err("not a list"), Kind::Scalar)
                    }
                };
                let count = self.list_count("a macro (all, exists, map, filter)", count);
                let init = self.estimate(&c.accu_init);
                self.bindings.push((c.iter_var.clone(), element));
                self.bindings.push((c.accu_var.clone(), init.kind.clone()));
                let step = self.estimate(&c.loop_step).cost + self.estimate(&c.loop_cond).cost;
                let result = self.estimate(&c.result);
                self.bindings.pop();
                self.bindings.pop();
                Estimate {
                    cost: range.cost + init.cost + count * step + result.cost,
                    kind: result.kind,
                }
            }
            Expr::Call(call) => self.call(&call.func_name, call.target.as_deref(), &call.args),
            other => {
                self.unbounded(format!("expression the guard does not know: {other:?}"));
                Estimate::scalar(1.0)
            }
        }
    }

    fn call(&mut self, function: &str, target: Option<&IdedExpr>, args: &[IdedExpr]) -> Estimate {
        let target = target.map(|t| self.estimate(t));
        let args: Vec<Estimate> = args.iter().map(|a| self.estimate(a)).collect();
        let inputs = target
            .iter()
            .chain(args.iter())
            .map(|x| x.cost)
            .sum::<f64>();
        let target_kind = target.as_ref().map(|t| t.kind.clone());
        let arg_size = |i: usize| match args.get(i).map(|a| &a.kind) {
            Some(Kind::String(Ok(n))) => *n,
            _ => REQUEST_LIMIT,
        };
        match (function, target_kind) {
            ("_&&_" | "_||_" | "!_" | "@not_strictly_false", _) => Estimate::scalar(inputs),
            ("_?_:_", _) => Estimate {
                cost: inputs,
                kind: match (&args[1].kind, &args[2].kind) {
                    (Kind::String(a), Kind::String(b)) => Kind::String(match (a, b) {
                        (Ok(a), Ok(b)) => Ok(a.max(*b)),
                        (Err(why), _) | (_, Err(why)) => Err(why),
                    }),
                    (k, _) => k.clone(),
                },
            },
            ("_==_" | "_!=_" | "_<_" | "_<=_" | "_>_" | "_>=_", _) => {
                // Strings cost the shorter of the two: one bounded side is enough.
                let size = |k: &Kind| match k {
                    Kind::String(n) => n.ok(),
                    _ => Some(1.0),
                };
                let smallest = match (size(&args[0].kind), size(&args[1].kind)) {
                    (Some(a), Some(b)) => a.min(b),
                    (Some(a), None) | (None, Some(a)) => a,
                    (None, None) => {
                        self.unbounded(format!(
                            "`{function}` compares two strings with no size bound"
                        ));
                        REQUEST_LIMIT
                    }
                };
                Estimate::scalar(inputs + smallest * STRING_TRAVERSAL)
            }
            ("_+_", _) => match (&args[0].kind, &args[1].kind) {
                (Kind::String(_), _) | (_, Kind::String(_)) => {
                    let a = self.traversed("string concatenation `+`", &args[0].kind);
                    let b = self.traversed("string concatenation `+`", &args[1].kind);
                    Estimate {
                        cost: inputs + (a + b) * STRING_TRAVERSAL,
                        kind: Kind::String(Ok(a + b)),
                    }
                }
                _ => Estimate::scalar(inputs + 1.0),
            },
            ("_-_" | "_*_" | "_/_" | "_%_" | "-_", _) => Estimate::scalar(inputs + 1.0),
            ("_[_]", _) => {
                let kind = match &args[0].kind {
                    Kind::List { element, .. } => (**element).clone(),
                    Kind::Schema(s) => s
                        .get("additionalProperties")
                        .map(Kind::of_schema)
                        .unwrap_or(Kind::Scalar),
                    _ => Kind::Scalar,
                };
                Estimate {
                    cost: inputs + 1.0,
                    kind,
                }
            }
            ("@in", _) => {
                let count = match &args[1].kind {
                    Kind::List { count, .. } => self.list_count("`in`", *count),
                    _ => 1.0,
                };
                Estimate::scalar(inputs + count)
            }
            (
                "size" | "int" | "uint" | "double" | "bool" | "duration" | "timestamp" | "dyn"
                | "type",
                _,
            ) => Estimate::scalar(inputs + 1.0),
            // cel-go gives the result of string() no size.
            ("string", _) => Estimate {
                cost: inputs + 1.0,
                kind: Kind::String(Err(STRING_RESULT)),
            },
            ("matches" | "find" | "findAll", Some(t)) => {
                let length = self.traversed(&format!("`{function}`"), &t);
                let cost = (length + 1.0) * STRING_TRAVERSAL * arg_size(0) * REGEX_LENGTH;
                let kind = match function {
                    "matches" => Kind::Scalar,
                    "find" => Kind::String(Ok(length)),
                    _ => Kind::List {
                        count: Ok(length),
                        element: Box::new(Kind::String(Ok(length))),
                    },
                };
                Estimate {
                    cost: inputs + cost,
                    kind,
                }
            }
            ("contains", Some(t)) => {
                let length = self.traversed("`contains`", &t);
                Estimate::scalar(
                    inputs + length * STRING_TRAVERSAL * arg_size(0) * STRING_TRAVERSAL,
                )
            }
            ("startsWith" | "endsWith", Some(_)) => {
                Estimate::scalar(inputs + arg_size(0) * STRING_TRAVERSAL)
            }
            ("substring" | "lowerAscii" | "upperAscii" | "trim", Some(t)) => {
                let length = self.traversed(&format!("`{function}`"), &t);
                Estimate {
                    cost: inputs + length * STRING_TRAVERSAL,
                    kind: Kind::String(Ok(length)),
                }
            }
            ("indexOf" | "lastIndexOf", Some(t)) => {
                let length = self.traversed(&format!("`{function}`"), &t);
                Estimate::scalar(inputs + length * STRING_TRAVERSAL)
            }
            ("replace", Some(t)) => {
                let length = self.traversed("`replace`", &t);
                let (from, to) = (arg_size(0), arg_size(1));
                let result = if to <= from {
                    length
                } else if from == 0.0 {
                    (length + 1.0) * to + length
                } else {
                    (length / from).ceil() * to
                };
                Estimate {
                    cost: inputs + 2.0 * length * STRING_TRAVERSAL,
                    kind: Kind::String(Ok(result)),
                }
            }
            ("split", Some(t)) => {
                let length = self.traversed("`split`", &t);
                Estimate {
                    cost: inputs + 2.0 * length * STRING_TRAVERSAL,
                    // The list's count is bounded; its elements are not.
                    kind: Kind::List {
                        count: Ok(length),
                        element: Box::new(Kind::String(Err(SPLIT_ELEMENT))),
                    },
                }
            }
            (other, _) => {
                self.unbounded(format!(
                    "`{other}`: a function this guard does not know how the API server \
                     estimates; teach the guard (tests/api/crd_cost.rs) before using it"
                ));
                Estimate::scalar(inputs + 1.0)
            }
        }
    }
}

/// One expression's verdict: its cost, and what could not be bounded.
fn estimate_expression(at: &str, source: &str, rule_self: &Value) -> (f64, Vec<String>) {
    let parsed = cel::parser::Parser::new()
        .parse(source)
        .unwrap_or_else(|e| panic!("{at}: does not parse: {e:?}"));
    let mut estimator = Estimator {
        at,
        rule_self,
        bindings: Vec::new(),
        problems: Vec::new(),
    };
    let estimate = estimator.estimate(&parsed);
    let mut problems = estimator.problems;
    problems.dedup();
    if estimate.cost > PER_EXPRESSION_LIMIT {
        problems.push(format!(
            "{at}: estimated cost {:.0} exceeds the per-expression limit {PER_EXPRESSION_LIMIT:.0}",
            estimate.cost
        ));
    }
    (estimate.cost, problems)
}

/// Every rule and message expression under `schema`, with the most times each
/// can run (the product of the enclosing lists' and maps' bounds).
fn walk(schema: &Value, path: &str, times: f64, out: &mut Vec<(String, String, Value, f64)>) {
    if let Some(rules) = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    {
        for (i, rule) in rules.iter().enumerate() {
            for key in ["rule", "messageExpression"] {
                if let Some(source) = rule.get(key).and_then(Value::as_str) {
                    out.push((
                        format!("{path} x-kubernetes-validations[{i}].{key}"),
                        source.to_string(),
                        schema.clone(),
                        times,
                    ));
                }
            }
        }
    }
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, child) in properties {
            walk(child, &format!("{path}.{name}"), times, out);
        }
    }
    if let Some(items) = schema.get("items") {
        let count = schema
            .get("maxItems")
            .and_then(Value::as_f64)
            .unwrap_or(REQUEST_LIMIT);
        walk(items, &format!("{path}[*]"), times * count, out);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        let count = schema
            .get("maxProperties")
            .and_then(Value::as_f64)
            .unwrap_or(REQUEST_LIMIT);
        walk(values, &format!("{path}[*]"), times * count, out);
    }
}

/// Every problem of one schema (empty: the API server will accept its rules),
/// and the estimated total.
fn check_schema(name: &str, schema: &Value) -> (f64, Vec<String>) {
    let mut expressions = Vec::new();
    walk(schema, name, 1.0, &mut expressions);
    let mut total = 0.0;
    let mut problems = Vec::new();
    for (at, source, rule_self, times) in &expressions {
        let (cost, mut found) = estimate_expression(at, source, rule_self);
        if *times > 1.0 && cost > 0.0 && found.is_empty() && times * cost > PER_CRD_LIMIT {
            found.push(format!(
                "{at}: runs up to {times:.0} times (a list or map without maxItems/maxProperties above it)"
            ));
        }
        total += cost * times;
        problems.extend(found);
    }
    if total > PER_CRD_LIMIT {
        problems.push(format!(
            "{name}: estimated total {total:.0} exceeds the per-CRD limit {PER_CRD_LIMIT:.0}"
        ));
    }
    (total, problems)
}

fn schema_of(
    version: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionVersion,
) -> Value {
    serde_json::to_value(
        version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("every version has a schema"),
    )
    .unwrap()
}

#[test]
fn every_rule_of_our_crds_is_bounded_for_the_api_servers_cost_estimator() {
    let mut checked = 0;
    for crd in k3s_control_plane::api::crds::ours() {
        for version in &crd.spec.versions {
            let name = format!("{} {}", crd.spec.names.kind, version.name);
            let schema = schema_of(version);
            let (total, problems) = check_schema(&name, &schema);
            assert!(
                problems.is_empty(),
                "the API server would refuse {name}:\n{}",
                problems.join("\n")
            );
            eprintln!("{name}: estimated total cost {total:.0} (limit {PER_CRD_LIMIT:.0})");
            checked += 1;
        }
    }
    assert!(checked >= 2);
}

/// The guard fails where the API server refused or would refuse, each with
/// its reason; and passes the same shapes once bounded.
#[test]
fn the_guard_catches_what_the_api_server_cannot_bound() {
    let version = |rules: Value| {
        json!({"type": "object", "properties": {"version": {
            "type": "string", "maxLength": 64, "x-kubernetes-validations": rules}}})
    };
    let cases: Vec<(&str, Value, Option<&str>)> = vec![
        (
            // The rule a real v1.28 API server refused (commit 5994271's parent).
            "split elements used",
            version(
                json!([{"rule": "int(self.split('.')[1]) <= int(oldSelf.split('.')[1]) + 1",
                            "messageExpression": "'cannot skip to ' + self.split('.')[1]"}]),
            ),
            Some("an element of the list split() returns"),
        ),
        (
            "string() concatenated",
            version(json!([{"rule": "true",
                            "messageExpression": "'upgrade to ' + string(int(self.find('[0-9]+')) + 1)"}])),
            Some(
                "string concatenation `+` traverses a string with no size bound (the result of string())",
            ),
        ),
        (
            "matches on a string without maxLength",
            json!({"type": "object", "properties": {"d": {"type": "string",
                "x-kubernetes-validations": [{"rule": "self.matches('^[0-9]+s$')"}]}}}),
            Some("`matches` traverses a string with no size bound (a field with no maxLength)"),
        ),
        (
            "a list without maxItems iterated",
            json!({"type": "object", "properties": {"l": {"type": "array",
                "items": {"type": "string", "maxLength": 10},
                "x-kubernetes-validations": [{"rule": "self.all(x, x.matches('^a'))"}]}}}),
            Some("no maxItems"),
        ),
        (
            "an unknown function",
            version(json!([{"rule": "self.reverse() == self"}])),
            Some("does not know"),
        ),
        (
            "find, substring and replace on a bounded string",
            version(
                json!([{"rule": "int(self.find('[0-9]+[-+]').replace('-', '').replace('+', '')) >= 0",
                            "messageExpression": "'from ' + oldSelf.find('^v[0-9]+[.][0-9]+') + ' to ' + self"}]),
            ),
            None,
        ),
        (
            "an unbounded string compared with a literal",
            json!({"type": "object", "properties": {"s": {"type": "string"}},
                   "x-kubernetes-validations": [{"rule": "!has(self.s) || self.s != ''"}]}),
            None,
        ),
        (
            "a bounded list iterated",
            json!({"type": "object", "properties": {"l": {"type": "array", "maxItems": 8,
                "items": {"type": "string", "maxLength": 10},
                "x-kubernetes-validations": [{"rule": "self.all(x, x.matches('^a'))"}]}}}),
            None,
        ),
    ];
    for (name, schema, want) in cases {
        let (_, problems) = check_schema(name, &schema);
        match want {
            Some(reason) => assert!(
                problems.iter().any(|p| p.contains(reason)),
                "{name}: want a problem saying {reason:?}, got {problems:?}"
            ),
            None => assert!(problems.is_empty(), "{name}: {problems:?}"),
        }
    }
}
