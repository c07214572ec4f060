use super::*;
use crate::codec::SparseSpec;
use crate::mesh::JoinMode;

/// Two regions, three nodes, a link for every pair.
const BASE: &str = r#"name = "t"
[model]
preset = "tiny"

[[regions]]
name = "us"
[[regions]]
name = "eu"

[[links]]
from = "us"
to = "us"
bandwidth = "4Gbit/s"
latency = "5ms"
[[links]]
from = "us"
to = "eu"
bandwidth = "1Gbit/s"
latency = "40ms"
[[links]]
from = "eu"
to = "eu"
bandwidth = "4Gbit/s"
latency = "5ms"

[[nodes]]
name = "us"
count = 2
region = "us"
step_time = "1s"
[[nodes]]
name = "eu"
region = "eu"
step_time = "1s"

[stop]
outer_steps = 3
"#;

fn parse(src: &str) -> Result<Scenario, ScenarioError> {
    Scenario::from_toml_str(src, "t.toml")
}

fn ok(src: &str) -> Scenario {
    match parse(src) {
        Ok(s) => s,
        Err(e) => panic!("unexpected error: {e}"),
    }
}

fn err(src: &str) -> ScenarioError {
    match parse(src) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

/// `line:column` of byte `off` of `src`, counted independently of the loader (1-based,
/// characters).
fn pos_at(src: &str, off: usize) -> String {
    let line = src[..off].matches('\n').count() + 1;
    let start = src[..off].rfind('\n').map_or(0, |i| i + 1);
    format!("{line}:{}", src[start..off].chars().count() + 1)
}

/// `line:column` of the first occurrence of `needle`.
fn pos(src: &str, needle: &str) -> String {
    pos_at(src, src.find(needle).unwrap_or_else(|| panic!("{needle:?} not in the source")))
}

/// `line:column` of the last occurrence of `needle`.
fn pos_last(src: &str, needle: &str) -> String {
    pos_at(src, src.rfind(needle).unwrap_or_else(|| panic!("{needle:?} not in the source")))
}

/// BASE with `old` replaced by `new` (which must occur).
fn edit(old: &str, new: &str) -> String {
    assert!(BASE.contains(old), "{old:?} not in BASE");
    BASE.replacen(old, new, 1)
}

/// Asserts the whole message: `t.toml:<position of needle>: <rest>`.
fn assert_msg(src: &str, needle: &str, rest: &str) {
    let e = err(src);
    assert_eq!(e.to_string(), format!("t.toml:{}: {rest}", pos(src, needle)));
}

#[test]
fn pos_helper_is_right() {
    assert_eq!(pos("ab\ncd", "a"), "1:1");
    assert_eq!(pos("ab\ncd", "b"), "1:2");
    assert_eq!(pos("ab\ncd", "c"), "2:1");
    assert_eq!(pos("ab\n\nxd", "d"), "3:2");
}

// ---------------------------------------------------------------------------------------------
// Valid files
// ---------------------------------------------------------------------------------------------

#[test]
fn base_scenario_expands_and_links() {
    let s = ok(BASE);
    assert_eq!(s.name(), "t");
    assert_eq!(s.seed(), 0);
    assert_eq!(s.published(), None);
    let names: Vec<&str> = s.nodes().iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["us-0", "us-1", "eu"]);
    for (i, n) in s.nodes().iter().enumerate() {
        assert_eq!(n.id, NodeId(i as u32));
        assert_eq!(s.node(n.id), Some(n));
    }
    assert_eq!(s.nodes()[1].entry, 0);
    assert_eq!(s.nodes()[2].entry, 1);
    let us = s.region_by_name("us").unwrap().id;
    let eu = s.region_by_name("eu").unwrap().id;
    assert_eq!((us, eu), (RegionId(0), RegionId(1)));
    assert_eq!(s.nodes()[2].region, eu);
    // The us-eu link serves both directions; within a region its own link.
    let ue = s.link(us, eu).unwrap();
    assert_eq!(ue.bandwidth, Varying::Fixed(Rate::from_bits_per_sec(1e9).unwrap()));
    assert_eq!(ue.latency, Varying::Fixed(Duration::from_millis(40)));
    assert_eq!(s.link(eu, us), Some(ue));
    assert_eq!(s.link(us, us).unwrap().bandwidth.at(Duration::ZERO).unwrap().bits_per_sec(), 4e9);
    assert_eq!(s.node_link(NodeId(0), NodeId(2)), Some(ue));
    assert_eq!(s.node_link(NodeId(0), NodeId(9)), None);
    assert_eq!(s.coordinator_region(), us);
    assert_eq!(s.total_gpus(), 3);
    assert_eq!(s.stop(), Stop { outer_steps: Some(3), time: None });
    assert_eq!(s.initial_nodes().count(), 3);
    assert!(s.churn().is_empty());
}

#[test]
fn defaults_are_the_documented_ones() {
    let s = ok(BASE);
    assert_eq!(s.diloco(), &DilocoSpec::default());
    assert_eq!(s.diloco().inner_steps, 100);
    assert_eq!(s.diloco().codec, CodecKind::Uint8);
    assert_eq!(s.mesh(), &MeshConfig::default());
    assert_eq!(s.sim(), &SimSpec::default());
    assert_eq!(s.real(), &RealSpec::default());
    assert_eq!(s.real().secret_env, "LOCO_SECRET");
    assert_eq!(s.model(), &Preset::Tiny.spec());
    let n = &s.nodes()[0];
    assert_eq!(
        (n.gpus, n.step_jitter, n.start, n.nic, n.peak_flops),
        (1, 0.0, Duration::ZERO, None, None)
    );
    let l = &s.links()[0];
    assert_eq!((l.oneway, l.jitter, l.streams), (false, Duration::ZERO, 1));
}

/// Every other section of a scenario, each key given, for [`every_section_parses`].
const EVERY_SECTION: &str = r#"
[model]
preset = "10b"
seq_len = 2048
tied_embeddings = true
norm_eps = 1e-6

[diloco]
inner_steps = 50
codec = "int8-block"
outer_lr = 0.5
outer_momentum = 0.8
nesterov = false
inner_lr = 3e-4
betas = [0.9, 0.99]
warmup_steps = 10
decay_start = 100
decay_steps = 50
weight_decay = 0.0
grad_clip = 0
z_loss = 0
batch_tokens = 4096
segment = "4MiB"

[mesh]
heartbeat = "1s"
heartbeat_timeout = "5s"
barrier_timeout = "10min"
max_retries = 5
join_mode = "non-blocking"
probe = "500ms"
coordinator_region = "eu"
min_members = 2
join_window = 0
sync_timeout = "1h"
allreduce_timeout = "2h"
retry_backoff = "3s"
state_senders = 2

[sim]
tick = "10ms"
numerics = "real"
elements = 100
duration_limit = "2d"
outer_cost = 2.5e-9
state_prepare_cost = 3e-10
state_receive_cost = 2e-9
encode_cost = 1e-9
tcp = "bbr"
executor = "events"

[real]
device = "cuda:1"
data = "data/x.txt"
micro_batch = 4
seq_len = 128
checkpoint_dir = "ckpt"
checkpoint_every = 2
keep = 5
secret_env = "MY_SECRET"
network = "emulated"
"#;

#[test]
fn every_section_parses() {
    // Top-level keys first, then BASE's tables without its model, then every other section.
    let src = "name = \"all\"\ndescription = \"all of it\"\nseed = 7\npublished = \"usa-europe\"\n"
        .to_owned()
        + &BASE.replacen("name = \"t\"\n", "", 1).replacen("[model]\npreset = \"tiny\"\n", "", 1)
        + EVERY_SECTION;
    let s = ok(&src);
    assert_eq!(s.name(), "all");
    assert_eq!(s.description(), Some("all of it"));
    assert_eq!(s.seed(), 7);
    assert_eq!(s.published(), Some(Published::UsaEu));
    let m = s.model();
    assert_eq!(
        (m.preset, m.layers, m.seq_len, m.tied_embeddings, m.norm_eps),
        (Some(Preset::B10), 42, 2048, true, 1e-6)
    );
    let d = s.diloco();
    assert_eq!(d.inner_steps, 50);
    assert_eq!(d.codec, CodecKind::Int8Block);
    assert_eq!((d.outer_lr, d.outer_momentum, d.nesterov, d.inner_lr), (0.5, 0.8, false, 3e-4));
    assert_eq!(d.betas, (0.9, 0.99));
    assert_eq!(d.decay, Some(Decay { start: 100, steps: 50 }));
    assert_eq!((d.weight_decay, d.grad_clip, d.z_loss, d.batch_tokens), (0.0, 0.0, 0.0, 4096));
    assert_eq!(d.segment, Some(4 << 20));
    let mesh = s.mesh();
    assert_eq!(mesh.heartbeat_interval, Duration::from_secs(1));
    assert_eq!(mesh.heartbeat_timeout, Duration::from_secs(5));
    // Derived default: 3 x heartbeat_timeout.
    assert_eq!(mesh.coordinator_timeout, Duration::from_secs(15));
    assert_eq!(mesh.barrier_timeout, Duration::from_secs(600));
    assert_eq!(mesh.max_retries, 5);
    assert_eq!(mesh.join_mode, JoinMode::NonBlocking);
    assert_eq!(mesh.probe_duration, Duration::from_millis(500));
    assert_eq!(mesh.min_members, 2);
    assert_eq!(mesh.join_window, Duration::ZERO);
    assert_eq!(mesh.sync_timeout, Duration::from_secs(3600));
    assert_eq!(mesh.allreduce_timeout, Duration::from_secs(7200));
    assert_eq!(mesh.retry_backoff, Duration::from_secs(3));
    assert_eq!(mesh.state_senders, 2);
    assert_eq!(s.coordinator_region(), RegionId(1));
    assert_eq!(
        s.sim(),
        &SimSpec {
            tick: Some(Duration::from_millis(10)),
            numerics: Numerics::Real,
            elements: 100,
            duration_limit: Some(Duration::from_secs(172_800)),
            outer_cost: 2.5e-9,
            state_prepare_cost: 3e-10,
            state_receive_cost: 2e-9,
            encode_cost: Some(1e-9),
            decode_cost: None,
            tcp: TcpKind::Bbr,
            executor: Some(ExecutorKind::Events),
            collectives: None,
        }
    );
    let r = s.real();
    assert_eq!(r.device, Device::Cuda(1));
    assert_eq!(r.device.to_string(), "cuda:1");
    assert_eq!((r.data.as_deref(), r.micro_batch, r.seq_len), (Some("data/x.txt"), 4, Some(128)));
    assert_eq!((r.checkpoint_dir.as_deref(), r.checkpoint_every, r.keep), (Some("ckpt"), 2, 5));
    assert_eq!(r.secret_env, "MY_SECRET");
    assert_eq!(r.network, NetworkMode::Emulated);
    // The validated scenario serialises (summary.json echoes it).
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["diloco"]["codec"], "int8-block");
    assert_eq!(json["published"], "usa-eu");
}

