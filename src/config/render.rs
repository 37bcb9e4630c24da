//! The effective configuration as YAML, for `--check`.
//!
//! Everything is printed, defaults included, in the order of the configuration file's
//! description (docs/behaviour.md §6), so an operator sees what the proxy will actually
//! do; the output parses back to an equal `Config`
//! (every `${` in a value printed as `$${`, which loads back as `${`) once the secrets,
//! printed `***` and listed in a comment at the top (store passwords, `admin.token`, a
//! `scope_principal`'s `hs256_secret`), are filled in.
//! The keys declared in `top`, `policy` and `sections` are printed by the methods
//! generated there, with the printers at the end of this file.

use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, StatusCode, Uri};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

use super::interp;
use super::units::{self, SizeText};
use super::values::Choice;
use super::{Config, ErrorsConfig, StoreConfig, StoreKind, Workers};
use crate::idempotency::pointer::JsonPointer;
use crate::idempotency::source::{KeySource, display_name};
use crate::principal::{BasicPrincipal, JwtKeys, ScopePrincipal};

pub(super) fn to_yaml(config: &Config) -> String {
    let mut root = Mapping::new();
    put(&mut root, "listen", config.listen.to_string());

    let upstream = &config.upstream;
    let mut section = Mapping::new();
    put(&mut section, "url", upstream_url(&upstream.url));
    put(
        &mut section,
        "connect_timeout",
        duration(&upstream.connect_timeout),
    );
    put(&mut section, "timeout", duration(&upstream.timeout));
    put(&mut section, "tls", super::tls::render(&upstream.tls));
    put(&mut root, "upstream", section);

    put(&mut root, "store", store(&config.store));

    put(
        &mut root,
        "idempotency",
        config.idempotency.to_mapping(None),
    );

    let routes: Vec<Value> = config
        .routes
        .iter()
        .map(|route| {
            let mut map = Mapping::new();
            put(&mut map, "path", route.path.as_str());
            map.extend(route.policy.to_mapping(Some(&config.idempotency)));
            Value::Mapping(map)
        })
        .collect();
    put(&mut root, "routes", routes);

    let mut admin = Mapping::new();
    // `null` disables the admin server; omitting the key would re-enable the default.
    let listen = config
        .admin
        .listen
        .map_or(Value::Null, |addr| addr.to_string().into());
    put(&mut admin, "listen", listen);
    // A credential: shown as set, never printed.
    let token = config
        .admin
        .token
        .as_ref()
        .map_or(Value::Null, |_| "***".into());
    put(&mut admin, "token", token);
    put(&mut root, "admin", admin);

    let mut log = Mapping::new();
    put(&mut log, "format", choice(&config.log.format));
    put(&mut log, "level", text(&config.log.level));
    put(&mut root, "log", log);

    put(
        &mut root,
        "shutdown_timeout",
        duration(&config.shutdown_timeout),
    );
    put(&mut root, "route_match", choice(&config.route_match));
    let timeout = duration(&config.listen_header_timeout);
    put(&mut root, "listen_header_timeout", timeout);
    put(&mut root, "max_connections", count(&config.max_connections));
    put(&mut root, "workers", workers(&config.workers));
    put(
        &mut root,
        "max_buffered_bytes",
        size(&config.max_buffered_bytes),
    );
    put(&mut root, "errors", errors(&config.errors));
    put(
        &mut root,
        "escaped_slashes",
        choice(&config.escaped_slashes),
    );
    put(&mut root, "upgrades", strings(&config.upgrades));
    let timeout = duration(&config.listen_idle_timeout);
    put(&mut root, "listen_idle_timeout", timeout);
    let timeout = duration(&config.listen_body_timeout);
    put(&mut root, "listen_body_timeout", timeout);
    let telemetry = super::sections::telemetry::render(&config.telemetry);
    put(&mut root, "telemetry", telemetry);

    let mut root = Value::Mapping(root);
    escape_interpolation(&mut root);
    let yaml = serde_saphyr::to_string(&root)
        .unwrap_or_else(|err| format!("# cannot print the configuration: {err}\n"));
    format!(
        "{}{}{}{yaml}",
        masked_notice(config),
        streaming_notice(config),
        basic_notice(config)
    )
}

