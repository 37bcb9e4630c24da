//! The text of a configuration read by the YAML parser, serde-saphyr, in one pass.
//!
//! The parser bounds what it reads itself (docs/behaviour.md §15): nesting deeper than
//! [`MAX_DEPTH`] (a flow collection is refused by its scanner as soon as it opens one
//! level too many, whatever follows), and aliases that would replay more than
//! [`MAX_REPLAYED`] events (a "billion laughs" file is refused after a few thousand
//! events, not after a billion). Duplicate keys are refused; merge keys (`<<: *base`)
//! are expanded. [`MAX_BYTES`] is checked before anything is read.
//!
//! `serde_path_to_error` records the path of the value being read (`routes[1].ttl`), and
//! the parser where it is in the file; every error names both.

use serde::de::DeserializeOwned;
use serde_saphyr::{DefaultMessageFormatter, Error, Location, MessageFormatter};

use super::error::{At, ConfigError};
use super::interp;

/// The largest configuration file, in bytes.
pub(super) const MAX_BYTES: usize = 1 << 20;

/// The deepest nesting of collections: a top-level mapping is 1, `a: [x]` is 2.
pub(super) const MAX_DEPTH: usize = 64;

/// The most events aliases may replay in one file. A configuration repeats a few
/// routes at most; a billion-laughs file would replay 10^9.
const MAX_REPLAYED: usize = 10_000;

/// Refuses text above [`MAX_BYTES`] (under `location`, the file or `(document)`).
pub(super) fn check_size(len: usize, location: &str) -> Result<(), ConfigError> {
    if len > MAX_BYTES {
        return Err(ConfigError::Limit {
            location: location.to_owned(),
            message: format!(
                "larger than 1 MiB ({MAX_BYTES} bytes), the most a configuration may hold"
            ),
        });
    }
    Ok(())
}

/// `text` read as a `T`, `${VAR}` resolved by `env`.
///
/// Values are interpolated as they are read (`interp`). A variable is asked of `env`
/// once a value names it: a first read that meets names not yet asked is read again
/// with their values, so that no name is ever looked up that the file does not use.
pub(super) fn document<T: DeserializeOwned>(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<T, ConfigError> {
    check_size(text.len(), "(document)")?;
    let mut vars = interp::Vars::default();
    loop {
        let (read, asked) = interp::reading(vars.clone(), || read::<T>(text));
        if asked.is_empty() {
            return read;
        }
        for name in asked {
            let value = env(&name);
            vars.insert(name, value);
        }
    }
}

fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_depth: MAX_DEPTH,
            // A flow collection more than 64 deep is more than 64 levels deep.
            flow_nesting_limit: MAX_DEPTH,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: MAX_REPLAYED,
        },
        // YAML 1.2, as the file has always been read: `yes` and `off` are strings,
        // `1_000` too, and `.nan` reaches the key that refuses it.
        strict_booleans: true,
        underscored_numbers_as_strings: true,
        non_finite_float_policy: serde_saphyr::NonFiniteFloatPolicy::PassThrough,
        with_snippet: false,
    }
}

fn read<T: DeserializeOwned>(text: &str) -> Result<T, ConfigError> {
    let mut path = None;
    serde_saphyr::with_deserializer_from_str_with_options(text, options(), |de| {
        serde_path_to_error::deserialize(de).map_err(|err| {
            path = Some(err.path().to_string());
            err.into_inner()
        })
    })
    .map_err(|err| classify(text, path.as_deref(), &err))
}

/// The parser's error as one of ours: a value (named by its `path`, when the parser was
/// reading one), the YAML itself, or a limit.
fn classify(text: &str, path: Option<&str>, err: &Error) -> ConfigError {
    let err = original(err);
    let at = err.location().filter(|at| at.line() > 0);
    let location = || at.map_or_else(|| "(document)".to_owned(), |at| line_column(&at));
    let too_deep = || ConfigError::Limit {
        location: location(),
        message: format!("nested deeper than {MAX_DEPTH} levels"),
    };
    let message = DefaultMessageFormatter.format_message(err).into_owned();
    match err {
        Error::ExternalMessage { msg, .. } if msg.contains("recursion limit exceeded") => {
            too_deep()
        }
        Error::Budget { breach, .. } => match breach {
            serde_saphyr::budget::BudgetBreach::Depth { .. } => too_deep(),
            breach => ConfigError::Limit {
                location: location(),
                message: format!("more YAML than any configuration holds ({breach:?})"),
            },
        },
        Error::AliasReplayLimitExceeded { .. }
        | Error::AliasExpansionLimitExceeded { .. }
        | Error::AliasReplayStackDepthExceeded { .. } => ConfigError::Limit {
            location: location(),
            message: format!(
                "aliases expand to more than {MAX_REPLAYED} YAML events, more than a \
                 configuration repeats"
            ),
        },
        Error::ExternalMessage { .. } | Error::MultipleDocuments { .. } => ConfigError::Syntax {
            location: location(),
            message,
        },
        _ => {
            let path = match path {
                None | Some(".") => "(top level)".to_owned(),
                Some(path) => path.to_owned(),
            };
            let at = At(at
                .map(|at| (at.line(), at.column()))
                .or_else(|| locate(text, &path)));
            value_error(path, err, &message, at)
        }
    }
}

