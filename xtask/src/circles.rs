//! `cargo xtask circles`: import circles between the files of one crate.
//!
//! A file imports another when its code (comments and doc links aside) names an item through
//! a path that ends there: `crate::a::b`, `super::x`, or a `use` of a child module
//! (`use report::print_table`). A path through a re-export (`pub use crate::shapes::GemmShape` in `gemm.rs`, or the
//! crate root's `pub use gemm::{GemmShape, ..}`) is followed to the file that defines the item,
//! so a facade is not a circle. Glob imports (`use super::*`), the crate root, and references
//! between a module and its own submodules (a folder module is one unit) are not edges. Files that import each other in a
//! loop (a strongly connected component of two or more files) are a circle.
//!
//! This reads paths as text: a macro-built path or a name brought in by a glob and used bare
//! is not seen. It finds the circles that `use` lists and qualified paths make, which is how
//! this workspace names what it imports.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The source roots checked: each crate's `src` (a library or binary root inside it).
const SOURCE_ROOTS: &[&str] = &["src", "xtask/src"];
/// Where the workspace's member crates live, each with its own `src`.
const CRATES_DIR: &str = "crates";
/// Circles kept on purpose: the files of each (relative to the workspace root) and why.
const KEPT: &[(&[&str], &str)] = &[(
    &["crates/uopc-ir/src/ops.rs", "crates/uopc-ir/src/uop.rs"],
    "the types are mutually recursive: a UOp holds its Op, and a custom kernel's Op holds its program, a UOp",
)];
/// How many re-exports a path is followed through before it is taken where it stands.
const MAX_REEXPORT_HOPS: usize = 8;

/// One crate's files by module path (`[]` for the root, `["x86", "avx512"]` for
/// `x86/avx512.rs`), and each file's text.
struct Crate {
    files: BTreeMap<Vec<String>, (PathBuf, String)>,
}

impl Crate {
    /// Reads every `.rs` file under `src` (the root being `lib.rs` or `main.rs`).
    fn read(src: &Path) -> std::io::Result<Crate> {
        let mut files = BTreeMap::new();
        let mut stack = vec![src.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir)? {
                let path = entry?.path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let rel = path.strip_prefix(src).unwrap_or(&path);
                    let text = std::fs::read_to_string(&path)?;
                    files.insert(module_path(rel), (path.clone(), text));
                }
            }
        }
        Ok(Crate { files })
    }

    /// The longest prefix of `path` that names a file of this crate, and what follows it.
    fn split<'p>(&self, path: &'p [String]) -> (Vec<String>, &'p [String]) {
        for cut in (0..=path.len()).rev() {
            if self.files.contains_key(&path[..cut]) {
                return (path[..cut].to_vec(), &path[cut..]);
            }
        }
        (Vec::new(), path)
    }

    /// The module of the file that defines what `path` (absolute, from the crate root) names,
    /// following re-exports.
    fn resolve(&self, path: &[String], hops: usize) -> Vec<String> {
        let (module, rest) = self.split(path);
        let Some(name) = rest.first() else { return module };
        if hops < MAX_REEXPORT_HOPS
            && let Some((_, text)) = self.files.get(&module)
            && let Some(target) = reexports(text, &module, name, self).into_iter().next()
        {
            return self.resolve(&target, hops + 1);
        }
        module
    }
}

/// The module path of a file at `rel` under `src`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "lib" | "main" | "mod") {
        parts.push(stem.to_string());
    }
    parts
}

