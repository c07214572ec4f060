//! The timeline of compute against all-reduce, and the send rate placed on it.

use super::*;

// ---------------------------------------------------------------------------------------------
// 6. Compute and all-reduce side by side on a timeline, one lane per node.

/// Most lanes (nodes) the timeline draws: the first ones by node id.
const TIMELINE_LANES: usize = 40;
/// Most outer steps the timeline draws, from the first one present.
const TIMELINE_STEPS: u64 = 30;
/// Seconds under which two durations are taken as equal.
const TIMELINE_EPS: f64 = 1e-6;
/// Width of the timeline's legend column, in pixels.
const TIMELINE_LEGEND_WIDTH: u32 = 150;

/// One node's lane: its name and its bars, in seconds since the run started.
struct Lane {
    name: String,
    /// `[start, end)` of each row's inner steps.
    compute: Vec<(f64, f64)>,
    /// `[start, end)` of each row's all-reduce.
    allreduce: Vec<(f64, f64)>,
}

/// Where a row's compute and all-reduce lie in time, as [`Timeline`] documents; the bandwidth
/// plot spreads a row's bytes over the same all-reduce.
struct RowBars {
    /// `[start, end)` of the inner steps, when there were any.
    compute: Option<(f64, f64)>,
    /// `[start, end)` of the all-reduce, when there was one.
    allreduce: Option<(f64, f64)>,
    /// Whether the all-reduce ran after the row, beside the next row's compute.
    overlapped: bool,
}

impl RowBars {
    /// The bars of a row whose `start_s <= end_s`, both finite.
    fn of(r: &OuterStepRow) -> RowBars {
        let finite = |x: f64| if x.is_finite() && x > 0.0 { x } else { 0.0 };
        let (start, end) = (r.start_s, r.end_s);
        let compute_end = (start + finite(r.compute_s)).min(end);
        let compute = (compute_end > start).then_some((start, compute_end));
        let (wall, waited) = (finite(r.allreduce_wall_s), finite(r.allreduce_s));
        if wall > waited + TIMELINE_EPS {
            // Overlapped: the all-reduce ran after the row, beside the next row's compute.
            return RowBars { compute, allreduce: Some((end, end + wall)), overlapped: true };
        }
        // Inside the row: it ends where the commit's outer step and checkpoint begin.
        let b = (end - finite(r.outer_s) - finite(r.checkpoint_s)).clamp(compute_end, end);
        let a = (b - waited).max(compute_end);
        let allreduce = (waited > 0.0 && b > a).then_some((a, b));
        RowBars { compute, allreduce, overlapped: false }
    }
}

/// Compute and all-reduce on a timeline, one lane per node (upper half: compute, lower half:
/// all-reduce), so that one sees whether the all-reduces run beside the compute (overlapped and
/// streaming DiLoCo) or stop it (sync DiLoCo).
///
/// The rows do not say when within a row each part happened, only how long it took, so the bars
/// are placed as follows:
///
/// - compute: `[start_s, start_s + compute_s]`, in every mode (the inner steps start the row);
/// - all-reduce of a row whose all-reduce lies inside it (sync: `allreduce_wall_s` equals
///   `allreduce_s`, or is 0 in files written before that column): `allreduce_s` ending where
///   the commit's outer step and the checkpoint begin, `[e - allreduce_s, e]` with
///   `e = end_s - outer_s - checkpoint_s`, kept after the compute. That is after the compute,
///   the recovery and the barrier wait, the order in which a node spends a row; idle seconds
///   (0 in the simulator) would shift it;
/// - all-reduce of an overlapped row (`allreduce_wall_s > allreduce_s`: the row ended when the
///   node reached the barrier, and its all-reduce ran beside the next row's compute):
///   `[end_s, end_s + allreduce_wall_s]`. The barrier wait before its release is not recorded,
///   so the bar may start a little early.
///
/// At most [`TIMELINE_LANES`] lanes (the first nodes by id) and the first [`TIMELINE_STEPS`]
/// outer steps present are drawn; the title says when either was cut.
pub(super) struct Timeline {
    /// In node id order (then name), first node first.
    lanes: Vec<Lane>,
    /// Nodes in the run, when more than the lanes drawn.
    nodes_total: Option<usize>,
    /// Whether later outer steps were left out.
    steps_cut: bool,
    /// Whether some all-reduce bar was drawn from its row's end (overlapped rows).
    overlapped: bool,
    /// The time span drawn, in seconds.
    span: (f64, f64),
    unit: Unit,
}

