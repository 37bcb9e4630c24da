//! Durations and byte sizes: parsing what operators write, printing what parses back.
//!
//! Both parsers are total: any input yields `Ok` or a message, never a panic, because
//! they run on untrusted text before anything else has looked at it.

use std::time::Duration;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Parses a humantime duration (`250ms`, `10s`, `5m`, `24h`, `7d`, `1h 30m`).
///
/// A bare number is refused rather than read as seconds: `ttl: 86400` and
/// `lease: 10` look alike but nobody can tell from the file which unit was meant.
pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
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
pub(super) fn format_duration(duration: Duration) -> String {
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
pub(super) fn parse_size(text: &str) -> Result<u64, String> {
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
pub(super) fn format_size(bytes: u64) -> SizeText {
    for (size, unit) in [(GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")] {
        if bytes != 0 && bytes.is_multiple_of(size) {
            return SizeText::WithUnit(format!("{}{unit}", bytes / size));
        }
    }
    SizeText::Bytes(bytes)
}

/// A printed size: with a unit it is a YAML string, without one a YAML integer.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum SizeText {
    WithUnit(String),
    Bytes(u64),
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
