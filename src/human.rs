//! Numbers written for people: terminal tables and messages (never files that tools read).

/// Bytes in decimal units with three significant digits or so: `512 B`, `38.2 kB`, `101.94 MB`,
/// `2.40 GB`, `7.98 TB`.
pub(crate) fn bytes(b: u64) -> String {
    let f = b as f64;
    if f >= 1e12 {
        format!("{:.2} TB", f / 1e12)
    } else if f >= 1e9 {
        format!("{:.2} GB", f / 1e9)
    } else if f >= 1e6 {
        format!("{:.2} MB", f / 1e6)
    } else if f >= 1e3 {
        format!("{:.1} kB", f / 1e3)
    } else {
        format!("{b} B")
    }
}

/// A duration in seconds, in the unit that shows its digits: `438.90 s`, `1.12 ms`, `85 us`.
/// Hours are left in seconds (the tables line figures up by unit).
pub(crate) fn seconds(s: f64) -> String {
    let a = s.abs();
    if !s.is_finite() || a == 0.0 || a >= 1.0 {
        format!("{s:.2} s")
    } else if a >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.0} us", s * 1e6)
    }
}

/// A rate with a k or M suffix: `16.7k`, `2.35M`, `80.1`.
pub(crate) fn rate(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.2}M", r / 1e6)
    } else if r >= 1e4 {
        format!("{:.1}k", r / 1e3)
    } else {
        format!("{r:.1}")
    }
}

/// `n` and a noun, plural unless `n` is 1: `1 join`, `3 epochs`.
pub(crate) fn count(n: u64, noun: &str) -> String {
    if n == 1 { format!("1 {noun}") } else { format!("{n} {noun}s") }
}

#[cfg(test)]
mod tests {
    #[test]
    fn units_follow_the_magnitude() {
        assert_eq!(super::bytes(512), "512 B");
        assert_eq!(super::bytes(38_200), "38.2 kB");
        assert_eq!(super::bytes(101_935_041), "101.94 MB");
        assert_eq!(super::bytes(2_400_000_000), "2.40 GB");
        assert_eq!(super::bytes(7_979_550_171_008), "7.98 TB");
        assert_eq!(super::seconds(438.9), "438.90 s");
        assert_eq!(super::seconds(0.00112), "1.12 ms");
        assert_eq!(super::seconds(0.000085), "85 us");
        assert_eq!(super::seconds(0.0), "0.00 s");
        assert_eq!(super::rate(16_666.6), "16.7k");
        assert_eq!(super::rate(2_350_000.0), "2.35M");
        assert_eq!(super::rate(80.06), "80.1");
        assert_eq!(super::count(1, "join"), "1 join");
        assert_eq!(super::count(0, "leave"), "0 leaves");
    }
}
