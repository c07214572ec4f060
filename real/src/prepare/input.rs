//! The inputs of `loco data prepare`: paths and globs expanded to files, and each file read as a
//! stream of documents (plain text, JSON lines, Parquet; text and JSON lines optionally gzip- or
//! zstd-compressed). Every error names the file and, where there is one, the line or row.

use super::PrepareError;
use crate::data::prepared::{InputFile, TextUnit};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What an input file holds, by its extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// `.txt`: plain text, cut into documents by `--text-unit`.
    Text,
    /// `.jsonl`: one JSON object per line, the text in a string field.
    Jsonl,
    /// `.parquet`: the text in a string column.
    Parquet,
}

/// How an input file is compressed, by its last extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Compression {
    None,
    Gzip,
    Zstd,
}

/// One input file, expanded and classified.
#[derive(Clone, Debug)]
pub(super) struct Input {
    pub(super) path: PathBuf,
    pub(super) kind: Kind,
    pub(super) compression: Compression,
    pub(super) bytes: u64,
}

impl Input {
    /// The file as the manifest records it.
    pub(super) fn record(&self) -> InputFile {
        InputFile { path: self.path.display().to_string(), bytes: self.bytes }
    }
}

/// Where a document came from, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Origin {
    /// Index of the input file.
    pub(super) input: u32,
    /// Its first line (1-based) in a text or JSON-lines file, its row (0-based) in Parquet.
    pub(super) at: u64,
}

/// The file's kind and compression from its name; an error says which names are understood.
pub(super) fn classify(path: &Path) -> Result<(Kind, Compression), PrepareError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let (stem, compression) = if let Some(s) = name.strip_suffix(".gz") {
        (s, Compression::Gzip)
    } else if let Some(s) = name.strip_suffix(".zst") {
        (s, Compression::Zstd)
    } else {
        (name, Compression::None)
    };
    let kind = if stem.ends_with(".txt") {
        Kind::Text
    } else if stem.ends_with(".jsonl") {
        Kind::Jsonl
    } else if stem.ends_with(".parquet") {
        Kind::Parquet
    } else {
        return Err(PrepareError::input(
            path,
            None,
            "unknown kind of input: expected a name ending .txt, .jsonl or .parquet (the first \
             two may add .gz or .zst)",
        ));
    };
    if kind == Kind::Parquet && compression != Compression::None {
        return Err(PrepareError::input(
            path,
            None,
            "a compressed Parquet file: Parquet compresses its own columns, give the .parquet file",
        ));
    }
    Ok((kind, compression))
}

/// Expands `patterns` (paths, or globs with `*`, `?` or `[`) into input files, in the order
/// given, each glob's matches in name order. A glob that matches nothing, a missing file or a
/// directory is an error.
pub(super) fn resolve(patterns: &[String]) -> Result<Vec<Input>, PrepareError> {
    if patterns.is_empty() {
        return Err(PrepareError::Setting {
            field: "INPUT",
            value: String::new(),
            expected: "at least one input file or glob",
        });
    }
    let mut out = Vec::new();
    for pattern in patterns {
        let paths: Vec<PathBuf> = if pattern.contains(['*', '?', '[']) {
            let matches = glob::glob(pattern).map_err(|e| PrepareError::Setting {
                field: "INPUT",
                value: format!("{pattern} ({e})"),
                expected: "a path or a valid glob",
            })?;
            let mut paths = Vec::new();
            for m in matches {
                let p = m.map_err(|e| {
                    PrepareError::input(e.path(), None, format!("cannot read: {}", e.error()))
                })?;
                if p.is_file() {
                    paths.push(p);
                }
            }
            if paths.is_empty() {
                return Err(PrepareError::Setting {
                    field: "INPUT",
                    value: pattern.clone(),
                    expected: "a glob that matches at least one file",
                });
            }
            paths
        } else {
            vec![PathBuf::from(pattern)]
        };
        for path in paths {
            let meta = std::fs::metadata(&path)
                .map_err(|e| PrepareError::input(&path, None, format!("cannot open: {e}")))?;
            if !meta.is_file() {
                return Err(PrepareError::input(
                    &path,
                    None,
                    "not a file (for a directory, give a glob such as DIR/*.jsonl)",
                ));
            }
            let (kind, compression) = classify(&path)?;
            out.push(Input { path, kind, compression, bytes: meta.len() });
        }
    }
    Ok(out)
}

/// How documents are read out of the inputs.
#[derive(Clone, Debug)]
pub(super) struct ReadSettings {
    /// The JSONL field or Parquet column of the text.
    pub(super) field: String,
    /// How plain text is cut into documents.
    pub(super) text_unit: TextUnit,
}

