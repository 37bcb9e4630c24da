//! Durations, byte sizes, counts and flags: parsing what operators write, printing
//! what parses back.
//!
//! Both parsers are total: any input yields `Ok` or a message, never a panic, because
//! they run on untrusted text before anything else has looked at it.

use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer};
use serde::ser::Serializer;

use super::{Scalar, forms};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Parses a humantime duration (`250ms`, `10s`, `5m`, `24h`, `7d`, `1h 30m`).
///
/// A bare number is refused rather than read as seconds: `ttl: 86400` and
/// `lease: 10` look alike but nobody can tell from the file which unit was meant.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration; write a number with a unit, e.g. 10s".to_owned());
    }
    if text.parse::<f64>().is_ok() {
        return Err(format!(
            "bare number {text} has no unit; write e.g. {text}s or {text}ms"
        ));
    }
    humantime::parse_duration(text).map_err(|err| {
        format!("invalid duration '{text}': {err}; write e.g. 250ms, 10s, 5m, 24h or 7d")
    })
}

/// Prints a duration in the largest unit that keeps it exact, so that `24h` stays
/// `24h` (humantime's own formatter would print `1day`) and the text parses back to
/// the same value.
pub(crate) fn format_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    const UNITS: [(u128, &str); 5] = [
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
    ];
    for (size, unit) in UNITS {
        if nanos != 0 && nanos.is_multiple_of(size) {
            return format!("{}{unit}", nanos / size);
        }
    }
    format!("{nanos}ns")
}

/// Parses a byte size: a bare integer is bytes; `B`, `KiB`/`MiB`/`GiB` (binary) and
/// `KB`/`MB`/`GB` (decimal, `kB` also accepted) multiply it.
///
/// Only whole numbers are accepted: `1.5MiB` is refused with a hint to write
/// `1536KiB`, so that a limit is always an exact byte count the operator can see.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let unit = unit.trim_start();
    if number.is_empty() {
        return Err(format!(
            "invalid size '{text}'; write bytes or a whole number with a unit, e.g. 1MiB"
        ));
    }
    if unit.starts_with('.') {
        return Err(format!(
            "invalid size '{text}': sizes are whole numbers of a unit; write e.g. 1536KiB instead of 1.5MiB"
        ));
    }
    let multiplier = match unit {
        "" | "B" => 1,
        "KiB" => KIB,
        "MiB" => MIB,
        "GiB" => GIB,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => {
            return Err(format!(
                "invalid size '{text}': unknown unit '{unit}'; use B, KiB, MiB, GiB, KB, MB or GB"
            ));
        }
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(|| format!("size '{text}' is too large"))
}

/// Prints a size in the largest binary unit that keeps it exact, else as bare bytes
/// (which the parser reads back as bytes).
pub(crate) fn format_size(bytes: u64) -> SizeText {
    for (size, unit) in [(GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")] {
        if bytes != 0 && bytes.is_multiple_of(size) {
            return SizeText::WithUnit(format!("{}{unit}", bytes / size));
        }
    }
    SizeText::Bytes(bytes)
}

/// A printed size: with a unit it is a YAML string, without one a YAML integer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SizeText {
    WithUnit(String),
    Bytes(u64),
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
pub(crate) struct Dur(pub(crate) Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a duration such as 10s";
        let text = match Scalar::read(d, EXPECTING)? {
            Scalar::Int(n) => format!("{n}"),
            Scalar::Float(x) => format!("{x}"),
            other => other.into_str(EXPECTING)?,
        };
        let duration = parse_duration(&text).map_err(de::Error::custom)?;
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
                format_duration(MAX_DURATION)
            )));
        }
        Ok(Dur(duration))
    }
}

/// `lease`: a [`Dur`] of at least [`MIN_LEASE`].
pub(crate) struct Lease(pub(crate) Duration);

impl<'de> Deserialize<'de> for Lease {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Dur(duration) = Dur::deserialize(d)?;
        if duration < MIN_LEASE {
            return Err(de::Error::custom(format!(
                "lease {} is shorter than {}: it would end before a renewal (every third of it, \
                 over the store) could land, and duplicates would take over requests still \
                 in flight",
                format_duration(duration),
                format_duration(MIN_LEASE)
            )));
        }
        Ok(Lease(duration))
    }
}

/// A byte count of at most [`MAX_SIZE`]: a YAML integer, or a string with an optional
/// unit.
pub(crate) struct Size(pub(crate) u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a size such as 1MiB or a number of bytes";
        let (bytes, shown) = match Scalar::read(d, EXPECTING)? {
            Scalar::Str(text) => {
                let bytes = parse_size(&text).map_err(de::Error::custom)?;
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

pub(crate) struct Count(pub(crate) u64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a non-negative integer";
        Scalar::read(d, EXPECTING)?.into_u64(EXPECTING).map(Count)
    }
}

/// A ratio from 0 to 1 (`telemetry.otlp.sample_ratio`), given as a number or its text.
pub(crate) struct Ratio(pub(crate) f64);

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
            _ => Err(scalar.unexpected(EXPECTING)),
        }
    }
}

/// A count of at least 1 (`max_connections`, `store.max_entries`).
pub(crate) struct AtLeastOne(usize);

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

