//! The plots, each drawn once as SVG and once as PNG from the same code, with the bundled font.

use crate::ReportError;
use crate::format::{Unit, bytes_unit, label_text, time_unit};
use loco_core::metrics::{
    BREAKDOWN_NAMES, EventKind, EventRow, OuterStepRow, active_nodes, allreduce_samples,
    allreduce_stats, node_totals, step_totals,
};
use loss::Loss;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{FontStyle, register_font};
use std::sync::OnceLock;
use timeline::{Bandwidth, Timeline};

mod loss;
mod timeline;

/// Width of every plot, in pixels.
pub const WIDTH: u32 = 960;
/// Height of every plot, in pixels.
pub const HEIGHT: u32 = 540;

const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Colours of [`BREAKDOWN_NAMES`]: compute, all-reduce, barrier, recovery, checkpoint, outer
/// step, idle.
const BREAKDOWN_COLORS: [RGBColor; 7] = [
    RGBColor(44, 160, 44),
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(190, 190, 190),
];
const BLUE: RGBColor = RGBColor(31, 119, 180);
const DARK_RED: RGBColor = RGBColor(214, 39, 40);
const DARK_GREEN: RGBColor = RGBColor(44, 160, 44);
const GREY: RGBColor = RGBColor(127, 127, 127);
const DARK_GREY: RGBColor = RGBColor(80, 80, 80);

/// Width of the legend column right of the stacked plots, in pixels.
const LEGEND_WIDTH: u32 = 130;

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// Registers the bundled font as `sans-serif` for plotters' text layout and rasterising, once.
/// Draws the series legend of `chart` at `pos`, in the one style every plot uses.
fn draw_legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    pos: SeriesLabelPosition,
) -> DrawResult<DB> {
    chart
        .configure_series_labels()
        .position(pos)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
}

fn ensure_font() -> Result<(), ReportError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok =
        *REGISTERED.get_or_init(|| register_font("sans-serif", FontStyle::Normal, FONT).is_ok());
    if ok { Ok(()) } else { Err(ReportError::Font) }
}

/// A plot that can be drawn on any plotters backend.
trait Plot {
    /// The file stem (`name.svg`, `name.png`).
    const NAME: &'static str;
    /// Draws the plot on a white `root`.
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB>;
}

/// One plot, drawn.
#[derive(Clone, Debug)]
pub(crate) struct RenderedPlot {
    /// File stem.
    pub(crate) name: &'static str,
    /// What the plot shows, for the report's caption.
    pub(crate) caption: &'static str,
    /// The SVG document.
    pub(crate) svg: String,
    /// The PNG file.
    pub(crate) png: Vec<u8>,
}

fn plot_err<E: std::fmt::Display>(plot: &'static str) -> impl Fn(E) -> ReportError {
    move |e| ReportError::Plot { plot, message: e.to_string() }
}

fn render<P: Plot>(p: &P, caption: &'static str, png: bool) -> Result<RenderedPlot, ReportError> {
    ensure_font()?;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err(P::NAME))?;
        p.draw(&root).map_err(plot_err(P::NAME))?;
        root.present().map_err(plot_err(P::NAME))?;
    }
    if !png {
        return Ok(RenderedPlot { name: P::NAME, caption, svg, png: Vec::new() });
    }
    let mut rgb = vec![0u8; WIDTH as usize * HEIGHT as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err(P::NAME))?;
        p.draw(&root).map_err(plot_err(P::NAME))?;
        root.present().map_err(plot_err(P::NAME))?;
    }
    let png = encode_png(&rgb, WIDTH, HEIGHT)
        .map_err(|e| ReportError::Png { plot: P::NAME, message: e.to_string() })?;
    Ok(RenderedPlot { name: P::NAME, caption, svg, png })
}

/// 8-bit RGB to PNG, with fixed settings (no timestamps, no text chunks): same pixels, same bytes.
fn encode_png(rgb: &[u8], width: u32, height: u32) -> Result<Vec<u8>, png::EncodingError> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, width, height);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::Balanced);
    let mut writer = enc.write_header()?;
    writer.write_image_data(rgb)?;
    writer.finish()?;
    Ok(out)
}

