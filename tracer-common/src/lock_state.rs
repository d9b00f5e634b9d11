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

use crate::{AggKey, Blockers, Counter, MODE_READ, MODE_WRITE, NO_STACK};

/// A trylock miss followed this soon by a start_locking in the same mode is one wait (the fault
/// path's trylock then killable lock). Longer gaps are separate attempts.
pub const MISS_CONTINUATION_NS: u64 = 1_000_000;

/// Why a holder was off CPU (`LockState::switched_out`).
pub const OFF_RUNNABLE: u8 = 1;
pub const OFF_SLEEPING: u8 = 2;
pub const OFF_UNINTERRUPTIBLE: u8 = 3;

/// Where one hold's time went while its thread was off CPU (from sched_switch). Running time is
/// the hold minus runnable and sleeping; uninterruptible (D) sleep is part of sleeping.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpu {
    pub runnable_ns: u64,
    pub sleeping_ns: u64,
    pub uninterruptible_ns: u64,
    pub longest_sleep_ns: u64,
    /// Kernel stack id where the longest sleep began, or NO_STACK.
    pub longest_sleep_stack: i32,
    pub _pad: u32,
}

impl OffCpu {
    pub const ZERO: OffCpu = OffCpu {
        runnable_ns: 0,
        sleeping_ns: 0,
        uninterruptible_ns: 0,
        longest_sleep_ns: 0,
        longest_sleep_stack: crate::NO_STACK,
        _pad: 0,
    };
}

/// A wait or hold whose aggregation the critical section left to the thread's next step
/// outside the lock (its next start_locking, the exit of its mm syscall, its exit, or user
/// space at the end of the trace): inside the critical section, where every waiter pays for
/// each nanosecond, the programs only time the event and name its key. `count` 0: none.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingAgg {
    pub key: AggKey,
    pub count: u64,
    pub ns: u64,
    /// A wait: the contended part, then 0, 0. A hold: runnable, sleeping, uninterruptible.
    pub parts: [u64; 3],
}

impl PendingAgg {
    pub const ZERO: PendingAgg = PendingAgg {
        key: AggKey {
            pid: 0,
            tid: 0,
            locker_pid: 0,
            kernel_stack: NO_STACK,
            user_stack: NO_STACK,
            kind: 0,
            mode: 0,
            syscall: 0,
            fault: 0,
        },
        count: 0,
        ns: 0,
        parts: [0; 3],
    };

    pub fn is_some(&self) -> bool {
        self.count != 0
    }
}

/// The pairing of one (thread, mm)'s lock events: when its wait and hold began, and the trylock
/// miss a lock may continue. All-zero means idle. It is the whole state of the lean path
/// (`--lean`), which keeps it in one cache line per thread; LockState builds the rest on it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockTiming {
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

/// What a state built on the timing keeps beside it, told of each transition where it happens
/// (rather than from flags afterwards: re-branching on them after the step took 6.1's verifier
/// past its million instructions on acquire_returned). The lean path keeps nothing: `()`.
pub trait TimingHooks {
    /// A new lock operation begins (not a start continuing a trylock miss).
    #[inline(always)]
    fn operation_begins(&mut self) {}
    /// A start: any sleep of an earlier wait is over.
    #[inline(always)]
    fn wait_begins(&mut self) {}
    /// A wait ends with an acquire in its own mode, taken or not; returns its sleeping part.
    #[inline(always)]
    fn wait_ends(&mut self, _now: u64) -> u64 {
        0
    }
    /// A hold begins: acquired, downgraded to read, or acquired after an unseen start.
    #[inline(always)]
    fn hold_begins(&mut self) {}
    /// The off-CPU parts of the hold that ends.
    #[inline(always)]
    fn hold_ends(&self) -> OffCpu {
        OffCpu::ZERO
    }
}

impl TimingHooks for () {}

impl LockTiming {
    pub const ZERO: LockTiming = LockTiming {
        wait_start_ns: 0,
        hold_start_ns: 0,
        miss_ns: 0,
        miss_wait_start_ns: 0,
        wait_mode: 0,
        hold_mode: 0,
        miss_mode: 0,
        _pad: [0; 5],
    };

