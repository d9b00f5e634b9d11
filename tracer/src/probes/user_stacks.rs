//! Draining the user stack ring buffer: copies of user registers and stack windows, and the
//! waits and holds that use them, for unwinding in user space (`--user-stack dwarf`).

use anyhow::{anyhow, bail, Result};
use aya::{
    maps::{MapData, RingBuf},
    Ebpf,
};
use tracer_common::{
    Config, UserStackCopyHeader, UserStackEvent, USER_STACK_MAX, USER_STACK_MAX_PAGES,
    USER_STACK_PAGE, USER_STACK_RECORD_COPY, USER_STACK_RECORD_EVENT, USER_STACK_SMALL_PAGES,
};

use super::{Family, ProbeSettings, THREAD_SIZE};
use crate::model::unwound::{StackCopy, StackRecord};
use crate::system::btf::KernelOffsets;

/// Configures the saved registers (fault attribution reads them too) and the copies; the
/// ring and its reader are the loader's (`UserStackReader`).
pub(super) const FAMILY: Family = Family {
    configure: |setup, config| {
        configure_user_regs(setup.offsets, config);
        configure_copies(setup.settings, config)
    },
    maps: &[COPY_BUDGET, SAMPLE_TICK, USER_STACKS],
    ..Family::NOTHING
};

/// The copies' ring buffer, sized at load.
pub(super) const USER_STACKS: &str = "USER_STACKS";
const COPY_BUDGET: &str = "COPY_BUDGET";
const SAMPLE_TICK: &str = "SAMPLE_TICK";

/// Ring buffer size when copies are asked for: about 400 copies of the default window (120 of
/// the largest), more than a drain interval (100 ms) of long waits and holds; what does not fit
/// is counted.
pub const RING_BYTES: u32 = 8 << 20;
/// Size when no copies are asked for (the smallest the kernel takes: one page).
pub const RING_BYTES_OFF: u32 = 4096;

/// The most copies a CPU makes per budget window (100 ms): 250 a second. A copy costs about
/// 5 us of the CPU it is made on, which a lock-bound target pays: a quarter of a percent at
/// most. The paths a target locks from repeat, and each needs only a few copies to be unwound.
pub const MAX_COPIES_PER_WINDOW: u32 = 25;

/// Copies each CPU may make per budget window (the drain interval): together they fill at most
/// half the ring between two drains, leaving room for the event records and for a late drain,
/// and never more than MAX_COPIES_PER_WINDOW.
pub fn copy_budget(ring_bytes: u32, window_bytes: u32, cpus: usize) -> u32 {
    let pages = (window_bytes as usize).div_ceil(USER_STACK_PAGE) + 1;
    let record = size_of::<UserStackCopyHeader>()
        + USER_STACK_PAGE * pages.clamp(USER_STACK_SMALL_PAGES, USER_STACK_MAX_PAGES);
    let copies = ring_bytes as usize / 2 / record / cpus.max(1);
    (copies.max(1) as u32).min(MAX_COPIES_PER_WINDOW)
}

pub struct UserStackReader {
    ring: RingBuf<MapData>,
}

impl UserStackReader {
    pub fn open(ebpf: &mut Ebpf) -> Result<Self> {
        let map = ebpf
            .take_map(USER_STACKS)
            .ok_or_else(|| anyhow!("eBPF object has no map USER_STACKS"))?;
        Ok(Self {
            ring: RingBuf::try_from(map)?,
        })
    }

    /// Every record the kernel has written since the last call, in order.
    pub fn drain(&mut self) -> Vec<StackRecord> {
        let mut records = Vec::new();
        while let Some(item) = self.ring.next() {
            match decode(&item) {
                Some(record) => records.push(record),
                None => log::warn!("user stack record of {} bytes ignored", item.len()),
            }
        }
        records
    }
}

/// Reads one record, told apart by its first field: a copy (header, then the `stack_len` bytes
/// of stack that follow it) or an event.
fn decode(bytes: &[u8]) -> Option<StackRecord> {
    let kind = u32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?);
    match kind {
        USER_STACK_RECORD_COPY => {
            let header: UserStackCopyHeader = read_struct(bytes)?;
            let start = std::mem::size_of::<UserStackCopyHeader>();
            let len = (header.stack_len as usize).min(USER_STACK_MAX);
            let stack = bytes.get(start..start + len)?;
            Some(StackRecord::Copy(StackCopy {
                header,
                bytes: stack.to_vec(),
            }))
        }
        USER_STACK_RECORD_EVENT => read_struct::<UserStackEvent>(bytes).map(StackRecord::Event),
        _ => None,
    }
}

