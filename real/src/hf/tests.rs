use super::*;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::fs;

fn spec(tied: bool) -> ModelSpec {
    ModelSpec {
        preset: None,
        layers: 2,
        dim: 16,
        heads: 4,
        kv_heads: 2,
        ffn: 24,
        vocab: 32,
        seq_len: 8,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        tied_embeddings: tied,
    }
}

/// Distinct, non-trivial values (no two equal), so that a wrong permutation shows.
fn values(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i as f32 + 1.0) * 1e-3 * if i % 3 == 0 { -1.0 } else { 1.0 }).collect()
}

fn export(dir: &Path, spec: &ModelSpec, flat: &[f32], shard: u64) -> Written {
    write(dir, spec, &HfConfig::from_spec(spec), flat, shard).unwrap()
}

fn file_bytes(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (e.file_name().into_string().unwrap(), fs::read(e.path()).unwrap()))
        .collect()
}

#[test]
fn the_permutation_is_meta_s_and_its_inverse_undoes_it() {
    let (heads, hd, cols) = (3, 6, 2);
    let src = values(heads * hd * cols);
    let mut hf = vec![0.0; src.len()];
    permute_rows(&src, &mut hf, heads, hd, cols, Direction::ToHf);
    // w.view(heads, hd/2, 2, cols).transpose(1, 2).reshape(heads * hd, cols), by hand.
    let mut want = Vec::new();
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..hd / 2 {
                let row = h * hd + 2 * i + j;
                want.extend_from_slice(&src[row * cols..(row + 1) * cols]);
            }
        }
    }
    assert_eq!(hf, want);
    let mut back = vec![0.0; src.len()];
    permute_rows(&hf, &mut back, heads, hd, cols, Direction::FromHf);
    assert_eq!(back, src);
}

#[test]
fn names_follow_hugging_face() {
    let p = hf_params(&spec(false));
    assert_eq!(p.len(), 1 + 2 * 9 + 2);
    assert_eq!(p[0].name, "model.embed_tokens.weight");
    assert_eq!(p[1].name, "model.layers.0.input_layernorm.weight");
    assert_eq!(p[2].name, "model.layers.0.self_attn.q_proj.weight");
    assert_eq!(p[2].rope_heads, Some(4));
    assert_eq!(p[3].name, "model.layers.0.self_attn.k_proj.weight");
    assert_eq!(p[3].rope_heads, Some(2));
    assert_eq!(p[3].shape, vec![8, 16]);
    assert_eq!(p[4].rope_heads, None);
    assert_eq!(p[7].name, "model.layers.0.mlp.gate_proj.weight");
    assert_eq!(p[8].name, "model.layers.0.mlp.down_proj.weight");
    assert_eq!(p[9].name, "model.layers.0.mlp.up_proj.weight");
    assert_eq!(p[19].name, "model.norm.weight");
    assert_eq!(p[20].name, "lm_head.weight");
    assert_eq!(p[20].offset + p[20].numel, spec(false).param_count() as usize);
    assert!(hf_params(&spec(true)).iter().all(|p| p.name != "lm_head.weight"));
}

#[test]
fn export_then_import_gives_the_vector_back_exactly_tied_untied_and_sharded() {
    for (tied, shard) in [(false, DEFAULT_SHARD_BYTES), (true, DEFAULT_SHARD_BYTES), (false, 3000)]
    {
        let s = spec(tied);
        let flat = values(s.param_count() as usize);
        let dir = tempfile::tempdir().unwrap();
        let w = export(dir.path(), &s, &flat, shard);
        let m = read(dir.path()).unwrap();
        assert_eq!(m.flat, flat, "tied {tied}, shard {shard}");
        assert_eq!(m.spec, s);
        assert_eq!(m.config, HfConfig::from_spec(&s));
        assert_eq!(w.tensor_bytes, 4 * flat.len() as u64);
        if shard == DEFAULT_SHARD_BYTES {
            assert_eq!(w.shards, 1);
            assert!(dir.path().join(SINGLE_FILE).exists());
            assert!(!dir.path().join(INDEX_FILE).exists());
        } else {
            assert!(w.shards > 2, "{} shards", w.shards);
            assert!(!dir.path().join(SINGLE_FILE).exists());
            let index: serde_json::Value =
                serde_json::from_slice(&fs::read(dir.path().join(INDEX_FILE)).unwrap()).unwrap();
            assert_eq!(index["metadata"]["total_size"], 4 * flat.len() as u64);
            let last = format!("model-{n:05}-of-{n:05}.safetensors", n = w.shards);
            assert_eq!(index["weight_map"]["lm_head.weight"], last);
            assert_eq!(m.files.len(), w.shards);
            // Every shard within the size, but for a tensor larger than it.
            for f in &m.files {
                let bytes = fs::read(f).unwrap();
                let st = SafeTensors::deserialize(&bytes).unwrap();
                let data: usize = st.tensors().iter().map(|(_, t)| t.data().len()).sum();
                assert!(data <= 3000 || st.len() == 1, "{}: {data}", f.display());
            }
        }
    }
}

