//! The workspace's structure, checked from its source text with std only (no parser crate):
//!
//! - **Import circles**, a hard failure: per crate, a graph of modules in which an edge A -> B
//!   means that non-test code in module A names a path into its sibling module B (`crate::B..`,
//!   `super::B..`, `$crate::..` at any depth: the edge is drawn at the level where the two paths
//!   part). A circle among siblings means neither can be understood, tested or moved alone. The
//!   only exceptions are the circles in [`CIRCLES_ALLOWED`], which may shrink but not grow.
//! - **Long files**: a non-test source file over [`MAX_FILE_LINES`] lines says why in its module
//!   doc at the top, on a line starting `//! Size:`.
//! - **Long functions**: no function in non-test code is over [`MAX_FN_LINES`] lines, counted from
//!   its `fn` line to its closing brace.
//!
//! Test code is exempt from all three: files named `tests.rs` or `*_tests.rs`, modules and items
//! under `#[cfg(test)]` or `#[test]` (inline or in their own files), and the `tests/` folders (not
//! read). Only the `src/` folders of the root package and of the four crates are read.
//!
//! The parsing is rough on purpose: comments and the insides of string and char literals are
//! blanked out, then braces are counted. Where it cannot make sense of a file (braces that do not
//! balance, a `#[path]` on a non-test module) it fails and says so rather than guess.
//!
//! Files still being split are in the allow-lists below: their long files, long functions and
//! circles are printed, not failed. Run `cargo test --test it structure -- --nocapture` to see
//! the counts.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

/// A non-test source file over this many lines needs a [`SIZE_MARKER`] line in its module doc.
const MAX_FILE_LINES: usize = 800;
/// A non-test function over this many lines (from its `fn` line to its closing brace) fails.
const MAX_FN_LINES: usize = 120;
/// The start of the module-doc line that says why a file is long, e.g.
/// `//! Size: one table per codec, kept together so that the formats can be compared.`
const SIZE_MARKER: &str = "//! Size:";

/// Files over [`MAX_FILE_LINES`] lines without a [`SIZE_MARKER`] line, allowed until they are
/// split: (file, why). Remove an entry once its file is split (the test prints stale entries).
const LONG_FILES_ALLOWED: &[(&str, &str)] = &[];

/// Files with functions over [`MAX_FN_LINES`] lines, allowed until they are split: (file, why).
/// Remove an entry once its functions are split (the test prints stale entries).
const LONG_FUNCTIONS_ALLOWED: &[(&str, &str)] = &[];

/// Import circles still to be broken, allowed until then: (crate, parent module, its children in
/// the circle, why). A circle passes only if all its modules are in one entry, so an entry may
/// shrink as the circle is broken but never grow. Remove an entry once its circle is gone (the
/// test prints stale entries).
const CIRCLES_ALLOWED: &[(&str, &str, &[&str], &str)] = &[];

/// The crates whose modules are checked: (display name, source folder, root file).
const CRATES: &[(&str, &str, &str)] = &[
    ("loco-core", "core/src", "lib.rs"),
    ("loco-sim", "sim/src", "lib.rs"),
    ("loco-real", "real/src", "lib.rs"),
    ("loco-reports", "reports/src", "lib.rs"),
    ("loco", "src", "main.rs"),
];

