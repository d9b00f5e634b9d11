//! Why a lock operation was begun, as far as it is known without a stack: a user page fault
//! or one of the mm syscalls. Read from the registers the thread saved entering the kernel,
//! or from the syscall programs' record of the mm syscall in progress; and what each cause is
//! charged with.

use aya_ebpf::{
    macros::map,
    maps::{LruHashMap, PerCpuArray},
};
use tracer_common::{
    Effects, LockState, SyscallState, EXEC_CAUSE, FAULTS_TOOK_MMAP_LOCK, FAULT_SLOTS, FORK_CAUSE,
    MM_SYSCALLS, OTHER_SYSCALL_CAUSE, READ_CAUSE, WRITE_CAUSE,
};

use crate::{
    context::Regs,
    filter::Locker,
    maps::{add_to, config},
};

/// How a target thread beginning a lock operation entered the kernel.
#[derive(Clone, Copy)]
pub struct Entry {
    /// Through an exception: a user page fault.
    pub fault: bool,
    /// The syscall cause (tracer_common's READ_CAUSE and others), or 0.
    pub syscall: u8,
}

impl Entry {
    pub const UNKNOWN: Entry = Entry {
        fault: false,
        syscall: 0,
    };
}

/// From the registers the thread saved when it entered the kernel (`orig_ax`: -1 for an
/// exception, else the syscall number), read once: no per-syscall program has to track the
/// syscall in progress, so no syscall tracepoint is attached for it (any one of them sends
/// every syscall on the machine through the kernel's slow path). Where the registers cannot
/// be found, the mm syscall the syscall programs saw enter (`--syscall-times`), if any.
#[inline(always)]
pub fn kernel_entry<R: Regs>(locker: &Locker) -> Entry {
    if locker.outside_pid != 0 {
        return Entry::UNKNOWN;
    }
    match R::entry_nr() {
        Some(nr) => Entry {
            fault: is_exception(nr),
            syscall: cause_of(nr),
        },
        None => Entry {
            fault: false,
            syscall: current(locker),
        },
    }
}

/// mm syscalls in progress on target threads.
#[map]
pub static SYSCALLS_ACTIVE: LruHashMap<u32, SyscallState> = LruHashMap::with_max_entries(16384, 0);

/// The syscall cause of syscall number `nr`: 1 + its index in MM_SYSCALLS, READ_CAUSE or
/// WRITE_CAUSE for the syscalls that copy to or from user memory, EXEC_CAUSE for an exec,
/// FORK_CAUSE for a fork, OTHER_SYSCALL_CAUSE for any other; 0 for an exception (-1).
#[inline(always)]
pub fn cause_of(nr: i64) -> u8 {
    let syscalls = &config().syscalls;
    let is = |n: &i32| *n as i64 == nr;
    if let Some(index) = syscalls.nrs.iter().position(is) {
        return index as u8 + 1;
    }
    if syscalls.read_nrs.iter().any(is) {
        READ_CAUSE
    } else if syscalls.write_nrs.iter().any(is) {
        WRITE_CAUSE
    } else if let Some(index) = syscalls.process_nrs.iter().position(is) {
        if index < 2 {
            EXEC_CAUSE
        } else {
            FORK_CAUSE
        }
    } else if nr >= 0 {
        OTHER_SYSCALL_CAUSE
    } else {
        0
    }
}

/// 1 + the index of the target thread's mm syscall in progress as the syscall programs saw it
/// enter, 0 when none (or they are not attached).
#[inline(always)]
pub fn current(locker: &Locker) -> u8 {
    if locker.outside_pid != 0 {
        return 0;
    }
    match unsafe { SYSCALLS_ACTIVE.get(&locker.tid) } {
        Some(state) if state.enter_ns != 0 => (state.index as u8).wrapping_add(1),
        _ => 0,
    }
}

/// Adds a lock operation's wait and hold to what its mm syscall will be handed at its exit
/// (`cause` one of MM_SYSCALLS': the operation serves one), and returns the cause.
#[inline(always)]
pub fn charge(st: &mut LockState, fx: &Effects) -> u8 {
    if st.cause == 0 || st.cause as usize > MM_SYSCALLS.len() {
        return st.cause;
    }
    if let Some((_, ns)) = fx.wait {
        st.syscall_wait_ns += ns;
    }
    if let Some((_, ns)) = fx.hold {
        st.syscall_hold_ns += ns;
    }
    st.cause
}

#[map]
pub static FAULT_COUNTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(FAULT_SLOTS, 0);

/// Whether `orig_ax`, as the thread saved it entering the kernel, says it came through an
/// exception (a user page fault) rather than a syscall.
#[inline(always)]
pub fn is_exception(orig_ax: i64) -> bool {
    orig_ax == -1
}

/// Counts one lock operation begun for a fault (a fault retried after dropping the lock, to
/// wait for I/O, counts again: it takes the lock again).
#[inline(always)]
pub fn count_fault_lock() {
    add_to(&FAULT_COUNTS, FAULTS_TOOK_MMAP_LOCK, 1);
}
