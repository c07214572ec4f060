//! Random scenarios for `loco fidelity --random`: scenario files nobody tuned, drawn from a
//! documented space sized for a 2-core machine running every node of the real backend at once.
//!
//! [`fidelity_scenario`] writes scenario `index` of the draw `seed` as TOML text (the file a user
//! would write, with a header saying what was drawn). The same `(seed, index)` gives the same
//! bytes. The space:
//!
//! | what | drawn from |
//! |---|---|
//! | regions | 2-4, each with 1-3 nodes; 3-8 nodes at the start in all |
//! | links | every pair of regions and each region to itself: 10-500 Mbit/s (log-uniform), one-way latency 1-150 ms (20-150 ms between regions, 1-20 ms within), jitter 0 or up to a tenth of the latency |
//! | nodes | `step_time` 0.2-2 s, `step_jitter` 0 or up to 0.1, per `[[nodes]]` group |
//! | DiLoCo | `inner_steps` 2-20 (at most 6 s of compute a round), every codec, `sync`, `overlap` or `streaming` (2 fragments when H is even) |
//! | values | as many as an all-reduce of 0.1-1.5 s over the slowest link needs, 20,000 to 2,000,000 |
//! | mesh | `ring` by measurement or by ids, `join_mode` blocking or non-blocking, heartbeat 200-500 ms, heartbeat timeout 4-8 of them |
//! | TCP | `cubic` or `bbr` |
//! | churn | 0-3 events, each at a time drawn over the run's expected span (so inside compute, all-reduces and state transfers alike): a crash (at a time, or `during` compute, the reduce-scatter or the all-gather), a leave, a hang of 0.5-4 s, a join of a node started later, a restart after a crash or a leave, a partition of two regions or of a node that heals after 0.5-4 s, a degrade of a link for 1-6 s, a coordinator pause of 0.5-2 s |
//! | length | 8-12 outer steps |
//!
//! At least two nodes stay members through every event, so that a run always trains. What the
//! space leaves out and why: more than 8 nodes (a 2-core machine cannot run them in real time),
//! links above 500 Mbit/s (the emulation's router on the same cores), a coordinator crash (the
//! run ends at once: nothing to compare), checkpoints (`crash during checkpoint`).

use crate::rng::{Purpose, stream};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::fmt::Write as _;

/// The codecs drawn, with the bytes one value takes on the wire (about).
const CODECS: [(&str, f64); 6] = [
    ("fp32", 4.0),
    ("fp16", 2.0),
    ("bf16", 2.0),
    ("uint8", 1.0),
    ("int8-block", 1.03),
    ("int4-block", 0.53),
];

/// One region's draw.
struct Region {
    name: String,
    /// Node groups: (name, count, step_time s, jitter).
    groups: Vec<(String, u32, f64, f64)>,
}

/// A node that exists at the start.
#[derive(Clone)]
struct Member {
    name: String,
}

