//! Draining the user stack ring buffer: copies of user registers and stack windows, for
//! unwinding in user space (`--user-stack dwarf`).

use anyhow::{anyhow, Result};
use aya::{
    maps::{MapData, RingBuf},
    Ebpf,
};
use tracer_common::{UserStackEvent, USER_STACK_MAX};

use crate::model::unwound::StackCopy;

/// Ring buffer size when copies are asked for: about 120 records of the largest window, more
/// than a drain interval (100 ms) of long waits and holds; what does not fit is counted.
pub const RING_BYTES: u32 = 8 << 20;
/// Size when no copies are asked for (the smallest the kernel takes: one page).
pub const RING_BYTES_OFF: u32 = 4096;

pub struct UserStackReader {
    ring: RingBuf<MapData>,
}

impl UserStackReader {
    pub fn open(ebpf: &mut Ebpf) -> Result<Self> {
        let map = ebpf
            .take_map("USER_STACKS")
            .ok_or_else(|| anyhow!("eBPF object has no map USER_STACKS"))?;
        Ok(Self {
            ring: RingBuf::try_from(map)?,
        })
    }

    /// Every copy the kernel has written since the last call.
    pub fn drain(&mut self) -> Vec<StackCopy> {
        let mut copies = Vec::new();
        while let Some(item) = self.ring.next() {
            match decode(&item) {
                Some(copy) => copies.push(copy),
                None => log::warn!("user stack record of {} bytes ignored", item.len()),
            }
        }
        copies
    }
}

/// Reads one record: the event, then the `stack_len` bytes of stack that follow it.
fn decode(bytes: &[u8]) -> Option<StackCopy> {
    let header = std::mem::size_of::<UserStackEvent>();
    if bytes.len() < header {
        return None;
    }
    // SAFETY: the length was checked; UserStackEvent is plain integers (any bit pattern is
    // valid); the ring gives no alignment promise, hence the unaligned read.
    let event = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<UserStackEvent>()) };
    let len = (event.stack_len as usize).min(USER_STACK_MAX);
    let stack = bytes.get(header..header + len)?;
    Some(StackCopy {
        event,
        bytes: stack.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_copied_part_only_and_refuses_short_records() {
        let event = UserStackEvent {
            tid: 9,
            stack_len: 16,
            sp: 0x7ffc_0000_0010,
            stack_start: 0x7ffc_0000_0000,
            ..UserStackEvent::default()
        };
        // SAFETY: viewing a plain-integer struct as bytes.
        let head = unsafe {
            std::slice::from_raw_parts(
                (&event as *const UserStackEvent).cast::<u8>(),
                std::mem::size_of::<UserStackEvent>(),
            )
        };
        let mut record = vec![0u8; 1];
        record.extend_from_slice(head);
        record.extend((0..64u8).collect::<Vec<_>>());
        let copy = decode(&record[1..]).unwrap();
        assert_eq!(copy.event, event);
        assert_eq!(copy.bytes, (0..16u8).collect::<Vec<_>>());
        assert!(decode(&record[1..40]).is_none());
        let cut = record.len() - 60;
        assert!(
            decode(&record[1..cut]).is_none(),
            "stack_len beyond the record"
        );
    }
}
