//! Errors of scenario loading: every one names the file, the field path, the line and column, and
//! what was expected.

use std::fmt;
use std::ops::Range;
use toml_edit::Item;

/// One step of a [`FieldPath`]: a key of a table or an index into an array.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    /// A key of a table (`links`, `bandwidth`).
    Key(String),
    /// An index into an array or an array of tables (`[1]`).
    Index(usize),
}

/// Where a value sits in the file, written like `links[1].bandwidth.trace[0][1]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldPath(Vec<Segment>);

impl FieldPath {
    /// The path of the whole file (empty).
    pub fn root() -> FieldPath {
        FieldPath(Vec::new())
    }

    /// This path followed by the key `key`.
    #[must_use]
    pub fn key(&self, key: &str) -> FieldPath {
        let mut v = self.0.clone();
        v.push(Segment::Key(key.to_owned()));
        FieldPath(v)
    }

    /// This path followed by the index `i`.
    #[must_use]
    pub fn index(&self, i: usize) -> FieldPath {
        let mut v = self.0.clone();
        v.push(Segment::Index(i));
        FieldPath(v)
    }

    /// The segments, outermost first.
    pub fn segments(&self) -> &[Segment] {
        &self.0
    }

    /// Whether this is the path of the whole file.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            match s {
                Segment::Key(k) if i == 0 => f.write_str(k)?,
                Segment::Key(k) => write!(f, ".{k}")?,
                Segment::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// A position in a file, both 1-based; the column counts characters, not bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Location {
    /// Line, from 1.
    pub line: usize,
    /// Column, from 1, in characters.
    pub column: usize,
}

impl Location {
    /// The location of byte `offset` of `src` (clamped to its length and to a character
    /// boundary).
    pub fn of_offset(src: &str, offset: usize) -> Location {
        let mut offset = offset.min(src.len());
        while !src.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &src[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        Location { line, column }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// What is wrong, without the where.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The file could not be read (only from [`super::Scenario::load`]).
    #[error("cannot read the file: {message}")]
    Io {
        /// The operating system's message.
        message: String,
    },
    /// Not valid TOML, or a value of the wrong TOML type or an unknown key, as reported by the
    /// TOML parser.
    #[error("{message}")]
    Toml {
        /// The parser's message (lowercase, without position).
        message: String,
    },
    /// A required field is absent.
    #[error("missing required field, expected {expected}")]
    Missing {
        /// What the field should hold.
        expected: String,
    },
    /// A value is present but wrong.
    #[error("expected {expected}, got {got}")]
    Expected {
        /// What the field should hold.
        expected: String,
        /// What it holds, as written in the file (strings quoted).
        got: String,
    },
    /// A name that refers to nothing declared.
    #[error("unknown {what} {name:?}, expected one of {}", quoted_list(.known))]
    Unknown {
        /// What kind of name (`region`, `node`).
        what: &'static str,
        /// The name as written.
        name: String,
        /// The names declared, in file order.
        known: Vec<String>,
    },
    /// A name declared twice.
    #[error("duplicate {what} {name:?} (first at {first})")]
    Duplicate {
        /// What kind of name (`region`, `node`, `link`).
        what: &'static str,
        /// The name.
        name: String,
        /// Where it was first declared (a field path).
        first: String,
    },
    /// Two regions that nodes need to talk over have no `[[links]]` entry.
    #[error(
        "no link from region {from:?} to region {to:?} ({needed_by}); add a [[links]] entry with from = {from:?}, to = {to:?}"
    )]
    NoLink {
        /// The sending region.
        from: String,
        /// The receiving region.
        to: String,
        /// Who needs it, e.g. `nodes "us-0" and "eu-0"`.
        needed_by: String,
    },
    /// Fields that are each valid but do not fit together, or a churn event that cannot happen.
    #[error("{reason}")]
    Conflict {
        /// Why, in words.
        reason: String,
    },
}

fn quoted_list(names: &[String]) -> String {
    if names.is_empty() {
        return "(none declared)".to_owned();
    }
    names.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", ")
}

/// An error in a scenario file: `file:line:column: field.path: what was expected`.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub struct ScenarioError {
    /// The file name, as given to the loader.
    pub file: String,
    /// Where in the file; `None` when the file could not be read.
    pub location: Option<Location>,
    /// The field at fault; empty for the whole file.
    pub path: FieldPath,
    /// What is wrong (boxed to keep `Result<Scenario, ScenarioError>` small).
    pub kind: Box<ErrorKind>,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(loc) = self.location {
            write!(f, ":{loc}")?;
        }
        if !self.path.is_root() {
            write!(f, ": {}", self.path)?;
        }
        write!(f, ": {}", self.kind)
    }
}

/// An error found by validation, before its position is known.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PathError {
    pub(crate) path: FieldPath,
    pub(crate) kind: ErrorKind,
}

impl PathError {
    pub(crate) fn new(path: FieldPath, kind: ErrorKind) -> PathError {
        PathError { path, kind }
    }

