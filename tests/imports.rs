//! No import circles: the modules of the library (`src/`), of `libmcast_nccl` (`nccl/src/`)
//! and of the binaries (`src/bin/`) depend on each other one way only.
//!
//! What a circle is (ARCHITECTURE.md, Invariants: **Imports**): every file and every inline
//! `mod` is a module of the module tree. A module depends on another when it names it, or an
//! item in it, through a path (`use`, or a path in code: `crate::runtime::launch::signed_as`,
//! `super::agree::across_domains`, `comm::Comm` after `use crate::runtime::comm`, also inside
//! macro calls); a name imported by a `use` (a re-export too) is followed to the module that
//! defines it. A dependency between two modules is counted at their lowest common ancestor,
//! between the two children of it that hold them (a folder counts as one with everything under
//! it): `runtime/hier/collective.rs` naming `runtime::team::Team` is `hier -> team` among the
//! children of `runtime`. A module and its own descendants are one room: a child's `super::Team`
//! and a parent's `pub use create::Joined` or `mod create;` count for nothing. A circle is a set
//! of siblings that reach each other through these dependencies; the test prints each, with the
//! paths that make it, and fails on any.
//!
//! `syn` parses the files (already in the lock file through cbindgen), so strings, comments and
//! doc links never count as imports; other crates (`std`, `mcast` seen from the shim) never do.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A module: its path from the crate root (`["runtime", "team"]`).
type ModPath = Vec<String>;

/// Dependencies allowed although they close a circle, each with the reason it is still there.
/// An allowance that no longer matches a dependency fails the test: it goes with the circle.
const ALLOWED: &[(&str, &str, &str)] = &[];

/// What one crate's files say.
#[derive(Default)]
struct Crate {
    /// Every module and the file that holds it.
    files: BTreeMap<ModPath, PathBuf>,
    /// The child modules of each module.
    children: BTreeMap<ModPath, BTreeSet<String>>,
    /// The names each module's `use` items bring in, and the path each names.
    imports: BTreeMap<ModPath, BTreeMap<String, Vec<String>>>,
    /// The modules whose names each module's glob imports bring in (their paths).
    globs: BTreeMap<ModPath, Vec<Vec<String>>>,
    /// Every path of two segments or more, in the module that wrote it.
    paths: Vec<(ModPath, Vec<String>)>,
}

/// One dependency between two modules, and the path that makes it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Dep {
    from: ModPath,
    to: ModPath,
    file: PathBuf,
    path: String,
}

/// The crates of the workspace: name, root file, and the names other crates' paths start with.
fn workspace() -> Vec<(&'static str, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut crates = vec![("mcast", root.join("src/lib.rs")), ("mcast_nccl", root.join("nccl/src/lib.rs"))];
    crates.push(("mcast-bench", root.join("src/bin/mcast-bench/main.rs")));
    crates.push(("mcast-info", root.join("src/bin/mcast-info.rs")));
    crates
}

impl Crate {
    /// Reads the crate whose root file is `root`, following its `mod` items.
    fn read(root: &Path) -> Crate {
        let mut c = Crate::default();
        c.load(Vec::new(), root, true, false);
        c
    }

    /// Reads `file` as module `at`; `owns_dir`: its child modules' files are beside it (a
    /// crate root, a `mod.rs`), else in the folder of its name.
    fn load(&mut self, at: ModPath, file: &Path, owns_dir: bool, in_test: bool) {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", file.display()));
        let dir = if owns_dir { file.parent().unwrap().to_path_buf() } else { file.with_extension("") };
        let mut v = Collect { c: self, at: at.clone(), out_of_file: Vec::new(), in_test };
        v.c.files.insert(at.clone(), file.to_path_buf());
        v.c.children.entry(at.clone()).or_default();
        for item in &ast.items {
            v.visit_item(item);
        }
        for (name, inner, test) in std::mem::take(&mut v.out_of_file) {
            let (flat, nested) = (dir.join(format!("{}.rs", name)), dir.join(&name).join("mod.rs"));
            match (flat.exists(), nested.exists()) {
                (true, false) => self.load(inner, &flat, false, test),
                (false, true) => self.load(inner, &nested, true, test),
                _ => panic!(
                    "mod {name} of {}: neither or both of {} and {}",
                    file.display(),
                    flat.display(),
                    nested.display()
                ),
            }
        }
    }

    fn has_child(&self, m: &ModPath, name: &str) -> bool {
        self.children.get(m).is_some_and(|c| c.contains(name))
    }

