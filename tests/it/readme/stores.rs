//! `docs/stores.md` gives operators who create idemgate's table themselves
//! (`store.create_table: false`) the statements to run. They are the ones idemgate runs
//! when it creates the table (`idemgate::store::create_statements`), compared here, so
//! that a change of the table cannot leave the doc behind (docs/behaviour.md §22).

use super::read;

const DOC: &str = "docs/stores.md";

/// A SQL text as its statements, each on one line: split at `;`, every run of
/// whitespace made one space, and none just inside a parenthesis, so that the doc may
/// lay a statement out over several lines.
fn statements(sql: &str) -> Vec<String> {
    sql.split(';')
        .map(|statement| {
            statement
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .replace("( ", "(")
                .replace(" )", ")")
        })
        .filter(|statement| !statement.is_empty())
        .collect()
}

/// The bodies of the doc's fenced `sql` blocks that create a table.
fn create_table_blocks(doc: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut open: Option<String> = None;
    for line in doc.lines() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(lang)) if lang.trim() == "sql" => open = Some(String::new()),
            (Some(body), Some(_)) => {
                if body.contains("CREATE TABLE") {
                    blocks.push(std::mem::take(body));
                }
                open = None;
            }
            (Some(body), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn the_create_table_operators_are_given_is_the_one_idemgate_runs() {
    let doc = read(DOC);
    let blocks = create_table_blocks(&doc);
    assert_eq!(
        blocks.len(),
        1,
        "{DOC}: one ```sql block with the CREATE TABLE, found {blocks:?}"
    );
    let runs: Vec<String> = idemgate::store::create_statements("idemgate_records")
        .iter()
        .flat_map(|statement| statements(statement))
        .collect();
    assert_eq!(
        statements(&blocks[0]),
        runs,
        "{DOC}: the CREATE TABLE block is not what idemgate runs for store.table: \
         idemgate_records"
    );
}

#[test]
fn statements_are_compared_whatever_their_layout() {
    assert_eq!(
        statements("CREATE TABLE t (\n    a int,\n    b text\n);\nCOMMENT ON TABLE t IS 'x';\n"),
        [
            "CREATE TABLE t (a int, b text)",
            "COMMENT ON TABLE t IS 'x'"
        ]
    );
    let doc = "```sql\nCREATE TABLE t (a int);\n```\n```sql\nGRANT SELECT ON t TO u;\n```\n";
    assert_eq!(create_table_blocks(doc), ["CREATE TABLE t (a int);\n"]);
}