#[test]
fn model_without_preset_and_overrides() {
    let src = edit(
        "preset = \"tiny\"",
        "layers = 3\ndim = 96\nheads = 6\nkv_heads = 3\nffn = 256\nvocab = 512\nseq_len = 32",
    );
    let m = ok(&src).model().clone();
    assert_eq!(m.preset, None);
    assert_eq!(
        (m.layers, m.dim, m.heads, m.kv_heads, m.ffn, m.vocab, m.seq_len),
        (3, 96, 6, 3, 256, 512, 32)
    );
    assert_eq!((m.rope_theta, m.norm_eps, m.tied_embeddings), (500_000.0, 1e-5, false));
    assert_eq!(m.head_dim(), 16);
    // A preset with an override keeps the rest of the preset.
    let m = ok(&edit("preset = \"tiny\"", "preset = \"10b\"\nlayers = 2")).model().clone();
    assert_eq!((m.layers, m.dim, m.vocab), (2, 4096, 128_256));
    assert!(m.param_count() < Preset::B10.spec().param_count());
}

#[test]
fn units_in_fields() {
    let src = edit(
        "step_time = \"1s\"\n[[nodes]]",
        "step_time = 22.8\nstart = \"1h30min\"\nnic = \"10Gbps\"\n[[nodes]]",
    );
    let s = ok(&src);
    let n = &s.nodes()[0];
    assert_eq!(n.step_time, Duration::from_millis(22_800));
    assert_eq!(n.start, Duration::from_secs(5400));
    assert_eq!(n.nic.unwrap().bits_per_sec(), 10e9);
    // Both us nodes start late: one join event for the entry, with both.
    assert_eq!(s.churn().len(), 1);
    assert_eq!(s.churn()[0].action, ChurnAction::Join(vec![NodeId(0), NodeId(1)]));
    assert_eq!(s.churn()[0].source, EventSource::NodeStart(0));
    let initial: Vec<NodeId> = s.initial_nodes().map(|n| n.id).collect();
    assert_eq!(initial, [NodeId(2)]);
}

#[test]
fn varying_links() {
    let src = edit(
        "bandwidth = \"1Gbit/s\"\nlatency = \"40ms\"",
        "bandwidth = { uniform = [\"500Mbit/s\", \"4Gbit/s\"], resample = \"1h\" }\nlatency = { trace = [[\"0s\", \"40ms\"], [\"2h\", 0.1]] }\njitter = \"5ms\"\nstreams = 8",
    );
    let s = ok(&src);
    let l = &s.links()[1];
    let r = |x: f64| Rate::from_bits_per_sec(x).unwrap();
    assert_eq!(
        l.bandwidth,
        Varying::Uniform { low: r(500e6), high: r(4e9), resample: Some(Duration::from_secs(3600)) }
    );
    assert_eq!(l.bandwidth.at(Duration::ZERO), None);
    assert_eq!(l.bandwidth.range(), Some((r(500e6), r(4e9))));
    assert_eq!(l.latency.at(Duration::from_secs(3600)), Some(Duration::from_millis(40)));
    assert_eq!(l.latency.at(Duration::from_secs(7200)), Some(Duration::from_millis(100)));
    assert_eq!(l.latency.range(), Some((Duration::from_millis(40), Duration::from_millis(100))));
    assert_eq!(Varying::<Duration>::Trace(Vec::new()).range(), None);
    assert_eq!((l.jitter, l.streams), (Duration::from_millis(5), 8));
}

#[test]
fn oneway_links_need_both_directions() {
    let src = edit(
        "to = \"eu\"\nbandwidth = \"1Gbit/s\"",
        "to = \"eu\"\noneway = true\nbandwidth = \"1Gbit/s\"",
    );
    let e = err(&src);
    assert_eq!(
        *e.kind,
        ErrorKind::NoLink {
            from: "eu".into(),
            to: "us".into(),
            needed_by: "needed by the coordinator and node \"eu\"".into()
        }
    );
    let src = src
        + "[[links]]\nfrom = \"eu\"\nto = \"us\"\noneway = true\nbandwidth = \"600Mbit/s\"\nlatency = \"45ms\"\n";
    let s = ok(&src);
    let (us, eu) = (RegionId(0), RegionId(1));
    assert_eq!(s.link(us, eu).unwrap().latency, Varying::Fixed(Duration::from_millis(40)));
    assert_eq!(s.link(eu, us).unwrap().latency, Varying::Fixed(Duration::from_millis(45)));
}

#[test]
fn churn_is_resolved_sorted_and_desugared() {
    let src = BASE.to_owned()
        + r#"
[[churn]]
at = "2h"
kind = "crash"
nodes = ["eu", "us-1"]
[[churn]]
at = "1h"
kind = "hang"
node = "us-0"
for = "10min"
[[churn]]
at = "3h"
kind = "restart"
node = "eu"
[[churn]]
at = "1h"
kind = "partition"
from = "eu"
to = "us"
for = "30min"
[[churn]]
at = "4h"
kind = "degrade"
from = "us"
to = "eu"
bandwidth = "100Mbit/s"
for = "1h"
[[churn]]
at = "6h"
kind = "partition"
nodes = ["us-0"]
[[churn]]
at = "7h"
kind = "heal"
[[churn]]
at = "8h"
kind = "coordinator-crash"
"#;
    let s = ok(&src);
    let h = |x: u64| Duration::from_secs(x * 3600);
    let m = |x: u64| Duration::from_secs(x * 60);
    let got: Vec<(Duration, ChurnAction, EventSource)> =
        s.churn().iter().map(|e| (e.at, e.action.clone(), e.source)).collect();
    let (us, eu) = (RegionId(0), RegionId(1));
    let cut = Cut::Regions { from: us, to: eu, oneway: false };
    let r100 = Rate::from_bits_per_sec(100e6).unwrap();
    let expected = vec![
        (h(1), ChurnAction::Hang(vec![NodeId(0)]), EventSource::Churn(1)),
        (h(1), ChurnAction::Partition(cut.clone()), EventSource::Churn(3)),
        (h(1) + m(10), ChurnAction::Resume(vec![NodeId(0)]), EventSource::ChurnEnd(1)),
        (h(1) + m(30), ChurnAction::Heal(Some(cut.clone())), EventSource::ChurnEnd(3)),
        (h(2), ChurnAction::Crash(vec![NodeId(2), NodeId(1)]), EventSource::Churn(0)),
        (h(3), ChurnAction::Restart(vec![NodeId(2)]), EventSource::Churn(2)),
        (
            h(4),
            ChurnAction::Degrade {
                from: us,
                to: eu,
                oneway: false,
                bandwidth: Some(Varying::Fixed(r100)),
                latency: None,
                jitter: None,
            },
            EventSource::Churn(4),
        ),
        (h(5), ChurnAction::Restore { from: us, to: eu, oneway: false }, EventSource::ChurnEnd(4)),
        (h(6), ChurnAction::Partition(Cut::Nodes(vec![NodeId(0)])), EventSource::Churn(5)),
        (h(7), ChurnAction::Heal(None), EventSource::Churn(6)),
        (h(8), ChurnAction::CoordinatorCrash, EventSource::Churn(7)),
    ];
    assert_eq!(got, expected);
}

#[test]
fn join_events_start_declared_nodes() {
    let src = BASE.replace("name = \"eu\"\nregion", "name = \"late\"\nregion")
        + "[[churn]]\nat = \"30min\"\nkind = \"join\"\nnode = \"late\"\n[[churn]]\nat = \"1h\"\nkind = \"crash\"\nnode = \"late\"\n";
    let s = ok(&src);
    let late = s.node_by_name("late").unwrap();
    assert_eq!(late.start, Duration::from_secs(1800));
    assert_eq!(s.churn()[0].action, ChurnAction::Join(vec![late.id]));
    assert_eq!(s.churn()[0].source, EventSource::Churn(0));
    assert_eq!(s.initial_nodes().count(), 2);
}

#[test]
fn events_at_equal_times_keep_file_order_after_node_starts() {
    let src = edit("step_time = \"1s\"\n\n[stop]", "step_time = \"1s\"\nstart = \"1h\"\n\n[stop]")
        + "[[churn]]\nat = \"1h\"\nkind = \"crash\"\nnode = \"us-1\"\n[[churn]]\nat = \"1h\"\nkind = \"crash\"\nnode = \"eu\"\n";
    let s = ok(&src);
    let sources: Vec<EventSource> = s.churn().iter().map(|e| e.source).collect();
    // The eu node starts at 1h and crashes at 1h: its join comes first.
    assert_eq!(sources, [EventSource::NodeStart(1), EventSource::Churn(0), EventSource::Churn(1)]);
}