    /// The module that defines what `segs` names when written in module `ctx`: the deepest
    /// module the path goes through, imports followed; `None` for another crate's path.
    fn resolve(&self, ctx: &ModPath, segs: &[String], depth: usize) -> Option<ModPath> {
        if depth > 16 || segs.is_empty() {
            return None;
        }
        let (start, rest): (ModPath, &[String]) = match segs[0].as_str() {
            "crate" => (Vec::new(), &segs[1..]),
            "self" => (ctx.clone(), &segs[1..]),
            "super" => {
                let ups = segs.iter().take_while(|s| *s == "super").count();
                (ctx[..ctx.len().checked_sub(ups)?].to_vec(), &segs[ups..])
            }
            _ => return self.resolve_name(ctx, segs, depth),
        };
        self.walk(start, rest, depth)
    }

    /// A path whose first segment is a name in scope in `ctx`.
    fn resolve_name(&self, ctx: &ModPath, segs: &[String], depth: usize) -> Option<ModPath> {
        let name = &segs[0];
        if self.has_child(ctx, name) {
            let mut m = ctx.clone();
            m.push(name.clone());
            return self.walk(m, &segs[1..], depth);
        }
        if let Some(target) = self.imports.get(ctx).and_then(|i| i.get(name)) {
            let mut full = target.clone();
            full.extend_from_slice(&segs[1..]);
            return self.resolve(ctx, &full, depth + 1);
        }
        for glob in self.globs.get(ctx).into_iter().flatten() {
            let Some(g) = self.resolve(ctx, glob, depth + 1) else { continue };
            if self.has_child(&g, name) || self.imports.get(&g).is_some_and(|i| i.contains_key(name)) {
                return self.resolve_name(&g, segs, depth + 1);
            }
        }
        None
    }

    /// From module `m`, down the segments `rest` as far as they name modules.
    fn walk(&self, mut m: ModPath, rest: &[String], depth: usize) -> Option<ModPath> {
        for (i, s) in rest.iter().enumerate() {
            if self.has_child(&m, s) {
                m.push(s.clone());
                continue;
            }
            if self.imports.get(&m).is_some_and(|im| im.contains_key(s)) {
                return self.resolve_name(&m, &rest[i..], depth + 1).or(Some(m));
            }
            break;
        }
        Some(m)
    }

    /// Every dependency between two modules of this crate.
    fn deps(&self) -> BTreeSet<Dep> {
        let mut deps = BTreeSet::new();
        for (from, segs) in &self.paths {
            let Some(to) = self.resolve(from, segs, 0) else { continue };
            if to != *from {
                let file = self.files[&self.file_module(from)].clone();
                deps.insert(Dep { from: from.clone(), to, file, path: segs.join("::") });
            }
        }
        deps
    }

    /// The module whose file holds module `m` (itself, or the file of an inline module).
    fn file_module(&self, m: &ModPath) -> ModPath {
        let mut m = m.clone();
        while !self.files.contains_key(&m) {
            m.pop();
        }
        m
    }
}

/// The visitor that fills a [`Crate`] from one file.
struct Collect<'a> {
    c: &'a mut Crate,
    at: ModPath,
    /// `mod name;` items of this file: (name, module path, compiled only for tests).
    out_of_file: Vec<(String, ModPath, bool)>,
    /// Inside an item compiled only for tests: its paths are not recorded.
    in_test: bool,
}

impl Collect<'_> {
    fn add_use(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.add_use(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                let (path, alias) = if name == "self" {
                    (prefix.clone(), prefix.last().cloned().unwrap_or_default())
                } else {
                    let mut p = prefix.clone();
                    p.push(name.clone());
                    (p, name)
                };
                self.import(alias, path);
            }
            syn::UseTree::Rename(r) => {
                let mut p = prefix.clone();
                if r.ident != "self" {
                    p.push(r.ident.to_string());
                }
                self.import(r.rename.to_string(), p);
            }
            syn::UseTree::Glob(_) if self.in_test => {}
            syn::UseTree::Glob(_) => {
                self.c.globs.entry(self.at.clone()).or_default().push(prefix.clone());
                self.c.paths.push((self.at.clone(), prefix.clone()));
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.add_use(prefix, t);
                }
            }
        }
    }

    fn import(&mut self, alias: String, path: Vec<String>) {
        if self.in_test {
            return;
        }
        if alias != "_" {
            self.c.imports.entry(self.at.clone()).or_default().insert(alias, path.clone());
        }
        self.c.paths.push((self.at.clone(), path));
    }

    /// Paths written inside a macro call (`tracing::warn!("{}", crate::x::y())`): every run of
    /// identifiers joined by `::` in its tokens.
    fn macro_paths(&mut self, tokens: proc_macro2::TokenStream) {
        let mut run: Vec<String> = Vec::new();
        let mut colons = 0;
        let flush = |run: &mut Vec<String>, c: &mut Crate, at: &ModPath| {
            if run.len() > 1 {
                c.paths.push((at.clone(), std::mem::take(run)));
            }
            run.clear();
        };
        for tt in tokens {
            match tt {
                proc_macro2::TokenTree::Ident(i) => {
                    if colons != 2 {
                        flush(&mut run, self.c, &self.at);
                    }
                    run.push(i.to_string());
                    colons = 0;
                }
                proc_macro2::TokenTree::Punct(p) if p.as_char() == ':' && !run.is_empty() && colons < 2 => {
                    colons += 1;
                }
                proc_macro2::TokenTree::Group(g) => {
                    flush(&mut run, self.c, &self.at);
                    colons = 0;
                    self.macro_paths(g.stream());
                }
                _ => {
                    flush(&mut run, self.c, &self.at);
                    colons = 0;
                }
            }
        }
        flush(&mut run, self.c, &self.at);
    }
}

