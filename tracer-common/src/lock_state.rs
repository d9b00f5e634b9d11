//! The per-(thread, mm) state machine over the three mmap_lock tracepoints.
//!
//! The traps it handles (include/linux/mmap_lock.h):
//! - a failed trylock emits start_locking then acquire_returned(success=false): a miss, not a wait;
//! - a killable lock interrupted by a fatal signal also reports success=false; it is told apart
//!   from a trylock miss by the SIGKILL pending on the task (the only way a killable lock fails);
//! - the page-fault path does a trylock, then a killable lock: the second start_locking continues
//!   the first wait, which keeps its first timestamp;
//! - mmap_write_downgrade emits acquire_returned(read, success) with no start_locking while the
//!   write lock is held: the write hold ends and a read hold begins;
//! - anything that does not pair up is counted and never turned into a duration.

use crate::{Counter, MODE_READ, MODE_WRITE};

/// A trylock miss followed this soon by a start_locking in the same mode is one wait (the fault
/// path's trylock then killable lock). Longer gaps are separate attempts.
pub const MISS_CONTINUATION_NS: u64 = 1_000_000;

/// What one (thread, mm) is doing with the lock. All-zero means idle. Timestamps are
/// bpf_ktime_get_ns values, never 0 on a running system, so 0 means "none".
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockState {
    pub wait_start_ns: u64,
    pub hold_start_ns: u64,
    /// When the last trylock missed, and when the attempt it belonged to started.
    pub miss_ns: u64,
    pub miss_wait_start_ns: u64,
    pub wait_mode: u8,
    pub hold_mode: u8,
    pub miss_mode: u8,
    pub _pad: [u8; 5],
}

/// One tracepoint hit, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockEvent {
    StartLocking {
        mode: u8,
    },
    AcquireReturned {
        mode: u8,
        success: bool,
        fatal_signal: bool,
    },
    Released {
        mode: u8,
    },
}

/// What a step produced: at most one finished wait, one finished hold and one counter bump, plus
/// what to add to the per-mode totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    pub wait: Option<(u8, u64)>,
    pub hold: Option<(u8, u64)>,
    pub acquired: Option<u8>,
    pub failed_trylock: Option<u8>,
    pub interrupted: Option<u8>,
    pub downgraded: bool,
    pub counter: Option<Counter>,
}

impl LockState {
    pub fn is_idle(&self) -> bool {
        self.wait_start_ns == 0 && self.hold_start_ns == 0 && self.miss_ns == 0
    }

    /// Advances the state by one event at time `now` and says what to record.
    #[inline(always)]
    pub fn step(&mut self, event: LockEvent, now: u64) -> Effects {
        match event {
            LockEvent::StartLocking { mode } => self.start_locking(mode, now),
            LockEvent::AcquireReturned {
                mode,
                success,
                fatal_signal,
            } => self.acquire_returned(mode, success, fatal_signal, now),
            LockEvent::Released { mode } => self.released(mode, now),
        }
    }

    #[inline(always)]
    fn start_locking(&mut self, mode: u8, now: u64) -> Effects {
        let mut fx = Effects::default();
        if self.hold_start_ns != 0 {
            // Our thread "still holds" it: its release went unseen (e.g. unlocked by another task).
            fx.counter = Some(Counter::StartWhileHolding);
            self.hold_start_ns = 0;
        } else if self.wait_start_ns != 0 {
            fx.counter = Some(Counter::StartWhileWaiting);
        }
        let continues_miss = self.miss_ns != 0
            && self.miss_mode == mode
            && now.wrapping_sub(self.miss_ns) <= MISS_CONTINUATION_NS;
        self.wait_start_ns = if continues_miss {
            self.miss_wait_start_ns
        } else {
            now
        };
        self.wait_mode = mode;
        self.clear_miss();
        fx
    }