/// Draws "no data" in the middle of an empty plot.
fn no_data<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    what: &str,
) -> DrawResult<DB> {
    let (w, h) = root.dim_in_pixel();
    let center =
        |dy: i32| (i32::try_from(w / 2).unwrap_or(0), i32::try_from(h / 2).unwrap_or(0) + dy);
    let style =
        TextStyle::from(("sans-serif", 24).into_font()).pos(Pos::new(HPos::Center, VPos::Center));
    root.draw_text(title, &style, center(-30))?;
    root.draw_text(what, &style.color(&GREY), center(20))?;
    Ok(())
}

fn caption_font() -> TextStyle<'static> {
    ("sans-serif", 24).into_font().into()
}

/// A range that plotters can draw: `lo < hi`, widened when the data are flat.
fn padded(lo: f64, hi: f64, pad: f64) -> std::ops::Range<f64> {
    if !(lo.is_finite() && hi.is_finite()) {
        return 0.0..1.0;
    }
    if hi > lo {
        let p = (hi - lo) * pad;
        (lo - p)..(hi + p)
    } else {
        let p = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        (lo - p)..(hi + p)
    }
}

/// `x` with up to `decimals` decimals, trailing zeros dropped.
fn tick(x: f64, decimals: usize) -> String {
    let s = format!("{x:.decimals$}");
    let s =
        if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_owned() } else { s };
    if s == "-0" { "0".to_owned() } else { s }
}

/// Integer ticks for outer steps; empty between integers.
fn int_tick(x: f64) -> String {
    if (x - x.round()).abs() < 1e-6 { tick(x.round(), 0) } else { String::new() }
}

// ---------------------------------------------------------------------------------------------
// 1. Active nodes over time, with joins, leaves, crashes and evictions marked.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Marker {
    Join,
    Leave,
    Crash,
    Evict,
}

impl Marker {
    const ALL: [Marker; 4] = [Marker::Join, Marker::Leave, Marker::Crash, Marker::Evict];
    fn label(self) -> &'static str {
        match self {
            Marker::Join => "join",
            Marker::Leave => "leave",
            Marker::Crash => "crash",
            Marker::Evict => "eviction",
        }
    }
    fn color(self) -> RGBColor {
        match self {
            Marker::Join => DARK_GREEN,
            Marker::Leave => BLUE,
            Marker::Crash => BLACK,
            Marker::Evict => DARK_RED,
        }
    }
}

struct ActiveNodes {
    /// (time, members from then on) from the events, from time 0; empty without membership events.
    members: Vec<(f64, u32)>,
    /// (time, world size of the outer step starting then) from the rows.
    world: Vec<(f64, u32)>,
    markers: Vec<(f64, u32, Marker)>,
    end_s: f64,
    unit: Unit,
}

/// The value of a step function `steps` (sorted by time) at `t`; 0 before the first step.
fn value_at(steps: &[(f64, u32)], t: f64) -> u32 {
    let i = steps.partition_point(|(s, _)| *s <= t);
    i.checked_sub(1).map_or(0, |i| steps[i].1)
}

/// `steps` as a polyline of horizontal and vertical segments, until `end`, scaled by `div`.
fn step_path(steps: &[(f64, u32)], end: f64, div: f64) -> Vec<(f64, f64)> {
    let mut path = Vec::with_capacity(steps.len() * 2);
    for (i, &(t, a)) in steps.iter().enumerate() {
        let next = steps.get(i + 1).map_or(end, |p| p.0);
        path.push((t / div, f64::from(a)));
        path.push((next.max(t) / div, f64::from(a)));
    }
    path
}

impl ActiveNodes {
    fn new(rows: &[OuterStepRow], events: &[EventRow], end_s: f64) -> ActiveNodes {
        let mut members: Vec<(f64, u32)> =
            active_nodes(events).iter().map(|p| (p.time_s, p.active)).collect();
        if members.iter().all(|(_, a)| *a == 0) {
            members.clear();
        }
        let world: Vec<(f64, u32)> =
            step_totals(rows).iter().map(|s| (s.start_s, s.world)).collect();
        let reference = if members.is_empty() { &world } else { &members };
        let markers = events
            .iter()
            .filter(|e| e.node.is_some() && e.time_s.is_finite())
            .filter_map(|e| {
                let m = match e.kind {
                    EventKind::Join => Marker::Join,
                    EventKind::Leave => Marker::Leave,
                    EventKind::Crash => Marker::Crash,
                    EventKind::Evict => Marker::Evict,
                    _ => return None,
                };
                Some((e.time_s, value_at(reference, e.time_s), m))
            })
            .collect();
        let end_s = members.iter().chain(&world).map(|p| p.0).fold(end_s, f64::max);
        ActiveNodes { members, world, markers, end_s, unit: time_unit(end_s) }
    }
}

