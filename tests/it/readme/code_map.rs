//! The code map of `docs/development.md` against `src/`: every path it names exists, and
//! every module is named. A map entry is a list item of its "Code map" section whose
//! first code span is a path under `src/`: a file, or a directory (ending in `/`) that
//! is one idea, which names every file below it. Test modules (a `tests.rs`, or any file
//! under a `tests/` directory) are not modules to name.

use std::collections::BTreeSet;
use std::path::Path;

use super::{documents, read, split_code};

const MAP: &str = "docs/development.md";
const SECTION: &str = "\n## Code map\n";

/// The paths the map names, in order.
fn entries() -> Vec<String> {
    let doc = read(MAP);
    let start = doc
        .find(SECTION)
        .unwrap_or_else(|| panic!("{MAP}: no '## Code map' section"));
    let section = &doc[start + SECTION.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    section
        .lines()
        .filter_map(|line| line.strip_prefix("- `"))
        .filter_map(|item| item.split_once('`'))
        .map(|(path, _)| path.to_owned())
        .filter(|path| path.starts_with("src/"))
        .collect()
}

/// Every `.rs` file under `dir`, relative to the root, test modules left out.
fn modules(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let entries = std::fs::read_dir(root.join(dir)).unwrap_or_else(|e| panic!("{dir:?}: {e}"));
    for entry in entries {
        let entry = entry.expect("a directory entry");
        let name = entry.file_name().to_str().expect("UTF-8 names").to_owned();
        let path = dir.join(&name);
        if entry.file_type().expect("a file type").is_dir() {
            if name != "tests" {
                modules(root, &path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(path.to_str().expect("UTF-8 paths").to_owned());
        }
    }
}

#[test]
fn the_code_map_names_every_module_and_only_paths_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let entries = entries();
    assert!(entries.len() > 10, "{MAP}: the code map lists {entries:?}");
    let mut wrong = BTreeSet::new();
    for entry in &entries {
        let path = root.join(entry);
        let is_dir = entry.ends_with('/');
        if (is_dir && !path.is_dir()) || (!is_dir && !path.is_file()) {
            wrong.insert(format!(
                "{MAP}: the code map names {entry}, which does not exist"
            ));
        }
        if entries.iter().filter(|other| *other == entry).count() > 1 {
            wrong.insert(format!("{MAP}: the code map names {entry} twice"));
        }
    }
    let mut all = Vec::new();
    modules(root, Path::new("src"), &mut all);
    all.sort();
    for module in all {
        let named = entries.iter().any(|entry| match entry.strip_suffix('/') {
            Some(dir) => module.starts_with(&format!("{dir}/")),
            None => *entry == module,
        });
        if !named {
            wrong.insert(format!("{MAP}: the code map does not name {module}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{}",
        wrong.into_iter().collect::<Vec<_>>().join("\n")
    );
}

/// Any `src/...` path in the code of README.md or docs/*.md names a file or directory
/// that is there, wherever it is cited.
#[test]
fn every_source_path_the_documents_name_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut wrong = BTreeSet::new();
    let mut named = 0;
    for (name, text) in documents() {
        let (_, code) = split_code(&text);
        for (n, line) in code.lines().enumerate() {
            let tokens = line.split(|c: char| c.is_whitespace() || "`,;()'\"".contains(c));
            for token in tokens.filter(|token| token.starts_with("src/")) {
                let path = token.trim_end_matches([':', '.']);
                named += 1;
                if !root.join(path).exists() {
                    wrong.insert(format!("{name}:{}: {path} does not exist", n + 1));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{}",
        wrong.into_iter().collect::<Vec<_>>().join("\n")
    );
    assert!(
        named > 0,
        "no source path found: is the search looking in the right places?"
    );
}
