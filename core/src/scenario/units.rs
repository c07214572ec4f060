//! Units written in scenario files: durations, rates and sizes, parsed exactly from decimal text.
//!
//! | kind | units | examples |
//! |---|---|---|
//! | duration | `ns`, `us` (`µs`), `ms`, `s`, `min` (`m`), `h`, `d`; terms may be chained | `"250ms"`, `"22.8s"`, `"38min"`, `"1.5h"`, `"1h30min"`, `"2d"`; a TOML number is seconds |
//! | rate (bits/s) | `bit/s` (`bps`, `b/s`), `kbit/s`, `Mbit/s`, `Gbit/s`, `Tbit/s` (also `Mbps`, `Mb/s`, ...), `Kibit/s`, `Mibit/s`, `Gibit/s` | `"500Mbit/s"`, `"4Gbit/s"`, `"10Gbps"` |
//! | rate (bytes/s) | `B/s` (`Bps`), `kB/s`, `MB/s`, `GB/s`, `TB/s` (also `MBps`, ...), `KiB/s`, `MiB/s`, `GiB/s` | `"1.5GB/s"`, `"100MB/s"` |
//! | size (bytes) | `B`, `kB`, `MB`, `GB`, `TB`, `KiB`, `MiB`, `GiB`, `TiB`; a TOML integer is bytes | `"4MiB"`, `"1GB"` |
//!
//! Decimal prefixes are powers of 1000, binary ones (`Ki`, `Mi`, ...) powers of 1024. A lower-case
//! `b` is a bit and an upper-case `B` a byte. A rate has no bare-number form (bits or bytes would
//! be a guess).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// A data rate, in bits per second: finite and positive.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd, Serialize, Deserialize)]
pub struct Rate(f64);

impl Rate {
    /// A rate of `bps` bits per second, or `None` unless it is finite and positive.
    pub fn from_bits_per_sec(bps: f64) -> Option<Rate> {
        (bps.is_finite() && bps > 0.0).then_some(Rate(bps))
    }

    /// Bits per second.
    pub fn bits_per_sec(self) -> f64 {
        self.0
    }

    /// Bytes per second.
    pub fn bytes_per_sec(self) -> f64 {
        self.0 / 8.0
    }

    /// How long `bytes` take at this rate.
    pub fn transfer_time(self, bytes: u64) -> Duration {
        Duration::try_from_secs_f64(bytes as f64 * 8.0 / self.0).unwrap_or(Duration::MAX)
    }
}

impl fmt::Display for Rate {
    /// In the largest decimal bit unit that keeps the number at least 1, e.g. `1.5Gbit/s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (v, unit) = [(1e12, "Tbit/s"), (1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")]
            .into_iter()
            .find(|(m, _)| self.0 >= *m)
            .map_or((self.0, "bit/s"), |(m, u)| (self.0 / m, u));
        write!(f, "{}{unit}", trim_float(v))
    }
}

/// A number with at most three decimals, without trailing zeros.
fn trim_float(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_owned()
}

/// A duration written the way a scenario file would: `22.8s`, `38min`, `2h`, `1h30min`, `250ms`.
/// Whole seconds from a minute up are written in days, hours, minutes and seconds.
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    const SEC: u128 = 1_000_000_000;
    if ns == 0 {
        return "0s".to_owned();
    }
    if ns.is_multiple_of(SEC) && ns >= 60 * SEC {
        let mut secs = ns / SEC;
        let mut out = String::new();
        for (unit, size) in [("d", 86_400), ("h", 3_600), ("min", 60), ("s", 1)] {
            if secs >= size {
                out.push_str(&format!("{}{unit}", secs / size));
                secs %= size;
            }
        }
        out
    } else if ns >= SEC {
        format!("{}s", trim_float(d.as_secs_f64()))
    } else if ns >= 1_000_000 {
        format!("{}ms", trim_float(ns as f64 / 1e6))
    } else if ns >= 1_000 {
        format!("{}us", trim_float(ns as f64 / 1e3))
    } else {
        format!("{ns}ns")
    }
}

/// Why a unit string did not parse (scenario validation adds what was expected and where).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// No number, an unknown unit, or trailing text.
    #[error("not a number followed by a known unit")]
    Syntax,
    /// A negative value.
    #[error("negative")]
    Negative,
    /// Zero where a positive value is needed (rates).
    #[error("zero")]
    Zero,
    /// Too large to represent.
    #[error("too large")]
    Overflow,
}

/// A non-negative decimal number `digits * 10^-scale`, kept exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Decimal {
    digits: u128,
    scale: u32,
}

impl Decimal {
    /// `self * mult`, rounded to the nearest integer; `None` on overflow.
    fn times(self, mult: u128) -> Option<u128> {
        let p = self.digits.checked_mul(mult)?;
        let div = 10u128.checked_pow(self.scale)?;
        Some(p.checked_add(div / 2)? / div)
    }

