//! Draining the timeline ring buffer: waits and holds over the timeline threshold.

use anyhow::{anyhow, Result};
use aya::{
    maps::{MapData, RingBuf},
    Ebpf,
};
use tracer_common::{AggKey, TimelineEvent};

/// The ring buffer the mmap_lock programs stream long waits and holds to.
pub(super) const TIMELINE: &str = "TIMELINE";

/// Ring buffer size when a timeline is asked for: about 87,000 events of 48 bytes (with the
/// ring's header), several seconds of a badly convoying process between two drains.
pub const RING_BYTES: u32 = 4 << 20;
/// Size when no timeline is asked for (the smallest the kernel takes: one page).
pub const RING_BYTES_OFF: u32 = 4096;
/// Events kept in user space; beyond it they are counted as dropped rather than growing
/// memory without bound on a long trace (40 bytes each: 40 MB).
const MAX_KEPT: usize = 1_000_000;

/// The ring buffer and the events drained from it so far.
pub struct TimelineReader {
    ring: RingBuf<MapData>,
    events: Vec<TimelineEvent>,
    dropped: u64,
}

impl TimelineReader {
    pub fn open(ebpf: &mut Ebpf) -> Result<Self> {
        let map = ebpf
            .take_map(TIMELINE)
            .ok_or_else(|| anyhow!("eBPF object has no map TIMELINE"))?;
        Ok(Self {
            ring: RingBuf::try_from(map)?,
            events: Vec::new(),
            dropped: 0,
        })
    }

    /// Moves every event the kernel has written into memory.
    pub fn drain(&mut self) {
        while let Some(item) = self.ring.next() {
            match decode(&item) {
                Some(_) if self.events.len() >= MAX_KEPT => self.dropped += 1,
                Some(event) => self.events.push(event),
                None => log::warn!("timeline record of {} bytes ignored", item.len()),
            }
        }
    }

    /// The keys of the events drained so far.
    pub fn keys(&self) -> impl Iterator<Item = &AggKey> {
        self.events.iter().map(|e| &e.key)
    }

    /// The events, oldest first, and how many were dropped in user space.
    pub fn finish(mut self) -> (Vec<TimelineEvent>, u64) {
        self.drain();
        // Each CPU writes in order, but records from different CPUs interleave by commit time.
        self.events.sort_by_key(|e| e.start_ns);
        (self.events, self.dropped)
    }
}

/// Reads one record; the ring gives bytes with no alignment promise, so read them unaligned.
fn decode(bytes: &[u8]) -> Option<TimelineEvent> {
    if bytes.len() < std::mem::size_of::<TimelineEvent>() {
        return None;
    }
    // SAFETY: the length was checked; TimelineEvent is plain integers (any bit pattern is valid).
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<TimelineEvent>()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_records_and_refuses_short_ones() {
        let event = TimelineEvent {
            start_ns: 7,
            duration_ns: 2_000_000,
            tid: 43,
            _pad: 0,
            key: tracer_common::AggKey {
                pid: 42,
                kernel_stack: 3,
                user_stack: -1,
                kind: 1,
                mode: 1,
                ..Default::default()
            },
        };
        // SAFETY: viewing a plain-integer struct as bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&event as *const TimelineEvent).cast::<u8>(),
                std::mem::size_of::<TimelineEvent>(),
            )
        };
        let mut misaligned = vec![0u8; 1];
        misaligned.extend_from_slice(bytes);
        assert_eq!(decode(&misaligned[1..]), Some(event));
        assert_eq!(decode(&bytes[..bytes.len() - 1]), None);
    }
}
