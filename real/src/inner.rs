//! The inner loop a worker runs between outer steps, behind one trait so that the worker's
//! protocol code is the same for the libtorch trainer and for a synthetic objective (tests and
//! machines without libtorch).

use crate::train::TrainerState;
use loco_core::node::synthetic::{Objective, StepDraw, initial_weights};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What one inner step reports.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct InnerStats {
    /// Training loss before the update, when there is one.
    pub loss: Option<f64>,
    /// Tokens (or samples) processed.
    pub tokens: u64,
}

/// Failure of the inner loop.
#[derive(Debug, thiserror::Error)]
pub enum InnerError {
    /// A parameter vector of the wrong length.
    #[error("parameter vector of {got} values, expected {expected}")]
    Length {
        /// Expected length.
        expected: usize,
        /// Given length.
        got: usize,
    },
    /// The trainer or the data failed.
    #[error("{0}")]
    Backend(String),
}

/// Whether the node hangs (`hang` in the scenario): its compute stops while its heartbeats go
/// on. The worker closes it and opens it again; the inner loop's thread waits on it between
/// steps, and a paced step's sleep waits out the hang on top of its time. The worker also
/// aborts the steps under way when their membership stops (their result is for nobody): a wait
/// returns at once then. Clones share one gate.
#[derive(Clone, Debug, Default)]
pub struct HangGate(Arc<(Mutex<GateState>, Condvar)>);

#[derive(Debug, Default)]
struct GateState {
    /// Since when it is closed; `None` while open.
    hung_since: Option<Instant>,
    /// How long it was closed in all, up to its last opening.
    closed: Duration,
    aborted: bool,
}

impl GateState {
    /// How long it has been closed in all, up to `now`.
    fn closed_until(&self, now: Instant) -> Duration {
        self.closed + self.hung_since.map_or(Duration::ZERO, |t| now.saturating_duration_since(t))
    }
}

impl HangGate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.0.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, f: impl FnOnce(&mut GateState)) {
        f(&mut self.lock());
        self.0.1.notify_all();
    }

    /// Closes (`true`) or opens the gate. The gate times its closings itself, so a hang
    /// lasts from this call to the opening one, however late the inner loop notices it.
    #[allow(clippy::disallowed_methods)] // the hang's wall time: a paced step waits it out
    pub fn set(&self, hung: bool) {
        let now = Instant::now();
        self.update(|g| match (hung, g.hung_since) {
            (true, None) => g.hung_since = Some(now),
            (false, Some(t)) => {
                g.closed += now.saturating_duration_since(t);
                g.hung_since = None;
            }
            _ => {}
        });
    }

    /// Whether it is closed.
    pub fn is_hung(&self) -> bool {
        self.lock().hung_since.is_some()
    }

    /// How long it has been closed in all, up to `now`: a paced step's mark
    /// ([`sleep_until`](Self::sleep_until)).
    pub fn closed_until(&self, now: Instant) -> Duration {
        self.lock().closed_until(now)
    }

    /// Aborts (`true`) the steps under way, or lets the next ones run (`false`).
    pub fn abort(&self, aborted: bool) {
        self.update(|g| g.aborted = aborted);
    }

    /// Whether the steps under way are aborted.
    pub fn is_aborted(&self) -> bool {
        self.lock().aborted
    }

    /// Blocks while the gate is closed (and the steps not aborted).
    pub fn wait(&self) {
        let cv = &self.0.1;
        let mut g = self.lock();
        while g.hung_since.is_some() && !g.aborted {
            g = cv.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Sleeps until `due.at`, later by however long the gate was closed since `due.closed`
    /// (its [`closed_until`](Self::closed_until) when the due time was set); returns the due
    /// time it woke at (moved by the hangs), at once when the steps are aborted.
    #[allow(clippy::disallowed_methods)] // pacing only: the synthetic step's wall time
    pub fn sleep_until(&self, due: Due) -> Due {
        let cv = &self.0.1;
        let mut g = self.lock();
        loop {
            let now = Instant::now();
            let closed = g.closed_until(now);
            let at = due.at + closed.saturating_sub(due.closed);
            if g.aborted || (g.hung_since.is_none() && now >= at) {
                return Due { at, closed };
            }
            g = if g.hung_since.is_some() {
                cv.wait(g).unwrap_or_else(PoisonError::into_inner)
            } else {
                cv.wait_timeout(g, at - now).unwrap_or_else(PoisonError::into_inner).0
            };
        }
    }
}

/// When a paced step is due to end, and how long the hang gate had been closed in all when
/// that was set: hangs after it push it back by their length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Due {
    /// The due time, hangs before `closed` included.
    pub at: Instant,
    /// The gate's [`HangGate::closed_until`] when `at` was set.
    pub closed: Duration,
}

