//! A member of the mesh: a sans-IO state machine on one node.
//!
//! Size: one impl of the member's handlers, a message each, over one state; split by message, the
//! rules on which epoch and which coordinator a member trusts would be spread over files.

use super::probe::{ProbeOut, Prober};
use super::timer::{TimerKind, TimerTable};
use super::{EvictReason, Held, LeaveReason, MeshConfig, MeshError, MeshMsg, Transfer, op_id};
use crate::ids::{Epoch, NodeId, Weight};
use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Duration;

/// Everything a backend needs to start one all-reduce: one ring per local shard
/// (`0..shards`), all in `epoch`, each with `shard` in its frames' headers.
#[derive(Clone, Debug, PartialEq)]
pub struct AllReduceStart {
    /// The epoch every frame carries.
    pub epoch: Epoch,
    /// The collective's op id ([`op_id`]`(outer_step, attempt)`).
    pub op: u64,
    /// The outer step.
    pub outer_step: u64,
    /// 0 for the first try, more for retries.
    pub attempt: u32,
    /// The ring order (the same on every node and every shard).
    pub ring: Vec<NodeId>,
    /// This node's weight (0: contribute zeros, it has no pseudo-gradient for this step).
    pub weight: Weight,
    /// Sum of every ring member's weight: the divisor the all-reduce will use.
    pub total_weight: f32,
    /// How many rings this node runs (one per local GPU shard).
    pub shards: u16,
}

/// Why a member stopped.
#[derive(Clone, Debug, PartialEq)]
pub enum StopReason {
    /// It left on its own (after sending its deathrattle).
    Left(LeaveReason),
    /// The coordinator evicted it.
    Evicted(EvictReason),
    /// Nothing was heard from the coordinator for `silent_for`. There is no standby coordinator:
    /// a takeover needs the standby to hold the coordinator's state at every decision and the
    /// members to agree on which coordinator is alive, and a wrong guess (a partition, not a
    /// death) would split the mesh into two that both train. A clean stop cannot make replicas
    /// disagree: the backend checkpoints the state as of `last_committed` and exits with this
    /// message, and the run resumes from the checkpoints with a new coordinator.
    CoordinatorLost {
        /// How long the coordinator had been silent.
        silent_for: Duration,
        /// The last outer step this member committed.
        last_committed: Option<u64>,
        /// A step whose all-reduce this member finished but whose commit it did not receive.
        /// The coordinator may have committed it on other members; every member that finished
        /// holds the same result, so the checkpoint should keep it alongside.
        pending: Option<u64>,
    },
    /// The coordinator ended the run.
    Shutdown,
    /// The coordinator stopped the run: the averaged update was refused
    /// [`UPDATE_REFUSALS_LIMIT`](super::UPDATE_REFUSALS_LIMIT) outer steps in a row
    /// ([`MeshConfig::max_update_ratio`](super::MeshConfig::max_update_ratio)). The weights of
    /// the last commit are good: checkpoint them.
    UpdatesRefused {
        /// The outer step the mesh was at.
        outer_step: u64,
        /// The last outer step this member committed.
        last_committed: Option<u64>,
    },
    /// The coordinator stopped the run because no member holding the training state is left
    /// (they were all evicted, left, crashed or restarted): going on would train from fresh
    /// weights. The run must be resumed from checkpoints taken after `outer_step` outer steps.
    /// A member that does not hold the state (`synced` false: a joiner that never received it)
    /// must not checkpoint: its weights are not the mesh's.
    NoSyncedMember {
        /// The outer step the mesh was at: every step before it was finished.
        outer_step: u64,
        /// Whether this member holds the training state.
        synced: bool,
        /// The last outer step this member committed.
        last_committed: Option<u64>,
    },
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::Left(r) => write!(f, "left the mesh ({r})"),
            StopReason::Evicted(r) => write!(f, "evicted by the coordinator ({r})"),
            StopReason::CoordinatorLost { silent_for, last_committed, pending } => {
                write!(
                    f,
                    "coordinator lost: nothing heard from it for {:.1}s; ",
                    silent_for.as_secs_f64()
                )?;
                match last_committed {
                    Some(s) => write!(f, "checkpointing outer step {s}")?,
                    None => write!(f, "no outer step committed yet")?,
                }
                if let Some(p) = pending {
                    write!(f, " (step {p} reduced, commit not received)")?;
                }
                write!(f, " and stopping")
            }
            StopReason::Shutdown => write!(f, "the coordinator ended the run"),
            StopReason::UpdatesRefused { outer_step, .. } => write!(
                f,
                "the coordinator stopped the run at outer step {outer_step}: the averaged update \
                 was refused {} steps in a row (its norm beyond mesh.max_update_ratio times the \
                 running median); the last committed weights are kept",
                super::UPDATE_REFUSALS_LIMIT
            ),
            StopReason::NoSyncedMember { outer_step, synced, .. } => {
                write!(
                    f,
                    "no member holds the training state any more: the run stopped at outer step \
                     {outer_step} and must be resumed from checkpoints"
                )?;
                if !synced {
                    write!(f, " (this node does not hold the state: no checkpoint)")?;
                }
                Ok(())
            }
        }
    }
}