/// The comment that says what a Basic principal is made of in each policy that has one
/// (docs/behaviour.md §25): the user name and a hash of the password, or the user name
/// alone where `replay_authorization` checks the password. A route is named when its
/// `scope_principal` differs from `idempotency`'s, as it is printed then.
fn basic_notice(config: &Config) -> String {
    let base = &config.idempotency.scope_principal;
    let sections = std::iter::once(("idempotency".to_owned(), base)).chain(
        config
            .routes
            .iter()
            .enumerate()
            .map(|(i, route)| (format!("routes[{i}]"), &route.policy.scope_principal))
            .filter(|(_, own)| *own != base),
    );
    let mut notice = String::new();
    for (section, source) in sections {
        let Some(ScopePrincipal::Basic(made_of)) = source else {
            continue;
        };
        let (what, why) = match made_of {
            BasicPrincipal::UserAndPassword => (
                "the user name and a SHA-256 of the password",
                "no replay_authorization checks the password before a replay; a new \
                 password is a new scope",
            ),
            BasicPrincipal::UserAlone => (
                "the user name alone",
                "replay_authorization checks the password before any replay",
            ),
        };
        notice.push_str(&format!(
            "# {section}: scope_principal basic: the principal is {what}\n#   ({why}).\n"
        ));
    }
    notice
}

/// The comment that says which policies stream only some bodies
/// (docs/behaviour.md §19): a key source or fingerprint that reads the body's JSON sees
/// buffered bodies only, so there a body over `max_request_body` is still `413`.
fn streaming_notice(config: &Config) -> String {
    let sections = std::iter::once(("idempotency".to_owned(), &config.idempotency)).chain(
        config
            .routes
            .iter()
            .enumerate()
            .map(|(i, route)| (format!("routes[{i}]"), &route.policy)),
    );
    let mut notice = String::new();
    for (section, policy) in sections {
        if let Some(needs_body) = policy.stream_limits() {
            notice.push_str(&format!(
                "# {section}: stream_request_body does not combine with {needs_body}: they \
                 see buffered\n#   bodies only, so there a body over max_request_body is \
                 answered 413 as without streaming.\n"
            ));
        }
    }
    notice
}

/// `store`: the keys every kind reads, and those of the chosen kind only. Loading leaves
/// the keys of other kinds at their defaults, so leaving them out loses nothing, and a
/// file store's configuration does not show Redis URLs it never connects to.
fn store(store: &StoreConfig) -> Mapping {
    let mut map = Mapping::new();
    put(&mut map, "kind", store.kind.name());
    if store.kind == StoreKind::Redis {
        match store.redacted_urls().as_slice() {
            [url] => put(&mut map, "url", url.as_str()),
            urls => put(&mut map, "urls", urls.to_vec()),
        }
        put(&mut map, "cluster", store.cluster);
    }
    put(&mut map, "key_prefix", store.key_prefix.as_str());
    put(&mut map, "timeout", duration(&store.timeout));
    put(&mut map, "on_unavailable", store.on_unavailable.name());
    match store.kind {
        StoreKind::Memory => {
            put(&mut map, "max_entries", store.max_entries as u64);
            per_scope(&mut map, store);
        }
        StoreKind::File => {
            put(&mut map, "max_entries", store.max_entries as u64);
            per_scope(&mut map, store);
            put(&mut map, "path", store.path.to_string_lossy().as_ref());
            put(&mut map, "fsync", store.fsync);
        }
        StoreKind::Redis => {
            put(&mut map, "sentinel", sentinel(store.sentinel.as_ref()));
            put(&mut map, "min_replicas", u64::from(store.min_replicas));
        }
    }
    if !store.encryption.is_empty() {
        put(
            &mut map,
            "encryption",
            super::sections::store::encryption::render(&store.encryption),
        );
    }
    map
}

/// `sentinel:` for `--check`: `null` when unset, passwords as `***`.
fn sentinel(sentinel: Option<&super::SentinelConfig>) -> Value {
    let Some(sentinel) = sentinel else {
        return Value::Null;
    };
    let mut map = Mapping::new();
    map.insert("master_name".into(), sentinel.master_name.as_str().into());
    map.insert("urls".into(), sentinel.redacted_urls().into());
    Value::Mapping(map)
}

/// `store.max_entries_per_scope`, when a quota is set (left out, there is none).
fn per_scope(map: &mut Mapping, store: &StoreConfig) {
    if let Some(n) = store.max_entries_per_scope {
        put(map, "max_entries_per_scope", n as u64);
    }
}