#[test]
fn seed_can_be_overridden() {
    let mut s = ok(&format!("seed = 42\n{BASE}"));
    assert_eq!(s.seed(), 42);
    s.set_seed(7);
    assert_eq!(s.seed(), 7);
}

#[test]
fn inner_lr_schedule() {
    let d = DilocoSpec {
        warmup_steps: 10,
        decay: Some(Decay { start: 100, steps: 100 }),
        inner_lr: 1.0,
        ..DilocoSpec::default()
    };
    assert_eq!(d.inner_lr_at(0), 0.0);
    assert_eq!(d.inner_lr_at(5), 0.5);
    assert_eq!(d.inner_lr_at(10), 1.0);
    assert_eq!(d.inner_lr_at(99), 1.0);
    assert_eq!(d.inner_lr_at(100), 1.0);
    assert!((d.inner_lr_at(125) - 0.5).abs() < 1e-12);
    assert_eq!(d.inner_lr_at(200), 0.0);
    assert_eq!(d.inner_lr_at(10_000), 0.0);
    let flat = DilocoSpec { warmup_steps: 0, ..DilocoSpec::default() };
    assert_eq!(flat.inner_lr_at(0), 7.5e-5);
}

#[test]
fn load_reads_a_file_and_reports_io_errors() {
    let e = Scenario::load("/nonexistent/loco/x.toml").unwrap_err();
    assert_eq!(e.location, None);
    assert!(matches!(*e.kind, ErrorKind::Io { .. }));
    assert!(e.to_string().starts_with("/nonexistent/loco/x.toml: cannot read the file: "), "{e}");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/small.toml");
    if let Ok(s) = Scenario::load(path) {
        assert_eq!(s.name(), "small");
    } else {
        // scenarios/ is checked by tests/scenarios.rs; here only the reading path matters.
        assert!(!std::path::Path::new(path).exists());
    }
}

// ---------------------------------------------------------------------------------------------
// Errors: file, line:column, field path, what was expected
// ---------------------------------------------------------------------------------------------

#[test]
fn rate_error_names_everything() {
    let src = edit("bandwidth = \"1Gbit/s\"", "bandwidth = \"fast\"");
    assert_msg(
        &src,
        "\"fast\"",
        r#"links[1].bandwidth: expected a rate like "500Mbit/s", got "fast""#,
    );
    let e = err(&src);
    assert_eq!(e.file, "t.toml");
    assert_eq!(e.location, Some(Location { line: 18, column: 13 }));
    assert_eq!(e.path.to_string(), "links[1].bandwidth");
    assert_eq!(
        *e.kind,
        ErrorKind::Expected {
            expected: r#"a rate like "500Mbit/s""#.into(),
            got: "\"fast\"".into()
        }
    );
    // A bare number is not a rate.
    let src = edit("bandwidth = \"1Gbit/s\"", "bandwidth = 1000");
    assert_msg(
        &src,
        "1000",
        r#"links[1].bandwidth: expected a rate with its unit, like "500Mbit/s" or "100MB/s", got 1000"#,
    );
    let src = edit("bandwidth = \"1Gbit/s\"", "bandwidth = \"0Gbit/s\"");
    assert_msg(
        &src,
        "\"0Gbit/s\"",
        r#"links[1].bandwidth: expected a positive rate like "500Mbit/s", got "0Gbit/s""#,
    );
}

#[test]
fn errors_inside_varying_values() {
    let src = edit("bandwidth = \"1Gbit/s\"", "bandwidth = { trace = [[\"1h\", \"1Gbit/s\"]] }");
    assert_msg(
        &src,
        "\"1h\"",
        r#"links[1].bandwidth.trace[0][0]: expected "0s" (a trace starts at the start of the run), got "1h""#,
    );
    let src = edit(
        "bandwidth = \"1Gbit/s\"",
        "bandwidth = { trace = [[0, \"1Gbit/s\"], [\"2h\", \"slow\"]] }",
    );
    assert_msg(
        &src,
        "\"slow\"",
        r#"links[1].bandwidth.trace[1][1]: expected a rate like "500Mbit/s", got "slow""#,
    );
    let src = edit(
        "bandwidth = \"1Gbit/s\"",
        "bandwidth = { trace = [[0, \"1Gbit/s\"], [0, \"2Gbit/s\"]] }",
    );
    assert_msg(
        &src,
        "0, \"2G",
        r#"links[1].bandwidth.trace[1][0]: expected a time after 0s (the previous point), got 0"#,
    );
    let src = edit("bandwidth = \"1Gbit/s\"", "bandwidth = { uniform = [\"1Gbit/s\"] }");
    assert_msg(
        &src,
        "[\"1Gbit/s\"]",
        "links[1].bandwidth.uniform: expected two values [low, high], got 1 values",
    );
    let src =
        edit("bandwidth = \"1Gbit/s\"", "bandwidth = { uniform = [\"2Gbit/s\", \"1Gbit/s\"] }");
    assert_msg(
        &src,
        "\"1Gbit/s\"]",
        r#"links[1].bandwidth.uniform[1]: expected an upper bound >= the lower bound "2Gbit/s", got "1Gbit/s""#,
    );
    let src =
        edit("latency = \"40ms\"", "latency = { trace = [[0, \"40ms\"]], resample = \"1h\" }");
    assert_msg(&src, "\"1h\"", "links[1].latency.resample: resample applies to uniform only");
    let src = edit(
        "bandwidth = \"1Gbit/s\"",
        "bandwidth = { uniform = [\"1Gbit/s\", \"2Gbit/s\"], seed = 3 }",
    );
    let e = err(&src);
    assert_eq!(e.path.to_string(), "links[1].bandwidth.seed", "{e}");
    assert_eq!(e.location.unwrap().to_string(), pos(&src, "seed"));
    assert!(e.to_string().contains("unknown field `seed`"), "{e}");
}

#[test]
fn toml_syntax_errors_have_positions() {
    let src = "name = \"t\nseed = 1\n";
    let e = err(src);
    assert_eq!(e.file, "t.toml");
    assert_eq!(e.location.map(|l| l.line), Some(1));
    assert!(matches!(*e.kind, ErrorKind::Toml { .. }));
}

#[test]
fn unknown_keys_are_rejected_with_their_path() {
    let src = format!("nmae = \"x\"\n{BASE}");
    let e = err(&src);
    assert_eq!(e.path.to_string(), "nmae");
    assert_eq!(e.location, Some(Location { line: 1, column: 1 }));
    assert!(
        e.to_string().starts_with("t.toml:1:1: nmae: unknown field `nmae`, expected one of"),
        "{e}"
    );
    let src = edit("latency = \"40ms\"", "latency = \"40ms\"\nbandwith = \"1Gbit/s\"");
    let e = err(&src);
    assert_eq!(e.path.to_string(), "links[1].bandwith");
    assert_eq!(e.location.unwrap().to_string(), pos(&src, "bandwith"));
    let src = edit("count = 2", "count = 2\ngpu = 8");
    let e = err(&src);
    assert_eq!(e.path.to_string(), "nodes[0].gpu");
    assert_eq!(e.location.unwrap().to_string(), pos(&src, "gpu ="));
}

#[test]
fn wrong_toml_types_say_what_was_expected() {
    let src = format!("seed = \"x\"\n{BASE}");
    let e = err(&src);
    assert_eq!(e.path.to_string(), "seed");
    assert_eq!(e.location.unwrap().to_string(), pos(&src, "\"x\""));
    assert!(e.to_string().contains("expected a non-negative integer, got string \"x\""), "{e}");
    let src = edit("count = 2", "count = -2");
    let e = err(&src);
    assert_eq!(e.path.to_string(), "nodes[0].count");
    assert_eq!(e.location.unwrap().to_string(), pos(&src, "-2"));
    let src = edit("bandwidth = \"1Gbit/s\"", "bandwidth = [1, 2]");
    let e = err(&src);
    assert_eq!(e.path.to_string(), "links[1].bandwidth");
    assert!(e.to_string().contains("got sequence"), "{e}");
}

#[test]
fn missing_required_fields() {
    let src = BASE.replacen("name = \"t\"\n", "", 1);
    assert_msg(
        &src,
        "[model]",
        "name: missing required field, expected the scenario's name, a string",
    );
    let src = BASE.replace("[stop]\nouter_steps = 3\n", "");
    let e = err(&src);
    assert_eq!(e.location, Some(Location { line: 1, column: 1 }));
    assert_eq!(e.path.to_string(), "stop");
    let src = BASE.replace("outer_steps = 3\n", "");
    assert_msg(
        &src,
        "[stop]",
        r#"stop: missing required field, expected outer_steps = N, time = "24h", or both (the run stops at the first reached)"#,
    );
    let src = edit("preset = \"tiny\"", "layers = 2");
    assert_msg(
        &src,
        "[model]",
        "model.dim: missing required field, expected an integer >= 1 (or set model.preset)",
    );
    let src = edit("region = \"eu\"\nstep_time = \"1s\"", "region = \"eu\"");
    assert_msg(
        &src,
        "[[nodes]]\nname = \"eu\"",
        r#"nodes[1].step_time: missing required field, expected the time of one inner step, like "22.8s""#,
    );
    let src = edit("to = \"eu\"\nbandwidth = \"1Gbit/s\"\n", "to = \"eu\"\n");
    assert_msg(
        &src,
        "[[links]]\nfrom = \"us\"\nto = \"eu\"",
        r#"links[1].bandwidth: missing required field, expected a rate like "500Mbit/s""#,
    );
}

