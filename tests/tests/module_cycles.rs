//! No crate in the workspace has a module cycle: sibling modules (children of one parent) that,
//! through `crate::`, `super::`, `self::` or child paths, end up depending on each other.
//!
//! A reference from module S to module T counts between the children of their lowest common
//! ancestor that lead to S and to T; a child naming an ancestor, or a parent a descendant, is
//! ordinary hierarchy. Only source text is read: paths made by macros, and names brought in by a
//! glob import and then used bare, are not seen; a name a parent re-exports counts as the parent.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::iter::{once, repeat_n};
use std::path::{Path, PathBuf};

/// A module's path below its crate root, `["commands", "gpu"]`; the root is `[]`.
type ModulePath = Vec<String>;
type Modules = BTreeSet<ModulePath>;
type Graph = BTreeMap<String, BTreeSet<String>>;
/// One example reference (file and path) for each edge `(from, to)` between siblings.
type Examples = BTreeMap<(String, String), String>;

/// One file of a crate: the module it defines, its path for the report, its text.
struct SourceFile {
    module: ModulePath,
    display: String,
    source: String,
}

/// What one file says: the paths it writes and its `mod name;` items.
#[derive(Default)]
struct Scan {
    paths: Vec<WrittenPath>,
    file_modules: Vec<String>,
}

/// A path as written, and the inline modules (`mod tests { .. }`) of its file around it.
struct WrittenPath {
    segments: Vec<String>,
    inline_modules: Vec<String>,
}

/// Siblings that depend on each other: a closed walk through all of them, and one example
/// reference for each edge among them.
struct Cycle {
    walk: Vec<String>,
    evidence: Vec<String>,
}

fn is_word_char(c: &char) -> bool {
    c.is_alphanumeric() || *c == '_'
}

fn word_len(rest: &[char]) -> usize {
    rest.iter().take_while(|c| is_word_char(c)).count()
}

/// Words, `::` and single punctuation; comments, string and char literals and lifetimes dropped.
fn tokenize(source: &str) -> Vec<String> {
    let chars: Vec<char> = source.chars().collect();
    let (mut tokens, mut at) = (Vec::new(), 0);
    while at < chars.len() {
        let rest = &chars[at..];
        let (len, is_token) = match rest {
            ['/', '/', ..] => (rest.iter().take_while(|c| **c != '\n').count(), false),
            ['/', '*', ..] => (block_comment_len(rest), false),
            ['"', ..] => (quoted_len(rest), false),
            ['\'', ..] => (char_literal_or_lifetime_len(rest), false),
            ['r', '#', after @ ..] if word_len(after) > 0 => (2, false), // `r#type` is `type`
            [':', ':', ..] => (2, true),
            [c, ..] if c.is_whitespace() => (1, false),
            _ => raw_string_len(rest).map_or((word_len(rest).max(1), true), |len| (len, false)),
        };
        if is_token {
            tokens.push(rest[..len].iter().collect());
        }
        at += len;
    }
    tokens
}

fn block_comment_len(rest: &[char]) -> usize {
    let (mut depth, mut at) = (0, 0);
    while at + 1 < rest.len() {
        match (rest[at], rest[at + 1]) {
            ('/', '*') => (depth, at) = (depth + 1, at + 2),
            ('*', '/') if depth == 1 => return at + 2,
            ('*', '/') => (depth, at) = (depth - 1, at + 2),
            _ => at += 1,
        }
    }
    rest.len()
}

fn quoted_len(rest: &[char]) -> usize {
    let mut at = 1;
    while at < rest.len() {
        match rest[at] {
            '\\' => at += 2,
            '"' => return at + 1,
            _ => at += 1,
        }
    }
    rest.len()
}

/// `'x'`, `'\n'`, `'\u{22}'`, or a lifetime or label such as `'a`.
fn char_literal_or_lifetime_len(rest: &[char]) -> usize {
    match rest {
        ['\'', '\\', _, tail @ ..] => 4 + tail.iter().take_while(|c| **c != '\'').count(),
        ['\'', _, '\'', ..] => 3,
        _ => 1 + word_len(&rest[1..]),
    }
}

/// The length of the `r".."`, `r#".."#`, `br".."` or `cr".."` that `rest` starts with, if any.
fn raw_string_len(rest: &[char]) -> Option<usize> {
    let prefix = match rest {
        ['r', ..] => 1,
        ['b' | 'c', 'r', ..] => 2,
        _ => return None,
    };
    let hashes = rest[prefix..].iter().take_while(|c| **c == '#').count();
    let body = prefix + hashes + 1;
    if rest.get(body - 1) != Some(&'"') {
        return None;
    }
    let close: Vec<char> = once('"').chain(repeat_n('#', hashes)).collect();
    let end = rest[body..].windows(close.len()).position(|w| w == close);
    Some(end.map_or(rest.len(), |end| body + end + close.len()))
}

