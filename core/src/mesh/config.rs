//! Settings of the elastic mesh, with the defaults of the INTELLECT-1 report in one place.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How a joiner receives the training state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JoinMode {
    /// The others wait while the joiner receives the state (PRIME's production mode).
    #[default]
    Blocking,
    /// The others go on; the joiner contributes weight 0 until it has caught up.
    NonBlocking,
}

/// How the coordinator orders the ring of each all-reduce.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RingOrder {
    /// By the measured bandwidth: the ring whose slowest link is fastest
    /// ([`ring_order`](super::ring_order)).
    #[default]
    Measured,
    /// In node-id order, whatever was measured: for links that are all alike (one machine's
    /// loopback), where measurement noise would pick among equal rings, and so change the order
    /// of the floating-point sums from run to run.
    Ids,
}

/// Settings of the elastic mesh. `Default` gives the values of the INTELLECT-1 report.
///
/// | field | default | source |
/// |---|---|---|
/// | `heartbeat_interval` | 2 s | report |
/// | `heartbeat_timeout` | 6 s | report (PRIME's code: 10 s) |
/// | `barrier_timeout` | 600 s | PRIME (3600 s in production) |
/// | `compute_timeout` | 4 h | loco |
/// | `max_retries` | 3 | PRIME |
/// | `join_mode` | blocking | PRIME's production mode |
/// | `probe_duration` | 1 s | PRIME's iperf runs |
/// | `coordinator_timeout` | 18 s | 3 x heartbeat timeout |
/// | `rejoin_for` | 36 s | 2 x coordinator timeout |
/// | `min_members` | 1 | loco |
/// | `join_window` | 5 s | loco |
/// | `sync_timeout` | 3600 s | PRIME's transfers took 30-60 min for 10B |
/// | `allreduce_timeout` | 3600 s | global all-reduces took up to ~1400 s |
/// | `retry_backoff` | 8 s | heartbeat timeout + one interval |
/// | `progress_timeout` | 600 s | loco (a 200 MB frame on a 10 Mbit/s link takes 160 s) |
/// | `state_senders` | 1 | loco |
/// | `state_resend_after` | 60 s | loco |
/// | `ring_order` | measured | PRIME |
/// | `max_queue` | 16384 | loco |
/// | `max_admissions` | 1024 | loco |
/// | `max_update_ratio` | 0 (off) | loco |
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MeshConfig {
    /// How often a member sends a heartbeat to the coordinator (default 2 s).
    pub heartbeat_interval: Duration,
    /// A member with no heartbeat for this long, by the coordinator's own clock, is evicted
    /// (default 6 s, as in the report; PRIME's code defaulted to 10 s).
    pub heartbeat_timeout: Duration,
    /// Deadline of the barrier before each all-reduce; a member that misses it is evicted even if
    /// it still sends heartbeats (default 600 s). The deadline runs from the first arrival; while
    /// nobody has arrived, [`compute_timeout`](Self::compute_timeout) bounds the wait instead.
    pub barrier_timeout: Duration,
    /// How many times a failed all-reduce is retried on a new epoch (default 3). Past this bound
    /// every member skips the outer update of that step, and the skip is logged.
    pub max_retries: u32,
    /// How joiners receive the state (default blocking).
    pub join_mode: JoinMode,
    /// Duration of the bandwidth probe between two members when the ring order is measured
    /// (default 1 s, like PRIME's iperf runs). The probe grows its payload until one transfer
    /// takes about a quarter of this.
    pub probe_duration: Duration,
    /// Members notice a silent coordinator after this long without any message from it
    /// (default 3 x heartbeat_timeout); they write it and wait for it, still members, until
    /// [`rejoin_for`](Self::rejoin_for).
    pub coordinator_timeout: Duration,
    /// A member whose coordinator has been silent this long stops (it checkpoints) and its
    /// process ends; before that it waits, still a member, and a node that a coordinator back
    /// from a restart or a partition no longer knows joins it again (default 2 x
    /// coordinator_timeout): long enough for a paused or restarted coordinator, short enough that
    /// a dead coordinator ends the run's processes for a resume from checkpoints. A run that
    /// must outlast long partitions sets it longer.
    #[serde(default = "defaults::rejoin_for")]
    pub rejoin_for: Duration,
    /// The first epoch forms only once this many joiners are queued (default 1).
    #[serde(default = "defaults::min_members")]
    pub min_members: usize,
    /// The first epoch forms this long after the first join, so that nodes starting together
    /// land in it together (default 5 s; 0 forms it as soon as `min_members` are queued).
    #[serde(default = "defaults::join_window")]
    pub join_window: Duration,
    /// In blocking mode, a joiner that has not received the state this long after its admission
    /// is evicted and the all-reduce goes on without it (default 3600 s).
    #[serde(default = "defaults::sync_timeout")]
    pub sync_timeout: Duration,
    /// An all-reduce not finished by every member this long after its release, with nobody
    /// evicted meanwhile, is given up: every member skips that step (default 3600 s).
    #[serde(default = "defaults::allreduce_timeout")]
    pub allreduce_timeout: Duration,
    /// After a member reports a failed all-reduce, the coordinator waits this long for the cause
    /// (a dead peer) to be evicted by its heartbeat timeout before it retries with the same
    /// members (default 8 s). An eviction in the meantime retries at once.
    #[serde(default = "defaults::retry_backoff")]
    pub retry_backoff: Duration,
    /// A member of a running all-reduce that has heard no frame from the ring neighbour that
    /// sends to it for this long (since the release, or since that neighbour's last frame)
    /// reports the attempt failed and names that neighbour (default 600 s; it must exceed the
    /// time one frame takes on the slowest link). The coordinator retries with a ring that gives
    /// the named member another neighbour, and evicts a member named by two others: a member
    /// that beats and reaches barriers but sends no ring frames costs two of these, not an
    /// `allreduce_timeout` per step.
    #[serde(default = "defaults::progress_timeout")]
    pub progress_timeout: Duration,
    /// How many peers send the state to one joiner (default 1).
    #[serde(default = "defaults::state_senders")]
    pub state_senders: usize,
    /// A joiner that has received pieces of its state and then none for this long asks its
    /// senders for the pieces it lacks (lost with a dropped connection, e.g. after a corrupt
    /// frame), again after twice as long, up to 8 times; a copy that fails verification is
    /// asked for at once (default 60 s: well above the time one piece takes on a slow link).
    #[serde(default = "defaults::state_resend_after")]
    pub state_resend_after: Duration,
    /// Deadline of the barrier while no member has reached it: if nobody arrives this long after
    /// the outer step began (on the coordinator's clock: the commit or skip of the step before,
    /// or the formation of the mesh), every member is evicted as having missed the barrier, even
    /// if they all still beat (default 4 h). Once a member arrives, the deadline is
    /// [`barrier_timeout`](Self::barrier_timeout) after that arrival instead, so this bound only
    /// matters when every member hangs. It must exceed the longest compute of one outer step.
    #[serde(default = "defaults::compute_timeout")]
    pub compute_timeout: Duration,
    /// How the ring of each all-reduce is ordered (default by measured bandwidth).
    #[serde(default)]
    pub ring_order: RingOrder,
    /// At most this many joiners wait in the queue (default 16384); a join beyond it is told
    /// the queue is full and sent again with the joiner's heartbeats. Bounds the coordinator's
    /// memory and work per join whatever joins.
    #[serde(default = "defaults::max_queue")]
    pub max_queue: usize,
    /// At most this many joiners are admitted at one outer-step boundary, the longest queued
    /// first (default 1024); the rest wait for the next. The formation of the mesh admits every
    /// founder.
    #[serde(default = "defaults::max_admissions")]
    pub max_admissions: usize,
    /// The guard on the averaged update: a step whose average's L2 norm is not finite, or is
    /// above this many times the median of the last committed ones
    /// ([`UPDATE_HISTORY`](super::UPDATE_HISTORY), judged once
    /// [`UPDATE_MIN_HISTORY`](super::UPDATE_MIN_HISTORY) are kept), is skipped by every member;
    /// [`UPDATE_REFUSALS_LIMIT`](super::UPDATE_REFUSALS_LIMIT) in a row stop the run. Members
    /// report the norms with `Done` (two passes over the values, only while the guard is on).
    /// 0 turns it off (the default: a legitimate change of regime, a learning-rate warm-up or a
    /// changed membership, can move the norm by more than any fixed ratio; set it where the
    /// run's norms are known, 10 for example).
    #[serde(default)]
    pub max_update_ratio: f64,
}

