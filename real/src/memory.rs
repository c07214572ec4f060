//! How much memory training a model needs, computed from its shape alone (nothing is
//! allocated), to refuse a run that cannot fit before it starts. Needs no libtorch.
//!
//! # What is counted
//!
//! On the training device (the CPU or one CUDA device):
//! - weights: fp32 master copy, 4 bytes per parameter;
//! - gradients: fp32, 4 bytes per parameter;
//! - AdamW state: two fp32 moments, 8 bytes per parameter;
//! - activations kept for the backward pass of one micro-batch of `micro_batch x seq_len` tokens,
//!   in the compute precision `e` bytes: per token and layer `10 dim + 4 ffn + 2 kv_dim` values
//!   (norm inputs and outputs, q/k/v after RoPE with k and v expanded to every query head,
//!   attention output, the SwiGLU gate, up and product), plus the logits, their log-softmax and
//!   their gradient, `3 vocab` fp32 values per token (flash-style attention: no `seq^2` term);
//! - optimizer temporaries: three fp32 copies of the largest parameter tensor (AdamW's
//!   intermediate tensors).
//!
//! On the host, always: the DiLoCo outer state (outer weights, pseudo-gradient, Nesterov
//! momentum: 3 x 4 bytes per parameter, `loco_core::diloco::OuterState`) and the flat fp32 copy
//! of the inner weights the pseudo-gradient is computed from (4 bytes per parameter).
//!
//! Not counted: libtorch's own runtime (hundreds of MiB; more with CUDA), allocator
//! fragmentation, and the transport's buffers. Treat the totals as a lower bound.

use crate::model::{ModelSpec, Precision};
use loco_core::scenario::Device;
use std::fmt;

/// Where memory is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Place {
    /// Host memory.
    Host,
    /// The memory of CUDA device `i`.
    Cuda(u32),
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Host => f.write_str("cpu"),
            Place::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl From<Device> for Place {
    fn from(d: Device) -> Place {
        match d {
            Device::Cpu => Place::Host,
            Device::Cuda(i) => Place::Cuda(i),
        }
    }
}

/// One use of memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryItem {
    /// What it holds.
    pub what: &'static str,
    /// Where.
    pub place: Place,
    /// How many bytes.
    pub bytes: u64,
}

/// The memory one node needs to train a model (see the module docs for what is counted).
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryPlan {
    /// The model: its preset's name, or `a custom model`.
    pub model: String,
    /// Its parameter count.
    pub params: u64,
    /// The training device.
    pub device: Device,
    /// Rows per micro-batch.
    pub micro_batch: u32,
    /// Tokens per row.
    pub seq_len: u32,
    /// Devices the node trains on (`gpus`): with more than one, the items on the device are
    /// what *each* device needs ([`MemoryPlan::sharded`]).
    pub devices: u32,
    /// Every use, device first, then host.
    pub items: Vec<MemoryItem>,
}

/// What [`MemoryPlan::fits`] answers when the plan does not fit: its `Display` is the message.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryShortfall {
    /// The plan.
    pub plan: MemoryPlan,
    /// Where it does not fit.
    pub place: Place,
    /// Bytes available there.
    pub available: u64,
}

impl MemoryPlan {
    /// The plan for training `spec` on `device` with micro-batches of `micro_batch` rows of
    /// `seq_len` tokens, computing in `precision`.
    pub fn new(
        spec: &ModelSpec,
        device: Device,
        micro_batch: u32,
        seq_len: u32,
        precision: Precision,
    ) -> MemoryPlan {
        let n = spec.param_count();
        let d = u64::from(spec.dim);
        let kv = u64::from(spec.kv_heads) * u64::from(spec.head_dim());
        let f = u64::from(spec.ffn);
        let v = u64::from(spec.vocab);
        let tokens = u64::from(micro_batch) * u64::from(seq_len);
        let per_token = u64::from(spec.layers)
            .saturating_mul((10 * d + 4 * f + 2 * kv) * precision.bytes())
            .saturating_add(3 * v * 4)
            .saturating_add(3 * d * 4);
        // The largest tensor: the embedding (vocab x dim), an FFN matrix or wq/wo (dim x dim).
        let largest = v.saturating_mul(d).max(d.saturating_mul(f)).max(d.saturating_mul(d));
        let at = Place::from(device);
        let item = |what, place, bytes| MemoryItem { what, place, bytes };
        let mut items = vec![
            item("weights", at, n.saturating_mul(4)),
            item("gradients", at, n.saturating_mul(4)),
            item("AdamW state", at, n.saturating_mul(8)),
            item("activations", at, tokens.saturating_mul(per_token)),
            item("optimizer temporaries", at, largest.saturating_mul(12)),
        ];
        items.extend(host_items(n));
        let model = model_name(spec);
        MemoryPlan { model, params: n, device, micro_batch, seq_len, devices: 1, items }
    }

