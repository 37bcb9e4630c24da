//! `store.encryption` and `store.max_entries_per_scope` (docs/behaviour.md §17).

use super::*;

const KEY_A: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="; // 32 bytes
const KEY_B: &str = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";

fn keys(list: &str) -> String {
    with_minimal(&format!("store:\n  encryption:\n    keys:\n{list}"))
}

#[test]
fn keys_are_read_in_order_from_base64_and_variables() {
    let env = env_map(&[("ENC_KEY", KEY_B)]);
    let text = keys(&format!(
        "      - {{id: new, key: \"${{ENC_KEY}}\"}}\n      - {{id: old, key: {KEY_A}}}\n"
    ));
    let config = Config::from_yaml_str(&text, &env).unwrap();
    let ids: Vec<&str> = config
        .store
        .encryption
        .iter()
        .map(|k| k.id.as_str())
        .collect();
    assert_eq!(ids, ["new", "old"], "the first seals, in the order written");
    assert_eq!(
        config.store.encryption[1].bytes(),
        b"0123456789abcdef0123456789abcdef"
    );
    assert!(parse_ok(&with_minimal("")).store.encryption.is_empty());
}

#[test]
fn a_key_that_is_not_32_bytes_of_base64_is_an_error_naming_its_id() {
    for bad in [
        "c2hvcnQ=",
        "not base64 at all!",
        "\"\"",
        &format!("{KEY_A}AAAA"),
    ] {
        let message = error_at(
            &keys(&format!(
                "      - {{id: k1, key: {KEY_A}}}\n      - {{id: rotated, key: {bad}}}\n"
            )),
            "store.encryption.keys[1].key (id 'rotated')",
        );
        assert!(message.contains("32 bytes in base64"), "{message}");
        assert!(
            !message.contains(KEY_A),
            "no key material in the message: {message}"
        );
    }
    let twice = keys(&format!(
        "      - {{id: k1, key: {KEY_A}}}\n      - {{id: k1, key: {KEY_B}}}\n"
    ));
    assert!(error_at(&twice, "store.encryption.keys[1].id").contains("twice"));
    for id in ["\"\"", "\"with space\""] {
        error_at(
            &keys(&format!("      - {{id: {id}, key: {KEY_A}}}\n")),
            "store.encryption.keys[0].id",
        );
    }
    error_at(
        &keys(&format!("      - {{key: {KEY_A}}}\n")),
        "store.encryption.keys[0].id",
    );
}

/// `--check` prints every key as `***`, names them in its opening notice, and refuses
/// `***` as a key until it is filled in.
#[test]
fn check_prints_every_key_masked() {
    let config = parse_ok(&keys(&format!(
        "      - {{id: a, key: {KEY_A}}}\n      - {{id: b, key: {KEY_B}}}\n"
    )));
    let yaml = config.to_yaml();
    assert!(!yaml.contains(KEY_A) && !yaml.contains(KEY_B), "{yaml}");
    assert!(
        yaml.contains("\n#   store.encryption.keys[0].key\n#   store.encryption.keys[1].key\n"),
        "{yaml}"
    );
    assert!(format!("{config:?}").contains("EncryptionKey(\"a\", ***)"));
    assert!(!format!("{config:?}").contains(KEY_A));
    let message = error_at(&yaml, "store.encryption.keys[0].key (id 'a')");
    assert!(message.contains("'***'"), "{message}");
    // The notice mentions `***` too; the keys are the quoted ones.
    let filled = yaml.replacen("'***'", KEY_A, 1).replacen("'***'", KEY_B, 1);
    assert_eq!(parse_ok(&filled), config);
    // Without keys, nothing about encryption is printed.
    assert!(!parse_ok(&with_minimal("")).to_yaml().contains("encryption"));
}

#[test]
fn a_scope_quota_is_a_count_of_at_least_one_on_the_embedded_stores() {
    for kind in ["memory", "file"] {
        let text = with_minimal(&format!(
            "store:\n  kind: {kind}\n  max_entries_per_scope: 50\n"
        ));
        let config = parse_ok(&text);
        assert_eq!(config.store.max_entries_per_scope, Some(50));
        assert!(config.to_yaml().contains("max_entries_per_scope: 50"));
        assert_eq!(parse_ok(&config.to_yaml()), config);
    }
    error_at(
        &with_minimal("store:\n  max_entries_per_scope: 0\n"),
        "store.max_entries_per_scope",
    );
    // Redis does not read it: allowed, and not in force.
    let redis = parse_ok(&with_minimal(
        "store:\n  kind: redis\n  max_entries_per_scope: 5\n",
    ));
    assert_eq!(redis.store.max_entries_per_scope, None);
}
