//! [`DaemonSession`]: the storage daemon's session with the monitor, as a sans-I/O state
//! machine. It decides when to boot (register), subscribe to new maps, heartbeat, fetch a
//! map it is told about, and when to give up on the link and boot again; the daemon
//! (`spindle_osd::Osd::mon_loop`) and the simulator (`spindle_sim::world`) execute its
//! actions over a real or simulated network and feed the answers back. It owns no socket,
//! timer or clock: time comes in as `now_ms` on every event.
//!
//! The rules:
//! - a session starts by booting; a boot is answered with the map that marks the daemon up,
//!   after which the daemon subscribes to every later epoch;
//! - a boot without an answer is sent again after [`SessionTiming::boot_timeout_ms`]; a
//!   refused or failed boot is retried at the next tick;
//! - an active session heartbeats at every tick ([`SessionTiming::heartbeat_ms`]); an
//!   answer naming a newer epoch than the daemon's makes it fetch that map (the push may
//!   have been lost);
//! - an active session boots again when the link fails, when a heartbeat is not answered
//!   within [`SessionTiming::answer_timeout_ms`] (the shell gives up on the call and tells
//!   [`DaemonSession::on_link_failed`]), when no answer came for
//!   [`SessionTiming::link_timeout_ms`], or when the daemon's own map says it is down (it
//!   was wrongly marked down, e.g. after a stall). The shell boots again through the next
//!   monitor (`MonAddrs::failed`).
//!
//! Invariant (a silently cut-off monitor, packets dropped and no reset): a daemon whose
//! monitor went silent boots through another monitor within
//! [`SessionTiming::silent_monitor_ms`] of its last answered heartbeat, so that, with
//! [`RECONNECT_MS`] to reach the next monitor, the leader hears from it again before it
//! marks it down: `silent_monitor_ms() + RECONNECT_MS <= down_after_ms`
//! ([`SessionTiming::fits_down_after`]; checked at compile time for the defaults in
//! `spindle-mon`, and when a monitor starts for its configured `down_after_ms`).

/// Timing of a daemon's monitor session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionTiming {
    /// Heartbeat interval (the tick).
    pub heartbeat_ms: u64,
    /// How long a heartbeat waits for its answer: past that the monitor is taken as gone
    /// (silently cut off) and the daemon boots again through the next monitor.
    pub answer_timeout_ms: u64,
    /// An active session with no answer from the monitor for this long boots again.
    pub link_timeout_ms: u64,
    /// A boot without an answer for this long is given up (the shell's call) and sent
    /// again (through the next monitor: one that passes it to a leader gone silent never
    /// answers).
    pub boot_timeout_ms: u64,
}

/// Time allowed, after a daemon gave up on a silent monitor, to connect to the next one
/// and have its boot reach the leader (a connection and two round trips on a healthy
/// network).
pub const RECONNECT_MS: u64 = 500;

/// The shortest heartbeat answer timeout (short heartbeat intervals in tests would make
/// a busy machine's scheduling delays look like a silent monitor).
pub const ANSWER_TIMEOUT_MIN_MS: u64 = 400;

/// The default heartbeat interval (`OsdConfig::heartbeat_ms`).
pub const HEARTBEAT_MS_DEFAULT: u64 = 400;

impl SessionTiming {
    /// The default timing for a heartbeat interval: a heartbeat (and the link) is given up
    /// after two intervals without an answer.
    pub const fn with_heartbeat(heartbeat_ms: u64) -> SessionTiming {
        let answer = 2 * heartbeat_ms;
        let answer_timeout_ms = if answer < ANSWER_TIMEOUT_MIN_MS {
            ANSWER_TIMEOUT_MIN_MS
        } else {
            answer
        };
        SessionTiming {
            heartbeat_ms,
            answer_timeout_ms,
            link_timeout_ms: answer_timeout_ms,
            // A new leader gives every daemon a full down interval from its election: a
            // boot sent to a monitor still passing requests to the old, silent leader is
            // given up and sent elsewhere within it.
            boot_timeout_ms: answer_timeout_ms + heartbeat_ms,
        }
    }

    /// The longest an active daemon whose monitor went silent keeps quiet, counted from its
    /// last answered heartbeat, before it boots again through another monitor: the next
    /// heartbeat goes out a tick later and is given up after the answer timeout; a shell
    /// that sends heartbeats without waiting for the answers (the simulator) notices at the
    /// first tick past the link timeout.
    pub const fn silent_monitor_ms(&self) -> u64 {
        let wait = if self.answer_timeout_ms > self.link_timeout_ms {
            self.answer_timeout_ms
        } else {
            self.link_timeout_ms
        };
        self.heartbeat_ms + wait
    }

    /// Whether a daemon with this timing leaves a silent monitor and reaches another one
    /// (within [`RECONNECT_MS`]) before a leader with `down_after_ms` marks it down.
    pub const fn fits_down_after(&self, down_after_ms: u64) -> bool {
        self.silent_monitor_ms() + RECONNECT_MS <= down_after_ms
    }
}

