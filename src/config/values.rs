//! Single values of the file, each parsed inside its own `Deserialize` so that an
//! error carries the path `serde_path_to_error` recorded for it (`routes[1].ttl`).
//!
//! Each type accepts exactly what the file may hold (docs/behaviour.md §6, §8) and says
//! what it found otherwise; `validate` only ever sees well-formed values.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, StatusCode, Uri};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use super::{interp, units};
use crate::idempotency::pointer::JsonPointer;
use crate::idempotency::source::KeySource;

/// A value as deserialized (checked, and still wrapped so that serde recorded its
/// path) and the typed value it stands for in [`Config`](super::Config).
///
/// The key declarations name the raw type of each key; this turns it into the typed
/// one, so a declaration whose two types disagree does not compile.
pub(super) trait Raw {
    type Typed;
    fn typed(self) -> Self::Typed;
}

/// `Raw` for the newtypes of this module, which only wrap their typed value.
macro_rules! raw_newtypes {
    ($($raw:ty => $typed:ty,)*) => {$(
        impl $crate::config::values::Raw for $raw {
            type Typed = $typed;
            fn typed(self) -> $typed {
                self.0
            }
        }
    )*};
}
pub(super) use raw_newtypes;

raw_newtypes! {
    AtLeastOne => usize,
    Addr => SocketAddr,
    Ratio => f64,
    Dur => Duration,
    Lease => Duration,
    Size => u64,
    Flag => bool,
    Header => HeaderName,
    Methods => Vec<Method>,
    Status => StatusCode,
    UpstreamUrl => Uri,
    LogLevel => String,
}

impl<T: Choice> Raw for Pick<T> {
    type Typed = T;
    fn typed(self) -> T {
        self.0
    }
}

impl<R: Raw> Raw for Vec<R> {
    type Typed = Vec<R::Typed>;
    fn typed(self) -> Self::Typed {
        self.into_iter().map(Raw::typed).collect()
    }
}

/// Any YAML scalar, kept with its type so that a message can say what was found.
/// Interpolated values are always strings, so numeric and boolean keys also accept
/// their text (`max_entries: ${MAX_ENTRIES}`).
enum Scalar {
    Str(String),
    Int(i128),
    Float(f64),
    Bool(bool),
}

impl Scalar {
    /// The value, `${VAR}` interpolated in a string (docs/behaviour.md §6).
    fn read<'de, D: Deserializer<'de>>(d: D, expecting: &'static str) -> Result<Scalar, D::Error> {
        match Scalar::read_key(d, expecting)? {
            Scalar::Str(text) => interp::expand(text)
                .map(Scalar::Str)
                .map_err(de::Error::custom),
            other => Ok(other),
        }
    }

    /// The value as written: keys are never interpolated.
    fn read_key<'de, D: Deserializer<'de>>(
        d: D,
        expecting: &'static str,
    ) -> Result<Scalar, D::Error> {
        d.deserialize_any(ScalarVisitor { expecting })
    }

    fn describe(&self) -> String {
        match self {
            Scalar::Str(s) => format!("string '{s}'"),
            Scalar::Int(n) => format!("integer {n}"),
            Scalar::Float(x) => format!("number {x}"),
            Scalar::Bool(b) => format!("boolean {b}"),
        }
    }

    /// The string, or an error saying what was expected instead.
    fn into_str<E: de::Error>(self, expecting: &str) -> Result<String, E> {
        match self {
            Scalar::Str(s) => Ok(s),
            other => Err(E::custom(format!(
                "expected {expecting}, found {}",
                other.describe()
            ))),
        }
    }

    /// A non-negative integer, given as a YAML integer or as a string of digits.
    fn into_u64<E: de::Error>(self, expecting: &str) -> Result<u64, E> {
        let number = match &self {
            Scalar::Int(n) => u64::try_from(*n).ok(),
            Scalar::Str(s) => s.trim().parse::<u64>().ok(),
            Scalar::Float(_) | Scalar::Bool(_) => None,
        };
        number.ok_or_else(|| E::custom(format!("expected {expecting}, found {}", self.describe())))
    }
}

struct ScalarVisitor {
    expecting: &'static str,
}