/// The plain-integer struct at the start of `bytes`, if they are long enough.
fn read_struct<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: the length was checked; T is Pod (plain integers, any bit pattern is valid); the
    // ring gives no alignment promise, hence the unaligned read.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// Fills where the saved user registers are (fault attribution and stack copies read them),
/// when the kernel's BTF has them.
fn configure_user_regs(offsets: &KernelOffsets, config: &mut Config) {
    let Some(regs) = offsets.user_regs else {
        return;
    };
    config.user_regs.task_stack_offset = regs.task_stack;
    config.user_regs.thread_size = THREAD_SIZE;
    config.user_regs.pt_regs_size = regs.pt_regs_size;
    config.user_regs.pt_regs_ip = regs.ip;
    config.user_regs.pt_regs_sp = regs.sp;
    config.user_regs.pt_regs_bp = regs.bp;
    config.user_regs.pt_regs_orig_ax = regs.orig_ax;
    config.user_regs.known = 1;
}

/// Fills the stack-copy part of `config` (left 0 when no copies are asked for). Fails when they
/// are asked for and the kernel's BTF lacks the saved-register offsets.
fn configure_copies(settings: &ProbeSettings, config: &mut Config) -> Result<()> {
    let Some(copies) = &settings.stack_copies else {
        return Ok(());
    };
    if config.user_regs.known == 0 {
        bail!("kernel BTF lacks task_struct.stack or struct pt_regs");
    }
    config.user_stack_copies.bytes = copies.bytes.clamp(1, tracer_common::USER_STACK_MAX as u32);
    config.user_stack_copies.threshold_ns = copies.threshold_ns;
    config.user_stack_copies.sample = copies.sample;
    let ring = settings.ring_bytes.unwrap_or(RING_BYTES);
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| anyhow!("counting CPUs: {e}"))?;
    config.user_stack_budget = copy_budget(ring, config.user_stack_copies.bytes, cpus);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of<T>(value: &T) -> Vec<u8> {
        // SAFETY: viewing a plain-integer struct as bytes.
        unsafe {
            std::slice::from_raw_parts((value as *const T).cast::<u8>(), std::mem::size_of::<T>())
        }
        .to_vec()
    }

    #[test]
    fn decodes_the_copied_part_only_and_refuses_short_records() {
        let header = UserStackCopyHeader {
            record: USER_STACK_RECORD_COPY,
            tid: 9,
            stack_len: 16,
            sp: 0x7ffc_0000_0010,
            stack_start: 0x7ffc_0000_0000,
            ..UserStackCopyHeader::default()
        };
        let mut record = bytes_of(&header);
        record.extend((0..64u8).collect::<Vec<_>>());
        let Some(StackRecord::Copy(copy)) = decode(&record) else {
            panic!("not decoded as a copy")
        };
        assert_eq!(copy.header, header);
        assert_eq!(copy.bytes, (0..16u8).collect::<Vec<_>>());
        assert!(decode(&record[..40]).is_none());
        let cut = record.len() - 60;
        assert!(
            decode(&record[..cut]).is_none(),
            "stack_len beyond the record"
        );
    }

    #[test]
    fn the_copy_budget_fills_half_the_ring_per_drain() {
        // Default 16 KiB window: 20 KiB records, 204 fit in half of 8 MiB, but a CPU copies
        // at most 25 per window.
        assert_eq!(copy_budget(RING_BYTES, 16384, 2), MAX_COPIES_PER_WINDOW);
        assert_eq!(copy_budget(RING_BYTES, 16384, 64), 3);
        // A 64 KiB window takes the large record.
        assert_eq!(copy_budget(RING_BYTES, 65536, 32), 1);
        // Never 0: a tiny ring still tries (and counts what does not fit).
        assert_eq!(copy_budget(4096, 16384, 64), 1);
    }

    #[test]
    fn decodes_events_and_refuses_unknown_kinds() {
        let event = UserStackEvent {
            record: USER_STACK_RECORD_EVENT,
            tid: 4,
            copy_id: 77,
            duration_ns: 5,
            last_use: 1,
            ..UserStackEvent::default()
        };
        let record = bytes_of(&event);
        assert_eq!(decode(&record), Some(StackRecord::Event(event)));
        assert!(decode(&record[..20]).is_none());
        let mut unknown = record.clone();
        unknown[0] = 9;
        assert!(decode(&unknown).is_none());
    }
}
