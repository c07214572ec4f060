//! Tests of `loco data prepare`'s library side: determinism, resumption, inputs, the reader.

use super::*;
use crate::data::{DataLoader, Order, Shard};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::sync::OnceLock;

const EOS: &str = "<|endoftext|>";

fn genesis() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/genesis-kjv.txt");
    std::fs::read_to_string(path).expect("data/genesis-kjv.txt")
}

/// A small byte-level BPE trained on Genesis, once.
fn tokenizer_json() -> &'static str {
    static JSON: OnceLock<String> = OnceLock::new();
    JSON.get_or_init(|| {
        let lines: Vec<String> = genesis().lines().map(str::to_owned).collect();
        train_byte_level_bpe(&lines, 600, &[EOS]).expect("train a tokenizer")
    })
}

/// Documents: Genesis's verses grouped a few at a time (and one with non-ASCII text).
fn documents() -> Vec<String> {
    let text = genesis();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut docs: Vec<String> = lines.chunks(3).map(|c| c.join("\n")).take(300).collect();
    docs.push("Ünïcode — naïve café, 日本語 🙂".into());
    docs
}

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let f = Fixture { dir: tempfile::tempdir().unwrap() };
        std::fs::write(f.path("tokenizer.json"), tokenizer_json()).unwrap();
        f
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn jsonl(&self, name: &str, docs: &[String]) -> String {
        let mut text = String::new();
        for (i, d) in docs.iter().enumerate() {
            text.push_str(&serde_json::json!({ "id": i, "text": d }).to_string());
            text.push('\n');
        }
        std::fs::write(self.path(name), text).unwrap();
        self.path(name).display().to_string()
    }

    fn options(&self, out: &str, inputs: Vec<String>) -> PrepareOptions {
        let mut o = PrepareOptions::new(self.path("tokenizer.json"), self.path(out), inputs);
        o.unit_bytes = 4096;
        o.held_out = 0.2;
        o.seed = 7;
        o.threads = Some(1);
        o
    }
}

/// Every file of a directory, by name.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap())
        })
        .collect()
}

/// The shards only (manifests name their inputs, which differ between input kinds).
fn shards(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    files(dir).into_iter().filter(|(n, _)| n.ends_with(".u16") || n.ends_with(".u32")).collect()
}

fn decode(bytes: &[u8]) -> Vec<u32> {
    bytes.chunks_exact(2).map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))).collect()
}

/// A split's tokens, its shards concatenated in manifest order.
fn split_tokens(dir: &Path, split: Split) -> Vec<u32> {
    let m = Manifest::read(dir).unwrap();
    m.split(split)
        .shards
        .iter()
        .flat_map(|s| decode(&std::fs::read(dir.join(&s.file)).unwrap()))
        .collect()
}

#[test]
fn the_split_and_the_bytes_do_not_depend_on_the_thread_count() {
    let f = Fixture::new();
    let input = f.jsonl("docs.jsonl", &documents());
    let one = prepare(&f.options("one", vec![input.clone()])).unwrap();
    let mut three = f.options("three", vec![input]);
    three.threads = Some(3);
    let three = prepare(&three).unwrap();
    assert!(one.units > 3, "several units: {}", one.units);
    assert_eq!(files(&f.path("one")), files(&f.path("three")));
    assert_eq!((one.train, one.held_out), (three.train, three.held_out));
    let n = documents().len() as u64;
    let held = (0..n).filter(|&i| is_held_out(7, i, 0.2)).count() as u64;
    assert_eq!(one.held_out.documents, held);
    assert!(held > n / 10 && held < n * 3 / 10, "about 20% held out: {held} of {n}");
    assert_eq!(one.documents(), n);
    // Another seed gives another split.
    assert_ne!(
        (0..n).filter(|&i| is_held_out(8, i, 0.2)).collect::<Vec<_>>(),
        (0..n).filter(|&i| is_held_out(7, i, 0.2)).collect::<Vec<_>>()
    );
    assert!((0..1000).all(|i| !is_held_out(3, i, 0.0)));
}

