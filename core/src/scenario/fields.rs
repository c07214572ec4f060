//! Reading one field, for the validators of every section (`validate`, `churn`, `failures`): the
//! error constructors that name the field at fault, the scalars with units, values that vary
//! over time, and the event before sorting with the fields to blame ([`Pending`]).

use super::error::{ErrorKind, FieldPath, PathError};
use super::raw::{RawScalar, RawVarying};
use super::units::{
    UnitError, duration_from_secs_f64, format_duration, parse_duration, parse_rate, parse_size,
};
use super::{ChurnEvent, Region, RegionId, Varying};
use std::fmt;
use std::time::Duration;

pub(super) type R<T> = Result<T, PathError>;

/// How many declared names an "unknown name" error lists.
const MAX_KNOWN: usize = 16;

const DURATION: &str = r#"a duration like "22.8s" or "38min""#;
pub(super) const RATE: &str = r#"a rate like "500Mbit/s""#;
const SIZE: &str = r#"a size like "4MiB""#;
const NAME: &str = "a name of letters, digits, '-', '_' or '.'";

pub(super) fn expected(
    path: &FieldPath,
    expected: impl Into<String>,
    got: impl fmt::Display,
) -> PathError {
    PathError::new(
        path.clone(),
        ErrorKind::Expected { expected: expected.into(), got: got.to_string() },
    )
}

pub(super) fn missing(path: &FieldPath, expected: impl Into<String>) -> PathError {
    PathError::new(path.clone(), ErrorKind::Missing { expected: expected.into() })
}

pub(super) fn conflict(path: &FieldPath, reason: impl Into<String>) -> PathError {
    PathError::new(path.clone(), ErrorKind::Conflict { reason: reason.into() })
}

pub(super) fn unknown(
    path: &FieldPath,
    what: &'static str,
    name: &str,
    known: Vec<String>,
) -> PathError {
    let mut known = known;
    if known.len() > MAX_KNOWN {
        known.truncate(MAX_KNOWN);
        known.push("...".to_owned());
    }
    PathError::new(path.clone(), ErrorKind::Unknown { what, name: name.to_owned(), known })
}

pub(super) fn quoted(s: &str) -> String {
    format!("{s:?}")
}

pub(super) fn one_of_text(names: &[&str]) -> String {
    let q: Vec<String> = names.iter().map(|n| quoted(n)).collect();
    format!("one of {}", q.join(", "))
}

// ---------------------------------------------------------------------------------------------
// Scalars with units
// ---------------------------------------------------------------------------------------------

pub(super) fn duration(path: &FieldPath, raw: &RawScalar) -> R<Duration> {
    let parsed = match raw {
        RawScalar::Str(s) => parse_duration(s),
        RawScalar::Int(i) => {
            u64::try_from(*i).map(Duration::from_secs).map_err(|_| UnitError::Negative)
        }
        RawScalar::Float(f) => duration_from_secs_f64(*f),
    };
    parsed.map_err(|e| match e {
        UnitError::Negative => expected(path, "a non-negative duration", raw),
        UnitError::Overflow => expected(path, "a duration that fits 64-bit seconds", raw),
        UnitError::Syntax | UnitError::Zero => expected(path, DURATION, raw),
    })
}

pub(super) fn positive_duration(path: &FieldPath, raw: &RawScalar) -> R<Duration> {
    let d = duration(path, raw)?;
    if d.is_zero() {
        return Err(expected(path, "a duration above 0", raw));
    }
    Ok(d)
}