impl Default for SessionTiming {
    fn default() -> Self {
        SessionTiming::with_heartbeat(HEARTBEAT_MS_DEFAULT)
    }
}

/// What the session asks its shell to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionAction {
    /// (Re)connect if the link is gone and send a boot; answer with
    /// [`DaemonSession::on_boot_answered`] or [`DaemonSession::on_boot_failed`].
    Boot,
    /// Ask for every epoch after `have_epoch` to be pushed.
    Subscribe { have_epoch: u64 },
    /// Send a heartbeat (with the daemon's reports); answer with
    /// [`DaemonSession::on_heartbeat_answered`] or [`DaemonSession::on_link_failed`].
    Heartbeat,
    /// Ask for the map after `have_epoch` once (no subscription).
    FetchMap { have_epoch: u64 },
}

/// Where a session is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionState {
    /// A boot was sent at `since_ms` and not answered yet.
    Booting { since_ms: u64 },
    /// A boot failed or was refused: boot again at the next tick.
    BootFailed,
    /// Booted; the monitor last answered at `last_answer_ms`.
    Active { last_answer_ms: u64 },
}

/// One daemon's session with the monitor.
#[derive(Clone, Debug)]
pub struct DaemonSession {
    timing: SessionTiming,
    state: SessionState,
    /// Boots sent (the first one included).
    boots: u64,
}

impl DaemonSession {
    /// A new session (process start): it boots first.
    pub fn start(timing: SessionTiming, now_ms: u64) -> (DaemonSession, Vec<SessionAction>) {
        let session = DaemonSession {
            timing,
            state: SessionState::Booting { since_ms: now_ms },
            boots: 1,
        };
        (session, vec![SessionAction::Boot])
    }

    pub fn state(&self) -> SessionState {
        self.state
    }

    pub fn timing(&self) -> SessionTiming {
        self.timing
    }

    /// Boots sent since the session started.
    pub fn boots(&self) -> u64 {
        self.boots
    }

    fn boot(&mut self, now_ms: u64) -> Vec<SessionAction> {
        self.state = SessionState::Booting { since_ms: now_ms };
        self.boots += 1;
        vec![SessionAction::Boot]
    }

    /// The monitor answered the boot with a map the daemon installed (`have_epoch`: the
    /// daemon's epoch now). A late answer to an abandoned boot counts the same.
    pub fn on_boot_answered(&mut self, now_ms: u64, have_epoch: u64) -> Vec<SessionAction> {
        match self.state {
            SessionState::Booting { .. } | SessionState::BootFailed => {
                self.state = SessionState::Active {
                    last_answer_ms: now_ms,
                };
                vec![SessionAction::Subscribe { have_epoch }]
            }
            // A duplicated answer: already subscribed.
            SessionState::Active { .. } => Vec::new(),
        }
    }

    /// The boot could not be sent, was refused, or its map was rejected.
    pub fn on_boot_failed(&mut self, _now_ms: u64) -> Vec<SessionAction> {
        if let SessionState::Booting { .. } = self.state {
            self.state = SessionState::BootFailed;
        }
        Vec::new()
    }

    /// The monitor answered a heartbeat, naming its epoch.
    pub fn on_heartbeat_answered(
        &mut self,
        now_ms: u64,
        mon_epoch: u64,
        have_epoch: u64,
    ) -> Vec<SessionAction> {
        let SessionState::Active { last_answer_ms } = &mut self.state else {
            return Vec::new();
        };
        *last_answer_ms = (*last_answer_ms).max(now_ms);
        if mon_epoch > have_epoch {
            vec![SessionAction::FetchMap { have_epoch }]
        } else {
            Vec::new()
        }
    }

    /// The link to the monitor failed (a call failed or the connection closed).
    pub fn on_link_failed(&mut self, now_ms: u64) -> Vec<SessionAction> {
        match self.state {
            SessionState::Active { .. } => self.boot(now_ms),
            SessionState::Booting { .. } => {
                self.state = SessionState::BootFailed;
                Vec::new()
            }
            SessionState::BootFailed => Vec::new(),
        }
    }