impl Visitor<'_> for ScalarVisitor {
    type Value = Scalar;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expecting)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
        Ok(Scalar::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar::Int(v.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
        Ok(Scalar::Int(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
        Ok(Scalar::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar::Str(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Scalar, E> {
        Ok(Scalar::Str(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Scalar, E> {
        Err(E::custom(NO_VALUE))
    }
    fn visit_none<E: de::Error>(self) -> Result<Scalar, E> {
        Err(E::custom(NO_VALUE))
    }
}

/// Why a key written without a value (or `null`) is refused: anywhere but where `null`
/// means what it says (an admin listener off, a section left at its defaults), `serde`
/// would read it as absent and quietly apply the default, so `ttl:` left empty would mean
/// 24 hours. A key that is written must have a value.
const NO_VALUE: &str = "has no value (an empty key, or null, is not its default); write a \
                        value, or leave the key out for its default";

/// A key of the file as written, for `#[serde(default, deserialize_with = "given")]`:
/// `None` when it is left out, and when it is written `null` if that means its default
/// ([`Null`]); otherwise `null` is refused ([`NO_VALUE`]).
pub(super) fn given<'de, D: Deserializer<'de>, T: Deserialize<'de> + Null>(
    d: D,
) -> Result<Option<T>, D::Error> {
    match Option::<T>::deserialize(d)? {
        None if !T::MEANS_DEFAULT => Err(de::Error::custom(NO_VALUE)),
        read => Ok(read),
    }
}

/// A key's value read as its form `F`, checked while it is read, for
/// `#[serde(with = "As::<F>")]` on a field of a section; `null` is refused
/// ([`NO_VALUE`]).
pub(super) struct As<F>(std::marker::PhantomData<F>);

impl<F: Raw> As<F> {
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<F::Typed, D::Error>
    where
        F: Deserialize<'de>,
    {
        match Option::<F>::deserialize(d)? {
            Some(form) => Ok(form.typed()),
            None => Err(de::Error::custom(NO_VALUE)),
        }
    }
}

/// [`As`] for a key where `null` means its default: a section (all of whose keys keep
/// their defaults, as under `{}`).
pub(super) struct OrDefault<F>(std::marker::PhantomData<F>);

impl<F: Raw> OrDefault<F>
where
    F::Typed: Default,
{
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<F::Typed, D::Error>
    where
        F: Deserialize<'de>,
    {
        Ok(Option::<F>::deserialize(d)?
            .map(Raw::typed)
            .unwrap_or_default())
    }
}

/// What a section holds as written until the configuration is built from it, and
/// never after: a built configuration compares and clones without it.
pub(crate) struct Pending<T>(pub(super) Option<T>);

impl<T> Pending<T> {
    pub(super) fn take(&mut self) -> Option<T> {
        self.0.take()
    }
}

impl<T> Default for Pending<T> {
    fn default() -> Self {
        Pending(None)
    }
}

impl<T> Clone for Pending<T> {
    fn clone(&self) -> Self {
        Pending(None)
    }
}

impl<T> PartialEq for Pending<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl<T> fmt::Debug for Pending<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Pending")
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Pending<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(d).map(|value| Pending(Some(value)))
    }
}

/// [`As`] for a key that is `None` when left out (its default), and never `null`.
pub(super) struct Opt<F>(std::marker::PhantomData<F>);

impl<F: Raw> Opt<F> {
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<F::Typed>, D::Error>
    where
        F: Deserialize<'de>,
    {
        As::<F>::deserialize(d).map(Some)
    }
}

/// A count of at least 1 (`max_connections`, `store.max_entries`).
pub(super) struct AtLeastOne(usize);

impl<'de> Deserialize<'de> for AtLeastOne {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Count(n) = Count::deserialize(d)?;
        usize::try_from(n)
            .ok()
            .filter(|n| *n >= 1)
            .map(AtLeastOne)
            .ok_or_else(|| de::Error::custom("must be at least 1"))
    }
}

/// A section that derives `Deserialize` itself: its own form.
macro_rules! section_form {
    ($($section:ty),* $(,)?) => {$(
        impl $crate::config::values::Raw for $section {
            type Typed = $section;
            fn typed(self) -> $section {
                self
            }
        }
    )*};
}
pub(super) use section_form;

/// What `null` means for the value of a key: nothing, and it is refused, unless the key
/// is a section (all of whose keys keep their defaults, as under `{}`) or a key whose
/// default is none (no TLS files, no sentinels, no exporter), as `--check` and
/// config/example.yaml write them.
pub(super) trait Null {
    const MEANS_DEFAULT: bool = false;
}

impl<T> Null for Vec<T> {}
impl<T> Null for Pick<T> {}
impl<V> Null for HeaderPairs<V> {}

/// [`Null`] for the raw types, `null` refused or meaning the default.
macro_rules! null {
    (refused: $($refused:ty),*; default: $($default:ty),* $(,)?) => {
        $(impl Null for $refused {})*
        $(impl Null for $default {
            const MEANS_DEFAULT: bool = true;
        })*
    };
}
pub(super) use null;

null! {
    refused: Dur, Lease, Size, Count, Ratio, WorkerCount, Flag, Addr, Header, Methods,
        Status, UpstreamUrl, LogLevel, Text, CookieName, KeyFrom, Pointer,
        ContentType;
    default:
}

/// The longest duration any key takes (docs/behaviour.md §15): ten years as humantime
/// counts them (`10y`, 365.25 days each), printed `87660h`.
///
/// No TTL, lease or timeout needs more, and the proxy adds each of them to
/// `Instant::now()`, which panics on overflow: `lease: 18446744073709551615s` used to
/// load and then kill every request task that computed its deadline.
const MAX_DURATION: Duration = Duration::from_secs(10 * 31_557_600);

/// The largest size any key takes (docs/behaviour.md §15), 1 TiB (`1024GiB`): far above
/// any body worth buffering, and far enough below `u64::MAX` that sums of sizes cannot
/// overflow.
const MAX_SIZE: u64 = 1 << 40;

/// The shortest duration any key takes. Redis counts TTLs in whole milliseconds
/// (`PX`) and the proxy's timers tick in them, so a shorter one (`500us`) would be
/// stored or waited for as zero: an expired record, or a timeout that fires at once.
const MIN_DURATION: Duration = Duration::from_millis(1);

/// The shortest `lease`. A lease is renewed every third of it, over the store, while
/// the upstream works; a shorter one (`1ns` used to load) ends before a renewal can
/// land, so a duplicate would take over a request still in flight and forward it again.
const MIN_LEASE: Duration = Duration::from_millis(100);

/// A duration of at least [`MIN_DURATION`] and at most [`MAX_DURATION`]: every duration
/// in the file is a TTL, a lease or a timeout, and zero would make each of them
/// meaningless.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dur(pub(super) Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a duration such as 10s";
        let text = match Scalar::read(d, EXPECTING)? {
            Scalar::Int(n) => format!("{n}"),
            Scalar::Float(x) => format!("{x}"),
            other => other.into_str(EXPECTING)?,
        };
        let duration = units::parse_duration(&text).map_err(de::Error::custom)?;
        if duration.is_zero() {
            return Err(de::Error::custom("must be greater than zero"));
        }
        if duration < MIN_DURATION {
            return Err(de::Error::custom(format!(
                "duration '{}' is less than 1ms, and would be counted as 0 ms; \
                 write at least 1ms",
                text.trim()
            )));
        }
        if duration > MAX_DURATION {
            return Err(de::Error::custom(format!(
                "duration '{}' is more than 10 years ({}), the longest any key takes",
                text.trim(),
                units::format_duration(MAX_DURATION)
            )));
        }
        Ok(Dur(duration))
    }
}

/// `lease`: a [`Dur`] of at least [`MIN_LEASE`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Lease(pub(super) Duration);

impl<'de> Deserialize<'de> for Lease {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Dur(duration) = Dur::deserialize(d)?;
        if duration < MIN_LEASE {
            return Err(de::Error::custom(format!(
                "lease {} is shorter than {}: it would end before a renewal (every third of it, \
                 over the store) could land, and duplicates would take over requests still \
                 in flight",
                units::format_duration(duration),
                units::format_duration(MIN_LEASE)
            )));
        }
        Ok(Lease(duration))
    }
}

/// A byte count of at most [`MAX_SIZE`]: a YAML integer, or a string with an optional
/// unit.
#[derive(Debug, Clone, Copy)]
pub(super) struct Size(pub(super) u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a size such as 1MiB or a number of bytes";
        let (bytes, shown) = match Scalar::read(d, EXPECTING)? {
            Scalar::Str(text) => {
                let bytes = units::parse_size(&text).map_err(de::Error::custom)?;
                (bytes, format!("'{}'", text.trim()))
            }
            other => {
                let bytes = other.into_u64(EXPECTING)?;
                (bytes, bytes.to_string())
            }
        };
        if bytes > MAX_SIZE {
            return Err(de::Error::custom(format!(
                "size {shown} is more than 1 TiB (1024GiB), the largest any key takes"
            )));
        }
        Ok(Size(bytes))
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Count(pub(super) u64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a non-negative integer";
        Scalar::read(d, EXPECTING)?.into_u64(EXPECTING).map(Count)
    }
}

/// A ratio from 0 to 1 (`telemetry.otlp.sample_ratio`), given as a number or its text.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ratio(pub(super) f64);

impl<'de> Deserialize<'de> for Ratio {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a number from 0 to 1";
        let scalar = Scalar::read(d, EXPECTING)?;
        let ratio = match &scalar {
            Scalar::Float(x) => Some(*x),
            Scalar::Int(n) => Some(*n as f64),
            Scalar::Str(s) => s.trim().parse::<f64>().ok(),
            Scalar::Bool(_) => None,
        };
        match ratio {
            Some(x) if (0.0..=1.0).contains(&x) => Ok(Ratio(x)),
            _ => Err(de::Error::custom(format!(
                "expected {EXPECTING}, found {}",
                scalar.describe()
            ))),
        }
    }
}