/// The inner optimisation of one worker. Moved into a blocking task while it computes.
pub trait InnerLoop: Send + 'static {
    /// `(name, numel)` of every parameter tensor, in the flat order.
    fn param_layout(&self) -> Vec<(String, usize)>;
    /// Total parameter count.
    fn num_params(&self) -> usize {
        self.param_layout().iter().map(|(_, n)| n).sum()
    }
    /// Copies the parameters into `out` (flat, fp32).
    fn params_into(&self, out: &mut [f32]) -> Result<(), InnerError>;
    /// Overwrites the parameters.
    fn set_params(&mut self, params: &[f32]) -> Result<(), InnerError>;
    /// One inner optimisation step.
    fn step(&mut self) -> Result<InnerStats, InnerError>;

    /// The held-out loss of `weights` (the global weights), leaving the inner loop's own
    /// parameters as they were; `None` for an inner loop without held-out data.
    fn eval_loss(&mut self, _weights: &[f32]) -> Result<Option<f64>, InnerError> {
        Ok(None)
    }
    /// The inner steps of outer step `outer_step` begin, in the node's process `draw` (the
    /// simulator's incarnation: see [`StepDraw`]).
    /// A paced loop starts its round's clock here: no step of it gets back time spent before
    /// it. Nothing by default.
    fn begin_round(&mut self, _outer_step: u64, _draw: u64) {}
    /// The gate a hang closes: a paced loop's step waits out the hang on top of its pace, as a
    /// simulated node's compute does. Nothing by default (the worker waits on the gate between
    /// steps, so a real step in flight finishes).
    fn set_gate(&mut self, _gate: HangGate) {}
    /// Serialised inner-optimiser state (for live recovery); empty when there is none.
    fn export_optimizer(&self) -> Result<Vec<u8>, InnerError> {
        Ok(Vec::new())
    }
    /// The largest [`export_optimizer`](Self::export_optimizer) output of this loop (what a
    /// joiner accepts as the own part of a state: anything longer is refused unread). The
    /// default, for AdamW: its two moments are 8 bytes per parameter; twice that and 64 MiB
    /// leave room for the schedule, the data position and the encoding.
    fn max_optimizer_bytes(&self) -> u64 {
        (self.num_params() as u64).saturating_mul(16).saturating_add(64 << 20)
    }
    /// Restores what [`export_optimizer`](Self::export_optimizer) produced.
    fn import_optimizer(&mut self, _bytes: &[u8]) -> Result<(), InnerError> {
        Ok(())
    }
    /// Everything a checkpoint needs to continue this loop exactly: the parameters, the
    /// optimiser's moments and step (empty moments when it has none), and where its data is
    /// (opaque JSON, given back to [`load_state`](Self::load_state)).
    fn save_state(&self) -> Result<(TrainerState, serde_json::Value), InnerError> {
        let mut params = vec![0.0; self.num_params()];
        self.params_into(&mut params)?;
        let state = TrainerState {
            step: 0,
            layout: self.param_layout(),
            params,
            exp_avg: Vec::new(),
            exp_avg_sq: Vec::new(),
        };
        Ok((state, serde_json::Value::Null))
    }
    /// Restores what [`save_state`](Self::save_state) produced.
    fn load_state(
        &mut self,
        state: &TrainerState,
        _data_position: &serde_json::Value,
    ) -> Result<(), InnerError> {
        self.set_params(&state.params)
    }
}

