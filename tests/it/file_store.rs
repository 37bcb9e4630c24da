//! `store.kind: file` from the outside (docs/behaviour.md §12): keys that survive a
//! restart of the binary, readiness and metrics, and every refusal: exit 1, an error
//! naming the path, the data left as it was.

use crate::support;

use std::path::{Path, PathBuf};

use support::bin::{
    Finished, Running, TempConfig, free_port, idemgate, idemgate_ignoring_sigxfsz, run,
};
use support::{TestClient, Upstream};

/// A config on the file store in `dir`; `extra` is appended (more top-level keys).
fn yaml(upstream: &str, dir: &Path, extra: &str) -> String {
    format!(
        "upstream:\n  url: {upstream}\nstore:\n  kind: file\n  path: {}\nadmin:\n  listen: null\n{extra}",
        dir.display()
    )
}

fn store_dir(tmp: &tempfile::TempDir) -> PathBuf {
    tmp.path().join("keys")
}

/// Starts the binary on `file` and expects it to refuse: exit 1, and an error naming `dir`.
async fn refused(file: &TempConfig, dir: &Path) -> Finished {
    let out = run(idemgate()
        .arg("--config")
        .arg(file.path())
        .arg("--listen")
        .arg(format!("127.0.0.1:{}", free_port())))
    .await;
    assert_eq!(out.code(), Some(1), "stderr: {}", out.stderr);
    assert!(
        out.stderr.contains(&dir.display().to_string()),
        "the error names {}: {}",
        dir.display(),
        out.stderr
    );
    out
}

fn db_bytes(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join(idemgate::store::file::JOURNAL_FILE)).expect("read the journal")
}

#[tokio::test]
async fn a_completed_key_replays_after_a_restart_and_readyz_and_metrics_report_the_store() {
    let up = Upstream::start().await;
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = store_dir(&tmp);
    let admin = free_port();
    let file = TempConfig::new(&yaml(&up.url(), &dir, "").replace(
        "admin:\n  listen: null\n",
        &format!("admin:\n  listen: 127.0.0.1:{admin}\n"),
    ));
    let path = file.path().to_string_lossy().into_owned();

    let mut first = Running::start(&["--config", &path]).await;
    let c = TestClient::new(first.addr);
    let created = c.post("/charges", "k1", "{}").await;
    assert_eq!(created.status, 201, "{}", created.text());
    let admin_client = TestClient::new(([127, 0, 0, 1], admin).into());
    let ready = admin_client.send("GET", "/readyz", &[], "").await;
    assert_eq!(ready.status, 200, "{}", ready.text());
    let metrics = admin_client.send("GET", "/metrics", &[], "").await.text();
    for line in [
        "idemgate_store_entries 1",
        "idemgate_store_flush_seconds_count ",
        "idemgate_store_flushes_total ",
        "idemgate_store_disk_bytes ",
        "idemgate_store_evictions_total{reason=\"full\"} 0",
        "idemgate_store_evictions_total{reason=\"scope_quota\"} 0",
    ] {
        assert!(metrics.contains(line), "no {line:?} in:\n{metrics}");
    }
    first.terminate().await;
    assert!(first.wait_exit().await.success());

    let second = Running::start(&["--config", &path]).await;
    let replay = TestClient::new(second.addr)
        .post("/charges", "k1", "{}")
        .await;
    assert_eq!(replay.status, 201, "{}", replay.text());
    assert!(replay.replayed());
    assert_eq!(replay.body, created.body);
    assert_eq!(up.count(), 1, "the restart forgot nothing");
}

#[tokio::test]
async fn a_second_process_on_the_same_path_exits_1_naming_it() {
    let up = Upstream::start().await;
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = store_dir(&tmp);
    let file = TempConfig::new(&yaml(&up.url(), &dir, ""));
    let path = file.path().to_string_lossy().into_owned();
    let first = Running::start(&["--config", &path]).await;
    let c = TestClient::new(first.addr);
    assert_eq!(c.post("/charges", "k", "{}").await.status, 201);
    let before = db_bytes(&dir);

    let out = refused(&file, &dir).await;
    assert!(
        out.stderr.contains("in use by another idemgate"),
        "{}",
        out.stderr
    );
    // The first one goes on serving from the untouched store.
    assert_eq!(db_bytes(&dir), before);
    assert!(c.post("/charges", "k", "{}").await.replayed());
}