#[test]
fn no_import_circles_between_sibling_modules() {
    let files = workspace();
    let (mut failing, mut tolerated) = (String::new(), String::new());
    // Entries that some circle still touches (allowed or not: a grown circle fails as new).
    let mut touched = BTreeSet::new();
    let mut count = 0;
    for (krate, _, _) in CRATES {
        let crate_files: Vec<&Source> = files.iter().filter(|f| f.krate == *krate).collect();
        for circle in circles(&crate_files) {
            count += 1;
            let same_place = |(k, parent, _, _): &(&str, &str, &[&str], &str)| {
                k == krate && *parent == circle.parent
            };
            let is_in = |members: &[&str]| {
                let n = circle.members.iter().filter(|m| members.contains(&m.as_str())).count();
                (n > 0, n == circle.members.len())
            };
            let mut allowed = false;
            for (i, entry) in CIRCLES_ALLOWED.iter().enumerate() {
                let (some, all) = is_in(entry.2);
                if same_place(entry) && some {
                    touched.insert(i);
                    allowed |= all;
                }
            }
            let out = if allowed { &mut tolerated } else { &mut failing };
            writeln!(out, "{krate}: {}", circle.text).unwrap();
        }
    }
    println!(
        "structure: {count} import circles between sibling modules ({} of them allowed for \
         now):\n{tolerated}{failing}",
        tolerated.lines().filter(|l| !l.starts_with(' ')).count(),
    );
    for (i, (krate, parent, members, _)) in CIRCLES_ALLOWED.iter().enumerate() {
        if !touched.contains(&i) {
            println!(
                "structure: the circle {krate}: {{{}}} under {parent} is gone: remove its \
                 allow-list entry",
                members.join(", ")
            );
        }
    }
    assert!(
        failing.is_empty(),
        "import circles between sibling modules (make the dependency go one way: move what both \
         need into the lower module, or into a new one both use):\n{failing}"
    );
}

#[test]
fn long_files_say_why_they_are_long() {
    let files = workspace();
    let long: Vec<(&str, usize)> = files
        .iter()
        .filter(|f| !f.test && f.lines > MAX_FILE_LINES && !has_size_note(&f.text))
        .map(|f| (f.rel.as_str(), f.lines))
        .collect();
    let list = |allowed: bool| -> String {
        long.iter()
            .filter(|(rel, _)| allowed_in(LONG_FILES_ALLOWED, rel) == allowed)
            .map(|(rel, n)| format!("  {rel}: {n} lines\n"))
            .collect()
    };
    let (failing, tolerated) = (list(false), list(true));
    println!(
        "structure: {} non-test files over {MAX_FILE_LINES} lines without a `{SIZE_MARKER}` line \
         ({} of them allowed for now):\n{tolerated}{failing}",
        long.len(),
        long.len() - failing.lines().count(),
    );
    print_stale(LONG_FILES_ALLOWED, |rel| long.iter().any(|(r, _)| *r == rel));
    assert!(
        failing.is_empty(),
        "files over {MAX_FILE_LINES} lines whose module doc does not say why: split them, or add \
         a line starting `{SIZE_MARKER}` to the `//!` doc at the top saying why the file is one \
         piece:\n{failing}"
    );
}

#[test]
fn functions_are_at_most_120_lines() {
    let files = workspace();
    let long: Vec<(&str, &LongFn)> =
        files.iter().flat_map(|f| f.long_fns.iter().map(move |l| (f.rel.as_str(), l))).collect();
    let list = |allowed: bool| -> String {
        long.iter()
            .filter(|(rel, _)| allowed_in(LONG_FUNCTIONS_ALLOWED, rel) == allowed)
            .map(|(rel, l)| format!("  {rel}:{} fn {}: {} lines\n", l.line, l.name, l.lines))
            .collect()
    };
    let (failing, tolerated) = (list(false), list(true));
    let in_files: BTreeSet<&str> = long.iter().map(|(rel, _)| *rel).collect();
    println!(
        "structure: {} non-test functions over {MAX_FN_LINES} lines in {} files ({} of them in \
         files allowed for now):\n{tolerated}{failing}",
        long.len(),
        in_files.len(),
        long.len() - failing.lines().count(),
    );
    print_stale(LONG_FUNCTIONS_ALLOWED, |rel| in_files.contains(rel));
    assert!(
        failing.is_empty(),
        "functions over {MAX_FN_LINES} lines (from the `fn` line to the closing brace): split \
         them into steps with names:\n{failing}"
    );
}