mod defaults {
    use std::time::Duration;
    pub(super) fn min_members() -> usize {
        1
    }
    pub(super) fn join_window() -> Duration {
        Duration::from_secs(5)
    }
    pub(super) fn state_resend_after() -> Duration {
        Duration::from_secs(60)
    }

    pub(super) fn sync_timeout() -> Duration {
        Duration::from_secs(3600)
    }
    pub(super) fn allreduce_timeout() -> Duration {
        Duration::from_secs(3600)
    }
    pub(super) fn retry_backoff() -> Duration {
        Duration::from_secs(8)
    }
    pub(super) fn progress_timeout() -> Duration {
        Duration::from_secs(600)
    }
    pub(super) fn state_senders() -> usize {
        1
    }
    pub(super) fn rejoin_for() -> Duration {
        Duration::from_secs(36)
    }
    pub(super) fn max_queue() -> usize {
        16_384
    }
    pub(super) fn max_admissions() -> usize {
        1024
    }
    pub(super) fn compute_timeout() -> Duration {
        Duration::from_secs(4 * 3600)
    }
}

impl Default for MeshConfig {
    fn default() -> Self {
        MeshConfig {
            heartbeat_interval: Duration::from_secs(2),
            heartbeat_timeout: Duration::from_secs(6),
            barrier_timeout: Duration::from_secs(600),
            max_retries: 3,
            join_mode: JoinMode::Blocking,
            probe_duration: Duration::from_secs(1),
            coordinator_timeout: Duration::from_secs(18),
            rejoin_for: defaults::rejoin_for(),
            min_members: defaults::min_members(),
            join_window: defaults::join_window(),
            sync_timeout: defaults::sync_timeout(),
            state_resend_after: defaults::state_resend_after(),
            allreduce_timeout: defaults::allreduce_timeout(),
            retry_backoff: defaults::retry_backoff(),
            progress_timeout: defaults::progress_timeout(),
            state_senders: defaults::state_senders(),
            compute_timeout: defaults::compute_timeout(),
            ring_order: RingOrder::Measured,
            max_queue: defaults::max_queue(),
            max_admissions: defaults::max_admissions(),
            max_update_ratio: 0.0,
        }
    }
}