impl Plot for ActiveNodes {
    const NAME: &'static str = "active_nodes";
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let u = self.unit;
        let x_max = (self.end_s / u.div).max(f64::MIN_POSITIVE);
        let y_max = self.members.iter().chain(&self.world).map(|p| p.1).max().unwrap_or(0) + 1;
        let mut chart = ChartBuilder::on(root)
            .caption("Active nodes", caption_font())
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(56)
            .build_cartesian_2d(0.0..x_max, 0.0..f64::from(y_max))?;
        chart
            .configure_mesh()
            .light_line_style(TRANSPARENT)
            .bold_line_style(BLACK.mix(0.12))
            .x_desc(format!("time ({})", u.name))
            .y_desc("nodes")
            .x_label_formatter(&|x| tick(*x, 2))
            .y_label_formatter(&|y| int_tick(*y))
            .draw()?;
        if !self.world.is_empty() {
            let style = GREY.stroke_width(1);
            chart
                .draw_series(LineSeries::new(step_path(&self.world, self.end_s, u.div), style))?
                .label("all-reduce world size")
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], style));
        }
        if !self.members.is_empty() {
            let style = BLUE.stroke_width(2);
            chart
                .draw_series(LineSeries::new(step_path(&self.members, self.end_s, u.div), style))?
                .label("members")
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], style));
        }
        for m in Marker::ALL {
            let pts: Vec<(f64, f64)> = self
                .markers
                .iter()
                .filter(|p| p.2 == m)
                .map(|p| (p.0 / u.div, f64::from(p.1)))
                .collect();
            if pts.is_empty() {
                continue;
            }
            let c = m.color();
            let label = m.label();
            match m {
                Marker::Join => {
                    chart
                        .draw_series(pts.iter().map(|&p| TriangleMarker::new(p, 7, c.filled())))?
                        .label(label)
                        .legend(move |(x, y)| TriangleMarker::new((x + 8, y), 6, c.filled()));
                }
                Marker::Leave => {
                    chart
                        .draw_series(pts.iter().map(|&p| Circle::new(p, 5, c.filled())))?
                        .label(label)
                        .legend(move |(x, y)| Circle::new((x + 8, y), 4, c.filled()));
                }
                Marker::Crash | Marker::Evict => {
                    chart
                        .draw_series(pts.iter().map(|&p| Cross::new(p, 6, c.stroke_width(2))))?
                        .label(label)
                        .legend(move |(x, y)| Cross::new((x + 8, y), 5, c.stroke_width(2)));
                }
            }
        }
        draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Where wall time went, per node and per outer step (stacked bars).

/// Stacked bars: one per x position, each split into [`BREAKDOWN_NAMES`] parts.
struct Stacked {
    title: &'static str,
    y_desc: String,
    x_desc: &'static str,
    /// (label, parts), in x order.
    bars: Vec<(String, [f64; 7])>,
    /// Label every bar (node names) or let plotters pick integer ticks (outer steps).
    categorical: bool,
}