/// `workers`: `auto` (one per CPU), `shared`, or a count.
#[derive(Debug, Clone, Copy)]
pub(super) enum WorkerCount {
    Auto,
    Shared,
    Count(u64),
}

impl<'de> Deserialize<'de> for WorkerCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "auto, shared or a number of workers";
        match Scalar::read(d, EXPECTING)? {
            Scalar::Str(text) if text.trim() == "auto" => Ok(WorkerCount::Auto),
            Scalar::Str(text) if text.trim() == "shared" => Ok(WorkerCount::Shared),
            other => other.into_u64(EXPECTING).map(WorkerCount::Count),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Flag(pub(super) bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "true or false";
        match Scalar::read(d, EXPECTING)? {
            Scalar::Bool(b) => Ok(Flag(b)),
            Scalar::Str(s) if s.trim() == "true" => Ok(Flag(true)),
            Scalar::Str(s) if s.trim() == "false" => Ok(Flag(false)),
            other => Err(de::Error::custom(format!(
                "expected {EXPECTING}, found {}",
                other.describe()
            ))),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Addr(pub(super) SocketAddr);

impl<'de> Deserialize<'de> for Addr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "an address such as 127.0.0.1:8080";
        let text = Scalar::read(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        text.trim().parse().map(Addr).map_err(|_| {
            de::Error::custom(format!(
                "invalid address '{text}'; expected IP:PORT such as 127.0.0.1:8080 or [::]:8080 \
                 (host names are not resolved)"
            ))
        })
    }
}

#[derive(Debug, Clone)]
pub(super) struct Header(pub(super) HeaderName);

impl<'de> Deserialize<'de> for Header {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "an HTTP header name";
        let text = Scalar::read(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        HeaderName::from_bytes(text.trim().as_bytes())
            .map(Header)
            .map_err(|_| de::Error::custom(format!("invalid HTTP header name '{text}'")))
    }
}

/// A header name as a key of a mapping, which is never interpolated.
struct HeaderKey(HeaderName);

impl<'de> Deserialize<'de> for HeaderKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "an HTTP header name";
        let text = Scalar::read_key(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        HeaderName::from_bytes(text.trim().as_bytes())
            .map(HeaderKey)
            .map_err(|_| de::Error::custom(format!("invalid HTTP header name '{text}'")))
    }
}

/// A non-empty method list: an empty one would guard nothing, which `enabled: false`
/// already says explicitly.
#[derive(Debug, Clone)]
pub(super) struct Methods(pub(super) Vec<Method>);

impl<'de> Deserialize<'de> for Methods {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let methods = Vec::<MethodName>::deserialize(d)?;
        if methods.is_empty() {
            return Err(de::Error::custom(
                "must not be empty (use enabled: false on a route to turn guarding off)",
            ));
        }
        Ok(Methods(methods.into_iter().map(|m| m.0).collect()))
    }
}