    /// Attaches the file and the position of the path in `src`.
    pub(crate) fn locate(self, src: &str, file: &str) -> ScenarioError {
        let offset = toml_edit::Document::parse(src)
            .ok()
            .map_or(0, |doc| offset_of_path(doc.as_item(), &self.path));
        ScenarioError {
            file: file.to_owned(),
            location: Some(Location::of_offset(src, offset)),
            path: self.path,
            kind: Box::new(self.kind),
        }
    }
}

/// The byte offset of the deepest part of `path` present in the document: the value of a key,
/// the header of a table, or the start of the file.
fn offset_of_path(root: &Item, path: &FieldPath) -> usize {
    let mut item = root;
    let mut best = 0;
    for seg in path.segments() {
        let next = match seg {
            Segment::Key(k) => item.get(k.as_str()),
            Segment::Index(i) => item.get(*i),
        };
        let Some(next) = next else { break };
        if let Some(span) = next.span() {
            best = span.start;
        }
        item = next;
    }
    best
}

/// Turns an error of the `toml` deserializer into a located one, finding the field path from the
/// error's span.
pub(crate) fn from_toml(err: &toml::de::Error, src: &str, file: &str) -> ScenarioError {
    let span = err.span();
    let offset = span.as_ref().map_or(0, |s| s.start);
    let path = span
        .and_then(|span| {
            let doc = toml_edit::Document::parse(src).ok()?;
            let mut segs = Vec::new();
            find_path(doc.as_item(), &span, &mut segs).then_some(FieldPath(segs))
        })
        .unwrap_or_default();
    ScenarioError {
        file: file.to_owned(),
        location: Some(Location::of_offset(src, offset)),
        path,
        kind: Box::new(ErrorKind::Toml { message: reword(err.message()) }),
    }
}

/// Searches for the deepest key or value whose span contains `target`, pushing its path.
fn find_path(item: &Item, target: &Range<usize>, path: &mut Vec<Segment>) -> bool {
    let contains = |s: Option<Range<usize>>| {
        s.is_some_and(|s| s.start <= target.start && target.end <= s.end.max(s.start + 1))
    };
    if let Some(table) = item.as_table_like() {
        for (key, child) in table.iter() {
            path.push(Segment::Key(key.to_owned()));
            let key_span = table.get_key_value(key).and_then(|(k, _)| k.span());
            if contains(key_span) || find_path(child, target, path) || contains(child.span()) {
                return true;
            }
            path.pop();
        }
    } else if let Some(aot) = item.as_array_of_tables() {
        for (i, t) in aot.iter().enumerate() {
            path.push(Segment::Index(i));
            let child = Item::Table(t.clone());
            if find_path(&child, target, path) || contains(t.span()) {
                return true;
            }
            path.pop();
        }
    } else if let Some(arr) = item.as_array() {
        for (i, v) in arr.iter().enumerate() {
            path.push(Segment::Index(i));
            let child = Item::Value(v.clone());
            if find_path(&child, target, path) || contains(v.span()) {
                return true;
            }
            path.pop();
        }
    }
    false
}

/// Rewords serde's `invalid type: X, expected Y` as `expected Y, got X`, and drops trailing
/// newlines, so that every message reads the same way.
fn reword(msg: &str) -> String {
    let msg = msg.trim_end();
    for prefix in ["invalid type: ", "invalid value: ", "invalid length "] {
        if let Some(rest) = msg.strip_prefix(prefix)
            && let Some((got, expected)) = rest.rsplit_once(", expected ")
        {
            let expected = match expected {
                "u64" | "usize" => "a non-negative integer",
                "u32" => "a non-negative integer below 2^32",
                "f64" | "f32" => "a number",
                other => other,
            };
            return format!("expected {expected}, got {got}");
        }
    }
    if let Some(rest) = msg.strip_prefix("unknown field ")
        && let Some((got, expected)) = rest.split_once(", expected ")
    {
        return format!("unknown field {got}, expected {expected}");
    }
    msg.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_display() {
        let p = FieldPath::root().key("links").index(1).key("bandwidth").key("trace").index(0);
        assert_eq!(p.to_string(), "links[1].bandwidth.trace[0]");
        assert_eq!(FieldPath::root().to_string(), "");
    }

    #[test]
    fn location_counts_characters() {
        let src = "a = 1\nµb = \"x\"\n";
        assert_eq!(Location::of_offset(src, 0), Location { line: 1, column: 1 });
        assert_eq!(Location::of_offset(src, 6), Location { line: 2, column: 1 });
        // 'µ' is two bytes; the `=` after "µb " is the fourth character.
        let eq = src.find("= \"").unwrap();
        assert_eq!(Location::of_offset(src, eq), Location { line: 2, column: 4 });
        assert_eq!(Location::of_offset(src, 10_000), Location { line: 3, column: 1 });
    }

    #[test]
    fn rewording() {
        assert_eq!(
            reword("invalid type: string \"x\", expected u64\n"),
            "expected a non-negative integer, got string \"x\""
        );
        assert_eq!(
            reword("invalid value: integer `-1`, expected u32"),
            "expected a non-negative integer below 2^32, got integer `-1`"
        );
        assert_eq!(reword("something else"), "something else");
    }
}
