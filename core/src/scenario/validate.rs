//! The second layer: raw values to a [`Scenario`], with the path of the field at fault in every
//! error (the position is added from the path by the caller).
//!
//! Size: one short validator per section of the format, in the order of the reference in
//! [`crate::scenario`], so that the file reads against it.

use super::error::{ErrorKind, FieldPath, PathError};
use super::fields::{
    R, RATE, at_least_one, check_name, conflict, duration, expected, finite_at_least, missing,
    one_of_text, positive_duration, quoted, rate, region_ref, size, unit_interval, varying,
};
use super::raw::{
    RawDiloco, RawLink, RawMesh, RawModel, RawNode, RawReal, RawRegion, RawScalar, RawScenario,
    RawSim, RawStop,
};
use super::units::format_duration;
use super::{
    CollectiveModel, Decay, Device, DilocoSpec, ExecutorKind, LinkSpec, ModelSpec, NetworkMode,
    NodeSpec, Numerics, Precision, Preset, Published, RealSpec, Region, RegionId, Scenario,
    SimSpec, Stop, TcpKind,
};
use crate::codec::{CodecKind, SparseSpec};
use crate::diloco::Mode;
use crate::ids::NodeId;
use crate::mesh::{JoinMode, MeshConfig, RingOrder};
use crate::scenario::STREAMING_FRAGMENTS;
use std::collections::BTreeMap;
use std::time::Duration;

/// The most nodes a scenario may expand to (a typo in `count` must not exhaust memory).
pub(crate) const MAX_NODES: u64 = 65_536;

// ---------------------------------------------------------------------------------------------
// Sections
// ---------------------------------------------------------------------------------------------

pub(crate) fn validate(raw: RawScenario) -> R<Scenario> {
    let root = FieldPath::root();
    let name = match &raw.name {
        Some(n) => check_name(&root.key("name"), n)?,
        None => return Err(missing(&root.key("name"), "the scenario's name, a string")),
    };
    let published = match &raw.published {
        Some(p) => Some(Published::from_name(p).ok_or_else(|| {
            let names: Vec<&str> = Published::ALL.iter().map(|p| p.name()).collect();
            expected(&root.key("published"), one_of_text(&names), quoted(p))
        })?),
        None => None,
    };
    let model = model(raw.model.as_ref())?;
    let diloco = diloco(&raw.diloco.clone().unwrap_or_default())?;
    let regions = regions(&raw.regions)?;
    let (mesh, coordinator_region) = mesh(&raw.mesh.clone().unwrap_or_default(), &regions)?;
    let links = links(&raw.links, &regions)?;
    let (mut nodes, start_given) = nodes(&raw.nodes, &regions)?;
    let mut mesh = mesh;
    if raw.mesh.as_ref().is_none_or(|m| m.compute_timeout.is_none()) {
        // Default: 4 h, or three times the slowest node's inner steps when that is longer.
        let slowest = nodes
            .iter()
            .map(|n| {
                // Saturating: a step time and jitter that pass their own checks may still
                // multiply past what a Duration holds.
                Duration::try_from_secs_f64(n.step_time.as_secs_f64() * (1.0 + n.step_jitter))
                    .unwrap_or(Duration::MAX)
            })
            .max()
            .unwrap_or(Duration::ZERO);
        let compute = slowest.saturating_mul(u32::try_from(diloco.inner_steps).unwrap_or(u32::MAX));
        mesh.compute_timeout = MeshConfig::default().compute_timeout.max(compute.saturating_mul(3));
    }
    check_coverage(&nodes, &links, &regions, coordinator_region)?;
    let stop = stop(raw.stop.as_ref())?;
    let generators = super::churn::Generators {
        failures: &raw.failures,
        diurnal: &raw.diurnal,
        arrivals: &raw.arrivals,
        seed: raw.seed.unwrap_or(0),
        stop_time: stop.time,
    };
    let churn =
        super::churn::churn(&raw.churn, &generators, &mut nodes, &start_given, &regions, &links)?;
    let sim = sim(&raw.sim.clone().unwrap_or_default(), &stop)?;
    let real = real(&raw.real.clone().unwrap_or_default())?;
    Ok(Scenario {
        name,
        description: raw.description,
        seed: raw.seed.unwrap_or(0),
        published,
        model,
        diloco,
        mesh,
        coordinator_region,
        regions,
        links,
        nodes,
        churn,
        stop,
        sim,
        real,
    })
}