/// A [`MeshConfig`] whose fields contradict each other.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum MeshConfigError {
    /// A duration that must be positive is zero.
    #[error("mesh.{field} must be greater than zero")]
    Zero {
        /// The field.
        field: &'static str,
    },
    /// The heartbeat timeout does not leave room for one missed heartbeat.
    #[error(
        "mesh.heartbeat_timeout ({timeout:?}) must be greater than mesh.heartbeat_interval ({interval:?})"
    )]
    TimeoutBelowInterval {
        /// The heartbeat timeout.
        timeout: Duration,
        /// The heartbeat interval.
        interval: Duration,
    },
    /// The members would stop before the coordinator could answer two heartbeats.
    #[error(
        "mesh.coordinator_timeout ({coordinator:?}) must be greater than mesh.heartbeat_interval ({interval:?})"
    )]
    CoordinatorTimeoutTooShort {
        /// The coordinator timeout.
        coordinator: Duration,
        /// The heartbeat interval.
        interval: Duration,
    },
    /// The guard's ratio is not 0 (off) or a finite number above 1.
    #[error("mesh.max_update_ratio is {got}: expected 0 (off) or a finite number above 1")]
    UpdateRatio {
        /// The value given.
        got: f64,
    },
    /// More retries than the op id can number.
    #[error("mesh.max_retries is {got}, at most {max} is allowed")]
    TooManyRetries {
        /// The value given.
        got: u32,
        /// The largest allowed.
        max: u32,
    },
}

/// The largest `max_retries` [`MeshConfig::validate`] accepts (attempts are numbered in 16 bits
/// of the collective's op id).
pub const MAX_RETRIES_LIMIT: u32 = 1000;

