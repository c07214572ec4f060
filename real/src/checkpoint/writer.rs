//! Writing checkpoints in the background: the writer thread, its temporary directory, the two
//! renames that install a step and the pruning of old ones.

use super::*;

/// One parameter of one buffer, as a safetensors view (bytes made on demand, one at a time).
struct F32View<'a> {
    data: &'a [f32],
    shape: [usize; 1],
}

impl View for F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        let mut out = Vec::with_capacity(self.data.len() * 4);
        for x in self.data {
            out.extend_from_slice(&x.to_le_bytes());
        }
        Cow::Owned(out)
    }
    fn data_len(&self) -> usize {
        self.data.len() * 4
    }
}

/// What a finished background save did.
#[derive(Debug)]
pub struct Saved {
    /// The creation counter of the checkpoint.
    pub counter: u64,
    /// Its outer step.
    pub outer_step: u64,
    /// The complete local checkpoint directory.
    pub path: PathBuf,
    /// Bytes written locally (tensor file and metadata).
    pub bytes: u64,
    /// Older local and remote checkpoints deleted to keep the last `keep`.
    pub removed: Vec<PathBuf>,
    /// The complete remote copy, when a remote is configured and the copy succeeded.
    pub remote: Option<PathBuf>,
    /// Failures after the local checkpoint was complete (remote copy, deleting old ones): the
    /// local checkpoint is good, but these need reporting.
    pub problems: Vec<CheckpointError>,
}

/// What [`Checkpointer::save`] did before returning.
#[derive(Debug)]
pub struct SaveTicket {
    /// The creation counter the new checkpoint will carry.
    pub counter: u64,
    /// Whether `save` had to wait for the previous save to finish writing.
    pub waited: bool,
    /// The outcome of the previous save, when it had not been collected yet.
    pub previous: Option<Result<Saved, CheckpointError>>,
}

struct Running {
    outer_step: u64,
    handle: JoinHandle<Result<Saved, CheckpointError>>,
}

/// A test-only latch that holds the writer before it touches the disk.
#[cfg(test)]
pub(super) type Gate = std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>;

/// Writes one node's checkpoints in the background, one at a time (see the module docs).
///
/// Dropping a `Checkpointer` waits for the save in flight (logging its outcome); call
/// [`flush`](Checkpointer::flush) before exiting to see it.
pub struct Checkpointer {
    cfg: CheckpointConfig,
    next_counter: u64,
    running: Option<Running>,
    #[cfg(test)]
    pub(super) gate: Option<Gate>,
}

impl fmt::Debug for Checkpointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpointer")
            .field("cfg", &self.cfg)
            .field("next_counter", &self.next_counter)
            .field("in_flight", &self.running.as_ref().map(|r| r.outer_step))
            .finish()
    }
}