#[test]
fn each_document_is_its_encoding_plus_eos_in_order() {
    let f = Fixture::new();
    let docs = documents();
    let mut o = f.options("out", vec![f.jsonl("docs.jsonl", &docs)]);
    o.eos = Some(EOS.into());
    let report = prepare(&o).unwrap();
    let tok = tokenizers::Tokenizer::from_bytes(tokenizer_json()).unwrap();
    let eos = tok.token_to_id(EOS).unwrap();
    let (mut train, mut held) = (Vec::new(), Vec::new());
    for (i, d) in docs.iter().enumerate() {
        let mut ids = tok.encode(d.as_str(), true).unwrap().get_ids().to_vec();
        ids.push(eos);
        if is_held_out(7, i as u64, 0.2) { held.extend(ids) } else { train.extend(ids) }
    }
    assert_eq!(split_tokens(&f.path("out"), Split::Train), train);
    assert_eq!(split_tokens(&f.path("out"), Split::HeldOut), held);
    let m = Manifest::read(&f.path("out")).unwrap();
    assert_eq!(m.eos_id, Some(eos));
    assert_eq!(m.token_width, 2);
    assert_eq!(m.vocab_size, tok.get_vocab_size(true) as u64);
    assert_eq!(m.train.tokens, report.train.tokens);
    assert_eq!(std::fs::read_to_string(f.path("out/tokenizer.json")).unwrap(), tokenizer_json());
    let want = blake3::hash(tokenizer_json().as_bytes()).to_hex().to_string();
    assert_eq!(m.settings.tokenizer_blake3, want);
}

#[test]
fn an_interrupted_preparation_resumes_to_the_same_bytes() {
    let f = Fixture::new();
    let input = f.jsonl("docs.jsonl", &documents());
    let whole = prepare(&f.options("whole", vec![input.clone()])).unwrap();
    let want = files(&f.path("whole"));
    let out = f.path("cut");
    let o = f.options("cut", vec![input]);
    prepare(&o).unwrap();
    // A kill during unit 3: no manifest, unit 2's train shard lost (never synced), the
    // journal's last record half written, a temporary file left.
    std::fs::remove_file(out.join(MANIFEST_FILE)).unwrap();
    std::fs::remove_file(out.join(Split::Train.shard_file(2, 2))).unwrap();
    let journal = std::fs::read_to_string(out.join(outdir::JOURNAL_FILE)).unwrap();
    let mut cut: String = journal.lines().take(5).map(|l| format!("{l}\n")).collect();
    cut.push_str(&journal.lines().nth(5).unwrap()[..10]);
    std::fs::write(out.join(outdir::JOURNAL_FILE), cut).unwrap();
    std::fs::write(out.join("train-00003.u16.tmp"), b"junk").unwrap();
    let resumed = prepare(&o).unwrap();
    assert_eq!(resumed.units_resumed, 2, "units 0 and 1 kept, 2 redone");
    assert!(!resumed.already_finished);
    assert_eq!(files(&out), want);
    assert_eq!((resumed.train, resumed.held_out), (whole.train, whole.held_out));
    // A journal cut after its header alone: everything is redone, to the same bytes.
    std::fs::remove_file(out.join(MANIFEST_FILE)).unwrap();
    std::fs::write(
        out.join(outdir::JOURNAL_FILE),
        format!("{}\n", journal.lines().next().unwrap()),
    )
    .unwrap();
    std::fs::write(out.join(Split::HeldOut.shard_file(0, 2)), b"x").unwrap();
    let again = prepare(&o).unwrap();
    assert_eq!(again.units_resumed, 0);
    assert_eq!(files(&out), want);
    // Finished: a rerun does nothing.
    let noop = prepare(&o).unwrap();
    assert!(noop.already_finished);
    assert_eq!(noop.processed_bytes, 0);
    assert_eq!(noop.units, whole.units);
    assert_eq!(files(&out), want);
}

#[test]
fn other_arguments_into_a_used_directory_are_refused() {
    let f = Fixture::new();
    let input = f.jsonl("docs.jsonl", &documents());
    let o = f.options("out", vec![input.clone()]);
    prepare(&o).unwrap();
    let mut seed = o.clone();
    seed.seed = 8;
    let e = prepare(&seed).unwrap_err().to_string();
    assert!(e.contains("other arguments") && e.contains("seed: 7 there, 8 now"), "{e}");
    // Unfinished too.
    std::fs::remove_file(f.path("out").join(MANIFEST_FILE)).unwrap();
    let mut held = o.clone();
    held.held_out = 0.5;
    let e = prepare(&held).unwrap_err().to_string();
    assert!(e.contains("held-out: 0.2 there, 0.5 now"), "{e}");
    let mut inputs = o.clone();
    inputs.inputs.push(input);
    let e = prepare(&inputs).unwrap_err().to_string();
    assert!(e.contains("inputs:"), "{e}");
    // A directory holding something else.
    std::fs::create_dir(f.path("other")).unwrap();
    std::fs::write(f.path("other/notes.txt"), "mine").unwrap();
    let e = prepare(&f.options("other", o.inputs.clone())).unwrap_err().to_string();
    assert!(e.contains("not empty"), "{e}");
    assert!(std::fs::read_dir(f.path("other")).unwrap().count() == 1, "nothing written there");
}

