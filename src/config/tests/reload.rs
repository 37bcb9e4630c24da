//! Every key has a reload class (docs/behaviour.md §14), and the reload table of
//! docs/operations.md says what [`RELOAD`] declares.

use std::collections::BTreeSet;

use super::*;

fn repo_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

fn declared(reload: Option<Reload>) -> BTreeSet<String> {
    RELOAD
        .iter()
        .filter(|key| reload.is_none_or(|reload| key.reload == reload))
        .map(|key| key.name.to_owned())
        .collect()
}

/// The annotated example writes every top-level key; each has a class, or each of its
/// keys has one when its section is declared key by key (`admin`, `log`).
#[test]
fn every_key_of_the_annotated_config_has_a_reload_class() {
    let example = Tree::parse(&repo_file("config/example.yaml"));
    let declared = declared(None);
    let Tree::Map(entries) = &example else {
        panic!("config/example.yaml is not a mapping");
    };
    for (key, value) in entries {
        if declared.contains(key) {
            continue;
        }
        let prefix = format!("{key}.");
        assert!(
            declared.iter().any(|name| name.starts_with(&prefix)),
            "config/example.yaml: {key} has no reload class in config::top"
        );
        for sub in value.keys() {
            let name = format!("{prefix}{sub}");
            assert!(declared.contains(&name), "{name} has no reload class");
        }
    }
    // And the example writes every declared key, so that the check above sees them all.
    for name in &declared {
        let top = name.split('.').next().unwrap();
        assert!(
            example.get(top).is_some(),
            "config/example.yaml lacks {top}"
        );
    }
}

/// The keys in backticks of the row of the docs/operations.md reload table whose second
/// cell starts with `outcome`.
fn readme_row(outcome: &str) -> BTreeSet<String> {
    let readme = repo_file("docs/operations.md");
    let (_, section) = readme
        .split_once("### Reloading the configuration (SIGHUP)")
        .unwrap();
    let row = section
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .map(|line| line.split('|').map(str::trim).collect::<Vec<_>>())
        .find(|cells| cells.get(2).is_some_and(|cell| cell.starts_with(outcome)))
        .unwrap_or_else(|| panic!("docs/operations.md: no reload row '{outcome}'"));
    row[1]
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_readme_reload_table_is_what_the_keys_declare() {
    assert_eq!(
        readme_row("need a restart"),
        declared(Some(Reload::Restart))
    );
    assert_eq!(
        readme_row("apply to requests that start after it"),
        declared(Some(Reload::Applies))
    );
}