/// What the backend must do. Drain with [`Member::poll_action`] after every call, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum MemberAction {
    /// Send a control message to `to` (the coordinator or a peer), with a body of `padding`
    /// bytes (only probes have one; see [`padded_frame`](crate::transport::padded_frame)).
    Send {
        /// Receiver.
        to: NodeId,
        /// The message.
        msg: MeshMsg,
        /// Body length in bytes.
        padding: u64,
    },
    /// This node is now a member of `epoch`.
    Admitted {
        /// The epoch.
        epoch: Epoch,
        /// The outer step at admission.
        outer_step: u64,
    },
    /// The mesh changed (informational).
    EpochChanged {
        /// The new epoch.
        epoch: Epoch,
        /// Its members, in id order.
        members: Vec<NodeId>,
    },
    /// Run the inner steps of `outer_step`, keep the pseudo-gradient, then call
    /// [`Member::barrier_arrive`].
    Compute {
        /// The epoch.
        epoch: Epoch,
        /// The outer step.
        outer_step: u64,
    },
    /// Receive the training state from these peers (supersedes an earlier `FetchState`), then
    /// call [`Member::report_sync_done`].
    FetchState {
        /// The epoch of the assignment.
        epoch: Epoch,
        /// The senders.
        senders: Vec<NodeId>,
        /// The state the members vouch for ([`MeshMsg::Sync`]'s `vouched`; `None` when the
        /// assignment came with a release, in non-blocking mode).
        vouched: Option<super::Held>,
    },
    /// Send the training state (as of the last commit) to a joiner: this node's share of it when
    /// there are several senders. Comes again when the senders change (one of them died), so
    /// that the shares are divided among those left.
    SendState {
        /// The epoch of the assignment.
        epoch: Epoch,
        /// The joiner.
        to: NodeId,
        /// Every sender of this transfer, in id order (this node among them).
        senders: Vec<NodeId>,
    },
    /// Start the all-reduce from the kept pseudo-gradient; report with
    /// [`Member::report_allreduce_done`] or [`Member::report_allreduce_failed`]. Do not apply
    /// the result before [`MemberAction::Commit`].
    StartAllReduce(AllReduceStart),
    /// Abandon the all-reduce `op` of `epoch` (running or finished but not committed); keep the
    /// pseudo-gradient for the retry.
    AbortAllReduce {
        /// Its epoch.
        epoch: Epoch,
        /// Its op id.
        op: u64,
    },
    /// Every member finished: apply the outer update with the all-reduce's result.
    Commit {
        /// The epoch of the all-reduce.
        epoch: Epoch,
        /// The step committed.
        outer_step: u64,
    },
    /// Retries exhausted: do not apply an outer update for this step (outer weights unchanged,
    /// inner weights reset to them). Every member does the same.
    SkipStep {
        /// The epoch.
        epoch: Epoch,
        /// The step skipped.
        outer_step: u64,
        /// Attempts made.
        attempts: u32,
    },
    /// Nothing was heard from the coordinator for `coordinator_timeout` (once per silence):
    /// the member stays a member, heartbeating, for `waits` more, then stops with
    /// [`StopReason::CoordinatorLost`] unless the coordinator answers.
    CoordinatorSilent {
        /// How long the coordinator has been silent.
        silent_for: Duration,
        /// The last outer step this member committed.
        last_committed: Option<u64>,
        /// How much longer the member waits for it.
        waits: Duration,
    },
    /// Stop: checkpoint if appropriate, log the reason, exit.
    Stop(StopReason),
}

/// A command from the application, as data (what [`Member::handle_command`] takes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Command {
    /// [`Member::barrier_arrive`].
    BarrierArrive {
        /// The outer step.
        outer_step: u64,
    },
    /// [`Member::report_allreduce_done`].
    AllReduceDone {
        /// The epoch.
        epoch: Epoch,
        /// The op id.
        op: u64,
    },
    /// [`Member::report_allreduce_failed`].
    AllReduceFailed {
        /// The epoch.
        epoch: Epoch,
        /// The op id.
        op: u64,
        /// The neighbour named for the failure, if any.
        accused: Option<NodeId>,
        /// Frames of the attempt received from that neighbour.
        received: u64,
    },
    /// [`Member::report_sync_done`].
    SyncDone,
    /// [`Member::leave`].
    Leave(LeaveReason),
}

