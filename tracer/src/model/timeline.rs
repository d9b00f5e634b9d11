//! The timeline: each wait and hold over the timeline threshold as a slice on its thread's
//! track, in time order. Totals hide convoys (readers queued behind a writer queued behind
//! readers); slices side by side show them.

use tracer_common::TimelineEvent;

use super::{
    cause::{cause_of, Cause},
    report::stack_frames,
    schema::{Kind, Mode},
    user_stack_owner, Frame, Symbols,
};

/// One wait or hold, placed on a track.
#[derive(Clone, Debug, PartialEq)]
pub struct Slice {
    /// The target whose mm was locked.
    pub pid: u32,
    pub tid: u32,
    /// Tgid of an outside locker (its thread is on that process's track), else None.
    pub locker_pid: Option<u32>,
    /// Nanoseconds since the trace started.
    pub start_ns: u64,
    pub duration_ns: u64,
    pub kind: Kind,
    pub mode: Mode,
    pub cause: Cause,
    /// User frames then kernel frames, innermost first (empty when no stack was taken).
    pub frames: Vec<Frame>,
}

impl Slice {
    /// The process whose track the slice is on: the locker's own.
    pub fn track_pid(&self) -> u32 {
        self.locker_pid.unwrap_or(self.pid)
    }
}

/// Slices from ring-buffer events, with times relative to `origin_ns` (the CLOCK_MONOTONIC
/// time tracing started, the clock of bpf_ktime_get_ns).
pub fn slices(events: &[TimelineEvent], symbols: &Symbols, origin_ns: u64) -> Vec<Slice> {
    events
        .iter()
        .map(|e| {
            let k = &e.key;
            let (kernel, frames) =
                stack_frames(symbols, k.kernel_stack, k.user_stack, user_stack_owner(k));
            Slice {
                pid: k.pid,
                tid: e.tid,
                locker_pid: (k.locker_pid != 0).then_some(k.locker_pid),
                start_ns: e.start_ns.saturating_sub(origin_ns),
                duration_ns: e.duration_ns,
                kind: Kind::from_raw(k.kind),
                mode: Mode::from_raw(k.mode),
                cause: cause_of(k.syscall, k.fault, kernel),
                frames,
            }
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::StackRef;
    use tracer_common::{AggKey, KIND_HOLD, KIND_WAIT, MODE_READ, MODE_WRITE, NO_STACK};

    fn kernel_frame(symbol: &str) -> Frame {
        Frame {
            kernel: true,
            module: "kernel".into(),
            symbol: Some(symbol.into()),
            ..Frame::default()
        }
    }

    /// A writer holding for 5 ms while a reader waits for it, then the reader holding.
    pub(crate) fn convoy() -> (Vec<TimelineEvent>, Symbols) {
        let event = |start_ns, duration_ns, tid, kernel_stack, kind, mode| TimelineEvent {
            start_ns,
            duration_ns,
            tid,
            key: AggKey {
                pid: 42,
                kernel_stack,
                user_stack: NO_STACK,
                kind,
                mode,
                ..AggKey::default()
            },
            ..TimelineEvent::default()
        };
        let events = vec![
            event(1_000_000_000, 5_000_000, 43, 1, KIND_HOLD, MODE_WRITE),
            event(1_001_000_000, 4_000_000, 44, 2, KIND_WAIT, MODE_READ),
            event(1_005_000_000, 2_000_000, 44, NO_STACK, KIND_HOLD, MODE_READ),
        ];
        let mut symbols = Symbols::new();
        symbols.insert(
            StackRef::Kernel(1),
            vec![kernel_frame("__traceiter_x"), kernel_frame("__vm_munmap")],
        );
        symbols.insert(
            StackRef::Kernel(2),
            vec![kernel_frame("lock_mm_and_find_vma")],
        );
        (events, symbols)
    }

    #[test]
    fn events_become_relative_classified_slices() {
        let (events, symbols) = convoy();
        let s = slices(&events, &symbols, 999_000_000);
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].start_ns, s[0].duration_ns), (1_000_000, 5_000_000));
        assert_eq!(
            (s[0].kind, s[0].mode, s[0].cause),
            (Kind::Hold, Mode::Write, Cause::Munmap)
        );
        assert_eq!(s[0].frames.len(), 1, "tracing machinery trimmed");
        assert_eq!(s[1].cause, Cause::PageFault);
        assert_eq!((s[2].cause, s[2].frames.len()), (Cause::NoStack, 0));
        assert_eq!(s[2].track_pid(), 42);
    }
}