/// Scenario `index` of the draw `seed`, as TOML text (see the module's documentation).
pub fn fidelity_scenario(seed: u64, index: u64) -> String {
    let mut rng = stream(seed, index, Purpose::RandomScenario);
    let rng = &mut rng;
    let regions = draw_regions(rng);
    let members: Vec<Member> = regions
        .iter()
        .flat_map(|reg| {
            reg.groups.iter().flat_map(move |(g, count, _, _)| {
                (0..*count).map(move |i| Member {
                    name: if *count > 1 { format!("{g}-{i}") } else { g.clone() },
                })
            })
        })
        .collect();
    // Links: within regions faster and nearer, between them slower and farther.
    let mut links = Vec::new();
    for a in 0..regions.len() {
        for b in a..regions.len() {
            let mbit = log_uniform(rng, 10.0, 500.0).round();
            let latency_ms = if a == b {
                rng.random_range(1.0..=20.0f64)
            } else {
                rng.random_range(20.0..=150.0f64)
            }
            .round();
            let jitter_ms = if rng.random_bool(0.4) {
                (latency_ms * rng.random_range(0.0..=0.1)).round()
            } else {
                0.0
            };
            links.push((a, b, mbit, latency_ms, jitter_ms));
        }
    }
    let slowest_mbit = links.iter().map(|l| l.2).fold(f64::INFINITY, f64::min);
    let step_max = regions.iter().flat_map(|r| r.groups.iter().map(|g| g.2)).fold(0.0f64, f64::max);
    let h_max = ((6.0 / step_max).floor() as u64).clamp(2, 20);
    let inner_steps = rng.random_range(2..=h_max);
    let (codec, value_bytes) = CODECS[rng.random_range(0..CODECS.len())];
    let mode = match rng.random_range(0..3u32) {
        0 => "sync",
        1 => "overlap",
        _ if inner_steps % 2 == 0 => "streaming",
        _ => "overlap",
    };
    let ar_target_s = rng.random_range(0.1..=1.5f64);
    let n = members.len() as f64;
    // A ring all-reduce sends 2 (n - 1) / n of the values from every node.
    let elements = (ar_target_s * slowest_mbit * 1e6 / 8.0 / value_bytes / (2.0 * (n - 1.0) / n))
        .clamp(20_000.0, 2_000_000.0)
        .round() as u64;
    let ring = if rng.random_bool(0.5) { "ids" } else { "measured" };
    let join_mode = if rng.random_bool(0.5) { "blocking" } else { "non-blocking" };
    let tcp = if rng.random_bool(0.5) { "cubic" } else { "bbr" };
    let hb_ms = rng.random_range(200..=500u64);
    let hb_timeout_ms = hb_ms * rng.random_range(4..=8u64);
    let outer_steps = rng.random_range(8..=12u64);
    // The expected length of an outer step, to place the churn over the run.
    let ar_s = slowest_mbit.recip() * 8.0 * elements as f64 * value_bytes * 2.0 / 1e6;
    let outer_s = inner_steps as f64 * step_max + ar_s;
    let span = (outer_steps as f64 - 2.0) * outer_s;
    let seed_of_run = rng.random_range(0..1_000_000u32);

    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Drawn by `loco fidelity --random` (draw {seed}, scenario {index}): {} regions, {} nodes \
         at the start, {mode}, {codec}, H = {inner_steps}, {tcp}.\n",
        regions.len(),
        members.len()
    );
    let _ = writeln!(s, "name = \"random-{seed}-{index}\"");
    let _ = writeln!(s, "description = \"a scenario drawn at random (draw {seed}, {index})\"");
    let _ = writeln!(s, "seed = {seed_of_run}\n");
    let _ = writeln!(s, "[model]\npreset = \"tiny\"\n");
    let _ = writeln!(s, "[diloco]\ninner_steps = {inner_steps}\ncodec = \"{codec}\"");
    let _ = writeln!(s, "mode = \"{mode}\"\nbatch_tokens = 256");
    if mode == "streaming" {
        let _ = writeln!(s, "fragments = 2");
    }
    let _ = writeln!(
        s,
        "\n[mesh]\nheartbeat = \"{hb_ms}ms\"\nheartbeat_timeout = \"{hb_timeout_ms}ms\"\n\
         barrier_timeout = \"30s\"\njoin_window = \"1s\"\nmin_members = {}\nring = \"{ring}\"\n\
         join_mode = \"{join_mode}\"\n",
        members.len()
    );
    topology(&mut s, &regions, &links);
    churn(rng, &mut s, &regions, &members, span, outer_s, step_max);
    let _ = writeln!(
        s,
        "[stop]\nouter_steps = {outer_steps}\ntime = \"{}s\"\n",
        (outer_steps as f64 * outer_s * 4.0 + 60.0).ceil()
    );
    let _ = writeln!(
        s,
        "[sim]\ntcp = \"{tcp}\"\nnumerics = \"real\"\nelements = {elements}\n\n[real]\ndevice = \"cpu\""
    );
    s
}

/// The `[[regions]]`, `[[links]]` and `[[nodes]]` tables.
fn topology(s: &mut String, regions: &[Region], links: &[(usize, usize, f64, f64, f64)]) {
    for r in regions {
        let _ = writeln!(s, "[[regions]]\nname = \"{}\"\n", r.name);
    }
    for &(a, b, mbit, lat, jit) in links {
        let _ = writeln!(
            s,
            "[[links]]\nfrom = \"{}\"\nto = \"{}\"\nbandwidth = \"{mbit}Mbit/s\"\nlatency = \"{lat}ms\"",
            regions[a].name, regions[b].name
        );
        if jit > 0.0 {
            let _ = writeln!(s, "jitter = \"{jit}ms\"");
        }
        s.push('\n');
    }
    for r in regions {
        for (g, count, step, jitter) in &r.groups {
            let _ = writeln!(
                s,
                "[[nodes]]\nname = \"{g}\"\ncount = {count}\nregion = \"{}\"\nstep_time = \"{}ms\"",
                r.name,
                (step * 1000.0).round()
            );
            if *jitter > 0.0 {
                let _ = writeln!(s, "step_jitter = {jitter:.3}");
            }
            s.push('\n');
        }
    }
}

fn log_uniform(rng: &mut ChaCha8Rng, lo: f64, hi: f64) -> f64 {
    (rng.random_range(lo.ln()..=hi.ln())).exp()
}