/// The token at `at`, or "" past the end.
fn token(tokens: &[String], at: usize) -> &str {
    tokens.get(at).map_or("", String::as_str)
}

fn is_word(token: &str) -> bool {
    token.chars().next().is_some_and(|c| is_word_char(&c))
}

/// Whether a path of two or more segments starts at `at`: not the tail of another path, a field
/// or method, or a macro variable.
fn starts_path(tokens: &[String], at: usize) -> bool {
    let first = token(tokens, at);
    let previous = at.checked_sub(1).map_or("", |p| token(tokens, p));
    let macro_variable = previous == "$" && first != "crate";
    let inside_another = previous == "::" || previous == ".";
    is_word(first) && token(tokens, at + 1) == "::" && !inside_another && !macro_variable
}

/// The paths of the path or use tree at `at`, `a::{b, c::{self, D}}` giving `a::b`, `a::c` and
/// `a::c::D`; and where it ends.
fn parse_path_tree(tokens: &[String], mut at: usize) -> (Vec<Vec<String>>, usize) {
    let mut prefix: Vec<String> = Vec::new();
    loop {
        let here = token(tokens, at);
        if here == "{" {
            let (tails, end) = parse_use_group(tokens, at + 1);
            let paths = tails
                .into_iter()
                .map(|tail| [prefix.clone(), tail].concat());
            return (paths.collect(), end);
        }
        if !is_word(here) {
            return (vec![prefix], at);
        }
        prefix.push(here.to_string());
        let after = token(tokens, at + 2);
        if token(tokens, at + 1) != "::" || !(is_word(after) || after == "{") {
            return (vec![prefix], at + 1);
        }
        at += 2;
    }
}

/// The paths inside the `{ .. }` of a use tree, from just after `{`, `self` being the empty
/// path; and where it ends.
fn parse_use_group(tokens: &[String], mut at: usize) -> (Vec<Vec<String>>, usize) {
    let mut paths = Vec::new();
    loop {
        match token(tokens, at) {
            "" => return (paths, at),
            "}" => return (paths, at + 1),
            "as" => at += 2,
            "self" => {
                paths.push(Vec::new());
                at += 1;
            }
            here if is_word(here) || here == "{" => {
                let (tree, end) = parse_path_tree(tokens, at);
                paths.extend(tree);
                at = end;
            }
            _ => at += 1,
        }
    }
}

/// Every path of two or more segments in the source (code, `use` items, macro calls), and the
/// `mod name;` items outside any braces.
fn scan(source: &str) -> Scan {
    let tokens = tokenize(source);
    let mut scan = Scan::default();
    let mut inline: Vec<(String, usize)> = Vec::new(); // each with the depth of its `{`
    let (mut depth, mut at) = (0, 0);
    while at < tokens.len() {
        if starts_path(&tokens, at) {
            let (paths, end) = parse_path_tree(&tokens, at);
            let inline_modules: Vec<String> = inline.iter().map(|(name, _)| name.clone()).collect();
            for segments in paths {
                let inline_modules = inline_modules.clone();
                scan.paths.push(WrittenPath {
                    segments,
                    inline_modules,
                });
            }
            at = end;
            continue;
        }
        let name = token(&tokens, at + 1).to_string();
        match (tokens[at].as_str(), token(&tokens, at + 2)) {
            ("mod", "{") => inline.push((name, depth)),
            ("mod", ";") if depth == 0 => scan.file_modules.push(name),
            ("{", _) => depth += 1,
            ("}", _) => {
                depth = depth.saturating_sub(1);
                if inline.last().map(|(_, opened_at)| *opened_at) == Some(depth) {
                    inline.pop();
                }
            }
            _ => {}
        }
        at += 1;
    }
    scan
}

/// What a written path in `module` names in this crate, below the root: `crate::`, `self::` and
/// `super::` paths, and paths from one of its children; `None` for anything else.
fn resolve(path: &WrittenPath, module: &[String], modules: &Modules) -> Option<ModulePath> {
    let segments = path.segments.as_slice();
    let is_child = |name: &str| modules.contains(&[module, &[name.to_string()]].concat());
    let (mut target, mut tail) = match segments.first()?.as_str() {
        "crate" => (Vec::new(), &segments[1..]),
        "self" | "super" => ([module, &path.inline_modules].concat(), segments),
        name if is_child(name) => (module.to_vec(), segments),
        _ => return None,
    };
    while let Some((first, after)) = tail.split_first() {
        match first.as_str() {
            "super" => drop(target.pop()?),
            "self" => {}
            _ => break,
        }
        tail = after;
    }
    target.extend_from_slice(tail);
    Some(target)
}

