//! The layering rule of docs/architecture.md, checked on the source: each
//! top-level module imports only modules on a lower floor, and no two files
//! outside the test API server import each other, directly or round a circle.
//! Read from `src/` (comments and `#[cfg(test)]` modules left out).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Floors, lowest first. A module may import its own floor's modules' types
/// only where listed in `SAME_FLOOR`, and any lower floor.
const FLOORS: &[&[&str]] = &[
    &["api", "quorum", "space_rule"],
    &["pki", "etcd", "membership", "lifecycle"],
    &["workload", "remediation", "rollout", "backup"],
    &["decision"],
    &["controller", "components", "webhook"],
    &["cli"],
];

/// Imports within one floor that are allowed (the remediation model and the
/// rollout rules share the control-plane view and the outdated reasons).
const SAME_FLOOR: &[(&str, &str)] = &[
    ("etcd", "pki"),
    ("membership", "etcd"),
    ("lifecycle", "pki"),
    ("remediation", "rollout"),
    ("rollout", "remediation"),
    ("workload", "etcd"),
    ("components", "webhook"),
];

/// Behind the `sandbox` feature: the test API server and the simulated world,
/// which may import anything and are imported only by `cli` (demo) and tests.
const SANDBOX: &[&str] = &["apiserver", "harness"];

fn floor(module: &str) -> Option<usize> {
    FLOORS.iter().position(|f| f.contains(&module))
}

struct File {
    module: Vec<String>,
    text: String,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without comments and without `#[cfg(test)]` / `#[cfg(all(test, ...))]` modules.
fn code_of(text: &str) -> String {
    let mut code = String::new();
    let mut skipping: Option<i32> = None;
    let mut test_attr = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(depth) = skipping.as_mut() {
            *depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
            if *depth <= 0 {
                skipping = None;
            }
            continue;
        }
        if trimmed.starts_with("#[cfg(") && trimmed.contains("test") {
            test_attr = true;
            continue;
        }
        let declares_mod = trimmed.starts_with("mod ") || trimmed.starts_with("pub(crate) mod ");
        if test_attr && declares_mod && trimmed.ends_with('{') {
            skipping = Some(1);
            test_attr = false;
            continue;
        }
        test_attr = test_attr && trimmed.starts_with("#[");
        let without_comment = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        code.push_str(without_comment);
        code.push('\n');
    }
    code
}

fn files() -> Vec<File> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    rust_files(&root, &mut paths);
    paths
        .into_iter()
        .map(|path| {
            let rel = path.strip_prefix(&root).unwrap().with_extension("");
            let mut module: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                module.pop();
            }
            File {
                module,
                text: code_of(&std::fs::read_to_string(&path).unwrap()),
            }
        })
        .collect()
}

/// Every `crate::a::b::...` and `super::...` path in `file`, resolved to the
/// longest known module.
fn imports(file: &File, known: &BTreeSet<Vec<String>>, is_dir: bool) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    let text = &file.text;
    for (start, _) in text
        .match_indices("crate::")
        .chain(text.match_indices("super::"))
    {
        if start > 0 {
            let before = text.as_bytes()[start - 1];
            if before.is_ascii_alphanumeric() || before == b'_' || before == b':' {
                continue;
            }
        }
        let rest: String = text[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':' || *c == '{')
            .collect();
        let segments: Vec<&str> = rest
            .split("::")
            .map(|s| s.trim_start_matches('{'))
            .filter(|s| !s.is_empty())
            .collect();
        let mut path: Vec<String> = if segments[0] == "crate" {
            vec![]
        } else {
            // `super` of a file module is its parent; of a `mod.rs`, the grandparent.
            let mut base = file.module.clone();
            if !is_dir {
                base.pop();
            }
            base
        };
        let mut rest = &segments[1..];
        if segments[0] == "super" {
            if is_dir {
                path.pop();
            }
            while rest.first() == Some(&"super") {
                path.pop();
                rest = &rest[1..];
            }
        }
        path.extend(rest.iter().map(|s| s.to_string()));
        while !path.is_empty() {
            if known.contains(&path) {
                if path != file.module {
                    out.insert(path.clone());
                }
                break;
            }
            path.pop();
        }
    }
    out
}

fn graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = files();
    let known: BTreeSet<Vec<String>> = files.iter().map(|f| f.module.clone()).collect();
    files
        .iter()
        .map(|f| {
            let mut dir = root.clone();
            for part in &f.module {
                dir.push(part);
            }
            let is_dir = dir.join("mod.rs").exists() || f.module.is_empty();
            (f.module.clone(), imports(f, &known, is_dir))
        })
        .collect()
}

/// Strongly connected components of more than one module (Tarjan).
fn circles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on_stack: BTreeSet<&'a Vec<String>>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Vec<String>) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            let Some((w, _)) = s.graph.get_key_value(w) else {
                continue;
            };
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack.remove(w);
                component.push(w.join("::"));
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !state.index.contains_key(v) {
            visit(&mut state, v);
        }
    }
    state.out
}

#[test]
fn no_import_circles_outside_the_test_api_server() {
    let found: Vec<Vec<String>> = circles(&graph())
        .into_iter()
        .filter(|c| !c.iter().all(|m| m.starts_with("apiserver")))
        .collect();
    assert!(
        found.is_empty(),
        "import circles (each a set of files that import each other, directly or round a circle): {found:#?}"
    );
}

