//! Reading one buffer of a checkpoint (the outer weights, for an export) without the others:
//! verified as [`load`](super::load) verifies it, in the memory of that buffer and one tensor.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use loco_core::digest::Blake3Digest;
use safetensors::tensor::Metadata;
use safetensors::{Dtype, SafeTensorError};

use super::{Buffer, CheckpointError, MODEL_FILE, Meta, check_meta, io_err, list, read_meta};

/// The largest safetensors header read (the safetensors crate's own limit).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One buffer of a checkpoint, read back and verified.
#[derive(Clone)]
pub struct LoadedBuffer {
    /// The checkpoint's directory.
    pub path: PathBuf,
    /// Its metadata.
    pub meta: Meta,
    /// The buffer's values, following [`Meta::layout`].
    pub values: Vec<f32>,
}

impl std::fmt::Debug for LoadedBuffer {
    /// The length, not the values.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedBuffer")
            .field("path", &self.path)
            .field("outer_step", &self.meta.outer_step)
            .field("values", &self.values.len())
            .finish()
    }
}

/// Reads buffer `buffer` of the checkpoint directory `path` and verifies it: the metadata as
/// [`load`](super::load) checks it, the tensor file's header (no tensor the metadata does not
/// list, its length), and each of the buffer's tensors (type F32, shape, digest, finite values).
/// The other buffers' tensors are not read. A checkpoint without that buffer is an error.
pub fn load_buffer(path: &Path, buffer: Buffer) -> Result<LoadedBuffer, CheckpointError> {
    let meta = read_meta(path)?;
    let (total, buffers, expected) = check_meta(path, &meta)?;
    if !buffers.contains(&buffer) {
        return Err(CheckpointError::Meta {
            path: path.join(super::META_FILE),
            what: format!("holds no `{}` buffer (it has {:?})", buffer.name(), meta.buffers),
        });
    }
    let model_path = path.join(MODEL_FILE);
    let st_err = |source| CheckpointError::SafeTensors { path: model_path.clone(), source };
    let tensor_err = |tensor: &str, what: String| CheckpointError::Tensor {
        path: model_path.clone(),
        tensor: tensor.to_string(),
        what,
    };
    let mut f = File::open(&model_path).map_err(io_err(&model_path, "open"))?;
    let len = f.metadata().map_err(io_err(&model_path, "stat"))?.len();
    if len < 8 {
        return Err(st_err(SafeTensorError::HeaderTooSmall));
    }
    let mut size = [0u8; 8];
    f.read_exact(&mut size).map_err(io_err(&model_path, "read"))?;
    let header_len = u64::from_le_bytes(size);
    if header_len > MAX_HEADER_BYTES {
        return Err(st_err(SafeTensorError::HeaderTooLarge));
    }
    let data_start = 8 + header_len;
    if data_start > len {
        return Err(st_err(SafeTensorError::InvalidHeaderLength));
    }
    let mut header = vec![0u8; header_len as usize];
    f.read_exact(&mut header).map_err(io_err(&model_path, "read"))?;
    let header: Metadata = serde_json::from_slice(&header)
        .map_err(|e| st_err(SafeTensorError::InvalidHeaderDeserialization(e)))?;
    if data_start + header.data_len() as u64 != len {
        return Err(st_err(SafeTensorError::MetadataIncompleteBuffer));
    }
    let names: BTreeSet<String> = header.tensors().into_keys().collect();
    if let Some(extra) = names.iter().find(|n| !expected.contains(*n)) {
        return Err(tensor_err(extra, "is in the file but not in meta.json".to_string()));
    }
    let mut values = Vec::with_capacity(total);
    let mut bytes = Vec::new();
    for (param, n) in &meta.layout {
        let name = buffer.tensor_name(param);
        let info = header.info(&name).ok_or_else(|| tensor_err(&name, "missing".to_string()))?;
        if info.dtype != Dtype::F32 {
            return Err(tensor_err(&name, format!("type {:?}, expected F32", info.dtype)));
        }
        if info.shape != [*n] {
            return Err(tensor_err(&name, format!("shape {:?}, expected [{n}]", info.shape)));
        }
        let (start, end) = info.data_offsets;
        bytes.resize(end - start, 0);
        f.seek(SeekFrom::Start(data_start + start as u64))
            .and_then(|_| f.read_exact(&mut bytes))
            .map_err(io_err(&model_path, format!("read tensor {name}")))?;
        let got = Blake3Digest::from_blake3(&blake3::hash(&bytes));
        let want = meta.digests.get(&name).copied();
        if want != Some(got) {
            return Err(CheckpointError::Digest {
                path: model_path.clone(),
                tensor: name,
                expected: want.unwrap_or(got),
                got,
            });
        }
        let at = values.len();
        values.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])));
        if let Some(i) = values[at..].iter().position(|x| !x.is_finite()) {
            let value = values[at + i];
            return Err(CheckpointError::NotFinite {
                path: model_path,
                tensor: name,
                index: i,
                value,
            });
        }
    }
    Ok(LoadedBuffer { path: path.to_path_buf(), meta, values })
}