/// Every path the text names from `crate::`, `super::`, `self::` or (in a `use`) a child
/// module of `module`, each made absolute; groups (`a::{b, c::d}`) are expanded and globs
/// dropped.
fn referenced_paths(text: &str, module: &[String], krate: &Crate) -> Vec<Vec<String>> {
    // The module a `super::` is relative to: a file's own module, whose parent `super` names.
    let here: Vec<String> = module.to_vec();
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        let rest = &text[i..];
        let base: Option<(Vec<String>, usize)> = if !starts_word {
            None
        } else if rest.starts_with("crate::") {
            Some((Vec::new(), "crate::".len()))
        } else if rest.starts_with("super::") {
            let mut parent = here.clone();
            let mut len = 0;
            let mut r = rest;
            while let Some(after) = r.strip_prefix("super::") {
                parent.pop();
                len += "super::".len();
                r = after;
            }
            Some((parent, len))
        } else if rest.starts_with("self::") {
            Some((here.clone(), "self::".len()))
        } else if let Some(used) = rest.strip_prefix("use ") {
            // `use child::item`: a child module of this file's module.
            let after = used.trim_start();
            let skip = rest.len() - after.len();
            let first: String =
                after.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            let mut child = here.clone();
            child.push(first);
            (krate.files.contains_key(&child)
                && after[child.last().map_or(0, String::len)..].starts_with("::"))
            .then_some((here.clone(), skip))
        } else {
            None
        };
        match base {
            Some((base, len)) => {
                let (paths, used) = parse_tree(&text[i + len..]);
                for p in paths {
                    let mut full = base.clone();
                    full.extend(p);
                    out.push(full);
                }
                i += len + used.max(1);
            }
            None => i += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    out
}

/// Parses a use tree at the start of `s` (`a::b`, `a::{b, c::{d, e}}`, `*`), returning each
/// leaf path (globs and `self` leaves end at their module) and the bytes read.
fn parse_tree(s: &str) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    let mut i = 0;
    let b = s.as_bytes();
    if s.starts_with('*') {
        return (Vec::new(), 1);
    }
    loop {
        let start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        if i > start {
            prefix.push(s[start..i].to_string());
        }
        if s[i..].starts_with("::{") {
            i += 3;
            let mut out = Vec::new();
            loop {
                while i < b.len() && (b[i] == b' ' || b[i] == b'\n' || b[i] == b',') {
                    i += 1;
                }
                if i >= b.len() || b[i] == b'}' {
                    i += 1;
                    break;
                }
                let (inner, used) = parse_tree(&s[i..]);
                for p in inner {
                    let mut full = prefix.clone();
                    full.extend(p.into_iter().filter(|x| x != "self"));
                    out.push(full);
                }
                i += used.max(1);
            }
            return (out, i);
        }
        if s[i..].starts_with("::") && s[i + 2..].starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
            i += 2;
            continue;
        }
        // A glob names no item of its own: what it brings in is seen only where it is named.
        if s[i..].starts_with("::*") {
            return (Vec::new(), i + 3);
        }
        // A `self` leaf ends at its module.
        return (vec![prefix], i);
    }
}

/// Where `module`'s file imports `name` from (`use path::name` or `use path::{.., name, ..}`,
/// with any visibility), as absolute paths.
fn reexports(text: &str, module: &[String], name: &str, krate: &Crate) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for stmt in text.split(';') {
        let t = stmt.trim_start();
        let Some(at) = t.find("use ") else { continue };
        // Only a `use` item (with any visibility: a child sees its parent's private imports),
        // not a `use` word inside other code.
        let head = t[..at].rsplit('\n').next().unwrap_or_default().trim();
        if !(head.is_empty() || head.starts_with("pub")) || head.contains(' ') {
            continue;
        }
        let body = &t[at + "use ".len()..];
        for path in referenced_paths(&format!("use {body}"), module, krate)
            .into_iter()
            .chain(relative_use(body, module))
        {
            if path.last().is_some_and(|last| last == name) {
                out.push(path);
            }
        }
    }
    out
}

/// The paths of a `use` body written relative to `module` (`gemm::{GemmShape, ..}` in the
/// crate root), made absolute.
fn relative_use(body: &str, module: &[String]) -> Vec<Vec<String>> {
    let body = body.trim();
    if body.starts_with("crate::") || body.starts_with("super::") || body.starts_with("self::") {
        return Vec::new();
    }
    let (paths, _) = parse_tree(body);
    paths
        .into_iter()
        .map(|p| {
            let mut full = module.to_vec();
            full.extend(p);
            full
        })
        .collect()
}

/// `text` without its test module (`#[cfg(test)] mod ..` to the end, where this workspace
/// keeps it): a test module's `super` is its own file, not the file's parent.
fn without_tests(text: &str) -> &str {
    let mut from = 0;
    while let Some(at) = text[from..].find("#[cfg(test)]") {
        let at = from + at;
        if text[at + "#[cfg(test)]".len()..].trim_start().starts_with("mod ") {
            return &text[..at];
        }
        from = at + 1;
    }
    text
}

/// `text` with every `//` comment (doc comments included) blanked: a doc link is a pointer
/// for the reader, not a dependency of the code.
fn without_comments(text: &str) -> String {
    text.lines().map(|line| line.find("//").map_or(line, |at| &line[..at])).collect::<Vec<_>>().join("\n")
}

