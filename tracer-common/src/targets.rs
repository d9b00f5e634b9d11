//! The listed targets the programs recognise without a hash lookup, and the lean path's
//! per-target aggregation (`--lean`).

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

/// Entries of the LEAN_AGG per-CPU array: one per (target slot, kind, mode).
pub const LEAN_AGG_SLOTS: u32 = (FAST_TARGETS * 4) as u32;

#[inline(always)]
pub fn lean_agg_index(slot: usize, kind: u8, mode: u8) -> u32 {
    (slot as u32 % FAST_TARGETS as u32) * 4 + (kind as u32 & 1) * 2 + (mode as u32 & 1)
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, integers only, explicit padding.
unsafe impl aya::Pod for FastTargets {}

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
                    let i = lean_agg_index(slot, kind, mode) as usize;
                    assert!(!seen[i], "{slot} {kind} {mode}");
                    seen[i] = true;
                }
            }
        }
        assert!(seen.iter().all(|&s| s));
    }
}