/// The checker's own parsing, on a made-up file: literals and comments blanked, test code
/// skipped, paths resolved, long functions measured.
#[test]
fn the_structure_parser_reads_paths_tests_and_function_lengths() {
    let text = "//! Doc with crate::mesh in it.\n\
                use crate::{mesh::Member, transport::{self, Frame as F}};\n\
                use super::super::ids::NodeId;\n\
                const S: &str = \"crate::rng::x { \";\n\
                const C: char = '{';\n\
                fn f<'a>(x: &'a str) -> usize {\n\
                    let r = r#\"}\"#;\n\
                    crate::diloco::outer(x)\n\
                }\n\
                /* a /* nested */ comment: crate::codec */ const Q: [u8; 2] = [b'{', b'\\''];\n\
                macro_rules! m { () => { $crate::time::Time::ZERO } }\n\
                #[cfg(test)]\n\
                use crate::metrics::Row;\n\
                #[cfg(test)]\n\
                mod tests {\n\
                    use crate::scenario::Scenario;\n\
                    fn long() {\n\
                    }\n\
                }\n";
    let parsed = parse(text, &["node".into(), "rings".into()], "x.rs").unwrap();
    let targets: Vec<String> = parsed.refs.iter().map(|r| r.path.join("::")).collect();
    assert_eq!(
        targets,
        [
            "mesh::Member",
            "transport",
            "transport::Frame",
            "ids::NodeId",
            "diloco::outer",
            "time::Time::ZERO"
        ]
    );
    assert_eq!(parsed.refs[3].line, 3);
    assert_eq!(parsed.fns.len(), 1, "the test module's fn is skipped");
    assert_eq!((parsed.fns[0].name.as_str(), parsed.fns[0].line, parsed.fns[0].lines), ("f", 6, 4));
    assert!(!parsed.whole_file_test);
    let err = parse("#[path = \"x.rs\"]\nmod y;\n", &[], "z.rs").err().unwrap();
    assert!(err.starts_with("z.rs:2: `#[path]`"), "{err}");
    assert!(parse("fn f() {\n", &[], "z.rs").is_err(), "unbalanced braces are an error");
}

// ---- the workspace ----

/// One source file, read and parsed.
struct Source {
    krate: &'static str,
    /// Path from the workspace root, with `/`.
    rel: String,
    /// Module path in its crate (`["node", "machine"]` for `core/src/node/machine/mod.rs`).
    module: Vec<String>,
    /// The whole file is test code.
    test: bool,
    text: String,
    lines: usize,
    /// Paths this file's non-test code names, resolved from the crate root.
    refs: Vec<Ref>,
    /// Module paths of the inline non-test modules the file defines (`mod imp { .. }`).
    inline_modules: Vec<Vec<String>>,
    long_fns: Vec<LongFn>,
}

struct LongFn {
    name: String,
    line: usize,
    lines: usize,
}

fn workspace() -> Vec<Source> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    let mut test_modules: BTreeSet<(&str, Vec<String>)> = BTreeSet::new();
    let mut problems = String::new();
    for &(krate, dir, root_file) in CRATES {
        let mut paths = Vec::new();
        rust_files(&root.join(dir), &mut paths);
        paths.sort();
        assert!(!paths.is_empty(), "no Rust files under {dir}: is the crate list out of date?");
        for path in paths {
            let rel_in_crate = path.strip_prefix(root.join(dir)).unwrap();
            let rel = format!("{dir}/{}", slashes(rel_in_crate));
            let module = module_path(rel_in_crate, root_file);
            let text = std::fs::read_to_string(&path).unwrap();
            let parsed = match parse(&text, &module, &rel) {
                Ok(p) => p,
                Err(e) => {
                    writeln!(problems, "{e}").unwrap();
                    continue;
                }
            };
            for m in &parsed.test_child_modules {
                test_modules.insert((krate, m.clone()));
            }
            let name = path.file_name().unwrap().to_str().unwrap();
            let test = name == "tests.rs" || name.ends_with("_tests.rs") || parsed.whole_file_test;
            let long_fns = parsed
                .fns
                .iter()
                .filter(|f| f.lines > MAX_FN_LINES)
                .map(|f| LongFn { name: f.name.clone(), line: f.line, lines: f.lines })
                .collect();
            files.push(Source {
                krate,
                rel,
                module,
                test,
                lines: text.lines().count(),
                text,
                refs: parsed.refs,
                inline_modules: parsed.inline_modules,
                long_fns,
            });
        }
    }
    assert!(problems.is_empty(), "the structure check could not read some files:\n{problems}");
    // A file whose module (or an ancestor) is declared `#[cfg(test)] mod x;` is test code.
    for f in &mut files {
        let k = f.krate;
        if (1..=f.module.len()).any(|n| test_modules.contains(&(k, f.module[..n].to_vec()))) {
            f.test = true;
        }
        if f.test {
            f.refs.clear();
            f.long_fns.clear();
        }
    }
    files
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn slashes(p: &Path) -> String {
    p.components().map(|c| c.as_os_str().to_str().unwrap()).collect::<Vec<_>>().join("/")
}

