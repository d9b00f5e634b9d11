//! Attaching the mmap_lock tracepoint family.

use anyhow::{anyhow, Context as _, Result};
use aya::{programs::TracePoint, Ebpf};

use crate::system::tracefs::{MMAP_LOCK_ACQUIRED, MMAP_LOCK_RELEASED, MMAP_LOCK_START};

/// Attaches release first and start last, so that a lock sequence in flight while attaching
/// shows up as an unpaired release at worst, never as a wait or hold with a made-up start.
pub fn attach(ebpf: &mut Ebpf) -> Result<()> {
    for tp in [MMAP_LOCK_RELEASED, MMAP_LOCK_ACQUIRED, MMAP_LOCK_START] {
        let program: &mut TracePoint = ebpf
            .program_mut(tp.name)
            .ok_or_else(|| anyhow!("eBPF object has no program {}", tp.name))?
            .try_into()?;
        program
            .load()
            .map_err(|e| super::explain_permission(anyhow!(e), &format!("loading {}", tp.name)))?;
        program
            .attach(tp.category, tp.name)
            .map_err(|e| {
                super::explain_permission(
                    anyhow!(e),
                    &format!("attaching {}:{}", tp.category, tp.name),
                )
            })
            .with_context(|| format!("tracepoint {}:{}", tp.category, tp.name))?;
    }
    Ok(())
}
