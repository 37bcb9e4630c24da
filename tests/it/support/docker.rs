//! Reading the Dockerfile and `.dockerignore` the way a Docker builder does, for the tests
//! that check the image on machines without a Docker engine (`tests/it/docker_build.rs`,
//! `tests/it/compose.rs`). Only the syntax the project uses is understood; anything else
//! panics with the line, so the tests never silently read a file differently from Docker.

#![allow(dead_code, unreachable_pub)]

use std::path::Path;

/// One instruction: the keyword upper-cased, its arguments with continuations joined.
#[derive(Debug, Clone)]
pub struct Instruction {
    pub keyword: String,
    pub args: String,
    /// 1-based line of the keyword, for messages.
    pub line: usize,
}

/// A `FROM` and the instructions up to the next one.
#[derive(Debug, Clone)]
pub struct Stage {
    pub image: String,
    pub name: Option<String>,
    pub instructions: Vec<Instruction>,
}

impl Stage {
    pub fn all<'a>(&'a self, keyword: &'a str) -> impl Iterator<Item = &'a Instruction> + 'a {
        self.instructions
            .iter()
            .filter(move |i| i.keyword == keyword)
    }

    /// The working directory the stage ends with (`/` when none is set).
    pub fn workdir(&self) -> String {
        self.all("WORKDIR")
            .last()
            .map_or_else(|| "/".to_owned(), |i| i.args.trim().to_owned())
    }

    /// `image` split at the tag: `("rust", "1.95-slim-bookworm")`.
    pub fn image_and_tag(&self) -> (&str, Option<&str>) {
        match self.image.rsplit_once(':') {
            Some((name, tag)) if !tag.contains('/') => (name, Some(tag)),
            _ => (self.image.as_str(), None),
        }
    }
}

/// The instructions of a Dockerfile, comments and blank lines dropped.
pub fn instructions(text: &str) -> Vec<Instruction> {
    let mut out = Vec::new();
    let mut pending: Option<Instruction> = None;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if pending.is_none() && (line.is_empty() || line.starts_with('#')) {
            continue;
        }
        // Inside a continuation, comment lines are skipped too (Docker does the same).
        if pending.is_some() && line.starts_with('#') {
            continue;
        }
        let (body, continues) = match line.strip_suffix('\\') {
            Some(body) => (body.trim_end(), true),
            None => (line, false),
        };
        match pending.as_mut() {
            Some(ins) => {
                ins.args.push(' ');
                ins.args.push_str(body);
            }
            None => {
                let (keyword, args) = body.split_once(char::is_whitespace).unwrap_or((body, ""));
                pending = Some(Instruction {
                    keyword: keyword.to_ascii_uppercase(),
                    args: args.trim().to_owned(),
                    line: n + 1,
                });
            }
        }
        if !continues {
            out.extend(pending.take());
        }
    }
    assert!(
        pending.is_none(),
        "the Dockerfile ends inside a continuation"
    );
    out
}

/// The stages of a Dockerfile, in order.
pub fn stages(text: &str) -> Vec<Stage> {
    let mut stages: Vec<Stage> = Vec::new();
    for ins in instructions(text) {
        if ins.keyword == "FROM" {
            let words: Vec<&str> = ins.args.split_whitespace().collect();
            let (image, name) = match words.as_slice() {
                [image] => (*image, None),
                [image, as_, name] if as_.eq_ignore_ascii_case("as") => (*image, Some(*name)),
                _ => panic!("line {}: FROM {} is not understood", ins.line, ins.args),
            };
            assert!(
                !image.starts_with("--"),
                "line {}: FROM flags are not understood",
                ins.line
            );
            stages.push(Stage {
                image: image.to_owned(),
                name: name.map(str::to_owned),
                instructions: Vec::new(),
            });
        } else {
            let stage = stages
                .last_mut()
                .unwrap_or_else(|| panic!("line {}: {} before FROM", ins.line, ins.keyword));
            stage.instructions.push(ins);
        }
    }
    stages
}

/// A parsed `COPY`.
#[derive(Debug, Clone)]
pub struct Copy {
    /// `--from=STAGE`, when it copies from another stage instead of the context.
    pub from: Option<String>,
    pub sources: Vec<String>,
    pub dest: String,
}