#[test]
fn every_module_imports_only_lower_floors() {
    let mut wrong = Vec::new();
    for (module, imports) in graph() {
        let Some(top) = module.first() else { continue };
        if SANDBOX.contains(&top.as_str()) {
            continue;
        }
        for import in imports {
            let target = &import[0];
            if target == top {
                continue;
            }
            let allowed = match (floor(top), floor(target)) {
                _ if SANDBOX.contains(&target.as_str()) => top == "cli",
                (Some(from), Some(to)) => {
                    to < from
                        || (to == from && SAME_FLOOR.contains(&(top.as_str(), target.as_str())))
                }
                // Top-level items of lib.rs (e.g. the crypto provider set-up).
                (_, None) => true,
                (None, _) => true,
            };
            if !allowed {
                wrong.push(format!(
                    "{} imports {}",
                    module.join("::"),
                    import.join("::")
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the floors of docs/architecture.md: {wrong:#?}"
    );
}

/// Modules outside the floors that any module may use (they import none of
/// ours): YAML in and out; one HTTP/2 connection over TLS.
const BESIDE_THE_FLOORS: &[&str] = &["yaml", "h2_connection"];

/// Every top-level module has its place: one on no floor would escape the
/// floor rule both ways (it may import anything and be imported by anything).
#[test]
fn every_module_is_on_a_floor() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut homeless = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = match path.file_stem().and_then(|n| n.to_str()) {
            Some(n) => n.to_string(),
            None => continue,
        };
        if !(path.is_dir() || path.extension().is_some_and(|e| e == "rs"))
            || ["lib", "main"].contains(&name.as_str())
        {
            continue;
        }
        if floor(&name).is_none()
            && !SANDBOX.contains(&name.as_str())
            && !BESIDE_THE_FLOORS.contains(&name.as_str())
        {
            homeless.push(name);
        }
    }
    assert!(
        homeless.is_empty(),
        "modules on no floor of docs/architecture.md: {homeless:?}"
    );
}

/// The checker itself: a circle and an upward import are found.
#[test]
fn the_checks_find_a_circle_and_an_upward_import() {
    let a = vec!["decision".to_string(), "a".to_string()];
    let b = vec!["decision".to_string(), "b".to_string()];
    let graph = BTreeMap::from([
        (a.clone(), BTreeSet::from([b.clone()])),
        (b.clone(), BTreeSet::from([a.clone()])),
    ]);
    assert_eq!(
        circles(&graph),
        vec![vec!["decision::a".to_string(), "decision::b".to_string()]]
    );
    assert!(floor("controller") > floor("decision"));
    let text = code_of(
        "use crate::controller::x; // crate::cli\n#[cfg(test)]\nmod tests {\n use crate::cli;\n}\n",
    );
    assert!(
        text.contains("crate::controller") && !text.contains("crate::cli"),
        "{text}"
    );
}

/// The floors whose modules decide from what was observed: pure, no I/O.
/// The controller observes and acts; these never wait on anything.
const PURE: &[&str] = &[
    "quorum",
    "space_rule",
    "membership",
    "lifecycle",
    "remediation",
    "rollout",
    "decision",
];

/// What a pure module must not use: async code, the runtime, or a client
/// of the API server (`kube::Api`, `kube::Client`, in a path or a `use`
/// list). Returns each use found.
fn impure_uses(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for marker in ["async fn", ".await", "tokio::"] {
        if code.contains(marker) {
            found.push(marker.to_string());
        }
    }
    let word = |text: &str, name: &str| {
        text.match_indices(name).any(|(i, _)| {
            let before = text[..i].chars().next_back();
            let after = text[i + name.len()..].chars().next();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
    };
    for (start, _) in code.match_indices("kube::") {
        let rest = &code[start + "kube::".len()..];
        let item = match rest.strip_prefix('{') {
            Some(list) => &list[..list.find('}').unwrap_or(list.len())],
            None => {
                let end = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                &rest[..end]
            }
        };
        for name in ["Api", "Client"] {
            if word(item, name) {
                found.push(format!("kube::{name}"));
            }
        }
    }
    found
}

#[test]
fn the_pure_floors_do_no_io() {
    let mut wrong = Vec::new();
    for file in files() {
        let Some(top) = file.module.first() else {
            continue;
        };
        if !PURE.contains(&top.as_str()) {
            continue;
        }
        for found in impure_uses(&file.text) {
            wrong.push(format!("{} uses {found}", file.module.join("::")));
        }
    }
    assert!(
        wrong.is_empty(),
        "I/O in the pure floors (docs/architecture.md): {wrong:#?}"
    );
}

/// The checker itself: each injected use is found, and a pure module's
/// ordinary imports are not.
#[test]
fn the_purity_check_finds_injected_io() {
    for (code, expected) in [
        ("pub async fn observe() {}", vec!["async fn"]),
        ("let x = read().await;", vec![".await"]),
        ("tokio::time::sleep(d);", vec!["tokio::"]),
        ("use kube::{Api, ResourceExt};", vec!["kube::Api"]),
        ("fn f(c: kube::Client) {}", vec!["kube::Client"]),
        (
            "use kube::ResourceExt;\nuse kube::core::ObjectMeta;",
            vec![],
        ),
        ("use kube::{ApiResource, ResourceExt};", vec![]),
    ] {
        assert_eq!(impure_uses(code), expected, "{code}");
    }
}