/// Where a member is (also reported in its heartbeats).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberPhase {
    /// Created, [`Member::join`] not called yet.
    Idle,
    /// Waiting for admission.
    Joining,
    /// Admitted in blocking mode: receiving the state before the all-reduce.
    Syncing {
        /// The step whose all-reduce waits.
        outer_step: u64,
    },
    /// Running inner steps.
    Computing {
        /// The step.
        outer_step: u64,
    },
    /// At the barrier, waiting for the release.
    AtBarrier {
        /// The step.
        outer_step: u64,
    },
    /// In the all-reduce (or finished it, waiting for the commit).
    Reducing {
        /// The step.
        outer_step: u64,
        /// The attempt.
        attempt: u32,
        /// This member reported it done.
        done: bool,
    },
    /// Stopped for good.
    Stopped,
}

impl fmt::Display for MemberPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemberPhase::Idle => write!(f, "idle"),
            MemberPhase::Joining => write!(f, "joining"),
            MemberPhase::Syncing { outer_step } => write!(f, "syncing for step {outer_step}"),
            MemberPhase::Computing { outer_step } => write!(f, "computing step {outer_step}"),
            MemberPhase::AtBarrier { outer_step } => {
                write!(f, "at the barrier of step {outer_step}")
            }
            MemberPhase::Reducing { outer_step, attempt, done } => write!(
                f,
                "reducing step {outer_step} attempt {attempt}{}",
                if *done { " (done)" } else { "" }
            ),
            MemberPhase::Stopped => write!(f, "stopped"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MemberTimer {
    Heartbeat,
    CoordinatorDeadline,
    Probe,
}

impl TimerKind for MemberTimer {
    const COUNT: usize = 3;
    fn all() -> &'static [Self] {
        &[MemberTimer::Heartbeat, MemberTimer::CoordinatorDeadline, MemberTimer::Probe]
    }
    fn index(self) -> usize {
        self as usize
    }
}

/// One node's side of the mesh, sans-IO. Call [`join`](Self::join) once, then feed it every
/// frame with a `Header::Mesh` via [`handle_message`](Self::handle_message), call
/// [`handle_timeout`](Self::handle_timeout) at [`poll_timeout`](Self::poll_timeout) (an early
/// call is a harmless no-op), give it the application's commands, and drain
/// [`poll_action`](Self::poll_action) after every call.
#[derive(Clone, Debug)]
pub struct Member {
    id: NodeId,
    incarnation: u64,
    cfg: MeshConfig,
    shards: u16,
    phase: MemberPhase,
    epoch: Option<Epoch>,
    members: Vec<NodeId>,
    queued: bool,
    synced: bool,
    /// The state the node holds and the steps it knows finished, told in its `Join`
    /// ([`Member::set_held`]).
    held: Option<Held>,
    finished: u64,
    collective: Option<(Epoch, u64)>,
    heard: Time,
    /// The coordinator has been silent for `coordinator_timeout`: this member said so
    /// ([`MemberAction::CoordinatorSilent`]) and waits for it, still a member, until `rejoin_for`.
    orphaned: bool,
    /// When this member was last driven (a message or a timer): a gap much longer than the
    /// heartbeat interval means this process itself was stopped (SIGSTOP, a VM pause).
    awake: Time,
    heartbeats: u64,
    last_committed: Option<u64>,
    fetching: Option<Vec<NodeId>>,
    /// The outer step whose pseudo-gradient this member withholds ([`Member::withhold`]).
    withheld: Option<u64>,
    sending: BTreeMap<NodeId, Vec<NodeId>>,
    timers: TimerTable<MemberTimer>,
    prober: Prober,
    actions: VecDeque<MemberAction>,
}

impl Member {
    /// The mesh's settings this member runs with.
    pub fn config(&self) -> &MeshConfig {
        &self.cfg
    }

    /// A member for node `id`. `incarnation` must differ between restarts of the same id (a
    /// counter, or a number drawn from the run's seeded stream); `shards` is the number of local
    /// rings (GPUs) it runs in each all-reduce.
    pub fn new(id: NodeId, incarnation: u64, cfg: MeshConfig, shards: u16) -> Self {
        Member {
            id,
            incarnation,
            cfg,
            shards: shards.max(1),
            phase: MemberPhase::Idle,
            epoch: None,
            members: Vec::new(),
            queued: false,
            synced: false,
            // A new process holds the initial weights until told otherwise.
            held: Some(Held::default()),
            finished: 0,
            collective: None,
            heard: Time::ZERO,
            orphaned: false,
            awake: Time::ZERO,
            heartbeats: 0,
            last_committed: None,
            fetching: None,
            withheld: None,
            sending: BTreeMap::new(),
            timers: TimerTable::new(),
            prober: Prober::default(),
            actions: VecDeque::new(),
        }
    }

