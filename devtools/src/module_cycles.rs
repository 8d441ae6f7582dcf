//! `cargo dev module-cycles`: fails when a module of a crate imports
//! another module that imports it back, directly or through others.
//!
//! Each module (a file, or an inline `mod name { … }`, tests included) is a
//! node; every path it names that starts with `crate::`, `super::`,
//! `self::` or one of its own child modules — in `use` trees, in code, and
//! in macro arguments — is an edge to the deepest module that path reaches.
//! A `mod` declaration is no import. The strongly connected components of
//! more than one module are the import cycles, printed with one cycle each.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// The crates `cargo dev module-cycles` checks when none is named: their
/// library roots, relative to the repository root.
pub const CRATES: [&str; 2] = ["sidecar-core/src/lib.rs", "sidecar/src/lib.rs"];

/// Options of `cargo dev module-cycles`.
#[derive(Debug, Clone, clap::Args)]
pub struct ModuleCyclesArgs {
    /// Crate roots (`src/lib.rs` or `src/main.rs`) to check; by default the
    /// sidecar's two crates.
    roots: Vec<PathBuf>,
}

/// A module path below the crate root (`["grpc", "wire"]`; empty for the root).
type ModPath = Vec<String>;

/// The modules of a crate and the modules each one imports.
#[derive(Debug, Default)]
pub struct Graph {
    /// Every module, with the modules it imports (never itself).
    pub imports: BTreeMap<ModPath, BTreeSet<ModPath>>,
}

/// Checks every root; fails naming each cycle found.
pub fn run(args: &ModuleCyclesArgs) -> anyhow::Result<()> {
    let roots: Vec<PathBuf> = match args.roots.is_empty() {
        true => CRATES
            .iter()
            .map(|c| bucketmap_testkit::repo_path(c))
            .collect(),
        false => args.roots.clone(),
    };
    let mut failures = Vec::new();
    for root in &roots {
        let graph = Graph::of_crate(root)?;
        let cycles = graph.cycles();
        let edges: usize = graph.imports.values().map(BTreeSet::len).sum();
        // A graph without edges would pass whatever the code did.
        anyhow::ensure!(
            edges > 0,
            "{}: no import between modules found; is it the crate root?",
            root.display()
        );
        if cycles.is_empty() {
            println!(
                "{}: {} modules, {edges} imports, no cycle",
                root.display(),
                graph.imports.len()
            );
        }
        for (cycle, component) in cycles {
            let others: Vec<String> = component
                .iter()
                .filter(|m| !cycle.contains(m))
                .map(name)
                .collect();
            let also = match others.is_empty() {
                true => String::new(),
                false => format!(" (in one circle with {})", others.join(", ")),
            };
            failures.push(format!("{}: {}{also}", root.display(), render(&cycle)));
        }
    }
    anyhow::ensure!(
        failures.is_empty(),
        "modules that import each other (break the cycle: move what both need \
         into a module of its own):\n  {}",
        failures.join("\n  ")
    );
    Ok(())
}

fn name(m: &ModPath) -> String {
    match m.is_empty() {
        true => "crate".to_owned(),
        false => m.join("::"),
    }
}

fn render(cycle: &[ModPath]) -> String {
    let mut names: Vec<String> = cycle.iter().map(name).collect();
    names.push(name(&cycle[0]));
    names.join(" -> ")
}

impl Graph {
    /// The graph of the crate whose root file is `root`.
    pub fn of_crate(root: &Path) -> anyhow::Result<Self> {
        let mut raw: BTreeMap<ModPath, Vec<Vec<String>>> = BTreeMap::new();
        let dir = root.parent().context("a crate root has a directory")?;
        read_file(root, dir, Vec::new(), &mut raw)?;
        Ok(Self::resolve(raw))
    }

    /// The graph of modules given as source text: `(module path, source)`,
    /// where the source's `mod x;` declarations are ignored.
    #[cfg(test)]
    pub fn of_sources(sources: &[(&str, &str)]) -> anyhow::Result<Self> {
        let mut raw = BTreeMap::new();
        for (path, source) in sources {
            let file = syn::parse_file(source)?;
            let module: ModPath = path
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            collect(&file.items, &module, None, &mut raw)?;
        }
        Ok(Self::resolve(raw))
    }

