//! The shape the module docs promise, checked: the files of `src/proxy/` depend one way,
//! in the order its module doc lists them (a request's path through them), so that no
//! file imports one above it and `mod.rs` is no hub that everything runs back through.

use std::collections::HashMap;
use std::path::Path;

fn proxy_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/proxy")
}

/// Each file's place in the numbered list of `src/proxy/mod.rs`'s module doc.
fn ranks() -> HashMap<String, usize> {
    let doc = std::fs::read_to_string(proxy_dir().join("mod.rs")).expect("mod.rs");
    let mut ranks = HashMap::new();
    let mut rank = 0;
    for line in doc.lines().take_while(|l| l.starts_with("//!")) {
        let text = line.trim_start_matches("//!").trim_start();
        if let Some((number, _)) = text.split_once(". ")
            && let Ok(n) = number.parse::<usize>()
        {
            rank = n;
        }
        if rank == 0 {
            continue;
        }
        for piece in text.split('`').skip(1).step_by(2) {
            if let Some(name) = piece.strip_suffix(".rs") {
                ranks.entry(name.to_owned()).or_insert(rank);
            }
        }
    }
    ranks
}

/// The sibling modules a file names in `use super::...` lines.
fn imports(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let flat = text.replace('\n', " ");
    for (at, _) in flat.match_indices("use super::") {
        let rest = &flat[at + "use super::".len()..];
        let end = rest.find(';').unwrap_or(rest.len());
        let path = &rest[..end];
        if let Some(list) = path.strip_prefix('{') {
            for item in list.trim_end_matches('}').split(',') {
                let first = item.trim().split("::").next().unwrap_or("").trim();
                names.push(first.to_owned());
            }
        } else {
            names.push(path.split("::").next().unwrap_or("").trim().to_owned());
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

#[test]
fn every_file_of_proxy_is_placed_and_imports_only_files_below_it() {
    let ranks = ranks();
    for entry in std::fs::read_dir(proxy_dir()).expect("src/proxy") {
        let path = entry.expect("entry").path();
        let Some(name) = path.file_stem().and_then(|n| n.to_str()) else {
            continue;
        };
        if name == "mod" || path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let rank = *ranks
            .get(name)
            .unwrap_or_else(|| panic!("src/proxy/mod.rs's list does not place {name}.rs"));
        let text = std::fs::read_to_string(&path).expect("read");
        // Tests may reach anywhere.
        let code = text.split("#[cfg(test)]").next().unwrap_or(&text);
        for imported in imports(code) {
            let Some(&theirs) = ranks.get(&imported) else {
                panic!(
                    "{name}.rs imports super::{imported}, which is no file of the list (a back-arrow to mod.rs?)"
                );
            };
            assert!(
                theirs >= rank,
                "{name}.rs (place {rank}) imports {imported}.rs (place {theirs}), above it"
            );
        }
    }
}

#[test]
fn the_import_reader_reads_lists_and_paths() {
    assert_eq!(
        imports(
            "use super::state::{AppState, Live};\nuse super::{upgrade, view};\nuse super::reply::{\n    Counted,\n};"
        ),
        ["state", "upgrade", "view", "reply"]
    );
}