fn draw_regions(rng: &mut ChaCha8Rng) -> Vec<Region> {
    let count = rng.random_range(2..=4usize);
    let names = ["us", "eu", "asia", "sa"];
    let mut regions: Vec<Region> = (0..count)
        .map(|r| {
            let groups = if rng.random_bool(0.3) {
                // Two groups of different speed in one region.
                vec![group(rng, names[r], "a", 1), group(rng, names[r], "b", 1)]
            } else {
                let nodes = rng.random_range(1..=2u32);
                vec![group(rng, names[r], "", nodes)]
            };
            Region { name: names[r].to_string(), groups }
        })
        .collect();
    // 3 to 8 nodes: add to the first region until there are 3, trim the largest above 8.
    while total(&regions) < 3 {
        regions[0].groups[0].1 += 1;
    }
    while total(&regions) > 8 {
        if let Some(g) = regions.iter_mut().flat_map(|r| r.groups.iter_mut()).max_by_key(|g| g.1) {
            g.1 -= 1;
        }
    }
    regions
}

fn total(regions: &[Region]) -> u32 {
    regions.iter().flat_map(|r| r.groups.iter().map(|g| g.1)).sum()
}

fn group(rng: &mut ChaCha8Rng, region: &str, suffix: &str, count: u32) -> (String, u32, f64, f64) {
    let step = (log_uniform(rng, 0.2, 2.0) * 20.0).round() / 20.0;
    let jitter = if rng.random_bool(0.5) { rng.random_range(0.0..=0.1f64) } else { 0.0 };
    let name = if suffix.is_empty() { region.to_string() } else { format!("{region}-{suffix}") };
    (name, count, step, jitter)
}

/// What each node does, as the events go: running, or gone (crashed or left) since a time.
#[derive(Clone, Copy, PartialEq)]
enum State {
    Running,
    Gone(f64),
}

/// 0-3 churn events, consistent with each other, at least two members through every one.
fn churn(
    rng: &mut ChaCha8Rng,
    s: &mut String,
    regions: &[Region],
    members: &[Member],
    span: f64,
    outer_s: f64,
    step_max: f64,
) {
    let events = rng.random_range(0..=3usize);
    let mut times: Vec<f64> =
        (0..events).map(|_| rng.random_range(outer_s.max(1.0)..=span.max(outer_s + 1.0))).collect();
    times.sort_by(f64::total_cmp);
    let mut state = vec![State::Running; members.len()];
    // Until when a node is busy with an event that has a length (a hang, a partition).
    let mut busy_until = vec![0.0f64; members.len()];
    let mut joined = 0usize;
    let mut coordinator_free = 0.0f64;
    let mut link_free = 0.0f64;
    for at in times {
        let at = (at * 10.0).round() / 10.0;
        let running = |state: &[State], busy: &[f64]| -> Vec<usize> {
            (0..members.len()).filter(|&i| state[i] == State::Running && busy[i] <= at).collect()
        };
        let live = state.iter().filter(|&&st| st == State::Running).count();
        let free = running(&state, &busy_until);
        let kind = rng.random_range(0..9u32);
        let pick = |rng: &mut ChaCha8Rng, v: &[usize]| v[rng.random_range(0..v.len())];
        match kind {
            // Crash or leave: keep two members.
            0..=2 if live > 2 && !free.is_empty() => {
                let i = pick(rng, &free);
                state[i] = State::Gone(at);
                let name = &members[i].name;
                match kind {
                    0 => event(s, at, "crash", &format!("node = \"{name}\"\n")),
                    1 => {
                        let phase =
                            ["compute", "reduce-scatter", "all-gather"][rng.random_range(0..3)];
                        event(s, at, "crash", &format!("node = \"{name}\"\nduring = \"{phase}\"\n"))
                    }
                    _ => event(s, at, "leave", &format!("node = \"{name}\"\n")),
                }
            }
            // A hang, shorter than the barrier timeout.
            3 if !free.is_empty() => {
                let i = pick(rng, &free);
                let d = rng.random_range(0.5..=4.0f64);
                // The hang ends by itself (`for`); nothing else happens to the node meanwhile.
                busy_until[i] = at + d + 0.1;
                let name = &members[i].name;
                event(s, at, "hang", &format!("node = \"{name}\"\nfor = \"{}ms\"\n", ms(d)));
            }
            // A restart of a node that is gone (a crash `during` a phase strikes up to an outer
            // step after its time: the restart comes later than that).
            4 => {
                let gone: Vec<usize> = (0..members.len())
                    .filter(|&i| matches!(state[i], State::Gone(t) if at > t + 1.5 * outer_s + 1.0))
                    .collect();
                if gone.is_empty() {
                    join(s, rng, regions, &mut joined, at, step_max);
                } else {
                    let i = pick(rng, &gone);
                    state[i] = State::Running;
                    busy_until[i] = at + 0.1;
                    event(s, at, "restart", &format!("node = \"{}\"\n", members[i].name));
                }
            }
            5 => join(s, rng, regions, &mut joined, at, step_max),
            // A partition that heals: two regions, or one node from everyone.
            6 if link_free <= at => {
                let d = rng.random_range(0.5..=4.0f64);
                link_free = at + d + 0.1;
                if rng.random_bool(0.5) && regions.len() >= 2 {
                    let (a, b) = two_regions(rng, regions);
                    event(s, at, "partition", &format!("{a}{b}for = \"{}ms\"\n", ms(d)));
                } else if !free.is_empty() {
                    let i = pick(rng, &free);
                    busy_until[i] = at + d + 0.1;
                    let fields = format!("node = \"{}\"\nfor = \"{}ms\"\n", members[i].name, ms(d));
                    event(s, at, "partition", &fields);
                }
            }
            // A degrade of a link between two regions.
            7 if link_free <= at => {
                let d = rng.random_range(1.0..=6.0f64);
                link_free = at + d + 0.1;
                let (a, b) = two_regions(rng, regions);
                let mbit = rng.random_range(5..=50u32);
                let fields = format!("{a}{b}bandwidth = \"{mbit}Mbit/s\"\nfor = \"{}ms\"\n", ms(d));
                event(s, at, "degrade", &fields);
            }
            8 if coordinator_free <= at => {
                let d = rng.random_range(0.5..=2.0f64);
                coordinator_free = at + d + 0.1;
                event(s, at, "coordinator-pause", &format!("for = \"{}ms\"\n", ms(d)));
            }
            _ => {}
        }
    }
}