fn model(raw: Option<&RawModel>) -> R<ModelSpec> {
    let p = FieldPath::root().key("model");
    let Some(m) = raw else {
        return Err(missing(
            &p,
            r#"a [model] table with preset = "tiny" | "150m" | "1b" | "10b", or the shape fields"#,
        ));
    };
    let preset = match &m.preset {
        Some(name) => Some(Preset::from_name(name).ok_or_else(|| {
            let names: Vec<&str> = Preset::ALL.iter().map(|p| p.name()).collect();
            expected(&p.key("preset"), one_of_text(&names), quoted(name))
        })?),
        None => None,
    };
    let base = preset.map(Preset::spec);
    let size = |key: &str, given: Option<u32>, from_preset: Option<u32>| -> R<u32> {
        match given.or(from_preset) {
            None => Err(missing(&p.key(key), "an integer >= 1 (or set model.preset)")),
            Some(v) => at_least_one(&p.key(key), v),
        }
    };
    let b = base.as_ref();
    let layers = size("layers", m.layers, b.map(|s| s.layers))?;
    let dim = size("dim", m.dim, b.map(|s| s.dim))?;
    let heads = size("heads", m.heads, b.map(|s| s.heads))?;
    let kv_heads = size("kv_heads", m.kv_heads, b.map(|s| s.kv_heads))?;
    let ffn = size("ffn", m.ffn, b.map(|s| s.ffn))?;
    let vocab = size("vocab", m.vocab, b.map(|s| s.vocab))?;
    let seq_len = size("seq_len", m.seq_len, b.map(|s| s.seq_len))?;
    if dim % heads != 0 {
        return Err(if m.heads.is_some() || m.dim.is_none() {
            expected(&p.key("heads"), format!("a divisor of dim ({dim})"), heads)
        } else {
            expected(&p.key("dim"), format!("a multiple of heads ({heads})"), dim)
        });
    }
    if heads % kv_heads != 0 {
        return Err(if m.kv_heads.is_some() || m.heads.is_none() {
            expected(&p.key("kv_heads"), format!("a divisor of heads ({heads})"), kv_heads)
        } else {
            expected(&p.key("heads"), format!("a multiple of kv_heads ({kv_heads})"), heads)
        });
    }
    let rope_theta = match m.rope_theta {
        Some(v) => finite_at_least(&p.key("rope_theta"), v, 0.0, false)?,
        None => b.map_or(super::DEFAULT_ROPE_THETA, |s| s.rope_theta),
    };
    let norm_eps = match m.norm_eps {
        Some(v) => finite_at_least(&p.key("norm_eps"), v, 0.0, false)?,
        None => b.map_or(super::DEFAULT_NORM_EPS, |s| s.norm_eps),
    };
    let spec = ModelSpec {
        preset,
        layers,
        dim,
        heads,
        kv_heads,
        ffn,
        vocab,
        seq_len,
        rope_theta,
        norm_eps,
        tied_embeddings: m.tied_embeddings.or(b.map(|s| s.tied_embeddings)).unwrap_or(false),
    };
    if !spec.counts_fit() {
        return Err(conflict(
            &p,
            "the model is too large: its parameter or flop count overflows 64 bits",
        ));
    }
    Ok(spec)
}

fn diloco(d: &RawDiloco) -> R<DilocoSpec> {
    let p = FieldPath::root().key("diloco");
    let def = DilocoSpec::default();
    let codec = match &d.codec {
        Some(c) => c.parse::<CodecKind>().map_err(|_| {
            let names: Vec<&str> = CodecKind::ALL.iter().map(|k| k.name()).collect();
            expected(&p.key("codec"), one_of_text(&names), quoted(c))
        })?,
        None => def.codec,
    };
    let mode = match &d.mode {
        Some(m) => m.parse::<Mode>().map_err(|_| {
            expected(&p.key("mode"), one_of_text(&["sync", "overlap", "streaming"]), quoted(m))
        })?,
        None => def.mode,
    };
    let (codec, error_feedback) = sparse(&p, d, codec, mode)?;
    let inner_steps =
        at_least_one(&p.key("inner_steps"), d.inner_steps.unwrap_or(def.inner_steps))?;
    let fragments = fragments(&p, mode, d.fragments, inner_steps)?;
    let mix = mix(&p, mode, d.mix, def.mix)?;
    let period = inner_steps / u64::from(fragments);
    let sync_delay = sync_delay(&p, mode, d.sync_delay, period)?;
    let betas = betas(&p, d.betas.as_deref(), def.betas)?;
    let warmup_steps = d.warmup_steps.unwrap_or(def.warmup_steps);
    let decay = decay(&p, d.decay_start, d.decay_steps, warmup_steps)?;
    Ok(DilocoSpec {
        inner_steps,
        mode,
        fragments,
        mix,
        sync_delay,
        codec,
        outer_lr: finite_at_least(
            &p.key("outer_lr"),
            d.outer_lr.unwrap_or(def.outer_lr),
            0.0,
            false,
        )?,
        outer_momentum: unit_interval(
            &p.key("outer_momentum"),
            d.outer_momentum.unwrap_or(def.outer_momentum),
        )?,
        nesterov: d.nesterov.unwrap_or(def.nesterov),
        inner_lr: finite_at_least(
            &p.key("inner_lr"),
            d.inner_lr.unwrap_or(def.inner_lr),
            0.0,
            false,
        )?,
        betas,
        warmup_steps,
        decay,
        weight_decay: finite_at_least(
            &p.key("weight_decay"),
            d.weight_decay.unwrap_or(def.weight_decay),
            0.0,
            true,
        )?,
        grad_clip: finite_at_least(
            &p.key("grad_clip"),
            d.grad_clip.unwrap_or(def.grad_clip),
            0.0,
            true,
        )?,
        z_loss: finite_at_least(&p.key("z_loss"), d.z_loss.unwrap_or(def.z_loss), 0.0, true)?,
        batch_tokens: at_least_one(
            &p.key("batch_tokens"),
            d.batch_tokens.unwrap_or(def.batch_tokens),
        )?,
        segment: segment(&p, d.segment.as_ref())?,
        error_feedback,
    })
}