#[test]
fn unknown_and_duplicate_names() {
    let src = edit("region = \"eu\"", "region = \"asia\"");
    assert_msg(
        &src,
        "\"asia\"",
        r#"nodes[1].region: unknown region "asia", expected one of "us", "eu""#,
    );
    let src = edit("name = \"eu\"\nregion", "name = \"us-1\"\nregion");
    assert_msg(&src, "\"us-1\"", r#"nodes[1].name: duplicate node "us-1" (first at nodes[0])"#);
    let src = edit("[[regions]]\nname = \"eu\"", "[[regions]]\nname = \"us\"");
    assert_msg(
        &src,
        "\"us\"\n\n",
        r#"regions[1].name: duplicate region "us" (first at regions[0])"#,
    );
    let src = edit("name = \"eu\"\nregion", "name = \"e u\"\nregion");
    assert_msg(
        &src,
        "\"e u\"",
        r#"nodes[1].name: expected a name of letters, digits, '-', '_' or '.', got "e u""#,
    );
    let src = BASE.to_owned()
        + "[[links]]\nfrom = \"eu\"\nto = \"us\"\nbandwidth = \"1Gbit/s\"\nlatency = \"1ms\"\n";
    let e = err(&src);
    assert_eq!(e.path.to_string(), "links[3].to");
    assert_eq!(
        *e.kind,
        ErrorKind::Duplicate { what: "link", name: "eu -> us".into(), first: "links[1]".into() }
    );
}

#[test]
fn missing_link_names_the_regions_and_nodes() {
    let src = edit(
        "[[links]]\nfrom = \"us\"\nto = \"eu\"\nbandwidth = \"1Gbit/s\"\nlatency = \"40ms\"\n",
        "",
    );
    assert_msg(
        &src,
        "\"eu\"\nstep",
        r#"nodes[1].region: no link from region "us" to region "eu" (needed by the coordinator and node "eu"); add a [[links]] entry with from = "us", to = "eu""#,
    );
    // Two nodes in one region need the region's own link.
    let src = edit(
        "[[links]]\nfrom = \"us\"\nto = \"us\"\nbandwidth = \"4Gbit/s\"\nlatency = \"5ms\"\n",
        "",
    );
    let e = err(&src);
    assert_eq!(
        *e.kind,
        ErrorKind::NoLink {
            from: "us".into(),
            to: "us".into(),
            needed_by: "needed by the coordinator and node \"us-0\"".into()
        }
    );
    assert_eq!(e.location.unwrap().to_string(), pos(&src, "\"us\"\nstep"));
}

#[test]
fn value_constraints() {
    let src = edit("step_time = \"1s\"\n[[nodes]]", "step_time = \"0s\"\n[[nodes]]");
    assert_msg(&src, "\"0s\"", r#"nodes[0].step_time: expected a duration above 0, got "0s""#);
    let src = edit("step_time = \"1s\"\n[[nodes]]", "step_time = -1\n[[nodes]]");
    assert_msg(&src, "-1", "nodes[0].step_time: expected a non-negative duration, got -1");
    let src = edit("step_time = \"1s\"\n[[nodes]]", "step_time = \"soon\"\n[[nodes]]");
    assert_msg(
        &src,
        "\"soon\"",
        r#"nodes[0].step_time: expected a duration like "22.8s" or "38min", got "soon""#,
    );
    let src = format!("{BASE}[diloco]\ninner_steps = 0\n");
    assert_msg(&src, "0\n", "diloco.inner_steps: expected an integer >= 1, got 0");
    let src = format!("{BASE}[diloco]\nouter_lr = -0.5\n");
    assert_msg(&src, "-0.5", "diloco.outer_lr: expected a number > 0, got -0.5");
    let src = format!("{BASE}[diloco]\nouter_momentum = 1.0\n");
    assert_msg(&src, "1.0", "diloco.outer_momentum: expected a number in [0, 1), got 1");
    let src = format!("{BASE}[diloco]\ncodec = \"int4\"\n");
    assert_msg(
        &src,
        "\"int4\"",
        r#"diloco.codec: expected one of "fp32", "fp16", "bf16", "uint8", "int8-block", "int4-block", "sparse", got "int4""#,
    );
    // The sparse codec's parameters: in range, only with it, error feedback in sync mode only.
    for (extra, want) in [
        ("sparse_density = 0.5", "sparse_density: applies only with codec = \"sparse\""),
        (
            "codec = \"sparse\"\nsparse_density = 0",
            "sparse_density: expected a number in (0, 1], got 0",
        ),
        (
            "codec = \"sparse\"\nsparse_chunk = 100",
            "sparse_chunk: expected an integer in 256..=65536, got 100",
        ),
        ("codec = \"sparse\"\nsparse_bits = 1", "sparse_bits: expected an integer in 2..=8, got 1"),
        (
            "codec = \"sparse\"\nerror_feedback = 1.5",
            "error_feedback: expected a number in [0, 1], got 1.5",
        ),
        ("codec = \"sparse\"\nmode = \"overlap\"", "error feedback runs in sync mode only"),
    ] {
        let e = err(&format!("{BASE}[diloco]\n{extra}\n")).to_string();
        assert!(e.contains(want), "{extra}: {e}");
    }
    let ok = |extra: &str| {
        let src = format!("{BASE}[diloco]\n{extra}\n");
        Scenario::from_toml_str(&src, "t.toml").unwrap_or_else(|e| panic!("{e}"))
    };
    let s = ok("codec = \"sparse\"\nsparse_density = 0.02\nsparse_bits = 4\nsparse_chunk = 1024");
    assert_eq!(s.diloco().codec, CodecKind::Sparse(SparseSpec { chunk: 1024, keep: 20, bits: 4 }));
    assert_eq!(s.diloco().error_feedback, Some(crate::scenario::DEFAULT_ERROR_FEEDBACK));
    let s = ok("codec = \"sparse\"\nmode = \"overlap\"\nerror_feedback = 0");
    assert_eq!(s.diloco().error_feedback, None);
    let src = format!("{BASE}[diloco]\nmode = \"eager\"\n");
    assert_msg(
        &src,
        "\"eager\"",
        r#"diloco.mode: expected one of "sync", "overlap", "streaming", got "eager""#,
    );
    let src = format!("{BASE}[diloco]\nmode = \"streaming\"\nfragments = 3\n");
    assert_eq!(
        err(&src).to_string(),
        format!(
            "t.toml:{}: diloco.fragments: expected a divisor of inner_steps (100): a round is inner_steps / fragments inner steps, got 3",
            pos_last(&src, "3\n")
        )
    );
    let src = format!("{BASE}[diloco]\nmode = \"overlap\"\nfragments = 4\n");
    assert_eq!(
        err(&src).to_string(),
        format!(
            r#"t.toml:{}: diloco.fragments: expected 1, or mode = "streaming" (fragments are streaming DiLoCo's), got 4"#,
            pos_last(&src, "4\n")
        )
    );
    let src = format!("{BASE}[diloco]\nmix = 0.5\n");
    assert_msg(
        &src,
        "0.5",
        r#"diloco.mix: expected no mix with mode = "sync" (it weighs the merge of overlap and streaming), got 0.5"#,
    );
    let src = format!("{BASE}[diloco]\nmode = \"overlap\"\nmix = 1.0\n");
    assert_msg(&src, "1.0", "diloco.mix: expected a number in [0, 1), got 1");
    let src = format!("{BASE}[diloco]\nsync_delay = 50\n");
    assert_msg(
        &src,
        "50",
        r#"diloco.sync_delay: expected no sync_delay with mode = "sync" (it shortens the delay of overlap and streaming), got 50"#,
    );
    let src = format!("{BASE}[diloco]\nmode = \"streaming\"\nsync_delay = 10\n");
    assert_msg(
        &src,
        "10",
        "diloco.sync_delay: expected a divisor of a round (25 inner steps: inner_steps / fragments), at least 1, got 10",
    );
    let src = format!("{BASE}[diloco]\nmode = \"overlap\"\nsync_delay = 0\n");
    assert_eq!(
        err(&src).to_string(),
        format!(
            "t.toml:{}: diloco.sync_delay: expected a divisor of a round (100 inner steps: inner_steps / fragments), at least 1, got 0",
            pos_last(&src, "0\n")
        )
    );
    let src = format!("{BASE}[diloco]\ndecay_start = 2000\n");
    assert_msg(
        &src,
        "[diloco]",
        "diloco.decay_steps: missing required field, expected the length of the decay in inner steps (with decay_start)",
    );
    let src = format!("{BASE}[diloco]\ndecay_start = 10\ndecay_steps = 5\n");
    assert_msg(&src, "10\n", "diloco.decay_start: expected a step >= warmup_steps (1000), got 10");
    let src = format!("{BASE}[diloco]\nsegment = \"4Mb\"\n");
    assert_msg(&src, "\"4Mb\"", r#"diloco.segment: expected a size like "4MiB", got "4Mb""#);
    let src = format!("published = \"europe\"\n{BASE}");
    assert_msg(
        &src,
        "\"europe\"",
        r#"published: expected one of "no-communication", "usa", "usa-eu", "global", got "europe""#,
    );
    let src = edit("preset = \"tiny\"", "preset = \"7b\"");
    assert_msg(
        &src,
        "\"7b\"",
        r#"model.preset: expected one of "tiny", "150m", "1b", "10b", got "7b""#,
    );
    let src = edit("preset = \"tiny\"", "preset = \"tiny\"\nheads = 5");
    assert_msg(&src, "5", "model.heads: expected a divisor of dim (64), got 5");
    let src = edit("preset = \"tiny\"", "preset = \"tiny\"\nkv_heads = 3");
    assert_msg(&src, "3", "model.kv_heads: expected a divisor of heads (4), got 3");
    let src = edit("count = 2", "count = 2\nstep_jitter = 1.5");
    assert_msg(&src, "1.5", "nodes[0].step_jitter: expected a number in [0, 1), got 1.5");
    let src = edit("count = 2", "count = 100000");
    assert_msg(
        &src,
        "100000",
        "nodes[0].count: expected at most 65536 nodes in all, got 100000 (making 100000)",
    );
}

#[test]
fn mesh_constraints() {
    let src = format!("{BASE}[mesh]\nheartbeat = \"2s\"\nheartbeat_timeout = \"2s\"\n");
    assert_msg_last(
        &src,
        "\"2s\"",
        r#"mesh.heartbeat_timeout: expected a duration longer than mesh.heartbeat (2s), got "2s""#,
    );
    let src = format!("{BASE}[mesh]\nheartbeat = \"10s\"\n");
    assert_msg(
        &src,
        "[mesh]",
        "mesh.heartbeat_timeout: expected a duration longer than mesh.heartbeat (10s), got 6s",
    );
    let src = format!("{BASE}[mesh]\njoin_mode = \"eager\"\n");
    assert_msg(
        &src,
        "\"eager\"",
        r#"mesh.join_mode: expected one of "blocking", "non-blocking", got "eager""#,
    );
    let src = format!("{BASE}[mesh]\nring = \"fastest\"\n");
    assert_msg(
        &src,
        "\"fastest\"",
        r#"mesh.ring: expected one of "measured", "ids", got "fastest""#,
    );
    let ids =
        Scenario::from_toml_str(&format!("{BASE}[mesh]\nring = \"ids\"\n"), "t.toml").unwrap();
    assert_eq!(ids.mesh().ring_order, crate::mesh::RingOrder::Ids);
    let src = format!("{BASE}[mesh]\ncoordinator_region = \"mars\"\n");
    assert_msg(
        &src,
        "\"mars\"",
        r#"mesh.coordinator_region: unknown region "mars", expected one of "us", "eu""#,
    );
    let src = format!("{BASE}[mesh]\nmax_retries = 5000\n");
    let e = err(&src);
    assert_eq!(e.path.to_string(), "mesh");
    assert_eq!(e.location.unwrap().to_string(), pos(&src, "[mesh]"));
    assert!(matches!(*e.kind, ErrorKind::Conflict { .. }));
    let src = format!("{BASE}[mesh]\nmax_update_ratio = 0.5\n");
    let e = err(&src);
    assert_eq!(e.path.to_string(), "mesh");
    assert!(e.to_string().contains("mesh.max_update_ratio is 0.5"), "{e}");
    let guarded =
        Scenario::from_toml_str(&format!("{BASE}[mesh]\nmax_update_ratio = 10\n"), "t.toml");
    assert_eq!(guarded.unwrap().mesh().max_update_ratio, 10.0);
}

#[test]
fn backend_section_constraints() {
    let src = format!("{BASE}[sim]\nnumerics = \"exact\"\n");
    assert_msg(
        &src,
        "\"exact\"",
        r#"sim.numerics: expected one of "virtual", "real", got "exact""#,
    );
    let src = BASE.replace("outer_steps = 3", "time = \"2d\"") + "[sim]\nduration_limit = \"1d\"\n";
    assert_msg(
        &src,
        "\"1d\"",
        r#"sim.duration_limit: expected a limit >= stop.time (2d), got "1d""#,
    );
    let src = format!("{BASE}[sim]\ntcp = \"vegas\"\n");
    assert_msg(
        &src,
        "\"vegas\"",
        r#"sim.tcp: expected one of "cubic", "bbr", "none", got "vegas""#,
    );
    let src = format!("{BASE}[sim]\nexecutor = \"tick\"\n");
    assert_msg(
        &src,
        "\"tick\"",
        r#"sim.executor: expected one of "turmoil", "events", got "tick""#,
    );
    let src = format!("{BASE}[real]\nnetwork = \"wan\"\n");
    assert_msg(
        &src,
        "\"wan\"",
        r#"real.network: expected one of "auto", "emulated", "relay", "loopback", got "wan""#,
    );
    let src = format!("{BASE}[sim]\nouter_cost = -1e-9\n");
    assert_msg(
        &src,
        "-1e-9",
        "sim.outer_cost: expected seconds per parameter, a number >= 0 like 3.2e-9, got -1e-9",
    );
    let src = format!("{BASE}[sim]\nouter_cost = \"5ns\"\n");
    let e = err(&src);
    assert_eq!(e.path.to_string(), "sim.outer_cost");
    // 0 charges nothing; an integer is a number too.
    let s = ok(&format!("{BASE}[sim]\nouter_cost = 0\n"));
    assert_eq!(s.sim().outer_time(10_000_000_000), Duration::ZERO);
    let s = ok(&format!("{BASE}[sim]\nouter_cost = 2e-9\n"));
    assert_eq!(s.sim().outer_time(150_000_000), Duration::from_millis(300));
    assert_eq!(s.sim().outer_time(u64::MAX), Duration::from_secs_f64(u64::MAX as f64 * 2e-9));
    assert_eq!(SimSpec { outer_cost: 1e300, ..SimSpec::default() }.outer_time(2), Duration::MAX);
    assert_eq!(SimSpec::default().outer_cost, SimSpec::DEFAULT_OUTER_COST);
    // The codec's CPU time: its measured figures unless set, per frame as the ring works.
    let src = format!("{BASE}[sim]\ndecode_cost = -1\n");
    assert_msg(
        &src,
        "-1",
        "sim.decode_cost: expected seconds per value, a number >= 0 like 2.7e-10, got -1e0",
    );
    let s = ok(&format!("{BASE}[sim]\nencode_cost = 2e-9\n"));
    assert_eq!(s.sim().codec_costs(CodecKind::Uint8), (2e-9, CodecKind::Uint8.measured_cost().1));
    let sim = SimSpec { encode_cost: Some(2e-9), decode_cost: Some(1e-9), ..SimSpec::default() };
    let work = |phase, step| sim.frame_work(CodecKind::Fp32, phase, step, 1_000_000);
    assert_eq!(work(Phase::ReduceScatter, 0), Duration::from_millis(2));
    assert_eq!(work(Phase::ReduceScatter, 2), Duration::from_millis(3));
    assert_eq!(work(Phase::AllGather, 0), Duration::from_millis(4));
    assert_eq!(work(Phase::AllGather, 1), Duration::from_millis(1));
    let src = format!("{BASE}[real]\ndevice = \"gpu\"\n");
    assert_msg(&src, "\"gpu\"", r#"real.device: expected "cpu", "cuda" or "cuda:N", got "gpu""#);
    let src = format!("{BASE}[real]\nkeep = 0\n");
    assert_msg(&src, "0\n", "real.keep: expected an integer >= 1, got 0");
    let s = ok(&format!("{BASE}[real]\ndevice = \"cuda\"\n"));
    assert_eq!(s.real().device, Device::Cuda(0));
    // The precision defaults by device and can be set either way.
    assert_eq!(s.real().precision, Precision::Bf16);
    assert_eq!(ok(BASE).real().precision, Precision::F32);
    let s = ok(&format!("{BASE}[real]\ndevice = \"cuda:1\"\nprecision = \"f32\"\n"));
    assert_eq!((s.real().device, s.real().precision), (Device::Cuda(1), Precision::F32));
    let s = ok(&format!("{BASE}[real]\nprecision = \"bf16\"\n"));
    assert_eq!(s.real().precision, Precision::Bf16);
    let src = format!("{BASE}[real]\nprecision = \"fp16\"\n");
    assert_msg(&src, "\"fp16\"", r#"real.precision: expected "f32" or "bf16", got "fp16""#);
}

#[test]
fn live_recovery_costs() {
    // The defaults: what `loco bench recovery` measured.
    let s = ok(BASE);
    assert_eq!(s.sim().state_prepare_cost, 1.1e-10);
    assert_eq!(s.sim().state_receive_cost, 3.7e-10);
    assert_eq!(SimSpec::DEFAULT_STATE_PREPARE_COST, 1.1e-10);
    assert_eq!(SimSpec::DEFAULT_STATE_RECEIVE_COST, 3.7e-10);
    // 2 GB: 0.22 s to digest, 0.74 s to take in.
    assert_eq!(s.sim().state_prepare_time(2_000_000_000), Duration::from_millis(220));
    assert_eq!(s.sim().state_receive_time(2_000_000_000), Duration::from_millis(740));
    let s = ok(&format!("{BASE}[sim]\nstate_prepare_cost = 2e-10\nstate_receive_cost = 1e-9\n"));
    assert_eq!((s.sim().state_prepare_cost, s.sim().state_receive_cost), (2e-10, 1e-9));
    assert_eq!(s.sim().state_prepare_time(5_000_000_000), Duration::from_secs(1));
    assert_eq!(s.sim().state_receive_time(3_000_000_000), Duration::from_secs(3));
    // The other keeps its default; 0 (an integer is a number too) charges nothing.
    let s = ok(&format!("{BASE}[sim]\nstate_receive_cost = 0\n"));
    assert_eq!(s.sim().state_receive_time(u64::MAX), Duration::ZERO);
    assert_eq!(s.sim().state_prepare_cost, SimSpec::DEFAULT_STATE_PREPARE_COST);
    let s = ok(&format!("{BASE}[sim]\nstate_prepare_cost = 0\n"));
    assert_eq!(s.sim().state_prepare_time(u64::MAX), Duration::ZERO);
    assert_eq!(s.sim().state_receive_cost, SimSpec::DEFAULT_STATE_RECEIVE_COST);
    let huge =
        SimSpec { state_prepare_cost: 1e300, state_receive_cost: 1e300, ..SimSpec::default() };
    assert_eq!(huge.state_prepare_time(2), Duration::MAX);
    assert_eq!(huge.state_receive_time(2), Duration::MAX);
    // Refused: a negative number, with the field named and the value shown.
    let src = format!("{BASE}[sim]\nstate_prepare_cost = -1e-10\n");
    assert_msg(
        &src,
        "-1e-10",
        "sim.state_prepare_cost: expected seconds per byte, a number >= 0 like 1.1e-10, got -1e-10",
    );
    let src = format!("{BASE}[sim]\nstate_receive_cost = -2.5\n");
    assert_msg(
        &src,
        "-2.5",
        "sim.state_receive_cost: expected seconds per byte, a number >= 0 like 3.7e-10, got -2.5e0",
    );
    // Not numbers, or not finite.
    for key in ["state_prepare_cost", "state_receive_cost"] {
        for bad in ["\"1ns\"", "true", "inf", "nan"] {
            let e = err(&format!("{BASE}[sim]\n{key} = {bad}\n"));
            assert_eq!(e.path.to_string(), format!("sim.{key}"), "{key} = {bad}: {e}");
        }
    }
}

#[test]
fn churn_field_errors() {
    let churn = |body: &str| format!("{BASE}[[churn]]\n{body}");
    let src = churn("at = \"1h\"\nkind = \"explode\"\nnode = \"eu\"\n");
    assert_msg(
        &src,
        "\"explode\"",
        r#"churn[0].kind: expected one of "join", "leave", "crash", "hang", "resume", "restart", "partition", "heal", "degrade", "restore", "coordinator-crash", "coordinator-pause", got "explode""#,
    );
    let src = churn("at = \"1h\"\nkind = \"crash\"\nnodes = [\"eu\", \"us-7\"]\n");
    assert_msg(
        &src,
        "\"us-7\"",
        r#"churn[0].nodes[1]: unknown node "us-7", expected one of "us-0", "us-1", "eu""#,
    );
    let src = churn("at = \"1h\"\nkind = \"crash\"\nnodes = [\"eu\", \"eu\"]\n");
    assert_msg(
        &src,
        "\"eu\"]",
        r#"churn[0].nodes[1]: duplicate node "eu" (first at churn[0].nodes[0])"#,
    );
    let src = churn("at = \"1h\"\nkind = \"crash\"\nnode = \"eu\"\nbandwidth = \"1Gbit/s\"\n");
    assert_msg_last(
        &src,
        "\"1Gbit/s\"",
        "churn[0].bandwidth: `bandwidth` does not apply to a crash event",
    );
    let src = churn("at = \"1h\"\nkind = \"crash\"\n");
    assert_msg(
        &src,
        "[[churn]]",
        r#"churn[0].node: missing required field, expected node = "name" or nodes = ["a", "b"]"#,
    );
    let src = churn("kind = \"crash\"\nnode = \"eu\"\n");
    assert_msg(
        &src,
        "[[churn]]",
        r#"churn[0].at: missing required field, expected the time of the event, like "3h""#,
    );
    let src = churn("at = \"1h\"\nkind = \"partition\"\nfrom = \"us\"\n");
    assert_msg(&src, "[[churn]]", "churn[0].to: missing required field, expected the other region");
    let src = churn("at = \"1h\"\nkind = \"partition\"\nfrom = \"us\"\nto = \"us\"\n");
    assert_msg_last(
        &src,
        "\"us\"\n",
        r#"churn[0].to: expected a region other than `from`, got "us""#,
    );
    let src = churn("at = \"1h\"\nkind = \"degrade\"\nfrom = \"us\"\nto = \"eu\"\n");
    assert_msg(
        &src,
        "[[churn]]",
        "churn[0].bandwidth: missing required field, expected bandwidth, latency or jitter: what the link changes to",
    );
    let src = edit("step_time = \"1s\"\n\n[stop]", "step_time = \"1s\"\nstart = \"0s\"\n\n[stop]")
        + "[[churn]]\nat = \"1h\"\nkind = \"join\"\nnode = \"eu\"\n";
    assert_msg_last(
        &src,
        "\"eu\"\n",
        r#"churn[0].node: node "eu" already has a start (nodes[1].start = 0s); a join event cannot start it again (restart brings back a node that crashed or left)"#,
    );
}

#[test]
fn a_crash_can_wait_for_a_phase() {
    let churn = |body: &str| format!("{BASE}[[churn]]\n{body}");
    let s = ok(&churn("at = \"2s\"\nkind = \"crash\"\nnode = \"eu\"\nduring = \"all-gather\"\n"));
    let c = &s.churn()[0];
    assert_eq!((c.at, c.during), (Duration::from_secs(2), Some(FaultPhase::AllGather)));
    assert!(matches!(&c.action, ChurnAction::Crash(ids) if ids == &[NodeId(2)]));
    for (name, phase) in FaultPhase::ALL {
        assert_eq!(FaultPhase::parse(name), Some(phase));
        assert_eq!(phase.to_string(), name);
    }
    let s = ok(&churn("at = \"2s\"\nkind = \"crash\"\nnode = \"eu\"\n"));
    assert_eq!(s.churn()[0].during, None);
    let src = churn("at = \"2s\"\nkind = \"crash\"\nnode = \"eu\"\nduring = \"lunch\"\n");
    assert_msg_last(
        &src,
        "\"lunch\"",
        r#"churn[0].during: expected one of "compute", "reduce-scatter", "all-gather", "state-send", "checkpoint", got "lunch""#,
    );
    let src = churn("at = \"2s\"\nkind = \"leave\"\nnode = \"eu\"\nduring = \"compute\"\n");
    assert_msg_last(
        &src,
        "\"compute\"",
        "churn[0].during: `during` does not apply to a leave event",
    );
    let s = ok(&churn(
        "at = \"2s\"\nkind = \"crash\"\nnode = \"eu\"\nduring = \"compute\"\nstep = 4\n",
    ));
    assert_eq!((s.churn()[0].during, s.churn()[0].from_step), (Some(FaultPhase::Compute), Some(4)));
    assert_eq!(
        ok(&churn("at = \"2s\"\nkind = \"crash\"\nnode = \"eu\"\n")).churn()[0].from_step,
        None
    );
    let e = err(&churn("at = \"2s\"\nkind = \"crash\"\nnode = \"eu\"\nstep = 4\n")).to_string();
    assert!(
        e.contains("churn[0].during: missing") && e.contains("`step` arms a crash with `during`"),
        "{e}"
    );
    let src = churn("at = \"2s\"\nkind = \"leave\"\nnode = \"eu\"\nstep = 4\n");
    assert_msg_last(&src, "4", "churn[0].step: `step` does not apply to a leave event");
}

fn assert_msg_last(src: &str, needle: &str, rest: &str) {
    let e = err(src);
    assert_eq!(e.to_string(), format!("t.toml:{}: {rest}", pos_last(src, needle)));
}

fn event(at: &str, kind: &str, extra: &str) -> String {
    format!("[[churn]]\nat = \"{at}\"\nkind = \"{kind}\"\n{extra}")
}

#[test]
fn impossible_churn_sequences() {
    let eu = "node = \"eu\"\n";
    let src = BASE.to_owned() + &event("1h", "crash", eu) + &event("2h", "crash", eu);
    assert_msg_last(
        &src,
        "\"eu\"",
        r#"churn[1].node: cannot crash node "eu" at 2h: it crashed at 1h"#,
    );
    let src = BASE.to_owned() + &event("1h", "restart", eu);
    assert_msg_last(
        &src,
        "\"eu\"",
        r#"churn[0].node: cannot restart node "eu" at 1h: it is running"#,
    );
    let src = BASE.to_owned() + &event("1h", "hang", eu) + &event("2h", "leave", eu);
    assert_msg_last(
        &src,
        "\"eu\"",
        r#"churn[1].node: cannot stop node "eu" at 2h: it hangs since 1h"#,
    );
    let src = BASE.to_owned() + &event("1h", "resume", "nodes = [\"us-0\", \"eu\"]\n");
    assert_msg_last(
        &src,
        "\"us-0\"",
        r#"churn[0].nodes[0]: cannot resume node "us-0" at 1h: it is running"#,
    );
    let late = edit("step_time = \"1s\"\n\n[stop]", "step_time = \"1s\"\nstart = \"2h\"\n\n[stop]");
    let src = late.clone() + &event("1h", "crash", eu);
    assert_msg_last(
        &src,
        "\"eu\"",
        r#"churn[0].node: cannot crash node "eu" at 1h: it has not started yet (it starts at 2h)"#,
    );
    // The end of a hang resumes a node that crashed meanwhile: blamed on `for`.
    let src = BASE.to_owned()
        + &event("1h", "hang", "node = \"eu\"\nfor = \"1h\"\n")
        + &event("90min", "crash", eu);
    assert_msg_last(
        &src,
        "\"1h\"",
        r#"churn[0].for: cannot resume node "eu" at 2h: it crashed at 1h30min"#,
    );
    let src = BASE.to_owned() + &event("1h", "heal", "");
    assert_msg_last(&src, "[[churn]]", "churn[0]: no partition is in place at 1h");
    let src = BASE.to_owned()
        + &event("1h", "partition", "from = \"us\"\nto = \"eu\"\n")
        + &event("2h", "heal", "from = \"eu\"\nto = \"us\"\noneway = true\n");
    assert_msg_last(&src, "[[churn]]", "churn[1]: no such partition is in place at 2h");
    let src = BASE.to_owned()
        + &event("1h", "partition", "from = \"us\"\nto = \"eu\"\n")
        + &event("2h", "partition", "from = \"eu\"\nto = \"us\"\n");
    assert_msg_last(&src, "[[churn]]", "churn[1]: this partition is already in place at 2h");
    let src = BASE.to_owned() + &event("1h", "restore", "from = \"us\"\nto = \"eu\"\n");
    assert_msg_last(&src, "[[churn]]", r#"churn[0]: the link "us" -> "eu" is not degraded at 1h"#);
    let src = BASE.to_owned()
        + &event("1h", "coordinator-crash", "")
        + &event("2h", "coordinator-crash", "");
    assert_msg_last(&src, "[[churn]]", "churn[1]: the coordinator already crashed at 1h");
    let src = BASE.to_owned() + &event("1h", "coordinator-pause", "");
    assert_msg_last(
        &src,
        "[[churn]]",
        r#"churn[0].for: missing required field, expected how long the coordinator's process is stopped, like "18s""#,
    );
    let src = BASE.to_owned()
        + &event("1h", "coordinator-pause", "for = \"20s\"\n")
        + &event("1h10s", "coordinator-pause", "for = \"5s\"\n");
    assert_msg_last(
        &src,
        "[[churn]]",
        "churn[1]: the coordinator is already paused at 1h10s (since 1h)",
    );
    let src = BASE.to_owned()
        + &event("1h", "coordinator-pause", "for = \"20s\"\n")
        + &event("1h10s", "coordinator-crash", "");
    assert_msg_last(
        &src,
        "[[churn]]",
        "churn[1]: the coordinator is paused at 1h10s (since 1h): a crash comes after its pause ends",
    );
    let src = BASE.to_owned()
        + &event("1h", "coordinator-crash", "")
        + &event("2h", "coordinator-pause", "for = \"20s\"\n");
    assert_msg_last(&src, "[[churn]]", "churn[1]: the coordinator crashed at 1h");
    // A pause, then another after it ends, then a crash: all fine.
    let src = BASE.to_owned()
        + &event("1h", "coordinator-pause", "for = \"20s\"\n")
        + &event("1h20s", "coordinator-pause", "for = \"20s\"\n")
        + &event("2h", "coordinator-crash", "");
    assert!(parse(&src).is_ok(), "{:?}", parse(&src).err());
    let src = late + &event("0s", "join", "node = \"us-0\"\n");
    assert_msg_last(
        &src,
        "\"0s\"",
        r#"churn[0].at: expected a time after 0s (nodes present from the start need no join event), got "0s""#,
    );
}

#[test]
fn a_healed_region_partition_matches_either_order() {
    let src = BASE.to_owned()
        + &event("1h", "partition", "from = \"us\"\nto = \"eu\"\n")
        + &event("2h", "heal", "from = \"eu\"\nto = \"us\"\n")
        + &event("3h", "partition", "nodes = [\"eu\", \"us-0\"]\n")
        + &event("4h", "heal", "nodes = [\"us-0\", \"eu\"]\n");
    let s = ok(&src);
    assert_eq!(s.churn().len(), 4);
    assert_eq!(s.churn()[2].action, ChurnAction::Partition(Cut::Nodes(vec![NodeId(0), NodeId(2)])));
}

#[test]
fn inline_tables_and_dotted_keys_are_located() {
    let src = BASE.replacen("[model]\npreset = \"tiny\"\n", "model = { preset = \"7b\" }\n", 1);
    assert_msg(
        &src,
        "\"7b\"",
        r#"model.preset: expected one of "tiny", "150m", "1b", "10b", got "7b""#,
    );
    let src = BASE.replacen("[model]\npreset = \"tiny\"\n", "model.preset = \"7b\"\n", 1);
    assert_msg(
        &src,
        "\"7b\"",
        r#"model.preset: expected one of "tiny", "150m", "1b", "10b", got "7b""#,
    );
}

#[test]
fn streaming_mode_counts_rounds_of_a_fragment_each() {
    let src = format!(
        "{BASE}[diloco]\ninner_steps = 100\nmode = \"streaming\"\nfragments = 4\nmix = 0.25\n"
    );
    let s = Scenario::from_toml_str(&src, "t.toml").unwrap();
    let d = s.diloco();
    assert_eq!((d.mode, d.fragments, d.mix), (crate::diloco::Mode::Streaming, 4, 0.25));
    assert_eq!((d.round_steps(), d.rounds_per_step()), (25, 4));
    let sched = d.schedule(10, &[]);
    assert_eq!(sched.fragments, vec![0..2, 2..5, 5..7, 7..10]);
    let mut s = s;
    s.set_mode(crate::diloco::Mode::Overlap, None, None, None).unwrap();
    assert_eq!((s.diloco().round_steps(), s.diloco().rounds_per_step()), (100, 1));
    assert!(s.set_mode(crate::diloco::Mode::Streaming, Some(3), None, None).is_err());
    assert!(s.set_mode(crate::diloco::Mode::Sync, None, Some(0.5), None).is_err());
    // The default of streaming is 4 fragments.
    s.set_mode(crate::diloco::Mode::Sync, None, None, None).unwrap();
    s.set_mode(crate::diloco::Mode::Streaming, None, None, None).unwrap();
    assert_eq!(s.diloco().fragments, 4);
    // A shorter delay: rounds of `sync_delay`, a sync every `sync_period / sync_delay`.
    s.set_mode(crate::diloco::Mode::Streaming, None, None, Some(5)).unwrap();
    let d = s.diloco();
    assert_eq!(
        (d.sync_period(), d.round_steps(), d.rounds_per_step(), d.sync_every()),
        (25, 5, 20, 5)
    );
    let sched = d.schedule(10, &[]);
    assert_eq!(sched.every, 5);
    // Rounds 0-3 all-reduce nothing (at the first fragment's start), round 4 the first fragment;
    // round 5 merges it; round 9 syncs the second.
    assert_eq!(
        (0..10).map(|r| sched.fragment(r)).collect::<Vec<_>>(),
        vec![0..0, 0..0, 0..0, 0..0, 0..2, 2..2, 2..2, 2..2, 2..2, 2..5]
    );
    assert_eq!((sched.merged(5), sched.merged(6)), (Some(0..2), Some(2..2)));
    // Kept through a change of mode where it still divides the round, else the round.
    s.set_mode(crate::diloco::Mode::Overlap, None, None, None).unwrap();
    assert_eq!((s.diloco().round_steps(), s.diloco().rounds_per_step()), (5, 20));
    s.set_mode(crate::diloco::Mode::Streaming, Some(50), None, None).unwrap();
    assert_eq!(s.diloco().round_steps(), 2);
    assert!(s.set_mode(crate::diloco::Mode::Overlap, None, None, Some(3)).is_err());
    assert!(s.set_mode(crate::diloco::Mode::Sync, None, None, Some(50)).is_err());
    s.set_mode(crate::diloco::Mode::Sync, None, None, None).unwrap();
    assert_eq!((s.diloco().round_steps(), s.diloco().rounds_per_step()), (100, 1));
}

/// BASE with a stop time of 100 h and the given extra text.
fn with_failures(extra: &str) -> String {
    format!("{}\n{extra}", BASE.replace("outer_steps = 3", "time = \"100h\""))
}

#[test]
fn failures_expand_into_crashes_and_restarts_per_node() {
    let failures = "[[failures]]\nregion = \"us\"\nmtbf = \"6h\"\nrepair = \"20min\"\n";
    let src = format!("seed = 5\n{}", with_failures(failures));
    let s = ok(&src);
    let events = s.churn();
    assert!(events.iter().all(|e| e.source == EventSource::Failures(0)));
    for (k, id) in [NodeId(0), NodeId(1)].into_iter().enumerate() {
        let mine: Vec<&ChurnEvent> = events
            .iter()
            .filter(|e| match &e.action {
                ChurnAction::Crash(ids) | ChurnAction::Restart(ids) => ids == &vec![id],
                _ => false,
            })
            .collect();
        // Alternating, a crash first, every time before the stop.
        for (j, e) in mine.iter().enumerate() {
            let crash = matches!(e.action, ChurnAction::Crash(_));
            assert_eq!(crash, j % 2 == 0, "node {k}, event {j}");
            assert!(e.at < Duration::from_secs(100 * 3600));
        }
        // About 100 h / (6 h + 20 min) = 16 failures; a Poisson count is within 3 sigma.
        let crashes = mine.iter().filter(|e| matches!(e.action, ChurnAction::Crash(_))).count();
        assert!((4..=30).contains(&crashes), "node {k}: {crashes} crashes");
    }
    // The eu node is not in the region: untouched.
    assert!(
        events
            .iter()
            .all(|e| !matches!(&e.action, ChurnAction::Crash(ids) if ids.contains(&NodeId(2))))
    );
    // The same file, the same events; another seed, others.
    assert_eq!(ok(&src).churn(), events);
    assert_ne!(ok(&src.replace("seed = 5", "seed = 6")).churn(), events);
}

#[test]
fn failure_processes_have_the_mean_they_are_given() {
    // 100 nodes over 100 h, mtbf 2 h, Weibull shape 2: the mean up time is 2 h.
    let src = with_failures("[[failures]]\nmtbf = \"2h\"\nshape = 2.0\nrepair = \"1min\"\n")
        .replace("count = 2", "count = 100");
    let s = ok(&src);
    let mut ups = Vec::new();
    let mut last_restart: std::collections::BTreeMap<NodeId, Duration> = Default::default();
    for e in s.churn() {
        match &e.action {
            ChurnAction::Crash(ids) => {
                let from = last_restart.get(&ids[0]).copied().unwrap_or_default();
                ups.push((e.at - from).as_secs_f64());
            }
            ChurnAction::Restart(ids) => {
                last_restart.insert(ids[0], e.at);
            }
            _ => {}
        }
    }
    let mean = ups.iter().sum::<f64>() / ups.len() as f64 / 3600.0;
    // Censoring at the stop shortens the mean slightly; thousands of draws.
    assert!(ups.len() > 3000, "{}", ups.len());
    assert!((1.9..2.1).contains(&mean), "mean up time {mean} h");
}

#[test]
fn failures_other_kinds_and_errors() {
    let s = ok(&with_failures(
        "[[failures]]\nnodes = [\"eu\"]\nkind = \"hang\"\nmtbf = \"10h\"\nrepair = \"1h\"\nfrom = \"1h\"\nuntil = \"50h\"\n",
    ));
    assert!(!s.churn().is_empty());
    for e in s.churn() {
        assert!(e.at >= Duration::from_secs(3600) && e.at < Duration::from_secs(50 * 3600));
        assert!(
            matches!(&e.action, ChurnAction::Hang(ids) | ChurnAction::Resume(ids) if ids == &vec![NodeId(2)])
        );
    }
    let leave =
        ok(&with_failures("[[failures]]\nkind = \"leave\"\nmtbf = \"10h\"\nrepair = \"1h\"\n"));
    assert!(leave.churn().iter().any(|e| matches!(e.action, ChurnAction::Leave(_))));
    for (extra, needle) in [
        ("[[failures]]\nrepair = \"1h\"\n", "failures[0].mtbf"),
        ("[[failures]]\nmtbf = \"1h\"\n", "failures[0].repair"),
        ("[[failures]]\nmtbf = \"1h\"\nrepair = \"1h\"\nkind = \"explode\"\n", "failures[0].kind"),
        ("[[failures]]\nmtbf = \"1h\"\nrepair = \"1h\"\nshape = 0.0\n", "failures[0].shape"),
        (
            "[[failures]]\nmtbf = \"1h\"\nrepair = \"1h\"\nnodes = [\"mars\"]\n",
            "failures[0].nodes[0]",
        ),
        ("[[failures]]\nmtbf = \"1h\"\nrepair = \"1h\"\nregion = \"moon\"\n", "failures[0].region"),
        ("[[failures]]\nmtbf = \"1h\"\nrepair = \"1h\"\nuntil = \"0s\"\n", "failures[0].until"),
        ("[[failures]]\nmtbf = \"1ms\"\nrepair = \"1ms\"\n", "failures[0].mtbf"),
        ("[[failures]]\nmtbf = \"1h\"\nrepair = \"1h\"\nnmtbf = 3\n", "nmtbf"),
    ] {
        let e = err(&with_failures(extra)).to_string();
        assert!(e.contains(needle), "{extra}: {e}");
    }
    // Without a stop time, `until` is needed.
    let e = err(&format!("{BASE}\n[[failures]]\nmtbf = \"1h\"\nrepair = \"1h\"\n")).to_string();
    assert!(e.contains("failures[0].until") && e.contains("[stop] time"), "{e}");
    // A generated crash of a node the file already crashed is refused, naming the entry.
    let e = err(&with_failures(
        "[[churn]]\nat = \"1s\"\nkind = \"crash\"\nnode = \"eu\"\n[[failures]]\nnodes = [\"eu\"]\nmtbf = \"1h\"\nrepair = \"1min\"\n",
    ))
    .to_string();
    assert!(e.contains("failures[0]") && e.contains("cannot crash node \"eu\""), "{e}");
}

/// Up times and outages from a trace: each draw is one of the observed values, each as likely.
#[test]
fn failures_from_a_trace_draw_the_observed_durations() {
    let src = with_failures(
        "[[failures]]\nup = [\"1h\", \"3h\"]\ndown = [\"1min\", \"5min\", \"10min\"]\n",
    )
    .replace("count = 2", "count = 50");
    let s = ok(&src);
    let (mut ups, mut downs) = (Vec::new(), Vec::new());
    let mut last: std::collections::BTreeMap<NodeId, Duration> = Default::default();
    let mut crashed: std::collections::BTreeMap<NodeId, Duration> = Default::default();
    for e in s.churn() {
        match &e.action {
            ChurnAction::Crash(ids) => {
                ups.push(e.at - last.get(&ids[0]).copied().unwrap_or_default());
                crashed.insert(ids[0], e.at);
            }
            ChurnAction::Restart(ids) => {
                downs.push(e.at - crashed[&ids[0]]);
                last.insert(ids[0], e.at);
            }
            _ => {}
        }
    }
    let minutes = |v: &[Duration]| -> std::collections::BTreeSet<u64> {
        v.iter().map(|d| (d.as_secs_f64() / 60.0).round() as u64).collect()
    };
    // Every up time is one of the trace's (in whole minutes; events are in whole milliseconds).
    assert_eq!(minutes(&ups), [60, 180].into_iter().collect(), "{:?}", minutes(&ups));
    assert_eq!(minutes(&downs), [1, 5, 10].into_iter().collect());
    // Each as likely: about half of the up times are the short one.
    let short = ups.iter().filter(|d| d.as_secs() < 2 * 3600).count() as f64 / ups.len() as f64;
    assert!(ups.len() > 1000 && (0.45..0.55).contains(&short), "{} {short}", ups.len());
    // A trace and a distribution for the same thing, a shape without one, an empty trace.
    for (extra, needle) in [
        ("[[failures]]\nmtbf = \"1h\"\nup = [\"1h\"]\nrepair = \"1h\"\n", "failures[0].up"),
        ("[[failures]]\nup = [\"1h\"]\nshape = 2.0\nrepair = \"1h\"\n", "failures[0].shape"),
        ("[[failures]]\nup = []\nrepair = \"1h\"\n", "failures[0].up"),
        ("[[failures]]\nup = [\"1h\", \"0s\"]\nrepair = \"1h\"\n", "failures[0].up[1]"),
        ("[[failures]]\nmtbf = \"1h\"\nrepair = \"1h\"\ndown = [\"1h\"]\n", "failures[0].down"),
    ] {
        let e = err(&with_failures(extra)).to_string();
        assert!(e.contains(needle), "{extra}: {e}");
    }
}

#[test]
fn diurnal_windows_take_nodes_offline_every_day() {
    let s = ok(&with_failures(
        "[[diurnal]]\nregion = \"eu\"\noffline_at = \"22h\"\noffline_for = \"8h\"\njitter = \"30min\"\n",
    ));
    let h = |x: f64| Duration::from_secs_f64(x * 3600.0);
    let events: Vec<&ChurnEvent> = s.churn().iter().collect();
    // 100 h: windows starting on days 0..=3 (22 h, 46 h, 70 h, 94 h), the last one cut by the stop.
    let leaves: Vec<Duration> =
        events.iter().filter(|e| matches!(e.action, ChurnAction::Leave(_))).map(|e| e.at).collect();
    let back: Vec<Duration> = events
        .iter()
        .filter(|e| matches!(e.action, ChurnAction::Restart(_)))
        .map(|e| e.at)
        .collect();
    assert_eq!((leaves.len(), back.len()), (4, 3), "{events:?}");
    for (d, at) in leaves.iter().enumerate() {
        let start = h(22.0 + 24.0 * d as f64);
        assert!(*at >= start && *at < start + h(0.5), "day {d}: {at:?}");
    }
    for (l, b) in leaves.iter().zip(&back) {
        assert_eq!(*b - *l, h(8.0));
    }
    assert!(events.iter().all(|e| e.source == EventSource::Diurnal(0)));
    assert!(events.iter().all(|e| match &e.action {
        ChurnAction::Leave(ids) | ChurnAction::Restart(ids) => ids == &vec![NodeId(2)],
        _ => false,
    }));
    for (extra, needle) in [
        ("[[diurnal]]\noffline_for = \"8h\"\n", "diurnal[0].offline_at"),
        ("[[diurnal]]\noffline_at = \"25h\"\noffline_for = \"8h\"\n", "diurnal[0].offline_at"),
        ("[[diurnal]]\noffline_at = \"1h\"\noffline_for = \"24h\"\n", "diurnal[0].offline_for"),
        ("[[diurnal]]\noffline_at = \"1h\"\n", "diurnal[0].offline_for"),
    ] {
        let e = err(&with_failures(extra)).to_string();
        assert!(e.contains(needle), "{extra}: {e}");
    }
}

#[test]
fn arrivals_start_nodes_one_after_another() {
    let s = ok(&with_failures(
        "[[arrivals]]\nnodes = [\"us-1\", \"eu\"]\nevery = \"30min\"\nfrom = \"1h\"\n",
    ));
    let joins: Vec<&ChurnEvent> =
        s.churn().iter().filter(|e| e.source == EventSource::Arrivals(0)).collect();
    assert_eq!(joins.len(), 2);
    assert_eq!(joins[0].action, ChurnAction::Join(vec![NodeId(1)]));
    assert_eq!(joins[1].action, ChurnAction::Join(vec![NodeId(2)]));
    assert!(joins[0].at > Duration::from_secs(3600) && joins[0].at < joins[1].at);
    // The nodes' starts are the arrivals; the others start with the run.
    assert_eq!(s.nodes()[1].start, joins[0].at);
    assert_eq!(s.nodes()[2].start, joins[1].at);
    assert_eq!(s.initial_nodes().count(), 1);
    // Without a list: every node of the region that would start with the run.
    let r = ok(&with_failures("[[arrivals]]\nregion = \"us\"\nevery = \"1h\"\n"));
    assert_eq!(r.initial_nodes().map(|n| n.name.as_str()).collect::<Vec<_>>(), vec!["eu"]);
    // A node with a start of its own cannot arrive too; `every` is needed.
    let e = err(&with_failures("[[arrivals]]\nnodes = [\"eu\"]\nevery = \"1h\"\n[[arrivals]]\nnodes = [\"eu\"]\nevery = \"1h\"\n")).to_string();
    assert!(e.contains("arrivals[1].nodes") && e.contains("already starts"), "{e}");
    let e = err(&with_failures("[[arrivals]]\nnodes = [\"eu\"]\n")).to_string();
    assert!(e.contains("arrivals[0].every"), "{e}");
}

#[test]
fn generated_churn_is_bounded() {
    // 1000 nodes failing every hour for a year (4,380 failures each, 8.8M events): refused,
    // not held in memory.
    let src = with_failures("[[failures]]\nmtbf = \"1h\"\nrepair = \"1h\"\nuntil = \"365d\"\n")
        .replace("count = 2", "count = 1000");
    let e = err(&src).to_string();
    assert!(e.contains("failures[0].mtbf") && e.contains("fewer events"), "{e}");
}
