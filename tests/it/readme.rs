//! Facts the README states that the repository can check, so that they cannot go stale:
//! the Rust version it asks for, no citation of a document the repository does not
//! hold, and a table of contents that matches its headings.

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

/// The README's headings outside code blocks, as (level, title, GitHub anchor), in order.
fn headings(readme: &str) -> Vec<(usize, String, String)> {
    let mut in_code = false;
    let mut seen: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for line in readme.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        let level = line.chars().take_while(|c| *c == '#').count();
        let Some(title) = line.get(level..).and_then(|t| t.strip_prefix(' ')) else {
            continue;
        };
        if in_code || level == 0 {
            continue;
        }
        let anchor = anchor(title);
        // GitHub numbers a repeated anchor: `x`, `x-1`, `x-2`.
        let repeats = seen.iter().filter(|a| **a == anchor).count();
        seen.push(anchor.clone());
        let anchor = match repeats {
            0 => anchor,
            n => format!("{anchor}-{n}"),
        };
        out.push((level, title.to_owned(), anchor));
    }
    out
}

/// GitHub's anchor of a heading: lower case, letters, digits, `-` and `_` kept, spaces
/// made `-`, anything else (backticks, `?`, `'`, `,`, `(`, `:`) dropped.
fn anchor(title: &str) -> String {
    title
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The table of contents after the introduction lists every section and subsection in
/// order, and each of its links, like every `(#...)` link of the README, lands on a
/// heading.
#[test]
fn the_table_of_contents_lists_every_section_and_every_link_lands() {
    let readme = read("README.md");
    let all = headings(&readme);
    let start = readme
        .find("\n## Contents\n")
        .expect("a '## Contents' section");
    let toc = &readme[start + "\n## Contents\n".len()..];
    let toc = &toc[..toc.find("\n## ").expect("a section after the contents")];
    let listed: Vec<(usize, String, String)> = toc
        .lines()
        .filter_map(|line| {
            let indent = line.len() - line.trim_start().len();
            let item = line.trim_start().strip_prefix("- [")?;
            let (title, rest) = item.split_once("](#")?;
            let (link, _) = rest.split_once(')')?;
            Some((2 + indent / 2, title.to_owned(), link.to_owned()))
        })
        .collect();
    let expected: Vec<(usize, String, String)> = all
        .iter()
        .filter(|(level, title, _)| (2..=3).contains(level) && title != "Contents")
        .cloned()
        .collect();
    assert_eq!(listed, expected, "the contents and the headings differ");

    let anchors: Vec<&str> = all.iter().map(|(_, _, a)| a.as_str()).collect();
    for (n, line) in readme.lines().enumerate() {
        for (at, _) in line.match_indices("](#") {
            let link = &line[at + 3..];
            let link = &link[..link.find(')').unwrap_or(link.len())];
            assert!(
                anchors.contains(&link),
                "README.md:{}: #{link} is no heading's anchor",
                n + 1
            );
        }
    }
}
