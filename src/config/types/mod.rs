//! How values are written in the file. Each key has a form ([`Form`]) that reads it
//! inside its own `Deserialize`, so that an error carries the path `serde_path_to_error`
//! recorded (`routes[1].ttl`) and the parser's line, and prints it back for `--check`.
//! A section's field names its form once, `#[serde(with = "As::<Dur>")]`, for both.
//!
//! `units`: durations, sizes, counts; `http`: addresses, URLs, header names and values,
//! methods, statuses; `secret`: what `--check` prints as `***`.

use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde::ser::{Serialize, Serializer};

use super::interp;

pub(crate) mod http;
pub(crate) mod secret;
pub(crate) mod units;

/// How a key is written: read as `Self` (checked while it is read), it stands for a
/// [`Form::Value`] of the configuration, which [`Form::print`] prints back.
pub(crate) trait Form {
    type Value;
    fn value(self) -> Self::Value;
    fn print<S: Serializer>(value: &Self::Value, s: S) -> Result<S::Ok, S::Error>;
    /// Whether the value is "none", which `--check` leaves out (it is the default, and
    /// `null` is refused).
    fn unset(_: &Self::Value) -> bool {
        false
    }
}

/// `#[serde(with = "As::<F>")]`: a key read and printed as its form `F`; `null` is
/// refused ([`NO_VALUE`]).
pub(crate) struct As<F>(PhantomData<F>);

impl<F: Form> As<F> {
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<F::Value, D::Error>
    where
        F: Deserialize<'de>,
    {
        match Option::<F>::deserialize(d)? {
            Some(form) => Ok(form.value()),
            None => Err(de::Error::custom(NO_VALUE)),
        }
    }

    pub(crate) fn serialize<S: Serializer>(value: &F::Value, s: S) -> Result<S::Ok, S::Error> {
        F::print(value, s)
    }
}

/// [`As`] for a key that is `None` when left out (its default), and never `null`.
pub(crate) struct Opt<F>(PhantomData<F>);

impl<F: Form> Opt<F> {
    pub(crate) fn deserialize<'de, D>(d: D) -> Result<Option<F::Value>, D::Error>
    where
        D: Deserializer<'de>,
        F: Deserialize<'de>,
    {
        As::<F>::deserialize(d).map(Some)
    }
}

/// [`As`] for a section, which `null` leaves at its defaults (as `{}` does).
pub(crate) struct OrDefault<F>(PhantomData<F>);

impl<F: Form> OrDefault<F>
where
    F::Value: Default,
{
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<F::Value, D::Error>
    where
        F: Deserialize<'de>,
    {
        Ok(Option::<F>::deserialize(d)?
            .map(Form::value)
            .unwrap_or_default())
    }

    pub(crate) fn serialize<S: Serializer>(value: &F::Value, s: S) -> Result<S::Ok, S::Error> {
        F::print(value, s)
    }
}

/// A value printed by its form, in a list or a mapping.
pub(crate) struct Shown<'a, F: Form>(pub(crate) &'a F::Value);

impl<F: Form> Serialize for Shown<'_, F> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        F::print(self.0, s)
    }
}

impl<F: Form> Form for Vec<F> {
    type Value = Vec<F::Value>;
    fn value(self) -> Self::Value {
        self.into_iter().map(Form::value).collect()
    }
    fn print<S: Serializer>(value: &Self::Value, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(value.iter().map(Shown::<F>))
    }
}

/// [`Form`] for forms that wrap their value: `Form => Value, print function;`.
macro_rules! forms {
    ($($form:ty => $value:ty, $print:expr;)*) => {$(
        impl $crate::config::types::Form for $form {
            type Value = $value;
            fn value(self) -> $value {
                self.0
            }
            fn print<S: serde::Serializer>(value: &$value, s: S) -> Result<S::Ok, S::Error> {
                $print(value, s)
            }
        }
    )*};
}
pub(crate) use forms;

/// [`Form`] for a section, which derives both `Deserialize` and `Serialize`.
macro_rules! section_forms {
    ($($section:ty),* $(,)?) => {$(
        impl $crate::config::types::Form for $section {
            type Value = $section;
            fn value(self) -> $section {
                self
            }
            fn print<S: serde::Serializer>(value: &$section, s: S) -> Result<S::Ok, S::Error> {
                serde::Serialize::serialize(value, s)
            }
        }
    )*};
}
pub(crate) use section_forms;

/// What `--check` holds of a section until the configuration is built from it, and
/// never after: a built configuration compares and clones without it.
pub(crate) struct Pending<T>(pub(crate) Option<T>);