/// The `sparse` codec's parameters (`sparse_density`, `sparse_chunk`, `sparse_bits`, only with
/// it) and `error_feedback` (only with it, and only in sync mode: the overlapped modes' merges
/// have no place for a residual yet).
fn sparse(
    p: &FieldPath,
    d: &RawDiloco,
    codec: CodecKind,
    mode: Mode,
) -> R<(CodecKind, Option<f64>)> {
    let CodecKind::Sparse(def) = codec else {
        for (key, set) in [
            ("sparse_density", d.sparse_density.is_some()),
            ("sparse_chunk", d.sparse_chunk.is_some()),
            ("sparse_bits", d.sparse_bits.is_some()),
            ("error_feedback", d.error_feedback.is_some_and(|b| b != 0.0)),
        ] {
            if set {
                return Err(conflict(&p.key(key), "applies only with codec = \"sparse\""));
            }
        }
        return Ok((codec, None));
    };
    let chunk = d.sparse_chunk.unwrap_or(def.chunk);
    if !(SparseSpec::MIN_CHUNK..=SparseSpec::MAX_CHUNK).contains(&chunk) {
        let want = format!("an integer in {}..={}", SparseSpec::MIN_CHUNK, SparseSpec::MAX_CHUNK);
        return Err(expected(&p.key("sparse_chunk"), want, chunk));
    }
    let bits = d.sparse_bits.unwrap_or(def.bits);
    if !(2..=8).contains(&bits) {
        return Err(expected(&p.key("sparse_bits"), "an integer in 2..=8", bits));
    }
    let spec = match d.sparse_density {
        Some(x) if x.is_finite() && x > 0.0 && x <= 1.0 => SparseSpec::with_density(chunk, x, bits),
        Some(x) => return Err(expected(&p.key("sparse_density"), "a number in (0, 1]", x)),
        None => SparseSpec::with_density(chunk, def.density(), bits),
    };
    let feedback = match d.error_feedback {
        Some(0.0) => None,
        Some(b) if b.is_finite() && b > 0.0 && b <= 1.0 => Some(b),
        Some(b) => return Err(expected(&p.key("error_feedback"), "a number in [0, 1]", b)),
        None => Some(super::DEFAULT_ERROR_FEEDBACK),
    };
    if feedback.is_some() && mode != Mode::Sync {
        return Err(conflict(
            &p.key("error_feedback"),
            "error feedback runs in sync mode only: set error_feedback = 0 or mode = \"sync\"",
        ));
    }
    Ok((CodecKind::Sparse(spec), feedback))
}

/// `fragments`: streaming DiLoCo's, a divisor of `inner_steps`; 1 in the other modes.
fn fragments(p: &FieldPath, mode: Mode, fragments: Option<u32>, inner_steps: u64) -> R<u32> {
    Ok(match (mode, fragments) {
        (Mode::Streaming, f) => {
            let f = at_least_one(&p.key("fragments"), f.unwrap_or(STREAMING_FRAGMENTS))?;
            if !inner_steps.is_multiple_of(u64::from(f)) {
                return Err(expected(
                    &p.key("fragments"),
                    format!(
                        "a divisor of inner_steps ({inner_steps}): a round is inner_steps / fragments inner steps"
                    ),
                    f,
                ));
            }
            f
        }
        (_, Some(f)) if f != 1 => {
            return Err(expected(
                &p.key("fragments"),
                "1, or mode = \"streaming\" (fragments are streaming DiLoCo's)",
                f,
            ));
        }
        _ => 1,
    })
}