/// An error about a value (or a key) at `path`.
fn value_error(path: String, err: &Error, message: &str, at: At) -> ConfigError {
    match err {
        Error::DuplicateMappingKey { key, .. } => {
            // The path is that of the mapping, with `?` for the key being read.
            let parent = path.trim_end_matches('?').trim_end_matches('.');
            let key = key.as_deref().unwrap_or("?");
            let path = if parent.is_empty() || parent == "(top level)" {
                key.to_owned()
            } else {
                format!("{parent}.{key}")
            };
            ConfigError::Invalid {
                path,
                message: "duplicate key: written twice in one mapping; write it once".to_owned(),
                at,
            }
        }
        Error::SerdeUnknownField {
            field, expected, ..
        } => ConfigError::Invalid {
            path,
            message: unknown_key(field, expected),
            at,
        },
        _ => match interp::missing() {
            Some(var) => ConfigError::MissingEnv { path, var, at },
            None => ConfigError::Invalid {
                path,
                message: tidy(message),
                at,
            },
        },
    }
}

/// The error itself, out of the wrappers that say where an alias took it.
fn original(mut err: &Error) -> &Error {
    while let Error::AliasError { error, .. } | Error::WithSnippet { error, .. } = err {
        err = error;
    }
    err
}

fn line_column(at: &Location) -> String {
    format!("line {} column {}", at.line(), at.column())
}

/// serde's built-in messages in this module's style: `'x'` rather than `` `x` ``.
fn tidy(message: &str) -> String {
    let mut parts = message.splitn(3, '`');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(head), Some(quoted), Some(tail)) => {
            format!("{head}'{quoted}'{}", tail.replace('`', ""))
        }
        _ => message.to_owned(),
    }
}

/// "unknown field 'foo', expected one of a, b", or, when one of the expected keys is a
/// likely misspelling of `foo`, "unknown key; did you mean 'a'?".
fn unknown_key(unknown: &str, expected: &[&str]) -> String {
    let lower = unknown.to_ascii_lowercase();
    let closest = expected
        .iter()
        .map(|key| (edit_distance(&lower, &key.to_ascii_lowercase()), key))
        .min_by_key(|(distance, _)| *distance);
    match closest {
        // A third of the key's letters, at least one: `tll` finds `ttl`, `bogus` nothing.
        Some((distance, key)) if distance <= (lower.chars().count() / 3).max(1) => {
            format!("unknown key; did you mean '{key}'?")
        }
        _ => format!(
            "unknown field '{unknown}', expected one of {}",
            expected.join(", ")
        ),
    }
}

/// Edits (insert, delete, replace, or swap two neighbours) that turn `a` into `b`: the
/// optimal string alignment distance, so a swap such as `requried` counts once.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // rows[i][j]: the distance between the first i letters of a and the first j of b.
    let mut rows = vec![vec![0; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}
/// `err` with the place in `text` it is about, if it names a path and no line: a rule
/// across keys fails after reading, and only then is the text read again to find it.
pub(super) fn located(mut err: ConfigError, text: &str) -> ConfigError {
    if let ConfigError::Invalid { path, at, .. } | ConfigError::MissingEnv { path, at, .. } =
        &mut err
        && at.0.is_none()
    {
        *at = At(locate(text, path));
    }
    err
}

/// Where `path` (`routes[1].ttl`, as errors write it) is written in `text`: the value at
/// the path, or, for a key that is not written (a default, or a key that is missing),
/// the nearest enclosing one that is. For the errors found once every value has been
/// read, which no longer know where they came from; read again only then, and no
/// deeper than a configuration goes.
pub(super) fn locate(text: &str, path: &str) -> Option<(u64, u64)> {
    let mut options = options();
    options.budget = serde_saphyr::budget! { max_depth: LOCATE_DEPTH };
    let Ok(mut node) = serde_saphyr::from_str_with_options::<Spanned<Node>>(text, options) else {
        // Deeper than any configuration: only the top level can be named.
        return steps(path).is_empty().then_some((1, 1));
    };
    let mut at = node.referenced;
    for step in steps(path) {
        let next = match (node.value, step) {
            (Node::Map(entries), Step::Key(key)) => {
                entries.into_iter().find(|(k, _)| *k == key).map(|(_, v)| v)
            }
            (Node::Seq(items), Step::Index(i)) => items.into_iter().nth(i),
            _ => None,
        };
        let Some(next) = next else { break };
        at = next.referenced;
        node = next;
    }
    Some((at.line().max(1), at.column().max(1)))
}

/// Deeper than any key of a configuration (`routes[0].scope_principal.jwt.claims[0]`
/// is 6), shallow enough to read recursively on any thread's stack.
const LOCATE_DEPTH: usize = 16;

type Spanned<T> = serde_saphyr::Spanned<T>;

/// A document, for [`locate`]: its collections and where each value is.
enum Node {
    Map(Vec<(String, Spanned<Node>)>),
    Seq(Vec<Spanned<Node>>),
    Scalar,
}

impl<'de> serde::Deserialize<'de> for Node {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> serde::de::Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok(Node::Map(entries))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_str<E>(self, _: &str) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
}

enum Step {
    Key(String),
    Index(usize),
}

/// `routes[1].ttl` as steps: `routes`, 1, `ttl`. A path that is no path (`(top level)`,
/// `--upstream`) has none.
fn steps(path: &str) -> Vec<Step> {
    if path.starts_with('(') {
        return Vec::new();
    }
    let mut steps = Vec::new();
    for part in path.split('.') {
        let (key, indexes) = part
            .split_once('[')
            .map_or((part, ""), |(k, rest)| (k, rest));
        if !key.is_empty() {
            steps.push(Step::Key(key.to_owned()));
        }
        for index in indexes.split('[') {
            if let Ok(i) = index.trim_end_matches(']').parse() {
                steps.push(Step::Index(i));
            }
        }
    }
    steps
}