/// The comment that opens the output when it holds `***` in place of a secret: such
/// a file is refused until each is filled in, and the operator should learn why and
/// where before trying to start from it.
fn masked_notice(config: &Config) -> String {
    let store = &config.store;
    let mut keys = Vec::new();
    if config.admin.token.is_some() {
        keys.push("admin.token".to_owned());
    }
    // A route prints `scope_principal` only when it differs from `idempotency`'s.
    let has_secret = |source: &Option<ScopePrincipal>| matches!(source, Some(ScopePrincipal::Jwt(jwt)) if matches!(jwt.keys, JwtKeys::Secret(_)));
    let base = &config.idempotency.scope_principal;
    if has_secret(base) {
        keys.push("idempotency.scope_principal.jwt.hs256_secret".to_owned());
    }
    for (i, route) in config.routes.iter().enumerate() {
        let own = &route.policy.scope_principal;
        if own != base && has_secret(own) {
            keys.push(format!("routes[{i}].scope_principal.jwt.hs256_secret"));
        }
    }
    // The paths of the URLs that hold a secret, as `to_yaml` printed them.
    let with_secrets = |urls: &[String], key: &str| -> Vec<String> {
        urls.iter()
            .enumerate()
            .filter(|(_, url)| super::url_secret(url).is_some())
            .map(|(i, _)| format!("{key}[{i}]"))
            .collect()
    };
    // Only a Redis store's URLs are printed.
    if store.kind == StoreKind::Redis {
        match store.urls.as_slice() {
            [url] if super::url_secret(url).is_some() => keys.push("store.url".to_owned()),
            urls => keys.extend(with_secrets(urls, "store.urls")),
        }
        if let Some(sentinel) = &store.sentinel {
            keys.extend(with_secrets(&sentinel.urls, "store.sentinel.urls"));
        }
    }
    keys.extend(super::sections::store::encryption::masked(
        &store.encryption,
    ));
    keys.extend(super::sections::telemetry::masked(&config.telemetry));
    if keys.is_empty() {
        return String::new();
    }
    let mut notice = "# Secrets are printed as ***, which idemgate refuses as a secret: fill \
                      these in\n# (the value, or ${VAR}) before starting it from this file:\n"
        .to_owned();
    for key in keys {
        notice.push_str(&format!("#   {key}\n"));
    }
    notice
}

fn put(map: &mut Mapping, key: &str, value: impl Into<Value>) {
    map.insert(key.into(), value.into());
}

/// Writes each `${` of a string value as `$${`, which loading reads back as `${`
/// rather than as a variable (keys are not interpolated, nor printed with a `$`).
///
/// Done once over the whole document, so that no printer of a key can forget it.
fn escape_interpolation(value: &mut Value) {
    match value {
        Value::String(text) => {
            if text.contains("${") {
                *text = interp::escape(text);
            }
        }
        Value::Sequence(items) => items.iter_mut().for_each(escape_interpolation),
        Value::Mapping(map) => map.0.iter_mut().for_each(|(_, v)| escape_interpolation(v)),
        Value::Null | Value::Bool(_) | Value::Int(_) | Value::Float(_) => {}
    }
}

// The printers below take the value by reference: the key declarations of `policy`
// call them as `show(&field)` whatever the field's type.

pub(super) fn duration(d: &Duration) -> Value {
    units::format_duration(*d).into()
}

pub(super) fn size(bytes: &u64) -> Value {
    match units::format_size(*bytes) {
        SizeText::WithUnit(text) => text.into(),
        SizeText::Bytes(n) => n.into(),
    }
}

pub(super) fn count(n: &usize) -> Value {
    (*n as u64).into()
}

pub(super) fn workers(workers: &Workers) -> Value {
    match workers {
        Workers::Auto => "auto".into(),
        Workers::Count(n) => (n.get() as u64).into(),
        Workers::Shared => "shared".into(),
    }
}

pub(super) fn errors(errors: &ErrorsConfig) -> Value {
    let mut map = Mapping::new();
    put(&mut map, "format", choice(&errors.format));
    put(&mut map, "template", text(&errors.template));
    put(&mut map, "content_type", header_value(&errors.content_type));
    map.into()
}

pub(super) fn text(value: &str) -> Value {
    value.into()
}

/// `http[s]://host:port` without the `/` that `Uri` adds for an empty path, as written.
pub(super) fn upstream_url(url: &Uri) -> Value {
    let scheme = url.scheme_str().unwrap_or("http");
    let authority = url.authority().map_or("", |a| a.as_str());
    let path = url.path().trim_end_matches('/');
    format!("{scheme}://{authority}{path}").into()
}

pub(super) fn flag(value: &bool) -> Value {
    Value::Bool(*value)
}

pub(super) fn choice<T: Choice>(value: &T) -> Value {
    value.name().into()
}

pub(super) fn methods(list: &[Method]) -> Value {
    list.iter().map(Method::as_str).collect::<Vec<_>>().into()
}

pub(super) fn statuses(list: &[StatusCode]) -> Value {
    list.iter()
        .map(|s| u64::from(s.as_u16()))
        .collect::<Vec<_>>()
        .into()
}

pub(super) fn pointers(list: &[JsonPointer]) -> Value {
    list.iter()
        .map(|p| text(p.as_str()))
        .collect::<Vec<_>>()
        .into()
}

