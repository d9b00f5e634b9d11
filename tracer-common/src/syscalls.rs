//! The mm syscall family: per-syscall totals and the syscall cause of each lock operation.

/// The syscalls that take mmap_lock for a reason of their own, traced for per-syscall totals.
pub const MM_SYSCALLS: [&str; 6] = ["mmap", "munmap", "mprotect", "mremap", "madvise", "brk"];

/// The syscall causes of a lock operation (`AggKey::syscall`), read from the number its thread
/// saved entering the kernel: 0 for none (an exception, or not known), 1 + index into
/// MM_SYSCALLS, then the others. A lock taken inside a syscall that is not an mm syscall is
/// nearly always a page fault on the syscall's user buffer: the kernel's own accesses to user
/// memory (copy_to_user in read()) fault without the per-VMA lock, under mmap_lock, where a
/// user-mode fault would not take it at all.
/// Syscalls that copy into user memory (read, pread64, readv, preadv, preadv2, recvfrom).
pub const READ_CAUSE: u8 = MM_SYSCALLS.len() as u8 + 1;
/// Syscalls that copy from user memory (write, pwrite64, writev, pwritev, pwritev2, sendto).
pub const WRITE_CAUSE: u8 = READ_CAUSE + 1;
/// execve and execveat: the new program's mappings, made under its new mm's lock.
pub const EXEC_CAUSE: u8 = WRITE_CAUSE + 1;
/// clone, clone3, fork and vfork: copying the parent's mappings (dup_mmap) under its lock,
/// taken for write for the whole copy.
pub const FORK_CAUSE: u8 = EXEC_CAUSE + 1;
/// Any other syscall (futex, io_uring_enter, process_vm_readv, reading /proc/self files...).
pub const OTHER_SYSCALL_CAUSE: u8 = FORK_CAUSE + 1;
/// Syscall causes besides none: the mm syscalls and the three above.
pub const SYSCALL_CAUSES: usize = OTHER_SYSCALL_CAUSE as usize;
/// Syscalls counted as READ_CAUSE, and as WRITE_CAUSE.
pub const COPYING_SYSCALLS: usize = 6;

/// Where the classic syscall tracepoints keep the syscall number, and this architecture's
/// numbers of MM_SYSCALLS.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallsConfig {
    /// __syscall_nr in the syscalls:sys_{enter,exit}_* events.
    pub nr_offset: u32,
    /// This architecture's numbers of MM_SYSCALLS, in that order.
    pub nrs: [i32; MM_SYSCALLS.len()],
    /// This architecture's numbers of the syscalls of READ_CAUSE and of WRITE_CAUSE.
    pub read_nrs: [i32; COPYING_SYSCALLS],
    pub write_nrs: [i32; COPYING_SYSCALLS],
    /// This architecture's numbers of execve and execveat (EXEC_CAUSE), then of clone,
    /// clone3, fork and vfork (FORK_CAUSE).
    pub process_nrs: [i32; 6],
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