fn stacked_draw<DB: DrawingBackend>(s: &Stacked, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
    if s.bars.is_empty() {
        return no_data(root, s.title, "no outer steps recorded");
    }
    let n = s.bars.len();
    let y_max = s
        .bars
        .iter()
        .map(|(_, p)| p.iter().filter(|x| x.is_finite() && **x > 0.0).sum::<f64>())
        .fold(0.0, f64::max);
    let y_max = if y_max > 0.0 { y_max * 1.05 } else { 1.0 };
    let x0: Vec<f64> = match s.categorical {
        true => (0..n).map(|i| i as f64).collect(),
        false => s.bars.iter().map(|(l, _)| l.parse().unwrap_or(0.0)).collect(),
    };
    let (lo, hi) = (x0.first().copied().unwrap_or(0.0), x0.last().copied().unwrap_or(0.0));
    let labels: Vec<&str> = s.bars.iter().map(|(l, _)| l.as_str()).collect();
    let body = root.margin(16, 0, 0, 0).titled(s.title, caption_font())?;
    let (w, _) = body.dim_in_pixel();
    let (plot, legend) = body.split_horizontally(w.saturating_sub(LEGEND_WIDTH));
    let mut chart = ChartBuilder::on(&plot)
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d((lo - 0.5)..(hi + 0.5), 0.0..y_max)?;
    let fmt = |x: &f64| {
        if s.categorical {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                return labels.get(i as usize).copied().unwrap_or("").to_owned();
            }
            String::new()
        } else {
            int_tick(*x)
        }
    };
    let mut mesh = chart.configure_mesh();
    mesh.light_line_style(TRANSPARENT).bold_line_style(BLACK.mix(0.12));
    mesh.x_desc(s.x_desc).y_desc(s.y_desc.as_str()).x_label_formatter(&fmt);
    if s.categorical {
        mesh.x_labels(n.min(40) + 1).disable_x_mesh();
    }
    mesh.draw()?;
    let half = 0.4;
    for (k, &color) in BREAKDOWN_COLORS.iter().enumerate() {
        let rects = s.bars.iter().zip(&x0).filter_map(|((_, parts), &x)| {
            let clean = |v: f64| if v.is_finite() && v > 0.0 { v } else { 0.0 };
            let base: f64 = parts[..k].iter().copied().map(clean).sum();
            let h = clean(parts[k]);
            (h > 0.0)
                .then(|| Rectangle::new([(x - half, base), (x + half, base + h)], color.filled()))
        });
        chart.draw_series(rects)?;
    }
    // The legend to the right of the plot, top to bottom in stacking order reversed (as drawn).
    let text = TextStyle::from(("sans-serif", 15).into_font());
    for (k, name) in BREAKDOWN_NAMES.iter().enumerate().rev() {
        let y = 40 + 24 * (BREAKDOWN_NAMES.len() as i32 - 1 - k as i32);
        legend.draw(&Rectangle::new([(8, y), (24, y + 16)], BREAKDOWN_COLORS[k].filled()))?;
        legend.draw_text(name, &text, (32, y))?;
    }
    Ok(())
}

struct TimeByNode(Stacked);

impl TimeByNode {
    fn new(rows: &[OuterStepRow]) -> TimeByNode {
        let bars = node_totals(rows)
            .into_iter()
            .map(|(node, t)| {
                let parts = [
                    t.compute_s,
                    t.allreduce_s,
                    t.barrier_s,
                    t.recovery_s,
                    t.checkpoint_s,
                    t.outer_s,
                    t.idle_s,
                ];
                let total: f64 = parts.iter().filter(|x| x.is_finite() && **x > 0.0).sum();
                let pct = parts.map(|p| if total > 0.0 { 100.0 * p / total } else { 0.0 });
                (label_text(&node), pct)
            })
            .collect();
        TimeByNode(Stacked {
            title: "Where each node's time went",
            y_desc: "% of the node's time".to_owned(),
            x_desc: "node",
            bars,
            categorical: true,
        })
    }
}

impl Plot for TimeByNode {
    const NAME: &'static str = "time_by_node";
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        stacked_draw(&self.0, root)
    }
}

struct TimeByStep(Stacked);

impl TimeByStep {
    fn new(rows: &[OuterStepRow]) -> TimeByStep {
        let steps = step_totals(rows);
        let longest = steps
            .iter()
            .map(|s| s.breakdown_s.iter().sum::<f64>() / f64::from(s.nodes.max(1)))
            .fold(0.0, f64::max);
        let u = time_unit(longest);
        let bars = steps
            .iter()
            .map(|s| {
                let n = f64::from(s.nodes.max(1));
                (s.outer_step.to_string(), s.breakdown_s.map(|x| x / n / u.div))
            })
            .collect();
        TimeByStep(Stacked {
            title: "Time per outer step (mean over nodes)",
            y_desc: format!("time ({})", u.name),
            x_desc: "outer step",
            bars,
            categorical: false,
        })
    }
}