    /// The plan of a node of `gpus` devices: [`MemoryPlan::new`] for one, [`MemoryPlan::sharded`]
    /// for more.
    pub fn for_node(
        spec: &ModelSpec,
        device: Device,
        gpus: u32,
        micro_batch: u32,
        seq_len: u32,
        precision: Precision,
    ) -> MemoryPlan {
        if gpus > 1 {
            MemoryPlan::sharded(spec, device, gpus, micro_batch, seq_len, precision)
        } else {
            MemoryPlan::new(spec, device, micro_batch, seq_len, precision)
        }
    }

    /// The plan of the sharded trainer over `gpus` devices (`loco_real::sharded`, ZeRO-3
    /// style), per device: its `1/gpus` of the fp32 weights, of their gradient and of AdamW's
    /// moments (the largest shard); one unit gathered at a time (the embedding, a block, or the
    /// head, see [`gathered_unit_bytes`]); the activation checkpoints (each
    /// block's input, `layers x dim` values per token); the activations of the one unit being
    /// recomputed (a block's, as in [`MemoryPlan::new`] for one layer, or the head's logits);
    /// and AdamW's temporaries over one chunk of [`ADAM_CHUNK`] values. On the host, the
    /// outer state and the flat inner copy as in [`MemoryPlan::new`]. With `device` the CPU,
    /// the devices are threads over host memory, and the host holds every device's share.
    pub fn sharded(
        spec: &ModelSpec,
        device: Device,
        gpus: u32,
        micro_batch: u32,
        seq_len: u32,
        precision: Precision,
    ) -> MemoryPlan {
        let g = u64::from(gpus.max(1));
        let n = spec.param_count();
        let shard = n.div_ceil(g);
        let e = precision.bytes();
        let d = u64::from(spec.dim);
        let kv = u64::from(spec.kv_heads) * u64::from(spec.head_dim());
        let f = u64::from(spec.ffn);
        let v = u64::from(spec.vocab);
        let tokens = u64::from(micro_batch) * u64::from(seq_len);
        let unit = gathered_unit_bytes(spec, device, gpus.max(1), e);
        let block_acts = (10 * d + 4 * f + 2 * kv) * e;
        let head_acts = 3 * v * 4 + 3 * d * 4;
        let at = Place::from(device);
        let item = |what, place, bytes| MemoryItem { what, place, bytes };
        let mut items = vec![
            item("weights shard", at, shard.saturating_mul(4)),
            item("gradient shard", at, shard.saturating_mul(4)),
            item("AdamW state shard", at, shard.saturating_mul(8)),
            item("gathered unit", at, unit),
            item(
                "activation checkpoints",
                at,
                tokens.saturating_mul(u64::from(spec.layers) + 1).saturating_mul(d * e),
            ),
            item("activations", at, tokens.saturating_mul(block_acts.max(head_acts))),
            item("optimizer temporaries", at, shard.min(ADAM_CHUNK as u64).saturating_mul(12)),
        ];
        items.extend(host_items(n));
        let model = model_name(spec);
        MemoryPlan { model, params: n, device, micro_batch, seq_len, devices: gpus.max(1), items }
    }