impl MeshConfig {
    /// Checks that the settings make sense together; the error names the field.
    pub fn validate(&self) -> Result<(), MeshConfigError> {
        let positive = [
            ("heartbeat_interval", self.heartbeat_interval),
            ("heartbeat_timeout", self.heartbeat_timeout),
            ("barrier_timeout", self.barrier_timeout),
            ("probe_duration", self.probe_duration),
            ("coordinator_timeout", self.coordinator_timeout),
            ("rejoin_for", self.rejoin_for),
            ("sync_timeout", self.sync_timeout),
            ("state_resend_after", self.state_resend_after),
            ("allreduce_timeout", self.allreduce_timeout),
            ("progress_timeout", self.progress_timeout),
            ("compute_timeout", self.compute_timeout),
        ];
        for (field, d) in positive {
            if d.is_zero() {
                return Err(MeshConfigError::Zero { field });
            }
        }
        if self.min_members == 0 {
            return Err(MeshConfigError::Zero { field: "min_members" });
        }
        if self.state_senders == 0 {
            return Err(MeshConfigError::Zero { field: "state_senders" });
        }
        if self.max_queue == 0 {
            return Err(MeshConfigError::Zero { field: "max_queue" });
        }
        if self.max_admissions == 0 {
            return Err(MeshConfigError::Zero { field: "max_admissions" });
        }
        let r = self.max_update_ratio;
        if !(r == 0.0 || r.is_finite() && r > 1.0) {
            return Err(MeshConfigError::UpdateRatio { got: r });
        }
        if self.heartbeat_timeout <= self.heartbeat_interval {
            return Err(MeshConfigError::TimeoutBelowInterval {
                timeout: self.heartbeat_timeout,
                interval: self.heartbeat_interval,
            });
        }
        if self.coordinator_timeout <= self.heartbeat_interval {
            return Err(MeshConfigError::CoordinatorTimeoutTooShort {
                coordinator: self.coordinator_timeout,
                interval: self.heartbeat_interval,
            });
        }
        if self.max_retries > MAX_RETRIES_LIMIT {
            return Err(MeshConfigError::TooManyRetries {
                got: self.max_retries,
                max: MAX_RETRIES_LIMIT,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_report() {
        let c = MeshConfig::default();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.heartbeat_interval, Duration::from_secs(2));
        assert_eq!(c.heartbeat_timeout, Duration::from_secs(6));
        assert_eq!(c.max_retries, 3);
        assert_eq!(c.compute_timeout, Duration::from_secs(4 * 3600));
    }

    #[test]
    fn validate_names_the_field() {
        let c = MeshConfig { heartbeat_timeout: Duration::from_secs(1), ..MeshConfig::default() };
        let e = c.validate().unwrap_err();
        assert!(matches!(e, MeshConfigError::TimeoutBelowInterval { .. }));
        assert!(e.to_string().contains("mesh.heartbeat_timeout"), "{e}");
        let c = MeshConfig { barrier_timeout: Duration::ZERO, ..MeshConfig::default() };
        assert_eq!(c.validate(), Err(MeshConfigError::Zero { field: "barrier_timeout" }));
        let c = MeshConfig { compute_timeout: Duration::ZERO, ..MeshConfig::default() };
        assert_eq!(c.validate(), Err(MeshConfigError::Zero { field: "compute_timeout" }));
        for r in [-1.0, 0.5, 1.0, f64::NAN, f64::INFINITY] {
            let c = MeshConfig { max_update_ratio: r, ..MeshConfig::default() };
            let e = c.validate().unwrap_err();
            assert!(e.to_string().contains("mesh.max_update_ratio"), "{e}");
        }
        let c = MeshConfig { max_update_ratio: 10.0, ..MeshConfig::default() };
        assert_eq!(c.validate(), Ok(()));
        let c = MeshConfig { max_retries: 5000, ..MeshConfig::default() };
        assert_eq!(
            c.validate(),
            Err(MeshConfigError::TooManyRetries { got: 5000, max: MAX_RETRIES_LIMIT })
        );
    }

    #[test]
    fn old_serialised_configs_still_load() {
        // A config written before the later fields existed gets their defaults.
        let mut v = serde_json::to_value(MeshConfig::default()).unwrap();
        let o = v.as_object_mut().unwrap();
        for k in [
            "min_members",
            "join_window",
            "sync_timeout",
            "allreduce_timeout",
            "retry_backoff",
            "progress_timeout",
            "state_senders",
            "state_resend_after",
            "compute_timeout",
        ] {
            o.remove(k);
        }
        let c: MeshConfig = serde_json::from_value(v).unwrap();
        assert_eq!(c, MeshConfig::default());
    }
}
