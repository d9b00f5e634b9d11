//! The timeline family: waits and holds over a threshold, one record each.

use crate::AggKey;

/// One wait or hold over the timeline threshold, as sent through the timeline ring buffer.
/// Stacks travel as ids into the stack map and are symbolized once, at the end.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimelineEvent {
    /// bpf_ktime_get_ns (CLOCK_MONOTONIC) when the wait or hold began.
    pub start_ns: u64,
    pub duration_ns: u64,
    /// The locking thread (always set, whatever the aggregation key holds).
    pub tid: u32,
    pub _pad: u32,
    /// The entry the wait or hold was aggregated under (its stacks, kind, mode, cause).
    pub key: AggKey,
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, integers only, explicit padding.
unsafe impl aya::Pod for TimelineEvent {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeline_event_has_no_implicit_padding() {
        // 2 x u64 + 5 x 32-bit + 2 x u8 + 2 pad bytes: the kernel and user space agree on it.
        assert_eq!(core::mem::size_of::<TimelineEvent>(), 48);
        assert_eq!(core::mem::align_of::<TimelineEvent>(), 8);
    }
}