struct MethodName(Method);

impl<'de> Deserialize<'de> for MethodName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "an HTTP method name";
        let text = Scalar::read(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        Method::from_bytes(text.trim().to_ascii_uppercase().as_bytes())
            .map(MethodName)
            .map_err(|_| de::Error::custom(format!("invalid HTTP method '{text}'")))
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Status(pub(super) StatusCode);

impl<'de> Deserialize<'de> for Status {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "an HTTP status code from 100 to 599";
        let code = Scalar::read(d, EXPECTING)?.into_u64::<D::Error>(EXPECTING)?;
        u16::try_from(code)
            .ok()
            .filter(|code| (100..=599).contains(code))
            .and_then(|code| StatusCode::from_u16(code).ok())
            .map(Status)
            .ok_or_else(|| de::Error::custom(format!("expected {EXPECTING}, found {code}")))
    }
}

#[derive(Debug, Clone)]
pub(super) struct UpstreamUrl(pub(super) Uri);

impl<'de> Deserialize<'de> for UpstreamUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a URL such as http://127.0.0.1:9000";
        let text = Scalar::read(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        parse_upstream_url(&text)
            .map(UpstreamUrl)
            .map_err(de::Error::custom)
    }
}

/// Parses `http[s]://host[:port][/base]`, refusing what the proxy cannot honour.
pub(super) fn parse_upstream_url(text: &str) -> Result<Uri, String> {
    let text = text.trim();
    let uri: Uri = text
        .parse()
        .map_err(|err| format!("invalid URL '{text}': {err}; expected http://host:port"))?;
    let scheme = match uri.scheme_str() {
        Some(scheme) if scheme.eq_ignore_ascii_case("http") => "http",
        Some(scheme) if scheme.eq_ignore_ascii_case("https") => "https",
        Some(scheme) => {
            return Err(format!(
                "unsupported scheme '{scheme}' in '{text}'; expected http://host:port"
            ));
        }
        None => {
            return Err(format!(
                "'{text}' is not an absolute URL; expected http://host:port"
            ));
        }
    };
    let Some(authority) = uri.authority() else {
        return Err(format!("'{text}' has no host; expected http://host:port"));
    };
    if authority.as_str().contains('@') {
        return Err("credentials in the upstream URL are not supported".to_owned());
    }
    if authority.host().is_empty() {
        return Err(format!("'{text}' has no host; expected http://host:port"));
    }
    if authority.port().is_some() && !matches!(authority.port_u16(), Some(1..)) {
        return Err(format!("'{text}' has an invalid port; expected 1 to 65535"));
    }
    if uri.query().is_some() {
        return Err(format!(
            "'{text}' has a query string; the upstream URL takes none"
        ));
    }
    let base = uri.path().trim_end_matches('/');
    let path = if base.is_empty() { "/" } else { base };
    Uri::builder()
        .scheme(scheme)
        .authority(authority.as_str())
        .path_and_query(path)
        .build()
        .map_err(|err| format!("invalid URL '{text}': {err}"))
}

