//! The loss plot: the training loss per node and its mean per outer step, and the held-out loss
//! of the global weights where the run evaluated them.

use super::{BLUE, DARK_RED, DrawResult, GREY, Plot, caption_font, draw_legend, padded, tick};
use loco_core::metrics::{OuterStepRow, step_totals};
use plotters::coord::Shift;
use plotters::prelude::*;

pub(super) struct Loss {
    /// (x, loss) of each row with a loss.
    points: Vec<(f64, f64)>,
    /// (x, mean loss) per outer step.
    mean: Vec<(f64, f64)>,
    /// (x, mean held-out loss) per evaluated outer step, at the tokens trained before it (the
    /// weights evaluated are those the step started from).
    pub(super) held_out: Vec<(f64, f64)>,
    x_desc: String,
    x_div: f64,
}

impl Loss {
    /// `None` when no row has a loss.
    pub(super) fn new(rows: &[OuterStepRow]) -> Option<Loss> {
        let steps = step_totals(rows);
        let total_tokens: u64 = steps.iter().map(|s| s.tokens).sum();
        let mut x_of = std::collections::BTreeMap::new();
        let mut cumulative = 0u64;
        for s in &steps {
            cumulative = cumulative.saturating_add(s.tokens);
            let x = if total_tokens > 0 { cumulative as f64 } else { s.outer_step as f64 };
            x_of.insert(s.outer_step, x);
        }
        let mean: Vec<(f64, f64)> =
            steps.iter().filter_map(|s| Some((*x_of.get(&s.outer_step)?, s.mean_loss?))).collect();
        if mean.is_empty() {
            return None;
        }
        let points = rows
            .iter()
            .filter_map(|r| Some((*x_of.get(&r.outer_step)?, r.loss.filter(|l| l.is_finite())?)))
            .collect();
        // Held-out losses, averaged over the nodes that evaluated each step (they evaluate the
        // same weights); x is what was trained before the step.
        let mut evals: std::collections::BTreeMap<u64, (f64, u32)> = Default::default();
        for r in rows {
            if let Some(l) = r.eval_loss.filter(|l| l.is_finite()) {
                let e = evals.entry(r.outer_step).or_default();
                e.0 += l;
                e.1 += 1;
            }
        }
        let held_out = evals
            .iter()
            .map(|(&step, &(sum, n))| {
                let before = x_of.range(..step).next_back().map_or(0.0, |(_, &x)| x);
                let x = if total_tokens > 0 { before } else { step as f64 };
                (x, sum / f64::from(n))
            })
            .collect();
        let (x_desc, x_div) = if total_tokens > 0 {
            let u = crate::format::count_unit(cumulative as f64);
            (format!("tokens ({})", u.name), u.div)
        } else {
            ("outer step (no token counts recorded)".to_owned(), 1.0)
        };
        Some(Loss { points, mean, held_out, x_desc, x_div })
    }
}

impl Plot for Loss {
    const NAME: &'static str = "loss";
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let xs = self.points.iter().chain(&self.held_out).map(|p| p.0 / self.x_div);
        let (x_lo, x_hi) =
            xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
        let ys = self.points.iter().chain(&self.held_out).map(|p| p.1);
        let (y_lo, y_hi) =
            ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| (a.min(y), b.max(y)));
        let mut chart = ChartBuilder::on(root)
            .caption("Loss", caption_font())
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(64)
            .build_cartesian_2d(padded(x_lo, x_hi, 0.03), padded(y_lo, y_hi, 0.08))?;
        chart
            .configure_mesh()
            .light_line_style(TRANSPARENT)
            .bold_line_style(BLACK.mix(0.12))
            .x_desc(self.x_desc.as_str())
            .y_desc("loss")
            .x_label_formatter(&|x| tick(*x, 3))
            .y_label_formatter(&|y| tick(*y, 3))
            .draw()?;
        let d = self.x_div;
        chart
            .draw_series(
                self.points
                    .iter()
                    .map(|&(x, y)| Circle::new((x / d, y), 2, GREY.mix(0.6).filled())),
            )?
            .label("per node")
            .legend(|(x, y)| Circle::new((x + 8, y), 3, GREY.filled()));
        chart
            .draw_series(LineSeries::new(
                self.mean.iter().map(|&(x, y)| (x / d, y)),
                DARK_RED.stroke_width(2),
            ))?
            .label("mean over nodes")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], DARK_RED.stroke_width(2)));
        if !self.held_out.is_empty() {
            let held_out = self.held_out.iter().map(|&(x, y)| (x / d, y));
            chart
                .draw_series(LineSeries::new(held_out.clone(), BLUE.stroke_width(2)))?
                .label("held-out (global weights)")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLUE.stroke_width(2)));
            chart.draw_series(held_out.map(|p| Circle::new(p, 3, BLUE.filled())))?;
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        Ok(())
    }
}