/// `mix`: the weight of the merge in overlap and streaming modes (`def` unless given); none
/// in sync mode.
fn mix(p: &FieldPath, mode: Mode, mix: Option<f64>, def: f64) -> R<f64> {
    Ok(match mix {
        Some(x) if mode == Mode::Sync => {
            return Err(expected(
                &p.key("mix"),
                "no mix with mode = \"sync\" (it weighs the merge of overlap and streaming)",
                x,
            ));
        }
        Some(x) => unit_interval(&p.key("mix"), x)?,
        None => def,
    })
}

/// `sync_delay`: in overlap and streaming modes, a divisor of a round of `period` inner steps
/// (the whole round unless given); none in sync mode.
fn sync_delay(p: &FieldPath, mode: Mode, sync_delay: Option<u64>, period: u64) -> R<u64> {
    Ok(match sync_delay {
        Some(t) if mode == Mode::Sync => {
            return Err(expected(
                &p.key("sync_delay"),
                "no sync_delay with mode = \"sync\" (it shortens the delay of overlap and \
                 streaming)",
                t,
            ));
        }
        Some(t) if t == 0 || !period.is_multiple_of(t) => {
            return Err(expected(
                &p.key("sync_delay"),
                format!(
                    "a divisor of a round ({period} inner steps: inner_steps / fragments), at \
                     least 1"
                ),
                t,
            ));
        }
        Some(t) => t,
        None => period,
    })
}

/// `betas`: two numbers in [0, 1] (`def` unless given).
fn betas(p: &FieldPath, betas: Option<&[f64]>, def: (f64, f64)) -> R<(f64, f64)> {
    Ok(match betas {
        Some(b) if b.len() == 2 => (
            unit_interval(&p.key("betas").index(0), b[0])?,
            unit_interval(&p.key("betas").index(1), b[1])?,
        ),
        Some(b) => {
            return Err(expected(
                &p.key("betas"),
                "two numbers [beta1, beta2]",
                format!("{} numbers", b.len()),
            ));
        }
        None => def,
    })
}

/// `decay_start` and `decay_steps`: both or neither; the decay starts after the warmup.
fn decay(
    p: &FieldPath,
    decay_start: Option<u64>,
    decay_steps: Option<u64>,
    warmup_steps: u64,
) -> R<Option<Decay>> {
    Ok(match (decay_start, decay_steps) {
        (Some(start), Some(steps)) => {
            if start < warmup_steps {
                return Err(expected(
                    &p.key("decay_start"),
                    format!("a step >= warmup_steps ({warmup_steps})"),
                    start,
                ));
            }
            Some(Decay { start, steps: at_least_one(&p.key("decay_steps"), steps)? })
        }
        (Some(_), None) => {
            return Err(missing(
                &p.key("decay_steps"),
                "the length of the decay in inner steps (with decay_start)",
            ));
        }
        (None, Some(_)) => {
            return Err(missing(
                &p.key("decay_start"),
                "the inner step the decay starts at (with decay_steps)",
            ));
        }
        (None, None) => None,
    })
}

/// `segment`: a size above 0, when given.
fn segment(p: &FieldPath, segment: Option<&RawScalar>) -> R<Option<u64>> {
    Ok(match segment {
        Some(s) => {
            let sp = p.key("segment");
            let bytes = size(&sp, s)?;
            if bytes == 0 {
                return Err(expected(&sp, "a size above 0", s));
            }
            Some(bytes)
        }
        None => None,
    })
}

fn regions(raw: &[RawRegion]) -> R<Vec<Region>> {
    let p = FieldPath::root().key("regions");
    if raw.is_empty() {
        return Err(missing(&p, "at least one [[regions]] entry with a name"));
    }
    let mut out: Vec<Region> = Vec::with_capacity(raw.len());
    for (i, r) in raw.iter().enumerate() {
        let np = p.index(i).key("name");
        let name = match &r.name {
            Some(n) => check_name(&np, n)?,
            None => return Err(missing(&np, "the region's name")),
        };
        if let Some(first) = out.iter().position(|o| o.name == name) {
            return Err(PathError::new(
                np,
                ErrorKind::Duplicate { what: "region", name, first: p.index(first).to_string() },
            ));
        }
        // At most as many regions as entries in a parsed file: fits u32 in any real file.
        let id = RegionId(u32::try_from(i).map_err(|_| conflict(&p, "too many regions"))?);
        out.push(Region { id, name });
    }
    Ok(out)
}