impl<T> Pending<T> {
    pub(crate) fn take(&mut self) -> Option<T> {
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

/// Any YAML scalar, kept with its type so that a message can say what was found.
/// Interpolated values are always strings, so numeric and boolean keys also accept
/// their text (`max_entries: ${MAX_ENTRIES}`).
pub(crate) enum Scalar {
    Str(String),
    Int(i128),
    Float(f64),
    Bool(bool),
}

impl Scalar {
    /// The value, `${VAR}` interpolated in a string (docs/behaviour.md §6).
    pub(crate) fn read<'de, D: Deserializer<'de>>(
        d: D,
        expecting: &'static str,
    ) -> Result<Scalar, D::Error> {
        match Scalar::read_key(d, expecting)? {
            Scalar::Str(text) => interp::expand(text)
                .map(Scalar::Str)
                .map_err(de::Error::custom),
            other => Ok(other),
        }
    }

    /// The value as written: keys are never interpolated.
    pub(crate) fn read_key<'de, D: Deserializer<'de>>(
        d: D,
        expecting: &'static str,
    ) -> Result<Scalar, D::Error> {
        d.deserialize_any(ScalarVisitor { expecting })
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Scalar::Str(s) => format!("string '{s}'"),
            Scalar::Int(n) => format!("integer {n}"),
            Scalar::Float(x) => format!("number {x}"),
            Scalar::Bool(b) => format!("boolean {b}"),
        }
    }

    /// The string, or an error saying what was expected instead.
    pub(crate) fn into_str<E: de::Error>(self, expecting: &str) -> Result<String, E> {
        match self {
            Scalar::Str(s) => Ok(s),
            other => Err(other.unexpected(expecting)),
        }
    }

    /// A non-negative integer, given as a YAML integer or as a string of digits.
    pub(crate) fn into_u64<E: de::Error>(self, expecting: &str) -> Result<u64, E> {
        let number = match &self {
            Scalar::Int(n) => u64::try_from(*n).ok(),
            Scalar::Str(s) => s.trim().parse::<u64>().ok(),
            Scalar::Float(_) | Scalar::Bool(_) => None,
        };
        number.ok_or_else(|| self.unexpected(expecting))
    }

    pub(crate) fn unexpected<E: de::Error>(&self, expecting: &str) -> E {
        E::custom(format!("expected {expecting}, found {}", self.describe()))
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

/// A key that may be left out but not written `null`, for
/// `#[serde(default, deserialize_with = "given")]` on an `Option`.
pub(crate) fn given<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    match Option::<T>::deserialize(d)? {
        None => Err(de::Error::custom(NO_VALUE)),
        read => Ok(read),
    }
}

/// A closed set of names in the file, mapped to their values.
pub(crate) trait Choice: Copy + PartialEq + 'static {
    const CHOICES: &'static [(&'static str, Self)];

    /// The name printed by `--check`, the one the parser accepts.
    fn name(self) -> &'static str {
        Self::CHOICES
            .iter()
            .find(|(_, value)| *value == self)
            .map_or("?", |(name, _)| name)
    }
}

/// One of `T::CHOICES`, reported as `unknown variant 'x', expected one of a, b`.
pub(crate) struct Pick<T>(T);

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
            other => Err(other.unexpected(&format!("one of {names}"))),
        }
    }
}

impl<T: Choice> Form for Pick<T> {
    type Value = T;
    fn value(self) -> T {
        self.0
    }
    fn print<S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(value.name())
    }
}

/// A plain string value, kept as written (after `${VAR}` interpolation).
pub(crate) struct Text(pub(crate) String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a string";
        Scalar::read(d, EXPECTING)?.into_str(EXPECTING).map(Text)
    }
}

impl From<Text> for String {
    fn from(text: Text) -> String {
        text.0
    }
}

forms! {
    Text => String, text;
}

/// A string as `--check` prints it: each `${` as `$${`, which loading reads back as
/// `${` rather than as a variable; plain where YAML reads it back as the same string,
/// else in single quotes (`'***'`, `'idemgate:'`), and in double quotes only when it
/// holds a character that needs an escape. Every string of the configuration is
/// printed through here, so that no key can forget the escape.
pub(crate) fn text<S: Serializer>(text: &str, s: S) -> Result<S::Ok, S::Error> {
    let text = interp::escape(text);
    let quoted = serde_saphyr::to_string(&text).is_ok_and(|plain| plain.starts_with('"'));
    let single = serde_saphyr::SingleQuoted(text.as_str());
    if quoted && serde_saphyr::to_string(&single).is_ok() {
        single.serialize(s)
    } else {
        s.serialize_str(&text)
    }
}

/// A value printed as its `Display`.
pub(crate) fn shown<T: fmt::Display, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
    text(&value.to_string(), s)
}
