//! Every link of README.md and docs/*.md lands, and none leaves the repository except to
//! a public standard or a crate: a reader of the repository can follow each one, and
//! nothing it relies on lives on a site that may change or vanish.

use std::path::{Component, Path, PathBuf};

use super::{documents, headings, line_of, read, split_code};

/// Where a link may leave the repository for: the IETF's and the RFC Editor's documents,
/// the W3C's recommendations, the OpenTelemetry specification, and crates.
const STANDARDS_AND_CRATES: &[&str] = &[
    "https://datatracker.ietf.org/doc/",
    "https://www.rfc-editor.org/rfc/",
    "https://www.w3.org/TR/",
    "https://opentelemetry.io/docs/specs/",
    "https://crates.io/crates/",
    "https://docs.rs/",
];

/// The URLs of a document's prose (link targets, autolinks, bare URLs, which GitHub
/// links too), as (line, URL). URLs in code are examples (`http://127.0.0.1:8080`).
fn urls(text: &str) -> Vec<(usize, String)> {
    let (prose, _) = split_code(text);
    let mut found = Vec::new();
    for scheme in ["http://", "https://"] {
        for (at, _) in prose.match_indices(scheme) {
            let url: String = prose[at..]
                .chars()
                .take_while(|c| !c.is_whitespace() && !")>]\"'".contains(*c))
                .collect();
            found.push((line_of(text, at), url));
        }
    }
    found
}

/// The targets of a document's Markdown links outside code, as (line, target).
fn link_targets(text: &str) -> Vec<(usize, String)> {
    let (prose, _) = split_code(text);
    prose
        .match_indices("](")
        .map(|(at, _)| {
            let rest = &prose[at + 2..];
            let target = &rest[..rest.find(')').unwrap_or(rest.len())];
            (line_of(text, at), target.trim().to_owned())
        })
        .collect()
}

/// `relative` taken from the directory of `document`, both relative to the root, without
/// `.` and `..`; `None` if it climbs above the root.
fn resolve(document: &str, relative: &str) -> Option<PathBuf> {
    let mut path = PathBuf::new();
    let base = Path::new(document).parent().unwrap_or(Path::new(""));
    for component in base.join(relative).components() {
        match component {
            Component::Normal(part) => path.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                if !path.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(path)
}

#[test]
fn no_link_leaves_the_repository_but_for_a_standard_or_a_crate() {
    let mut wrong = Vec::new();
    for (name, text) in documents() {
        for (line, url) in urls(&text) {
            if !STANDARDS_AND_CRATES
                .iter()
                .any(|allowed| url.starts_with(allowed))
            {
                wrong.push(format!("{name}:{line}: {url} is no standard nor crate"));
            }
        }
        for (line, target) in link_targets(&text) {
            let Some((scheme, _)) = target.split_once(':') else {
                continue;
            };
            if !["http", "https"].contains(&scheme) && !scheme.contains(['/', '#']) {
                wrong.push(format!("{name}:{line}: {target} leaves the repository"));
            }
        }
        // Commands and paths in code are run and read from the root: `../` is outside.
        let (_, code) = split_code(&text);
        for (n, code_line) in code.lines().enumerate() {
            let tokens = code_line.split(|c: char| c.is_whitespace() || "`'\"(=".contains(c));
            for token in tokens.filter(|token| token.starts_with("../")) {
                wrong.push(format!(
                    "{name}:{}: {token} is outside the repository",
                    n + 1
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_link_into_the_repository_lands_on_a_file_and_a_heading() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (name, text) in documents() {
        for (line, target) in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue; // the test above
            }
            checked += 1;
            let at = format!("{name}:{line}: ({target})");
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let file = if file.is_empty() {
                PathBuf::from(&name)
            } else {
                match resolve(&name, file) {
                    Some(path) => path,
                    None => {
                        wrong.push(format!("{at} climbs out of the repository"));
                        continue;
                    }
                }
            };
            if !root.join(&file).exists() {
                wrong.push(format!("{at}: {} does not exist", file.display()));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            let file = file.to_str().expect("a UTF-8 path");
            if !file.ends_with(".md") {
                wrong.push(format!(
                    "{at}: an anchor into {file}, which has no headings"
                ));
                continue;
            }
            if !headings(&read(file)).iter().any(|(_, _, a)| a == anchor) {
                wrong.push(format!("{at}: #{anchor} is no heading's anchor in {file}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(
        checked > 0,
        "no link found: is the search looking in the right places?"
    );
}

/// The README leads to every document of the reference.
#[test]
fn the_readme_links_every_document_of_docs() {
    let readme = read("README.md");
    let linked: Vec<String> = link_targets(&readme)
        .into_iter()
        .map(|(_, target)| target.split('#').next().unwrap_or("").to_owned())
        .collect();
    for (name, _) in documents().into_iter().skip(1) {
        assert!(linked.contains(&name), "README.md has no link to {name}");
    }
}
