//! `docs/errors.md` against the status tables of `src/error.rs`: its first table lists
//! exactly the (status, problem slug) pairs the proxy answers (`ProxyError::problem`),
//! its second exactly those of the admin key API (`AdminError::problem`), and every
//! `type` URI it shows is the base of `src/error.rs` followed by the slug.

use std::collections::BTreeSet;

use http::StatusCode;

use super::read;

const DOC: &str = "docs/errors.md";
const CODE: &str = "src/error.rs";

/// The status code whose constant is `name` (`BAD_REQUEST`): the constants are the
/// canonical reason phrases in upper case.
fn status_named(name: &str) -> u16 {
    (100..600)
        .filter_map(|code| StatusCode::from_u16(code).ok())
        .find(|status| {
            status.canonical_reason().is_some_and(|reason| {
                reason
                    .to_uppercase()
                    .replace([' ', '-'], "_")
                    .replace('\'', "")
                    == name
            })
        })
        .unwrap_or_else(|| panic!("no status is named {name}"))
        .as_u16()
}

/// The (status, slug) pairs of the `problem` table in `impl {ty}` of `src/error.rs`:
/// each `StatusCode::NAME,` followed by a string literal, its slug.
fn code_table(source: &str, ty: &str) -> BTreeSet<(u16, String)> {
    let start = source
        .find(&format!("\nimpl {ty} {{"))
        .unwrap_or_else(|| panic!("{CODE}: no impl {ty}"));
    let block = &source[start + 1..];
    let block = &block[..block.find("\nimpl ").unwrap_or(block.len())];
    let block = &block[block.find("fn problem").expect("fn problem")..];
    let mut pairs = BTreeSet::new();
    for (at, _) in block.match_indices("StatusCode::") {
        let rest = &block[at + "StatusCode::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || *c == '_')
            .collect();
        // A row of the table is `(StatusCode::NAME, "slug", "title", retry_after)`.
        let Some(after) = rest[name.len()..].strip_prefix(',') else {
            continue;
        };
        let Some(slug) = after.trim_start().strip_prefix('"') else {
            continue;
        };
        let slug = &slug[..slug.find('"').expect("a closing quote")];
        pairs.insert((status_named(&name), slug.to_owned()));
    }
    assert!(!pairs.is_empty(), "{CODE}: no status in impl {ty}");
    pairs
}

/// The (status, slug) pairs of each `| status | slug (`type` URI) | when |` table of the
/// doc, in order; `502/504` is two statuses.
fn doc_tables(doc: &str, base: &str) -> Vec<BTreeSet<(u16, String)>> {
    let mut tables: Vec<BTreeSet<(u16, String)>> = Vec::new();
    let mut in_table = false;
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if !line.starts_with('|') {
            in_table = false;
        } else if cells.get(1) == Some(&"status") && cells[2].starts_with("slug") {
            in_table = true;
            tables.push(BTreeSet::new());
        } else if in_table && !cells[1].starts_with("---") {
            let spans: Vec<&str> = cells[2].split('`').skip(1).step_by(2).collect();
            let [slug, uri] = spans[..] else {
                panic!("{DOC}: not `slug` (`type` URI): {line}");
            };
            assert_eq!(uri, format!("{base}{slug}"), "{DOC}: {line}");
            let table = tables.last_mut().expect("a table");
            for status in cells[1].split('/') {
                let status = status.parse().unwrap_or_else(|_| panic!("{DOC}: {line}"));
                table.insert((status, slug.to_owned()));
            }
        }
    }
    tables
}

#[test]
fn the_errors_reference_lists_every_problem_of_the_status_tables() {
    let source = read(CODE);
    let base = source
        .split("const PROBLEM_BASE: &str = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("PROBLEM_BASE");
    let tables = doc_tables(&read(DOC), base);
    assert_eq!(
        tables.len(),
        2,
        "{DOC}: the proxy's table and the admin API's"
    );
    assert_eq!(
        tables[0],
        code_table(&source, "ProxyError"),
        "{DOC}'s first table and ProxyError::problem differ"
    );
    assert_eq!(
        tables[1],
        code_table(&source, "AdminError"),
        "{DOC}'s second table and AdminError::problem differ"
    );
}
