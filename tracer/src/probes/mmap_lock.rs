//! Loading and attaching the mmap_lock tracepoint family.

use anyhow::{anyhow, Context as _, Result};
use aya::{programs::TracePoint, Ebpf};

use crate::system::tracefs::{Needed, MMAP_LOCK_ACQUIRED, MMAP_LOCK_RELEASED, MMAP_LOCK_START};

const FAMILY: [Needed; 3] = [MMAP_LOCK_RELEASED, MMAP_LOCK_ACQUIRED, MMAP_LOCK_START];

/// Verifies all three programs before attaching any (verification takes milliseconds), then
/// attaches them back to back. The programs ignore events until the tracer arms them.
pub fn attach(ebpf: &mut Ebpf) -> Result<()> {
    for tp in FAMILY {
        program(ebpf, &tp)?
            .load()
            .map_err(|e| super::explain_permission(anyhow!(e), &format!("loading {}", tp.name)))?;
    }
    for tp in FAMILY {
        program(ebpf, &tp)?
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

fn program<'a>(ebpf: &'a mut Ebpf, tp: &Needed) -> Result<&'a mut TracePoint> {
    Ok(ebpf
        .program_mut(tp.name)
        .ok_or_else(|| anyhow!("eBPF object has no program {}", tp.name))?
        .try_into()?)
}
