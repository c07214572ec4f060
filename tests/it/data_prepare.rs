//! `loco data prepare` against Hugging Face's own Python `tokenizers` (the Python of
//! `LOCO_PYTHON`, which `scripts/test.sh` sets up): Python trains a byte-level BPE on Genesis
//! (with a BOS added by its post-processor, as Llama 3's tokenizer does) and encodes each
//! document; the shards `loco data prepare` writes from the same documents, as JSON lines and
//! as Parquet, hold exactly those ids, document after document.

use crate::common::{TestContext, stderr, stdout};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

const PYTHON: &str = r#"
import json, sys
from tokenizers import Tokenizer, models, trainers, pre_tokenizers, decoders, processors
out, text_file = sys.argv[1], sys.argv[2]
lines = [l for l in open(text_file, encoding="utf-8").read().splitlines() if l.strip()]
docs = ["\n".join(lines[i:i + 4]) for i in range(0, 800, 4)]
docs += ["Ünïcode — naïve café, 日本語 🙂", "  leading and trailing spaces  ", "tabs\tand\r\nCRLF"]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=1000, min_frequency=2,
                              special_tokens=["<|endoftext|>", "<bos>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(lines, trainer)
bos = tok.token_to_id("<bos>")
tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos)])
tok.save(out + "/tokenizer.json")
with open(out + "/docs.jsonl", "w", encoding="utf-8") as f:
    for i, d in enumerate(docs):
        f.write(json.dumps({"id": i, "text": d}) + "\n")
json.dump({"docs": docs, "ids": [tok.encode(d).ids for d in docs],
           "vocab": tok.get_vocab_size(), "eos": tok.token_to_id("<|endoftext|>"), "bos": bos},
          open(out + "/expected.json", "w"))
"#;

fn python() -> String {
    std::env::var("LOCO_PYTHON").unwrap_or_else(|_| {
        panic!(
            "LOCO_PYTHON is not set: run the tests through scripts/test.sh (or `source \
             scripts/torch-env.sh` first), which sets it to the Python with Hugging Face's \
             tokenizers that this test compares with"
        )
    })
}

/// A Parquet file with the documents in a string column `text`, in two row groups.
fn write_parquet(path: &Path, docs: &[String]) {
    use parquet::data_type::{ByteArray, ByteArrayType};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    let schema = "message m { REQUIRED BYTE_ARRAY text (UTF8); }";
    let schema = Arc::new(parquet::schema::parser::parse_message_type(schema).unwrap());
    let props = Arc::new(WriterProperties::builder().build());
    let file = std::fs::File::create(path).unwrap();
    let mut w = SerializedFileWriter::new(file, schema, props).unwrap();
    for group in docs.chunks(docs.len() / 2 + 1) {
        let mut rg = w.next_row_group().unwrap();
        let mut col = rg.next_column().unwrap().unwrap();
        let values: Vec<ByteArray> = group.iter().map(|d| ByteArray::from(d.as_str())).collect();
        col.typed::<ByteArrayType>().write_batch(&values, None, None).unwrap();
        col.close().unwrap();
        rg.close().unwrap();
    }
    w.close().unwrap();
}

/// A split's tokens: its shards, as the manifest lists them, concatenated.
fn stream(dir: &Path, split: &str) -> Vec<u32> {
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["token_width"], 2);
    let mut out = Vec::new();
    for shard in manifest[split]["shards"].as_array().unwrap() {
        let bytes = std::fs::read(dir.join(shard["file"].as_str().unwrap())).unwrap();
        assert_eq!(bytes.len() as u64, 2 * shard["tokens"].as_u64().unwrap());
        out.extend(bytes.chunks_exact(2).map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))));
    }
    out
}