    /// Resolves each raw path to the deepest known module it reaches.
    fn resolve(raw: BTreeMap<ModPath, Vec<Vec<String>>>) -> Self {
        let known: BTreeSet<&ModPath> = raw.keys().collect();
        let mut imports = BTreeMap::new();
        for (module, paths) in &raw {
            let mut targets = BTreeSet::new();
            for path in paths {
                if let Some(target) = absolute(module, path, &known)
                    .and_then(|abs| deepest_module(&abs, &known))
                    .filter(|t| t != module)
                {
                    targets.insert(target);
                }
            }
            imports.insert(module.clone(), targets);
        }
        Self { imports }
    }

    /// Each strongly connected component of more than one module: one
    /// cycle through some of its modules, and all of them.
    pub fn cycles(&self) -> Vec<(Vec<ModPath>, BTreeSet<ModPath>)> {
        let mut out = Vec::new();
        for component in self.components() {
            if component.len() > 1
                && let Some(cycle) = self.cycle_in(&component)
            {
                out.push((cycle, component));
            }
        }
        out
    }

    /// Strongly connected components (Kosaraju: small graphs, no recursion
    /// depth worth worrying about).
    fn components(&self) -> Vec<BTreeSet<ModPath>> {
        let mut order = Vec::new();
        let mut seen = BTreeSet::new();
        for start in self.imports.keys() {
            self.post_order(start, &mut seen, &mut order);
        }
        let mut reverse: BTreeMap<&ModPath, Vec<&ModPath>> = BTreeMap::new();
        for (from, tos) in &self.imports {
            for to in tos {
                reverse.entry(to).or_default().push(from);
            }
        }
        let mut assigned = BTreeSet::new();
        let mut components = Vec::new();
        for start in order.iter().rev() {
            if assigned.contains(start) {
                continue;
            }
            let mut component = BTreeSet::new();
            let mut stack = vec![start];
            while let Some(m) = stack.pop() {
                if !assigned.insert(m.clone()) {
                    continue;
                }
                component.insert(m.clone());
                stack.extend(reverse.get(m).into_iter().flatten().copied());
            }
            components.push(component);
        }
        components
    }

    fn post_order(&self, start: &ModPath, seen: &mut BTreeSet<ModPath>, order: &mut Vec<ModPath>) {
        if !seen.insert(start.clone()) {
            return;
        }
        // Iterative depth-first search: (module, its imports not yet visited).
        let mut stack: Vec<(ModPath, Vec<ModPath>)> = vec![(start.clone(), self.next(start))];
        while let Some((module, pending)) = stack.last_mut() {
            match pending.pop() {
                Some(next) if seen.insert(next.clone()) => {
                    let after = self.next(&next);
                    stack.push((next, after));
                }
                Some(_) => {}
                None => {
                    order.push(module.clone());
                    stack.pop();
                }
            }
        }
    }

    fn next(&self, module: &ModPath) -> Vec<ModPath> {
        self.imports
            .get(module)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// A shortest cycle through the component's first module.
    fn cycle_in(&self, component: &BTreeSet<ModPath>) -> Option<Vec<ModPath>> {
        let start = component.iter().next()?;
        let mut parent: BTreeMap<&ModPath, &ModPath> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        while let Some(m) = queue.pop_front() {
            for next in self.imports.get(m).into_iter().flatten() {
                if !component.contains(next) {
                    continue;
                }
                if next == start {
                    let mut cycle = vec![m.clone()];
                    let mut at = m;
                    while let Some(p) = parent.get(at) {
                        cycle.push((*p).clone());
                        at = p;
                    }
                    cycle.reverse();
                    return Some(cycle);
                }
                if next != start && !parent.contains_key(next) {
                    parent.insert(next, m);
                    queue.push_back(next);
                }
            }
        }
        None
    }
}

/// Reads the module file `file` (module `module`, whose child modules live
/// in `dir`) and the files of its child modules.
fn read_file(
    file: &Path,
    dir: &Path,
    module: ModPath,
    raw: &mut BTreeMap<ModPath, Vec<Vec<String>>>,
) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let parsed =
        syn::parse_file(&text).with_context(|| format!("cannot parse {}", file.display()))?;
    let file_dir = file.parent().unwrap_or(dir);
    collect(&parsed.items, &module, Some((dir, file_dir)), raw)
        .with_context(|| format!("in {}", file.display()))
}