impl Copy {
    pub fn parse(ins: &Instruction) -> Copy {
        assert_eq!(ins.keyword, "COPY");
        let words: Vec<String> = if ins.args.trim_start().starts_with('[') {
            serde_json::from_str(&ins.args)
                .unwrap_or_else(|e| panic!("line {}: COPY [...] is not JSON: {e}", ins.line))
        } else {
            ins.args.split_whitespace().map(str::to_owned).collect()
        };
        let mut from = None;
        let mut rest = Vec::new();
        for word in words {
            if let Some(stage) = word.strip_prefix("--from=") {
                from = Some(stage.to_owned());
            } else if word.starts_with("--") {
                // --chown, --chmod and --link change no file's presence.
                assert!(
                    ["--chown=", "--chmod=", "--link"]
                        .iter()
                        .any(|f| word.starts_with(f)),
                    "line {}: COPY flag {word} is not understood",
                    ins.line
                );
            } else {
                rest.push(word);
            }
        }
        let dest = rest
            .pop()
            .unwrap_or_else(|| panic!("line {}: COPY without a destination", ins.line));
        assert!(!rest.is_empty(), "line {}: COPY without a source", ins.line);
        for source in &rest {
            assert!(
                !source.contains(['*', '?', '[']),
                "line {}: wildcard sources ({source}) are not understood",
                ins.line
            );
        }
        Copy {
            from,
            sources: rest,
            dest,
        }
    }

    /// Whether `dest` names a directory that the sources go into, as Docker decides it.
    pub fn dest_is_dir(&self) -> bool {
        self.dest.ends_with('/') || self.sources.len() > 1
    }
}

/// The JSON (exec) form of `CMD`/`ENTRYPOINT`/`RUN`, or `None` for the shell form.
pub fn exec_form(ins: &Instruction) -> Option<Vec<String>> {
    ins.args
        .trim_start()
        .starts_with('[')
        .then(|| serde_json::from_str(&ins.args).expect("exec form is a JSON array of strings"))
}

/// The rules of a `.dockerignore`, applied as BuildKit applies them: a path is excluded
/// when the last pattern that matches it, or one of its parent directories, is not an
/// exception (`!`). Patterns are globs per path segment (`*`, `?`, and `**` for any
/// number of segments), relative to the context root.
#[derive(Debug, Default)]
pub struct Ignore {
    rules: Vec<(bool, Vec<String>)>,
}

impl Ignore {
    /// The rules in `path`; none when the file does not exist.
    pub fn load(path: &Path) -> Ignore {
        match std::fs::read_to_string(path) {
            Ok(text) => Ignore::parse(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ignore::default(),
            Err(e) => panic!("{}: {e}", path.display()),
        }
    }

    pub fn parse(text: &str) -> Ignore {
        let mut rules = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (exception, pattern) = match line.strip_prefix('!') {
                Some(p) => (true, p.trim()),
                None => (false, line),
            };
            assert!(
                !pattern.contains(['[', '\\']),
                ".dockerignore: {line} uses syntax this reader does not understand"
            );
            let segments = pattern
                .split('/')
                .filter(|s| !s.is_empty() && *s != ".")
                .map(str::to_owned)
                .collect::<Vec<_>>();
            if !segments.is_empty() {
                rules.push((exception, segments));
            }
        }
        Ignore { rules }
    }

    /// Whether `path` (relative to the context, `/`-separated) stays out of the context.
    pub fn excluded(&self, path: &str) -> bool {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let mut excluded = false;
        for (exception, pattern) in &self.rules {
            if (1..=segments.len()).any(|n| glob(pattern, &segments[..n])) {
                excluded = !exception;
            }
        }
        excluded
    }
}

fn glob(pattern: &[String], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((first, rest)) if first == "**" => {
            (0..=path.len()).any(|skip| glob(rest, &path[skip..]))
        }
        Some((first, rest)) => match path.split_first() {
            Some((segment, path_rest)) => {
                segment_matches(first.as_bytes(), segment.as_bytes()) && glob(rest, path_rest)
            }
            None => false,
        },
    }
}

fn segment_matches(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|skip| segment_matches(rest, &text[skip..])),
        Some((b'?', rest)) => !text.is_empty() && segment_matches(rest, &text[1..]),
        Some((c, rest)) => text.first() == Some(c) && segment_matches(rest, &text[1..]),
    }
}