#[test]
fn prepared_tokens_are_pythons_ids_document_by_document() {
    let ctx = TestContext::new();
    let tmp = ctx.path();
    let genesis = TestContext::repo().join("data/genesis-kjv.txt");
    let py = Command::new(python())
        .arg("-c")
        .arg(PYTHON)
        .arg(tmp)
        .arg(&genesis)
        .output()
        .expect("run LOCO_PYTHON");
    assert!(py.status.success(), "python: {}", String::from_utf8_lossy(&py.stderr));
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.join("expected.json")).unwrap()).unwrap();
    let docs: Vec<String> = serde_json::from_value(expected["docs"].clone()).unwrap();
    let ids: Vec<Vec<u32>> = serde_json::from_value(expected["ids"].clone()).unwrap();
    let eos = expected["eos"].as_u64().unwrap() as u32;
    let bos = expected["bos"].as_u64().unwrap() as u32;
    assert!(ids.iter().all(|d| d[0] == bos), "Python's post-processor adds the BOS");
    write_parquet(&tmp.join("docs.parquet"), &docs);
    let s = |p: &Path| p.display().to_string();
    let tokenizer = s(&tmp.join("tokenizer.json"));
    let prepare = |input: &str, out: &str, extra: &[&str]| {
        let mut args = vec!["data", "prepare", "--tokenizer", &tokenizer, "--out", out];
        args.extend_from_slice(&["--held-out", "0", "--unit-bytes", "10000"]);
        args.extend_from_slice(extra);
        args.push(input);
        ctx.loco(&args)
    };
    let (jsonl, parquet) = (s(&tmp.join("docs.jsonl")), s(&tmp.join("docs.parquet")));
    let (a, b, c) = (tmp.join("a"), tmp.join("b"), tmp.join("c"));
    // Without eos: the ids, concatenated.
    let o = prepare(&jsonl, &s(&a), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!(
            "documents   {} (train {}, held out 0)",
            docs.len(),
            docs.len()
        )),
        "{}",
        stdout(&o)
    );
    assert_eq!(stream(&a, "train"), ids.concat());
    assert!(stream(&a, "heldout").is_empty());
    // With eos, from JSON lines and from Parquet: each document's ids, then eos.
    for (input, dir) in [(&jsonl, &b), (&parquet, &c)] {
        let o = prepare(input, &s(dir), &["--eos", "<|endoftext|>", "--threads", "2"]);
        assert!(o.status.success(), "{input}: {}", stderr(&o));
        let got = stream(dir, "train");
        let mut at = 0;
        for (i, want) in ids.iter().enumerate() {
            let n = want.len();
            assert_eq!(&got[at..at + n], &want[..], "{input}: document {i}: {:?}", docs[i]);
            assert_eq!(got[at + n], eos, "{input}: eos after document {i}");
            at += n + 1;
        }
        assert_eq!(at, got.len(), "{input}: nothing after the last document");
    }
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(c.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["vocab_size"], expected["vocab"]);
    assert_eq!(manifest["eos_id"], eos);
    assert_eq!(manifest["train"]["documents"], docs.len());
    assert!(manifest["train"]["shards"].as_array().unwrap().len() > 3, "several units");
    assert_eq!(
        std::fs::read(c.join("tokenizer.json")).unwrap(),
        std::fs::read(&tokenizer).unwrap()
    );
    // A rerun of a finished directory does nothing; other arguments are refused (exit 2).
    let o = prepare(&jsonl, &s(&a), &[]);
    assert!(o.status.success() && stdout(&o).contains("already prepared"), "{}", stdout(&o));
    let o = prepare(&jsonl, &s(&a), &["--seed", "5"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("seed: 0 there, 5 now"), "{}", stderr(&o));
    // Bad input: exit 2, naming the file and the line.
    std::fs::write(tmp.join("bad.jsonl"), "{\"text\": \"fine\"}\n{\"txt\": \"oops\"}\n").unwrap();
    let bad = s(&tmp.join("bad.jsonl"));
    let o = prepare(&bad, &s(&tmp.join("d")), &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains(&format!("{bad}: line 2: no field \"text\"")), "{}", stderr(&o));
}