    fn to_f64(self) -> f64 {
        self.digits as f64 / 10f64.powi(self.scale as i32)
    }
}

/// Reads a decimal number at the start of `s` (digits, an optional fraction and an optional
/// exponent), returning it and the rest of `s`.
fn number(s: &str) -> Result<(Decimal, &str), UnitError> {
    let b = s.as_bytes();
    if b.first() == Some(&b'-') {
        return Err(UnitError::Negative);
    }
    let mut i = usize::from(b.first() == Some(&b'+'));
    let mut digits: u128 = 0;
    let mut scale: i64 = 0;
    let mut seen_digit = false;
    let mut seen_dot = false;
    while i < b.len() {
        match b[i] {
            c @ b'0'..=b'9' => {
                seen_digit = true;
                // Beyond 36 significant digits, ignore the rest of the precision.
                if digits < 10u128.pow(36) {
                    digits = digits * 10 + u128::from(c - b'0');
                    if seen_dot {
                        scale += 1;
                    }
                } else if !seen_dot {
                    scale -= 1;
                }
            }
            b'.' if !seen_dot => seen_dot = true,
            b'_' if seen_digit => {}
            _ => break,
        }
        i += 1;
    }
    if !seen_digit {
        return Err(UnitError::Syntax);
    }
    // An exponent: e/E, an optional sign, digits (only if digits follow, so units never clash).
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        let mut j = i + 1;
        let neg = b.get(j) == Some(&b'-');
        if matches!(b.get(j), Some(b'-' | b'+')) {
            j += 1;
        }
        let start = j;
        let mut exp: i64 = 0;
        while j < b.len() && b[j].is_ascii_digit() {
            exp = (exp * 10 + i64::from(b[j] - b'0')).min(1000);
            j += 1;
        }
        if j > start {
            scale += if neg { exp } else { -exp };
            i = j;
        }
    }
    while scale < 0 {
        digits = digits.checked_mul(10).ok_or(UnitError::Overflow)?;
        scale += 1;
    }
    // Drop precision that no unit can use (below 1e-30 of the number's unit).
    while scale > 30 {
        digits /= 10;
        scale -= 1;
    }
    let scale = u32::try_from(scale).map_err(|_| UnitError::Overflow)?;
    Ok((Decimal { digits, scale }, &s[i..]))
}

const NS_PER_SEC: u128 = 1_000_000_000;

fn duration_unit(u: &str) -> Option<u128> {
    Some(match u {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" | "sec" => NS_PER_SEC,
        "m" | "min" => 60 * NS_PER_SEC,
        "h" => 3_600 * NS_PER_SEC,
        "d" => 86_400 * NS_PER_SEC,
        _ => return None,
    })
}

/// Parses a duration: one or more `<number><unit>` terms, e.g. `"22.8s"`, `"1h30min"`, `"2 d"`.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(UnitError::Syntax);
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let (n, after) = number(rest)?;
        let after = after.trim_start();
        let end = after.find(|c: char| !c.is_alphabetic()).unwrap_or(after.len());
        let mult = duration_unit(&after[..end]).ok_or(UnitError::Syntax)?;
        total = total
            .checked_add(n.times(mult).ok_or(UnitError::Overflow)?)
            .ok_or(UnitError::Overflow)?;
        rest = after[end..].trim_start();
    }
    duration_from_nanos(total)
}

/// A duration of `secs` seconds (a TOML number); exact for the decimal the float prints as.
pub fn duration_from_secs_f64(secs: f64) -> Result<Duration, UnitError> {
    if secs.is_nan() || secs.is_infinite() {
        return Err(UnitError::Syntax);
    }
    if secs < 0.0 {
        return Err(UnitError::Negative);
    }
    // The shortest decimal that reads back as `secs` (Rust's `Display`) is what the user wrote.
    let text = format!("{secs}");
    let (n, rest) = number(&text)?;
    if !rest.is_empty() {
        return Err(UnitError::Syntax);
    }
    duration_from_nanos(n.times(NS_PER_SEC).ok_or(UnitError::Overflow)?)
}

fn duration_from_nanos(ns: u128) -> Result<Duration, UnitError> {
    let secs = u64::try_from(ns / NS_PER_SEC).map_err(|_| UnitError::Overflow)?;
    // The remainder is below 1e9 and fits a u32.
    let nanos = u32::try_from(ns % NS_PER_SEC).map_err(|_| UnitError::Overflow)?;
    Ok(Duration::new(secs, nanos))
}

