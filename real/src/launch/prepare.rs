//! What a launch checks and works out before it starts a process: whether the model fits this
//! machine, where checkpoints are, which outer step a resumed run starts from.

use super::LaunchError;
use crate::checkpoint::{CheckpointConfig, list, replicated_digests};
use crate::memory::{MemoryPlan, Place, cuda_device_bytes, host_available_bytes};
use crate::node::CheckpointPlan;
use loco_core::scenario::Scenario;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Where a scenario's paths (data, checkpoints) are relative to: the scenario file's directory.
pub fn scenario_base(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// The checkpoint root: `given`, or the scenario's `[real] checkpoint_dir`, when there is one.
pub fn checkpoint_root(
    s: &Scenario,
    scenario_path: &Path,
    given: Option<&Path>,
) -> Option<PathBuf> {
    given
        .map(Path::to_path_buf)
        .or_else(|| s.real().checkpoint_dir.as_ref().map(|d| scenario_base(scenario_path).join(d)))
}

/// The checkpoints worker `node` writes, when the run has a checkpoint root.
pub fn checkpoint_plan(
    s: &Scenario,
    scenario_path: &Path,
    given: Option<&Path>,
    node: &str,
) -> Option<CheckpointPlan> {
    let dir = checkpoint_root(s, scenario_path, given)?;
    let remote = s.real().checkpoint_remote.as_ref().map(|d| scenario_base(scenario_path).join(d));
    Some(CheckpointPlan {
        config: CheckpointConfig {
            dir,
            scenario: s.name().to_string(),
            model: Some(s.model().clone()),
            node: node.to_string(),
            keep: s.real().keep as usize,
            remote,
        },
        every: s.real().checkpoint_every,
    })
}

/// The outer step a launch resumes from: `wanted`, or the newest step every starting node has a
/// complete checkpoint of in which they all hold the same replicated state (outer weights and
/// momentum, compared by the digests in each `meta.json`). Names what is missing or differs
/// otherwise.
pub fn resume_step(
    s: &Scenario,
    scenario_path: &Path,
    given: Option<&Path>,
    wanted: Option<u64>,
) -> Result<u64, LaunchError> {
    let Some(root) = checkpoint_root(s, scenario_path, given) else {
        return Err(LaunchError::NoCheckpointDir { scenario_path: scenario_path.to_path_buf() });
    };
    let nodes: Vec<String> = s.initial_nodes().map(|n| n.name.clone()).collect();
    agreed_step(&root, &nodes, wanted)
}

/// [`resume_step`] over the checkpoints of `nodes` under `root`.
pub fn agreed_step(root: &Path, nodes: &[String], wanted: Option<u64>) -> Result<u64, LaunchError> {
    let mut common: Option<BTreeSet<u64>> = None;
    let mut have = Vec::new();
    let mut dirs = Vec::new();
    for n in nodes {
        let listed = list(root, n)?;
        let steps: BTreeSet<u64> = listed.iter().map(|(k, _)| *k).collect();
        have.push(format!("{n}: {steps:?}"));
        dirs.push(listed.into_iter().collect::<std::collections::BTreeMap<_, _>>());
        common = Some(match common {
            None => steps,
            Some(c) => c.intersection(&steps).copied().collect(),
        });
    }
    let common = common.unwrap_or_default();
    let candidates: Vec<u64> = match wanted {
        Some(k) => common.contains(&k).then_some(k).into_iter().collect(),
        None => common.iter().rev().copied().collect(),
    };
    let mut differing = Vec::new();
    for step in candidates {
        // Nodes grouped by the digests of their replicated state at this step.
        let mut groups: Vec<(std::collections::BTreeMap<String, _>, Vec<&str>)> = Vec::new();
        for (n, d) in nodes.iter().zip(&dirs) {
            let digests = replicated_digests(&d[&step])?;
            match groups.iter_mut().find(|(g, _)| *g == digests) {
                Some((_, names)) => names.push(n),
                None => groups.push((digests, vec![n])),
            }
        }
        if groups.len() <= 1 {
            return Ok(step);
        }
        let split: Vec<String> = groups.iter().map(|(_, names)| names.join(" ")).collect();
        tracing::warn!(
            "checkpoints of outer step {step} differ between nodes ({}): not resuming from it",
            split.join(" | ")
        );
        differing.push(format!("step {step}: {}", split.join(" | ")));
    }
    if !differing.is_empty() {
        return Err(LaunchError::CheckpointsDiffer {
            root: root.to_path_buf(),
            wanted,
            groups: differing.join("; "),
        });
    }
    Err(LaunchError::NoCommonCheckpoint { root: root.to_path_buf(), wanted, have: have.join("; ") })
}

/// Refuses node `n` if its plan needs more on each device than its first CUDA device has
/// (where `nvidia-smi` tells it; the CPU's memory is the host's, which [`check_memory`]
/// checks). A worker on its own machine checks its node.
pub fn check_devices(s: &Scenario, n: &loco_core::scenario::NodeSpec) -> Result<(), LaunchError> {
    let loco_core::scenario::Device::Cuda(first) = s.real().device else { return Ok(()) };
    let Some(device_bytes) = cuda_device_bytes(first) else { return Ok(()) };
    let seq = s.real().seq_len.unwrap_or(s.model().seq_len);
    let p = MemoryPlan::for_node(
        s.model(),
        s.real().device,
        n.gpus,
        s.real().micro_batch,
        seq,
        s.real().precision,
    );
    if p.per_device() <= device_bytes {
        return Ok(());
    }
    Err(LaunchError::DeviceDoesNotFit {
        scenario: s.name().to_string(),
        node: n.name.clone(),
        gpus: n.gpus.max(1),
        device: s.real().device.to_string(),
        need_bytes: p.per_device(),
        device_bytes,
        plan: p.describe(Place::Cuda(first)),
    })
}

/// Refuses a model whose starting processes need more host memory than this machine has
/// available, or more on each device than a node's CUDA devices have (where `nvidia-smi` tells
/// it), with the memory plan.
pub fn check_memory(s: &Scenario) -> Result<(), LaunchError> {
    let seq = s.real().seq_len.unwrap_or(s.model().seq_len);
    let plan = |gpus: u32| {
        MemoryPlan::for_node(
            s.model(),
            s.real().device,
            gpus,
            s.real().micro_batch,
            seq,
            s.real().precision,
        )
    };
    for n in s.nodes() {
        check_devices(s, n)?;
    }
    let starting: Vec<u32> = s.initial_nodes().map(|n| n.gpus).collect();
    let processes = starting.len().max(1) as u64;
    // The plan shown: the largest node's (the one most likely not to fit).
    let largest = plan(starting.iter().copied().max().unwrap_or(1));
    if let Some(available_bytes) = host_available_bytes() {
        let need_bytes =
            starting.iter().fold(0u64, |a, &g| a.saturating_add(plan(g).total(Place::Host)));
        if need_bytes > available_bytes {
            return Err(LaunchError::DoesNotFit {
                scenario: s.name().to_string(),
                processes,
                need_bytes,
                available_bytes,
                plan: largest.describe(Place::Host),
            });
        }
    }
    Ok(())
}