/// A reader that counts the bytes read through it (the compressed bytes, for the progress bar).
struct Counting<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Reads every document of `input` (index `index`) in order and hands each, with where it
/// came from, to `emit`. Documents that are empty (whitespace only, for plain text) are
/// skipped. `read` counts the file's bytes as they are read.
pub(super) fn read_documents(
    input: &Input,
    index: u32,
    settings: &ReadSettings,
    read: &Arc<AtomicU64>,
    emit: &mut dyn FnMut(String, Origin) -> Result<(), PrepareError>,
) -> Result<(), PrepareError> {
    let path = &input.path;
    let file = File::open(path)
        .map_err(|e| PrepareError::input(path, None, format!("cannot open: {e}")))?;
    if input.kind == Kind::Parquet {
        read.fetch_add(input.bytes, Ordering::Relaxed);
        return read_parquet(path, index, file, &settings.field, emit);
    }
    let counted = Counting { inner: file, count: Arc::clone(read) };
    let stream: Box<dyn Read> = match input.compression {
        Compression::None => Box::new(counted),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(counted)),
        Compression::Zstd => Box::new(
            zstd::stream::read::Decoder::new(counted)
                .map_err(|e| PrepareError::input(path, None, format!("not zstd: {e}")))?,
        ),
    };
    let mut lines = Lines { path, reader: BufReader::with_capacity(1 << 20, stream), line: 0 };
    match input.kind {
        Kind::Jsonl => read_jsonl(&mut lines, index, &settings.field, emit),
        _ => read_text(&mut lines, index, settings.text_unit, emit),
    }
}

/// Lines of a text stream, numbered, as UTF-8.
struct Lines<'a, R> {
    path: &'a Path,
    reader: BufReader<R>,
    /// The number of the last line read (1-based).
    line: u64,
}

impl<R: Read> Lines<'_, R> {
    /// The next line without its `\n` or `\r\n`, or `None` at the end.
    fn next_line(&mut self, raw: &mut Vec<u8>) -> Result<Option<String>, PrepareError> {
        raw.clear();
        let n = self.reader.read_until(b'\n', raw).map_err(|e| {
            PrepareError::input(self.path, Some(format!("line {}", self.line + 1)), e.to_string())
        })?;
        if n == 0 {
            return Ok(None);
        }
        self.line += 1;
        if raw.last() == Some(&b'\n') {
            raw.pop();
            if raw.last() == Some(&b'\r') {
                raw.pop();
            }
        }
        let text = String::from_utf8(std::mem::take(raw)).map_err(|e| {
            PrepareError::input(
                self.path,
                Some(format!("line {}", self.line)),
                format!("not UTF-8 (byte {} of the line)", e.utf8_error().valid_up_to()),
            )
        })?;
        Ok(Some(text))
    }
}

fn read_text<R: Read>(
    lines: &mut Lines<'_, R>,
    index: u32,
    unit: TextUnit,
    emit: &mut dyn FnMut(String, Origin) -> Result<(), PrepareError>,
) -> Result<(), PrepareError> {
    if unit == TextUnit::File {
        return read_whole(lines, index, emit);
    }
    let mut raw = Vec::new();
    let mut doc = String::new();
    let mut first = 0u64;
    while let Some(line) = lines.next_line(&mut raw)? {
        let blank = line.trim().is_empty();
        if unit == TextUnit::Line {
            if !blank {
                emit(line, Origin { input: index, at: lines.line })?;
            }
        } else if blank {
            if !doc.is_empty() {
                emit(std::mem::take(&mut doc), Origin { input: index, at: first })?;
            }
        } else {
            if doc.is_empty() {
                first = lines.line;
            } else {
                doc.push('\n');
            }
            doc.push_str(&line);
        }
    }
    if !doc.is_empty() {
        emit(doc, Origin { input: index, at: first })?;
    }
    Ok(())
}

/// The whole stream as one document (unless it is whitespace only).
fn read_whole<R: Read>(
    lines: &mut Lines<'_, R>,
    index: u32,
    emit: &mut dyn FnMut(String, Origin) -> Result<(), PrepareError>,
) -> Result<(), PrepareError> {
    let mut raw = Vec::new();
    lines
        .reader
        .read_to_end(&mut raw)
        .map_err(|e| PrepareError::input(lines.path, None, format!("cannot read: {e}")))?;
    let text = String::from_utf8(raw).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let line = 1 + e.as_bytes()[..valid].iter().filter(|&&b| b == b'\n').count();
        PrepareError::input(lines.path, Some(format!("line {line}")), "not UTF-8")
    })?;
    if !text.trim().is_empty() {
        emit(text, Origin { input: index, at: 1 })?;
    }
    Ok(())
}

