use std::fs;

use super::*;

#[test]
fn a_second_open_while_the_first_lives_is_in_use() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut first, _) = open_ok(dir.path());
    first.append(&enc(&[put(1, 1, b"x")])).expect("append");
    assert!(matches!(open(dir.path()), Err(OpenError::InUse { .. })));
    drop(first);
    let (_, seen) = open_ok(dir.path());
    assert_eq!(seen, [put(1, 1, b"x")]);
}

#[test]
fn a_stray_file_without_a_journal_is_corrupt_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    fs::write(dir.path().join("keys.bak"), b"someone's").expect("write");
    match open(dir.path()) {
        Err(err @ OpenError::Corrupt { .. }) => assert!(err.to_string().contains("keys.bak")),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(!dir.path().join(JOURNAL_FILE).exists());
}

#[test]
fn a_new_journal_starts_next_to_the_lock_and_lost_and_found() {
    let dir = tempfile::tempdir().expect("temp dir");
    fs::write(dir.path().join(dir::LOCK_FILE), b"").expect("write");
    fs::create_dir(dir.path().join("lost+found")).expect("mkdir");
    let (journal, seen) = open_ok(dir.path());
    assert!(seen.is_empty());
    assert_eq!(journal.len(), HEADER);
    assert_eq!(journal_bytes(dir.path()), header(FORMAT));
}

#[test]
fn a_redb_store_is_refused_and_not_touched() {
    let dir = tempfile::tempdir().expect("temp dir");
    fs::write(dir.path().join(dir::REDB_FILE), b"redb bytes").expect("write");
    let err = open(dir.path()).expect_err("refused");
    assert!(matches!(err, OpenError::Redb { .. }), "{err:?}");
    assert!(err.to_string().contains("earlier redb format"), "{err}");
    let names: Vec<_> = fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, [dir::REDB_FILE], "nothing created next to it");
    assert_eq!(
        fs::read(dir.path().join(dir::REDB_FILE)).expect("read"),
        b"redb bytes"
    );
}

#[test]
fn a_journal_path_that_is_a_directory_is_unreadable() {
    let dir = tempfile::tempdir().expect("temp dir");
    fs::create_dir(dir.path().join(JOURNAL_FILE)).expect("mkdir");
    assert!(matches!(
        open(dir.path()),
        Err(OpenError::Unreadable { .. })
    ));
}

#[test]
fn a_leftover_staging_file_is_removed_on_open() {
    for existing in [false, true] {
        let dir = tempfile::tempdir().expect("temp dir");
        if existing {
            three_frames(dir.path());
        }
        let staging = dir.path().join(STAGING_FILE);
        fs::write(&staging, b"half a rewrite").expect("write");
        let (_, seen) = open_ok(dir.path());
        assert_eq!(seen.is_empty(), !existing);
        assert!(!staging.exists(), "existing journal: {existing}");
    }
}

#[test]
fn check_path_accepts_a_directory_to_be_made() {
    let dir = tempfile::tempdir().expect("temp dir");
    dir::check_path(&dir.path().join("a/b")).expect("can be created");
    let file = dir.path().join("file");
    fs::write(&file, b"").expect("write");
    assert!(matches!(
        dir::check_path(&file.join("below")),
        Err(OpenError::Create { .. })
    ));
}