/// A `log.level`: a level, or an `EnvFilter`-style list of `target=level` directives.
#[derive(Debug, Clone)]
pub(super) struct LogLevel(pub(super) String);

const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

impl<'de> Deserialize<'de> for LogLevel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a log level such as info";
        let text = Scalar::read(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        parse_log_level(&text)
            .map(LogLevel)
            .map_err(de::Error::custom)
    }
}

/// Accepts `info` (any case, stored lower-case) or `EnvFilter`-style directives such
/// as `info,idemgate=debug,hyper=warn`, where every bare word is a level and every
/// `target=` names one; span filters (`[...]`) are not accepted.
fn parse_log_level(text: &str) -> Result<String, String> {
    let text = text.trim();
    let lower = text.to_ascii_lowercase();
    if LEVELS.contains(&lower.as_str()) {
        return Ok(lower);
    }
    let is_level = |s: &str| LEVELS.contains(&s.to_ascii_lowercase().as_str());
    let is_target = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '-'))
    };
    let valid = !text.is_empty()
        && text
            .split(',')
            .all(|directive| match directive.trim().split_once('=') {
                Some((target, level)) => is_target(target.trim()) && is_level(level.trim()),
                // A bare word must be a level: EnvFilter would read `verbose` as a target
                // at trace level, but here it is far more likely a misspelt level.
                None => is_level(directive.trim()),
            });
    if valid {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "invalid log level '{text}'; expected one of trace, debug, info, warn, error \
             or directives such as info,idemgate=debug"
        ))
    }
}