/// Records the paths `items` name as module `module`'s, and recurses into
/// its child modules: files when `dirs` (the directory of the module's
/// children, and that of the file declaring them) are given.
fn collect(
    items: &[syn::Item],
    module: &ModPath,
    dirs: Option<(&Path, &Path)>,
    raw: &mut BTreeMap<ModPath, Vec<Vec<String>>>,
) -> anyhow::Result<()> {
    let mut visitor = Paths::default();
    for item in items {
        match item {
            syn::Item::Mod(m) => {
                let mut child = module.clone();
                child.push(m.ident.to_string());
                match (&m.content, dirs) {
                    (Some((_, inner)), Some((dir, file_dir))) => {
                        let child_dir = dir.join(m.ident.to_string());
                        collect(inner, &child, Some((&child_dir, file_dir)), raw)?;
                    }
                    (Some((_, inner)), None) => collect(inner, &child, None, raw)?,
                    (None, Some((dir, file_dir))) => {
                        let (file, sub) = module_file(m, dir, file_dir)?;
                        read_file(&file, &sub, child, raw)?;
                    }
                    (None, None) => {}
                }
            }
            other => visitor.visit_item(other),
        }
    }
    raw.entry(module.clone()).or_default().extend(visitor.paths);
    Ok(())
}

/// The file of the out-of-line module `m` declared in a module whose
/// children live in `dir` (in a file in `file_dir`), and the directory of
/// its own children.
fn module_file(
    m: &syn::ItemMod,
    dir: &Path,
    file_dir: &Path,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let name = m.ident.to_string();
    for attr in &m.attrs {
        if attr.path().is_ident("path")
            && let syn::Meta::NameValue(nv) = &attr.meta
            && let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) = &nv.value
        {
            // `#[path]` is relative to the declaring file's directory.
            let file = file_dir.join(s.value());
            let sub = file.with_extension("");
            return Ok((file, sub));
        }
    }
    let flat = dir.join(format!("{name}.rs"));
    if flat.exists() {
        return Ok((flat, dir.join(&name)));
    }
    let nested = dir.join(&name).join("mod.rs");
    anyhow::ensure!(
        nested.exists(),
        "no file for module {name} in {}",
        dir.display()
    );
    Ok((nested, dir.join(&name)))
}

/// Every path of an item that may name a module, as its segments.
#[derive(Default)]
struct Paths {
    paths: Vec<Vec<String>>,
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {
        // Nested modules are collected as modules of their own.
    }

    fn visit_use_tree(&mut self, tree: &'ast syn::UseTree) {
        use_paths(tree, &mut Vec::new(), &mut self.paths);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            self.paths
                .push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        token_paths(mac.tokens.clone(), &mut self.paths);
        syn::visit::visit_macro(self, mac);
    }
}

/// The full paths of a `use` tree (`a::{b, c::d}` → `a::b`, `a::c::d`).
fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => out.push(with(prefix, &n.ident)),
        syn::UseTree::Rename(r) => out.push(with(prefix, &r.ident)),
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(g) => {
            for item in &g.items {
                use_paths(item, prefix, out);
            }
        }
    }
}

fn with(prefix: &[String], last: &syn::Ident) -> Vec<String> {
    let mut path = prefix.to_vec();
    path.push(last.to_string());
    path
}

