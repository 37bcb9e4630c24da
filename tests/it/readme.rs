//! Facts README.md and the reference in docs/ state that the repository can check, so
//! that they cannot go stale: the Rust version the README asks for, no citation of a
//! document the repository does not hold, citations of `docs/behaviour.md` that land on
//! one of its sections, a README short enough to read and a table of contents that
//! matches its headings. Its submodules check the links of every document (`links.rs`),
//! the configuration reference against the keys `--check` prints (`configuration.rs`),
//! the errors reference against the status tables (`errors.rs`), the code map against
//! `src/` (`code_map.rs`), and the PostgreSQL table the stores reference gives against
//! the one idemgate creates (`stores.rs`). The metrics reference is checked against a
//! running idemgate's `/metrics` by `tests/it/monitoring.rs`.

mod code_map;
mod configuration;
mod errors;
mod links;
mod stores;

use std::path::{Path, PathBuf};

fn read(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The documents a reader opens first: README.md and every `docs/*.md`, as (path
/// relative to the root, text), README.md first.
fn documents() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").file_name())
        .filter_map(|name| name.to_str().map(str::to_owned))
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    names.sort();
    names.insert(0, "README.md".to_owned());
    names
        .into_iter()
        .map(|name| {
            let text = read(&name);
            (name, text)
        })
        .collect()
}

/// `text` split in two of the same length and the same lines: its prose, with the code
/// (fenced blocks, code spans) blanked out, and its code, with the prose blanked out.
/// A link or a URL in code is an example, not a link.
fn split_code(text: &str) -> (String, String) {
    let (mut prose, mut code) = (String::new(), String::new());
    let (mut in_fence, mut in_span) = (false, false);
    for line in text.split_inclusive('\n') {
        let fence = line.trim_start().starts_with("```");
        if fence || in_fence {
            in_fence ^= fence;
            code.push_str(line);
            prose.extend(line.chars().map(|c| if c == '\n' { c } else { ' ' }));
            continue;
        }
        if line.trim().is_empty() {
            in_span = false; // a code span never crosses a paragraph
        }
        for c in line.chars() {
            if c == '`' {
                in_span = !in_span;
            }
            let (kept, blank) = if in_span || c == '`' {
                (&mut code, &mut prose)
            } else {
                (&mut prose, &mut code)
            };
            kept.push(c);
            blank.push(if c == '\n' { c } else { ' ' });
        }
    }
    (prose, code)
}

/// The line number (from 1) of byte `at` of `text`.
fn line_of(text: &str, at: usize) -> usize {
    text[..at].matches('\n').count() + 1
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

/// The README says what idemgate guarantees, how to start, the concepts and where the
/// reference is; the reference itself lives in docs/, so the README stays short enough
/// to be read through.
#[test]
fn the_readme_stays_within_700_lines() {
    let lines = read("README.md").lines().count();
    assert!(
        lines <= 700,
        "README.md has {lines} lines: move reference material to docs/"
    );
}

/// The contract the code is written to, in the repository (see its introduction).
const BEHAVIOUR: &str = "docs/behaviour.md";

/// How comments cited the contract when it lived outside the repository, where a reader
/// of the repository cannot open it. Split in two so that this file does not cite it.
const OUTSIDE_CITATION: &str = concat!("SPEC", " §");

/// What a reader of the repository opens: the sources, tests, benches, examples, configs,
/// deployment files, scripts and documents, as (path relative to the root, text). Files
/// that are not UTF-8 text are left out.
fn repository_files() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pending: Vec<PathBuf> = [
        "src",
        "tests",
        "benches",
        "examples",
        "config",
        "deploy",
        "scripts",
        "docs",
        "README.md",
        "BENCHMARKS.md",
        "Dockerfile",
        "docker-compose.yml",
        "Cargo.toml",
    ]
    .iter()
    .map(|name| root.join(name))
    .collect();
    let mut files = Vec::new();
    while let Some(path) = pending.pop() {
        if path.is_dir() {
            let entries =
                std::fs::read_dir(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            pending.extend(entries.map(|entry| entry.expect("a directory entry").path()));
        } else if let Ok(text) = std::fs::read_to_string(&path) {
            let name = path.strip_prefix(root).expect("under the root");
            files.push((name.display().to_string(), text));
        }
    }
    assert!(
        files.iter().any(|(name, _)| name == BEHAVIOUR),
        "{BEHAVIOUR} is missing"
    );
    files
}

#[test]
fn no_file_cites_a_document_outside_the_repository() {
    let mut found = Vec::new();
    for (name, text) in repository_files() {
        for (n, line) in text.lines().enumerate() {
            if line.contains(OUTSIDE_CITATION) {
                found.push(format!("{name}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "cite {BEHAVIOUR} instead of a document the repository does not hold:\n{}",
        found.join("\n")
    );
}

/// The numbers of the sections of `docs/behaviour.md`: its `## N. Title` headings.
fn behaviour_sections(text: &str) -> Vec<u32> {
    text.lines()
        .filter_map(|line| line.strip_prefix("## ")?.split_once(". "))
        .filter_map(|(number, _)| number.parse().ok())
        .collect()
}

/// The section numbers of a citation, given the text after its first `§`: `4`, `9, §10`,
/// `2–§4`, `9-§11`, `1 and §8`. `None` when no number follows.
fn cited_sections(mut rest: &str) -> Option<Vec<u32>> {
    let mut numbers = Vec::new();
    loop {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        numbers.push(rest[..digits].parse().ok()?);
        rest = &rest[digits..];
        let next = [", §", "–§", "-§", " and §"]
            .iter()
            .find_map(|joint| rest.strip_prefix(joint));
        match next {
            Some(after) => rest = after,
            None => return Some(numbers),
        }
    }
}

/// Every citation of a section of `docs/behaviour.md` in the repository names a section
/// the document has, and no citation is split over two lines, where its number would go unchecked. The
/// sections are numbered 1, 2, 3, ... so that a number, once cited, keeps its meaning.
#[test]
fn every_behaviour_citation_names_a_section_that_exists() {
    let files = repository_files();
    let sections = behaviour_sections(&read(BEHAVIOUR));
    let expected: Vec<u32> = (1..).take(sections.len()).collect();
    assert_eq!(sections, expected, "{BEHAVIOUR}: sections out of sequence");
    let citation = format!("{BEHAVIOUR} §");
    let mut wrong = Vec::new();
    let mut cited = 0;
    for (name, text) in files.iter().filter(|(name, _)| name != BEHAVIOUR) {
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            let at = format!("{name}:{}", n + 1);
            for (start, _) in line.match_indices(&citation) {
                match cited_sections(&line[start + citation.len()..]) {
                    Some(numbers) => {
                        cited += 1;
                        for number in numbers.iter().filter(|number| !sections.contains(number)) {
                            wrong.push(format!("{at}: §{number} is no section: {line}"));
                        }
                    }
                    None => wrong.push(format!("{at}: a citation without a number: {line}")),
                }
            }
            let next = lines.get(n + 1).map_or("", |next| {
                next.trim_start_matches(|c: char| c.is_whitespace() || "/!#-".contains(c))
            });
            if line.trim_end().ends_with(BEHAVIOUR) && next.starts_with('§') {
                wrong.push(format!("{at}: a citation split over two lines: {line}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(
        cited > 0,
        "no file cites {BEHAVIOUR}: is the search looking in the right places?"
    );
}

/// A document's headings outside code blocks, as (level, title, GitHub anchor), in order.
fn headings(text: &str) -> Vec<(usize, String, String)> {
    let mut in_code = false;
    let mut seen: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
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
/// order. (That each of its links, like every link of every document, lands on a
/// heading is `links.rs`'s.)
#[test]
fn the_table_of_contents_lists_every_section() {
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
}