/// The rows with a finite span, in a fixed order whatever the order of the file: node id,
/// name, outer step, start.
fn rows_by_node(rows: &[OuterStepRow]) -> Vec<&OuterStepRow> {
    let mut rows: Vec<&OuterStepRow> = rows
        .iter()
        .filter(|r| r.start_s.is_finite() && r.end_s.is_finite() && r.end_s >= r.start_s)
        .collect();
    rows.sort_by(|a, b| {
        (a.node_id, &a.node, a.outer_step)
            .cmp(&(b.node_id, &b.node, b.outer_step))
            .then(a.start_s.total_cmp(&b.start_s))
    });
    rows
}

impl Timeline {
    pub(super) fn new(rows: &[OuterStepRow]) -> Timeline {
        let rows = rows_by_node(rows);
        let first_step = rows.iter().map(|r| r.outer_step).min().unwrap_or(0);
        let last_step = first_step.saturating_add(TIMELINE_STEPS);
        let steps_cut = rows.iter().any(|r| r.outer_step >= last_step);
        let mut lanes: Vec<Lane> = Vec::new();
        let mut keys: Vec<(u32, &str)> = Vec::new();
        let mut overlapped = false;
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for r in rows {
            let key = (r.node_id, r.node.as_str());
            if keys.last() != Some(&key) {
                keys.push(key);
                if keys.len() <= TIMELINE_LANES {
                    let name = label_text(&r.node);
                    lanes.push(Lane { name, compute: Vec::new(), allreduce: Vec::new() });
                }
            }
            if keys.len() > TIMELINE_LANES || r.outer_step >= last_step {
                continue;
            }
            let Some(lane) = lanes.last_mut() else { continue };
            let bars = RowBars::of(r);
            lo = lo.min(r.start_s);
            hi = hi.max(r.end_s);
            lane.compute.extend(bars.compute);
            if let Some((a, b)) = bars.allreduce {
                lane.allreduce.push((a, b));
                hi = hi.max(b);
            }
            overlapped |= bars.overlapped;
        }
        let nodes_total = (keys.len() > TIMELINE_LANES).then_some(keys.len());
        // From the run's start, as the other time plots, unless the rows drawn start late.
        let lo = if lo >= 0.0 && lo < 0.05 * hi { 0.0 } else { lo };
        let span = if lo.is_finite() && hi > lo { (lo, hi) } else { (0.0, 0.0) };
        Timeline { lanes, nodes_total, steps_cut, overlapped, span, unit: time_unit(span.1) }
    }

    fn title(&self) -> String {
        let mut cuts = Vec::new();
        if self.steps_cut {
            cuts.push(format!("first {TIMELINE_STEPS} outer steps"));
        }
        if let Some(n) = self.nodes_total {
            cuts.push(format!("first {} of {n} nodes", self.lanes.len()));
        }
        let title = "Compute and all-reduce per node";
        if cuts.is_empty() { title.to_owned() } else { format!("{title} ({})", cuts.join(", ")) }
    }
}