fn rate_unit(u: &str) -> Option<f64> {
    let (prefix, base) =
        if let Some(p) = ["bit/s", "bits/s", "bps", "b/s"].iter().find_map(|s| u.strip_suffix(s)) {
            (p, 1.0)
        } else if let Some(p) = ["B/s", "Bps"].iter().find_map(|s| u.strip_suffix(s)) {
            (p, 8.0)
        } else {
            return None;
        };
    let mult = match prefix {
        "" => 1.0,
        "k" | "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        _ => return None,
    };
    Some(base * mult)
}

/// Parses a rate such as `"500Mbit/s"`, `"10Gbps"` or `"1.5GB/s"` into a positive [`Rate`].
pub fn parse_rate(s: &str) -> Result<Rate, UnitError> {
    let (n, unit) = number(s.trim())?;
    let mult = rate_unit(unit.trim()).ok_or(UnitError::Syntax)?;
    let bps = n.to_f64() * mult;
    if bps == 0.0 {
        return Err(UnitError::Zero);
    }
    Rate::from_bits_per_sec(bps).ok_or(UnitError::Overflow)
}

fn size_unit(u: &str) -> Option<u128> {
    Some(match u {
        "B" => 1,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return None,
    })
}

/// Parses a size such as `"4MiB"` or `"1GB"` into bytes (rounded to the nearest byte).
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let (n, unit) = number(s.trim())?;
    let mult = size_unit(unit.trim()).ok_or(UnitError::Syntax)?;
    u64::try_from(n.times(mult).ok_or(UnitError::Overflow)?).map_err(|_| UnitError::Overflow)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn d(s: &str) -> Duration {
        parse_duration(s).unwrap()
    }

    #[test]
    fn durations() {
        assert_eq!(d("250ms"), Duration::from_millis(250));
        assert_eq!(d("2s"), Duration::from_secs(2));
        assert_eq!(d("22.8s"), Duration::from_millis(22_800));
        assert_eq!(d("38min"), Duration::from_secs(38 * 60));
        assert_eq!(d("38m"), Duration::from_secs(38 * 60));
        assert_eq!(d("1.5h"), Duration::from_secs(5_400));
        assert_eq!(d("2d"), Duration::from_secs(172_800));
        assert_eq!(d("1h30min"), Duration::from_secs(5_400));
        assert_eq!(d("1h 30min 15s"), Duration::from_secs(5_415));
        assert_eq!(d(" 5 s "), Duration::from_secs(5));
        assert_eq!(d("10us"), Duration::from_micros(10));
        assert_eq!(d("10µs"), Duration::from_micros(10));
        assert_eq!(d("7ns"), Duration::from_nanos(7));
        assert_eq!(d("0s"), Duration::ZERO);
        assert_eq!(d("1e3ms"), Duration::from_secs(1));
        assert_eq!(d("0.1s"), Duration::from_millis(100));
        assert_eq!(d(".5s"), Duration::from_millis(500));
        assert_eq!(d("1_000ms"), Duration::from_secs(1));
        // Below a nanosecond rounds to the nearest.
        assert_eq!(d("1.6ns"), Duration::from_nanos(2));
    }

    #[test]
    fn duration_errors() {
        for bad in ["", "s", "2", "2 parsecs", "2sx", "fast", "2s3", "inf s", "NaN", "1..2s"] {
            assert_eq!(parse_duration(bad), Err(UnitError::Syntax), "{bad:?}");
        }
        assert_eq!(parse_duration("-1s"), Err(UnitError::Negative));
        assert_eq!(parse_duration("1e30d"), Err(UnitError::Overflow));
        assert_eq!(parse_duration("99999999999999999999999d"), Err(UnitError::Overflow));
    }

    #[test]
    fn durations_from_numbers() {
        assert_eq!(duration_from_secs_f64(22.8), Ok(Duration::from_millis(22_800)));
        assert_eq!(duration_from_secs_f64(0.1), Ok(Duration::from_millis(100)));
        assert_eq!(duration_from_secs_f64(3.0), Ok(Duration::from_secs(3)));
        assert_eq!(duration_from_secs_f64(1e-9), Ok(Duration::from_nanos(1)));
        assert_eq!(duration_from_secs_f64(-1.0), Err(UnitError::Negative));
        assert_eq!(duration_from_secs_f64(f64::NAN), Err(UnitError::Syntax));
        assert_eq!(duration_from_secs_f64(1e300), Err(UnitError::Overflow));
    }

    #[test]
    fn rates() {
        let r = |s| parse_rate(s).unwrap().bits_per_sec();
        assert_eq!(r("500Mbit/s"), 500e6);
        assert_eq!(r("4Gbit/s"), 4e9);
        assert_eq!(r("1.5GB/s"), 12e9);
        assert_eq!(r("100MB/s"), 800e6);
        assert_eq!(r("10Gbps"), 10e9);
        assert_eq!(r("10 Gb/s"), 10e9);
        assert_eq!(r("2kbit/s"), 2e3);
        assert_eq!(r("2Kbps"), 2e3);
        assert_eq!(r("1bit/s"), 1.0);
        assert_eq!(r("3bits/s"), 3.0);
        assert_eq!(r("1MiB/s"), 8.0 * 1_048_576.0);
        assert_eq!(r("1Gibit/s"), 1_073_741_824.0);
        assert_eq!(r("1MBps"), 8e6);
        for bad in ["fast", "500", "500Mbit", "500 mbit/s", "5Xbit/s", "Mbit/s", ""] {
            assert_eq!(parse_rate(bad), Err(UnitError::Syntax), "{bad:?}");
        }
        assert_eq!(parse_rate("-1Gbit/s"), Err(UnitError::Negative));
        assert_eq!(parse_rate("0Gbit/s"), Err(UnitError::Zero));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4MiB"), Ok(4 << 20));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert_eq!(parse_size("100B"), Ok(100));
        assert_eq!(parse_size("2 kB"), Ok(2000));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
        assert_eq!(parse_size("4Mib"), Err(UnitError::Syntax));
        assert_eq!(parse_size("4"), Err(UnitError::Syntax));
        assert_eq!(parse_size("-4MiB"), Err(UnitError::Negative));
        assert_eq!(parse_size("1e10TiB"), Err(UnitError::Overflow));
    }

    #[test]
    fn display() {
        assert_eq!(Rate(1.5e9).to_string(), "1.5Gbit/s");
        assert_eq!(Rate(500e6).to_string(), "500Mbit/s");
        assert_eq!(Rate(12.0).to_string(), "12bit/s");
        assert_eq!(format_duration(Duration::from_millis(22_800)), "22.8s");
        assert_eq!(format_duration(Duration::from_secs(7200)), "2h");
        assert_eq!(format_duration(Duration::from_secs(38 * 60)), "38min");
        assert_eq!(format_duration(Duration::from_secs(86_400)), "1d");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::ZERO), "0s");
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30min");
        assert_eq!(format_duration(Duration::from_secs(90_061)), "1d1h1min1s");
        assert_eq!(format_duration(Duration::from_secs(59)), "59s");
    }

    proptest! {
        /// Every duration printed by `format_duration` with millisecond precision reads back.
        #[test]
        fn duration_round_trip(ms in 0u64..10_000_000_000) {
            let dur = Duration::from_millis(ms);
            prop_assert_eq!(parse_duration(&format_duration(dur)), Ok(dur));
        }

        /// Integer seconds in every unit agree.
        #[test]
        fn duration_units_agree(n in 0u64..1_000_000) {
            let secs = Duration::from_secs(n);
            prop_assert_eq!(d(&format!("{n}s")), secs);
            prop_assert_eq!(d(&format!("{}ms", n * 1000)), secs);
            prop_assert_eq!(d(&format!("{n}min")), secs * 60);
            prop_assert_eq!(d(&format!("{n}h")), secs * 3600);
            prop_assert_eq!(duration_from_secs_f64(n as f64), Ok(secs));
        }

        /// Decimal durations are exact: `a.bcd` seconds is `abcd` milliseconds.
        #[test]
        fn decimal_seconds_exact(whole in 0u64..1_000_000, frac in 0u64..1000) {
            let s = format!("{whole}.{frac:03}s");
            prop_assert_eq!(d(&s), Duration::from_millis(whole * 1000 + frac));
        }

        /// A byte rate is eight times the bit rate of the same number.
        #[test]
        fn bytes_are_eight_bits(n in 1u32..100_000, p in prop::sample::select(vec!["k", "M", "G", "T"])) {
            let bits = parse_rate(&format!("{n}{p}bit/s")).unwrap().bits_per_sec();
            let bytes = parse_rate(&format!("{n}{p}B/s")).unwrap().bits_per_sec();
            prop_assert!((bytes - 8.0 * bits).abs() <= 1e-9 * bytes);
        }

        /// A rate printed by `Display` reads back within rounding of three decimals.
        #[test]
        fn rate_round_trip(bps in 1.0f64..1e13) {
            let r = Rate::from_bits_per_sec(bps).unwrap();
            let back = parse_rate(&r.to_string()).unwrap().bits_per_sec();
            prop_assert!((back - bps).abs() <= 5e-4 * bps, "{} -> {}", r, back);
        }

        /// Arbitrary text never panics any parser.
        #[test]
        fn parsers_total(s in "\\PC{0,12}") {
            let _ = parse_duration(&s);
            let _ = parse_rate(&s);
            let _ = parse_size(&s);
        }

        /// Binary sizes are exact powers of 1024.
        #[test]
        fn binary_sizes(n in 0u64..1_000_000) {
            prop_assert_eq!(parse_size(&format!("{n}KiB")), Ok(n << 10));
            prop_assert_eq!(parse_size(&format!("{n}MiB")), Ok(n << 20));
        }
    }
}