pub(super) fn rate(path: &FieldPath, raw: &RawScalar) -> R<super::Rate> {
    match raw {
        RawScalar::Str(s) => parse_rate(s).map_err(|e| match e {
            UnitError::Negative | UnitError::Zero => {
                expected(path, r#"a positive rate like "500Mbit/s""#, raw)
            }
            UnitError::Overflow => expected(path, "a finite rate", raw),
            UnitError::Syntax => expected(path, RATE, raw),
        }),
        RawScalar::Int(_) | RawScalar::Float(_) => {
            Err(expected(path, r#"a rate with its unit, like "500Mbit/s" or "100MB/s""#, raw))
        }
    }
}

pub(super) fn size(path: &FieldPath, raw: &RawScalar) -> R<u64> {
    let parsed = match raw {
        RawScalar::Str(s) => parse_size(s),
        RawScalar::Int(i) => u64::try_from(*i).map_err(|_| UnitError::Negative),
        RawScalar::Float(_) => Err(UnitError::Syntax),
    };
    parsed.map_err(|e| match e {
        UnitError::Negative => expected(path, "a non-negative size", raw),
        UnitError::Overflow => expected(path, "a size that fits 64 bits", raw),
        UnitError::Syntax | UnitError::Zero => expected(path, SIZE, raw),
    })
}

pub(super) fn varying<T: Copy + PartialOrd>(
    path: &FieldPath,
    raw: &RawVarying,
    parse: fn(&FieldPath, &RawScalar) -> R<T>,
) -> R<Varying<T>> {
    let table = match raw {
        RawVarying::Scalar(s) => return parse(path, s).map(Varying::Fixed),
        RawVarying::Table(t) => t,
    };
    match (&table.uniform, &table.trace) {
        (Some(u), None) => {
            let up = path.key("uniform");
            if u.len() != 2 {
                return Err(expected(&up, "two values [low, high]", format!("{} values", u.len())));
            }
            let low = parse(&up.index(0), &u[0])?;
            let high = parse(&up.index(1), &u[1])?;
            if high < low {
                return Err(expected(
                    &up.index(1),
                    format!("an upper bound >= the lower bound {}", u[0]),
                    &u[1],
                ));
            }
            let resample =
                table.resample.as_ref().map(|r| positive_duration(&path.key("resample"), r));
            Ok(Varying::Uniform { low, high, resample: resample.transpose()? })
        }
        (None, Some(trace)) => {
            let tp = path.key("trace");
            if table.resample.is_some() {
                return Err(conflict(&path.key("resample"), "resample applies to uniform only"));
            }
            if trace.is_empty() {
                return Err(expected(&tp, "at least one [time, value] pair", "[]"));
            }
            let mut points: Vec<(Duration, T)> = Vec::with_capacity(trace.len());
            for (i, pair) in trace.iter().enumerate() {
                let ep = tp.index(i);
                if pair.len() != 2 {
                    return Err(expected(
                        &ep,
                        "a pair [time, value]",
                        format!("{} values", pair.len()),
                    ));
                }
                let at = duration(&ep.index(0), &pair[0])?;
                match points.last() {
                    None if !at.is_zero() => {
                        return Err(expected(
                            &ep.index(0),
                            r#""0s" (a trace starts at the start of the run)"#,
                            &pair[0],
                        ));
                    }
                    Some((prev, _)) if at <= *prev => {
                        return Err(expected(
                            &ep.index(0),
                            format!("a time after {} (the previous point)", format_duration(*prev)),
                            &pair[0],
                        ));
                    }
                    _ => {}
                }
                points.push((at, parse(&ep.index(1), &pair[1])?));
            }
            Ok(Varying::Trace(points))
        }
        (Some(_), Some(_)) => Err(conflict(&path.key("trace"), "give uniform or trace, not both")),
        (None, None) => Err(expected(
            path,
            "a value, { uniform = [low, high] } or { trace = [[time, value], ...] }",
            "a table with neither",
        )),
    }
}

pub(super) fn check_name(path: &FieldPath, s: &str) -> R<String> {
    let ok = !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok { Ok(s.to_owned()) } else { Err(expected(path, NAME, quoted(s))) }
}

pub(super) fn finite_at_least(path: &FieldPath, v: f64, min: f64, inclusive: bool) -> R<f64> {
    let ok = v.is_finite() && if inclusive { v >= min } else { v > min };
    if ok {
        Ok(v)
    } else {
        let op = if inclusive { ">=" } else { ">" };
        Err(expected(path, format!("a number {op} {min}"), v))
    }
}

pub(super) fn unit_interval(path: &FieldPath, v: f64) -> R<f64> {
    if v.is_finite() && (0.0..1.0).contains(&v) {
        Ok(v)
    } else {
        Err(expected(path, "a number in [0, 1)", v))
    }
}

pub(super) fn at_least_one<T: Into<u64> + Copy + fmt::Display>(path: &FieldPath, v: T) -> R<T> {
    if v.into() >= 1 { Ok(v) } else { Err(expected(path, "an integer >= 1", v)) }
}

pub(super) fn region_ref(path: &FieldPath, name: &str, regions: &[Region]) -> R<RegionId> {
    regions.iter().find(|r| r.name == name).map(|r| r.id).ok_or_else(|| {
        unknown(path, "region", name, regions.iter().map(|r| r.name.clone()).collect())
    })
}

/// An event before sorting, with the paths to blame: for each node, and for the event itself.
pub(super) struct Pending {
    pub(super) event: ChurnEvent,
    pub(super) path: FieldPath,
    pub(super) node_paths: Vec<FieldPath>,
}