fn error_of(f: &Fixture, name: &str, content: &[u8]) -> String {
    std::fs::write(f.path(name), content).unwrap();
    let o = f.options(&format!("out-{name}"), vec![f.path(name).display().to_string()]);
    prepare(&o).unwrap_err().to_string()
}

#[test]
fn bad_inputs_name_the_file_the_line_and_what_was_expected() {
    let f = Fixture::new();
    let e = error_of(&f, "a.jsonl", b"{\"text\": \"ok\"}\n\n{\"text\": \"ok\"\n");
    assert!(e.contains("a.jsonl: line 3: not JSON"), "{e}");
    let e = error_of(&f, "b.jsonl", b"{\"text\": \"ok\"}\n{\"body\": \"x\", \"id\": 1}\n");
    assert!(e.contains("b.jsonl: line 2: no field \"text\" (its fields: body, id"), "{e}");
    let e = error_of(&f, "c.jsonl", b"{\"text\": 12}\n");
    assert!(e.contains("c.jsonl: line 1: field \"text\" is a number, expected a string"), "{e}");
    let e = error_of(&f, "d.jsonl", b"[1, 2]\n");
    assert!(e.contains("d.jsonl: line 1: expected a JSON object"), "{e}");
    let e = error_of(&f, "e.txt", b"fine\n\nbad \xff byte\n");
    assert!(e.contains("e.txt: line 3: not UTF-8"), "{e}");
    let e = error_of(&f, "f.csv", b"a,b\n");
    assert!(e.contains("f.csv: unknown kind of input"), "{e}");
    let e = error_of(&f, "g.jsonl.gz", b"not gzip at all");
    assert!(e.contains("g.jsonl.gz: line 1"), "{e}");
    let e = error_of(&f, "h.parquet", b"PAR1 not really");
    assert!(e.contains("h.parquet: not a Parquet file"), "{e}");
    write_parquet(&f.path("i.parquet"), "message m { OPTIONAL BYTE_ARRAY text; }", &[&[Some("x")]]);
    let e = prepare(&f.options("out-i", vec![f.path("i.parquet").display().to_string()]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("i.parquet: column \"text\" is BYTE_ARRAY")
            && e.contains("expected a string column"),
        "{e}"
    );
    write_parquet(&f.path("j.parquet"), STRING_SCHEMA, &[&[Some("a")], &[Some("b"), None]]);
    let e = prepare(&f.options("out-j", vec![f.path("j.parquet").display().to_string()]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("j.parquet: row 2: column \"text\" is null"), "{e}");
    let mut o = f.options("out-k", vec![f.path("j.parquet").display().to_string()]);
    o.field = "body".into();
    let e = prepare(&o).unwrap_err().to_string();
    assert!(e.contains("j.parquet: no column \"body\" (its columns: text"), "{e}");
    let e = prepare(&f.options("out-l", vec![f.path("nothing-*.jsonl").display().to_string()]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("matches at least one file"), "{e}");
    let mut o = f.options("out-m", vec![f.path("j.parquet").display().to_string()]);
    o.eos = Some("<nope>".into());
    let e = prepare(&o).unwrap_err().to_string();
    assert!(e.contains("tokenizer.json: --eos \"<nope>\": no such token"), "{e}");
    o.eos = None;
    o.held_out = 1.0;
    assert!(
        prepare(&o)
            .unwrap_err()
            .to_string()
            .contains("--held-out 1: expected a fraction in [0, 1)")
    );
}

const STRING_SCHEMA: &str =
    "message m { OPTIONAL BYTE_ARRAY text (UTF8); OPTIONAL BYTE_ARRAY other (UTF8); }";

/// A Parquet file of one row group per slice of `groups`; every column gets the same values.
fn write_parquet(path: &Path, schema: &str, groups: &[&[Option<&str>]]) {
    use parquet::data_type::{ByteArray, ByteArrayType};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    let schema = Arc::new(parquet::schema::parser::parse_message_type(schema).unwrap());
    let props = WriterProperties::builder()
        .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
        .build();
    let mut w =
        SerializedFileWriter::new(File::create(path).unwrap(), schema, Arc::new(props)).unwrap();
    for group in groups {
        let mut rg = w.next_row_group().unwrap();
        while let Some(mut col) = rg.next_column().unwrap() {
            let values: Vec<ByteArray> =
                group.iter().flatten().map(|t| ByteArray::from(*t)).collect();
            let defs: Vec<i16> = group.iter().map(|t| i16::from(t.is_some())).collect();
            col.typed::<ByteArrayType>().write_batch(&values, Some(&defs), None).unwrap();
            col.close().unwrap();
        }
        rg.close().unwrap();
    }
    w.close().unwrap();
}

#[test]
fn compressed_and_parquet_inputs_give_the_plain_ones_tokens() {
    let f = Fixture::new();
    let docs = documents();
    let plain = f.jsonl("docs.jsonl", &docs);
    let text = std::fs::read(&plain).unwrap();
    let mut gz = flate2::write::GzEncoder::new(
        File::create(f.path("docs.jsonl.gz")).unwrap(),
        flate2::Compression::default(),
    );
    gz.write_all(&text).unwrap();
    gz.finish().unwrap();
    std::fs::write(f.path("docs.jsonl.zst"), zstd::encode_all(&text[..], 3).unwrap()).unwrap();
    let refs: Vec<Option<&str>> = docs.iter().map(|d| Some(d.as_str())).collect();
    let (a, b) = refs.split_at(100);
    write_parquet(&f.path("docs.parquet"), STRING_SCHEMA, &[a, b]);
    prepare(&f.options("plain", vec![plain])).unwrap();
    let want = shards(&f.path("plain"));
    assert!(want.len() > 4);
    for name in ["docs.jsonl.gz", "docs.jsonl.zst", "docs.parquet"] {
        let out = format!("out-{name}");
        prepare(&f.options(&out, vec![f.path(name).display().to_string()])).unwrap();
        assert_eq!(shards(&f.path(&out)), want, "{name}");
    }
    // Plain text, gzipped, cut by paragraphs: the same documents again.
    let paragraphs = docs.join("\n\n") + "\n";
    let mut gz = flate2::write::GzEncoder::new(
        File::create(f.path("docs.txt.gz")).unwrap(),
        flate2::Compression::fast(),
    );
    gz.write_all(paragraphs.as_bytes()).unwrap();
    gz.finish().unwrap();
    prepare(&f.options("txt", vec![f.path("docs.txt.gz").display().to_string()])).unwrap();
    assert_eq!(shards(&f.path("txt")), want);
}

#[test]
fn text_is_cut_by_line_paragraph_or_file() {
    let f = Fixture::new();
    std::fs::write(f.path("a.txt"), "one\ntwo\n\n  \nthree\r\nfour\n\n").unwrap();
    std::fs::write(f.path("b.txt"), "five\n").unwrap();
    let glob = f.path("*.txt").display().to_string();
    let mut counts = Vec::new();
    for unit in [TextUnit::Line, TextUnit::Paragraph, TextUnit::File] {
        let mut o = f.options(&format!("out-{unit}"), vec![glob.clone()]);
        o.text_unit = unit;
        o.held_out = 0.0;
        let r = prepare(&o).unwrap();
        counts.push(r.documents());
        let tok = tokenizers::Tokenizer::from_bytes(tokenizer_json()).unwrap();
        let docs: &[&str] = match unit {
            TextUnit::Line => &["one", "two", "three", "four", "five"],
            TextUnit::Paragraph => &["one\ntwo", "three\nfour", "five"],
            TextUnit::File => &["one\ntwo\n\n  \nthree\r\nfour\n\n", "five\n"],
        };
        let want: Vec<u32> =
            docs.iter().flat_map(|d| tok.encode(*d, true).unwrap().get_ids().to_vec()).collect();
        assert_eq!(split_tokens(&f.path(&format!("out-{unit}")), Split::Train), want, "{unit}");
    }
    assert_eq!(counts, [5, 3, 2]);
}

#[test]
fn the_loader_reads_a_split_across_shards_and_checks_the_vocabulary() {
    let f = Fixture::new();
    let o = f.options("out", vec![f.jsonl("docs.jsonl", &documents())]);
    prepare(&o).unwrap();
    let dir = f.path("out");
    let m = Manifest::read(&dir).unwrap();
    let vocab = m.vocab_size as u32;
    let seq = 16;
    for split in Split::ALL {
        let stream = split_tokens(&dir, split);
        let mut l =
            DataLoader::prepared(&dir, split, seq, vocab, Shard::WHOLE, Order::Sequential).unwrap();
        assert_eq!(l.sequences(), (stream.len() as u64 - 1) / seq as u64);
        for k in 0..l.sequences() as usize {
            let mut row = Vec::new();
            l.next_sequence_into(&mut row).unwrap();
            let want: Vec<i64> =
                stream[k * seq..=(k + 1) * seq].iter().map(|&t| i64::from(t)).collect();
            assert_eq!(row, want, "{split} sequence {k}");
        }
    }
    // The scenario's `[real] data = "DIR"`: the train split.
    let src = crate::data::DataSource::from_scenario(Some("out"), f.dir.path(), 1);
    assert_eq!(src, crate::data::DataSource::Prepared { dir: dir.clone(), split: Split::Train });
    let file_src = crate::data::DataSource::File(dir.clone());
    let mut a = DataLoader::new(&file_src, seq, vocab, Shard::WHOLE, Order::Sequential).unwrap();
    let mut b = DataLoader::new(&src, seq, vocab, Shard::WHOLE, Order::Sequential).unwrap();
    assert_eq!(a.next_batch(4).unwrap(), b.next_batch(4).unwrap());
    // A model vocabulary smaller than the tokenizer's.
    let e = DataLoader::prepared(&dir, Split::Train, seq, 300, Shard::WHOLE, Order::Sequential)
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, DataError::VocabTooLarge { prepared, model: 300, .. } if prepared == m.vocab_size)
    );
    assert!(
        msg.contains(&dir.display().to_string())
            && msg.contains(&format!("{} tokens", m.vocab_size))
            && msg.contains("300")
            && msg.contains("[model] vocab"),
        "{msg}"
    );
    // A truncated shard, then a corrupt manifest: errors naming the file.
    let shard = dir.join(&m.train.shards[1].file);
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 2]).unwrap();
    let e = DataLoader::prepared(&dir, Split::Train, seq, vocab, Shard::WHOLE, Order::Sequential)
        .unwrap_err()
        .to_string();
    assert!(e.contains(&shard.display().to_string()) && e.contains("truncated"), "{e}");
    std::fs::write(&shard, &bytes).unwrap();
    let manifest = std::fs::read_to_string(dir.join(MANIFEST_FILE)).unwrap();
    for (bad, says) in [
        (manifest[..manifest.len() / 2].to_owned(), "not a manifest"),
        (manifest.replace("\"token_width\": 2", "\"token_width\": 3"), "token_width 3"),
        (manifest.replacen("train-00000.u16", "../train-00000.u16", 1), "expected a file name"),
        (
            manifest.replacen("\"format_version\": 1", "\"format_version\": 9", 1),
            "format_version 9",
        ),
    ] {
        std::fs::write(dir.join(MANIFEST_FILE), &bad).unwrap();
        let e =
            DataLoader::prepared(&dir, Split::Train, seq, vocab, Shard::WHOLE, Order::Sequential)
                .unwrap_err()
                .to_string();
        assert!(e.contains("manifest.json") && e.contains(says), "{e}");
    }
    std::fs::remove_file(dir.join(MANIFEST_FILE)).unwrap();
    let e = DataLoader::prepared(&dir, Split::Train, seq, vocab, Shard::WHOLE, Order::Sequential)
        .unwrap_err()
        .to_string();
    assert!(e.contains("manifest.json: missing"), "{e}");
}

#[test]
fn a_vocabulary_over_65536_writes_u32_tokens() {
    let f = Fixture::new();
    let mut vocab = serde_json::Map::new();
    vocab.insert("[UNK]".into(), 0.into());
    for i in 1..70_000u32 {
        vocab.insert(format!("w{i}"), i.into());
    }
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": { "type": "Whitespace" }, "post_processor": null,
        "decoder": null, "model": { "type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]" }
    });
    std::fs::write(f.path("tokenizer.json"), json.to_string()).unwrap();
    let mut o = f.options("out", vec![f.jsonl("d.jsonl", &["w1 w69999 w65536 zzz".into()])]);
    o.held_out = 0.0;
    prepare(&o).unwrap();
    let m = Manifest::read(&f.path("out")).unwrap();
    assert_eq!((m.token_width, m.vocab_size), (4, 70_000));
    let bytes = std::fs::read(f.path("out/train-00000.u32")).unwrap();
    let ids: Vec<u32> =
        bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    assert_eq!(ids, [1, 69_999, 65_536, 0]);
}
