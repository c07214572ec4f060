//! Fixed number formats and text escaping shared by the plots, the HTML and the CSV summaries.

/// A display unit: values are divided by `div` and labelled `name`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Unit {
    /// Divisor.
    pub(crate) div: f64,
    /// Label.
    pub(crate) name: &'static str,
}

/// Seconds, minutes or hours, so that `max` reads as at most a few hundred.
pub(crate) fn time_unit(max: f64) -> Unit {
    if max >= 3.0 * 3600.0 {
        Unit { div: 3600.0, name: "h" }
    } else if max >= 300.0 {
        Unit { div: 60.0, name: "min" }
    } else {
        Unit { div: 1.0, name: "s" }
    }
}

/// Bytes in B, kB, MB, GB or TB (powers of 1000).
pub(crate) fn bytes_unit(max: f64) -> Unit {
    const UNITS: [(f64, &str); 4] = [(1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")];
    UNITS
        .iter()
        .find(|(d, _)| max >= *d)
        .map_or(Unit { div: 1.0, name: "B" }, |&(div, name)| Unit { div, name })
}

/// Counts in units, thousands, millions, billions or trillions.
pub(crate) fn count_unit(max: f64) -> Unit {
    const UNITS: [(f64, &str); 4] =
        [(1e12, "trillions"), (1e9, "billions"), (1e6, "millions"), (1e3, "thousands")];
    UNITS
        .iter()
        .find(|(d, _)| max >= *d)
        .map_or(Unit { div: 1.0, name: "count" }, |&(div, name)| Unit { div, name })
}

/// Text safe to draw: control characters replaced by `?`, at most 40 characters.
pub(crate) fn label_text(s: &str) -> String {
    let mut out: String =
        s.chars().map(|c| if c.is_control() { '?' } else { c }).take(40).collect();
    if s.chars().count() > 40 {
        out.push('…');
    }
    out
}

/// `s` escaped for HTML text and attribute values. Control characters other than tab and line
/// feed, which neither HTML nor XML allows, become U+FFFD.
pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' | '\n' => out.push(c),
            c if c.is_control() => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// A fraction as a percentage with one decimal (`0.9571` -> `95.7%`).
pub(crate) fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// Seconds with adaptive precision: `0.000123 s`, `1.23 s`, `469 s`.
pub(crate) fn secs(x: f64) -> String {
    let a = x.abs();
    if a == 0.0 {
        "0 s".to_owned()
    } else if a < 0.01 {
        format!("{x:.6} s")
    } else if a < 100.0 {
        format!("{x:.3} s")
    } else {
        format!("{x:.1} s")
    }
}

/// Bytes in the unit that suits them, two decimals (`1.50 GB`).
pub(crate) fn bytes(x: u64) -> String {
    let u = bytes_unit(x as f64);
    if u.div == 1.0 { format!("{x} B") } else { format!("{:.2} {}", x as f64 / u.div, u.name) }
}

/// A general number with six decimals.
pub(crate) fn num(x: f64) -> String {
    format!("{x:.6}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(
            escape_html("<a href=\"x\">&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(escape_html("a\u{1}b\n"), "a\u{FFFD}b\n");
        assert_eq!(label_text("n\u{7}1"), "n?1");
    }

    #[test]
    fn units() {
        assert_eq!(time_unit(10.0).name, "s");
        assert_eq!(time_unit(600.0).name, "min");
        assert_eq!(time_unit(42.0 * 86400.0).name, "h");
        assert_eq!(bytes(999), "999 B");
        assert_eq!(bytes(10_200_000_000), "10.20 GB");
        assert_eq!(pct(0.9568), "95.7%");
        assert_eq!(secs(469.0), "469.0 s");
        assert_eq!(secs(2.5), "2.500 s");
    }
}