/// The synthetic objective of `loco_core::node::synthetic` (the simulator's real numerics):
/// noisy gradient descent on `0.5 * |x - target|^2`, with a target per node (non-i.i.d. data in
/// small). All nodes start from the same seeded point. The noise of an outer step's inner steps
/// comes from the weights they start from: the first step after [`set_params`](InnerLoop::set_params)
/// (or the start) draws its stream, so the same weights give the simulator's bits.
pub struct Quadratic {
    x: Vec<f32>,
    objective: Objective,
    /// The current outer step's noise; `None` until its first step draws it from `x`.
    noise: Option<ChaCha8Rng>,
    steps: u64,
    /// How long its steps take: the node's draws (the incarnation and outer step are each
    /// round's).
    pace: Option<StepDraw>,
    /// The step times of the round under way not yet stepped (seconds).
    round: std::collections::VecDeque<f64>,
    /// When the last step of the round under way was due to end: the next step of the round is
    /// due its time after it, so that a round lasts the sum of its steps' times from its first
    /// step's start and the sleeps' overshoot does not add up; `None` at a round's start
    /// ([`begin_round`](InnerLoop::begin_round)), so no round gets back the wait before it.
    due: Option<Due>,
    gate: HangGate,
}

impl Quadratic {
    /// `n` parameters, seeded start shared by all nodes, target and noise from `(seed, node)`.
    pub fn new(n: usize, seed: u64, node: u32) -> Quadratic {
        Quadratic {
            x: initial_weights(seed, n),
            objective: Objective::new(seed, node, n),
            noise: None,
            steps: 0,
            pace: None,
            round: Default::default(),
            due: None,
            gate: HangGate::default(),
        }
    }

    /// Makes each step take its time of `pace` (the simulator's draw for the node's step),
    /// its own work included (at least its work, when that is longer), so that a synthetic run
    /// has the scenario's timing and its churn lands where it would in a real one.
    pub fn paced(mut self, pace: StepDraw) -> Quadratic {
        self.pace = Some(pace);
        self
    }
}

/// When a paced step of `secs` that starts at `started` is due to end: `secs` after the due
/// time of the round's last step `last`, or after its own start (when the gate had been closed
/// `closed` in all) when it begins the round.
fn next_due(last: Option<Due>, started: Instant, closed: Duration, secs: f64) -> Due {
    let base = last.unwrap_or(Due { at: started, closed });
    Due { at: base.at + Duration::from_secs_f64(secs.max(0.0)), ..base }
}

impl InnerLoop for Quadratic {
    fn param_layout(&self) -> Vec<(String, usize)> {
        vec![("x".to_string(), self.x.len())]
    }

    fn params_into(&self, out: &mut [f32]) -> Result<(), InnerError> {
        if out.len() != self.x.len() {
            return Err(InnerError::Length { expected: self.x.len(), got: out.len() });
        }
        out.copy_from_slice(&self.x);
        Ok(())
    }

    /// Sets the weights the next outer step starts from (its noise is drawn from them).
    fn set_params(&mut self, params: &[f32]) -> Result<(), InnerError> {
        if params.len() != self.x.len() {
            return Err(InnerError::Length { expected: self.x.len(), got: params.len() });
        }
        self.x.copy_from_slice(params);
        self.noise = None;
        Ok(())
    }

    /// One step; its loss is the loss after the update (the simulator's, for the last step of an
    /// outer step).
    fn step(&mut self) -> Result<InnerStats, InnerError> {
        #[allow(clippy::disallowed_methods)] // pacing only: the step lasts `pace` in all
        let started = Instant::now();
        let noise = self.noise.get_or_insert_with(|| self.objective.noise(&self.x));
        let loss = self.objective.step(&mut self.x, noise);
        self.steps += 1;
        // The step's own work counts toward its time, as a real step's compute would; a step
        // of the round under way is due its time after the last one's due time. A hang
        // meanwhile adds its length.
        if let Some(p) = &self.pace {
            let secs = self.round.pop_front().unwrap_or(p.step_time.as_secs_f64());
            let due = next_due(self.due, started, self.gate.closed_until(started), secs);
            self.due = Some(self.gate.sleep_until(due));
        }
        Ok(InnerStats { loss: Some(loss), tokens: self.x.len() as u64 })
    }