#[test]
fn the_files_are_what_safetensors_reads_with_hugging_face_shapes_and_the_permuted_rows() {
    let s = spec(false);
    let flat = values(s.param_count() as usize);
    let dir = tempfile::tempdir().unwrap();
    export(dir.path(), &s, &flat, DEFAULT_SHARD_BYTES);
    let bytes = fs::read(dir.path().join(SINGLE_FILE)).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(meta.metadata().as_ref().unwrap()["format"], "pt");
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let p = hf_params(&s);
    let q = st.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.shape(), [16, 16]);
    assert_eq!(q.dtype(), Dtype::F32);
    // Row 1 of head 0 in Hugging Face's layout is loco's row 2 (hd = 4: rows 0 2 1 3).
    let row = |t: &[u8], r: usize| -> Vec<f32> {
        t[r * 64..(r + 1) * 64]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let loco = &flat[p[2].offset..p[2].offset + p[2].numel];
    assert_eq!(row(q.data(), 1), loco[2 * 16..3 * 16]);
    assert_eq!(row(q.data(), 2), loco[16..2 * 16]);
    let v = st.tensor("model.layers.0.self_attn.v_proj.weight").unwrap();
    assert_eq!(row(v.data(), 1), flat[p[4].offset + 16..p[4].offset + 32]);
    let config: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.path().join(CONFIG_FILE)).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "LlamaForCausalLM");
    assert_eq!(config["num_key_value_heads"], 2);
    assert_eq!(config["head_dim"], 4);
    assert_eq!(config["rope_scaling"], serde_json::Value::Null);
    assert_eq!(config["torch_dtype"], "float32");
    assert!(config.get("bos_token_id").is_none());
}

#[test]
fn exports_are_byte_identical_and_a_new_one_replaces_an_old_one_s_files() {
    let s = spec(false);
    let flat = values(s.param_count() as usize);
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    export(a.path(), &s, &flat, 3000);
    export(b.path(), &s, &flat, 3000);
    assert_eq!(file_bytes(a.path()), file_bytes(b.path()));
    // Re-exported in one file over the shards: only the new model remains, no temporary file.
    export(a.path(), &s, &flat, DEFAULT_SHARD_BYTES);
    let names: Vec<String> = file_bytes(a.path()).into_keys().collect();
    assert_eq!(names, [CONFIG_FILE, SINGLE_FILE]);
    assert_eq!(read(a.path()).unwrap().flat, flat);
    // And back to shards.
    export(a.path(), &s, &flat, 3000);
    assert_eq!(file_bytes(a.path()), file_bytes(b.path()));
}

#[test]
fn a_flat_vector_of_the_wrong_length_is_refused() {
    let s = spec(true);
    let dir = tempfile::tempdir().unwrap();
    let e = write(dir.path(), &s, &HfConfig::from_spec(&s), &[0.0; 3], 1 << 20).unwrap_err();
    assert!(matches!(e, HfError::FlatLength { got: 3, .. }), "{e}");
}

#[test]
fn check_spec_names_every_mismatching_field_and_the_key_to_change() {
    let c = HfConfig::from_spec(&spec(false));
    assert_eq!(check_spec(&c, &spec(false)), Ok(()));
    let shorter = ModelSpec { seq_len: 4, ..spec(false) };
    assert_eq!(check_spec(&c, &shorter), Ok(()), "a shorter sequence is fine");
    let other = ModelSpec {
        layers: 3,
        kv_heads: 4,
        rope_theta: 500_000.0,
        tied_embeddings: true,
        seq_len: 16,
        ..spec(false)
    };
    let e = check_spec(&c, &other).unwrap_err();
    let keys: Vec<&str> = e.0.iter().map(|m| m.key).collect();
    assert_eq!(keys, ["layers", "kv_heads", "rope_theta", "tied_embeddings", "seq_len"]);
    let text = e.to_string();
    for part in [
        "[model] layers = 3 but the config's num_hidden_layers = 2: set `layers = 2` in [model]",
        "[model] kv_heads = 4 but the config's num_key_value_heads = 2",
        "[model] rope_theta = 500000 but the config's rope_theta = 10000",
        "set `tied_embeddings = false`",
        "[model] seq_len = 16 exceeds the config's max_position_embeddings = 8",
    ] {
        assert!(text.contains(part), "{part:?} not in {text}");
    }
}