/// `node/machine/mod.rs` -> `[node, machine]`; `testing/nodes.rs` -> `[testing, nodes]`.
fn module_path(rel_in_crate: &Path, root_file: &str) -> Vec<String> {
    let rel = slashes(rel_in_crate);
    if rel == root_file {
        return Vec::new();
    }
    let mut parts: Vec<String> =
        rel.trim_end_matches(".rs").split('/').map(str::to_string).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

fn has_size_note(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .take_while(|l| l.starts_with("//!") || l.is_empty())
        .any(|l| l.strip_prefix(SIZE_MARKER).is_some_and(|why| !why.trim().is_empty()))
}

fn allowed_in(list: &[(&str, &str)], rel: &str) -> bool {
    list.iter().any(|(file, _)| *file == rel)
}

fn print_stale(list: &[(&str, &str)], offends: impl Fn(&str) -> bool) {
    for (file, _) in list {
        if !offends(file) {
            println!("structure: {file} no longer needs its allow-list entry: remove it");
        }
    }
}

// ---- circles ----

/// A circle among sibling modules.
struct Circle {
    /// `crate root` or `crate::a::b`, the modules' parent.
    parent: String,
    /// The modules in the circle, sorted.
    members: Vec<String>,
    /// The circle and where each of its edges comes from.
    text: String,
}

/// Every circle among sibling modules of one crate.
fn circles(files: &[&Source]) -> Vec<Circle> {
    let mut modules: BTreeSet<Vec<String>> = BTreeSet::new();
    for f in files {
        for n in 0..=f.module.len() {
            modules.insert(f.module[..n].to_vec());
        }
        modules.extend(f.inline_modules.iter().cloned());
    }
    // parent -> (from, to) -> where (file, line)
    type Edges<'a> = BTreeMap<(String, String), BTreeSet<(&'a str, usize)>>;
    let mut graphs: BTreeMap<Vec<String>, Edges> = BTreeMap::new();
    for f in files {
        for r in &f.refs {
            let common = r.from.iter().zip(&r.path).take_while(|(a, b)| a == b).count();
            let (Some(a), Some(b)) = (r.from.get(common), r.path.get(common)) else { continue };
            let parent = r.path[..common].to_vec();
            let mut target = parent.clone();
            target.push(b.clone());
            if !modules.contains(&target) {
                continue; // an item (`crate::NodeId`), not a module
            }
            let at = graphs.entry(parent).or_default().entry((a.clone(), b.clone())).or_default();
            at.insert((f.rel.as_str(), r.line));
        }
    }
    let mut out = Vec::new();
    for (parent, edges) in &graphs {
        let scope = if parent.is_empty() {
            "crate root".to_string()
        } else {
            format!("crate::{}", parent.join("::"))
        };
        for members in strongly_connected(edges.keys()) {
            let mut text = format!("{{{}}} under {scope} import each other:", members.join(", "));
            for ((a, b), at) in edges {
                if members.contains(a) && members.contains(b) {
                    let first: Vec<String> =
                        at.iter().take(3).map(|(rel, line)| format!("{rel}:{line}")).collect();
                    let more = match at.len() {
                        0..=3 => String::new(),
                        n => format!(" and {} more", n - 3),
                    };
                    write!(text, "\n    {a} -> {b}: {}{more}", first.join(", ")).unwrap();
                }
            }
            out.push(Circle { parent: scope.clone(), members, text });
        }
    }
    out
}