impl Plot for TimeByStep {
    const NAME: &'static str = "time_by_step";
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        stacked_draw(&self.0, root)
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Distribution of all-reduce times.

struct AllreduceHist {
    /// Ascending, finite, positive; in `unit`.
    samples: Vec<f64>,
    median: f64,
    p5: f64,
    p95: f64,
    unit: Unit,
}

impl AllreduceHist {
    fn new(rows: &[OuterStepRow]) -> AllreduceHist {
        let samples = allreduce_samples(rows);
        let stats = allreduce_stats(&samples);
        let unit = time_unit(samples.last().copied().unwrap_or(0.0));
        AllreduceHist {
            samples: samples.iter().map(|x| x / unit.div).collect(),
            median: stats.median / unit.div,
            p5: stats.p5 / unit.div,
            p95: stats.p95 / unit.div,
            unit,
        }
    }

    /// (bin start, bin end, count) with `ceil(sqrt(n))` bins (5 to 40) over [min, max].
    fn bins(&self) -> Vec<(f64, f64, u32)> {
        let (Some(&lo), Some(&hi)) = (self.samples.first(), self.samples.last()) else {
            return Vec::new();
        };
        let range = padded(lo, hi, 0.0);
        let (lo, hi) = (range.start.max(0.0), range.end);
        let k = ((self.samples.len() as f64).sqrt().ceil() as usize).clamp(5, 40);
        let w = (hi - lo) / k as f64;
        let mut counts = vec![0u32; k];
        for &x in &self.samples {
            let i = (((x - lo) / w).floor().max(0.0) as usize).min(k - 1);
            counts[i] += 1;
        }
        counts
            .into_iter()
            .enumerate()
            .map(|(i, c)| (lo + w * i as f64, lo + w * (i + 1) as f64, c))
            .collect()
    }
}

impl Plot for AllreduceHist {
    const NAME: &'static str = "allreduce_hist";
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let title = "All-reduce time distribution";
        let bins = self.bins();
        let (Some(first), Some(last)) = (bins.first(), bins.last()) else {
            return no_data(root, title, "no all-reduce in this run");
        };
        let x_range = padded(first.0, last.1, 0.05);
        let y_max = f64::from(bins.iter().map(|b| b.2).max().unwrap_or(1)) * 1.15;
        let mut chart = ChartBuilder::on(root)
            .caption(title, caption_font())
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(56)
            .build_cartesian_2d(x_range, 0.0..y_max)?;
        chart
            .configure_mesh()
            .light_line_style(TRANSPARENT)
            .bold_line_style(BLACK.mix(0.12))
            .x_desc(format!(
                "all-reduce time ({}), one sample per node and outer step",
                self.unit.name
            ))
            .y_desc("samples")
            .x_label_formatter(&|x| tick(*x, 3))
            .y_label_formatter(&|y| int_tick(*y))
            .draw()?;
        chart
            .draw_series(
                bins.iter()
                    .map(|&(a, b, c)| Rectangle::new([(a, 0.0), (b, f64::from(c))], BLUE.filled())),
            )?
            .label(format!("{} samples", self.samples.len()))
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], BLUE.filled()));
        let vline = |x: f64| vec![(x, 0.0), (x, y_max)];
        chart
            .draw_series(LineSeries::new(vline(self.median), DARK_RED.stroke_width(2)))?
            .label(format!("median {}", tick(self.median, 3)))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], DARK_RED.stroke_width(2)));
        chart
            .draw_series(
                [self.p5, self.p95].map(|x| PathElement::new(vline(x), DARK_GREY.stroke_width(2))),
            )?
            .label(format!("p5 {} / p95 {}", tick(self.p5, 3), tick(self.p95, 3)))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], DARK_GREY.stroke_width(2)));
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Bytes sent per outer step.

struct BytesPerStep {
    /// (outer step, bytes in `unit`).
    bars: Vec<(f64, f64)>,
    unit: Unit,
}