/// A closed set of names in the file, mapped to their typed values.
pub(super) trait Choice: Copy + PartialEq + 'static {
    const CHOICES: &'static [(&'static str, Self)];

    /// The name printed by `to_yaml`, the one the parser accepts.
    fn name(self) -> &'static str {
        Self::CHOICES
            .iter()
            .find(|(_, value)| *value == self)
            .map_or("?", |(name, _)| name)
    }
}

/// One of `T::CHOICES`, reported as `unknown variant 'x', expected one of a, b`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pick<T>(pub(super) T);

impl<'de, T: Choice> Deserialize<'de> for Pick<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let names = T::CHOICES
            .iter()
            .map(|(name, _)| *name)
            .collect::<Vec<_>>()
            .join(", ");
        match Scalar::read(d, "one of the listed names")? {
            Scalar::Str(text) => T::CHOICES
                .iter()
                .find(|(name, _)| *name == text.trim())
                .map(|(_, value)| Pick(*value))
                .ok_or_else(|| {
                    de::Error::custom(format!("unknown variant '{text}', expected one of {names}"))
                }),
            other => Err(de::Error::custom(format!(
                "expected one of {names}, found {}",
                other.describe()
            ))),
        }
    }
}

/// A plain string value, kept as written (after `${VAR}` interpolation).
#[derive(Debug, Clone)]
pub(super) struct Text(pub(super) String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a string";
        Scalar::read(d, EXPECTING)?.into_str(EXPECTING).map(Text)
    }
}

/// A cookie name (an RFC 6265 token), for `scope_cookies`.
#[derive(Debug, Clone)]
pub(super) struct CookieName(pub(super) String);

impl<'de> Deserialize<'de> for CookieName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a cookie name";
        let name = Scalar::read(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        // An RFC 9110 token: visible ASCII but separators.
        let token = |b: u8| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b);
        if name.is_empty() || !name.bytes().all(token) {
            return Err(de::Error::custom(format!(
                "'{name}' is not a cookie name (letters, digits and !#$%&'*+-.^_`|~)"
            )));
        }
        Ok(CookieName(name))
    }
}

/// `key_from` (docs/behaviour.md §9): a non-empty list of sources, `fingerprint` only as
/// the last.
#[derive(Debug, Clone)]
pub(super) struct KeyFrom(pub(super) Vec<KeySource>);

impl<'de> Deserialize<'de> for KeyFrom {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let sources: Vec<KeySource> = Vec::<Source>::deserialize(d)?
            .into_iter()
            .map(|source| source.0)
            .collect();
        if sources.is_empty() {
            return Err(de::Error::custom(
                "must not be empty; list where the key comes from, \
                 e.g. [{header: Idempotency-Key}]",
            ));
        }
        let last = sources.len() - 1;
        if let Some(at) = sources
            .iter()
            .position(|source| matches!(source, KeySource::Fingerprint(_)))
            .filter(|at| *at < last)
        {
            return Err(de::Error::custom(format!(
                "fingerprint (entry {at}) must be the last source: it is always present, \
                 so no source after it would ever be tried"
            )));
        }
        Ok(KeyFrom(sources))
    }
}

/// One `key_from` entry: a mapping with exactly one of its four keys.
struct Source(KeySource);

const SOURCE_KINDS: &[&str] = &["header", "query", "json", "fingerprint"];

impl<'de> Deserialize<'de> for Source {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(SourceVisitor)
    }
}