/// The strongly connected components with more than one node (Tarjan's algorithm).
fn strongly_connected<'a>(edges: impl Iterator<Item = &'a (String, String)>) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        next.entry(a).or_default().push(b);
        next.entry(b).or_default();
    }
    struct Tarjan<'a> {
        next: &'a BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            let next = self.next;
            for &w in &next[v] {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    scc.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        next: &next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in next.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out.sort();
    t.out
}

// ---- parsing one file ----

/// A path named by non-test code.
struct Ref {
    /// The module the path is named in (the file's, plus inline modules around it).
    from: Vec<String>,
    /// The path, resolved from the crate root (`crate::`, `super::` and `self::` removed).
    path: Vec<String>,
    line: usize,
}

struct FnSpan {
    name: String,
    line: usize,
    lines: usize,
}

struct Parsed {
    refs: Vec<Ref>,
    fns: Vec<FnSpan>,
    inline_modules: Vec<Vec<String>>,
    /// Child modules declared `#[cfg(test)] mod x;`, as module paths.
    test_child_modules: Vec<Vec<String>>,
    /// `#![cfg(test)]` at the top.
    whole_file_test: bool,
}

fn parse(text: &str, module: &[String], rel: &str) -> Result<Parsed, String> {
    let c: Vec<char> = blank_literals_and_comments(text);
    let line_starts: Vec<usize> =
        std::iter::once(0).chain((0..c.len()).filter(|&i| c[i] == '\n').map(|i| i + 1)).collect();
    let line_of = |i: usize| line_starts.partition_point(|&s| s <= i);
    let close = match_braces(&c).map_err(|i| {
        format!("{rel}:{}: braces do not balance after blanking literals and comments", line_of(i))
    })?;

    // Test code: items under a test attribute. Inline modules: `mod name {`.
    let mut test_ranges: Vec<(usize, usize)> = Vec::new();
    let mut test_child_modules = Vec::new();
    let mut whole_file_test = false;
    let mut inline: Vec<(String, usize, usize)> = Vec::new();
    let mut i = 0;
    while i < c.len() {
        if c[i] == '#' && matches!(c.get(i + 1), Some('[') | Some('!')) {
            let start = i;
            let mut attrs = Vec::new();
            let mut j = i;
            while c.get(j) == Some(&'#') {
                let inner = c.get(j + 1) == Some(&'!');
                let open = if inner { j + 2 } else { j + 1 };
                if c.get(open) != Some(&'[') {
                    break;
                }
                let end = match_bracket(&c, open)
                    .ok_or_else(|| format!("{rel}:{}: unclosed attribute", line_of(j)))?;
                let attr: String =
                    c[open + 1..end].iter().filter(|ch| !ch.is_whitespace()).collect();
                if inner {
                    whole_file_test |= is_test_attr(&attr);
                } else {
                    attrs.push(attr);
                }
                j = skip_ws(&c, end + 1);
            }
            let test = attrs.iter().any(|a| is_test_attr(a));
            let item = skip_visibility(&c, j);
            if let Some((name, after)) = keyword_ident(&c, item, "mod") {
                let after = skip_ws(&c, after);
                if c.get(after) == Some(&';') {
                    if test {
                        let mut m = module.to_vec();
                        m.push(name);
                        test_child_modules.push(m);
                    } else if attrs.iter().any(|a| a.starts_with("path=")) {
                        return Err(format!(
                            "{rel}:{}: `#[path]` on a non-test module: the structure check maps \
                             files to modules by their names and cannot follow it",
                            line_of(j)
                        ));
                    }
                }
            }
            if test {
                test_ranges.push((start, item_end(&c, &close, item)));
            }
            i = j.max(i + 1);
            continue;
        }
        if let Some((name, after)) = keyword_ident(&c, i, "mod") {
            let open = skip_ws(&c, after);
            if c.get(open) == Some(&'{') {
                inline.push((name, open, close[&open]));
            }
            i = after;
            continue;
        }
        i += 1;
    }
    let in_test = |p: usize| test_ranges.iter().any(|&(s, e)| s <= p && p <= e);
    let module_at = |p: usize| -> Vec<String> {
        let mut m = module.to_vec();
        m.extend(inline.iter().filter(|(_, s, e)| *s < p && p < *e).map(|(n, _, _)| n.clone()));
        m
    };
    let inline_modules =
        inline.iter().filter(|(_, s, _)| !in_test(*s)).map(|(_, s, _)| module_at(*s + 1)).collect();

    // Paths and functions.
    let mut refs = Vec::new();
    let mut fns = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let word_start = i == 0 || !is_ident(c[i - 1]);
        if word_start && ["crate", "super", "self"].iter().any(|w| starts_word(&c, i, w)) {
            let mut j = i;
            let trees = use_tree(&c, &mut j);
            if j > i && !in_test(i) {
                let from = module_at(i);
                for path in trees {
                    if let Some(path) = resolve(&from, &path) {
                        refs.push(Ref { from: from.clone(), path, line: line_of(i) });
                    }
                }
            }
            i = j.max(i + 1);
            continue;
        }
        if word_start && let Some((name, after)) = keyword_ident(&c, i, "fn") {
            if !in_test(i)
                && let Some(open) = fn_body(&c, after)
            {
                let (first, last) = (line_of(i), line_of(close[&open]));
                fns.push(FnSpan { name, line: first, lines: last - first + 1 });
            }
            i = after;
            continue;
        }
        i += 1;
    }
    Ok(Parsed { refs, fns, inline_modules, test_child_modules, whole_file_test })
}