    #[inline(always)]
    fn acquire_returned(&mut self, mode: u8, success: bool, fatal: bool, now: u64) -> Effects {
        let mut fx = Effects::default();
        if self.wait_start_ns == 0 {
            if success && mode == MODE_READ && self.holds(MODE_WRITE) {
                fx.hold = Some((MODE_WRITE, now.wrapping_sub(self.hold_start_ns)));
                fx.downgraded = true;
                self.begin_hold(MODE_READ, now);
            } else {
                fx.counter = Some(Counter::UnpairedAcquire);
                // The acquisition time is still known, so the hold can be timed.
                if success {
                    self.begin_hold(mode, now);
                }
            }
            return fx;
        }
        let wait_start = self.wait_start_ns;
        self.wait_start_ns = 0;
        if self.wait_mode != mode {
            fx.counter = Some(Counter::ModeMismatch);
            if success {
                self.begin_hold(mode, now);
            }
            return fx;
        }
        if success {
            fx.wait = Some((mode, now.wrapping_sub(wait_start)));
            fx.acquired = Some(mode);
            self.begin_hold(mode, now);
        } else if fatal {
            fx.interrupted = Some(mode);
            self.clear_miss();
        } else {
            fx.failed_trylock = Some(mode);
            self.miss_ns = now;
            self.miss_wait_start_ns = wait_start;
            self.miss_mode = mode;
        }
        fx
    }

    #[inline(always)]
    fn released(&mut self, mode: u8, now: u64) -> Effects {
        let mut fx = Effects::default();
        if self.hold_start_ns == 0 {
            fx.counter = Some(Counter::UnpairedRelease);
        } else if self.hold_mode != mode {
            fx.counter = Some(Counter::ModeMismatch);
        } else {
            fx.hold = Some((mode, now.wrapping_sub(self.hold_start_ns)));
        }
        self.hold_start_ns = 0;
        fx
    }

    fn holds(&self, mode: u8) -> bool {
        self.hold_start_ns != 0 && self.hold_mode == mode
    }

    #[inline(always)]
    fn begin_hold(&mut self, mode: u8, now: u64) {
        self.hold_start_ns = now;
        self.hold_mode = mode;
    }