/// The deepest module `target` starts with: `a::b::Item` is `a::b` if that exists, else `a`.
fn deepest_module(modules: &Modules, target: &[String]) -> ModulePath {
    let mut prefixes = (0..=target.len()).rev().map(|len| target[..len].to_vec());
    prefixes.find(|p| modules.contains(p)).unwrap_or_default()
}

/// The module cycles of one crate, given all its files. Each reference becomes an edge between
/// the children of its ends' lowest common ancestor, in that ancestor's graph of siblings.
fn module_cycles(files: &[SourceFile]) -> Vec<Cycle> {
    let mut modules = Modules::new();
    for file in files {
        modules.extend((0..=file.module.len()).map(|len| file.module[..len].to_vec()));
    }
    let mut examples_by_parent: BTreeMap<ModulePath, Examples> = BTreeMap::new();
    for file in files {
        let from = &file.module;
        for path in scan(&file.source).paths {
            let Some(target) = resolve(&path, from, &modules) else {
                continue;
            };
            let to = deepest_module(&modules, &target);
            let shared = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if shared < from.len() && shared < to.len() {
                let edge = (from[..=shared].join("::"), to[..=shared].join("::"));
                let example = format!("{}: {}", file.display, path.segments.join("::"));
                let examples = examples_by_parent
                    .entry(from[..shared].to_vec())
                    .or_default();
                examples.entry(edge).or_insert(example);
            }
        }
    }
    examples_by_parent
        .values()
        .flat_map(cycles_among_siblings)
        .collect()
}

/// The strongly connected parts of more than one sibling, with an example for each edge.
fn cycles_among_siblings(examples: &Examples) -> Vec<Cycle> {
    let mut graph = Graph::new();
    for (from, to) in examples.keys() {
        graph.entry(from.clone()).or_default().insert(to.clone());
    }
    let mut cycles = Vec::new();
    for members in strongly_connected_components(&graph) {
        let mut evidence = Vec::new();
        for ((from, to), example) in examples {
            if members.contains(from.as_str()) && members.contains(to.as_str()) {
                evidence.push(format!("{from} -> {to}: {example}"));
            }
        }
        let walk = closed_walk(&graph, &members);
        cycles.push(Cycle { walk, evidence });
    }
    cycles
}

/// The sets of two or more nodes that all reach each other, straight from the definition: a
/// graph of siblings has a few dozen nodes at most.
fn strongly_connected_components(graph: &Graph) -> BTreeSet<BTreeSet<&str>> {
    let reach: BTreeMap<&str, _> = graph
        .keys()
        .map(|n| (n.as_str(), breadth_first(graph, n)))
        .collect();
    let mut components = BTreeSet::new();
    for (node, reached) in &reach {
        let back = |other: &&&str| reach.get(*other).is_some_and(|r| r.contains_key(node));
        let component: BTreeSet<&str> = reached.keys().filter(back).copied().collect();
        if component.len() > 1 {
            components.insert(component);
        }
    }
    components
}

/// Every node reached from `from`, with the node it was first reached from.
fn breadth_first<'g>(graph: &'g Graph, from: &'g str) -> BTreeMap<&'g str, &'g str> {
    let (mut parents, mut queue) = (BTreeMap::new(), VecDeque::from([from]));
    while let Some(node) = queue.pop_front() {
        for next in graph.get(node).into_iter().flatten() {
            if !parents.contains_key(next.as_str()) {
                parents.insert(next.as_str(), node);
                queue.push_back(next.as_str());
            }
        }
    }
    parents
}

/// A walk from the first member to each member not yet passed, by shortest paths, and back.
fn closed_walk(graph: &Graph, members: &BTreeSet<&str>) -> Vec<String> {
    let start = *members.first().expect("a cycle has members");
    let mut walk = vec![start];
    for goal in members.iter().copied().skip(1).chain([start]) {
        if goal != start && walk.contains(&goal) {
            continue;
        }
        let here = walk[walk.len() - 1];
        let parents = breadth_first(graph, here);
        let mut leg = vec![goal];
        while let Some(&previous) = parents.get(leg[leg.len() - 1]).filter(|p| **p != here) {
            leg.push(previous);
        }
        walk.extend(leg.into_iter().rev());
    }
    walk.into_iter().map(String::from).collect()
}