pub(crate) struct Flag(pub(crate) bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "true or false";
        match Scalar::read(d, EXPECTING)? {
            Scalar::Bool(b) => Ok(Flag(b)),
            Scalar::Str(s) if s.trim() == "true" => Ok(Flag(true)),
            Scalar::Str(s) if s.trim() == "false" => Ok(Flag(false)),
            other => Err(other.unexpected(EXPECTING)),
        }
    }
}

forms! {
    Dur => Duration, duration;
    Lease => Duration, duration;
    Size => u64, size;
    Count => u64, |n: &u64, s: S| s.serialize_u64(*n);
    AtLeastOne => usize, |n: &usize, s: S| s.serialize_u64(*n as u64);
    Ratio => f64, |x: &f64, s: S| s.serialize_f64(*x);
    Flag => bool, |b: &bool, s: S| s.serialize_bool(*b);
}

/// A duration as `--check` prints it: `24h`, `10s`, `500ms`.
pub(crate) fn duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_duration(*d))
}

/// A size as `--check` prints it: `1MiB`, or bare bytes.
fn size<S: Serializer>(bytes: &u64, s: S) -> Result<S::Ok, S::Error> {
    match format_size(*bytes) {
        SizeText::WithUnit(text) => s.serialize_str(&text),
        SizeText::Bytes(n) => s.serialize_u64(n),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn durations_in_every_documented_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration(" 1h 30m "), Ok(Duration::from_secs(5_400)));
    }

    #[test]
    fn durations_without_a_known_unit_are_refused() {
        for text in ["10", "0", "1.5", "", "10q", "s", "-1s"] {
            assert!(parse_duration(text).is_err(), "{text:?} was accepted");
        }
        let message = parse_duration("10").unwrap_err();
        assert!(message.contains("no unit"), "{message}");
        let message = parse_duration("10q").unwrap_err();
        assert!(message.contains("'10q'"), "{message}");
    }

    #[test]
    fn durations_print_in_the_largest_exact_unit() {
        let cases = [
            (Duration::from_secs(86_400), "24h"),
            (Duration::from_secs(7 * 86_400), "168h"),
            (Duration::from_secs(300), "5m"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_micros(1_500), "1500us"),
            (Duration::from_nanos(7), "7ns"),
            (Duration::ZERO, "0ns"),
        ];
        for (duration, text) in cases {
            assert_eq!(format_duration(duration), text);
            assert_eq!(humantime::parse_duration(text), Ok(duration));
        }
    }

    #[test]
    fn sizes_in_binary_and_decimal_units() {
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("12B"), Ok(12));
        assert_eq!(parse_size("1KiB"), Ok(1024));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("4 MiB"), Ok(4 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1KB"), Ok(1_000));
        assert_eq!(parse_size("1kB"), Ok(1_000));
        assert_eq!(parse_size("3MB"), Ok(3_000_000));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
    }

    #[test]
    fn malformed_sizes_are_refused() {
        for text in [
            "1XB",
            "MiB",
            "",
            "-1",
            "1.5MiB",
            "1 mib",
            "99999999999GiB",
            "1MiB2",
        ] {
            assert!(parse_size(text).is_err(), "{text:?} was accepted");
        }
        assert!(parse_size("1.5MiB").unwrap_err().contains("1536KiB"));
    }

    #[test]
    fn sizes_print_in_the_largest_exact_binary_unit() {
        assert_eq!(format_size(1 << 20), SizeText::WithUnit("1MiB".into()));
        assert_eq!(format_size(4 << 20), SizeText::WithUnit("4MiB".into()));
        assert_eq!(format_size(3072), SizeText::WithUnit("3KiB".into()));
        assert_eq!(format_size(1536), SizeText::Bytes(1536));
        assert_eq!(format_size(1_000_000), SizeText::Bytes(1_000_000));
        assert_eq!(format_size(0), SizeText::Bytes(0));
    }

    proptest! {
        #[test]
        fn duration_parser_never_panics(text in ".*") {
            let _ = parse_duration(&text);
        }

        #[test]
        fn duration_parser_never_panics_on_unit_like_text(text in "[0-9 .]{0,25}[a-zµ ]{0,8}[0-9]{0,5}") {
            let _ = parse_duration(&text);
        }

        #[test]
        fn size_parser_never_panics(text in ".*") {
            let _ = parse_size(&text);
        }

        #[test]
        fn size_parser_never_panics_on_unit_like_text(text in "[0-9 .]{0,25}[KMGkiB]{0,4}") {
            let _ = parse_size(&text);
        }

        #[test]
        fn printed_durations_parse_back(nanos in 1u64..u64::MAX / 4) {
            let duration = Duration::from_nanos(nanos);
            prop_assert_eq!(parse_duration(&format_duration(duration)), Ok(duration));
        }

        #[test]
        fn printed_sizes_parse_back(bytes in any::<u64>()) {
            let parsed = match format_size(bytes) {
                SizeText::WithUnit(text) => parse_size(&text),
                SizeText::Bytes(n) => Ok(n),
            };
            prop_assert_eq!(parsed, Ok(bytes));
        }
    }
}