    /// Bytes one device needs (the items on the training device; with one CPU device, none of
    /// the host's own).
    pub fn per_device(&self) -> u64 {
        let at = Place::from(self.device);
        self.items
            .iter()
            .filter(|i| i.place == at && !is_host_item(i.what))
            .fold(0, |a, i| a.saturating_add(i.bytes))
    }

    /// The plan of the model alone: without DiLoCo's outer state and the flat inner copy on the
    /// host (for training outside a worker, as `loco bench train` does).
    pub fn without_outer_state(&self) -> MemoryPlan {
        let items = self.items.iter().filter(|i| !is_host_item(i.what)).cloned().collect();
        MemoryPlan { items, ..self.clone() }
    }

    /// Bytes of `what` (an item's name), summed over places; 0 if absent.
    pub fn bytes(&self, what: &str) -> u64 {
        self.items.iter().filter(|i| i.what == what).map(|i| i.bytes).sum()
    }

    /// How many times the items at `place` count there: the node's devices for the host when
    /// they are CPU threads over it (device items only), once otherwise.
    fn times(&self, item: &MemoryItem, place: Place) -> u64 {
        if place == Place::Host && self.devices > 1 && !is_host_item(item.what) {
            u64::from(self.devices)
        } else {
            1
        }
    }

    /// Bytes needed at `place` (each CUDA device of a sharded node needs the same).
    pub fn total(&self, place: Place) -> u64 {
        let place_of = |p: Place| match (p, place) {
            (Place::Cuda(first), Place::Cuda(i)) if i >= first && i - first < self.devices => place,
            _ => p,
        };
        self.items
            .iter()
            .filter(|i| place_of(i.place) == place)
            .fold(0, |a, i| a.saturating_add(i.bytes.saturating_mul(self.times(i, place))))
    }

    /// The places used, device first (the first device of a sharded node stands for all).
    pub fn places(&self) -> Vec<Place> {
        let mut out: Vec<Place> = Vec::new();
        for i in &self.items {
            if !out.contains(&i.place) {
                out.push(i.place);
            }
        }
        out
    }

    /// Whether `place` has room: `Err` holds the message to show when `available` bytes there
    /// are fewer than [`MemoryPlan::total`].
    pub fn fits(&self, place: Place, available: u64) -> Result<(), MemoryShortfall> {
        if self.total(place) <= available {
            Ok(())
        } else {
            Err(MemoryShortfall { plan: self.clone(), place, available })
        }
    }

    /// One line for `place`: "~X GiB on P for weights A, gradients B, ... (GiB)".
    pub fn describe(&self, place: Place) -> String {
        let parts: Vec<String> = self
            .items
            .iter()
            .filter(|i| i.place == place)
            .map(|i| {
                let note = if i.what == "activations" {
                    format!(" ({} x {} tokens)", self.micro_batch, self.seq_len)
                } else {
                    String::new()
                };
                let times = self.times(i, place);
                let each = if times > 1 {
                    format!(" ({times} x {})", gib(i.bytes))
                } else {
                    String::new()
                };
                format!("{} {}{each}{note}", i.what, gib(i.bytes.saturating_mul(times)))
            })
            .collect();
        let on = match place {
            Place::Cuda(i) if self.devices > 1 => {
                format!("each of cuda:{i}..cuda:{}", i + self.devices - 1)
            }
            Place::Host if self.devices > 1 && Place::from(self.device) == Place::Host => {
                format!("cpu ({} devices)", self.devices)
            }
            _ => place.to_string(),
        };
        format!("~{} GiB on {on} for {} (GiB)", gib(self.total(place)), parts.join(", "))
    }
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let places: Vec<String> = self.places().into_iter().map(|p| self.describe(p)).collect();
        write!(
            f,
            "{} ({:.4e} parameters) needs {}",
            self.model,
            self.params as f64,
            places.join(" and ")
        )
    }
}

impl fmt::Display for MemoryShortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.place == Place::Host { "this machine" } else { "the device" };
        write!(
            f,
            "{} ({:.4e} parameters) needs {}; {what} has {} GiB available",
            self.plan.model,
            self.plan.params as f64,
            self.plan.describe(self.place),
            gib(self.available)
        )
    }
}

impl std::error::Error for MemoryShortfall {}