/// Paths in a macro's tokens (`crate::a::b` in `assert_eq!(crate::a::b(), …)`).
fn token_paths(tokens: TokenStream, out: &mut Vec<Vec<String>>) {
    let mut current: Vec<String> = Vec::new();
    let mut colons = 0;
    let flush = |current: &mut Vec<String>, out: &mut Vec<Vec<String>>| {
        if current.len() > 1 {
            out.push(std::mem::take(current));
        }
        current.clear();
    };
    for token in tokens {
        match token {
            TokenTree::Ident(ident) if current.is_empty() || colons == 2 => {
                current.push(ident.to_string());
                colons = 0;
            }
            TokenTree::Punct(p) if p.as_char() == ':' && !current.is_empty() && colons < 2 => {
                colons += 1;
            }
            TokenTree::Group(g) => {
                flush(&mut current, out);
                colons = 0;
                token_paths(g.stream(), out);
            }
            TokenTree::Ident(ident) => {
                flush(&mut current, out);
                current.push(ident.to_string());
                colons = 0;
            }
            _ => {
                flush(&mut current, out);
                colons = 0;
            }
        }
    }
    flush(&mut current, out);
}

/// `path`, named in `module`, from the crate root; `None` when it names no
/// module of this crate (an external crate, a local item, a prelude name).
fn absolute(module: &ModPath, path: &[String], known: &BTreeSet<&ModPath>) -> Option<ModPath> {
    let (first, rest) = path.split_first()?;
    let mut base = match first.as_str() {
        "crate" => Vec::new(),
        "self" => module.clone(),
        "super" => {
            let mut base = module.clone();
            base.pop()?;
            let mut rest = rest;
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
            base.extend(rest.iter().cloned());
            return Some(base);
        }
        _ if rest.is_empty() => return None,
        _ => {
            // A child module named without `self::` (`json::rewrite`).
            let mut child = module.clone();
            child.push(first.clone());
            if !known.contains(&child) {
                return None;
            }
            module.clone()
        }
    };
    match first.as_str() {
        "crate" | "self" => base.extend(rest.iter().cloned()),
        _ => base.extend(path.iter().cloned()),
    }
    Some(base)
}

/// The deepest prefix of `path` that is a known module.
fn deepest_module(path: &[String], known: &BTreeSet<&ModPath>) -> Option<ModPath> {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|prefix| known.contains(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cycles(sources: &[(&str, &str)]) -> Vec<String> {
        let graph = Graph::of_sources(sources).expect("parses");
        graph.cycles().iter().map(|(c, _)| render(c)).collect()
    }

    #[test]
    fn a_module_importing_one_that_imports_it_back_is_a_cycle() {
        let found = cycles(&[
            ("", "pub mod a; pub mod b;"),
            ("a", "use crate::b::Thing; pub struct Other;"),
            (
                "b",
                "pub struct Thing; fn f() -> crate::a::Other { todo!() }",
            ),
        ]);
        assert_eq!(found, ["a -> b -> a"]);
    }

    #[test]
    fn cycles_through_groups_super_and_macros_are_found() {
        let found = cycles(&[
            ("", "pub mod x;"),
            ("x", "pub mod p; pub mod q; pub mod r;"),
            ("x::p", "use super::{q::Q, other};"),
            ("x::q", "fn f() { assert!(crate::x::r::ok()); }"),
            (
                "x::r",
                "use self::inner::*; mod inner { use super::super::p; }",
            ),
            ("x::r::inner", "use crate::x::p::P;"),
        ]);
        assert_eq!(found, ["x::p -> x::q -> x::r -> x::r::inner -> x::p"]);
    }

    #[test]
    fn imports_in_one_direction_and_tests_of_a_module_are_no_cycle() {
        let graph = Graph::of_sources(&[
            ("", "pub mod a; pub mod b;"),
            ("a", "use crate::b::Thing; mod tests { use super::*; }"),
            ("a::tests", "use super::*; use crate::b;"),
            (
                "b",
                "pub struct Thing; fn g() -> std::io::Result<()> { Ok(()) }",
            ),
        ])
        .expect("parses");
        assert!(graph.cycles().is_empty());
        // Something was compared: a → b, a::tests → a and b.
        let edges: usize = graph.imports.values().map(BTreeSet::len).sum();
        assert_eq!(edges, 3, "{:?}", graph.imports);
    }
}
