//! The fault family: the slots of the per-CPU fault counters. (Faults are told apart by the saved
//! user registers, `user_stacks::UserRegs`.)

/// Slots of the per-CPU fault counter array.
/// User faults of the targets: filled in by user space from /proc/PID/stat (counting them in
/// the kernel cost a program run on every fault).
pub const FAULTS_USER: u32 = 0;
/// Lock operations taken by user page faults (fell back from the per-VMA lock).
pub const FAULTS_TOOK_MMAP_LOCK: u32 = 1;
pub const FAULTS_FILEMAP: u32 = 2;
/// filemap faults while the faulting thread held the target's mmap_lock.
pub const FAULTS_FILEMAP_UNDER_LOCK: u32 = 3;
pub const FAULT_SLOTS: u32 = 4;