/// Values of a shard that the sharded trainer's AdamW updates at once (64 Mi fp32 values):
/// bounds its temporaries.
pub const ADAM_CHUNK: usize = 1 << 24;

/// Bytes one device holds for the unit it has gathered, at most (the largest unit): its
/// weights in the compute precision (`e` bytes a value) and their gradient, plus that gradient
/// in fp32 for the reduce-scatter when `e` is not 4. Weights on a CUDA device are a copy (4
/// bytes a value while the fp32 pieces are joined, then the cast); on the CPU, where the
/// devices share memory, fp32 weights within one shard are a view of it, and only a unit that
/// crosses a shard boundary is copied.
pub fn gathered_unit_bytes(spec: &ModelSpec, device: Device, gpus: u32, e: u64) -> u64 {
    let layers = crate::model::layer_layout(spec);
    let n: u64 = layers.iter().map(|(_, v)| *v as u64).sum();
    let g = usize::try_from(gpus.max(1)).unwrap_or(usize::MAX);
    let bounds: Vec<u64> = (1..g)
        .map(|c| loco_core::allreduce::schedule::chunk_range(n as usize, g, c).start as u64)
        .collect();
    let spans = |lo: u64, hi: u64| bounds.iter().any(|&b| lo < b && b < hi);
    // Units: the embedding, each block, and the head (the final norm with the output matrix,
    // or with the embedding when tied).
    let mut units: Vec<(u64, bool)> = Vec::new();
    let mut at = 0u64;
    let mut ranges = Vec::new();
    for (_, v) in &layers {
        ranges.push((at, at + *v as u64));
        at += *v as u64;
    }
    let count = ranges.len();
    let head_start = if spec.tied_embeddings { count - 1 } else { count.saturating_sub(2) };
    for &(lo, hi) in &ranges[..head_start] {
        units.push((hi - lo, spans(lo, hi)));
    }
    let (norm_lo, norm_hi) = ranges[head_start];
    let out = if spec.tied_embeddings { ranges[0] } else { ranges[count - 1] };
    units.push((
        (norm_hi - norm_lo) + (out.1 - out.0),
        spans(norm_lo, norm_hi) || spans(out.0, out.1),
    ));
    let cuda = matches!(device, Device::Cuda(_));
    let cast = e != 4;
    units
        .into_iter()
        .map(|(len, spanning)| {
            let copied = cuda || spanning;
            // While gathering: the joined fp32 values and their cast; then the weights, their
            // gradient and its fp32 copy.
            let gathering = if copied { 4 } else { 0 } + if cast { e } else { 0 };
            let weights = if cast {
                e
            } else if copied {
                4
            } else {
                0
            };
            let held = weights + e + if cast { 4 } else { 0 };
            len.saturating_mul(gathering.max(held))
        })
        .max()
        .unwrap_or(0)
}

/// The host's own items: DiLoCo's outer state (outer weights, pseudo-gradient, momentum) and
/// the flat fp32 copy of the inner weights, 4 bytes a parameter each.
fn host_items(n: u64) -> Vec<MemoryItem> {
    HOST_ITEMS
        .iter()
        .map(|&what| MemoryItem { what, place: Place::Host, bytes: n.saturating_mul(4) })
        .collect()
}

const HOST_ITEMS: [&str; 4] =
    ["outer weights", "pseudo-gradient", "outer momentum", "flat inner copy"];

/// "the P preset", or "a custom model".
fn model_name(spec: &ModelSpec) -> String {
    match spec.preset {
        Some(p) => format!("the {p} preset"),
        None => "a custom model".to_owned(),
    }
}

/// Whether an item is the host's own: DiLoCo's outer state and the flat inner copy.
fn is_host_item(what: &str) -> bool {
    HOST_ITEMS.contains(&what)
}

/// Bytes as GiB with one decimal.
fn gib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 30) as f64)
}

/// Host memory available for new allocations (`MemAvailable` of `/proc/meminfo`), if known.
pub fn host_available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&text)
}