    /// The heartbeat timer fired. `marked_down`: the daemon's current map says it is down.
    pub fn on_tick(&mut self, now_ms: u64, marked_down: bool) -> Vec<SessionAction> {
        match self.state {
            SessionState::Booting { since_ms } => {
                if now_ms.saturating_sub(since_ms) >= self.timing.boot_timeout_ms {
                    self.boot(now_ms)
                } else {
                    Vec::new()
                }
            }
            SessionState::BootFailed => self.boot(now_ms),
            SessionState::Active { last_answer_ms } => {
                if marked_down
                    || now_ms.saturating_sub(last_answer_ms) > self.timing.link_timeout_ms
                {
                    self.boot(now_ms)
                } else {
                    vec![SessionAction::Heartbeat]
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SessionAction::*;

    fn timing() -> SessionTiming {
        SessionTiming::default()
    }

    #[test]
    fn boot_then_subscribe_then_heartbeat_each_tick() {
        let (mut s, first) = DaemonSession::start(timing(), 0);
        assert_eq!(first, vec![Boot]);
        assert_eq!(s.on_tick(400, false), vec![], "boot pending: no heartbeat");
        assert_eq!(
            s.on_boot_answered(450, 7),
            vec![Subscribe { have_epoch: 7 }]
        );
        assert_eq!(s.on_boot_answered(460, 7), vec![], "a duplicate answer");
        assert_eq!(s.on_tick(800, false), vec![Heartbeat]);
        assert_eq!(s.on_heartbeat_answered(810, 7, 7), vec![]);
        assert_eq!(
            s.on_heartbeat_answered(1210, 9, 7),
            vec![FetchMap { have_epoch: 7 }],
            "the monitor is ahead: fetch"
        );
        assert_eq!(s.boots(), 1);
    }

    #[test]
    fn unanswered_boots_are_resent_after_the_boot_timeout() {
        let t = timing();
        let (mut s, _) = DaemonSession::start(t, 1_000);
        assert_eq!(s.on_tick(1_000 + t.boot_timeout_ms - 1, false), vec![]);
        assert_eq!(s.on_tick(1_000 + t.boot_timeout_ms, false), vec![Boot]);
        assert_eq!(s.boots(), 2);
        // A refused boot is retried at the next tick, not after the timeout.
        assert_eq!(s.on_boot_failed(12_000), vec![]);
        assert_eq!(s.state(), SessionState::BootFailed);
        assert_eq!(s.on_tick(12_400, false), vec![Boot]);
    }

    #[test]
    fn a_lost_link_a_silent_monitor_or_being_marked_down_boot_again() {
        let t = timing();
        let (mut s, _) = DaemonSession::start(t, 0);
        s.on_boot_answered(10, 1);
        assert_eq!(s.on_link_failed(500), vec![Boot], "call failed");
        s.on_boot_answered(600, 1);
        assert_eq!(s.on_tick(600 + t.link_timeout_ms, false), vec![Heartbeat]);
        assert_eq!(
            s.on_tick(601 + t.link_timeout_ms, false),
            vec![Boot],
            "no answer for longer than the link timeout"
        );
        s.on_boot_answered(7_000, 2);
        assert_eq!(s.on_tick(7_400, true), vec![Boot], "the map says I am down");
        assert_eq!(s.boots(), 4);
        // Failures while booting wait for the next tick (no boot storm).
        assert_eq!(s.on_link_failed(7_500), vec![]);
        assert_eq!(s.on_link_failed(7_600), vec![]);
        assert_eq!(s.on_tick(7_800, false), vec![Boot]);
    }

    #[test]
    fn a_silent_monitor_is_left_well_before_the_daemon_is_marked_down() {
        // The leader's default (`MonConfig::down_after_ms`): 2 s without a heartbeat.
        const DOWN_AFTER_MS: u64 = 2_000;
        let t = timing();
        assert_eq!(t.answer_timeout_ms, 2 * t.heartbeat_ms);
        assert!(t.fits_down_after(DOWN_AFTER_MS), "{t:?}");
        assert!(t.silent_monitor_ms() + RECONNECT_MS <= DOWN_AFTER_MS);
        // The old timing (a 5 s wait for answers) did not fit.
        let old = SessionTiming {
            answer_timeout_ms: 5_000,
            link_timeout_ms: 5_000,
            ..t
        };
        assert!(!old.fits_down_after(DOWN_AFTER_MS));
        // Short test intervals keep a floor on the answer timeout, and still fit the
        // shorter down intervals tests use.
        let fast = SessionTiming::with_heartbeat(100);
        assert_eq!(fast.answer_timeout_ms, ANSWER_TIMEOUT_MIN_MS);
        assert!(SessionTiming::with_heartbeat(200).fits_down_after(1_500));

        // A shell that does not wait for answers: the session itself boots again at the
        // first tick past the link timeout, within silent_monitor_ms of the last answer.
        let (mut s, _) = DaemonSession::start(t, 0);
        s.on_boot_answered(1_000, 3);
        let mut now = 1_000;
        let booted_at = loop {
            now += t.heartbeat_ms;
            if s.on_tick(now, false) == vec![Boot] {
                break now;
            }
        };
        assert!(booted_at - 1_000 <= t.silent_monitor_ms(), "{booted_at}");
        assert!(booted_at - 1_000 + RECONNECT_MS <= DOWN_AFTER_MS);
    }

    #[test]
    fn heartbeat_answers_only_count_while_active() {
        let (mut s, _) = DaemonSession::start(timing(), 0);
        assert_eq!(s.on_heartbeat_answered(100, 5, 0), vec![], "not booted yet");
        assert!(matches!(s.state(), SessionState::Booting { since_ms: 0 }));
        // Answers never move the clock of the last answer backwards.
        s.on_boot_answered(1_000, 5);
        s.on_heartbeat_answered(900, 5, 5);
        assert_eq!(
            s.state(),
            SessionState::Active {
                last_answer_ms: 1_000
            }
        );
    }
}