/// Writes a valid export of `spec(false)` and then edits its config.json with `edit`.
fn with_config(edit: impl FnOnce(&mut serde_json::Value)) -> (tempfile::TempDir, HfError) {
    let s = spec(false);
    let dir = tempfile::tempdir().unwrap();
    export(dir.path(), &s, &values(s.param_count() as usize), DEFAULT_SHARD_BYTES);
    let path = dir.path().join(CONFIG_FILE);
    let mut c: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    edit(&mut c);
    fs::write(&path, serde_json::to_vec(&c).unwrap()).unwrap();
    let e = read(dir.path()).unwrap_err();
    (dir, e)
}

#[test]
fn configs_loco_cannot_build_are_refused_naming_the_field() {
    let cases: Vec<(&str, serde_json::Value, &str)> = vec![
        (
            "rope_scaling",
            serde_json::json!({"rope_type": "llama3", "factor": 8.0}),
            "lacks RoPE scaling",
        ),
        ("attention_bias", serde_json::json!(true), "no biases"),
        ("mlp_bias", serde_json::json!(true), "no biases"),
        ("hidden_act", serde_json::json!("gelu"), "SwiGLU"),
        ("model_type", serde_json::json!("mistral"), "loco reads Llama models"),
        ("head_dim", serde_json::json!(8), "hidden_size / num_attention_heads = 4"),
        ("num_key_value_heads", serde_json::json!(3), "heads = 4, expected a multiple of kv_heads"),
        ("rms_norm_eps", serde_json::json!(-1.0), "finite number above 0"),
        ("architectures", serde_json::json!(["MistralForCausalLM"]), "LlamaForCausalLM"),
    ];
    for (field, value, says) in cases {
        let (dir, e) = with_config(|c| c[field] = value.clone());
        let text = e.to_string();
        assert!(matches!(e, HfError::Config { .. }), "{field}: {text}");
        assert!(text.contains(says), "{field}: {text}");
        assert!(text.contains(&dir.path().join(CONFIG_FILE).display().to_string()), "{text}");
    }
    // Hugging Face's defaults: no num_key_value_heads (multi-head), null rope_scaling.
    let (_, e) = with_config(|c| {
        c.as_object_mut().unwrap().remove("hidden_size");
    });
    assert!(e.to_string().contains("hidden_size: missing"), "{e}");
    // A plain RoPE in a scaling's clothes reads.
    let s = spec(false);
    let dir = tempfile::tempdir().unwrap();
    export(dir.path(), &s, &values(s.param_count() as usize), DEFAULT_SHARD_BYTES);
    let path = dir.path().join(CONFIG_FILE);
    let mut c: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    c["rope_scaling"] = serde_json::json!({"rope_type": "default"});
    fs::write(&path, c.to_string()).unwrap();
    assert_eq!(read(dir.path()).unwrap().spec, s);
}

#[test]
fn a_config_with_defaults_left_out_reads() {
    let s = ModelSpec { kv_heads: 4, rope_theta: 10_000.0, norm_eps: 1e-6, ..spec(false) };
    let dir = tempfile::tempdir().unwrap();
    export(dir.path(), &s, &values(s.param_count() as usize), DEFAULT_SHARD_BYTES);
    let minimal = serde_json::json!({
        "model_type": "llama", "hidden_size": 16, "intermediate_size": 24,
        "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 32,
        "max_position_embeddings": 8, "num_key_value_heads": null, "eos_token_id": [1, 2],
    });
    fs::write(dir.path().join(CONFIG_FILE), minimal.to_string()).unwrap();
    let m = read(dir.path()).unwrap();
    assert_eq!(m.spec, s);
    assert_eq!(m.config.eos_token_id, None);
}

/// Writes a safetensors file of `tensors` (name, dtype, shape, bytes) to `dir/model.safetensors`.
fn write_raw(dir: &Path, tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    fs::write(dir.join(SINGLE_FILE), safetensors::serialize(views, Some(meta)).unwrap()).unwrap();
}

