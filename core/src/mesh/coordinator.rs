//! The coordinator: a sans-IO state machine that records the members' messages into a
//! [`MeshState`], applies [`decide`]'s decisions and emits messages.
//!
//! Size: one impl of one state machine's handlers over one [`MeshState`], a message each; read
//! together they show every field a decision may change, which a split by message would scatter.

use super::decide::{CoordTimer, Decision, EpochPlan, Reason, Round, Then, decide, timers};
use super::member::MemberPhase;
use super::probe::ProbePlan;
use super::state::{Joiner, MemberInfo, MeshState, Outcome, Phase};
use super::timer::TimerTable;
use super::{EvictReason, Held, MeshConfig, MeshMsg, ProbeResult};
use crate::ids::{Epoch, NodeId, Weight};
use crate::time::Time;

/// The largest epoch a forming coordinator takes from a stranger's heartbeat as the floor of its
/// own (far beyond any run's count: a forged one cannot bring the count to its end).
const EPOCH_FLOOR_MAX: u64 = 1 << 48;
use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

/// Decisions applied in one call at most; more means a bug in [`decide`] (reported as
/// [`MeshEvent::DecisionLimit`], never a hang or a panic).
const MAX_DECISIONS_PER_CALL: usize = 64;

/// Something the coordinator did or saw, for the metrics and the log.
#[derive(Clone, Debug, PartialEq)]
pub enum MeshEvent {
    /// A node asked to join and was queued.
    JoinQueued {
        /// The node.
        node: NodeId,
        /// Its incarnation.
        incarnation: u64,
        /// Its position in the queue.
        position: u32,
    },
    /// The queue of joiners reached [`MeshConfig::max_queue`]: joins beyond it are answered
    /// `QueueFull` until a place frees (said once each time it fills).
    QueueFull {
        /// The cap.
        max: usize,
    },
    /// A queued joiner went silent or left before its admission.
    JoinerForgotten {
        /// The node.
        node: NodeId,
    },
    /// A join was refused (it was told `Evicted { reason }`): its incarnation was admitted once
    /// already (a process restarted with the incarnation of the one before).
    JoinRefused {
        /// The node.
        node: NodeId,
        /// The incarnation it joined with.
        incarnation: u64,
        /// What it was told.
        reason: EvictReason,
    },
    /// A new epoch was formed.
    EpochFormed {
        /// The epoch.
        epoch: Epoch,
        /// Its members, in id order.
        members: Vec<NodeId>,
        /// Joiners admitted into it.
        admitted: Vec<NodeId>,
        /// Members removed, with the reason.
        evicted: Vec<(NodeId, EvictReason)>,
    },
    /// An all-reduce was released (attempt > 0: a retry).
    Released {
        /// Its epoch.
        epoch: Epoch,
        /// The outer step.
        outer_step: u64,
        /// The attempt.
        attempt: u32,
        /// The ring.
        ring: Vec<NodeId>,
        /// The weights, aligned with the ring.
        weights: Vec<Weight>,
    },
    /// A member reported its all-reduce failed.
    AllReduceFailed {
        /// The member.
        node: NodeId,
        /// The epoch of the attempt.
        epoch: Epoch,
        /// The attempt.
        attempt: u32,
        /// The member it named for the failure (values that are not finite), if any.
        accused: Option<NodeId>,
    },
    /// Every member finished the all-reduce; the outer step is committed.
    Committed {
        /// The epoch.
        epoch: Epoch,
        /// The step.
        outer_step: u64,
    },
    /// The averaged update failed the guard ([`MeshConfig::max_update_ratio`]): every member
    /// skips the step (or, at the limit, the run stops).
    UpdateRefused {
        /// The epoch.
        epoch: Epoch,
        /// The step.
        outer_step: u64,
        /// The largest norm of the average reported (infinite for NaN).
        norm: f64,
        /// The median of the committed norms kept (`None` before there are enough).
        median: Option<f64>,
        /// The member whose own pseudo-gradient stands out (beyond the ratio of the others'
        /// median), if one does.
        outlier: Option<NodeId>,
        /// Whether the run stops for it ([`UPDATE_REFUSALS_LIMIT`](super::UPDATE_REFUSALS_LIMIT)
        /// in a row).
        stopping: bool,
    },
    /// Retries were exhausted: every member skips this step's outer update.
    StepSkipped {
        /// The epoch in which the skip was decided.
        epoch: Epoch,
        /// The step.
        outer_step: u64,
        /// Attempts made.
        attempts: u32,
    },
    /// A message that belongs to another epoch, step or attempt was ignored.
    Stale {
        /// The sender.
        from: NodeId,
        /// The message.
        msg: MeshMsg,
        /// The current epoch.
        current: Epoch,
    },
    /// A link was measured.
    BandwidthMeasured {
        /// The sending end.
        from: NodeId,
        /// The receiving end.
        to: NodeId,
        /// Bytes per second.
        bytes_per_sec: f64,
    },
    /// What the coordinator waits for changed (logged only on change).
    Waiting(Reason),
    /// More than the allowed number of decisions in one call: the rest waits for the next event.
    DecisionLimit,
    /// The coordinator told every node to stop.
    Shutdown,
    /// No member holding the training state is left: the coordinator stopped the run (it told
    /// the members and queued joiners left `NoSyncedMember`, and answers any later message the
    /// same way). The run must be resumed from checkpoints taken after `outer_step` outer steps.
    NoSyncedMember {
        /// The last epoch formed.
        epoch: Epoch,
        /// The outer step that could not be finished (every step before it was).
        outer_step: u64,
        /// Members removed by this last change, with the reason.
        evicted: Vec<(NodeId, EvictReason)>,
        /// The members left, none of which holds the state.
        unsynced: Vec<NodeId>,
    },
}