fn mesh(m: &RawMesh, regions: &[Region]) -> R<(MeshConfig, RegionId)> {
    let p = FieldPath::root().key("mesh");
    let def = MeshConfig::default();
    let opt_pos = |key: &str, v: &Option<RawScalar>, default: Duration| -> R<Duration> {
        v.as_ref().map_or(Ok(default), |r| positive_duration(&p.key(key), r))
    };
    let heartbeat_interval = opt_pos("heartbeat", &m.heartbeat, def.heartbeat_interval)?;
    let heartbeat_timeout =
        opt_pos("heartbeat_timeout", &m.heartbeat_timeout, def.heartbeat_timeout)?;
    if heartbeat_timeout <= heartbeat_interval {
        let got = m
            .heartbeat_timeout
            .as_ref()
            .map_or(format_duration(heartbeat_timeout), |r| r.to_string());
        return Err(expected(
            &p.key("heartbeat_timeout"),
            format!(
                "a duration longer than mesh.heartbeat ({})",
                format_duration(heartbeat_interval)
            ),
            got,
        ));
    }
    let coordinator_timeout = opt_pos(
        "coordinator_timeout",
        &m.coordinator_timeout,
        heartbeat_timeout.saturating_mul(3),
    )?;
    if coordinator_timeout <= heartbeat_interval {
        let got = m
            .coordinator_timeout
            .as_ref()
            .map_or(format_duration(coordinator_timeout), |r| r.to_string());
        return Err(expected(
            &p.key("coordinator_timeout"),
            format!(
                "a duration longer than mesh.heartbeat ({})",
                format_duration(heartbeat_interval)
            ),
            got,
        ));
    }
    let join_mode = match m.join_mode.as_deref() {
        None => def.join_mode,
        Some("blocking") => JoinMode::Blocking,
        Some("non-blocking") => JoinMode::NonBlocking,
        Some(other) => {
            return Err(expected(
                &p.key("join_mode"),
                one_of_text(&["blocking", "non-blocking"]),
                quoted(other),
            ));
        }
    };
    let ring_order = match m.ring.as_deref() {
        None => def.ring_order,
        Some("measured") => RingOrder::Measured,
        Some("ids") => RingOrder::Ids,
        Some(other) => {
            return Err(expected(&p.key("ring"), one_of_text(&["measured", "ids"]), quoted(other)));
        }
    };
    let coordinator_region = match &m.coordinator_region {
        Some(name) => region_ref(&p.key("coordinator_region"), name, regions)?,
        None => RegionId(0),
    };
    let usize_at_least_one = |key: &str, v: Option<u32>, default: usize| -> R<usize> {
        match v {
            Some(n) => Ok(at_least_one(&p.key(key), n)? as usize),
            None => Ok(default),
        }
    };
    let config = MeshConfig {
        heartbeat_interval,
        heartbeat_timeout,
        barrier_timeout: opt_pos("barrier_timeout", &m.barrier_timeout, def.barrier_timeout)?,
        max_retries: m.max_retries.unwrap_or(def.max_retries),
        join_mode,
        probe_duration: opt_pos("probe", &m.probe, def.probe_duration)?,
        coordinator_timeout,
        rejoin_for: opt_pos("rejoin_for", &m.rejoin_for, coordinator_timeout.saturating_mul(2))?,
        min_members: usize_at_least_one("min_members", m.min_members, def.min_members)?,
        join_window: m
            .join_window
            .as_ref()
            .map_or(Ok(def.join_window), |r| duration(&p.key("join_window"), r))?,
        sync_timeout: opt_pos("sync_timeout", &m.sync_timeout, def.sync_timeout)?,
        state_resend_after: opt_pos(
            "state_resend_after",
            &m.state_resend_after,
            def.state_resend_after,
        )?,
        allreduce_timeout: opt_pos(
            "allreduce_timeout",
            &m.allreduce_timeout,
            def.allreduce_timeout,
        )?,
        retry_backoff: m
            .retry_backoff
            .as_ref()
            .map_or(Ok(def.retry_backoff), |r| duration(&p.key("retry_backoff"), r))?,
        progress_timeout: opt_pos("progress_timeout", &m.progress_timeout, def.progress_timeout)?,
        state_senders: usize_at_least_one("state_senders", m.state_senders, def.state_senders)?,
        // When not given, `validate` raises it to the nodes' compute.
        compute_timeout: opt_pos("compute_timeout", &m.compute_timeout, def.compute_timeout)?,
        ring_order,
        max_queue: usize_at_least_one("max_queue", m.max_queue, def.max_queue)?,
        max_admissions: usize_at_least_one("max_admissions", m.max_admissions, def.max_admissions)?,
        max_update_ratio: m.max_update_ratio.unwrap_or(def.max_update_ratio),
    };
    // The mesh's own rules, for any this function does not check itself.
    config.validate().map_err(|e| conflict(&p, e.to_string()))?;
    Ok((config, coordinator_region))
}