    fn begin_round(&mut self, outer_step: u64, draw: u64) {
        self.due = None;
        self.round.clear();
        if let Some(p) = &self.pace {
            let d = StepDraw { incarnation: draw, outer_step, ..*p };
            self.round.extend(d.times());
        }
    }

    fn set_gate(&mut self, gate: HangGate) {
        self.gate = gate;
    }

    /// The parameters, the step count, and where the noise is (its "data"): the stream of the
    /// outer step under way and its position, or none when the next step starts an outer step.
    fn save_state(&self) -> Result<(TrainerState, serde_json::Value), InnerError> {
        let state = TrainerState {
            step: self.steps,
            layout: self.param_layout(),
            params: self.x.clone(),
            exp_avg: Vec::new(),
            exp_avg_sq: Vec::new(),
        };
        let pos = match &self.noise {
            None => serde_json::json!({ "noise": null }),
            Some(rng) => serde_json::json!({ "noise": {
                "seed": rng.get_seed().iter().map(|b| format!("{b:02x}")).collect::<String>(),
                "word_pos": rng.get_word_pos().to_string(),
            }}),
        };
        Ok((state, pos))
    }

    fn load_state(
        &mut self,
        state: &TrainerState,
        data_position: &serde_json::Value,
    ) -> Result<(), InnerError> {
        let bad = || {
            InnerError::Backend(format!(
                "data position {data_position}: expected {{\"noise\": null}} or \
                 {{\"noise\": {{\"seed\": \"<64 hex digits>\", \"word_pos\": \"<integer>\"}}}}"
            ))
        };
        let noise = match data_position.get("noise").ok_or_else(bad)? {
            serde_json::Value::Null => None,
            n => {
                let hex = n.get("seed").and_then(|v| v.as_str()).ok_or_else(bad)?;
                let pos = n
                    .get("word_pos")
                    .and_then(|v| v.as_str())
                    .and_then(|v| v.parse::<u128>().ok())
                    .ok_or_else(bad)?;
                let mut seed = [0u8; 32];
                if hex.len() != 64 || !hex.is_ascii() {
                    return Err(bad());
                }
                for (i, b) in seed.iter_mut().enumerate() {
                    *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
                }
                let mut rng = ChaCha8Rng::from_seed(seed);
                rng.set_word_pos(pos);
                Some(rng)
            }
        };
        self.set_params(&state.params)?;
        self.noise = noise;
        self.steps = state.step;
        Ok(())
    }
}

/// A node's libtorch trainer: one device, or G devices sharded
/// ([`crate::sharded::ShardedTrainer`]).
#[cfg(feature = "torch")]
pub enum NodeTrainer {
    /// One device.
    One(crate::train::Trainer),
    /// G devices, sharded.
    Sharded(crate::sharded::ShardedTrainer),
}

#[cfg(feature = "torch")]
impl NodeTrainer {
    /// The training settings.
    pub fn config(&self) -> &crate::train::TrainConfig {
        match self {
            NodeTrainer::One(t) => t.config(),
            NodeTrainer::Sharded(t) => t.config(),
        }
    }

    /// `(name, numel)` of every parameter tensor, in the flat order.
    pub fn param_layout(&self) -> Vec<(String, usize)> {
        match self {
            NodeTrainer::One(t) => t.param_layout(),
            NodeTrainer::Sharded(t) => t.param_layout(),
        }
    }

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        match self {
            NodeTrainer::One(t) => t.num_params(),
            NodeTrainer::Sharded(t) => t.num_params(),
        }
    }

    /// Copies the parameters into `out` (flat, fp32).
    pub fn flat_params_into(&self, out: &mut [f32]) -> Result<(), crate::train::TrainError> {
        match self {
            NodeTrainer::One(t) => t.flat_params_into(out),
            NodeTrainer::Sharded(t) => t.flat_params_into(out),
        }
    }

    /// Overwrites the parameters.
    pub fn set_flat_params(&mut self, p: &[f32]) -> Result<(), crate::train::TrainError> {
        match self {
            NodeTrainer::One(t) => t.set_flat_params(p),
            NodeTrainer::Sharded(t) => t.set_flat_params(p),
        }
    }

    /// Mean cross-entropy on `tokens` (rows of `seq_len + 1`), without gradients or updates.
    pub fn eval_loss(&mut self, tokens: &[i64]) -> Result<f64, crate::train::TrainError> {
        match self {
            NodeTrainer::One(t) => t.eval_loss(tokens),
            NodeTrainer::Sharded(t) => t.eval_loss(tokens),
        }
    }

    /// One inner step on a batch of token ids.
    pub fn inner_step(
        &mut self,
        tokens: &[i64],
    ) -> Result<crate::train::StepStats, crate::train::TrainError> {
        match self {
            NodeTrainer::One(t) => t.inner_step(tokens),
            NodeTrainer::Sharded(t) => t.inner_step(tokens),
        }
    }

    /// The whole state, on the CPU.
    pub fn export_state(&self) -> Result<TrainerState, crate::train::TrainError> {
        match self {
            NodeTrainer::One(t) => t.export_state(),
            NodeTrainer::Sharded(t) => t.export_state(),
        }
    }

    /// Replaces the whole state.
    pub fn import_state(&mut self, st: &TrainerState) -> Result<(), crate::train::TrainError> {
        match self {
            NodeTrainer::One(t) => t.import_state(st),
            NodeTrainer::Sharded(t) => t.import_state(st),
        }
    }
}