fn describe(crate_name: &str, cycle: &Cycle) -> String {
    let mut lines = vec![format!("crate {crate_name}: {}", cycle.walk.join(" -> "))];
    lines.extend(cycle.evidence.iter().map(|edge| format!("    {edge}")));
    lines.join("\n")
}

// ---- The workspace on disk ----

/// The `members = [..]` of the workspace's Cargo.toml.
fn workspace_members(root: &Path) -> Vec<String> {
    let manifest = fs::read_to_string(root.join("Cargo.toml")).expect("read workspace Cargo.toml");
    let list = manifest
        .split_once("members")
        .and_then(|(_, rest)| rest.split_once('['));
    let list = list.and_then(|(_, rest)| rest.split_once(']'));
    let (list, _) = list.expect("the workspace Cargo.toml has `members = [..]`");
    let names = list
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_string());
    names.filter(|m| !m.is_empty()).collect()
}

/// A package's crate roots, each with its name in the report: src/lib.rs, src/main.rs and
/// src/bin/*.rs.
fn crate_roots(package_dir: &Path, package: &str) -> Vec<(String, PathBuf)> {
    let src = package_dir.join("src");
    let (lib, main) = (src.join("lib.rs"), src.join("main.rs"));
    let main_name = format!("{package}{}", if lib.is_file() { " (main.rs)" } else { "" });
    let mut roots = vec![(package.to_string(), lib), (main_name, main)];
    let entries = fs::read_dir(src.join("bin")).into_iter().flatten();
    let mut bins: Vec<PathBuf> = entries.flatten().map(|entry| entry.path()).collect();
    bins.sort();
    for bin in bins {
        let name = bin.file_name().map(|n| n.to_string_lossy().to_string());
        roots.push((format!("{package} (bin/{})", name.unwrap_or_default()), bin));
    }
    roots.retain(|(_, root)| root.is_file() && root.extension().is_some_and(|e| e == "rs"));
    roots
}

/// Every file of the crate at `root_file`, found as rustc finds them: from `mod name;` items,
/// `name.rs` or `name/mod.rs` beside a crate root or mod.rs, and under `a/` beside `a.rs`.
fn crate_sources(workspace: &Path, root_file: &Path) -> Vec<SourceFile> {
    let mut files = Vec::new();
    let mut pending = vec![(ModulePath::new(), root_file.to_path_buf(), true)];
    while let Some((module, path, owns_its_directory)) = pending.pop() {
        let source = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        let directory = if owns_its_directory {
            path.with_file_name("")
        } else {
            path.with_extension("")
        };
        for child in scan(&source).file_modules {
            let flat = directory.join(format!("{child}.rs"));
            let owns = !flat.is_file();
            let child_path = if owns {
                directory.join(&child).join("mod.rs")
            } else {
                flat
            };
            assert!(
                child_path.is_file(),
                "`mod {child};` in {path:?}: no file (#[path] is not read)"
            );
            pending.push(([module.clone(), vec![child]].concat(), child_path, owns));
        }
        let relative = path.strip_prefix(workspace).unwrap_or(&path);
        let display = relative.display().to_string();
        files.push(SourceFile {
            module,
            display,
            source,
        });
    }
    files.sort_by(|a, b| a.display.cmp(&b.display));
    files
}

/// Every module cycle of every crate of the workspace at `root`, described for a developer.
fn workspace_cycle_report(root: &Path) -> Vec<String> {
    let mut report = Vec::new();
    for package in workspace_members(root) {
        for (crate_name, root_file) in crate_roots(&root.join(&package), &package) {
            let cycles = module_cycles(&crate_sources(root, &root_file));
            report.extend(cycles.iter().map(|cycle| describe(&crate_name, cycle)));
        }
    }
    report
}