struct SourceVisitor;

impl<'de> Visitor<'de> for SourceVisitor {
    type Value = Source;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a mapping with one of header, query, json, fingerprint, \
             such as {header: X-Request-Id}",
        )
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Source, A::Error> {
        let Some(kind) = map.next_key::<String>()? else {
            return Err(de::Error::custom(
                "is empty; each entry has exactly one of header, query, json, fingerprint",
            ));
        };
        let source = match kind.as_str() {
            "header" => KeySource::Header(map.next_value::<Header>()?.0),
            "query" => KeySource::Query(map.next_value::<QueryName>()?.0),
            "json" => KeySource::Json(map.next_value::<Pointer>()?.0),
            "fingerprint" => KeySource::Fingerprint(map.next_value::<Dur>()?.0),
            other => return Err(de::Error::unknown_field(other, SOURCE_KINDS)),
        };
        if let Some(extra) = map.next_key::<String>()? {
            return Err(de::Error::custom(format!(
                "has both {kind} and {extra}; each entry has exactly one of header, query, \
                 json, fingerprint"
            )));
        }
        Ok(Source(source))
    }
}

/// A query parameter name, compared with each parameter's decoded name.
struct QueryName(String);

impl<'de> Deserialize<'de> for QueryName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a query parameter name such as request_id";
        let name = Scalar::read(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        if name.is_empty() {
            return Err(de::Error::custom(
                "must not be empty; expected a query parameter name such as request_id",
            ));
        }
        Ok(QueryName(name))
    }
}

/// A map of header name to value (`replay_error_headers`, `telemetry.otlp.headers`), in
/// file order, each value read as `V` (a [`Text`], or a secret that refuses the mask).
#[derive(Debug, Clone)]
pub(super) struct HeaderPairs<V = Text>(
    pub(super) Vec<(HeaderName, HeaderValue)>,
    std::marker::PhantomData<V>,
);

impl<'de, V: Deserialize<'de> + Into<String>> Deserialize<'de> for HeaderPairs<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PairsVisitor<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de> + Into<String>> Visitor<'de> for PairsVisitor<V> {
            type Value = HeaderPairs<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping of header name to value")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut pairs = Vec::new();
                while let Some((name, value)) = map.next_entry::<HeaderKey, V>()? {
                    let value: String = value.into();
                    let value = HeaderValue::from_str(&value).map_err(|_| {
                        de::Error::custom(format!(
                            "'{value}' is not a valid value for header {}",
                            name.0.as_str()
                        ))
                    })?;
                    pairs.push((name.0, value));
                }
                Ok(HeaderPairs(pairs, std::marker::PhantomData))
            }
        }
        d.deserialize_map(PairsVisitor(std::marker::PhantomData))
    }
}

impl<V> Raw for HeaderPairs<V> {
    type Typed = Vec<(HeaderName, HeaderValue)>;
    fn typed(self) -> Self::Typed {
        self.0
    }
}

impl From<Text> for String {
    fn from(text: Text) -> String {
        text.0
    }
}

/// A JSON Pointer of `fingerprint_ignore`: `""` or `/...` with valid `~0`/`~1`.
#[derive(Debug, Clone)]
pub(super) struct Pointer(pub(super) JsonPointer);

impl<'de> Deserialize<'de> for Pointer {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a JSON Pointer such as /timestamp";
        let text = Scalar::read(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        JsonPointer::parse(&text)
            .map(Pointer)
            .map_err(de::Error::custom)
    }
}

/// A `Content-Type` value.
#[derive(Debug, Clone)]
pub(super) struct ContentType(pub(super) HeaderValue);

impl<'de> Deserialize<'de> for ContentType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a media type such as application/json";
        let text = Scalar::read(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        match HeaderValue::from_str(&text) {
            Ok(value) if text.contains('/') => Ok(ContentType(value)),
            _ => Err(de::Error::custom(format!(
                "'{text}' is not a media type; expected e.g. application/json"
            ))),
        }
    }
}

raw_newtypes! {
    Text => String,
    CookieName => String,
    ContentType => HeaderValue,
    Pointer => JsonPointer,
    KeyFrom => Vec<KeySource>,
}