#[tokio::test]
async fn a_corrupt_store_exits_1_and_is_left_as_it_is() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = store_dir(&tmp);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let garbage: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(dir.join(idemgate::store::file::JOURNAL_FILE), &garbage).expect("write");
    let file = TempConfig::new(&yaml("http://127.0.0.1:9", &dir, ""));

    let out = refused(&file, &dir).await;
    assert!(out.stderr.contains("corrupt"), "{}", out.stderr);
    assert_eq!(db_bytes(&dir), garbage, "never silently emptied");
}

/// A store that idemgate opened and wrote one key to (answered 201), then stopped:
/// its directory, and the config that opens it.
async fn a_store_with_one_key(tmp: &tempfile::TempDir) -> (PathBuf, TempConfig) {
    let up = Upstream::start().await;
    let dir = store_dir(tmp);
    let file = TempConfig::new(&yaml(&up.url(), &dir, ""));
    let path = file.path().to_string_lossy().into_owned();
    let mut running = Running::start(&["--config", &path]).await;
    let answer = TestClient::new(running.addr)
        .post("/charges", "k", "{}")
        .await;
    assert_eq!(answer.status, 201);
    running.terminate().await;
    running.wait_exit().await;
    (dir, file)
}

/// A store whose frames were overwritten after it was written: the journal's checksums
/// catch it, and nothing is repaired (or cut) away.
#[tokio::test]
async fn a_store_with_damaged_pages_exits_1_and_is_left_as_it_is() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let (dir, file) = a_store_with_one_key(&tmp).await;
    // Keep the journal's header, damage everything after it.
    let mut bytes = db_bytes(&dir);
    for b in &mut bytes[idemgate::store::file::HEADER_LEN..] {
        *b ^= 0x5A;
    }
    std::fs::write(dir.join(idemgate::store::file::JOURNAL_FILE), &bytes).expect("write");

    refused(&file, &dir).await;
    assert_eq!(db_bytes(&dir), bytes);
}

#[tokio::test]
async fn a_store_of_another_format_exits_1_and_is_left_as_it_is() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let (dir, file) = a_store_with_one_key(&tmp).await;
    // A store as a later idemgate might write it: another format number in the header.
    let mut bytes = db_bytes(&dir);
    let at = idemgate::store::file::FORMAT_AT;
    bytes[at..at + 8].copy_from_slice(&(idemgate::store::file::FORMAT + 1).to_be_bytes());
    std::fs::write(dir.join(idemgate::store::file::JOURNAL_FILE), &bytes).expect("write");

    let out = refused(&file, &dir).await;
    let found = format!("on-disk format {}", idemgate::store::file::FORMAT + 1);
    assert!(out.stderr.contains(&found), "{}", out.stderr);
    assert_eq!(db_bytes(&dir), bytes);
}

/// Writes the first `len` bytes of the journal back over it: a copy or a filesystem that
/// lost the journal's end.
fn cut_journal(dir: &Path, whole: &[u8], len: usize) {
    std::fs::write(dir.join(idemgate::store::file::JOURNAL_FILE), &whole[..len]).expect("cut");
}

/// A journal cut short of what the store had made durable (docs/behaviour.md §25) lost
/// answered records: it is refused naming the byte offset, never cut as a torn tail
/// (after which their keys would execute again). Once after a clean stop (`fsync: true`,
/// the zeros written ahead are cut off at the stop), once after `kill -9` (`fsync:
/// false`, nothing written ahead). With the whole journal back, every key replays.
#[tokio::test]
async fn a_journal_cut_to_half_its_length_exits_1_naming_the_offset() {
    for fsync in [true, false] {
        let up = Upstream::start().await;
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = store_dir(&tmp);
        let config = yaml(&up.url(), &dir, "").replace(
            "  kind: file\n",
            &format!("  kind: file\n  fsync: {fsync}\n"),
        );
        let file = TempConfig::new(&config);
        let path = file.path().to_string_lossy().into_owned();
        let mut running = Running::start(&["--config", &path]).await;
        let c = TestClient::new(running.addr);
        for k in 0..20 {
            let r = c.post("/charges", &format!("k{k}"), "{}").await;
            assert_eq!(r.status, 201, "{}", r.text());
        }
        if fsync {
            running.terminate().await;
        } else {
            running.kill().await;
        }
        running.wait_exit().await;
        let whole = db_bytes(&dir);
        let half = whole.len() / 2;
        cut_journal(&dir, &whole, half);

        let out = refused(&file, &dir).await;
        assert!(
            out.stderr.contains(&format!("at byte {half}")),
            "fsync {fsync}: {}",
            out.stderr
        );
        assert_eq!(
            db_bytes(&dir),
            whole[..half],
            "fsync {fsync}: left as it is"
        );

        cut_journal(&dir, &whole, whole.len());
        let running = Running::start(&["--config", &path]).await;
        let c = TestClient::new(running.addr);
        for k in 0..20 {
            let r = c.post("/charges", &format!("k{k}"), "{}").await;
            assert!(r.replayed(), "fsync {fsync}, k{k}: {}", r.text());
        }
        assert_eq!(up.count(), 20, "fsync {fsync}: no key executed twice");
    }
}