    /// This node.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Its incarnation.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Where it is.
    pub fn phase(&self) -> MemberPhase {
        self.phase
    }

    /// Whether it has noticed the coordinator's silence ([`MemberAction::CoordinatorSilent`])
    /// and not heard from it since.
    pub fn waiting_for_coordinator(&self) -> bool {
        self.orphaned
    }

    /// The epoch it is in (exactly one, or none before admission).
    pub fn epoch(&self) -> Option<Epoch> {
        self.epoch
    }

    /// Members of its epoch, as last told, in id order.
    pub fn members(&self) -> &[NodeId] {
        &self.members
    }

    /// The last outer step it committed.
    pub fn last_committed(&self) -> Option<u64> {
        self.last_committed
    }

    /// True once stopped.
    pub fn is_stopped(&self) -> bool {
        self.phase == MemberPhase::Stopped
    }

    /// The next output, if any.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<MemberAction> {
        self.actions.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called next, if ever.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        self.timers.next_timeout()
    }

    fn send(&mut self, to: NodeId, msg: MeshMsg) {
        self.actions.push_back(MemberAction::Send { to, msg, padding: 0 });
    }

    fn send_coordinator(&mut self, msg: MeshMsg) {
        self.send(NodeId::COORDINATOR, msg);
    }

    fn stop(&mut self, reason: StopReason) {
        self.phase = MemberPhase::Stopped;
        self.collective = None;
        self.timers = TimerTable::new();
        self.actions.push_back(MemberAction::Stop(reason));
    }

    fn wrong_phase(&self, command: &'static str) -> MeshError {
        MeshError::WrongPhase { command, phase: self.phase.to_string() }
    }

    /// Asks to join. Call once, at start.
    pub fn join(&mut self, now: Time) -> Result<(), MeshError> {
        if self.phase != MemberPhase::Idle {
            return Err(self.wrong_phase("join"));
        }
        self.phase = MemberPhase::Joining;
        self.heard = now;
        self.awake = now;
        self.send_join();
        self.timers.set(MemberTimer::Heartbeat, now + self.cfg.heartbeat_interval);
        self.timers.set(MemberTimer::CoordinatorDeadline, now + self.cfg.coordinator_timeout);
        Ok(())
    }

    /// Says which training state the node holds (see [`Held`]): sent with the `Join`, and sent
    /// again if it changes while the node waits in the queue.
    /// `finished`: the outer steps the node knows were finished in the run (committed or
    /// skipped), in any membership of its process.
    pub fn set_held(&mut self, held: Option<Held>, finished: u64) {
        if (self.held, self.finished) == (held, finished) {
            return;
        }
        (self.held, self.finished) = (held, finished);
        if self.phase == MemberPhase::Joining && self.queued {
            self.send_join();
        }
    }

    fn send_join(&mut self) {
        self.send_coordinator(MeshMsg::Join {
            incarnation: self.incarnation,
            held: self.held,
            finished: self.finished,
        });
    }

    /// Leaves now: sends the deathrattle and stops. For a graceful exit, a panic hook or a
    /// signal handler.
    pub fn leave(&mut self, _now: Time, reason: LeaveReason) {
        if matches!(self.phase, MemberPhase::Idle | MemberPhase::Stopped) {
            return;
        }
        self.send_coordinator(MeshMsg::Leave { reason });
        self.stop(StopReason::Left(reason));
    }

    /// This member's pseudo-gradient of `outer_step` is not fit to average (not finite): its
    /// barrier arrival, and its heartbeats until the step is over, ask the coordinator for
    /// weight 0. Call before [`barrier_arrive`](Self::barrier_arrive).
    pub fn withhold(&mut self, outer_step: u64) {
        self.withheld = Some(outer_step);
    }

    /// The outer step whose pseudo-gradient this member withholds, if any.
    pub fn withheld(&self) -> Option<u64> {
        self.withheld
    }

    /// The inner steps of `outer_step` are done and the pseudo-gradient is kept.
    pub fn barrier_arrive(&mut self, _now: Time, outer_step: u64) -> Result<(), MeshError> {
        match self.phase {
            MemberPhase::Computing { outer_step: s } if s == outer_step => {
                self.phase = MemberPhase::AtBarrier { outer_step };
                let withheld = self.withheld == Some(outer_step);
                let held = self.held;
                self.send_coordinator(MeshMsg::Barrier { outer_step, withheld, held });
                Ok(())
            }
            MemberPhase::Computing { outer_step: s } => {
                Err(MeshError::WrongStep { got: outer_step, expected: Some(s) })
            }
            _ => Err(self.wrong_phase("barrier_arrive")),
        }
    }

    fn check_op(&self, epoch: Epoch, op: u64) -> Result<(u64, u32, bool), MeshError> {
        let (MemberPhase::Reducing { outer_step, attempt, done }, Some((e, running))) =
            (self.phase, self.collective)
        else {
            return Err(MeshError::UnknownOp { got: op, running: None });
        };
        if epoch != e {
            return Err(MeshError::StaleEpoch { got: epoch, current: Some(e) });
        }
        if op != running {
            return Err(MeshError::UnknownOp { got: op, running: Some(running) });
        }
        Ok((outer_step, attempt, done))
    }

    /// The all-reduce `op` of `epoch` finished on every shard. A report for an aborted epoch is
    /// refused with [`MeshError::StaleEpoch`].
    pub fn report_allreduce_done(
        &mut self,
        _now: Time,
        epoch: Epoch,
        op: u64,
        norms: Option<super::UpdateNorms>,
    ) -> Result<(), MeshError> {
        let (outer_step, attempt, done) = self.check_op(epoch, op)?;
        if !done {
            self.phase = MemberPhase::Reducing { outer_step, attempt, done: true };
            self.send_coordinator(MeshMsg::Done { epoch, outer_step, attempt, norms });
        }
        Ok(())
    }

    /// The all-reduce `op` of `epoch` failed here (a peer unreachable, a corrupt frame, nothing
    /// from `accused` for the progress timeout), with `received` frames of it received from the
    /// neighbour that sends to this node. The member waits for the coordinator's retry or skip.
    pub fn report_allreduce_failed(
        &mut self,
        _now: Time,
        epoch: Epoch,
        op: u64,
        accused: Option<NodeId>,
        received: u64,
    ) -> Result<(), MeshError> {
        let (outer_step, attempt, _) = self.check_op(epoch, op)?;
        self.phase = MemberPhase::Reducing { outer_step, attempt, done: false };
        let msg = MeshMsg::Failed { epoch, outer_step, attempt, accused, received };
        self.send_coordinator(msg);
        Ok(())
    }

    /// The complete state the senders of `epoch`'s assignment sent is not the one the members
    /// vouch for: the coordinator is told, to assign other senders.
    pub fn report_state_refused(&mut self, epoch: Epoch, senders: Vec<NodeId>) {
        if matches!(self.phase, MemberPhase::Syncing { .. }) {
            self.send_coordinator(MeshMsg::StateRefused { epoch, senders });
        }
    }

    /// The state requested by [`MemberAction::FetchState`] has arrived and verified.
    pub fn report_sync_done(&mut self, _now: Time) -> Result<(), MeshError> {
        let Some(epoch) = self.epoch else { return Err(self.wrong_phase("report_sync_done")) };
        if self.fetching.take().is_none() || self.phase == MemberPhase::Stopped {
            return Err(self.wrong_phase("report_sync_done"));
        }
        if let MemberPhase::Syncing { outer_step } = self.phase {
            self.phase = MemberPhase::AtBarrier { outer_step };
        }
        self.synced = true;
        self.send_coordinator(MeshMsg::Synced { epoch });
        Ok(())
    }

    /// Applies a [`Command`].
    pub fn handle_command(&mut self, now: Time, c: Command) -> Result<(), MeshError> {
        match c {
            Command::BarrierArrive { outer_step } => self.barrier_arrive(now, outer_step),
            Command::AllReduceDone { epoch, op } => {
                self.report_allreduce_done(now, epoch, op, None)
            }
            Command::AllReduceFailed { epoch, op, accused, received } => {
                self.report_allreduce_failed(now, epoch, op, accused, received)
            }
            Command::SyncDone => self.report_sync_done(now),
            Command::Leave(r) => {
                self.leave(now, r);
                Ok(())
            }
        }
    }

    /// Deadlines passed (heartbeat due, coordinator silent, probe timed out). Early calls are
    /// no-ops.
    pub fn handle_timeout(&mut self, now: Time) {
        // Stopped longer than half the coordinator timeout: the silence was this process's own.
        let stalled =
            now - self.awake > self.cfg.coordinator_timeout / 2 && self.phase != MemberPhase::Idle;
        self.awake = now;
        for t in self.timers.expired(now) {
            match t {
                MemberTimer::Heartbeat => {
                    if self.phase == MemberPhase::Joining && !self.queued {
                        self.send_join();
                    } else {
                        self.send_heartbeat();
                    }
                    self.timers.set(MemberTimer::Heartbeat, now + self.cfg.heartbeat_interval);
                }
                MemberTimer::CoordinatorDeadline if stalled => {
                    // Ask before concluding: the coordinator answers (or evicts this node).
                    self.heard = now;
                    self.send_heartbeat();
                    self.timers
                        .set(MemberTimer::CoordinatorDeadline, now + self.cfg.coordinator_timeout);
                }
                MemberTimer::CoordinatorDeadline => {
                    if self.coordinator_silent(now) {
                        return;
                    }
                }
                MemberTimer::Probe => {
                    let out = self.prober.on_timeout(now, self.cfg.probe_duration);
                    self.probe_out(out);
                }
            }
        }
    }

    /// The coordinator has been silent past its deadline. A coordinator that was itself away (a
    /// paused VM, its uplink down) comes back with its state and the members it credits, so the
    /// membership is kept, heartbeating, until the silence reaches `rejoin_for`; only then does
    /// the member stop (the coordinator is taken for dead). Returns whether it stopped.
    fn coordinator_silent(&mut self, now: Time) -> bool {
        let silent_for = now - self.heard;
        if !self.orphaned {
            self.orphaned = true;
            self.actions.push_back(MemberAction::CoordinatorSilent {
                silent_for,
                last_committed: self.last_committed,
                waits: self.cfg.rejoin_for.saturating_sub(silent_for),
            });
        }
        if silent_for >= self.cfg.rejoin_for {
            self.stop_lost(silent_for);
            return true;
        }
        self.timers.set(MemberTimer::CoordinatorDeadline, self.heard + self.cfg.rejoin_for);
        false
    }

    /// Stops for the loss of the coordinator, silent for `silent_for`.
    fn stop_lost(&mut self, silent_for: Duration) {
        let pending = match self.phase {
            MemberPhase::Reducing { outer_step, done: true, .. } => Some(outer_step),
            _ => None,
        };
        self.stop(StopReason::CoordinatorLost {
            silent_for,
            last_committed: self.last_committed,
            pending,
        });
    }

    fn send_heartbeat(&mut self) {
        self.heartbeats += 1;
        self.send_coordinator(MeshMsg::Heartbeat {
            seq: self.heartbeats,
            epoch: self.epoch,
            phase: self.phase,
            synced: self.synced,
            withheld: self.withheld,
        });
    }

    fn probe_out(&mut self, out: Vec<ProbeOut>) {
        for o in out {
            match o {
                ProbeOut::Send { to, round, seq, padding } => {
                    self.actions.push_back(MemberAction::Send {
                        to,
                        msg: MeshMsg::Probe { round, seq },
                        padding,
                    });
                }
                ProbeOut::Report { round, results } => {
                    self.send_coordinator(MeshMsg::ProbeReport { round, results });
                }
            }
        }
        self.timers.set_opt(MemberTimer::Probe, self.prober.deadline(self.cfg.probe_duration));
    }

    /// Takes `epoch` as current unless it is older. Returns whether it changed, `None` if stale.
    fn accept_epoch(&mut self, epoch: Epoch) -> Option<bool> {
        if self.epoch.is_some_and(|cur| epoch < cur) {
            return None;
        }
        let changed = self.epoch != Some(epoch);
        self.epoch = Some(epoch);
        Some(changed)
    }

    fn set_members(&mut self, epoch: Epoch, mut members: Vec<NodeId>, changed: bool) {
        members.sort();
        members.dedup();
        self.members = members;
        if changed {
            self.actions
                .push_back(MemberAction::EpochChanged { epoch, members: self.members.clone() });
        }
    }

    fn admit_if_joining(&mut self, epoch: Epoch, outer_step: u64) {
        if self.phase == MemberPhase::Joining {
            self.actions.push_back(MemberAction::Admitted { epoch, outer_step });
        }
    }

    fn transfers(&mut self, epoch: Epoch, transfers: &[Transfer], vouched: Option<super::Held>) {
        for t in transfers {
            if t.joiner == self.id && self.fetching.as_ref() != Some(&t.senders) {
                self.fetching = Some(t.senders.clone());
                let senders = t.senders.clone();
                self.actions.push_back(MemberAction::FetchState { epoch, senders, vouched });
            }
            if t.senders.contains(&self.id) && self.sending.get(&t.joiner) != Some(&t.senders) {
                self.sending.insert(t.joiner, t.senders.clone());
                let senders = t.senders.clone();
                self.actions.push_back(MemberAction::SendState { epoch, to: t.joiner, senders });
            }
        }
    }

    fn abort_running(&mut self) {
        if let Some((epoch, op)) = self.collective.take() {
            self.actions.push_back(MemberAction::AbortAllReduce { epoch, op });
        }
    }

    fn compute(&mut self, epoch: Epoch, outer_step: u64) {
        self.phase = MemberPhase::Computing { outer_step };
        self.sending.clear();
        self.actions.push_back(MemberAction::Compute { epoch, outer_step });
    }

    /// Whether a message naming `ids` with `incarnations` (aligned) is meant for this process:
    /// it does not name this node, or names it with this incarnation.
    fn addressed_to_me(&self, ids: &[NodeId], incarnations: &[u64]) -> bool {
        ids.iter()
            .position(|&x| x == self.id)
            .is_none_or(|i| incarnations.get(i) == Some(&self.incarnation))
    }

    /// A mesh message from `from` arrived at `now` (this node's clock).
    pub fn handle_message(&mut self, now: Time, from: NodeId, msg: MeshMsg) {
        if matches!(self.phase, MemberPhase::Idle | MemberPhase::Stopped) {
            return;
        }
        if from != NodeId::COORDINATOR {
            self.peer_message(now, from, msg);
            return;
        }
        let silent_for = now - self.heard;
        let orphaned = std::mem::take(&mut self.orphaned);
        self.heard = now;
        self.awake = now;
        self.timers.set(MemberTimer::CoordinatorDeadline, now + self.cfg.coordinator_timeout);
        match msg {
            MeshMsg::Queued { .. } => self.queued = true,
            // Not queued: the join goes again with the next heartbeat.
            MeshMsg::QueueFull => self.queued = false,
            MeshMsg::HeartbeatAck => {}
            MeshMsg::View { epoch, outer_step, members, incarnation } => {
                self.on_view(epoch, outer_step, members, incarnation)
            }
            MeshMsg::Sync { epoch, outer_step, members, incarnations, transfers, vouched } => {
                self.on_sync(epoch, outer_step, members, &incarnations, &transfers, vouched)
            }
            MeshMsg::Release {
                epoch,
                outer_step,
                attempt,
                ring,
                weights,
                incarnations,
                transfers,
            } => {
                let Some(pos) = ring.iter().position(|&x| x == self.id) else { return };
                if incarnations.get(pos) != Some(&self.incarnation) {
                    return; // meant for this node's previous process
                }
                if self.epoch.is_some_and(|cur| epoch < cur) {
                    return;
                }
                if matches!(self.phase, MemberPhase::Computing { .. }) {
                    return; // not at the barrier: it has no pseudo-gradient to reduce
                }
                let op = op_id(outer_step, attempt);
                if self.collective == Some((epoch, op)) {
                    return; // sent again (a repair that crossed our progress): already running
                }
                self.abort_running();
                let Some(changed) = self.accept_epoch(epoch) else { return };
                self.admit_if_joining(epoch, outer_step);
                self.set_members(epoch, ring.clone(), changed);
                self.transfers(epoch, &transfers, None);
                let weight = weights.get(pos).copied().unwrap_or(Weight::ZERO);
                let total_weight = weights.iter().map(|w| w.get()).sum();
                self.phase = MemberPhase::Reducing { outer_step, attempt, done: false };
                self.collective = Some((epoch, op));
                self.actions.push_back(MemberAction::StartAllReduce(AllReduceStart {
                    epoch,
                    op,
                    outer_step,
                    attempt,
                    ring,
                    weight,
                    total_weight,
                    shards: self.shards,
                }));
            }
            MeshMsg::Commit { epoch, outer_step } => self.on_commit(epoch, outer_step),
            MeshMsg::Skip { epoch, outer_step, members, attempts } => {
                self.on_skip(epoch, outer_step, members, attempts)
            }
            // A coordinator that answers a member it lost with "not a member" is a new one (a
            // restart) or evicted it meanwhile: the member was cut off, not refused, and keeps
            // its state for the rejoin (a forming mesh founds itself on it).
            MeshMsg::Evicted { reason: EvictReason::NotAMember } if orphaned => {
                self.stop_lost(silent_for)
            }
            MeshMsg::Evicted { reason } => self.stop(StopReason::Evicted(reason)),
            MeshMsg::ProbeRequest { round, peers } => {
                let peers: Vec<NodeId> = peers.into_iter().filter(|&p| p != self.id).collect();
                let out = self.prober.start(now, round, peers, self.cfg.probe_duration);
                self.probe_out(out);
            }
            MeshMsg::Shutdown => self.stop(StopReason::Shutdown),
            MeshMsg::UpdatesRefused { outer_step } => self.stop(StopReason::UpdatesRefused {
                outer_step,
                last_committed: self.last_committed,
            }),
            MeshMsg::NoSyncedMember { outer_step } => self.stop(StopReason::NoSyncedMember {
                outer_step,
                synced: self.synced,
                last_committed: self.last_committed,
            }),
            // Member-to-coordinator or peer messages from the coordinator: ignore.
            MeshMsg::Join { .. }
            | MeshMsg::Heartbeat { .. }
            | MeshMsg::Barrier { .. }
            | MeshMsg::Done { .. }
            | MeshMsg::Failed { .. }
            | MeshMsg::Synced { .. }
            | MeshMsg::StateRefused { .. }
            | MeshMsg::ProbeReport { .. }
            | MeshMsg::Leave { .. }
            | MeshMsg::Probe { .. }
            | MeshMsg::ProbeAck { .. } => {}
        }
    }

    /// `View`: a new epoch while members compute; a joiner named in it is admitted into a
    /// forming mesh.
    fn on_view(&mut self, epoch: Epoch, outer_step: u64, members: Vec<NodeId>, incarnation: u64) {
        if incarnation != self.incarnation {
            return; // meant for this node's previous process
        }
        let joining = self.phase == MemberPhase::Joining;
        if joining && !members.contains(&self.id) {
            return; // formed without us: we are still queued
        }
        let Some(changed) = self.accept_epoch(epoch) else { return };
        self.admit_if_joining(epoch, outer_step);
        self.set_members(epoch, members, changed);
        if joining {
            // Admitted into a forming mesh: every member starts from the same state.
            self.synced = true;
            self.compute(epoch, outer_step);
        }
    }

    /// `Sync` (blocking mode): a new epoch whose joiners first receive the state.
    fn on_sync(
        &mut self,
        epoch: Epoch,
        outer_step: u64,
        members: Vec<NodeId>,
        incarnations: &[u64],
        transfers: &[Transfer],
        vouched: Option<super::Held>,
    ) {
        if !self.addressed_to_me(&members, incarnations) {
            return; // meant for this node's previous process
        }
        let joining = self.phase == MemberPhase::Joining;
        if joining && !members.contains(&self.id) {
            return;
        }
        let Some(changed) = self.accept_epoch(epoch) else { return };
        self.admit_if_joining(epoch, outer_step);
        self.set_members(epoch, members, changed);
        if joining {
            let me = self.id;
            self.phase = if transfers.iter().any(|t| t.joiner == me) {
                MemberPhase::Syncing { outer_step }
            } else {
                MemberPhase::AtBarrier { outer_step }
            };
        }
        self.transfers(epoch, transfers, vouched);
    }

    /// `Commit`: a member whose attempt finished applies the outer update and computes the
    /// next step.
    fn on_commit(&mut self, epoch: Epoch, outer_step: u64) {
        // The epoch is the collective's (the membership may have moved on since).
        let finished = matches!(
            self.phase,
            MemberPhase::Reducing { outer_step: s, done: true, .. } if s == outer_step
        );
        if finished && self.collective.is_some_and(|(e, _)| e == epoch) {
            self.collective = None;
            self.last_committed = Some(outer_step);
            self.actions.push_back(MemberAction::Commit { epoch, outer_step });
            let current = self.epoch.unwrap_or(epoch);
            self.compute(current, outer_step + 1);
        }
    }

    /// `Skip`: retries are exhausted; a member at that step skips its outer update.
    fn on_skip(&mut self, epoch: Epoch, outer_step: u64, members: Vec<NodeId>, attempts: u32) {
        let at_step = match self.phase {
            MemberPhase::Reducing { outer_step: s, .. }
            | MemberPhase::AtBarrier { outer_step: s }
            | MemberPhase::Syncing { outer_step: s }
            | MemberPhase::Computing { outer_step: s } => s == outer_step,
            _ => false,
        };
        if !at_step || !members.contains(&self.id) {
            return;
        }
        self.abort_running();
        let Some(changed) = self.accept_epoch(epoch) else { return };
        self.set_members(epoch, members, changed);
        self.actions.push_back(MemberAction::SkipStep { epoch, outer_step, attempts });
        self.compute(epoch, outer_step + 1);
    }

    fn peer_message(&mut self, now: Time, from: NodeId, msg: MeshMsg) {
        match msg {
            MeshMsg::Probe { round, seq } => self.send(from, MeshMsg::ProbeAck { round, seq }),
            MeshMsg::ProbeAck { round, seq } => {
                let out = self.prober.on_ack(now, from, round, seq, self.cfg.probe_duration);
                self.probe_out(out);
            }
            // Only the coordinator speaks the rest.
            _ => {}
        }
    }
}

#[cfg(test)]
#[path = "member_tests.rs"]
mod tests;