#[test]
fn workspace_has_no_module_cycles() {
    let report = workspace_cycle_report(&Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    let message = format!("{} module cycle(s), one reference per edge:", report.len());
    assert!(report.is_empty(), "{message}\n\n{}\n", report.join("\n\n"));
}

// ---- The core on fixtures ----

fn module_path(path: &str) -> ModulePath {
    path.split("::")
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// What `source` in `module` names, as `a::b::Item`, in a crate of `modules`.
fn resolved(module: &str, modules: &[&str], source: &str) -> Vec<String> {
    let modules: Modules = modules.iter().map(|m| module_path(m)).collect();
    let in_module = |path| resolve(&path, &module_path(module), &modules);
    let paths = scan(source).paths.into_iter().filter_map(in_module);
    paths.map(|path| path.join("::")).collect()
}

/// The walks of the cycles among `(module, source)` files.
fn cycles_in(files: &[(&str, &str)]) -> Vec<String> {
    let file = |(module, source): &(&str, &str)| SourceFile {
        module: module_path(module),
        display: format!("{module}.rs"),
        source: source.to_string(),
    };
    let cycles = module_cycles(&files.iter().map(file).collect::<Vec<_>>());
    cycles
        .into_iter()
        .map(|cycle| cycle.walk.join(" -> "))
        .collect()
}

#[test]
fn nested_use_groups_give_every_path() {
    let source = "use crate::{a::X, b::{c, d::{self, Y as Z}}}; use super::{x, y::*};";
    let expected = ["a::X", "b::c", "b::d", "b::d::Y", "m::x", "m::y"];
    assert_eq!(resolved("m::n", &[], source), expected);
}

#[test]
fn relative_paths_start_from_the_module_they_are_written_in() {
    let source = "use super::super::x::Y; fn f() { super::z::g(); self::w::h(); }";
    assert_eq!(
        resolved("a::b::c", &[], source),
        ["a::x::Y", "a::b::z::g", "a::b::c::w::h"]
    );
    assert!(
        resolved("a", &[], "use super::super::x;").is_empty(),
        "above the crate root"
    );
    let in_tests = "mod tests { use super::super::testkit::T; use super::*; }\nuse super::order;";
    let expected = ["sched::testkit::T", "sched::plan", "sched::order"];
    assert_eq!(resolved("sched::plan", &[], in_tests), expected);
}

#[test]
fn bare_paths_count_only_when_they_name_a_child() {
    let source = "use run::Plan; use tokio::sync; fn f() { run::go(); x.run::<u8>(); }";
    assert_eq!(
        resolved("exec", &["exec::run"], source),
        ["exec::run::Plan", "exec::run::go"]
    );
}

#[test]
fn comments_strings_and_chars_are_not_references() {
    let source = r###"
        // crate::a::X   /* crate::b */  /// crate::c
        /* outer /* crate::d */ crate::e */
        const S: &str = "crate::f \" crate::g";
        const R: &str = r#"crate::h "quoted" crate::i"#;
        const B: &[u8] = br"crate::j\";
        const C: char = '"'; const Q: char = '\''; const E: char = '\u{22}';
        fn f<'a>(x: &'a str) -> &'a str { 'outer: loop { break 'outer crate::real::X; } }
        fn g() { let _ = b"crate::k"; let r#type = crate::also_real::Y; }
    "###;
    assert_eq!(resolved("", &[], source), ["real::X", "also_real::Y"]);
}

#[test]
fn a_ring_of_three_siblings_is_a_cycle() {
    let files = [
        ("a", "use crate::b::B;"),
        ("b", "use crate::c::C;"),
        ("c", "use crate::a::A;"),
    ];
    assert_eq!(cycles_in(&files), ["a -> b -> c -> a"]);
}

#[test]
fn parent_and_child_naming_each_other_is_not_a_cycle() {
    let parent = (
        "p",
        "pub use q::X; use self::q::Y; fn f() { crate::p::q::z() }",
    );
    let child = ("p::q", "use super::Z; use crate::p::W; use crate::T;");
    assert!(cycles_in(&[("", "pub use p::q::X;"), parent, child]).is_empty());
}

#[test]
fn a_lone_self_reference_is_not_a_cycle() {
    assert!(cycles_in(&[("a", "use crate::a::X; use self::Y;"), ("b", "")]).is_empty());
}

#[test]
fn a_cycle_between_siblings_inside_a_module_is_named_by_path() {
    let gpu = ("commands::gpu", "fn f() { super::gpu_partition::run() }");
    let partition = (
        "commands::gpu_partition",
        "use crate::commands::gpu::{self, Args};",
    );
    let expected = ["commands::gpu -> commands::gpu_partition -> commands::gpu"];
    assert_eq!(cycles_in(&[gpu, partition]), expected);
}

#[test]
fn cousins_naming_each_other_make_a_cycle_of_their_ancestors() {
    let files = [
        ("a::x", "use crate::b::y::Y;"),
        ("b::y", "use crate::a::X;"),
    ];
    assert_eq!(cycles_in(&files), ["a -> b -> a"]);
}

#[test]
fn an_item_path_names_its_deepest_module() {
    let modules: Modules = ["", "a", "a::b"].map(module_path).into();
    let deepest = |path| deepest_module(&modules, &module_path(path)).join("::");
    assert_eq!(
        ["a::b::Item", "a::Item", "zz::Item"].map(deepest),
        ["a::b", "a", ""]
    );
}