/// After a clean stop the journal is exactly what the store made durable: one byte less
/// is a refusal naming where it ends.
#[tokio::test]
async fn a_journal_one_byte_short_after_a_clean_stop_exits_1_naming_the_offset() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let (dir, file) = a_store_with_one_key(&tmp).await;
    let whole = db_bytes(&dir);
    let short = whole.len() - 1;
    cut_journal(&dir, &whole, short);

    let out = refused(&file, &dir).await;
    assert!(
        out.stderr.contains(&format!("at byte {short}")),
        "{}",
        out.stderr
    );
    assert_eq!(db_bytes(&dir), whole[..short], "left as it is");
}

#[tokio::test]
async fn an_unreadable_store_exits_1_naming_the_path() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = store_dir(&tmp);
    // Where the database file should be is a directory: it cannot be read as a file,
    // whoever runs the test (root reads any file regardless of its mode).
    std::fs::create_dir_all(dir.join(idemgate::store::file::JOURNAL_FILE)).expect("mkdir");
    let file = TempConfig::new(&yaml("http://127.0.0.1:9", &dir, ""));

    let out = refused(&file, &dir).await;
    assert!(out.stderr.contains("cannot be read"), "{}", out.stderr);
    assert!(dir.join(idemgate::store::file::JOURNAL_FILE).is_dir());
}

#[tokio::test]
async fn a_path_that_cannot_be_created_exits_1_and_check_reports_it() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let blocker = tmp.path().join("a-file");
    std::fs::write(&blocker, b"not a directory").expect("write");
    let dir = blocker.join("keys");
    let file = TempConfig::new(&yaml("http://127.0.0.1:9", &dir, ""));

    let out = refused(&file, &dir).await;
    assert!(out.stderr.contains("cannot be created"), "{}", out.stderr);

    let check = run(idemgate().arg("--config").arg(file.path()).arg("--check")).await;
    assert_eq!(check.code(), Some(1), "stdout: {}", check.stdout);
    assert!(
        check.stderr.contains("store.path") && check.stderr.contains(&dir.display().to_string()),
        "{}",
        check.stderr
    );
    // A good path passes --check and is not created by it.
    let fine = tmp.path().join("later/keys");
    let good = TempConfig::new(&yaml("http://127.0.0.1:9", &fine, ""));
    let check = run(idemgate().arg("--config").arg(good.path()).arg("--check")).await;
    assert_eq!(check.code(), Some(0), "{}", check.stderr);
    assert!(check.stdout.contains("  kind: file"), "{}", check.stdout);
    assert!(check.stdout.contains("  fsync: true"), "{}", check.stdout);
    assert!(!tmp.path().join("later").exists());
}

/// `on_concurrent: wait` on the file store: duplicates parked on the owner's key are
/// woken by its commit and replay the recorded response; one execution.
#[tokio::test]
async fn waiting_duplicates_are_woken_by_the_record_and_replay_it() {
    use idemgate::config::Config;

    let up = Upstream::start().await;
    let tmp = tempfile::tempdir().expect("temp dir");
    let yaml = format!(
        "upstream:\n  url: {}\nstore:\n  kind: file\n  path: {}\nidempotency:\n  on_concurrent: wait\n",
        up.url(),
        store_dir(&tmp).display()
    );
    let proxy =
        support::Proxy::file(Config::from_yaml_str(&yaml, &|_| None).expect("config")).await;
    let c = proxy.client();
    let first = c.spawn_post("/gate/charges", "w", "{}");
    up.wait_for(1).await;
    let waiters: Vec<_> = (0..3)
        .map(|_| c.spawn_post("/gate/charges", "w", "{}"))
        .collect();
    proxy.state.metrics.wait_until(|m| m.waiting() == 3).await;
    up.open_gate();
    let first = first.await.expect("join");
    assert_eq!(first.status, 201, "{}", first.text());
    for waiter in waiters {
        let r = waiter.await.expect("join");
        assert_eq!(r.status, 201, "{}", r.text());
        assert!(r.replayed());
        assert_eq!(r.body, first.body);
    }
    assert_eq!(up.count(), 1);
}