/// Two different regions, drawn: their `from` and `to` lines.
fn two_regions(rng: &mut ChaCha8Rng, regions: &[Region]) -> (String, String) {
    let a = rng.random_range(0..regions.len());
    let b = (a + rng.random_range(1..regions.len())) % regions.len();
    (format!("from = \"{}\"\n", regions[a].name), format!("to = \"{}\"\n", regions[b].name))
}

fn ms(secs: f64) -> u64 {
    (secs * 1000.0).round() as u64
}

fn event(s: &mut String, at: f64, kind: &str, fields: &str) {
    let _ = writeln!(s, "[[churn]]\nat = \"{}ms\"\nkind = \"{kind}\"\n{fields}", ms(at));
}

/// A node that joins at `at`: declared with its start, in a region drawn.
fn join(
    s: &mut String,
    rng: &mut ChaCha8Rng,
    regions: &[Region],
    joined: &mut usize,
    at: f64,
    step_max: f64,
) {
    let r = &regions[rng.random_range(0..regions.len())];
    let step = r.groups[0].2.min(step_max);
    let _ = writeln!(
        s,
        "[[nodes]]\nname = \"late-{joined}\"\nregion = \"{}\"\nstep_time = \"{}ms\"\nstart = \"{}ms\"\n",
        r.name,
        ms(step),
        ms(at)
    );
    *joined += 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    #[test]
    fn every_drawn_scenario_is_valid_and_the_draw_repeats() {
        for seed in [0u64, 1, 0xdead_beef] {
            for index in 0..200 {
                let text = fidelity_scenario(seed, index);
                let s = Scenario::from_toml_str(&text, "random.toml")
                    .unwrap_or_else(|e| panic!("draw {seed} {index}: {e}\n{text}"));
                let start = s.nodes().iter().filter(|n| n.start.is_zero()).count();
                assert!((3..=8).contains(&start), "{start} nodes at the start");
                assert!((2..=20).contains(&s.diloco().inner_steps));
                assert_eq!(text, fidelity_scenario(seed, index));
            }
        }
        assert_ne!(fidelity_scenario(1, 0), fidelity_scenario(1, 1));
    }

    #[test]
    fn the_draws_cover_the_space() {
        let texts: Vec<String> = (0..300).map(|i| fidelity_scenario(7, i)).collect();
        for needle in [
            "mode = \"sync\"",
            "mode = \"overlap\"",
            "mode = \"streaming\"",
            "ring = \"ids\"",
            "ring = \"measured\"",
            "join_mode = \"non-blocking\"",
            "tcp = \"bbr\"",
            "tcp = \"cubic\"",
            "codec = \"int4-block\"",
            "codec = \"fp32\"",
            "kind = \"crash\"",
            "during = \"reduce-scatter\"",
            "kind = \"leave\"",
            "kind = \"hang\"",
            "kind = \"restart\"",
            "kind = \"partition\"",
            "kind = \"degrade\"",
            "kind = \"coordinator-pause\"",
            "start = ",
            "step_jitter",
            "jitter = ",
        ] {
            assert!(texts.iter().any(|t| t.contains(needle)), "no draw has {needle}");
        }
    }
}