/// `key_from` entries, each a one-key mapping as written.
pub(super) fn key_sources(list: &[KeySource]) -> Value {
    list.iter()
        .map(|source| {
            let (kind, value) = match source {
                KeySource::Header(name) => ("header", header_name(name)),
                KeySource::Query(name) => ("query", text(name)),
                KeySource::Json(pointer) => ("json", text(pointer.as_str())),
                KeySource::Fingerprint(window) => ("fingerprint", duration(window)),
            };
            let mut entry = Mapping::new();
            entry.insert(kind.into(), value);
            Value::Mapping(entry)
        })
        .collect::<Vec<_>>()
        .into()
}

pub(super) fn strings(list: &[String]) -> Value {
    list.iter().map(|s| text(s)).collect::<Vec<_>>().into()
}

/// A header map as YAML, names as given.
pub(super) fn header_pairs(pairs: &[(HeaderName, HeaderValue)]) -> Value {
    let mut map = Mapping::new();
    for (name, value) in pairs {
        map.insert(
            name.as_str().into(),
            text(&String::from_utf8_lossy(value.as_bytes())),
        );
    }
    Value::Mapping(map)
}

pub(super) fn header_value(value: &HeaderValue) -> Value {
    text(&String::from_utf8_lossy(value.as_bytes()))
}

pub(super) fn headers(list: &[HeaderName]) -> Value {
    list.iter()
        .map(HeaderName::as_str)
        .collect::<Vec<_>>()
        .into()
}

/// `idempotency-key` -> `Idempotency-Key`: header names are case-insensitive, and this
/// is how docs/behaviour.md and the IETF draft spell the request header.
pub(super) fn header_name(name: &HeaderName) -> Value {
    display_name(name).into()
}

/// A value as `--check` prints it: YAML's own shapes, mappings in the order their keys
/// were put.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Value {
    Null,
    Bool(bool),
    Int(u64),
    Float(f64),
    String(String),
    Sequence(Vec<Value>),
    Mapping(Mapping),
}

impl Value {
    pub(super) fn is_null(&self) -> bool {
        *self == Value::Null
    }
}

/// A mapping whose keys keep the order they were inserted in.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Mapping(Vec<(String, Value)>);

impl Mapping {
    pub(super) fn new() -> Self {
        Self::default()
    }

    /// Puts `key`, replacing its value if it is there already.
    pub(super) fn insert(&mut self, key: String, value: Value) {
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => self.0.push((key, value)),
        }
    }

    pub(super) fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub(super) fn remove(&mut self, key: &str) {
        self.0.retain(|(k, _)| k != key);
    }

    #[cfg(test)]
    pub(super) fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl IntoIterator for Mapping {
    type Item = (String, Value);
    type IntoIter = std::vec::IntoIter<(String, Value)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl FromIterator<(String, Value)> for Mapping {
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(iter: I) -> Self {
        let mut map = Mapping::new();
        map.extend(iter);
        map
    }
}

impl Extend<(String, Value)> for Mapping {
    fn extend<I: IntoIterator<Item = (String, Value)>>(&mut self, iter: I) {
        for (key, value) in iter {
            self.insert(key, value);
        }
    }
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Null => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(n) => s.serialize_u64(*n),
            Value::Float(x) => s.serialize_f64(*x),
            Value::String(text) => text_as_before(text, s),
            Value::Sequence(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Value::Mapping(map) => {
                let mut out = s.serialize_map(Some(map.0.len()))?;
                for (key, value) in &map.0 {
                    out.serialize_entry(key, value)?;
                }
                out.end()
            }
        }
    }
}

/// A string as `--check` has always printed it: plain where YAML reads it back as the
/// same string, else in single quotes (`'***'`, `'idemgate:'`), and in double quotes
/// only when it holds a character that needs an escape.
pub(super) fn text_as_before<S: Serializer>(text: &str, s: S) -> Result<S::Ok, S::Error> {
    let quoted = serde_saphyr::to_string(&text).is_ok_and(|plain| plain.starts_with('"'));
    let single = serde_saphyr::SingleQuoted(text);
    if quoted && serde_saphyr::to_string(&single).is_ok() {
        single.serialize(s)
    } else {
        s.serialize_str(text)
    }
}

impl From<&str> for Value {
    fn from(text: &str) -> Self {
        Value::String(text.to_owned())
    }
}

impl From<String> for Value {
    fn from(text: String) -> Self {
        Value::String(text)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<u64> for Value {
    fn from(n: u64) -> Self {
        Value::Int(n)
    }
}

impl From<f64> for Value {
    fn from(x: f64) -> Self {
        Value::Float(x)
    }
}

impl From<Mapping> for Value {
    fn from(map: Mapping) -> Self {
        Value::Mapping(map)
    }
}

impl<T: Into<Value>> From<Vec<T>> for Value {
    fn from(items: Vec<T>) -> Self {
        Value::Sequence(items.into_iter().map(Into::into).collect())
    }
}