#[test]
fn bench_data_reports_both_runs_and_their_identical_output() {
    let ctx = TestContext::new();
    let o = ctx.loco(&["bench", "data", "--mb", "2", "--vocab", "600", "--threads", "2", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    assert_eq!(v["identical"], true);
    assert!(v["text_bytes"].as_u64().unwrap() >= 2_000_000);
    assert!(v["tokens"].as_u64().unwrap() > 100_000);
    assert_eq!(v["single"]["threads"], 1);
    assert_eq!(v["parallel"]["threads"], 2);
    for run in ["single", "parallel"] {
        let r = &v[run];
        let mbs = r["mb_per_s"].as_f64().unwrap();
        let per = r["mb_per_s_per_thread"].as_f64().unwrap();
        assert!(mbs > 0.0 && (per * r["threads"].as_f64().unwrap() - mbs).abs() < 1e-9 * mbs);
        let secs = r["seconds"].as_f64().unwrap();
        assert!((mbs * secs * 1e6 - v["text_bytes"].as_f64().unwrap()).abs() < 1.0, "{run}: {r}");
    }
    let speedup = v["speedup"].as_f64().unwrap();
    let ratio =
        v["parallel"]["mb_per_s"].as_f64().unwrap() / v["single"]["mb_per_s"].as_f64().unwrap();
    assert!((speedup - ratio).abs() < 1e-9);
    let o = ctx.loco(&["bench", "data", "--mb", "0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--mb"), "{}", stderr(&o));
}

/// `scenarios/tiny-real.toml` on text prepared by `loco data prepare` (a BPE of 1,000 tokens that
/// Python trained on Genesis, one document per line, a tenth held out), evaluating the global
/// weights every 5 outer steps: the held-out loss falls, every node of a step reports the same
/// one, and the summary and the report carry it.
#[cfg(feature = "torch")]
#[test]
fn tiny_real_on_prepared_text_shows_the_held_out_loss_falling() {
    let _turn = crate::common::one_real_run_at_a_time();
    let ctx = TestContext::new();
    let tmp = ctx.path();
    let genesis = TestContext::repo().join("data/genesis-kjv.txt");
    let py = Command::new(python()).arg("-c").arg(PYTHON).arg(tmp).arg(&genesis).output();
    let py = py.expect("run LOCO_PYTHON");
    assert!(py.status.success(), "python: {}", String::from_utf8_lossy(&py.stderr));
    let data = tmp.join("genesis");
    let s = |p: &Path| p.display().to_string();
    let o = ctx.loco(&[
        "data",
        "prepare",
        "--tokenizer",
        &s(&tmp.join("tokenizer.json")),
        "--out",
        &s(&data),
        "--text-unit",
        "line",
        "--held-out",
        "0.1",
        &s(&genesis),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let base = std::fs::read_to_string(TestContext::repo().join("scenarios/tiny-real.toml"));
    let scenario =
        base.unwrap().replace("preset = \"tiny\"", "preset = \"tiny\"\nvocab = 1000").replace(
            "[real]\n",
            &format!("[real]\ndata = {:?}\neval_every = 5\neval_sequences = 24\n", s(&data)),
        );
    let file = tmp.join("tiny-real-text.toml");
    std::fs::write(&file, scenario).unwrap();
    let out = tmp.join("run");
    let o = ctx.loco(&["launch", &s(&file), "--out", &s(&out), "--timeout", "300"]);
    assert!(o.status.success(), "stdout: {}\nstderr: {}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("held-out loss"), "{}", stdout(&o));
    let rows = crate::common::read_csv(&out.join("outer_steps.csv"));
    let mut by_step: std::collections::BTreeMap<u64, Vec<f64>> = Default::default();
    for r in &rows {
        if !r["eval_loss"].is_empty() {
            by_step
                .entry(r["outer_step"].parse().unwrap())
                .or_default()
                .push(r["eval_loss"].parse().unwrap());
        }
    }
    let steps: Vec<u64> = by_step.keys().copied().collect();
    assert_eq!(steps, (0..40).step_by(5).collect::<Vec<u64>>(), "evaluated every 5 steps");
    for (step, losses) in &by_step {
        assert!(losses.iter().all(|l| l == &losses[0]), "step {step}: {losses:?}");
    }
    let first = by_step[&0][0];
    let last = by_step[&35][0];
    // ln(1000) = 6.9 at the start; a model that learned the text is far below it.
    assert!(first > 6.0 && last < first - 1.5, "held-out loss {first} -> {last}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let final_eval = summary["final_eval_loss"].as_f64().expect("final_eval_loss");
    assert!((final_eval - last).abs() < 1e-6, "summary {final_eval}, csv {last}");
    let report = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(report.contains("held-out"), "the report shows the held-out loss");
}