impl fmt::Display for MeshEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MeshEvent::JoinQueued { node, position, .. } => {
                write!(f, "{node} queued to join (position {position})")
            }
            MeshEvent::JoinerForgotten { node } => write!(f, "joiner {node} forgotten"),
            MeshEvent::QueueFull { max } => {
                write!(f, "the join queue is full ({max} joiners): later joins wait")
            }
            MeshEvent::JoinRefused { node, incarnation, reason } => {
                write!(f, "join of {node} (incarnation {incarnation}) refused: {reason}")
            }
            MeshEvent::EpochFormed { epoch, members, admitted, evicted } => {
                write!(f, "epoch {epoch}: {} members", members.len())?;
                for a in admitted {
                    write!(f, ", +{a}")?;
                }
                for (e, why) in evicted {
                    write!(f, ", -{e} ({why})")?;
                }
                Ok(())
            }
            MeshEvent::Released { epoch, outer_step, attempt, ring, .. } => {
                write!(
                    f,
                    "{epoch}: all-reduce of step {outer_step} attempt {attempt} on {} nodes",
                    ring.len()
                )
            }
            MeshEvent::AllReduceFailed { node, epoch, attempt, accused: None } => {
                write!(f, "{epoch}: {node} reports attempt {attempt} failed")
            }
            MeshEvent::AllReduceFailed { node, epoch, attempt, accused: Some(a) } => write!(
                f,
                "{epoch}: {node} reports attempt {attempt} failed: values from {a} not finite"
            ),
            MeshEvent::Committed { epoch, outer_step } => {
                write!(f, "{epoch}: step {outer_step} committed")
            }
            MeshEvent::UpdateRefused { epoch, outer_step, norm, median, outlier, stopping } => {
                write!(f, "{epoch}: step {outer_step}'s update refused: norm {norm:.3e}")?;
                if let Some(m) = median {
                    write!(f, " against a median of {m:.3e}")?;
                }
                if let Some(o) = outlier {
                    write!(f, "; {o}'s own pseudo-gradient stands out")?;
                }
                f.write_str(if *stopping { "; the run stops" } else { "; skipped" })
            }
            MeshEvent::StepSkipped { epoch, outer_step, attempts } => write!(
                f,
                "{epoch}: step {outer_step} skipped by every member after {attempts} failed attempts"
            ),
            MeshEvent::Stale { from, current, .. } => {
                write!(f, "stale message from {from} ignored (current {current})")
            }
            MeshEvent::BandwidthMeasured { from, to, bytes_per_sec } => {
                write!(f, "link {from}->{to}: {:.1} MB/s", bytes_per_sec / 1e6)
            }
            MeshEvent::Waiting(r) => write!(f, "waiting: {r}"),
            MeshEvent::DecisionLimit => write!(f, "decision limit reached"),
            MeshEvent::Shutdown => write!(f, "shutdown"),
            MeshEvent::NoSyncedMember { epoch, outer_step, evicted, unsynced } => {
                write!(f, "{epoch}: no member holds the training state")?;
                for (e, why) in evicted {
                    write!(f, ", -{e} ({why})")?;
                }
                if !unsynced.is_empty() {
                    let v: Vec<String> = unsynced.iter().map(ToString::to_string).collect();
                    write!(f, ", left without it: {}", v.join(" "))?;
                }
                write!(f, "; run stopped at outer step {outer_step}, resume from checkpoints")
            }
        }
    }
}

/// An output of the coordinator.
#[derive(Clone, Debug, PartialEq)]
pub enum CoordinatorAction {
    /// Send a control message (empty body).
    Send {
        /// Receiver.
        to: NodeId,
        /// The message.
        msg: MeshMsg,
    },
    /// Record an event.
    Event(MeshEvent),
}

/// The mesh coordinator, sans-IO. Feed it every message addressed to
/// [`NodeId::COORDINATOR`] with [`handle_message`](Self::handle_message), call
/// [`handle_timeout`](Self::handle_timeout) at [`poll_timeout`](Self::poll_timeout), and after
/// every call drain [`poll_action`](Self::poll_action) in order.
#[derive(Clone, Debug)]
pub struct Coordinator {
    cfg: MeshConfig,
    state: MeshState,
    actions: VecDeque<CoordinatorAction>,
    timers: TimerTable<CoordTimer>,
    last_reason: Option<Reason>,
    probes: ProbePlan,
    stopped: bool,
    /// Once stopped: the message that answers any member's message (`Shutdown` or
    /// `NoSyncedMember`), so that a node that missed it, or joins late, learns why.
    farewell: Option<MeshMsg>,
    /// When it last handled an input: the start of a gap in which it may not have been running.
    last_ran: Option<Time>,
    /// The queue is full, said once ([`MeshEvent::QueueFull`]) until a join is queued again.
    queue_full: bool,
}

impl Coordinator {
    /// A coordinator with no members yet.
    pub fn new(cfg: MeshConfig) -> Self {
        Coordinator {
            cfg,
            state: MeshState::default(),
            actions: VecDeque::new(),
            timers: TimerTable::new(),
            last_reason: None,
            queue_full: false,
            probes: ProbePlan::default(),
            stopped: false,
            farewell: None,
            last_ran: None,
        }
    }

    /// A coordinator whose first epoch starts at `outer_step` (a run resumed from checkpoints
    /// taken after that many outer steps).
    pub fn starting_at(cfg: MeshConfig, outer_step: u64) -> Self {
        let mut c = Coordinator::new(cfg);
        c.state.outer_step = outer_step;
        c
    }

    /// Everything the coordinator knows.
    pub fn state(&self) -> &MeshState {
        &self.state
    }

