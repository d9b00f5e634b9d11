//! The user stack copy family (`--user-stack dwarf`): where the saved user registers are, how
//! much stack is copied and how often, and the ring buffer's records.

use crate::AggKey;

/// Which waits and holds get their user stack copied, and how much of it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserStackCopyConfig {
    /// Waits and holds at least this long get their user stack copied for unwinding; shorter
    /// ones with a kernel stack are copied one in `sample`.
    pub threshold_ns: u64,
    /// Bytes of user stack to copy from the saved user sp (at most USER_STACK_MAX); 0: no
    /// copies (`--user-stack fp|none`).
    pub bytes: u32,
    /// 1 in this many waits and holds under `threshold_ns` (with a kernel stack) are copied
    /// too, so that common short paths are unwound; 0: none.
    pub sample: u32,
}

/// Where the task's saved user registers are (from BTF): `task_struct.stack`, the kernel stack
/// size, `sizeof(struct pt_regs)` and its ip, sp, bp and orig_ax members. The fault family
/// reads orig_ax from them too.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserRegs {
    pub task_stack_offset: u32,
    pub thread_size: u32,
    pub pt_regs_size: u32,
    pub pt_regs_ip: u32,
    pub pt_regs_sp: u32,
    pub pt_regs_bp: u32,
    pub pt_regs_orig_ax: u32,
    /// Non-zero when the offsets above are known: lock operations serving a user page fault
    /// are then told apart by the saved orig_ax (-1 on exception entry).
    pub known: u32,
}

/// Largest user stack window one record carries: whole pages, copied from the page holding the
/// saved user sp (so up to a page less than this lies above sp).
pub const USER_STACK_MAX: usize = 64 * 1024;
pub const USER_STACK_PAGE: usize = 4096;
/// Pages of the two record sizes: the small one fits the default 16 KiB window plus the partial
/// page below it, so that a ring record does not reserve 64 KiB for a 20 KiB copy.
pub const USER_STACK_SMALL_PAGES: usize = 5;
pub const USER_STACK_MAX_PAGES: usize = USER_STACK_MAX / USER_STACK_PAGE;

/// The window of `Config::user_stack_budget`: user space drains the ring this often.
pub const USER_STACK_BUDGET_WINDOW_NS: u64 = 100_000_000;

/// Per-CPU state of the copy budget.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyBudget {
    pub window_start_ns: u64,
    pub used: u32,
    pub _pad: u32,
}

/// What a user-stack ring record is (its first field).
pub const USER_STACK_RECORD_COPY: u32 = 1;
pub const USER_STACK_RECORD_EVENT: u32 = 2;

/// The fixed part of a `UserStackCopy`: whose stack, its saved registers, and how much of it
/// follows. Copies are taken when a lock operation begins (before the lock is taken, so that no
/// waiter pays for the copy) and used by the `UserStackEvent`s that name them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserStackCopyHeader {
    /// USER_STACK_RECORD_COPY.
    pub record: u32,
    pub tid: u32,
    /// bpf_ktime_get_ns when the copy was made: with `tid`, names the copy.
    pub copy_id: u64,
    /// The process whose stack this is (its objects unwind it).
    pub pid: u32,
    /// Bytes of the copy's pages that hold stack memory (from `stack_start`).
    pub stack_len: u32,
    /// User registers saved when the thread entered the kernel (syscall or fault).
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// User address of the first copied byte: sp rounded down to its page.
    pub stack_start: u64,
}

/// A user stack copy as the ring buffer carries it, in one of two sizes (`PAGES`).
#[repr(C)]
pub struct UserStackCopy<const PAGES: usize> {
    pub header: UserStackCopyHeader,
    pub pages: [[u8; USER_STACK_PAGE]; PAGES],
}

/// One wait or hold whose user stack was copied: the copy it uses, the aggregation key the
/// kernel added it under and its exact share of that entry, so that user space can move the
/// event from that entry to one keyed by the unwound stack.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserStackEvent {
    /// USER_STACK_RECORD_EVENT.
    pub record: u32,
    /// The locking thread (with `copy_id`, names the copy).
    pub tid: u32,
    pub copy_id: u64,
    pub key: AggKey,
    pub duration_ns: u64,
    /// The event's share of the AggValue fields, so that moving it is exact.
    pub contended_ns: u64,
    pub runnable_ns: u64,
    pub sleeping_ns: u64,
    pub uninterruptible_ns: u64,
    /// 1 when this event ends its lock operation: no later event uses the copy.
    pub last_use: u8,
    /// 1 when the copy was made at the end of the event, inside the critical section (the
    /// event was long without having been expected to be).
    pub late_copy: u8,
    pub _pad: [u8; 6],
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, integers only, explicit padding.
unsafe impl aya::Pod for UserStackEvent {}
#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, integers only, explicit padding.
unsafe impl aya::Pod for UserStackCopyHeader {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_stack_records_have_no_implicit_padding() {
        // 2 x u32 + u64 + 2 x u32 + 4 x u64.
        assert_eq!(core::mem::size_of::<UserStackCopyHeader>(), 56);
        // 2 x u32 + u64 + AggKey (24) + 5 x u64 + 8 flag and pad bytes.
        assert_eq!(core::mem::size_of::<UserStackEvent>(), 88);
        assert_eq!(core::mem::align_of::<UserStackEvent>(), 8);
        assert_eq!(
            core::mem::size_of::<UserStackCopy<USER_STACK_SMALL_PAGES>>(),
            56 + USER_STACK_SMALL_PAGES * USER_STACK_PAGE
        );
        assert_eq!(USER_STACK_MAX_PAGES * USER_STACK_PAGE, USER_STACK_MAX);
    }
}
