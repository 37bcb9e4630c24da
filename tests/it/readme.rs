//! Facts the README states that the repository can check, so that they cannot go stale:
//! the Rust version it asks for, and no citation of a document the repository does not
//! hold.

use std::path::Path;

fn read(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_rust_version_the_readme_asks_for_is_the_one_cargo_needs() {
    let manifest = read("Cargo.toml");
    let needed = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .expect("Cargo.toml names a rust-version");
    let readme = read("README.md");
    // "a Rust toolchain (1.90 or newer)", wherever the README asks for one.
    let asked: Vec<&str> = readme
        .match_indices("Rust toolchain (")
        .filter_map(|(at, found)| readme[at + found.len()..].split_once(" or newer"))
        .map(|(version, _)| version)
        .collect();
    assert!(
        !asked.is_empty(),
        "the README names no minimum Rust version"
    );
    for version in asked {
        assert_eq!(
            version, needed,
            "README asks for Rust {version}, Cargo.toml needs {needed}"
        );
    }
}

#[test]
fn the_readme_cites_no_document_outside_the_repository() {
    let readme = read("README.md");
    for (n, line) in readme.lines().enumerate() {
        assert!(!line.contains("SPEC §"), "README.md:{}: {line}", n + 1);
    }
}