    #[inline(always)]
    pub fn is_idle(&self) -> bool {
        self.wait_start_ns == 0 && self.hold_start_ns == 0 && self.miss_ns == 0
    }

    /// Back to idle, field by field (see LockState::reset_keeping_history).
    #[inline(always)]
    pub fn reset(&mut self) {
        self.wait_start_ns = 0;
        self.hold_start_ns = 0;
        self.clear_miss();
        self.wait_mode = 0;
        self.hold_mode = 0;
    }

    /// Advances the pairing by one event at time `now`: what to record.
    #[inline(always)]
    pub fn step<H: TimingHooks>(&mut self, event: LockEvent, now: u64, hooks: &mut H) -> Effects {
        match event {
            LockEvent::StartLocking { mode } => self.start_locking(mode, now, hooks),
            LockEvent::AcquireReturned {
                mode,
                success,
                fatal_signal,
            } => self.acquire_returned(mode, success, fatal_signal, now, hooks),
            LockEvent::Released { mode } => self.released(mode, now, hooks),
        }
    }

    /// Whether a start_locking in `mode` at `now` continues the last trylock miss (the fault
    /// path's trylock then killable lock: one wait), rather than beginning a new operation.
    #[inline(always)]
    pub fn continues_miss(&self, mode: u8, now: u64) -> bool {
        self.miss_ns != 0
            && self.miss_mode == mode
            && now.wrapping_sub(self.miss_ns) <= MISS_CONTINUATION_NS
    }

    /// When the wait or hold that `event` would end began, without stepping: the programs ask
    /// before the step whether the duration it will produce is long enough to want stacks.
    /// Agrees with `step` (a test holds it to it): a successful acquire ends the wait in its
    /// mode, or downgrades a write hold; a release ends the hold in its mode.
    #[inline(always)]
    pub fn ending_began(&self, event: LockEvent) -> Option<u64> {
        match event {
            LockEvent::StartLocking { .. } => None,
            LockEvent::AcquireReturned { mode, success, .. } => {
                if !success {
                    None
                } else if self.wait_start_ns != 0 {
                    (self.wait_mode == mode).then_some(self.wait_start_ns)
                } else if mode == MODE_READ && self.holds(MODE_WRITE) {
                    Some(self.hold_start_ns)
                } else {
                    None
                }
            }
            LockEvent::Released { mode } => self.holds(mode).then_some(self.hold_start_ns),
        }
    }

    #[inline(always)]
    fn start_locking<H: TimingHooks>(&mut self, mode: u8, now: u64, hooks: &mut H) -> Effects {
        let mut fx = Effects::default();
        if self.hold_start_ns != 0 {
            // Our thread "still holds" it: its release went unseen (e.g. unlocked by another task).
            fx.counter = Some(Counter::StartWhileHolding);
            self.hold_start_ns = 0;
        } else if self.wait_start_ns != 0 {
            fx.counter = Some(Counter::StartWhileWaiting);
        }
        self.wait_start_ns = if self.continues_miss(mode, now) {
            self.miss_wait_start_ns
        } else {
            hooks.operation_begins();
            now
        };
        hooks.wait_begins();
        self.wait_mode = mode;
        self.clear_miss();
        fx
    }