/// The tensors of a valid export of `s` with `flat`, as (name, F32, shape, bytes) in loco's
/// layout converted to Hugging Face's.
fn raw_tensors(s: &ModelSpec, flat: &[f32]) -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
    let dir = tempfile::tempdir().unwrap();
    export(dir.path(), s, flat, DEFAULT_SHARD_BYTES);
    let bytes = fs::read(dir.path().join(SINGLE_FILE)).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    hf_params(s)
        .into_iter()
        .map(|p| {
            let t = st.tensor(&p.name).unwrap();
            (p.name, t.dtype(), t.shape().to_vec(), t.data().to_vec())
        })
        .collect()
}

#[test]
fn bf16_and_f16_weights_are_converted_to_f32() {
    let s = spec(true);
    // Values exact in both 16-bit types.
    let flat: Vec<f32> =
        (0..s.param_count() as usize).map(|i| (i % 64) as f32 / 32.0 - 1.0).collect();
    for dtype in [Dtype::BF16, Dtype::F16] {
        let dir = tempfile::tempdir().unwrap();
        let tensors = raw_tensors(&s, &flat)
            .into_iter()
            .map(|(n, _, shape, b)| {
                let b = b
                    .chunks_exact(4)
                    .flat_map(|c| {
                        let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                        match dtype {
                            Dtype::BF16 => half::bf16::from_f32(x).to_le_bytes(),
                            _ => half::f16::from_f32(x).to_le_bytes(),
                        }
                    })
                    .collect();
                (n, dtype, shape, b)
            })
            .collect();
        write_raw(dir.path(), tensors);
        fs::write(
            dir.path().join(CONFIG_FILE),
            serde_json::to_vec(&HfConfig::from_spec(&s)).unwrap(),
        )
        .unwrap();
        assert_eq!(read(dir.path()).unwrap().flat, flat, "{dtype:?}");
    }
}

/// A valid export of `spec(tied)` whose tensors `edit` changes before they are written again;
/// the error reading it.
fn with_tensors(
    tied: bool,
    edit: impl FnOnce(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>),
) -> (tempfile::TempDir, String) {
    let s = spec(tied);
    let dir = tempfile::tempdir().unwrap();
    let flat = values(s.param_count() as usize);
    let mut tensors = raw_tensors(&s, &flat);
    edit(&mut tensors);
    write_raw(dir.path(), tensors);
    fs::write(dir.path().join(CONFIG_FILE), serde_json::to_vec(&HfConfig::from_spec(&s)).unwrap())
        .unwrap();
    let e = read(dir.path()).unwrap_err().to_string();
    assert!(e.contains(&dir.path().join(SINGLE_FILE).display().to_string()), "{e}");
    (dir, e)
}

#[test]
fn wrong_missing_extra_and_non_finite_tensors_are_named() {
    let q = "model.layers.1.self_attn.q_proj.weight";
    let (_, e) = with_tensors(false, |t| t.retain(|x| x.0 != "lm_head.weight"));
    assert!(e.contains("`lm_head.weight`: missing: expected shape [32, 16]"), "{e}");
    assert!(e.contains("tie_word_embeddings = false"), "{e}");
    let (_, e) = with_tensors(true, |t| {
        t.push(("lm_head.weight".into(), Dtype::F32, vec![32, 16], vec![0; 32 * 16 * 4]));
    });
    assert!(
        e.contains("`lm_head.weight`: is stored, but config.json has tie_word_embeddings = true"),
        "{e}"
    );
    let (_, e) = with_tensors(false, |t| {
        t.push(("model.layers.2.mlp.up_proj.weight".into(), Dtype::F32, vec![1], vec![0; 4]));
    });
    assert!(e.contains("`model.layers.2.mlp.up_proj.weight`: is not a parameter"), "{e}");
    let (_, e) = with_tensors(false, |t| {
        let x = t.iter_mut().find(|x| x.0 == q).unwrap();
        x.2 = vec![8, 32];
    });
    assert!(e.contains(&format!("`{q}`: shape [8, 32], expected [16, 16]")), "{e}");
    let (_, e) = with_tensors(false, |t| {
        let x = t.iter_mut().find(|x| x.0 == q).unwrap();
        x.1 = Dtype::I32;
    });
    assert!(e.contains(&format!("`{q}`: type I32: loco reads F32, BF16 or F16")), "{e}");
    let (_, e) = with_tensors(false, |t| {
        let x = t.iter_mut().find(|x| x.0 == q).unwrap();
        x.3[20..24].copy_from_slice(&f32::NAN.to_le_bytes());
    });
    assert!(e.contains(&format!("`{q}`: value 5 is NaN, expected a finite number")), "{e}");
    // RoPE's frequency buffers are ignored.
    let s = spec(false);
    let dir = tempfile::tempdir().unwrap();
    let mut t = raw_tensors(&s, &values(s.param_count() as usize));
    t.push((
        "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
        Dtype::F32,
        vec![2],
        vec![0; 8],
    ));
    write_raw(dir.path(), t);
    fs::write(dir.path().join(CONFIG_FILE), serde_json::to_vec(&HfConfig::from_spec(&s)).unwrap())
        .unwrap();
    assert_eq!(read(dir.path()).unwrap().flat, values(s.param_count() as usize));
}