/// Memory of CUDA device `index`, as `nvidia-smi` reports it (`memory.total`), if it runs here.
pub fn cuda_device_bytes(index: u32) -> Option<u64> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=memory.total", "--format=csv,noheader,nounits"])
        .arg(format!("--id={index}"))
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    parse_mib(&String::from_utf8_lossy(&out.stdout))
}

/// The first line of `nvidia-smi`'s `memory.total` in MiB, as bytes.
fn parse_mib(text: &str) -> Option<u64> {
    let mib: u64 = text.lines().next()?.trim().parse().ok()?;
    mib.checked_mul(1 << 20)
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use loco_core::scenario::Preset;

    #[test]
    fn nvidia_smi_memory_parses() {
        assert_eq!(parse_mib("81559\n"), Some(81_559 << 20));
        assert_eq!(parse_mib(" 143771 \n81559\n"), Some(143_771 << 20));
        assert_eq!(parse_mib("[N/A]\n"), None);
        assert_eq!(parse_mib(""), None);
    }

    #[test]
    fn meminfo_parses() {
        let text = "MemTotal:       24000000 kB\nMemAvailable:   1000 kB\n";
        assert_eq!(parse_mem_available(text), Some(1_024_000));
        assert_eq!(parse_mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: lots kB\n"), None);
    }

    #[test]
    fn tiny_plan_by_hand() {
        let spec = Preset::Tiny.spec();
        let plan = MemoryPlan::new(&spec, Device::Cpu, 4, 64, Precision::F32);
        let n = 131_392u64;
        assert_eq!(plan.params, n);
        assert_eq!(plan.bytes("weights"), 4 * n);
        assert_eq!(plan.bytes("AdamW state"), 8 * n);
        // Per token: 2 layers x (640 + 768 + 64) x 4 B + 3 x 256 x 4 + 3 x 64 x 4.
        let per_token = 2 * (10 * 64 + 4 * 192 + 2 * 32) * 4 + 3 * 256 * 4 + 3 * 64 * 4;
        assert_eq!(plan.bytes("activations"), 256 * per_token);
        // Largest tensor: the embedding, 256 x 64.
        assert_eq!(plan.bytes("optimizer temporaries"), 12 * 256 * 64);
        // On the CPU everything is on the host.
        assert_eq!(plan.places(), vec![Place::Host]);
        assert_eq!(plan.total(Place::Host), plan.items.iter().map(|i| i.bytes).sum::<u64>());
        assert!(plan.fits(Place::Host, 1 << 30).is_ok());
        let bf16 = MemoryPlan::new(&spec, Device::Cpu, 4, 64, Precision::Bf16);
        assert!(bf16.bytes("activations") < plan.bytes("activations"));
        // The model alone: the outer state's three copies and the flat inner copy are gone.
        let model = plan.without_outer_state();
        assert_eq!(model.total(Place::Host), plan.total(Place::Host) - 4 * 4 * n);
        assert_eq!((model.bytes("outer momentum"), model.bytes("weights")), (0, 4 * n));
        assert!(!model.describe(Place::Host).contains("outer"));
    }

    #[test]
    fn ten_b_plan_without_allocating() {
        let spec = Preset::B10.spec();
        let plan = MemoryPlan::new(&spec, Device::Cuda(0), 1, 8192, Precision::Bf16);
        let n = plan.params as f64;
        assert!((n / 10.21e9 - 1.0).abs() < 0.01, "{n}");
        // 16 bytes per parameter on the device before activations: 163 GB, more than an H100's
        // 80 GB (INTELLECT-1 sharded it over 8 GPUs with FSDP).
        let device = plan.total(Place::Cuda(0));
        assert!(device > 16 * plan.params, "{device}");
        let err = plan.fits(Place::Cuda(0), 80 << 30).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("the 10b preset (1.0211e10 parameters) needs ~"), "{msg}");
        assert!(
            msg.contains("on cuda:0 for weights 38.0, gradients 38.0, AdamW state 76.1"),
            "{msg}"
        );
        assert!(msg.ends_with("the device has 80.0 GiB available"), "{msg}");
        // The host holds the outer state and the flat copy: 16 bytes per parameter.
        assert_eq!(plan.total(Place::Host), 16 * plan.params);
        let host = plan.fits(Place::Host, 24 << 30).unwrap_err().to_string();
        assert!(
            host.contains("~152.2 GiB on cpu for outer weights 38.0, pseudo-gradient 38.0, outer momentum 38.0, flat inner copy 38.0 (GiB); this machine has 24.0 GiB available"),
            "{host}"
        );
        assert!(plan.fits(Place::Host, 200 << 30).is_ok());
        let shown = plan.to_string();
        assert!(shown.contains(" and ~152.2 GiB on cpu"), "{shown}");
    }

    #[test]
    fn ten_b_sharded_over_eight_gpus_fits_an_h100_and_an_h200() {
        let spec = Preset::B10.spec();
        let one = MemoryPlan::new(&spec, Device::Cuda(0), 1, 8192, Precision::Bf16);
        let plan = MemoryPlan::sharded(&spec, Device::Cuda(0), 8, 1, 8192, Precision::Bf16);
        assert_eq!(plan.devices, 8);
        let each = plan.total(Place::Cuda(0));
        // Every device of the node needs the same; the shards are an eighth of 16 B/parameter.
        assert_eq!(plan.total(Place::Cuda(7)), each);
        assert_eq!(plan.total(Place::Cuda(8)), 0);
        assert_eq!(plan.per_device(), each);
        let shard = plan.params.div_ceil(8);
        assert_eq!(
            plan.bytes("weights shard")
                + plan.bytes("gradient shard")
                + plan.bytes("AdamW state shard"),
            16 * shard
        );
        assert!(each < one.total(Place::Cuda(0)) / 3, "{each}");
        assert!(plan.fits(Place::Cuda(0), 80 << 30).is_ok(), "{}", plan.describe(Place::Cuda(0)));
        assert!(plan.fits(Place::Cuda(0), 141 << 30).is_ok());
        // The largest unit gathered is the head: the final norm and the output matrix.
        assert_eq!(plan.bytes("gathered unit"), (4096 + 128_256 * 4096) * 8);
        let shown = plan.describe(Place::Cuda(0));
        assert!(shown.contains("on each of cuda:0..cuda:7 for weights shard 4.8, gradient shard 4.8, AdamW state shard 9.5"), "{shown}");
        // The host: the outer state and the flat copy, as unsharded.
        assert_eq!(plan.total(Place::Host), one.total(Place::Host));
        // Too many devices of too little memory still do not fit, and say so.
        let small = MemoryPlan::sharded(&spec, Device::Cuda(0), 2, 1, 8192, Precision::Bf16);
        assert!(small.fits(Place::Cuda(0), 80 << 30).is_err());
    }

    #[test]
    fn sharded_cpu_devices_share_the_host() {
        let spec = Preset::Tiny.spec();
        let plan = MemoryPlan::sharded(&spec, Device::Cpu, 2, 4, 64, Precision::F32);
        let n = plan.params;
        assert_eq!(plan.bytes("weights shard"), 4 * n.div_ceil(2));
        let device: u64 = plan.per_device();
        assert_eq!(plan.total(Place::Host), 2 * device + 16 * n, "two devices and the outer state");
        assert!(plan.describe(Place::Host).contains("on cpu (2 devices) for weights shard"));
        assert!(plan.describe(Place::Host).contains("(2 x "));
        assert_eq!(plan.without_outer_state().total(Place::Host), 2 * device);
        assert_eq!(
            MemoryPlan::for_node(&spec, Device::Cpu, 1, 4, 64, Precision::F32),
            MemoryPlan::new(&spec, Device::Cpu, 4, 64, Precision::F32)
        );
    }

    #[test]
    fn ten_b_plan_is_fast() {
        // Computing a plan allocates nothing the size of the model: a thousand 10B plans take
        // well under a second (the bound is loose for slow CI machines).
        let spec = Preset::B10.spec();
        let total: u64 = (0..1000)
            .map(|i| MemoryPlan::new(&spec, Device::Cpu, 1 + i % 4, 8192, Precision::F32).params)
            .sum();
        assert_eq!(total, 1000 * spec.param_count());
    }
}