    #[inline(always)]
    fn acquire_returned<H: TimingHooks>(
        &mut self,
        mode: u8,
        success: bool,
        fatal: bool,
        now: u64,
        hooks: &mut H,
    ) -> Effects {
        let mut fx = Effects::default();
        if self.wait_start_ns == 0 {
            if success && mode == MODE_READ && self.holds(MODE_WRITE) {
                fx.hold = Some((MODE_WRITE, now.wrapping_sub(self.hold_start_ns)));
                fx.hold_offcpu = hooks.hold_ends();
                fx.downgraded = true;
                self.begin_hold(MODE_READ, now, hooks);
            } else {
                fx.counter = Some(Counter::UnpairedAcquire);
                // The acquisition time is still known, so the hold can be timed.
                if success {
                    self.begin_hold(mode, now, hooks);
                }
            }
            return fx;
        }
        let wait_start = self.wait_start_ns;
        self.wait_start_ns = 0;
        if self.wait_mode != mode {
            fx.counter = Some(Counter::ModeMismatch);
            if success {
                self.begin_hold(mode, now, hooks);
            }
            return fx;
        }
        let contended_ns = hooks.wait_ends(now);
        if success {
            fx.wait = Some((mode, now.wrapping_sub(wait_start)));
            fx.wait_contended_ns = contended_ns;
            fx.acquired = Some(mode);
            self.begin_hold(mode, now, hooks);
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
    fn released<H: TimingHooks>(&mut self, mode: u8, now: u64, hooks: &mut H) -> Effects {
        let mut fx = Effects::default();
        if self.hold_start_ns == 0 {
            fx.counter = Some(Counter::UnpairedRelease);
        } else if self.hold_mode != mode {
            fx.counter = Some(Counter::ModeMismatch);
        } else {
            fx.hold = Some((mode, now.wrapping_sub(self.hold_start_ns)));
            fx.hold_offcpu = hooks.hold_ends();
        }
        self.hold_start_ns = 0;
        fx
    }

    #[inline(always)]
    fn holds(&self, mode: u8) -> bool {
        self.hold_start_ns != 0 && self.hold_mode == mode
    }

    #[inline(always)]
    fn begin_hold<H: TimingHooks>(&mut self, mode: u8, now: u64, hooks: &mut H) {
        self.hold_start_ns = now;
        self.hold_mode = mode;
        hooks.hold_begins();
    }

    /// Volatile: LLVM merges the two adjacent stores into a call of the BPF object's memset,
    /// across which it kept a value in a register the call clobbers (the verifier refused the
    /// lean path for `R5 !read_ok`).
    #[inline(always)]
    fn clear_miss(&mut self) {
        unsafe {
            core::ptr::write_volatile(&mut self.miss_ns, 0);
            core::ptr::write_volatile(&mut self.miss_wait_start_ns, 0);
        }
        self.miss_mode = 0;
    }
}

/// What one (thread, mm) is doing with the lock. All-zero means idle. Timestamps are
/// bpf_ktime_get_ns values, never 0 on a running system, so 0 means "none".
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockState {
    /// The wait and hold in progress: the pairing of the three events. With the fields up to
    /// `start_user_stack`, what an operation that never slept touches: the first two cache
    /// lines, and the third's head (its state is looked up cold on every event).
    pub timing: LockTiming,
    /// Sleeping (rwsem slow path) part of the current wait, from lock:contention_begin/end.
    pub contended_ns: u64,
    pub contended_since_ns: u64,
    /// How the thread is off CPU in the switch-out in progress (see `off_since_ns`).
    pub off_kind: u8,
    /// 1 while the current lock operation serves a user page fault (see AggKey::fault).
    pub fault: u8,
    /// 1 once this lock operation's wait went to sleep in the rwsem slow path
    /// (lock:contention_begin): its holders were taken and its stacks walked then, once.
    pub slept: u8,
    /// 1 when this lock operation was picked by the sampler for stacks and a user stack copy:
    /// its events keep their stacks whatever their length.
    pub user_copy_sampled: u8,
    /// 1 + index into MM_SYSCALLS of the mm syscall this lock operation serves, or 0 (managed
    /// by the eBPF programs, from start_locking: no lookup inside the critical section).
    pub cause: u8,
    /// 1 while `pending_wait` or `pending_holds` holds something: their lines are read only
    /// then.
    pub pending: u8,
    /// 1 once the sleep in progress (`off_since_ns`) has been charged to a waker
    /// (sched_waking): a second wakeup of the same sleep charges nothing.
    pub off_woken: u8,
    pub _pad: [u8; 1],
    /// Off-CPU parts of the current hold, and the switch-out in progress.
    pub offcpu: OffCpu,
    pub off_since_ns: u64,
    pub off_stack: i32,
    pub _pad2: u32,
    /// Kernel and user stacks walked outside the critical section (managed by the eBPF
    /// programs): at start_locking for a sampled operation, at contention_begin for a wait
    /// that sleeps. The wait and the hold that follows reuse them.
    pub start_kernel_stack: i32,
    pub start_user_stack: i32,
    /// Id (bpf_ktime_get_ns at copy time) of the user stack copy this lock operation sent to
    /// user space, or 0 (managed by the eBPF programs).
    pub user_copy_id: u64,
    /// Lock wait and hold spent inside the thread's current mm syscall, handed to it when the
    /// syscall exits (outside the lock), and kept across the reset to idle until then.
    pub syscall_wait_ns: u64,
    pub syscall_hold_ns: u64,
    /// Who held the lock when the current wait went to sleep (managed by the eBPF programs).
    pub blockers: Blockers,
    /// The last wait and holds, not yet aggregated (see PendingAgg); the wait's blockers stay
    /// in `blockers` until it is charged to them. Two holds: a downgrade ends the write hold
    /// and the read hold that follows ends before the thread leaves the lock.
    pub pending_wait: PendingAgg,
    pub pending_holds: [PendingAgg; 2],
}

impl LockState {
    pub const ZERO: LockState = LockState {
        timing: LockTiming::ZERO,
        contended_ns: 0,
        contended_since_ns: 0,
        off_kind: 0,
        fault: 0,
        slept: 0,
        user_copy_sampled: 0,
        cause: 0,
        pending: 0,
        off_woken: 0,
        _pad: [0; 1],
        offcpu: OffCpu::ZERO,
        off_since_ns: 0,
        off_stack: crate::NO_STACK,
        _pad2: 0,
        start_kernel_stack: crate::NO_STACK,
        start_user_stack: crate::NO_STACK,
        user_copy_id: 0,
        syscall_wait_ns: 0,
        syscall_hold_ns: 0,
        blockers: Blockers::ZERO,
        pending_wait: PendingAgg::ZERO,
        pending_holds: [PendingAgg::ZERO; 2],
    };
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
    /// With `wait`: how much of it was spent asleep in the rwsem slow path.
    pub wait_contended_ns: u64,
    /// With `hold`: where it was spent off CPU.
    pub hold_offcpu: OffCpu,
}

impl Effects {
    /// The effects of a thread's first event since the tracer attached: an acquire or release
    /// without its start ends an operation that began before tracing did, an edge of the trace
    /// rather than an unpaired event.
    #[inline(always)]
    pub fn seen_first(mut self, event: LockEvent) -> Self {
        self.note_seen_first(event);
        self
    }

    /// `seen_first` in place.
    #[inline(always)]
    pub fn note_seen_first(&mut self, event: LockEvent) {
        let ends_unseen_start = matches!(
            self.counter,
            Some(Counter::UnpairedAcquire | Counter::UnpairedRelease)
        );
        if ends_unseen_start && !matches!(event, LockEvent::StartLocking { .. }) {
            self.counter = Some(Counter::BeganBeforeAttach);
        }
    }
}

impl LockState {
    pub fn is_idle(&self) -> bool {
        self.timing.is_idle()
    }

    /// Back to idle, keeping only what the last lock operation left to do (the syscall's lock time, pending aggregation and its blockers).
    /// Field by field: a whole-struct store compiles to a memset loop that the verifier walks
    /// byte by byte.
    #[inline(always)]
    pub fn reset_keeping_history(&mut self) {
        self.timing.reset();
        self.contended_since_ns = 0;
        self.offcpu = OffCpu::ZERO;
        self.off_since_ns = 0;
        self.off_stack = NO_STACK;
        self.off_kind = 0;
        let (count, mask) = (self.blockers.count, self.blockers.write_mask);
        self.begin_operation();
        if self.pending != 0 && self.pending_wait.is_some() {
            (self.blockers.count, self.blockers.write_mask) = (count, mask);
        }
    }

    /// Advances the state by one event at time `now` and says what to record: the timing's
    /// effects, with the parts of the wait spent asleep and of the hold spent off CPU.
    #[inline(always)]
    pub fn step(&mut self, event: LockEvent, now: u64) -> Effects {
        let state: *mut LockState = self;
        // SAFETY: `state` is valid for the call, and the hooks (`AroundTiming`) reach only the
        // fields beside `timing`, through the pointer: no reference to the whole state exists
        // while `timing` is borrowed. (Stepping a copy of the timing instead took 6.18's
        // verifier past its million instructions on start_locking.)
        unsafe { (*state).timing.step(event, now, &mut AroundTiming(state)) }
    }

    /// lock:contention_begin for this lock: the waiter goes to sleep in the slow path.
    #[inline(always)]
    pub fn contention_begin(&mut self, now: u64) {
        if self.timing.wait_start_ns != 0 {
            self.contended_since_ns = now;
        }
    }

    /// lock:contention_end (or the acquisition itself): the sleep is over.
    #[inline(always)]
    pub fn contention_end(&mut self, now: u64) {
        // SAFETY: a valid state, borrowed whole.
        unsafe { contention_end_at(self, now) }
    }

    /// sched_switch away from a thread: `kind` is OFF_RUNNABLE (preempted) or a sleep, `stack`
    /// the kernel stack it sleeps in.
    #[inline(always)]
    pub fn switched_out(&mut self, now: u64, kind: u8, stack: i32) {
        if self.timing.hold_start_ns != 0 {
            self.off_since_ns = now;
            self.off_kind = kind;
            self.off_stack = stack;
            self.off_woken = 0;
        }
    }

    /// sched_switch back to a thread: charges the time away to the hold.
    #[inline(always)]
    pub fn switched_in(&mut self, now: u64) {
        if self.timing.hold_start_ns == 0 || self.off_since_ns == 0 {
            return;
        }
        let away = now.wrapping_sub(self.off_since_ns);
        let off = &mut self.offcpu;
        if self.off_kind == OFF_RUNNABLE {
            off.runnable_ns += away;
        } else {
            off.sleeping_ns += away;
            if self.off_kind == OFF_UNINTERRUPTIBLE {
                off.uninterruptible_ns += away;
            }
            if away > off.longest_sleep_ns {
                off.longest_sleep_ns = away;
                off.longest_sleep_stack = self.off_stack;
            }
        }
        self.off_since_ns = 0;
    }

    /// sched_waking of the thread: how long the sleep in progress inside its hold has lasted,
    /// the first time that sleep is ended (None when it is not asleep in a hold, preempted, or
    /// that sleep was charged to a waker already).
    #[inline(always)]
    pub fn woken(&mut self, now: u64) -> Option<u64> {
        let asleep = self.timing.hold_start_ns != 0
            && self.off_since_ns != 0
            && self.off_kind != OFF_RUNNABLE
            && self.off_woken == 0;
        if !asleep {
            return None;
        }
        self.off_woken = 1;
        Some(now.wrapping_sub(self.off_since_ns))
    }

    /// A new lock operation: nothing of the last one carries over (a trylock miss that was never
    /// followed by a lock leaves its stacks, copy, cause and blockers behind), but the syscall
    /// time not yet handed over.
    #[inline(always)]
    fn begin_operation(&mut self) {
        // SAFETY: a valid state, borrowed whole.
        unsafe { begin_operation_at(self) }
    }
}

/// LockState::begin_operation through a pointer, for the timing's hooks.
///
/// # Safety
/// `s` is valid; only fields beside `timing` are touched.
#[inline(always)]
unsafe fn begin_operation_at(s: *mut LockState) {
    unsafe {
        (*s).contended_ns = 0;
        (*s).fault = 0;
        (*s).user_copy_sampled = 0;
        (*s).slept = 0;
        (*s).cause = 0;
        (*s).start_kernel_stack = crate::NO_STACK;
        (*s).start_user_stack = crate::NO_STACK;
        (*s).user_copy_id = 0;
        // Only the count and mask: refs past the count are never read.
        (*s).blockers.count = 0;
        (*s).blockers.write_mask = 0;
    }
}

/// LockState::contention_end through a pointer, for the timing's hooks.
///
/// # Safety
/// `s` is valid; only fields beside `timing` are touched.
#[inline(always)]
unsafe fn contention_end_at(s: *mut LockState, now: u64) {
    unsafe {
        if (*s).contended_since_ns != 0 {
            (*s).contended_ns += now.wrapping_sub((*s).contended_since_ns);
            (*s).contended_since_ns = 0;
        }
    }
}

/// The contention, off-CPU and per-operation parts of a LockState, which its timing's steps
/// update: a pointer to the state whose `timing` is being stepped (see LockState::step).
struct AroundTiming(*mut LockState);

impl TimingHooks for AroundTiming {
    #[inline(always)]
    fn operation_begins(&mut self) {
        // SAFETY (all five): see LockState::step; no reference to the whole state is made.
        unsafe { begin_operation_at(self.0) }
    }

    #[inline(always)]
    fn wait_begins(&mut self) {
        unsafe { (*self.0).contended_since_ns = 0 }
    }

    #[inline(always)]
    fn wait_ends(&mut self, now: u64) -> u64 {
        unsafe {
            contention_end_at(self.0, now);
            (*self.0).contended_ns
        }
    }

    #[inline(always)]
    fn hold_begins(&mut self) {
        unsafe {
            (*self.0).offcpu = OffCpu::ZERO;
            (*self.0).off_since_ns = 0;
        }
    }

    #[inline(always)]
    fn hold_ends(&self) -> OffCpu {
        unsafe { (*self.0).offcpu }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NO_STACK;
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

    /// `ending_began` says, before each step, exactly when the wait or hold that the step ends
    /// began, over every event from every state that sequences of up to four events reach.
    #[test]
    fn ending_began_agrees_with_step() {
        extern crate std;
        use std::{vec, vec::Vec};
        let events = [
            StartLocking { mode: R },
            StartLocking { mode: W },
            acquired(R),
            acquired(W),
            missed(R),
            missed(W),
            AcquireReturned {
                mode: W,
                success: false,
                fatal_signal: true,
            },
            Released { mode: R },
            Released { mode: W },
        ];
        let mut states = vec![LockTiming::ZERO];
        let mut checked = 0;
        for _ in 0..4 {
            let mut next = Vec::new();
            for state in &states {
                for event in &events {
                    let now = 1_000 * (1 + checked);
                    let mut stepped = *state;
                    let predicted = state.ending_began(*event);
                    let fx = stepped.step(*event, now, &mut ());
                    let ended = fx.wait.or(fx.hold).map(|(_, ns)| now - ns);
                    assert_eq!(predicted, ended, "{state:?} then {event:?}: {fx:?}");
                    checked += 1;
                    next.push(stepped);
                }
            }
            states = next;
        }
        assert!(checked > 6_000, "{checked}");
    }

    /// Which hooks one step called: (operation_begins, wait_ends, hold_begins).
    #[derive(Default)]
    struct Calls(u32, u32, u32);

    impl TimingHooks for Calls {
        fn operation_begins(&mut self) {
            self.0 += 1;
        }
        fn wait_ends(&mut self, _now: u64) -> u64 {
            self.1 += 1;
            0
        }
        fn hold_begins(&mut self) {
            self.2 += 1;
        }
    }

    /// What the bare timing (the lean path's whole state) tells the state built on it: a new
    /// operation only where a start does not continue a miss, the end of a wait only on an
    /// acquire of its own mode, the beginning of a hold on every acquisition.
    #[test]
    fn the_timing_says_where_operations_waits_and_holds_begin_and_end() {
        let mut t = LockTiming::ZERO;
        let mut step = |e, now| {
            let mut calls = Calls::default();
            t.step(e, now, &mut calls);
            (calls.0, calls.1, calls.2)
        };
        assert_eq!(step(StartLocking { mode: R }, 100), (1, 0, 0));
        assert_eq!(step(missed(R), 110), (0, 1, 0));
        assert_eq!(
            step(StartLocking { mode: R }, 120),
            (0, 0, 0),
            "continues the miss"
        );
        assert_eq!(step(acquired(R), 130), (0, 1, 1));
        assert_eq!(step(Released { mode: R }, 140), (0, 0, 0));
        assert_eq!(step(StartLocking { mode: W }, 200), (1, 0, 0));
        assert_eq!(
            step(acquired(R), 210),
            (0, 0, 1),
            "the wrong mode ends no wait"
        );
        assert_eq!(step(Released { mode: R }, 220), (0, 0, 0));
        step(StartLocking { mode: W }, 300);
        step(acquired(W), 310);
        assert_eq!(step(acquired(R), 320), (0, 0, 1), "a downgrade");
        step(Released { mode: R }, 330);
        assert!(t.is_idle());
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
        assert_eq!(s.timing.hold_start_ns, 0);
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
    fn an_attempt_after_an_abandoned_miss_inherits_nothing_of_it() {
        let mut s = LockState::ZERO;
        s.step(StartLocking { mode: R }, 1_000);
        // What the eBPF side recorded for the attempt that then missed its trylock.
        s.start_kernel_stack = 7;
        s.start_user_stack = 8;
        s.user_copy_id = 1_000;
        s.user_copy_sampled = 1;
        s.cause = 3;
        s.fault = 1;
        s.blockers.count = 1;
        s.slept = 1;
        s.syscall_hold_ns = 40;
        s.step(missed(R), 1_050);
        assert!(!s.is_idle(), "a miss waits to see whether a lock follows");
        s.step(StartLocking { mode: W }, 1_100);
        assert_eq!(
            (s.start_kernel_stack, s.start_user_stack, s.user_copy_id),
            (NO_STACK, NO_STACK, 0)
        );
        assert_eq!(
            (s.user_copy_sampled, s.slept, s.cause, s.fault),
            (0, 0, 0, 0)
        );
        assert_eq!(s.blockers, Blockers::ZERO);
        assert_eq!(s.syscall_hold_ns, 40);
    }

    #[test]
    fn a_threads_first_event_ending_an_unseen_operation_is_an_edge_not_a_loss() {
        for event in [acquired(W), Released { mode: R }] {
            let fx = LockState::default().step(event, 100);
            assert!(matches!(
                fx.counter,
                Some(Counter::UnpairedAcquire | Counter::UnpairedRelease)
            ));
            assert_eq!(
                fx.seen_first(event).counter,
                Some(Counter::BeganBeforeAttach)
            );
        }
        let fx = LockState::default().step(StartLocking { mode: R }, 100);
        assert_eq!(fx.seen_first(StartLocking { mode: R }).counter, None);
    }

    #[test]
    fn the_fault_paths_second_start_keeps_the_first_attempts_stacks() {
        let mut s = LockState::ZERO;
        s.step(StartLocking { mode: R }, 1_000);
        s.start_kernel_stack = 7;
        s.user_copy_id = 1_000;
        s.step(missed(R), 1_050);
        s.step(StartLocking { mode: R }, 1_060);
        assert_eq!((s.start_kernel_stack, s.user_copy_id), (7, 1_000));
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
    fn contention_inside_a_wait_is_its_sleeping_part() {
        let mut s = LockState::default();
        s.step(StartLocking { mode: W }, 100);
        s.contention_begin(200);
        s.contention_end(700);
        s.contention_begin(800);
        // Acquired without a contention_end: the acquisition closes the sleep.
        let fx = s.step(acquired(W), 1_000);
        assert_eq!(fx.wait, Some((W, 900)));
        assert_eq!(fx.wait_contended_ns, 700);
        // The next wait starts from zero.
        s.step(Released { mode: W }, 1_100);
        s.step(StartLocking { mode: W }, 2_000);
        let fx = s.step(acquired(W), 2_050);
        assert_eq!(fx.wait_contended_ns, 0);
    }

    #[test]
    fn contention_outside_a_wait_is_ignored() {
        let mut s = LockState::default();
        s.contention_begin(10);
        s.contention_end(20);
        assert!(s.is_idle());
        assert_eq!(s.contended_ns, 0);
    }

    #[test]
    fn off_cpu_time_of_a_hold_is_split_by_reason() {
        let mut s = LockState::default();
        s.step(StartLocking { mode: R }, 0);
        s.step(acquired(R), 10);
        s.switched_out(100, OFF_RUNNABLE, -1);
        s.switched_in(300);
        s.switched_out(400, OFF_UNINTERRUPTIBLE, 7);
        s.switched_in(1_400);
        s.switched_out(1_500, OFF_SLEEPING, 9);
        s.switched_in(1_600);
        let fx = s.step(Released { mode: R }, 2_010);
        assert_eq!(fx.hold, Some((R, 2_000)));
        let off = fx.hold_offcpu;
        assert_eq!(off.runnable_ns, 200);
        assert_eq!(off.sleeping_ns, 1_100);
        assert_eq!(off.uninterruptible_ns, 1_000);
        assert_eq!((off.longest_sleep_ns, off.longest_sleep_stack), (1_000, 7));
        // A new hold starts clean; switches while not holding change nothing.
        s.switched_out(3_000, OFF_SLEEPING, 3);
        s.switched_in(4_000);
        s.step(StartLocking { mode: R }, 5_000);
        s.step(acquired(R), 5_001);
        let fx = s.step(Released { mode: R }, 5_101);
        assert_eq!(fx.hold_offcpu, OffCpu::ZERO);
    }

    #[test]
    fn a_sleep_inside_a_hold_is_charged_to_its_first_waker_only() {
        let mut s = LockState::default();
        assert_eq!(s.woken(5), None, "not holding");
        s.step(StartLocking { mode: W }, 0);
        s.step(acquired(W), 10);
        s.switched_out(100, OFF_RUNNABLE, -1);
        assert_eq!(s.woken(150), None, "preempted, not asleep");
        s.switched_in(200);
        s.switched_out(300, OFF_UNINTERRUPTIBLE, 7);
        assert_eq!(s.woken(1_300), Some(1_000));
        assert_eq!(s.woken(1_350), None, "a second wakeup of the same sleep");
        s.switched_in(1_400);
        s.switched_out(1_500, OFF_SLEEPING, 9);
        assert_eq!(s.woken(1_520), Some(20), "the next sleep is charged afresh");
    }

    #[test]
    fn downgrade_hands_the_write_phase_its_off_cpu_time() {
        let mut s = LockState::default();
        s.step(StartLocking { mode: W }, 0);
        s.step(acquired(W), 10);
        s.switched_out(20, OFF_RUNNABLE, -1);
        s.switched_in(70);
        let fx = s.step(acquired(R), 100);
        assert!(fx.downgraded);
        assert_eq!(fx.hold_offcpu.runnable_ns, 50);
        let fx = s.step(Released { mode: R }, 200);
        assert_eq!(fx.hold_offcpu.runnable_ns, 0);
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
        assert_eq!(s.timing.hold_start_ns, 0);
        assert_eq!(s.timing.wait_start_ns, 900);
    }

    #[test]
    fn the_reset_to_idle_keeps_only_the_syscalls_time() {
        let mut st = LockState::ZERO;
        st.timing.hold_start_ns = 5;
        st.syscall_hold_ns = 9;
        st.user_copy_id = 7;
        st.user_copy_sampled = 1;
        st.slept = 1;
        st.reset_keeping_history();
        assert!(st.is_idle());
        assert_eq!((st.user_copy_id, st.user_copy_sampled, st.slept), (0, 0, 0));
        assert_eq!(st.syscall_hold_ns, 9, "handed to the syscall at its exit");
    }
}