/// The text with comments and the insides of string and char literals replaced by spaces
/// (newlines kept, so that positions keep their lines).
fn blank_literals_and_comments(text: &str) -> Vec<char> {
    let s: Vec<char> = text.chars().collect();
    let mut out = s.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for ch in &mut out[from..to.min(s.len())] {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
    };
    let mut i = 0;
    while i < s.len() {
        let prev_ident = i > 0 && is_ident(s[i - 1]);
        match s[i] {
            '/' if s.get(i + 1) == Some(&'/') => {
                let end = s[i..].iter().position(|&ch| ch == '\n').map_or(s.len(), |n| i + n);
                blank(&mut out, i, end);
                i = end;
            }
            '/' if s.get(i + 1) == Some(&'*') => {
                let (mut depth, mut j) = (0usize, i);
                while j < s.len() {
                    if s[j] == '/' && s.get(j + 1) == Some(&'*') {
                        depth += 1;
                        j += 2;
                    } else if s[j] == '*' && s.get(j + 1) == Some(&'/') {
                        depth -= 1;
                        j += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        j += 1;
                    }
                }
                blank(&mut out, i, j);
                i = j;
            }
            'r' if !prev_ident
                || (i >= 1 && matches!(s[i - 1], 'b' | 'c') && (i < 2 || !is_ident(s[i - 2]))) =>
            {
                let hashes = s[i + 1..].iter().take_while(|&&ch| ch == '#').count();
                if s.get(i + 1 + hashes) != Some(&'"') {
                    i += 1;
                    continue;
                }
                let body = i + 2 + hashes;
                let mut j = body;
                while j < s.len() {
                    if s[j] == '"'
                        && s[j + 1..].iter().take(hashes).filter(|&&ch| ch == '#').count() == hashes
                    {
                        break;
                    }
                    j += 1;
                }
                blank(&mut out, body, j);
                i = j + 1 + hashes;
            }
            '"' => {
                let mut j = i + 1;
                while j < s.len() && s[j] != '"' {
                    j += if s[j] == '\\' { 2 } else { 1 };
                }
                blank(&mut out, i + 1, j);
                i = j + 1;
            }
            '\'' => {
                if s.get(i + 1) == Some(&'\\') {
                    let mut j = i + 3;
                    while j < s.len() && s[j] != '\'' {
                        j += 1;
                    }
                    blank(&mut out, i + 1, j);
                    i = j + 1;
                } else if s.get(i + 2) == Some(&'\'') {
                    blank(&mut out, i + 1, i + 2);
                    i += 3;
                } else {
                    i += 1; // a lifetime or a label
                }
            }
            _ => i += 1,
        }
    }
    out
}