/// True for an item compiled only for tests (`#[cfg(test)]`).
fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test"))
}

impl<'ast> Visit<'ast> for Collect<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Struct(s) => &s.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        let outer = self.in_test;
        self.in_test |= test_only(attrs);
        syn::visit::visit_item(self, item);
        self.in_test = outer;
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        let name = m.ident.to_string();
        self.c.children.entry(self.at.clone()).or_default().insert(name.clone());
        let mut inner = self.at.clone();
        inner.push(name.clone());
        match &m.content {
            None => self.out_of_file.push((name, inner, self.in_test)),
            Some((_, items)) => {
                self.c.children.entry(inner.clone()).or_default();
                let outer = std::mem::replace(&mut self.at, inner);
                for item in items {
                    self.visit_item(item);
                }
                self.at = outer;
            }
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.add_use(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.segments.len() > 1 && !self.in_test {
            self.c.paths.push((self.at.clone(), p.segments.iter().map(|s| s.ident.to_string()).collect()));
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        if !self.in_test {
            self.macro_paths(m.tokens.clone());
        }
        syn::visit::visit_macro(self, m);
    }
}

/// A circle: the module whose children form it, the children, and for each dependency between
/// two of them (from, to) the first that makes it and how many others do.
type Circle = (ModPath, Vec<String>, Vec<(String, String, Dep, usize)>);

/// The circles among `deps` of one crate: for each module whose children form one, the
/// children and, for each dependency between two of them, the first path that makes it and how
/// many others do.
fn circles(deps: &BTreeSet<Dep>) -> Vec<Circle> {
    // Per level (the lowest common ancestor): child -> child -> the dependencies under them.
    let mut levels: BTreeMap<ModPath, BTreeMap<(String, String), Vec<Dep>>> = BTreeMap::new();
    for d in deps {
        let common = d.from.iter().zip(&d.to).take_while(|(a, b)| a == b).count();
        if common == d.from.len() || common == d.to.len() {
            continue; // one holds the other
        }
        let pair = (d.from[common].clone(), d.to[common].clone());
        levels.entry(d.from[..common].to_vec()).or_default().entry(pair).or_default().push(d.clone());
    }
    let mut found = Vec::new();
    for (level, edges) in levels {
        for scc in strongly_connected(edges.keys()) {
            let within = edges
                .iter()
                .filter(|((a, b), _)| scc.contains(a) && scc.contains(b))
                .map(|((a, b), ds)| (a.clone(), b.clone(), ds[0].clone(), ds.len() - 1))
                .collect();
            found.push((level.clone(), scc.into_iter().collect(), within));
        }
    }
    found
}

/// The strongly connected components of more than one node of the graph of `edges`.
fn strongly_connected<'a>(edges: impl Iterator<Item = &'a (String, String)>) -> Vec<BTreeSet<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        next.entry(a).or_default().push(b);
        next.entry(b).or_default();
    }
    // Reachability is enough at this size: a and b are in one component when each reaches the other.
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from];
        while let Some(n) = todo.pop() {
            for &m in &next[n] {
                if seen.insert(m) {
                    todo.push(m);
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&str, BTreeSet<&str>> = next.keys().map(|&n| (n, reach(n))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for (&n, r) in &reached {
        if !r.contains(n) || out.iter().any(|c| c.contains(n)) {
            continue;
        }
        out.push(r.iter().filter(|m| reached[**m].contains(n)).map(|m| m.to_string()).collect());
    }
    out
}

fn show(m: &[String]) -> String {
    if m.is_empty() {
        "crate".to_string()
    } else {
        m.join("::")
    }
}

/// The report of the circles of every crate under `crates`, and the allowances that matched no
/// dependency; `allowed` as [`ALLOWED`].
fn check(crates: &[(&str, PathBuf)], allowed: &[(&str, &str, &str)]) -> (String, Vec<String>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut report = String::new();
    let mut used = BTreeSet::new();
    for (name, file) in crates {
        let c = Crate::read(file);
        let deps: BTreeSet<Dep> = c
            .deps()
            .into_iter()
            .filter(|d| {
                let hit =
                    allowed.iter().position(|&(k, from, to)| k == *name && show(&d.from) == from && show(&d.to) == to);
                if let Some(i) = hit {
                    used.insert(i);
                }
                hit.is_none()
            })
            .collect();
        for (level, members, within) in circles(&deps) {
            let _ = writeln!(report, "{name}: a circle among the children of {}: {}", show(&level), members.join(", "));
            for (a, b, d, more) in within {
                let file = d.file.strip_prefix(root).unwrap_or(&d.file).display().to_string();
                let more = if more > 0 { format!(" and {more} more") } else { String::new() };
                let _ = writeln!(report, "    {a} -> {b}: {file}: {}{more}", d.path);
            }
        }
    }
    let stale = allowed
        .iter()
        .enumerate()
        .filter(|(i, _)| !used.contains(i))
        .map(|(_, (k, from, to))| format!("{k}: {from} -> {to}"))
        .collect();
    (report, stale)
}

#[test]
fn no_import_circles() {
    let (report, stale) = check(&workspace(), ALLOWED);
    assert!(report.is_empty(), "import circles (see tests/imports.rs for what counts):\n{report}");
    assert!(
        stale.is_empty(),
        "allowances in tests/imports.rs that no dependency needs any more (the circle is gone: remove them): {stale:?}"
    );
}

/// Every `.rs` file under `src/` and `nccl/src/` is a module of one crate read here, so no file
/// escapes the check (a `#[path]`, a file no `mod` names).
#[test]
fn every_source_file_is_read() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut read = BTreeMap::new();
    for (name, file) in workspace() {
        for f in Crate::read(&file).files.into_values() {
            assert!(read.insert(f.clone(), name).is_none(), "{} is read by two crates", f.display());
        }
    }
    let mut on_disk = Vec::new();
    let mut todo = vec![root.join("src"), root.join("nccl/src")];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                on_disk.push(p);
            }
        }
    }
    let missed: Vec<_> = on_disk.iter().filter(|p| !read.contains_key(*p)).collect();
    assert!(missed.is_empty(), "source files no crate's module tree reaches: {missed:?}");
    assert!(read.len() > 100, "only {} files read", read.len());
}