/// The libtorch trainer on a data loader.
#[cfg(feature = "torch")]
pub struct TchInner {
    trainer: NodeTrainer,
    data: crate::data::DataLoader,
    /// Held-out rows of `seq_len + 1` token ids, one after the other, when the run evaluates.
    held_out: Option<Vec<i64>>,
}

#[cfg(feature = "torch")]
impl TchInner {
    /// Wraps a trainer and this node's data.
    pub fn new(trainer: NodeTrainer, data: crate::data::DataLoader) -> TchInner {
        TchInner { trainer, data, held_out: None }
    }

    /// Evaluates on `rows` (held-out rows of `seq_len + 1` token ids, one after the other).
    pub fn with_held_out(mut self, rows: Vec<i64>) -> TchInner {
        self.held_out = Some(rows);
        self
    }

    /// The trainer.
    pub fn trainer(&self) -> &NodeTrainer {
        &self.trainer
    }
}

#[cfg(feature = "torch")]
impl InnerLoop for TchInner {
    fn param_layout(&self) -> Vec<(String, usize)> {
        self.trainer.param_layout()
    }

    fn params_into(&self, out: &mut [f32]) -> Result<(), InnerError> {
        self.trainer.flat_params_into(out).map_err(|e| InnerError::Backend(e.to_string()))
    }

    fn set_params(&mut self, params: &[f32]) -> Result<(), InnerError> {
        self.trainer.set_flat_params(params).map_err(|e| InnerError::Backend(e.to_string()))
    }

    fn step(&mut self) -> Result<InnerStats, InnerError> {
        let rows = self.trainer.config().batch_rows;
        let batch = self.data.next_batch(rows).map_err(|e| InnerError::Backend(e.to_string()))?;
        let s = self.trainer.inner_step(&batch).map_err(|e| InnerError::Backend(e.to_string()))?;
        Ok(InnerStats { loss: Some(s.loss), tokens: s.tokens })
    }

    /// Swaps `weights` in, takes the mean loss over the held-out rows, and swaps the node's own
    /// parameters back, whether the evaluation worked or not.
    fn eval_loss(&mut self, weights: &[f32]) -> Result<Option<f64>, InnerError> {
        let Some(rows) = self.held_out.take() else { return Ok(None) };
        let mut own = vec![0.0f32; self.num_params()];
        self.params_into(&mut own)?;
        let loss = self.set_params(weights).and_then(|()| {
            self.trainer.eval_loss(&rows).map_err(|e| InnerError::Backend(e.to_string()))
        });
        self.held_out = Some(rows);
        self.set_params(&own)?;
        loss.map(Some)
    }

    /// AdamW's moments and step (no parameters: a joiner takes the outer weights as its
    /// parameters, which the inner ones equal at an outer-step boundary), and the data position.
    fn export_optimizer(&self) -> Result<Vec<u8>, InnerError> {
        let mut st = self.trainer.export_state().map_err(|e| InnerError::Backend(e.to_string()))?;
        st.params = Vec::new();
        let pos = self.data.position();
        postcard::to_allocvec(&(st, pos)).map_err(|e| InnerError::Backend(e.to_string()))
    }