impl BytesPerStep {
    fn new(rows: &[OuterStepRow]) -> BytesPerStep {
        let steps = step_totals(rows);
        let unit = bytes_unit(steps.iter().map(|s| s.bytes_sent as f64).fold(0.0, f64::max));
        let bars =
            steps.iter().map(|s| (s.outer_step as f64, s.bytes_sent as f64 / unit.div)).collect();
        BytesPerStep { bars, unit }
    }
}

impl Plot for BytesPerStep {
    const NAME: &'static str = "bytes_per_step";
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let title = "Bytes sent per outer step (all nodes)";
        let (Some(first), Some(last)) = (self.bars.first(), self.bars.last()) else {
            return no_data(root, title, "no outer steps recorded");
        };
        let y_max = self.bars.iter().map(|b| b.1).fold(0.0, f64::max);
        let y_max = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
        let mut chart = ChartBuilder::on(root)
            .caption(title, caption_font())
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(64)
            .build_cartesian_2d((first.0 - 0.5)..(last.0 + 0.5), 0.0..y_max)?;
        chart
            .configure_mesh()
            .light_line_style(TRANSPARENT)
            .bold_line_style(BLACK.mix(0.12))
            .x_desc("outer step")
            .y_desc(format!("sent ({})", self.unit.name))
            .x_label_formatter(&|x| int_tick(*x))
            .y_label_formatter(&|y| tick(*y, 2))
            .draw()?;
        chart.draw_series(
            self.bars
                .iter()
                .map(|&(x, b)| Rectangle::new([(x - 0.4, 0.0), (x + 0.4, b)], BLUE.filled())),
        )?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// 5. Loss over tokens (or outer steps when tokens are unknown).

/// The file stems of every plot a run can have, in the report's order.
pub const PLOT_NAMES: [&str; 8] = [
    "active_nodes",
    "time_by_node",
    "time_by_step",
    "timeline",
    "bandwidth",
    "allreduce_hist",
    "bytes_per_step",
    "loss",
];

/// Draws every plot of a run (the loss plot only when some row has a loss); without `png`, their
/// SVG only (the PNG left empty).
pub(crate) fn draw_all(
    rows: &[OuterStepRow],
    events: &[EventRow],
    end_s: f64,
    png: bool,
) -> Result<Vec<RenderedPlot>, ReportError> {
    let mut out = vec![
        render(
            &ActiveNodes::new(rows, events, end_s),
            "Members of the mesh over time, with joins, leaves, crashes and evictions marked.",
            png,
        )?,
        render(
            &TimeByNode::new(rows),
            "Where each node's wall time went: compute, all-reduce, waiting at the barrier, \
             recovery, checkpoints, idle.",
            png,
        )?,
        render(
            &TimeByStep::new(rows),
            "The same breakdown per outer step, averaged over the nodes of the step.",
            png,
        )?,
        render(
            &Timeline::new(rows),
            "Compute (upper half of each lane) and all-reduce (lower half) on a timeline per \
             node (at most the first 30 outer steps and 40 nodes by id): overlapped and \
             streaming DiLoCo run the all-reduce beside the compute, sync DiLoCo stops the \
             compute for it. Placement is approximate: in sync runs the all-reduce is drawn \
             just before the row's outer step (after its compute and barrier wait); all-reduce \
             from the row's end in overlapped runs (it ran beside the next row's compute).",
            png,
        )?,
        render(
            &Bandwidth::new(rows),
            "The rate each node sends at over time (its bytes spread over its all-reduce as \
             placed on the timeline), averaged over the nodes present and for the busiest \
             node, against the mean over the whole run: the peak a node's link must carry \
             against what it carries on average.",
            png,
        )?,
        render(
            &AllreduceHist::new(rows),
            "Distribution of all-reduce times, one sample per node and outer step.",
            png,
        )?,
        render(&BytesPerStep::new(rows), "Bytes sent by all nodes during each outer step.", png)?,
    ];
    if let Some(loss) = Loss::new(rows) {
        let caption = if loss.held_out.is_empty() {
            "Training loss per node, and its mean per outer step."
        } else {
            "Training loss per node, its mean per outer step, and the held-out loss of the \
             global weights where the run evaluated them ([real] eval_every)."
        };
        out.push(render(&loss, caption, png)?);
    }
    Ok(out)
}