impl Checkpointer {
    /// Validates `cfg`, creates `dir/<node>`, deletes `*.tmp*` directories left there (and in the
    /// remote, if it can be read) by a crash, and continues the creation counter after the highest
    /// one found.
    /// Only one `Checkpointer` may use a node's directory at a time.
    pub fn new(cfg: CheckpointConfig) -> Result<Checkpointer, CheckpointError> {
        cfg.validate()?;
        let local = cfg.dir.join(&cfg.node);
        fs::create_dir_all(&local).map_err(io_err(&local, "create directory"))?;
        let mut max_counter = clean_and_scan(&local)?;
        if let Some(remote) = &cfg.remote {
            // The remote may be a mount that is down for now: its copies are a bonus, so a failure
            // to scan it is logged, and the copy will report its own error when it runs.
            match clean_and_scan(&remote.join(&cfg.node)) {
                Ok(c) => max_counter = max_counter.max(c),
                Err(e) => tracing::warn!("checkpoint: remote: {e}"),
            }
        }
        Ok(Checkpointer {
            cfg,
            next_counter: max_counter + 1,
            running: None,
            #[cfg(test)]
            gate: None,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CheckpointConfig {
        &self.cfg
    }

    /// Whether a save is still being written (its outcome not yet available).
    pub fn in_flight(&self) -> bool {
        self.running.as_ref().is_some_and(|r| !r.handle.is_finished())
    }

    /// Starts writing `snapshot` in the background and returns. If the previous save is still
    /// being written, waits for it first (see the module docs for why it never skips); its
    /// outcome is returned in [`SaveTicket::previous`]. An inconsistent snapshot is an error at
    /// once, and nothing is written.
    pub fn save(&mut self, snapshot: Snapshot) -> Result<SaveTicket, CheckpointError> {
        snapshot.validate()?;
        let waited = self.in_flight();
        if waited {
            tracing::info!(
                node = %self.cfg.node,
                outer_step = snapshot.outer_step,
                "checkpoint: waiting for the previous save to finish writing"
            );
        }
        let previous = self.wait();
        let counter = self.next_counter;
        self.next_counter += 1;
        let cfg = self.cfg.clone();
        let outer_step = snapshot.outer_step;
        #[cfg(test)]
        let gate = self.gate.clone();
        // An OS thread rather than a tokio task: the writer does seconds to minutes of blocking
        // hashing and file I/O, must make progress whether or not the caller is inside a runtime
        // (tests, shutdown), and is joined explicitly (wait, flush, Drop). Real backend only.
        #[allow(clippy::disallowed_methods)]
        let handle = std::thread::Builder::new()
            .name(format!("checkpoint-{}", cfg.node))
            .spawn(move || {
                #[cfg(test)]
                if let Some(g) = gate {
                    let (lock, cv) = &*g;
                    let mut open = lock.lock().unwrap_or_else(|e| e.into_inner());
                    while !*open {
                        open = cv.wait(open).unwrap_or_else(|e| e.into_inner());
                    }
                }
                write_job(&cfg, counter, &snapshot)
            })
            .map_err(io_err(&self.cfg.dir, "start the checkpoint writer thread"))?;
        self.running = Some(Running { outer_step, handle });
        Ok(SaveTicket { counter, waited, previous })
    }

    /// The outcome of the save in flight if it has finished; `None` if none is running or it is
    /// still writing.
    pub fn poll(&mut self) -> Option<Result<Saved, CheckpointError>> {
        if self.in_flight() { None } else { self.wait() }
    }

    /// Waits for the save in flight and returns its outcome; `None` if there is none.
    pub fn wait(&mut self) -> Option<Result<Saved, CheckpointError>> {
        let Running { outer_step, handle } = self.running.take()?;
        let outcome = handle.join().unwrap_or(Err(CheckpointError::WriterPanicked { outer_step }));
        match &outcome {
            Ok(s) => {
                tracing::info!(node = %self.cfg.node, outer_step, path = %s.path.display(), "checkpoint written");
                for p in &s.problems {
                    tracing::warn!(node = %self.cfg.node, outer_step, "checkpoint: {p}");
                }
            }
            Err(e) => tracing::error!(node = %self.cfg.node, outer_step, "checkpoint failed: {e}"),
        }
        Some(outcome)
    }

    /// Waits for the save in flight; an error if it failed or had a [problem](Saved::problems).
    /// Call before exiting.
    pub fn flush(&mut self) -> Result<Option<Saved>, CheckpointError> {
        match self.wait() {
            None => Ok(None),
            Some(Err(e)) => Err(e),
            Some(Ok(mut s)) => match s.problems.is_empty() {
                true => Ok(Some(s)),
                false => Err(s.problems.remove(0)),
            },
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        // `wait` logs the outcome; a dropped checkpointer never abandons a write half-way.
        let _ = self.wait();
    }
}

/// Deletes `*.tmp*` checkpoint directories under `node_dir` and returns the highest creation
/// counter seen (in `meta.json` of complete checkpoints and in `.tmp-<counter>` names).
fn clean_and_scan(node_dir: &Path) -> Result<u64, CheckpointError> {
    #[derive(Deserialize)]
    struct CounterOnly {
        counter: u64,
    }
    let entries = match fs::read_dir(node_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_err(node_dir, "list directory")(e)),
    };
    let mut max = 0;
    let mut stale = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err(node_dir, "list directory"))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if parse_step_dir(name).is_some() {
            let meta = entry.path().join(META_FILE);
            let parsed =
                fs::read(&meta).ok().and_then(|t| serde_json::from_slice::<CounterOnly>(&t).ok());
            match parsed {
                Some(c) => max = max.max(c.counter),
                None => tracing::warn!(path = %meta.display(), "checkpoint: unreadable counter"),
            }
        } else if name.starts_with("step-") && name.contains(".tmp") {
            if let Some(c) = name.rsplit('-').next().and_then(|c| c.parse::<u64>().ok()) {
                max = max.max(c);
            }
            stale.push(entry.path());
        }
    }
    // A crash between the two renames of `install` left a step only in its `*.tmp-replaced-*`
    // directory: that directory was the complete step, so it is put back, not deleted.
    for (step, old) in orphaned_replacements(node_dir)? {
        let dst = node_dir.join(step_dir_name(step));
        tracing::warn!(path = %old.display(), "checkpoint: restoring a step a crash left mid-replacement");
        fs::rename(&old, &dst).map_err(io_err(&old, format!("rename to {}", dst.display())))?;
        sync_path(node_dir)?;
        stale.retain(|p| p != &old);
    }
    stale.sort();
    for p in stale {
        tracing::warn!(path = %p.display(), "checkpoint: deleting an incomplete checkpoint left by a crash");
        remove_any(&p)?;
    }
    Ok(max)
}

fn remove_any(p: &Path) -> Result<(), CheckpointError> {
    let r = if p.is_dir() { fs::remove_dir_all(p) } else { fs::remove_file(p) };
    r.map_err(io_err(p, "delete"))
}

fn sync_path(p: &Path) -> Result<(), CheckpointError> {
    File::open(p).and_then(|f| f.sync_all()).map_err(io_err(p, "fsync"))
}

/// The background job: write locally, prune, copy to the remote, prune there.
fn write_job(
    cfg: &CheckpointConfig,
    counter: u64,
    snap: &Snapshot,
) -> Result<Saved, CheckpointError> {
    let node_dir = cfg.dir.join(&cfg.node);
    let step_name = step_dir_name(snap.outer_step);
    let tmp = node_dir.join(format!("{step_name}.tmp-{counter}"));
    // A diverged state is refused before anything is written: resuming from it would restart the
    // divergence, and it would push an older good checkpoint out of the last `keep`.
    if let Some((tensor, index, value)) = snap.first_non_finite() {
        let path = node_dir.join(&step_name).join(MODEL_FILE);
        return Err(CheckpointError::NotFinite { path, tensor, index, value });
    }
    let written = write_local(cfg, counter, snap, &node_dir, &tmp);
    let bytes = match written {
        Ok(b) => b,
        Err(e) => {
            if tmp.exists()
                && let Err(c) = remove_any(&tmp)
            {
                tracing::warn!("checkpoint: cleaning up after a failed save: {c}");
            }
            return Err(e);
        }
    };
    let path = node_dir.join(&step_name);
    let mut saved = Saved {
        counter,
        outer_step: snap.outer_step,
        path: path.clone(),
        bytes,
        removed: Vec::new(),
        remote: None,
        problems: Vec::new(),
    };
    match prune(&node_dir, cfg.keep, &path) {
        Ok(r) => saved.removed.extend(r),
        Err(e) => saved.problems.push(e),
    }
    if let Some(remote) = &cfg.remote {
        let remote_node = remote.join(&cfg.node);
        match copy_to(&path, &remote_node, &step_name, counter) {
            Ok(p) => {
                match prune(&remote_node, cfg.keep, &p) {
                    Ok(r) => saved.removed.extend(r),
                    Err(e) => saved.problems.push(e),
                }
                saved.remote = Some(p);
            }
            Err(e) => saved.problems.push(e),
        }
    }
    Ok(saved)
}

/// Writes the tensors and metadata into `tmp`, syncs, and renames it into place. Returns the
/// bytes written.
pub(super) fn write_local(
    cfg: &CheckpointConfig,
    counter: u64,
    snap: &Snapshot,
    node_dir: &Path,
    tmp: &Path,
) -> Result<u64, CheckpointError> {
    fs::create_dir_all(node_dir).map_err(io_err(node_dir, "create directory"))?;
    fs::create_dir(tmp).map_err(io_err(tmp, "create directory"))?;

    let present = snap.present();
    let mut tensors = Vec::with_capacity(present.len() * snap.layout.len());
    for &b in &present {
        let v = snap.buffer(b);
        let mut at = 0;
        for (name, n) in &snap.layout {
            let end = at + n;
            if let Some(data) = v.get(at..end) {
                tensors.push((b.tensor_name(name), F32View { data, shape: [*n] }));
            }
            at = end;
        }
    }
    let model = tmp.join(MODEL_FILE);
    let info = HashMap::from([("format".to_string(), format!("{FORMAT} v{FORMAT_VERSION}"))]);
    safetensors::serialize_to_file(tensors, Some(info), &model).map_err(|e| match e {
        SafeTensorError::IoError(source) => {
            CheckpointError::Io { path: model.clone(), op: "write".into(), source }
        }
        source => CheckpointError::SafeTensors { path: model.clone(), source },
    })?;
    sync_path(&model)?;
    let model_len = fs::metadata(&model).map_err(io_err(&model, "stat"))?.len();

    let meta = Meta {
        format: FORMAT.to_string(),
        format_version: FORMAT_VERSION,
        scenario: cfg.scenario.clone(),
        node: cfg.node.clone(),
        outer_step: snap.outer_step,
        inner_step: snap.inner_step,
        counter,
        data_position: snap.data_position.clone(),
        layout: snap.layout.clone(),
        buffers: present,
        digests: snap.digests(),
        model: cfg.model.clone(),
    };
    let meta_path = tmp.join(META_FILE);
    let mut text = serde_json::to_vec_pretty(&meta)
        .map_err(|source| CheckpointError::MetaJson { path: meta_path.clone(), source })?;
    text.push(b'\n');
    let mut f = File::create(&meta_path).map_err(io_err(&meta_path, "create"))?;
    f.write_all(&text).map_err(io_err(&meta_path, "write"))?;
    f.sync_all().map_err(io_err(&meta_path, "fsync"))?;
    drop(f);
    sync_path(tmp)?;

    install(tmp, &node_dir.join(step_dir_name(snap.outer_step)), counter)?;
    Ok(model_len + text.len() as u64)
}

/// Renames the complete directory `tmp` to `dst`, replacing an existing `dst`, and syncs the parent.
fn install(tmp: &Path, dst: &Path, counter: u64) -> Result<(), CheckpointError> {
    let parent = dst.parent().unwrap_or(Path::new("."));
    let mut replaced = None;
    if dst.exists() {
        let name = dst.file_name().and_then(|n| n.to_str()).unwrap_or("step");
        let old = parent.join(format!("{name}.tmp-replaced-{counter}"));
        fs::rename(dst, &old).map_err(io_err(dst, format!("rename to {}", old.display())))?;
        replaced = Some(old);
    }
    fs::rename(tmp, dst).map_err(io_err(tmp, format!("rename to {}", dst.display())))?;
    sync_path(parent)?;
    if let Some(old) = replaced {
        remove_any(&old)?;
        sync_path(parent)?;
    }
    Ok(())
}

/// Copies the complete checkpoint `src` to `node_dir/step_name` with the same protocol.
fn copy_to(
    src: &Path,
    node_dir: &Path,
    step_name: &str,
    counter: u64,
) -> Result<PathBuf, CheckpointError> {
    fs::create_dir_all(node_dir).map_err(io_err(node_dir, "create directory"))?;
    let tmp = node_dir.join(format!("{step_name}.tmp-{counter}"));
    let result = (|| {
        fs::create_dir(&tmp).map_err(io_err(&tmp, "create directory"))?;
        for f in [MODEL_FILE, META_FILE] {
            let (from, to) = (src.join(f), tmp.join(f));
            fs::copy(&from, &to).map_err(io_err(&from, format!("copy to {}", to.display())))?;
            sync_path(&to)?;
        }
        sync_path(&tmp)?;
        let dst = node_dir.join(step_name);
        install(&tmp, &dst, counter)?;
        Ok(dst)
    })();
    if result.is_err()
        && tmp.exists()
        && let Err(c) = remove_any(&tmp)
    {
        tracing::warn!("checkpoint: cleaning up after a failed remote copy: {c}");
    }
    result
}

/// Deletes the oldest complete checkpoints under `node_dir` until `keep` remain, never `keep_this`.
fn prune(node_dir: &Path, keep: usize, keep_this: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let all = list_node_dir(node_dir)?;
    let excess = all.len().saturating_sub(keep);
    let mut removed = Vec::new();
    for (_, p) in all {
        if removed.len() == excess {
            break;
        }
        if p == keep_this {
            continue;
        }
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("step").to_string();
        let doomed = node_dir.join(format!("{name}.tmp-deleted"));
        // Renamed first, so that a crash mid-delete leaves a `*.tmp*` directory, never a
        // `step-<N>` that looks complete but is not.
        fs::rename(&p, &doomed).map_err(io_err(&p, format!("rename to {}", doomed.display())))?;
        remove_any(&doomed)?;
        removed.push(p);
    }
    if !removed.is_empty() {
        sync_path(node_dir)?;
    }
    Ok(removed)
}