    fn import_optimizer(&mut self, bytes: &[u8]) -> Result<(), InnerError> {
        if bytes.is_empty() {
            return Ok(());
        }
        let (mut st, pos): (crate::train::TrainerState, crate::data::DataPosition) =
            postcard::from_bytes(bytes).map_err(|e| InnerError::Backend(e.to_string()))?;
        if st.params.is_empty() {
            // Sent without parameters: keep these (the worker sets the outer weights next).
            st.params = vec![0.0; self.num_params()];
            self.params_into(&mut st.params)?;
        }
        self.trainer.import_state(&st).map_err(|e| InnerError::Backend(e.to_string()))?;
        // The data position is the joiner's own shard: keep its own position (its shard differs);
        // the sender's position is carried for checkpoints.
        let _ = pos;
        Ok(())
    }

    fn save_state(&self) -> Result<(TrainerState, serde_json::Value), InnerError> {
        let st = self.trainer.export_state().map_err(|e| InnerError::Backend(e.to_string()))?;
        let pos = serde_json::to_value(self.data.position())
            .map_err(|e| InnerError::Backend(e.to_string()))?;
        Ok((st, pos))
    }

    fn load_state(
        &mut self,
        state: &TrainerState,
        data_position: &serde_json::Value,
    ) -> Result<(), InnerError> {
        self.trainer.import_state(state).map_err(|e| InnerError::Backend(e.to_string()))?;
        let pos: crate::data::DataPosition = serde_json::from_value(data_position.clone())
            .map_err(|e| InnerError::Backend(format!("data position {data_position}: {e}")))?;
        self.data.seek(pos).map_err(|e| InnerError::Backend(e.to_string()))
    }
}