/// A filesystem of its own for one test: a size-limited tmpfs mounted on a temporary
/// directory (the tests run as root), so that a test can fill it for real and free it
/// again. Unmounted when dropped, also when the test fails.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    /// The error, when the tmpfs cannot be mounted (no root, no `CAP_SYS_ADMIN`).
    fn mount(size: &str) -> Result<SmallDisk, String> {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "idemgate-test",
            ])
            .arg(dir.path())
            .output()
            .map_err(|err| format!("running mount: {err}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
        }
        Ok(SmallDisk { dir })
    }

    /// Writes a file until the filesystem has no byte left; returns its path.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let filler = self.dir.path().join("filler");
        let mut file = std::fs::File::create(&filler).expect("create the filler");
        for chunk in [64 * 1024, 4096, 512, 1] {
            let bytes = vec![0xA5u8; chunk];
            while file.write_all(&bytes).is_ok() {}
        }
        filler
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazy: detached even if something still has a file open on it.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// How a test makes the store's disk full, for real.
enum FullDisk {
    /// A 4 MiB tmpfs mounted by the test, filled by a file the test writes until
    /// `ENOSPC`, freed by deleting that file.
    Tmpfs(SmallDisk),
    /// A file-size limit (`RLIMIT_FSIZE`, set on the running binary with `prlimit`) at
    /// the database file's size, so that a commit that grows the file fails (`EFBIG`);
    /// freed by lifting the limit. The binary ignores `SIGXFSZ`, as it would ignore a
    /// full disk.
    FileSize(tempfile::TempDir),
}

/// What [`FullDisk::fill`] did, undone by [`Filled::free`].
enum Filled {
    Filler(PathBuf),
    Limit(u32),
}

impl FullDisk {
    /// A tmpfs; where none can be mounted, says so and limits the file size instead.
    // The note is for whoever reads the test's output: which full disk was tested.
    #[allow(clippy::print_stderr)]
    fn tmpfs_or_file_size() -> FullDisk {
        match SmallDisk::mount("4m") {
            Ok(disk) => FullDisk::Tmpfs(disk),
            Err(why) => {
                eprintln!(
                    "NOTE: cannot mount a tmpfs ({why}): the disk is filled with a \
                     file-size limit instead"
                );
                FullDisk::file_size()
            }
        }
    }

    fn file_size() -> FullDisk {
        FullDisk::FileSize(tempfile::tempdir().expect("temp dir"))
    }

    fn path(&self) -> &Path {
        match self {
            FullDisk::Tmpfs(disk) => disk.dir.path(),
            FullDisk::FileSize(dir) => dir.path(),
        }
    }

    async fn start(&self, config: &str) -> Running {
        match self {
            FullDisk::Tmpfs(_) => Running::start(&["--config", config]).await,
            FullDisk::FileSize(_) => {
                Running::start_command(idemgate_ignoring_sigxfsz, &["--config", config], &[]).await
            }
        }
    }

    fn fill(&self, running: &Running, store: &Path) -> Filled {
        match self {
            FullDisk::Tmpfs(disk) => Filled::Filler(disk.fill()),
            FullDisk::FileSize(_) => {
                let size = std::fs::metadata(store.join(idemgate::store::file::JOURNAL_FILE))
                    .expect("the journal")
                    .len();
                prlimit(running.pid(), &format!("--fsize={size}:unlimited"));
                Filled::Limit(running.pid())
            }
        }
    }
}

impl Filled {
    fn free(self) {
        match self {
            Filled::Filler(path) => std::fs::remove_file(&path).expect("free the space"),
            Filled::Limit(pid) => prlimit(pid, "--fsize=unlimited:unlimited"),
        }
    }
}

fn prlimit(pid: u32, limit: &str) {
    let status = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), limit])
        .status()
        .expect("run prlimit");
    assert!(status.success(), "prlimit --pid {pid} {limit}: {status}");
}

