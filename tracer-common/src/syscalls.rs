//! The mm syscall family: per-syscall totals and the syscall cause of each lock operation.

/// The syscalls that take mmap_lock for a reason of their own, traced for per-syscall totals.
pub const MM_SYSCALLS: [&str; 6] = ["mmap", "munmap", "mprotect", "mremap", "madvise", "brk"];

/// Where the classic syscall tracepoints keep the syscall number, and this architecture's
/// numbers of MM_SYSCALLS.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallsConfig {
    /// __syscall_nr in the syscalls:sys_{enter,exit}_* events.
    pub nr_offset: u32,
    /// This architecture's numbers of MM_SYSCALLS, in that order.
    pub nrs: [i32; MM_SYSCALLS.len()],
}

/// An mm syscall in progress on one thread (its lock wait and hold are kept in the thread's
/// LockState meanwhile, so that no lock event looks this up inside the critical section).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallState {
    /// Index into MM_SYSCALLS.
    pub index: u32,
    pub _pad: u32,
    pub enter_ns: u64,
}

/// Per-syscall totals (a per-CPU array indexed like MM_SYSCALLS).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize))]
pub struct SyscallTotals {
    pub count: u64,
    pub total_ns: u64,
    pub lock_wait_ns: u64,
    pub lock_hold_ns: u64,
}

impl SyscallTotals {
    pub fn merge(&mut self, o: &SyscallTotals) {
        self.count += o.count;
        self.total_ns += o.total_ns;
        self.lock_wait_ns += o.lock_wait_ns;
        self.lock_hold_ns += o.lock_hold_ns;
    }

    /// What these running totals gained since `before`.
    pub fn since(&self, before: &SyscallTotals) -> SyscallTotals {
        SyscallTotals {
            count: self.count.saturating_sub(before.count),
            total_ns: self.total_ns.saturating_sub(before.total_ns),
            lock_wait_ns: self.lock_wait_ns.saturating_sub(before.lock_wait_ns),
            lock_hold_ns: self.lock_hold_ns.saturating_sub(before.lock_hold_ns),
        }
    }
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, integers only, explicit padding.
unsafe impl aya::Pod for SyscallState {}
#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, integers only, explicit padding.
unsafe impl aya::Pod for SyscallTotals {}