#[cfg(test)]
// The pacing's tests time it on the wall clock, with a thread that closes and opens the gate.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;

    #[test]
    fn quadratic_descends_and_round_trips_its_parameters() {
        let mut q = Quadratic::new(64, 7, 0);
        let first = q.step().unwrap().loss.unwrap();
        for _ in 0..50 {
            q.step().unwrap();
        }
        let last = q.step().unwrap().loss.unwrap();
        assert!(last < first * 0.1, "{first} -> {last}");
        let mut p = vec![0.0; 64];
        q.params_into(&mut p).unwrap();
        let mut other = Quadratic::new(64, 7, 1);
        other.set_params(&p).unwrap();
        let mut p2 = vec![0.0; 64];
        other.params_into(&mut p2).unwrap();
        assert_eq!(p, p2);
        assert!(other.set_params(&p[..3]).is_err());
        // Same seed, same start on every node.
        let (a, b) = (Quadratic::new(8, 3, 0), Quadratic::new(8, 3, 5));
        assert_eq!(a.x, b.x);
        assert_eq!(a.x, initial_weights(3, 8), "the simulator's initial weights");
        // One outer step's worth of steps, as the simulator's objective computes it.
        let mut c = Quadratic::new(64, 7, 2);
        let mut w = c.x.clone();
        let want = c.objective.inner_steps(&mut w, 5);
        let mut got = 0.0;
        for _ in 0..5 {
            got = c.step().unwrap().loss.unwrap();
        }
        assert_eq!((c.x.clone(), got.to_bits()), (w, want.to_bits()));
    }

    #[test]
    fn paced_steps_of_a_round_are_due_back_to_back() {
        let t0 = Instant::now();
        let ms = |n| Duration::from_millis(n);
        let due = |at, closed| Due { at, closed };
        // The first step of a round is due its time after its start, from the gate's mark then.
        assert_eq!(next_due(None, t0 + ms(900), ms(7), 0.2), due(t0 + ms(1100), ms(7)));
        // The next one started 3 ms late (a wake-up delay): due at 400 ms, not 403, and hangs
        // are counted from the last due time's mark.
        let last = Some(due(t0 + ms(200), ms(1)));
        assert_eq!(next_due(last, t0 + ms(203), ms(9), 0.2), due(t0 + ms(400), ms(1)));
        // No time: due at once.
        assert_eq!(next_due(None, t0 + ms(5), ms(0), 0.0), due(t0 + ms(5), ms(0)));
    }

    /// A hang is as long as the gate was closed, counted by the gate: one that began before the
    /// sleep (during a step's compute) counts from its start, and a late wake-up takes nothing
    /// off it.
    #[test]
    fn a_sleep_waits_out_the_hangs_since_its_mark() {
        let gate = HangGate::default();
        let t0 = Instant::now();
        let mark = gate.closed_until(t0);
        gate.set(true);
        std::thread::sleep(Duration::from_millis(60));
        let g = gate.clone();
        let opener = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(40));
            g.set(false);
        });
        let woke = gate.sleep_until(Due { at: t0 + Duration::from_millis(30), closed: mark });
        opener.join().unwrap();
        assert!(woke.closed >= Duration::from_millis(100), "{woke:?}");
        assert_eq!(woke.at, t0 + Duration::from_millis(30) + woke.closed);
        assert!(t0.elapsed() >= Duration::from_millis(130), "{:?}", t0.elapsed());
    }

    fn pace(step_ms: u64, jitter: f64) -> StepDraw {
        let step_time = Duration::from_millis(step_ms);
        StepDraw {
            seed: 5,
            node: 1,
            incarnation: 0,
            outer_step: 0,
            inner_steps: 4,
            step_time,
            jitter,
        }
    }

    /// Runs one round of `q` and returns its wall time.
    fn round(q: &mut Quadratic, outer_step: u64) -> Duration {
        let t = Instant::now();
        q.begin_round(outer_step, 0);
        for _ in 0..4 {
            q.step().unwrap();
        }
        t.elapsed()
    }

    /// A round takes its steps' times whatever the wait before it: a gap shorter than a step
    /// (a fast all-reduce) is not taken back from the next round.
    #[test]
    fn a_round_lasts_its_steps_whatever_the_wait_before_it() {
        let mut q = Quadratic::new(16, 1, 1).paced(pace(60, 0.0));
        round(&mut q, 0);
        for wait in [0, 20, 45] {
            std::thread::sleep(Duration::from_millis(wait));
            let took = round(&mut q, 1);
            assert!(took >= Duration::from_millis(240), "after {wait} ms: {took:?}");
        }
    }

    /// With jitter each step lasts the simulator's draw for it: the round at least their sum.
    #[test]
    fn jittered_steps_last_the_simulator_s_draws() {
        let p = pace(40, 0.5);
        let times: Vec<f64> = StepDraw { outer_step: 3, ..p }.times().collect();
        assert!(times.iter().any(|t| (t - 0.04).abs() > 1e-3), "{times:?}");
        let sum = Duration::from_secs_f64(times.iter().sum());
        let mut q = Quadratic::new(16, 1, 1).paced(p);
        let took = round(&mut q, 3);
        assert!(took >= sum, "{took:?} < {sum:?}");
    }

    /// Aborting the steps under way ends a hung round at once.
    #[test]
    fn an_abort_ends_a_hung_round() {
        let mut q = Quadratic::new(16, 1, 1).paced(pace(50, 0.0));
        let gate = HangGate::default();
        q.set_gate(gate.clone());
        gate.set(true);
        let g = gate.clone();
        let abort = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            g.abort(true);
        });
        let t = Instant::now();
        q.begin_round(0, 0);
        for _ in 0..4 {
            if gate.is_aborted() {
                break;
            }
            gate.wait();
            q.step().unwrap();
        }
        abort.join().unwrap();
        assert!(gate.is_hung(), "an abort leaves the hang as it is");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }

    /// A hang in the middle of a round adds its length: the compute stops, it does not catch
    /// up after.
    #[test]
    fn a_hang_adds_its_length_to_the_round() {
        let mut q = Quadratic::new(16, 1, 1).paced(pace(50, 0.0));
        let gate = HangGate::default();
        q.set_gate(gate.clone());
        let hang = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(70));
            gate.set(true);
            std::thread::sleep(Duration::from_millis(150));
            gate.set(false);
        });
        let took = round(&mut q, 0);
        hang.join().unwrap();
        assert!(took >= Duration::from_millis(350), "{took:?}");
    }
}