/// Polls `/readyz` (its answer is cached for a second) until it answers `status`.
async fn readyz_becomes(admin: &TestClient, status: u16, running: &Running) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if admin.send("GET", "/readyz", &[], "").await.status == status {
            return;
        }
        if std::time::Instant::now() >= deadline {
            let log = running.stderr();
            let tail: Vec<&str> = log
                .lines()
                .filter(|line| !line.contains("idemgate::access"))
                .collect();
            panic!(
                "/readyz never answered {status}; idemgate's log without access lines, last 40:\n{}",
                tail[tail.len().saturating_sub(40)..].join("\n")
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The store's disk fills up: a write that fails is `503 store-unavailable` and nothing
/// is forwarded for it, `/readyz` is 503; once space is freed the store writes again and
/// is ready without a restart, and every key acknowledged before or after the outage
/// still replays, after a restart too.
async fn the_store_recovers_from(disk: FullDisk) {
    let store = disk.path().join("store");
    let up = Upstream::start().await;
    let admin = free_port();
    let file = TempConfig::new(&yaml(&up.url(), &store, "").replace(
        "admin:\n  listen: null\n",
        &format!("admin:\n  listen: 127.0.0.1:{admin}\n"),
    ));
    let path = file.path().to_string_lossy().into_owned();
    let mut running = disk.start(&path).await;
    let admin = TestClient::new(([127, 0, 0, 1], admin).into());
    let c = TestClient::new(running.addr);

    let mut acknowledged = Vec::new();
    for k in 0..5 {
        let key = format!("before-{k}");
        let r = c.post("/big/2000", &key, "{}").await;
        assert_eq!(r.status, 200, "{}", r.text());
        acknowledged.push((key, r.body));
    }
    readyz_becomes(&admin, 200, &running).await;

    let filled = disk.fill(&running, &store);
    let mut refused = false;
    for i in 0..300 {
        let executed = up.count();
        let r = c.post("/big/50000", &format!("full-{i}"), "{}").await;
        if r.status == 503 {
            assert_eq!(r.problem(), "store-unavailable");
            assert_eq!(up.count(), executed, "refused, never forwarded");
            refused = true;
            break;
        }
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert!(refused, "the full disk never refused a claim");
    readyz_becomes(&admin, 503, &running).await;

    filled.free();
    // Nothing is sent meanwhile: the store finds out on its own that it can write.
    readyz_becomes(&admin, 200, &running).await;
    let after = c.post("/big/2000", "after", "{}").await;
    assert_eq!(after.status, 200, "{}", after.text());
    assert!(!after.replayed());
    acknowledged.push(("after".to_owned(), after.body));

    let executed = up.count();
    for (key, body) in &acknowledged {
        let r = c.post("/big/2000", key, "{}").await;
        assert!(r.replayed(), "{key}: {} {}", r.status, r.text());
        assert_eq!(&r.body, body, "{key}");
    }
    running.terminate().await;
    assert!(running.wait_exit().await.success(), "{}", running.stderr());

    let mut running = Running::start(&["--config", &path]).await;
    let c = TestClient::new(running.addr);
    for (key, body) in &acknowledged {
        let r = c.post("/big/2000", key, "{}").await;
        assert!(
            r.replayed(),
            "after a restart, {key}: {} {}",
            r.status,
            r.text()
        );
        assert_eq!(&r.body, body, "{key}");
    }
    assert_eq!(up.count(), executed, "replays only");
    running.terminate().await;
    assert!(running.wait_exit().await.success(), "{}", running.stderr());

    // The writes that probed for room were cut off again: the store's directory holds
    // the journal and its lock, and the journal reopens with every key (above).
    let mut files: Vec<String> = std::fs::read_dir(&store)
        .expect("read the store")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            idemgate::store::file::JOURNAL_FILE,
            idemgate::store::file::LOCK_FILE
        ]
    );
}

/// The full disk is a real one: a 4 MiB tmpfs that the test mounts and fills with a
/// file until `ENOSPC`, then frees by deleting the file (a file-size limit where no
/// tmpfs can be mounted).
#[tokio::test]
async fn a_full_disk_is_503_and_not_ready_and_the_store_recovers_without_a_restart() {
    the_store_recovers_from(FullDisk::tmpfs_or_file_size()).await;
}

/// The same with the other real way to refuse a write: a file-size limit on the running
/// binary, reached by the database file, then lifted.
#[tokio::test]
async fn a_file_size_limit_is_503_and_not_ready_and_the_store_recovers_once_lifted() {
    the_store_recovers_from(FullDisk::file_size()).await;
}