/// The import edges between one crate's files (by module path), root excluded.
fn edges(krate: &Crate) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut out: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, (_, text)) in &krate.files {
        if module.is_empty() {
            continue;
        }
        for p in referenced_paths(&without_comments(without_tests(text)), module, krate) {
            let target = krate.resolve(&p, 0);
            // A folder module and its own children are one unit: a child implementing part of
            // its parent's types, and the parent re-exporting it, is no circle.
            let related = target.starts_with(module) || module.starts_with(&target);
            if !target.is_empty() && !related {
                out.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    out
}

/// The strongly connected components of two or more nodes (Tarjan's algorithm).
fn circles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct State<'g> {
        graph: &'g BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: HashMap<&'g Vec<String>, usize>,
        low: HashMap<&'g Vec<String>, usize>,
        stack: Vec<&'g Vec<String>>,
        on_stack: BTreeSet<&'g Vec<String>>,
        out: Vec<Vec<Vec<String>>>,
    }
    fn visit<'g>(st: &mut State<'g>, v: &'g Vec<String>) {
        let n = st.index.len();
        st.index.insert(v, n);
        st.low.insert(v, n);
        st.stack.push(v);
        st.on_stack.insert(v);
        for w in st.graph.get(v).into_iter().flatten() {
            if !st.index.contains_key(w) {
                visit(st, w);
                let lw = st.low[w];
                let lv = st.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if st.on_stack.contains(w) {
                let iw = st.index[w];
                let lv = st.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if st.low[v] == st.index[v] {
            let mut component = Vec::new();
            while let Some(w) = st.stack.pop() {
                st.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                st.out.push(component);
            }
        }
    }
    let mut st = State {
        graph,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !st.index.contains_key(v) {
            visit(&mut st, v);
        }
    }
    st.out
}

/// The circles of the crate whose sources are under `src`, each as its files' paths.
fn crate_circles(src: &Path) -> std::io::Result<Vec<Vec<PathBuf>>> {
    let krate = Crate::read(src)?;
    let found = circles(&edges(&krate));
    Ok(found
        .into_iter()
        .map(|c| c.iter().filter_map(|m| krate.files.get(m).map(|(p, _)| p.clone())).collect())
        .collect())
}

/// Runs the check over every crate of the workspace at `root`; fails when a circle exists.
pub fn run(root: &Path) -> ExitCode {
    let mut roots: Vec<PathBuf> = SOURCE_ROOTS.iter().map(|r| root.join(r)).collect();
    if let Ok(dir) = std::fs::read_dir(root.join(CRATES_DIR)) {
        roots.extend(dir.filter_map(Result::ok).map(|e| e.path().join("src")));
    }
    roots.retain(|r| r.is_dir());
    roots.sort();
    let mut total = 0;
    for src in &roots {
        match crate_circles(src) {
            Ok(found) => {
                for circle in &found {
                    let names: Vec<String> = circle
                        .iter()
                        .map(|p| p.strip_prefix(root).unwrap_or(p).display().to_string())
                        .collect();
                    let kept = KEPT.iter().find(|(files, _)| {
                        files.len() == names.len() && files.iter().all(|f| names.iter().any(|n| n == f))
                    });
                    match kept {
                        Some((_, why)) => println!("kept circle: {} ({why})", names.join(" <-> ")),
                        None => {
                            println!("import circle: {}", names.join(" <-> "));
                            total += 1;
                        }
                    }
                }
            }
            Err(e) => {
                eprintln!("error: reading {}: {e}", src.display());
                return ExitCode::FAILURE;
            }
        }
    }
    println!("import circles: {total} in {} crates", roots.len());
    if total == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        for (name, text) in files {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
            std::fs::write(path, text).expect("write");
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("uopc-circles-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_loop_through_use_lists_and_qualified_paths_is_a_circle() {
        let dir = scratch("loop");
        write(
            &dir,
            &[
                ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
                ("a.rs", "use crate::b::{Thing, other::Deep};\n"),
                ("b.rs", "pub struct Thing;\nfn f() { crate::c::g() }\n"),
                ("c.rs", "pub fn g() { let _ = crate::a::A; }\n"),
            ],
        );
        let found = crate_circles(&dir).expect("reads");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].len(), 3, "{found:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn re_exports_and_globs_and_children_are_not_circles() {
        let dir = scratch("facade");
        write(
            &dir,
            &[
                // The root and a front end re-export a leaf's item; the leaf's users name it
                // through them.
                ("lib.rs", "mod front;\nmod leaf;\nmod kernel;\npub use front::Shape;\n"),
                ("front.rs", "pub use crate::leaf::Shape;\nuse crate::kernel::run;\n"),
                ("leaf.rs", "pub struct Shape;\n"),
                ("kernel.rs", "use crate::Shape;\nuse crate::front::Shape as S;\npub fn run() {}\n"),
                // A parent re-exports a child's function; the child takes the parent's names by glob.
                ("bench/mod.rs", "mod backward;\npub use backward::run_backward;\n"),
                ("bench/backward.rs", "use super::*;\npub fn run_backward() {}\n"),
            ],
        );
        let found = crate_circles(&dir).expect("reads");
        assert!(found.is_empty(), "{found:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn use_trees_expand_to_each_leaf() {
        let (paths, _) = parse_tree("a::{b, c::{d, e}, self, f::*}");
        let s: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
        assert_eq!(s, ["a::b", "a::c::d", "a::c::e", "a"]);
    }
}