fn read_jsonl<R: Read>(
    lines: &mut Lines<'_, R>,
    index: u32,
    field: &str,
    emit: &mut dyn FnMut(String, Origin) -> Result<(), PrepareError>,
) -> Result<(), PrepareError> {
    let mut raw = Vec::new();
    while let Some(line) = lines.next_line(&mut raw)? {
        if line.trim().is_empty() {
            continue;
        }
        let at = lines.line;
        let bad = |msg: String| PrepareError::input(lines.path, Some(format!("line {at}")), msg);
        let value: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| bad(format!("not JSON: {e}")))?;
        let serde_json::Value::Object(mut object) = value else {
            return Err(bad(format!(
                "expected a JSON object with a string field \"{field}\", found {}",
                json_kind(&value)
            )));
        };
        match object.remove(field) {
            Some(serde_json::Value::String(text)) => {
                if !text.is_empty() {
                    emit(text, Origin { input: index, at })?;
                }
            }
            Some(other) => {
                return Err(bad(format!(
                    "field \"{field}\" is {}, expected a string (choose the field with --field)",
                    json_kind(&other)
                )));
            }
            None => {
                let mut names: Vec<&str> = object.keys().map(String::as_str).take(10).collect();
                if names.is_empty() {
                    names.push("none");
                }
                return Err(bad(format!(
                    "no field \"{field}\" (its fields: {}; choose one with --field)",
                    names.join(", ")
                )));
            }
        }
    }
    Ok(())
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Reads column `field` of a Parquet file row by row (the record API, one row group at a time).
/// The parquet crate panics on some corrupt files; such a panic becomes an error naming the file.
fn read_parquet(
    path: &Path,
    index: u32,
    file: File,
    field: &str,
    emit: &mut dyn FnMut(String, Origin) -> Result<(), PrepareError>,
) -> Result<(), PrepareError> {
    let run = std::panic::AssertUnwindSafe(|| read_parquet_rows(path, index, file, field, emit));
    match std::panic::catch_unwind(run) {
        Ok(r) => r,
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "unknown".into());
            Err(PrepareError::input(path, None, format!("corrupt Parquet file ({what})")))
        }
    }
}

fn read_parquet_rows(
    path: &Path,
    index: u32,
    file: File,
    field: &str,
    emit: &mut dyn FnMut(String, Origin) -> Result<(), PrepareError>,
) -> Result<(), PrepareError> {
    use parquet::basic::{ConvertedType, LogicalType, Type as Physical};
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;
    let bad = |at: Option<String>, msg: String| PrepareError::input(path, at, msg);
    let reader = SerializedFileReader::new(file)
        .map_err(|e| bad(None, format!("not a Parquet file: {e}")))?;
    let schema = reader.metadata().file_metadata().schema();
    let columns = schema.get_fields();
    let Some(column) = columns.iter().find(|c| c.name() == field) else {
        let names: Vec<&str> = columns.iter().map(|c| c.name()).take(10).collect();
        return Err(bad(
            None,
            format!(
                "no column \"{field}\" (its columns: {}; choose one with --field)",
                names.join(", ")
            ),
        ));
    };
    let info = column.get_basic_info();
    let is_string = column.is_primitive()
        && column.get_physical_type() == Physical::BYTE_ARRAY
        && (matches!(info.logical_type_ref(), Some(LogicalType::String))
            || info.converted_type() == ConvertedType::UTF8);
    if !is_string {
        let what = if column.is_primitive() {
            format!("{:?} ({:?})", column.get_physical_type(), info.logical_type_ref())
        } else {
            "a group".to_owned()
        };
        return Err(bad(
            None,
            format!("column \"{field}\" is {what}, expected a string column (UTF-8 BYTE_ARRAY)"),
        ));
    }
    let projection = parquet::schema::types::Type::group_type_builder(schema.name())
        .with_fields(vec![column.clone()])
        .build()
        .map_err(|e| bad(None, e.to_string()))?;
    let mut row_index = 0u64;
    for g in 0..reader.num_row_groups() {
        let group =
            reader.get_row_group(g).map_err(|e| bad(None, format!("row group {g}: {e}")))?;
        let rows = group
            .get_row_iter(Some(projection.clone()))
            .map_err(|e| bad(None, format!("row group {g}: {e}")))?;
        for row in rows {
            let at = Some(format!("row {row_index}"));
            let row = row.map_err(|e| bad(at.clone(), e.to_string()))?;
            match row.into_columns().into_iter().next().map(|(_, f)| f) {
                Some(Field::Str(text)) => {
                    if !text.is_empty() {
                        emit(text, Origin { input: index, at: row_index })?;
                    }
                }
                Some(Field::Null) => {
                    return Err(bad(at, format!("column \"{field}\" is null, expected a string")));
                }
                other => {
                    return Err(bad(
                        at,
                        format!("column \"{field}\" is {other:?}, expected a string"),
                    ));
                }
            }
            row_index += 1;
        }
    }
    Ok(())
}