fn links(raw: &[RawLink], regions: &[Region]) -> R<Vec<LinkSpec>> {
    let p = FieldPath::root().key("links");
    let mut out = Vec::with_capacity(raw.len());
    // Which entry serves each direction, for duplicates.
    let mut served: BTreeMap<(RegionId, RegionId), usize> = BTreeMap::new();
    for (i, l) in raw.iter().enumerate() {
        let lp = p.index(i);
        let end = |key: &str, v: &Option<String>| -> R<RegionId> {
            match v {
                Some(name) => region_ref(&lp.key(key), name, regions),
                None => Err(missing(&lp.key(key), "a region name")),
            }
        };
        let from = end("from", &l.from)?;
        let to = end("to", &l.to)?;
        let oneway = l.oneway.unwrap_or(false);
        let bandwidth = match &l.bandwidth {
            Some(b) => varying(&lp.key("bandwidth"), b, rate)?,
            None => return Err(missing(&lp.key("bandwidth"), RATE)),
        };
        let latency = match &l.latency {
            Some(v) => varying(&lp.key("latency"), v, duration)?,
            None => return Err(missing(&lp.key("latency"), r#"a one-way latency like "40ms""#)),
        };
        let jitter =
            l.jitter.as_ref().map_or(Ok(Duration::ZERO), |j| duration(&lp.key("jitter"), j))?;
        let streams = at_least_one(&lp.key("streams"), l.streams.unwrap_or(1))?;
        let mut dirs = vec![(from, to)];
        if !oneway && from != to {
            dirs.push((to, from));
        }
        for dir in dirs {
            if let Some(first) = served.insert(dir, i) {
                let name = format!(
                    "{} -> {}",
                    regions[dir.0.0 as usize].name, regions[dir.1.0 as usize].name
                );
                return Err(PathError::new(
                    lp.key("to"),
                    ErrorKind::Duplicate { what: "link", name, first: p.index(first).to_string() },
                ));
            }
        }
        out.push(LinkSpec { from, to, oneway, bandwidth, latency, jitter, streams });
    }
    Ok(out)
}

/// The nodes, expanded, and for each whether its `start` was written in the file.
fn nodes(raw: &[RawNode], regions: &[Region]) -> R<(Vec<NodeSpec>, Vec<bool>)> {
    let p = FieldPath::root().key("nodes");
    if raw.is_empty() {
        return Err(missing(&p, "at least one [[nodes]] entry"));
    }
    let mut out: Vec<NodeSpec> = Vec::new();
    let mut start_given = Vec::new();
    let mut total: u64 = 0;
    for (i, n) in raw.iter().enumerate() {
        let np = p.index(i);
        let base = match &n.name {
            Some(s) => check_name(&np.key("name"), s)?,
            None => return Err(missing(&np.key("name"), "the node's name")),
        };
        let count = at_least_one(&np.key("count"), n.count.unwrap_or(1))?;
        total += u64::from(count);
        if total > MAX_NODES {
            return Err(expected(
                &np.key("count"),
                format!("at most {MAX_NODES} nodes in all"),
                format!("{count} (making {total})"),
            ));
        }
        let region = match &n.region {
            Some(name) => region_ref(&np.key("region"), name, regions)?,
            None if regions.len() == 1 => RegionId(0),
            None => {
                return Err(missing(
                    &np.key("region"),
                    "a region name (there are several regions)",
                ));
            }
        };
        let gpus = at_least_one(&np.key("gpus"), n.gpus.unwrap_or(1))?;
        let step_time = match &n.step_time {
            Some(s) => positive_duration(&np.key("step_time"), s)?,
            None => {
                return Err(missing(
                    &np.key("step_time"),
                    r#"the time of one inner step, like "22.8s""#,
                ));
            }
        };
        let step_jitter = unit_interval(&np.key("step_jitter"), n.step_jitter.unwrap_or(0.0))?;
        let start =
            n.start.as_ref().map_or(Ok(Duration::ZERO), |s| duration(&np.key("start"), s))?;
        let nic = n.nic.as_ref().map(|r| rate(&np.key("nic"), r)).transpose()?;
        let peak_flops = n
            .peak_flops
            .map(|f| finite_at_least(&np.key("peak_flops"), f, 0.0, false))
            .transpose()?;
        for k in 0..count {
            let name = if count == 1 { base.clone() } else { format!("{base}-{k}") };
            if let Some(first) = out.iter().find(|o| o.name == name) {
                return Err(PathError::new(
                    np.key("name"),
                    ErrorKind::Duplicate {
                        what: "node",
                        name,
                        first: p.index(first.entry).to_string(),
                    },
                ));
            }
            let id = NodeId(u32::try_from(out.len()).map_err(|_| conflict(&p, "too many nodes"))?);
            out.push(NodeSpec {
                id,
                name,
                region,
                gpus,
                step_time,
                step_jitter,
                start,
                nic,
                peak_flops,
                entry: i,
            });
            start_given.push(n.start.is_some());
        }
    }
    Ok((out, start_given))
}

/// Every pair of regions that must talk has a link in each direction.
fn check_coverage(
    nodes: &[NodeSpec],
    links: &[LinkSpec],
    regions: &[Region],
    coord: RegionId,
) -> R<()> {
    // Each region used by nodes: (region, first node, second node), by first appearance.
    let mut used: Vec<(RegionId, usize, Option<usize>)> = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        match used.iter_mut().find(|u| u.0 == n.region) {
            Some(u) if u.2.is_none() => u.2 = Some(i),
            Some(_) => {}
            None => used.push((n.region, i, None)),
        }
    }
    let has = |a: RegionId, b: RegionId| links.iter().any(|l| l.serves(a, b));
    let rname = |r: RegionId| regions[r.0 as usize].name.clone();
    let at_node = |i: usize| FieldPath::root().key("nodes").index(nodes[i].entry).key("region");
    let need = |a: RegionId, b: RegionId, blame: usize, needed_by: &dyn Fn() -> String| -> R<()> {
        for (x, y) in [(a, b), (b, a)] {
            if !has(x, y) {
                return Err(PathError::new(
                    at_node(blame),
                    ErrorKind::NoLink { from: rname(x), to: rname(y), needed_by: needed_by() },
                ));
            }
        }
        Ok(())
    };
    for (k, &(r, first, second)) in used.iter().enumerate() {
        let n1 = &nodes[first].name;
        need(coord, r, first, &|| format!("needed by the coordinator and node {n1:?}"))?;
        if let Some(second) = second {
            let n2 = &nodes[second].name;
            need(r, r, second, &|| format!("needed by nodes {n1:?} and {n2:?}"))?;
        }
        for &(r2, other, _) in &used[..k] {
            let m = &nodes[other].name;
            need(r2, r, first, &|| format!("needed by nodes {m:?} and {n1:?}"))?;
        }
    }
    Ok(())
}

fn stop(raw: Option<&RawStop>) -> R<Stop> {
    let p = FieldPath::root().key("stop");
    let what = "outer_steps = N, time = \"24h\", or both (the run stops at the first reached)";
    let Some(s) = raw else { return Err(missing(&p, format!("a [stop] table with {what}"))) };
    let outer_steps = s.outer_steps.map(|n| at_least_one(&p.key("outer_steps"), n)).transpose()?;
    let time = s.time.as_ref().map(|t| positive_duration(&p.key("time"), t)).transpose()?;
    if outer_steps.is_none() && time.is_none() {
        return Err(missing(&p, what));
    }
    Ok(Stop { outer_steps, time })
}

fn sim(s: &RawSim, stop: &Stop) -> R<SimSpec> {
    let p = FieldPath::root().key("sim");
    let def = SimSpec::default();
    let numerics = match s.numerics.as_deref() {
        None => def.numerics,
        Some("virtual") => Numerics::Virtual,
        Some("real") => Numerics::Real,
        Some(other) => {
            return Err(expected(
                &p.key("numerics"),
                one_of_text(&["virtual", "real"]),
                quoted(other),
            ));
        }
    };
    let duration_limit = match &s.duration_limit {
        Some(raw) => {
            let lp = p.key("duration_limit");
            let d = positive_duration(&lp, raw)?;
            if let Some(t) = stop.time
                && d < t
            {
                return Err(expected(
                    &lp,
                    format!("a limit >= stop.time ({})", format_duration(t)),
                    raw,
                ));
            }
            Some(d)
        }
        None => None,
    };
    let collectives = match s.collectives.as_deref() {
        None => None,
        Some(name) => Some(CollectiveModel::from_name(name).ok_or_else(|| {
            expected(&p.key("collectives"), one_of_text(&CollectiveModel::NAMES), quoted(name))
        })?),
    };
    if collectives == Some(CollectiveModel::Modelled) && numerics == Numerics::Real {
        return Err(expected(
            &p.key("collectives"),
            "\"frames\" with numerics = \"real\" (real values must travel)",
            quoted("modelled"),
        ));
    }
    Ok(SimSpec {
        collectives,
        executor: match s.executor.as_deref() {
            None => None,
            Some(name) => Some(ExecutorKind::from_name(name).ok_or_else(|| {
                expected(&p.key("executor"), one_of_text(&ExecutorKind::NAMES), quoted(name))
            })?),
        },
        tcp: match s.tcp.as_deref() {
            None => def.tcp,
            Some(name) => TcpKind::from_name(name).ok_or_else(|| {
                expected(&p.key("tcp"), one_of_text(&TcpKind::NAMES), quoted(name))
            })?,
        },
        tick: s.tick.as_ref().map(|t| positive_duration(&p.key("tick"), t)).transpose()?,
        numerics,
        elements: at_least_one(&p.key("elements"), s.elements.unwrap_or(def.elements))?,
        duration_limit,
        outer_cost: cost(
            &p.key("outer_cost"),
            s.outer_cost,
            def.outer_cost,
            "seconds per parameter, a number >= 0 like 3.2e-9",
        )?,
        state_prepare_cost: cost(
            &p.key("state_prepare_cost"),
            s.state_prepare_cost,
            def.state_prepare_cost,
            "seconds per byte, a number >= 0 like 1.1e-10",
        )?,
        state_receive_cost: cost(
            &p.key("state_receive_cost"),
            s.state_receive_cost,
            def.state_receive_cost,
            "seconds per byte, a number >= 0 like 3.7e-10",
        )?,
        encode_cost: s
            .encode_cost
            .map(|v| {
                cost(
                    &p.key("encode_cost"),
                    Some(v),
                    0.0,
                    "seconds per value, a number >= 0 like 5.9e-10",
                )
            })
            .transpose()?,
        decode_cost: s
            .decode_cost
            .map(|v| {
                cost(
                    &p.key("decode_cost"),
                    Some(v),
                    0.0,
                    "seconds per value, a number >= 0 like 2.7e-10",
                )
            })
            .transpose()?,
    })
}

/// A `[sim]` cost: a finite number >= 0 (`what` says its unit), `def` when absent.
fn cost(path: &FieldPath, v: Option<f64>, def: f64, what: &str) -> R<f64> {
    match v {
        None => Ok(def),
        Some(v) if v.is_finite() && v >= 0.0 => Ok(v),
        Some(v) => Err(expected(path, what, format!("{v:e}"))),
    }
}

fn real(r: &RawReal) -> R<RealSpec> {
    let p = FieldPath::root().key("real");
    let def = RealSpec::default();
    let device = match r.device.as_deref() {
        None => def.device,
        Some(name) => Device::from_name(name).ok_or_else(|| {
            expected(&p.key("device"), r#""cpu", "cuda" or "cuda:N""#, quoted(name))
        })?,
    };
    let precision = match r.precision.as_deref() {
        None => Precision::default_for(device),
        Some(name) => Precision::from_name(name)
            .ok_or_else(|| expected(&p.key("precision"), r#""f32" or "bf16""#, quoted(name)))?,
    };
    let path_field = |key: &str, v: &Option<String>| -> R<Option<String>> {
        match v {
            Some(s) if s.is_empty() => Err(expected(&p.key(key), "a path", quoted(s))),
            other => Ok(other.clone()),
        }
    };
    let secret_env = match &r.secret_env {
        Some(s) if s.is_empty() || s.contains('=') || s.contains('\0') => {
            return Err(expected(&p.key("secret_env"), "an environment variable name", quoted(s)));
        }
        Some(s) => s.clone(),
        None => def.secret_env,
    };
    if r.checkpoint_remote.is_some() && r.checkpoint_dir.is_none() {
        return Err(missing(
            &p.key("checkpoint_dir"),
            "the local checkpoint directory that checkpoint_remote copies",
        ));
    }
    Ok(RealSpec {
        device,
        precision,
        data: path_field("data", &r.data)?,
        init: path_field("init", &r.init)?,
        eval_every: r.eval_every.unwrap_or(def.eval_every),
        eval_sequences: at_least_one(
            &p.key("eval_sequences"),
            r.eval_sequences.unwrap_or(def.eval_sequences),
        )?,
        micro_batch: at_least_one(&p.key("micro_batch"), r.micro_batch.unwrap_or(def.micro_batch))?,
        seq_len: r.seq_len.map(|s| at_least_one(&p.key("seq_len"), s)).transpose()?,
        checkpoint_dir: path_field("checkpoint_dir", &r.checkpoint_dir)?,
        checkpoint_remote: path_field("checkpoint_remote", &r.checkpoint_remote)?,
        checkpoint_every: at_least_one(
            &p.key("checkpoint_every"),
            r.checkpoint_every.unwrap_or(def.checkpoint_every),
        )?,
        keep: at_least_one(&p.key("keep"), r.keep.unwrap_or(def.keep))?,
        secret_env,
        secret: match &r.secret {
            Some(s) if s.is_empty() => {
                return Err(expected(&p.key("secret"), "a non-empty secret", quoted(s)));
            }
            other => other.clone(),
        },
        roster: path_field("roster", &r.roster)?,
        network: match r.network.as_deref() {
            None => def.network,
            Some(name) => NetworkMode::from_name(name).ok_or_else(|| {
                expected(&p.key("network"), one_of_text(&NetworkMode::NAMES), quoted(name))
            })?,
        },
    })
}
