//! The timeline family: waits and holds over a load-time threshold, streamed to user space
//! through a ring buffer so that their order (convoys) survives, not just their totals.

use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::map, maps::RingBuf};
use tracer_common::{AggKey, Counter, TimelineEvent};

use crate::{
    filter::Locker,
    maps::{config, count},
};

/// Sized by user space at load time (one page when no timeline is asked for).
#[map]
pub static TIMELINE: RingBuf = RingBuf::with_byte_size(4096, 0);

/// Sends one finished wait or hold of `ns` to the timeline when it is long enough. `key` is
/// the aggregation key it was just added under (it carries the stack ids, taken once).
///
/// The end is read here, after the stack walks of `aggregate`: a few microseconds late, which
/// a threshold in milliseconds does not notice.
#[inline(always)]
pub fn emit(locker: &Locker, key: &AggKey, ns: u64) {
    let threshold = config().timeline_threshold_ns;
    if threshold == 0 || ns < threshold {
        return;
    }
    let end_ns = unsafe { bpf_ktime_get_ns() };
    let event = TimelineEvent {
        start_ns: end_ns.saturating_sub(ns),
        duration_ns: ns,
        tid: locker.tid,
        _pad: 0,
        key: *key,
    };
    if TIMELINE.output::<TimelineEvent>(&event, 0).is_err() {
        count(Counter::TimelineDropped);
    }
}