impl Plot for Timeline {
    const NAME: &'static str = "timeline";
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let title = self.title();
        let n = self.lanes.len();
        if n == 0 || self.span.1 <= self.span.0 {
            return no_data(root, &title, "no outer steps recorded");
        }
        let u = self.unit;
        let (x_lo, x_hi) = (self.span.0 / u.div, self.span.1 / u.div);
        let title_font = if title.len() > 40 { ("sans-serif", 20) } else { ("sans-serif", 24) };
        let body = root.margin(16, 0, 0, 0).titled(&title, title_font.into_font())?;
        let (w, _) = body.dim_in_pixel();
        let (plot, legend) = body.split_horizontally(w.saturating_sub(TIMELINE_LEGEND_WIDTH));
        // Lane i (first node first, at the top) is centred on y = n - 1 - i.
        let y_of = |i: usize| (n - 1 - i) as f64;
        let label_px = if n > 24 { 10 } else { 13 };
        let longest = self.lanes.iter().map(|l| l.name.chars().count()).max().unwrap_or(0);
        let label_area = (longest as u32 * label_px * 6 / 10 + 24).clamp(48, 240);
        let mut chart = ChartBuilder::on(&plot)
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(label_area)
            .build_cartesian_2d(x_lo..x_hi, -0.5..(n as f64 - 0.5))?;
        let names: Vec<&str> = self.lanes.iter().map(|l| l.name.as_str()).collect();
        let lane_label = |y: &f64| {
            let k = y.round();
            if (y - k).abs() < 1e-6 && k >= 0.0 && (k as usize) < n {
                names[n - 1 - k as usize].to_owned()
            } else {
                String::new()
            }
        };
        let x_desc = match self.overlapped {
            true => format!("time ({}); all-reduce drawn from the row's end (overlapped)", u.name),
            false => format!("time ({})", u.name),
        };
        chart
            .configure_mesh()
            .light_line_style(TRANSPARENT)
            .bold_line_style(BLACK.mix(0.12))
            .disable_y_mesh()
            .x_desc(x_desc)
            .x_label_formatter(&|x| tick(*x, 2))
            .y_labels(n + 1)
            .y_label_style(("sans-serif", label_px))
            .y_label_formatter(&lane_label)
            .draw()?;
        // Thin separators between the lanes.
        chart.draw_series((1..n).map(|k| {
            let y = k as f64 - 0.5;
            PathElement::new([(x_lo, y), (x_hi, y)], BLACK.mix(0.08))
        }))?;
        let (gap, half) = (0.04, 0.42);
        for (k, upper) in [(0, true), (1, false)] {
            let color = BREAKDOWN_COLORS[k];
            let rects = self.lanes.iter().enumerate().flat_map(|(i, lane)| {
                let y = y_of(i);
                let (y0, y1) = if upper { (y + gap, y + half) } else { (y - half, y - gap) };
                let bars = if upper { &lane.compute } else { &lane.allreduce };
                bars.iter().map(move |&(a, b)| {
                    Rectangle::new([(a / u.div, y0), (b / u.div, y1)], color.filled())
                })
            });
            chart.draw_series(rects)?;
        }
        // The legend to the right of the plot, in the breakdown plots' style.
        let text = TextStyle::from(("sans-serif", 15).into_font());
        for k in 0..2 {
            let y = 40 + 24 * k as i32;
            legend.draw(&Rectangle::new([(8, y), (24, y + 16)], BREAKDOWN_COLORS[k].filled()))?;
            legend.draw_text(BREAKDOWN_NAMES[k], &text, (32, y))?;
        }
        let note = TextStyle::from(("sans-serif", 12).into_font()).color(&DARK_GREY);
        for (k, line) in ["one lane per node:", "upper half compute,", "lower half all-reduce"]
            .iter()
            .enumerate()
        {
            legend.draw_text(line, &note, (8, 100 + 16 * k as i32))?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// 7. Send rate over time: peak against mean.

/// Time bins of the bandwidth plot.
const BANDWIDTH_BINS: usize = 480;

/// A rate in bit/s, kbit/s, Mbit/s or Gbit/s (powers of 1000), so that `max` reads as at most
/// a few hundred.
fn rate_unit(max_bits: f64) -> Unit {
    const UNITS: [(f64, &str); 3] = [(1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")];
    UNITS
        .iter()
        .find(|(d, _)| max_bits >= *d)
        .map_or(Unit { div: 1.0, name: "bit/s" }, |&(div, name)| Unit { div, name })
}

/// A rate in bit/s in its own unit, three significant digits (`64.3 Mbit/s`, `2.05 Gbit/s`).
fn rate_text(bits: f64) -> String {
    let u = rate_unit(bits);
    let v = bits / u.div;
    let decimals = if v < 10.0 {
        2
    } else if v < 100.0 {
        1
    } else {
        0
    };
    format!("{} {}", tick(v, decimals), u.name)
}

/// The rate each node sends at over time, so that one sees the peak a link must carry against
/// the mean it carries: sync DiLoCo sends in bursts between long silences, overlapped and
/// streaming DiLoCo spread the same bytes.
///
/// A row's bytes (`bytes_sent`, what the node sent within the row's span) are spread evenly over
/// the all-reduce they belong to, placed as in the [`Timeline`] ([`RowBars`]): the row's own,
/// or in an overlapped run the row before's, which ran beside this row's compute; over the
/// whole row when there was none (recovery and control only). The peak is the highest rate of one node over one row; the mean is all bytes over all
/// the nodes' time (each node's first row's start to its last row's end, all-reduce included).
/// The curves are the mean and the highest rate over the nodes in each of [`BANDWIDTH_BINS`]
/// time bins.
pub(super) struct Bandwidth {
    /// (bin centre in seconds, mean over the nodes present, highest node), in bit/s.
    bins: Vec<(f64, f64, f64)>,
    /// Highest rate of one node over one row, bit/s.
    peak: f64,
    /// Bits sent over node-seconds present.
    mean: f64,
    /// The time span drawn, in seconds.
    span: (f64, f64),
}

impl Bandwidth {
    pub(super) fn new(rows: &[OuterStepRow]) -> Bandwidth {
        // (node key, [from, to), bits) of each sending stretch, and each node's presence.
        let mut sends: Vec<((u32, &str), f64, f64, f64)> = Vec::new();
        let mut present: Vec<((u32, &str), f64, f64)> = Vec::new();
        let mut peak: f64 = 0.0;
        // The all-reduce of the node's row before (node, outer step, span), when it ran after
        // that row (overlapped).
        type Before<'a> = ((u32, &'a str), u64, (f64, f64));
        let mut before: Option<Before> = None;
        for r in rows_by_node(rows) {
            let key = (r.node_id, r.node.as_str());
            let bars = RowBars::of(r);
            let own = bars.allreduce.unwrap_or((r.start_s, r.end_s));
            present.push((key, r.start_s, r.end_s.max(own.1)));
            // A row counts the bytes sent in its span: in an overlapped run that is the
            // all-reduce of the row before, which ran beside this row's compute.
            let (a, b) = match before.take() {
                Some((k, step, span)) if k == key && step + 1 == r.outer_step => span,
                _ => own,
            };
            if let (true, Some(span)) = (bars.overlapped, bars.allreduce) {
                before = Some((key, r.outer_step, span));
            }
            let bits = r.bytes_sent as f64 * 8.0;
            if bits > 0.0 && b > a {
                peak = peak.max(bits / (b - a));
                sends.push((key, a, b, bits));
            }
        }
        // Each node's presence: its first start to its last end.
        present.sort_by(|x, y| x.0.cmp(&y.0));
        let mut spans: Vec<((u32, &str), f64, f64)> = Vec::new();
        for (key, a, b) in present {
            match spans.last_mut() {
                Some(last) if last.0 == key => {
                    last.1 = last.1.min(a);
                    last.2 = last.2.max(b);
                }
                _ => spans.push((key, a, b)),
            }
        }
        let lo = spans.iter().map(|s| s.1).fold(f64::INFINITY, f64::min);
        let hi = spans.iter().map(|s| s.2).fold(f64::NEG_INFINITY, f64::max);
        if !(lo.is_finite() && hi > lo) {
            return Bandwidth { bins: Vec::new(), peak: 0.0, mean: 0.0, span: (0.0, 0.0) };
        }
        let lo = if lo >= 0.0 && lo < 0.05 * hi { 0.0 } else { lo };
        let width = (hi - lo) / BANDWIDTH_BINS as f64;
        let node_time: f64 = spans.iter().map(|s| s.2 - s.1).sum();
        let total_bits: f64 = sends.iter().map(|s| s.3).sum();
        // Bits per node and bin, spread in proportion to the overlap.
        let index = |key: (u32, &str)| spans.binary_search_by(|s| s.0.cmp(&key)).ok();
        let mut bits = vec![0.0f64; spans.len() * BANDWIDTH_BINS];
        let bin_of =
            |t: f64| (((t - lo) / width).floor().max(0.0) as usize).min(BANDWIDTH_BINS - 1);
        for &(key, a, b, v) in &sends {
            let Some(n) = index(key) else { continue };
            for k in bin_of(a)..=bin_of(b) {
                let (x0, x1) = (lo + k as f64 * width, lo + (k + 1) as f64 * width);
                let overlap = (b.min(x1) - a.max(x0)).max(0.0);
                bits[n * BANDWIDTH_BINS + k] += v * overlap / (b - a);
            }
        }
        let bins = (0..BANDWIDTH_BINS)
            .map(|k| {
                let (x0, x1) = (lo + k as f64 * width, lo + (k + 1) as f64 * width);
                let (mut sum, mut here, mut top) = (0.0, 0usize, 0.0f64);
                for (n, s) in spans.iter().enumerate() {
                    if s.1 < x1 && s.2 > x0 {
                        let rate = bits[n * BANDWIDTH_BINS + k] / width;
                        sum += rate;
                        here += 1;
                        top = top.max(rate);
                    }
                }
                let mean = if here > 0 { sum / here as f64 } else { 0.0 };
                ((x0 + x1) / 2.0, mean, top)
            })
            .collect();
        let mean = if node_time > 0.0 { total_bits / node_time } else { 0.0 };
        Bandwidth { bins, peak, mean, span: (lo, hi) }
    }

    fn title(&self) -> String {
        if self.peak <= 0.0 {
            return "Send rate per node".to_owned();
        }
        format!(
            "Send rate per node: peak {}, mean {} ({:.1}x)",
            rate_text(self.peak),
            rate_text(self.mean),
            self.peak / self.mean.max(f64::MIN_POSITIVE)
        )
    }
}

impl Plot for Bandwidth {
    const NAME: &'static str = "bandwidth";
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let title = self.title();
        if self.bins.is_empty() || self.peak <= 0.0 {
            return no_data(root, &title, "no bytes sent");
        }
        let t = time_unit(self.span.1);
        let top = self.bins.iter().map(|b| b.2).fold(self.peak, f64::max);
        let r = rate_unit(top);
        let mut chart = ChartBuilder::on(root)
            .caption(&title, ("sans-serif", 20).into_font())
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(64)
            .build_cartesian_2d(self.span.0 / t.div..self.span.1 / t.div, 0.0..top / r.div * 1.1)?;
        chart
            .configure_mesh()
            .light_line_style(TRANSPARENT)
            .bold_line_style(BLACK.mix(0.12))
            .x_desc(format!("time ({})", t.name))
            .y_desc(format!("sent ({})", r.name))
            .x_label_formatter(&|x| tick(*x, 2))
            .y_label_formatter(&|y| tick(*y, 2))
            .draw()?;
        let xy = |x: f64, y: f64| (x / t.div, y / r.div);
        chart
            .draw_series(AreaSeries::new(
                self.bins.iter().map(|b| xy(b.0, b.1)),
                0.0,
                BLUE.mix(0.5),
            ))?
            .label("mean over the nodes")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], BLUE.mix(0.5).filled()));
        chart
            .draw_series(LineSeries::new(self.bins.iter().map(|b| xy(b.0, b.2)), DARK_RED))?
            .label("busiest node")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], DARK_RED));
        let (x0, x1) = (self.span.0, self.span.1);
        chart
            .draw_series(DashedLineSeries::new(
                [xy(x0, self.mean), xy(x1, self.mean)],
                8,
                5,
                DARK_GREY.stroke_width(2),
            ))?
            .label("mean over the run")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], DARK_GREY.stroke_width(2)));
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