    #[inline(always)]
    fn clear_miss(&mut self) {
        self.miss_ns = 0;
        self.miss_wait_start_ns = 0;
        self.miss_mode = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use LockEvent::*;

    const R: u8 = MODE_READ;
    const W: u8 = MODE_WRITE;

    fn acquired(mode: u8) -> LockEvent {
        AcquireReturned {
            mode,
            success: true,
            fatal_signal: false,
        }
    }

    fn missed(mode: u8) -> LockEvent {
        AcquireReturned {
            mode,
            success: false,
            fatal_signal: false,
        }
    }

    /// Runs (event, time) pairs and returns every step's effects.
    fn run(events: &[(LockEvent, u64)]) -> (LockState, [Effects; 8]) {
        let mut s = LockState::default();
        let mut out = [Effects::default(); 8];
        for (i, (e, t)) in events.iter().enumerate() {
            out[i] = s.step(*e, *t);
        }
        (s, out)
    }

    #[test]
    fn plain_write_lock_gives_wait_then_hold() {
        let (s, fx) = run(&[
            (StartLocking { mode: W }, 100),
            (acquired(W), 130),
            (Released { mode: W }, 1130),
        ]);
        assert_eq!(fx[1].wait, Some((W, 30)));
        assert_eq!(fx[1].acquired, Some(W));
        assert_eq!(fx[2].hold, Some((W, 1000)));
        assert!(fx.iter().all(|f| f.counter.is_none()));
        assert!(s.is_idle());
    }

    #[test]
    fn failed_trylock_is_a_miss_not_a_wait() {
        let (s, fx) = run(&[(StartLocking { mode: R }, 100), (missed(R), 110)]);
        assert_eq!(fx[1].failed_trylock, Some(R));
        assert_eq!(fx[1].wait, None);
        assert_eq!(fx[1].acquired, None);
        assert_eq!(s.hold_start_ns, 0);
    }

    #[test]
    fn fault_path_trylock_then_lock_keeps_first_timestamp() {
        let (_, fx) = run(&[
            (StartLocking { mode: R }, 1_000),
            (missed(R), 1_050),
            (StartLocking { mode: R }, 1_200),
            (acquired(R), 9_000),
            (Released { mode: R }, 10_000),
        ]);
        assert_eq!(fx[1].failed_trylock, Some(R));
        assert_eq!(fx[3].wait, Some((R, 8_000)), "wait counts from the trylock");
        assert_eq!(fx[4].hold, Some((R, 1_000)));
        assert!(fx.iter().all(|f| f.counter.is_none()));
    }

    #[test]
    fn late_or_other_mode_attempt_after_miss_starts_fresh() {
        let (_, fx) = run(&[
            (StartLocking { mode: R }, 1_000),
            (missed(R), 1_050),
            (StartLocking { mode: R }, 1_050 + MISS_CONTINUATION_NS + 1),
            (acquired(R), 1_050 + MISS_CONTINUATION_NS + 11),
        ]);
        assert_eq!(fx[3].wait, Some((R, 10)));
        let (_, fx) = run(&[
            (StartLocking { mode: R }, 1_000),
            (missed(R), 1_050),
            (StartLocking { mode: W }, 1_100),
            (acquired(W), 1_120),
        ]);
        assert_eq!(fx[3].wait, Some((W, 20)));
    }

    #[test]
    fn killable_lock_interrupted_by_fatal_signal_is_counted() {
        let (s, fx) = run(&[
            (StartLocking { mode: W }, 100),
            (
                AcquireReturned {
                    mode: W,
                    success: false,
                    fatal_signal: true,
                },
                5_000,
            ),
        ]);
        assert_eq!(fx[1].interrupted, Some(W));
        assert_eq!(fx[1].failed_trylock, None);
        assert_eq!(fx[1].wait, None);
        assert!(s.is_idle());
    }

    #[test]
    fn downgrade_ends_write_hold_and_starts_read_hold() {
        let (s, fx) = run(&[
            (StartLocking { mode: W }, 100),
            (acquired(W), 200),
            (acquired(R), 700),
            (Released { mode: R }, 1_700),
        ]);
        assert_eq!(fx[2].hold, Some((W, 500)));
        assert!(fx[2].downgraded);
        assert_eq!(fx[2].counter, None);
        assert_eq!(fx[2].acquired, None, "a downgrade is not a new acquisition");
        assert_eq!(fx[3].hold, Some((R, 1_000)));
        assert!(s.is_idle());
    }

    #[test]
    fn unpaired_events_are_counted_never_timed() {
        let (_, fx) = run(&[(Released { mode: W }, 100)]);
        assert_eq!(fx[0].counter, Some(Counter::UnpairedRelease));
        assert_eq!(fx[0].hold, None);

        let (s, fx) = run(&[(acquired(W), 100), (Released { mode: W }, 400)]);
        assert_eq!(fx[0].counter, Some(Counter::UnpairedAcquire));
        assert_eq!(fx[0].wait, None);
        assert_eq!(fx[1].hold, Some((W, 300)), "the hold itself was fully seen");
        assert!(s.is_idle());

        let (_, fx) = run(&[
            (StartLocking { mode: R }, 100),
            (acquired(R), 110),
            (Released { mode: W }, 400),
        ]);
        assert_eq!(fx[2].counter, Some(Counter::ModeMismatch));
        assert_eq!(fx[2].hold, None);
    }

    #[test]
    fn restart_while_waiting_or_holding_is_counted() {
        let (_, fx) = run(&[
            (StartLocking { mode: R }, 100),
            (StartLocking { mode: R }, 5_000),
            (acquired(R), 5_010),
        ]);
        assert_eq!(fx[1].counter, Some(Counter::StartWhileWaiting));
        assert_eq!(fx[2].wait, Some((R, 10)), "the lost wait is not stretched");

        let (s, fx) = run(&[
            (StartLocking { mode: R }, 100),
            (acquired(R), 110),
            (StartLocking { mode: W }, 900),
        ]);
        assert_eq!(fx[2].counter, Some(Counter::StartWhileHolding));
        assert_eq!(s.hold_start_ns, 0);
        assert_eq!(s.wait_start_ns, 900);
    }
}