/// [`load_buffer`] of the newest complete checkpoint of `node` under `dir` (as
/// [`latest`](super::latest) finds it, the node checked against its metadata); `None` when
/// there is none.
pub fn latest_buffer(
    dir: &Path,
    node: &str,
    buffer: Buffer,
) -> Result<Option<LoadedBuffer>, CheckpointError> {
    let Some((_, path)) = list(dir, node)?.pop() else { return Ok(None) };
    let loaded = load_buffer(&path, buffer)?;
    if loaded.meta.node != node {
        return Err(CheckpointError::Meta {
            path: path.join(super::META_FILE),
            what: format!("node is {:?}, expected {node:?}", loaded.meta.node),
        });
    }
    Ok(Some(loaded))
}

#[cfg(test)]
mod tests {
    use super::super::{CheckpointConfig, Checkpointer, Snapshot};
    use super::*;

    fn saved(root: &Path) -> (PathBuf, Snapshot) {
        let n = 1000;
        let v = |k: f32| -> Vec<f32> { (0..n).map(|i| i as f32 * 0.25 + k).collect() };
        let snap = Snapshot {
            outer_step: 5,
            inner_step: 50,
            layout: vec![("a".to_string(), 300), ("b".to_string(), 700)],
            outer: v(1.0),
            params: v(2.0),
            exp_avg: v(3.0),
            ..Snapshot::default()
        };
        let mut ck = Checkpointer::new(CheckpointConfig {
            model: None,
            dir: root.to_path_buf(),
            scenario: "s".into(),
            node: "n0".into(),
            keep: 2,
            remote: None,
        })
        .unwrap();
        ck.save(snap.clone()).unwrap();
        (ck.flush().unwrap().unwrap().path, snap)
    }

    /// Where tensor `name`'s bytes start in the file.
    fn offset(bytes: &[u8], name: &str) -> usize {
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: Metadata = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        8 + n + header.info(name).unwrap().data_offsets.0
    }

    #[test]
    fn one_buffer_reads_back_verified_without_the_others() {
        let root = tempfile::tempdir().unwrap();
        let (path, snap) = saved(root.path());
        let got = load_buffer(&path, Buffer::Outer).unwrap();
        assert_eq!(got.values, snap.outer);
        assert_eq!(got.meta.outer_step, 5);
        assert_eq!(load_buffer(&path, Buffer::Params).unwrap().values, snap.params);
        let newest = latest_buffer(root.path(), "n0", Buffer::Outer).unwrap().unwrap();
        assert_eq!(newest.values, snap.outer);
        assert!(latest_buffer(root.path(), "n1", Buffer::Outer).unwrap().is_none());
        let e = load_buffer(&path, Buffer::Momentum).unwrap_err().to_string();
        assert!(e.contains("holds no `momentum` buffer"), "{e}");

        // A flipped byte in another buffer is not read; in this one, its digest names it.
        let model = path.join(MODEL_FILE);
        let good = std::fs::read(&model).unwrap();
        let mut bad = good.clone();
        bad[offset(&good, "params/b") + 7] ^= 1;
        std::fs::write(&model, &bad).unwrap();
        assert_eq!(load_buffer(&path, Buffer::Outer).unwrap().values, snap.outer);
        let mut bad = good.clone();
        bad[offset(&good, "outer/b") + 7] ^= 1;
        std::fs::write(&model, &bad).unwrap();
        let e = load_buffer(&path, Buffer::Outer).unwrap_err();
        assert!(matches!(&e, CheckpointError::Digest { tensor, .. } if tensor == "outer/b"), "{e}");
        // Truncated, absurd header sizes: errors, not panics.
        for bytes in [
            good[..good.len() - 1].to_vec(),
            good[..4].to_vec(),
            [&u64::MAX.to_le_bytes()[..], &good[8..]].concat(),
            [&(good.len() as u64).to_le_bytes()[..], &good[8..]].concat(),
        ] {
            std::fs::write(&model, &bytes).unwrap();
            let e = load_buffer(&path, Buffer::Outer).unwrap_err();
            assert!(matches!(e, CheckpointError::SafeTensors { .. }), "{e}");
        }
    }
}