/// The checker itself, on a small crate written for it: a circle between siblings through a
/// re-export and a macro call is found with the paths that make it; a child's `super::` and a
/// parent's use of its own children are not circles; a third module that only depends on the
/// others is not in the circle, nor brought into it by a test module's import.
#[test]
fn the_checker_finds_circles_between_siblings_only() {
    let dir = std::env::temp_dir().join(format!("mcast-imports-{}", std::process::id()));
    let files = [
        ("lib.rs", "mod a;\nmod b;\nmod c;\npub use a::Alpha;\n"),
        ("a/mod.rs", "mod inner;\npub use inner::Alpha;\nuse inner::helper;\n"),
        ("a/inner.rs", "use super::super::b;\npub struct Alpha;\npub fn helper() { let _ = b::Beta; }\n"),
        ("b.rs", "pub struct Beta;\nfn f() { tracing::warn!(\"{:?}\", crate::Alpha); }\n#[cfg(test)]\nmod tests { use crate::c; }\n"),
        ("c.rs", "use crate::a::Alpha;\nuse crate::b::Beta;\nmod kid { use super::*; }\n"),
    ];
    for (name, text) in files {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
    }
    let (report, stale) = check(&[("t", dir.join("lib.rs"))], &[]);
    assert!(report.starts_with("t: a circle among the children of crate: a, b\n"), "{report}");
    assert!(report.contains("\n    a -> b: ") && report.contains("inner.rs: b::Beta and 1 more\n"), "{report}");
    // b names crate::Alpha, a re-export of a::inner's Alpha.
    assert!(report.contains("\n    b -> a: ") && report.contains("b.rs: crate::Alpha\n"), "{report}");
    assert_eq!(report.lines().count(), 3, "{report}");
    assert!(stale.is_empty());
    // An allowance of the dependency b -> a::inner breaks the circle; one naming nothing is stale.
    let (report, stale) = check(&[("t", dir.join("lib.rs"))], &[("t", "b", "a::inner"), ("t", "c", "b::x")]);
    assert!(report.is_empty(), "{report}");
    assert_eq!(stale, ["t: c -> b::x"]);
    std::fs::remove_dir_all(&dir).unwrap();
}