/// Open brace position -> its close brace position; on failure, where it went wrong.
fn match_braces(c: &[char]) -> Result<BTreeMap<usize, usize>, usize> {
    let mut close = BTreeMap::new();
    let mut open = Vec::new();
    for (i, &ch) in c.iter().enumerate() {
        match ch {
            '{' => open.push(i),
            '}' => {
                close.insert(open.pop().ok_or(i)?, i);
            }
            _ => {}
        }
    }
    match open.pop() {
        Some(i) => Err(i),
        None => Ok(close),
    }
}

fn match_bracket(c: &[char], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, &ch) in c.iter().enumerate().skip(open) {
        match ch {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

fn is_test_attr(attr: &str) -> bool {
    attr == "test"
        || attr.ends_with("::test")
        || attr == "cfg(test)"
        || attr.starts_with("cfg(all(test,")
}

/// Where the item (or field, statement, expression) starting at `i` ends: at its first `;` or
/// `,` outside brackets, at the brace that closes its first block, or before the `}` that closes
/// what holds it.
fn item_end(c: &[char], close: &BTreeMap<usize, usize>, i: usize) -> usize {
    if keyword(c, i, "use") {
        return c[i..].iter().position(|&ch| ch == ';').map_or(c.len(), |n| i + n);
    }
    // In an item, a comma at depth 0 is in its generics or where clause, not its end.
    const ITEMS: &[&str] = &[
        "fn",
        "struct",
        "enum",
        "union",
        "impl",
        "trait",
        "mod",
        "const",
        "static",
        "type",
        "async",
        "unsafe",
        "extern",
        "let",
        "macro_rules",
    ];
    let item = ident_at(c, i).is_some_and(|w| ITEMS.contains(&w.as_str()));
    let mut depth = 0i32;
    for (j, &ch) in c.iter().enumerate().skip(i) {
        match ch {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            '{' if depth == 0 => return close[&j],
            ',' if depth == 0 && !item => return j,
            ';' | '}' if depth == 0 => return j,
            _ => {}
        }
    }
    c.len()
}

/// The `{` that opens a function's body, from just after its name; `None` for a declaration.
fn fn_body(c: &[char], from: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (j, &ch) in c.iter().enumerate().skip(from) {
        match ch {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            '{' if depth == 0 => return Some(j),
            ';' if depth == 0 => return None,
            _ => {}
        }
    }
    None
}

/// Reads a path or `use` tree starting at `*i` (`crate::a::{b, c::d as e, self}`), into its
/// leaf paths; leaves `*i` after it.
fn use_tree(c: &[char], i: &mut usize) -> Vec<Vec<String>> {
    let mut prefix = Vec::new();
    while let Some(word) = ident_at(c, *i) {
        *i += word.chars().count();
        prefix.push(word);
        if !(c.get(*i) == Some(&':') && c.get(*i + 1) == Some(&':')) {
            break;
        }
        let after = skip_ws(c, *i + 2);
        if c.get(after) == Some(&'{') {
            *i = after + 1;
            return use_group(c, i, &prefix);
        }
        if after != *i + 2 || ident_at(c, after).is_none() {
            *i += 2; // `::*`, `::<T>`
            break;
        }
        *i = after;
    }
    if prefix.is_empty() { Vec::new() } else { vec![prefix] }
}

/// The leaves of the group `{..}` of a use tree, from just after its `{`, each after `prefix`.
fn use_group(c: &[char], i: &mut usize, prefix: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    loop {
        *i = skip_ws(c, *i);
        match c.get(*i) {
            Some('}') => {
                *i += 1;
                break;
            }
            Some(',' | '*') => *i += 1,
            Some(ch) if is_ident(*ch) => {
                for leaf in use_tree(c, i) {
                    let mut p = prefix.to_vec();
                    p.extend(leaf.into_iter().filter(|s| s != "self"));
                    out.push(p);
                }
                *i = skip_ws(c, *i);
                if keyword(c, *i, "as") {
                    *i = skip_ws(c, *i + 2);
                    if let Some(alias) = ident_at(c, *i) {
                        *i += alias.chars().count();
                    }
                }
            }
            _ => break, // not a use tree after all
        }
    }
    out
}

/// A path from the crate root, or `None` if it does not start at `crate`, `super` or `self`.
fn resolve(from: &[String], path: &[String]) -> Option<Vec<String>> {
    let mut segments = path.iter().peekable();
    let mut base: Vec<String> = match segments.peek()?.as_str() {
        "crate" => {
            segments.next();
            Vec::new()
        }
        "self" => {
            segments.next();
            from.to_vec()
        }
        "super" => from.to_vec(),
        _ => return None,
    };
    while segments.peek().is_some_and(|s| *s == "super") {
        segments.next();
        base.pop()?;
    }
    base.extend(segments.cloned());
    Some(base)
}

fn is_ident(ch: char) -> bool {
    ch.is_alphanumeric() || ch == '_'
}

fn ident_at(c: &[char], i: usize) -> Option<String> {
    if !c.get(i).is_some_and(|&ch| is_ident(ch) && !ch.is_ascii_digit()) {
        return None;
    }
    Some(c[i..].iter().take_while(|&&ch| is_ident(ch)).collect())
}

fn skip_ws(c: &[char], mut i: usize) -> usize {
    while c.get(i).is_some_and(|ch| ch.is_whitespace()) {
        i += 1;
    }
    i
}

/// `word` at `i` as a whole word.
fn starts_word(c: &[char], i: usize, word: &str) -> bool {
    let n = word.chars().count();
    c.len() >= i + n
        && c[i..i + n].iter().copied().eq(word.chars())
        && !c.get(i + n).is_some_and(|&ch| is_ident(ch))
        && (i == 0 || !is_ident(c[i - 1]))
}

/// `word` at `i` followed by whitespace.
fn keyword(c: &[char], i: usize, word: &str) -> bool {
    starts_word(c, i, word) && c.get(i + word.chars().count()).is_some_and(|ch| ch.is_whitespace())
}

/// `mod name` / `fn name` at `i`: the name and the position after it.
fn keyword_ident(c: &[char], i: usize, word: &str) -> Option<(String, usize)> {
    if !keyword(c, i, word) {
        return None;
    }
    let at = skip_ws(c, i + word.len());
    let name = ident_at(c, at)?;
    let after = at + name.chars().count();
    Some((name, after))
}

/// Past `pub`, `pub(crate)`, `pub(in path)` and whitespace.
fn skip_visibility(c: &[char], i: usize) -> usize {
    let i = skip_ws(c, i);
    if !starts_word(c, i, "pub") {
        return i;
    }
    let j = skip_ws(c, i + 3);
    if c.get(j) == Some(&'(') {
        let close = c[j..].iter().position(|&ch| ch == ')').map_or(c.len(), |n| j + n + 1);
        return skip_ws(c, close);
    }
    j
}
