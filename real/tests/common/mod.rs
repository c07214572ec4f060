//! What the real backend's tests share: a scenario of loopback workers with a harness's own
//! mesh timings, from which each worker takes its settings as a real one does.

use loco_core::mesh::MeshConfig;
use loco_core::scenario::Scenario;
use std::sync::Arc;

/// A scenario of `workers` nodes named `w0`, `w1`, ... with `gpus` GPUs each, `H = inner_steps`,
/// the all-reduce's `codec` and pipelining `segment` (bytes), and the mesh settings `mesh`.
pub fn scenario(
    workers: u32,
    gpus: u32,
    inner_steps: u32,
    codec: &str,
    segment: Option<u64>,
    mesh: MeshConfig,
) -> Arc<Scenario> {
    let segment = segment.map(|b| format!("segment = \"{b}B\"\n")).unwrap_or_default();
    let mut toml = format!(
        "name = \"loopback\"\n[model]\npreset = \"tiny\"\n[diloco]\ninner_steps = {inner_steps}\n\
         codec = \"{codec}\"\n{segment}[[regions]]\nname = \"local\"\n[[links]]\nfrom = \"local\"\n\
         to = \"local\"\nbandwidth = \"10Gbit/s\"\nlatency = \"1ms\"\n[stop]\nouter_steps = 1000\n"
    );
    for i in 0..workers {
        toml.push_str(&format!("[[nodes]]\nname = \"w{i}\"\ngpus = {gpus}\nstep_time = \"1s\"\n"));
    }
    let mut s = Scenario::from_toml_str(&toml, "loopback.toml").expect("a valid scenario");
    s.set_mesh(mesh).expect("valid mesh settings");
    Arc::new(s)
}