    /// The settings.
    pub fn config(&self) -> &MeshConfig {
        &self.cfg
    }

    /// The current epoch (0 before the first one).
    pub fn epoch(&self) -> Epoch {
        self.state.epoch
    }

    /// Members of the current epoch, in id order.
    pub fn members(&self) -> Vec<NodeId> {
        self.state.member_ids()
    }

    /// The outer step being computed or reduced.
    pub fn outer_step(&self) -> u64 {
        self.state.outer_step
    }

    /// True after [`shutdown`](Self::shutdown), or once the run stopped because no member holds
    /// the training state ([`MeshEvent::NoSyncedMember`]).
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// The next output, if any. Drain after every call.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<CoordinatorAction> {
        self.actions.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called next, if ever.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        if self.stopped { None } else { self.timers.next_timeout() }
    }

    /// Deadlines passed. Calling it early is harmless.
    pub fn handle_timeout(&mut self, now: Time) {
        if !self.stopped {
            self.credit_absence(now, false);
            self.step(now);
        }
    }

    /// The coordinator judges silence only over time it was itself running and hearing. Two
    /// signs say it was not (a paused VM, swap, a blocked loop, its own uplink down), and
    /// nothing it could have heard meanwhile was heard:
    /// - a deadline met more than a quarter of a heartbeat interval late (`heard` false): the
    ///   gap since it last handled an input is credited;
    /// - a message after more than one and a half heartbeat intervals without any message while
    ///   it has members or joiners, who each beat every interval (`heard` true): the gap since
    ///   the last message is credited. Deadlines met meanwhile judged nobody's silence (see
    ///   [`isolated`](super::decide::isolated)).
    ///
    /// When it stopped hearing within that gap is unknown, so every member and joiner is
    /// credited the whole gap: a pause or a cut-off of the coordinator alone evicts nobody, and
    /// a node that died meanwhile is evicted that much later. Returns whether it credited.
    fn credit_absence(&mut self, now: Time, heard: bool) -> bool {
        let last_ran = self.last_ran.replace(now);
        let interval = self.cfg.heartbeat_interval;
        let gap = if heard {
            let since = self.state.last_heard.replace(now).or(last_ran);
            let gap = since.map_or(Duration::ZERO, |t| now.saturating_since(t));
            let someone = !self.state.members.is_empty() || !self.state.queue.is_empty();
            (someone && gap > interval + interval / 2).then_some(gap)
        } else {
            let late = self
                .timers
                .next_timeout()
                .is_some_and(|due| now.saturating_since(due) > interval / 4);
            last_ran.filter(|_| late).map(|t| now.saturating_since(t))
        };
        let Some(gap) = gap else { return false };
        tracing::warn!(
            "coordinator: {:.1}s since it last ran or heard anyone: silence over that time is not held against anyone",
            gap.as_secs_f64()
        );
        for m in self.state.members.values_mut() {
            m.last_seen = (m.last_seen + gap).min(now);
        }
        for j in &mut self.state.queue {
            j.last_seen = (j.last_seen + gap).min(now);
        }
        true
    }

    /// Ends the run: tells every member and queued joiner to stop.
    pub fn shutdown(&mut self, _now: Time) {
        if self.stopped {
            return;
        }
        let to: Vec<NodeId> = self
            .state
            .member_ids()
            .into_iter()
            .chain(self.state.queue.iter().map(|j| j.id))
            .collect();
        for id in to {
            self.send(id, MeshMsg::Shutdown);
        }
        self.event(MeshEvent::Shutdown);
        self.stopped = true;
        self.farewell = Some(MeshMsg::Shutdown);
    }

    /// A message from `from` arrived at `now` (the coordinator's clock).
    pub fn handle_message(&mut self, now: Time, from: NodeId, msg: MeshMsg) {
        if self.stopped {
            self.answer_after_stop(from, &msg);
            return;
        }
        let credited = self.credit_absence(now, true);
        // A heartbeat from a live member that changes nothing but its liveness changes no
        // decision (see `quiet` below): what it was before.
        let before = match &msg {
            MeshMsg::Heartbeat { .. } => self
                .state
                .members
                .get(&from)
                .filter(|m| now < m.last_seen + self.cfg.heartbeat_timeout)
                .cloned(),
            _ => None,
        };
        self.seen(now, from, &msg);
        let is_member = self.state.members.contains_key(&from);
        match msg {
            MeshMsg::Join { incarnation, held, finished } => {
                self.on_join(now, from, incarnation, held, finished)
            }
            MeshMsg::Heartbeat { epoch, phase, synced, withheld, .. } => {
                if is_member || self.state.is_queued(from) {
                    self.send(from, MeshMsg::HeartbeatAck);
                    if is_member {
                        if let (Some(s), Some(m)) = (withheld, self.state.members.get_mut(&from)) {
                            m.withheld = Some(s);
                        }
                        self.repair(now, from, epoch, phase, synced);
                    }
                } else {
                    // A member of an epoch this coordinator never formed (it restarted): it
                    // joins again at once, and a forming mesh waits for its state.
                    if self.state.phase == Phase::Forming
                        && let Some(e) = epoch
                    {
                        if self.state.expected.len() < self.cfg.max_queue {
                            self.state.expected.insert(from, now);
                        }
                        // Its epochs go on above the old mesh's: a frame still on its way from
                        // an old collective can never pass for one of the new mesh.
                        if e.0 < EPOCH_FLOOR_MAX {
                            self.state.epoch = self.state.epoch.max(e);
                        }
                    }
                    self.send(from, MeshMsg::Evicted { reason: EvictReason::NotAMember });
                }
            }
            MeshMsg::Barrier { outer_step, withheld, held } if is_member => {
                self.on_barrier(now, from, outer_step, withheld, held)
            }
            MeshMsg::Done { epoch, outer_step, attempt, norms } if is_member => {
                if self.is_current_round(epoch, outer_step, attempt) {
                    if let Some(m) = self.state.members.get_mut(&from) {
                        m.done = true;
                        m.norms = norms;
                    }
                } else {
                    self.stale(from, MeshMsg::Done { epoch, outer_step, attempt, norms });
                }
            }
            MeshMsg::Failed { epoch, outer_step, attempt, accused, received } if is_member => {
                self.on_failed(now, from, (epoch, outer_step, attempt), accused, received)
            }
            MeshMsg::Synced { .. } if is_member => {
                if let Some(m) = self.state.members.get_mut(&from) {
                    m.synced = true;
                }
            }
            MeshMsg::StateRefused { epoch, senders } if is_member => {
                self.on_state_refused(from, epoch, &senders)
            }
            MeshMsg::ProbeReport { round, results } if is_member => {
                self.on_probe_report(from, round, results)
            }
            MeshMsg::Leave { reason } => {
                if let Some(m) = self.state.members.get_mut(&from) {
                    m.leaving = Some(reason);
                } else if self.state.is_queued(from) {
                    self.state.queue.retain(|j| j.id != from);
                    self.event(MeshEvent::JoinerForgotten { node: from });
                }
            }
            MeshMsg::Barrier { .. }
            | MeshMsg::Done { .. }
            | MeshMsg::Failed { .. }
            | MeshMsg::Synced { .. }
            | MeshMsg::StateRefused { .. }
            | MeshMsg::ProbeReport { .. } => {
                // A member's message from a non-member: it was evicted; tell it again.
                self.send(from, MeshMsg::Evicted { reason: EvictReason::NotAMember });
            }
            // Messages meant for members or peers: not ours, ignore.
            MeshMsg::Queued { .. }
            | MeshMsg::HeartbeatAck
            | MeshMsg::QueueFull
            | MeshMsg::View { .. }
            | MeshMsg::Sync { .. }
            | MeshMsg::Release { .. }
            | MeshMsg::Commit { .. }
            | MeshMsg::Skip { .. }
            | MeshMsg::UpdatesRefused { .. }
            | MeshMsg::Evicted { .. }
            | MeshMsg::ProbeRequest { .. }
            | MeshMsg::Shutdown
            | MeshMsg::NoSyncedMember { .. }
            | MeshMsg::Probe { .. }
            | MeshMsg::ProbeAck { .. } => {}
        }
        // After a credit every deadline moved: decide again, whatever the message.
        if credited || !self.quiet(now, from, before) {
            self.step(now);
        }
    }

    /// The run is over: a member's message (not its deathrattle) gets the final word again.
    fn answer_after_stop(&mut self, from: NodeId, msg: &MeshMsg) {
        let to_us = matches!(
            msg,
            MeshMsg::Join { .. }
                | MeshMsg::Heartbeat { .. }
                | MeshMsg::Barrier { .. }
                | MeshMsg::Done { .. }
                | MeshMsg::Failed { .. }
                | MeshMsg::Synced { .. }
                | MeshMsg::StateRefused { .. }
                | MeshMsg::ProbeReport { .. }
        );
        if let (true, Some(m)) = (to_us, self.farewell.clone()) {
            self.send(from, m);
        }
    }

    /// Any message from `from` at `now`: its liveness, stamped with our own receive time, and
    /// whether it shows that the member knows it was admitted.
    fn seen(&mut self, now: Time, from: NodeId, msg: &MeshMsg) {
        if let Some(m) = self.state.members.get_mut(&from) {
            m.last_seen = m.last_seen.max(now);
        }
        if let Some(j) = self.state.queue.iter_mut().find(|j| j.id == from) {
            j.last_seen = j.last_seen.max(now);
        }
        // Only a process that knows it was admitted sends these (see `MemberInfo::confirmed`).
        let confirms = matches!(
            msg,
            MeshMsg::Heartbeat { epoch: Some(_), .. }
                | MeshMsg::Barrier { .. }
                | MeshMsg::Done { .. }
                | MeshMsg::Failed { .. }
                | MeshMsg::Synced { .. }
                | MeshMsg::StateRefused { .. }
                | MeshMsg::ProbeReport { .. }
        );
        if let (true, Some(m)) = (confirms, self.state.members.get_mut(&from)) {
            m.confirmed = true;
        }
    }

    /// A member arrived at the barrier of `outer_step` (stale unless that step computes).
    fn on_barrier(
        &mut self,
        now: Time,
        from: NodeId,
        outer_step: u64,
        withheld: bool,
        held: Option<super::Held>,
    ) {
        let cur = self.state.outer_step;
        match &mut self.state.phase {
            Phase::Compute { barrier_opened, .. } if outer_step == cur => {
                barrier_opened.get_or_insert(now);
                if let Some(m) = self.state.members.get_mut(&from) {
                    m.arrived = Some(outer_step);
                    m.held_at_barrier = held;
                    if withheld {
                        m.withheld = Some(outer_step);
                    }
                }
            }
            _ => self.stale(from, MeshMsg::Barrier { outer_step, withheld, held }),
        }
    }

    /// A member's all-reduce attempt `(epoch, outer step, attempt)` failed (stale unless it is
    /// the current round's), naming `accused` (kept only when that is another member), with
    /// `received` frames of it received from its ring neighbour.
    fn on_failed(
        &mut self,
        now: Time,
        from: NodeId,
        (epoch, outer_step, attempt): (Epoch, u64, u32),
        accused: Option<NodeId>,
        received: u64,
    ) {
        if self.is_current_round(epoch, outer_step, attempt) {
            let accused = accused.filter(|a| *a != from && self.state.members.contains_key(a));
            if let Some(m) = self.state.members.get_mut(&from) {
                m.failed = true;
                m.accuses = accused;
                m.received = received;
            }
            if let Phase::Reduce { failed_at, .. } = &mut self.state.phase {
                failed_at.get_or_insert(now);
            }
            self.event(MeshEvent::AllReduceFailed { node: from, epoch, attempt, accused });
        } else {
            let msg = MeshMsg::Failed { epoch, outer_step, attempt, accused, received };
            self.stale(from, msg);
        }
    }

    /// A joiner being synced refused the state its senders of `epoch` sent (not the one the
    /// members vouch for): those of its current senders are not assigned to it again while it
    /// syncs (the decision reassigns it where others can send).
    fn on_state_refused(&mut self, from: NodeId, epoch: Epoch, senders: &[NodeId]) {
        let syncing = matches!(self.state.phase, Phase::Sync { .. })
            && epoch == self.state.epoch
            && self.state.members.get(&from).is_some_and(|m| !m.synced);
        let Some(t) = self.state.transfers.iter().find(|t| t.joiner == from) else { return };
        if !syncing {
            return;
        }
        let named: Vec<NodeId> =
            senders.iter().copied().filter(|id| t.senders.contains(id)).collect();
        tracing::warn!(target: "loco_core", "{from} refused the state {named:?} sent: not the one the members hold");
        self.state.refused.entry(from).or_default().extend(named);
    }

    /// A member's bandwidths to its peers, measured in probe `round`.
    fn on_probe_report(&mut self, from: NodeId, round: u64, results: Vec<ProbeResult>) {
        self.probes.on_report(from, round);
        // Links between members only: a report naming other ids (made up, or gone) grows
        // nothing here.
        for r in results {
            let member = self.state.members.contains_key(&r.peer);
            if member && r.peer != from && r.bytes_per_sec.is_finite() && r.bytes_per_sec > 0.0 {
                self.state.bandwidth.set(from, r.peer, r.bytes_per_sec);
                self.event(MeshEvent::BandwidthMeasured {
                    from,
                    to: r.peer,
                    bytes_per_sec: r.bytes_per_sec,
                });
            }
        }
    }

    /// Whether a message was a quiet heartbeat (`before`: the live member's record before it):
    /// one that changed nothing of its record but when it was last seen, while no deadline is
    /// due. `decide` depends on a member's last sighting only through its silence (it was not
    /// silent and is not), and on time only through the deadlines in `timers` (none has passed
    /// since the last decision), so it would wait as it did: the decision is skipped. The
    /// heartbeat-expiry deadline stays where it was, earlier than the true one, and recomputes
    /// when it comes. At a thousand members this spares an O(members) decision for each of the
    /// hundreds of heartbeats a second.
    fn quiet(&self, now: Time, from: NodeId, before: Option<MemberInfo>) -> bool {
        before.is_some_and(|mut b| {
            b.confirmed = true;
            let after = self.state.members.get(&from);
            after.is_some_and(|a| {
                b.last_seen = a.last_seen;
                *a == b
            })
        }) && self.timers.next_timeout().is_none_or(|t| t > now)
    }

    /// Compares a member's reported state with ours and repairs what a lost message broke:
    /// records an arrival, a `Done` or a `Synced` we missed; sends again the `View`, `Sync`,
    /// `Release`, `Commit` or `Skip` it missed. Every repair is idempotent on both sides.
    fn repair(
        &mut self,
        now: Time,
        from: NodeId,
        epoch: Option<Epoch>,
        phase: MemberPhase,
        synced: bool,
    ) {
        let cur = self.state.epoch;
        let k = self.state.outer_step;
        let behind = epoch.is_none_or(|e| e < cur);
        // The member list goes into the rare repairs only (a heartbeat's usual answer is none):
        // collected there, not for every heartbeat of a thousand members.
        let Some(info) = self.state.members.get_mut(&from) else { return };
        if synced {
            info.synced = true;
        }
        match self.state.phase.clone() {
            Phase::Forming => {}
            Phase::Compute { .. } => match phase {
                MemberPhase::Reducing { outer_step, .. }
                | MemberPhase::AtBarrier { outer_step }
                | MemberPhase::Syncing { outer_step }
                    if outer_step + 1 == k =>
                {
                    // The outcome of the last step was lost.
                    match self.state.last_outcome {
                        Some(Outcome::Committed { outer_step: s, epoch: e }) if s == outer_step => {
                            self.send(from, MeshMsg::Commit { epoch: e, outer_step });
                        }
                        Some(Outcome::Skipped { outer_step: s, attempts }) if s == outer_step => {
                            let members = self.state.member_ids();
                            let msg = MeshMsg::Skip { epoch: cur, outer_step, members, attempts };
                            self.send(from, msg);
                        }
                        _ => {}
                    }
                }
                MemberPhase::AtBarrier { outer_step }
                    if outer_step == k && info.arrived != Some(k) =>
                {
                    // Its `Barrier` was lost.
                    info.arrived = Some(k);
                    if let Phase::Compute { barrier_opened, .. } = &mut self.state.phase {
                        barrier_opened.get_or_insert(now);
                    }
                }
                // It missed its admission. It takes a `View` for the admission of a founding
                // member, which starts from the initial state: only right for one. A joiner
                // admitted at a boundary whose `Release` was lost (and whose step is over) gets
                // nothing: it misses the barrier and is evicted at its deadline.
                MemberPhase::Joining if info.synced => {
                    let incarnation = info.incarnation;
                    let members = self.state.member_ids();
                    let view = MeshMsg::View { epoch: cur, outer_step: k, members, incarnation };
                    self.send(from, view);
                }
                MemberPhase::Joining => {}
                _ if behind => {
                    let incarnation = info.incarnation;
                    let members = self.state.member_ids();
                    let view = MeshMsg::View { epoch: cur, outer_step: k, members, incarnation };
                    self.send(from, view)
                }
                _ => {}
            },
            Phase::Sync { .. } => {
                if behind || phase == MemberPhase::Joining {
                    let transfers = self.state.transfers.clone();
                    let members = self.state.member_ids();
                    let incarnations = self.incarnations(&members);
                    let (epoch, outer_step) = (cur, k);
                    let vouched = super::guard::vouched(&self.state);
                    let msg = MeshMsg::Sync {
                        epoch,
                        outer_step,
                        members,
                        incarnations,
                        transfers,
                        vouched,
                    };
                    self.send(from, msg);
                }
            }
            Phase::Reduce { attempt, .. } => match phase {
                MemberPhase::Reducing { outer_step, attempt: a, done }
                    if outer_step == k && a == attempt && epoch == Some(cur) =>
                {
                    // Running; or finished and its `Done` was lost.
                    info.done |= done;
                }
                // It missed the release (or a retry's); or, as a joiner of this boundary in
                // non-blocking mode, its admission.
                MemberPhase::AtBarrier { outer_step: s }
                | MemberPhase::Syncing { outer_step: s }
                | MemberPhase::Reducing { outer_step: s, .. }
                    if s == k =>
                {
                    self.resend_release(from, attempt);
                }
                MemberPhase::Joining => self.resend_release(from, attempt),
                _ => {}
            },
        }
    }

    fn resend_release(&mut self, to: NodeId, attempt: u32) {
        let msg = MeshMsg::Release {
            epoch: self.state.epoch,
            outer_step: self.state.outer_step,
            attempt,
            ring: self.state.ring.clone(),
            weights: self.state.weights.clone(),
            incarnations: self.incarnations(&self.state.ring),
            transfers: self.state.transfers.clone(),
        };
        self.send(to, msg);
    }

    /// The incarnations of `ids` as this coordinator knows them (0 for one it does not know).
    fn incarnations(&self, ids: &[NodeId]) -> Vec<u64> {
        ids.iter().map(|id| self.state.members.get(id).map_or(0, |m| m.incarnation)).collect()
    }

    fn is_current_round(&self, epoch: Epoch, outer_step: u64, attempt: u32) -> bool {
        matches!(self.state.phase, Phase::Reduce { attempt: a, .. } if a == attempt)
            && epoch == self.state.epoch
            && outer_step == self.state.outer_step
    }

    /// A `Join`. From a current member, see the rule in the [module documentation](super).
    fn on_join(
        &mut self,
        now: Time,
        from: NodeId,
        incarnation: u64,
        held: Option<Held>,
        finished: u64,
    ) {
        if let Some(m) = self.state.members.get_mut(&from) {
            if m.incarnation == incarnation && !m.confirmed {
                // A repeat that crossed its admission (or a process that restarted before it
                // learnt of it, and so has done nothing as a member): admit it again.
                self.repair(now, from, None, MemberPhase::Joining, false);
                return;
            }
            // The process this membership describes is gone, with its state and its
            // pseudo-gradient: evict it (`decide` does, as restarted). A new incarnation is
            // queued below; the same one is refused below (it was admitted once).
            m.restarted = true;
        }
        if self.state.admitted.contains(&(from, incarnation)) {
            // That incarnation was admitted once: it must come back as a new incarnation.
            let reason = EvictReason::IncarnationReused;
            self.send(from, MeshMsg::Evicted { reason });
            self.event(MeshEvent::JoinRefused { node: from, incarnation, reason });
            return;
        }
        if let Some(j) = self.state.queue.iter_mut().find(|j| j.id == from) {
            if j.incarnation != incarnation {
                j.incarnation = incarnation;
                j.queued_at = now;
            }
            (j.held, j.finished) = (held, finished);
            let position = self.state.queue.iter().position(|j| j.id == from).unwrap_or(0);
            self.send(from, MeshMsg::Queued { position: position as u32 });
            return;
        }
        if self.state.queue.len() >= self.cfg.max_queue {
            if !self.queue_full {
                self.queue_full = true;
                self.event(MeshEvent::QueueFull { max: self.cfg.max_queue });
            }
            self.send(from, MeshMsg::QueueFull);
            return;
        }
        self.queue_full = false;
        let position = self.state.queue.len() as u32;
        self.state.queue.push(Joiner {
            id: from,
            incarnation,
            queued_at: now,
            last_seen: now,
            held,
            finished,
        });
        self.send(from, MeshMsg::Queued { position });
        self.event(MeshEvent::JoinQueued { node: from, incarnation, position });
    }

    fn stale(&mut self, from: NodeId, msg: MeshMsg) {
        let current = self.state.epoch;
        self.event(MeshEvent::Stale { from, msg, current });
    }

    fn send(&mut self, to: NodeId, msg: MeshMsg) {
        self.actions.push_back(CoordinatorAction::Send { to, msg });
    }

    fn event(&mut self, e: MeshEvent) {
        self.actions.push_back(CoordinatorAction::Event(e));
    }

    fn broadcast(&mut self, msg: &MeshMsg) {
        for id in self.state.member_ids() {
            self.send(id, msg.clone());
        }
    }

    /// Decide and apply until the decision is to wait.
    fn step(&mut self, now: Time) {
        let mut applied = 0;
        loop {
            let d = decide(now, &self.state, &self.cfg);
            match d {
                Decision::Wait(reason) => {
                    if self.last_reason.as_ref() != Some(&reason) {
                        self.last_reason = Some(reason.clone());
                        self.event(MeshEvent::Waiting(reason));
                    }
                    break;
                }
                _ if applied >= MAX_DECISIONS_PER_CALL => {
                    self.event(MeshEvent::DecisionLimit);
                    break;
                }
                Decision::ForgetJoiners(ids) => {
                    self.state.queue.retain(|j| !ids.contains(&j.id));
                    for node in ids {
                        self.event(MeshEvent::JoinerForgotten { node });
                    }
                }
                Decision::NewEpoch(plan) => self.apply_epoch(now, plan),
                Decision::NoSyncedMember { evicted, unsynced } => {
                    self.stop_without_state(evicted, unsynced);
                    break;
                }
                Decision::Release(round) => self.start_round(now, round),
                Decision::RefuseUpdate(r) => {
                    if self.refuse_update(now, r) {
                        break;
                    }
                }
                Decision::Commit { outer_step } => {
                    let epoch = self.state.epoch;
                    if let Some(norm) = super::guard::reported_norm(&self.state) {
                        let kept = &mut self.state.update_norms;
                        kept.push_back(norm);
                        while kept.len() > super::UPDATE_HISTORY {
                            kept.pop_front();
                        }
                    }
                    self.state.refused_updates = 0;
                    self.state.last_outcome = Some(Outcome::Committed { outer_step, epoch });
                    self.broadcast(&MeshMsg::Commit { epoch, outer_step });
                    self.event(MeshEvent::Committed { epoch, outer_step });
                    for m in self.state.members.values_mut() {
                        m.blamed = 0;
                        m.accusers.clear();
                    }
                    self.state.refused.clear();
                    self.next_step(now);
                }
            }
            applied += 1;
        }
        if self.stopped {
            self.timers = TimerTable::new();
            return;
        }
        self.run_probes(now);
        self.timers = timers(&self.state, &self.cfg);
        // Probing pauses outside the compute phase; an expired round is ended when it resumes.
        if matches!(self.state.phase, Phase::Compute { .. }) {
            self.timers.set_opt(CoordTimer::ProbeRound, self.probes.deadline());
        }
        // `decide` just chose to wait at `now`, so a deadline already passed cannot change its
        // mind: drop it rather than be woken for it again and again.
        self.timers.clear_expired(now);
    }

    /// Removes evicted members, telling those that can still hear it.
    fn evict(&mut self, evicted: &[(NodeId, EvictReason)]) {
        for &(id, reason) in evicted {
            self.state.members.remove(&id);
            // The word of a member that is gone no longer counts against anyone.
            for m in self.state.members.values_mut() {
                m.accusers.remove(&id);
            }
            self.probes.forget(id);
            // A restarted node's id now belongs to its new incarnation, and a node that sent its
            // deathrattle is gone: only the others are told.
            if !matches!(reason, EvictReason::Restarted | EvictReason::Deathrattle(_)) {
                self.send(id, MeshMsg::Evicted { reason });
            }
        }
    }

    /// The guard refused the update of this step: every member skips it, or at the limit the
    /// run stops (returns true).
    fn refuse_update(&mut self, now: Time, r: super::guard::Refusal) -> bool {
        self.state.refused_updates = self.state.refused_updates.saturating_add(1);
        let stopping = self.state.refused_updates >= super::UPDATE_REFUSALS_LIMIT;
        let (epoch, outer_step) = (self.state.epoch, self.state.outer_step);
        self.event(MeshEvent::UpdateRefused {
            epoch,
            outer_step,
            norm: r.norm,
            median: r.median,
            outlier: r.outlier,
            stopping,
        });
        if stopping {
            let msg = MeshMsg::UpdatesRefused { outer_step };
            self.broadcast(&msg);
            self.stopped = true;
            self.farewell = Some(msg);
            return true;
        }
        let attempts = match self.state.phase {
            Phase::Reduce { attempt, .. } => attempt + 1,
            _ => 1,
        };
        let members = self.state.member_ids();
        // The `UpdateRefused` event above is the skip's record (no `StepSkipped` beside it).
        self.state.last_outcome = Some(Outcome::Skipped { outer_step, attempts });
        self.broadcast(&MeshMsg::Skip { epoch, outer_step, members, attempts });
        self.next_step(now);
        false
    }

    /// No member holding the state is left after `evicted`: stop the run. The members left and
    /// the queued joiners are told why; so is any node that writes to us later.
    fn stop_without_state(&mut self, evicted: Vec<(NodeId, EvictReason)>, unsynced: Vec<NodeId>) {
        self.evict(&evicted);
        let msg = MeshMsg::NoSyncedMember { outer_step: self.state.outer_step };
        let to: Vec<NodeId> = self
            .state
            .member_ids()
            .into_iter()
            .chain(self.state.queue.iter().map(|j| j.id))
            .collect();
        for id in to {
            self.send(id, msg.clone());
        }
        self.event(MeshEvent::NoSyncedMember {
            epoch: self.state.epoch,
            outer_step: self.state.outer_step,
            evicted,
            unsynced,
        });
        self.stopped = true;
        self.farewell = Some(msg);
    }

    fn apply_epoch(&mut self, now: Time, p: EpochPlan) {
        let forming = self.state.phase == Phase::Forming;
        // The names that count in the attempt given up ([`MeshState::named_in_attempt`]).
        if matches!(self.state.phase, Phase::Reduce { .. }) {
            for (by, named) in self.state.named_in_attempt() {
                if let Some(m) = self.state.members.get_mut(&named) {
                    m.accusers.insert(by);
                }
            }
        }
        // An attempt given up with nobody dead, failed by the word of one member alone.
        if matches!(self.state.phase, Phase::Reduce { .. }) && p.evicted.is_empty() {
            for id in super::blame::blamed_parties(&self.state) {
                if let Some(m) = self.state.members.get_mut(&id) {
                    m.blamed += 1;
                }
            }
        }
        self.state.epoch = p.epoch;
        self.evict(&p.evicted);
        for &(id, reason) in &p.evicted {
            if matches!(
                reason,
                EvictReason::Uncorroborated | EvictReason::Disputed | EvictReason::Accused
            ) {
                let (times, until) = self.state.barred.entry(id).or_insert((0, now));
                *times = times.saturating_add(1);
                *until = now + super::decide::barred_for(*times, &self.cfg);
            }
        }
        if forming {
            // The founders hold the state at this step (or the coordinator's count, resumed, is
            // ahead of theirs): the mesh goes on from there.
            let top = p.admitted.iter().filter_map(|id| self.state.joiner(*id)?.held);
            let top = top.map(|h| h.outer_step).max().unwrap_or(0);
            self.state.outer_step = self.state.outer_step.max(top);
            // Those awaited have joined or gone silent: nobody is awaited once the mesh runs.
            self.state.expected.clear();
        }
        let step = self.state.outer_step;
        for &id in &p.admitted {
            let Some(pos) = self.state.queue.iter().position(|j| j.id == id) else { continue };
            let j = self.state.queue.remove(pos);
            let (first_step, synced) = if forming { (step, true) } else { (step + 1, false) };
            let info = MemberInfo::new(j.incarnation, j.last_seen, p.epoch, first_step, synced);
            self.state.members.insert(id, info);
            self.state.admitted.insert((id, j.incarnation));
        }
        self.event(MeshEvent::EpochFormed {
            epoch: p.epoch,
            members: p.members.clone(),
            admitted: p.admitted.clone(),
            evicted: p.evicted.clone(),
        });
        let members = self.state.member_ids();
        match p.then {
            Then::Compute => {
                if forming {
                    self.state.phase = Phase::Compute { since: now, barrier_opened: None };
                }
                let epoch = p.epoch;
                for id in members.iter().copied() {
                    // A member still waiting for its admission takes a `View` for the admission
                    // of a founding member, which starts from the initial state. So a joiner
                    // admitted at a boundary that has not confirmed it (its `Release` may have
                    // been lost) gets none: it would train from fresh weights and report itself
                    // synced. Once it confirms, the repair of its heartbeats sends the epoch.
                    let Some(m) = self.state.members.get(&id) else { continue };
                    if m.synced || m.confirmed {
                        let (outer_step, members) = (step, members.clone());
                        let incarnation = m.incarnation;
                        self.send(id, MeshMsg::View { epoch, outer_step, members, incarnation });
                    }
                }
                if forming {
                    self.request_probes();
                }
            }
            Then::Sync { transfers } => {
                // A reassignment keeps the deadline that runs from the joiners' admission.
                let since = match self.state.phase {
                    Phase::Sync { since } => since,
                    _ => now,
                };
                self.state.phase = Phase::Sync { since };
                self.state.transfers = transfers.clone();
                let incarnations = self.incarnations(&members);
                let (epoch, outer_step) = (p.epoch, step);
                let vouched = super::guard::vouched(&self.state);
                let msg =
                    MeshMsg::Sync { epoch, outer_step, members, incarnations, transfers, vouched };
                self.broadcast(&msg);
            }
            Then::Reduce(round) => self.start_round(now, round),
            Then::Skip { attempts } => {
                let epoch = p.epoch;
                self.state.last_outcome = Some(Outcome::Skipped { outer_step: step, attempts });
                self.broadcast(&MeshMsg::Skip { epoch, outer_step: step, members, attempts });
                self.event(MeshEvent::StepSkipped { epoch, outer_step: step, attempts });
                self.next_step(now);
            }
        }
    }

    fn start_round(&mut self, now: Time, r: Round) {
        self.state.phase = Phase::Reduce { attempt: r.attempt, since: now, failed_at: None };
        for m in self.state.members.values_mut() {
            m.forget_attempt();
        }
        self.state.ring = r.ring.clone();
        self.state.weights = r.weights.clone();
        self.state.transfers = r.transfers.clone();
        let epoch = self.state.epoch;
        let msg = MeshMsg::Release {
            epoch,
            outer_step: r.outer_step,
            attempt: r.attempt,
            ring: r.ring.clone(),
            weights: r.weights.clone(),
            incarnations: self.incarnations(&r.ring),
            transfers: r.transfers,
        };
        self.broadcast(&msg);
        self.event(MeshEvent::Released {
            epoch,
            outer_step: r.outer_step,
            attempt: r.attempt,
            ring: r.ring,
            weights: r.weights,
        });
    }

    /// After a commit or a skip: the next outer step is computed; links not measured yet are.
    fn next_step(&mut self, now: Time) {
        self.state.outer_step += 1;
        self.state.phase = Phase::Compute { since: now, barrier_opened: None };
        self.state.transfers.clear();
        for m in self.state.members.values_mut() {
            m.forget_attempt();
        }
        self.request_probes();
    }

    /// Queues the links not measured yet among the members, when the ring order is measured (a
    /// ring in id order needs no figures, and probes would only load the links).
    fn request_probes(&mut self) {
        if self.cfg.ring_order == super::RingOrder::Ids {
            return;
        }
        let members = self.state.member_ids();
        self.probes.plan(&members, &self.state.bandwidth);
    }

    /// Starts the next probe round, only while the members compute (probes would slow an
    /// all-reduce or a state transfer).
    fn run_probes(&mut self, now: Time) {
        if !matches!(self.state.phase, Phase::Compute { .. }) {
            return;
        }
        for (prober, round, peer) in self.probes.next_round(now, self.cfg.probe_duration) {
            self.send(prober, MeshMsg::ProbeRequest { round, peers: vec![peer] });
        }
    }
}