#[test]
fn corrupt_files_are_errors_naming_them_never_panics() {
    let s = spec(false);
    let flat = values(s.param_count() as usize);
    let dir = tempfile::tempdir().unwrap();
    export(dir.path(), &s, &flat, DEFAULT_SHARD_BYTES);
    let path = dir.path().join(SINGLE_FILE);
    let good = fs::read(&path).unwrap();
    let n = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let mut cases: Vec<(Vec<u8>, &str)> = vec![
        (good[..5].to_vec(), "less than the 8"),
        (good[..good.len() - 1].to_vec(), "truncated: the file has"),
        (good[..8 + n / 2].to_vec(), "truncated: a header of"),
        ([good.clone(), vec![0]].concat(), "trailing bytes"),
        ([&u64::MAX.to_le_bytes()[..], &good[8..]].concat(), "more than the 100000000 allowed"),
        ([&(1u64 << 40).to_le_bytes()[..], &good[8..]].concat(), "more than the"),
    ];
    let mut garbled = good.clone();
    garbled[8..8 + 9].copy_from_slice(b"{\"x\":[1,2");
    cases.push((garbled, "header:"));
    let mut offsets = good.clone();
    let text = String::from_utf8(offsets[8..8 + n].to_vec()).unwrap();
    let moved = text.replacen("\"data_offsets\":[0,", "\"data_offsets\":[4,", 1);
    offsets[8..8 + n].copy_from_slice(moved.as_bytes());
    cases.push((offsets, "header:"));
    for (bytes, says) in cases {
        fs::write(&path, &bytes).unwrap();
        let e = read(dir.path()).unwrap_err().to_string();
        assert!(e.contains(says) && e.contains(&path.display().to_string()), "{says}: {e}");
    }
    fs::remove_file(&path).unwrap();
    let e = read(dir.path()).unwrap_err().to_string();
    assert!(e.contains("model.safetensors: open"), "{e}");
    fs::write(dir.path().join(CONFIG_FILE), b"{not json").unwrap();
    let e = read(dir.path()).unwrap_err().to_string();
    assert!(e.contains("config.json"), "{e}");
}

#[test]
fn a_sharded_index_that_disagrees_with_its_files_is_refused() {
    let s = spec(false);
    let flat = values(s.param_count() as usize);
    let edit = |f: &dyn Fn(&mut serde_json::Value)| -> String {
        let dir = tempfile::tempdir().unwrap();
        export(dir.path(), &s, &flat, 3000);
        let path = dir.path().join(INDEX_FILE);
        let mut index: serde_json::Value =
            serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        f(&mut index);
        fs::write(&path, index.to_string()).unwrap();
        read(dir.path()).unwrap_err().to_string()
    };
    let e = edit(&|i| i["weight_map"]["model.norm.weight"] = "../model.safetensors".into());
    assert!(e.contains("is not a file name in the directory"), "{e}");
    let first = |i: &serde_json::Value| i["weight_map"]["model.embed_tokens.weight"].clone();
    let e = edit(&|i| i["weight_map"]["model.norm.weight"] = first(i));
    assert!(e.contains("`model.norm.weight`: is in this file too"), "{e}");
    let e = edit(&|i| {
        i["weight_map"].as_object_mut().unwrap().remove("model.norm.weight");
    });
    assert!(e.contains("`model.norm.weight`: is in the file but not in"), "{e}");
    let e = edit(&|i| i["weight_map"]["model.layers.9.x"] = first(i));
    assert!(
        e.contains("`model.layers.9.x`: model.safetensors.index.json puts it in this file"),
        "{e}"
    );
}
