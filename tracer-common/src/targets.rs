//! The listed targets the programs recognise without a hash lookup, and their per-CPU
//! aggregation of operations without stacks (all of `--lean`'s; the defaults' short ones).

use crate::{LockTiming, StateKey};

/// Listed targets recognised without a hash lookup.
pub const FAST_TARGETS: usize = 8;

/// The listed targets: slot i is the target `pids[i]` (0: free), whose mm is `mms[i]` once
/// one of its threads locked it (learnt by the programs; a new mm after an exec replaces it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FastTargets {
    pub pids: [u32; FAST_TARGETS],
    pub mms: [u64; FAST_TARGETS],
}

/// Causes a LEAN_AGG entry is kept by: none, the syscall causes (`SYSCALL_CAUSES`: the mm
/// syscalls, then the others), and a user page fault outside them.
pub const FAST_CAUSES: u32 = 1 + crate::SYSCALL_CAUSES as u32 + 1;

/// The lean path (`--lean`, `serve`, `-a --lean`) reads the cause of a wait or hold at least
/// this long from the saved registers (its syscall, or a fault) when it ends; a shorter one,
/// most of them, is added without (the read costs more than the rest of its path).
pub const LEAN_CAUSE_THRESHOLD_NS: u64 = 10_000;

/// Entries of the LEAN_AGG per-CPU array: one per (target slot, kind, mode, cause).
pub const LEAN_AGG_SLOTS: u32 = FAST_TARGETS as u32 * 4 * FAST_CAUSES;

/// The LEAN_AGG cause of an operation's (syscall, fault), if it has one (a fault inside an mm
/// syscall has none: the general path keeps it).
#[inline(always)]
pub fn fast_cause(syscall: u8, fault: u8) -> Option<u32> {
    match (syscall as u32, fault) {
        (0, 0) => Some(0),
        (0, _) => Some(FAST_CAUSES - 1),
        (s, 0) if s < FAST_CAUSES - 1 => Some(s),
        _ => None,
    }
}

/// The (syscall, fault) of a LEAN_AGG cause: `fast_cause`'s inverse.
pub fn cause_parts(cause: u32) -> (u8, u8) {
    if cause == FAST_CAUSES - 1 {
        (0, 1)
    } else {
        (cause as u8, 0)
    }
}

#[inline(always)]
pub fn lean_agg_index(slot: usize, kind: u8, mode: u8, cause: u32) -> u32 {
    let slot = slot as u32 % FAST_TARGETS as u32;
    ((slot * 4 + (kind as u32 & 1) * 2 + (mode as u32 & 1)) * FAST_CAUSES) + cause % FAST_CAUSES
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, integers only, explicit padding.
unsafe impl aya::Pod for FastTargets {}

/// Entries of the lean path's LEAN_THREADS array: a thread's entry is at its tid modulo this.
pub const LEAN_THREAD_SLOTS: u32 = 4096;

/// A LEAN_THREADS entry: the lock timing of the (thread, mm) that holds it, 64 bytes, so that
/// each event of the lean path touches one cache line of state. Found by index, not by hash.
/// A thread keeps its entry until it exits; a thread whose index is taken keeps its timing in
/// LOCK_STATE.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeanThread {
    /// tid 0: free.
    pub key: StateKey,
    pub timing: LockTiming,
    /// Atomic adds of the threads that found the entry free and tried to take it: the one
    /// whose add made it 1 took it (reset to 0 when the entry is freed).
    pub claims: u64,
}

#[inline(always)]
pub fn lean_thread_index(tid: u32) -> u32 {
    tid % LEAN_THREAD_SLOTS
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, integers only, explicit padding.
unsafe impl aya::Pod for LeanThread {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KIND_HOLD, KIND_WAIT, MODE_READ, MODE_WRITE};

    #[test]
    fn lean_agg_indices_are_dense_and_distinct() {
        let mut seen = [false; LEAN_AGG_SLOTS as usize];
        for slot in 0..FAST_TARGETS {
            for kind in [KIND_WAIT, KIND_HOLD] {
                for mode in [MODE_READ, MODE_WRITE] {
                    for cause in 0..FAST_CAUSES {
                        let i = lean_agg_index(slot, kind, mode, cause) as usize;
                        assert!(!seen[i], "{slot} {kind} {mode} {cause}");
                        seen[i] = true;
                    }
                }
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn every_cause_but_a_fault_inside_a_syscall_has_a_slot_and_comes_back() {
        for syscall in 0..=crate::SYSCALL_CAUSES as u8 {
            for fault in [0, 1] {
                match fast_cause(syscall, fault) {
                    Some(cause) => assert_eq!(cause_parts(cause), (syscall, fault)),
                    None => assert!(syscall != 0 && fault != 0, "{syscall} {fault}"),
                }
            }
        }
        assert_eq!(fast_cause(crate::SYSCALL_CAUSES as u8 + 1, 0), None);
    }

    #[test]
    fn a_lean_thread_fills_one_cache_line() {
        assert_eq!(core::mem::size_of::<LeanThread>(), 64);
    }
}
