//! Attaching the fault family. Lock operations serving user page faults are recognised by the
//! mmap_lock programs themselves (from the saved user registers), so the family needs no
//! program on every fault; mm_filemap_fault adds the filemap faults taken under mmap_lock.

use anyhow::Result;
use aya::Ebpf;
use tracer_common::program_names::MM_FILEMAP_FAULT;

use crate::system::tracefs::{Tracefs, FILEMAP_FAULT};

/// Whether fault attribution is available (it needs the saved-register offsets from BTF),
/// and whether the filemap faults are traced.
pub fn attach(
    ebpf: &mut Ebpf,
    tracefs: &Tracefs,
    user_regs_known: bool,
    links: &mut super::ClassicLinks,
) -> Result<(bool, bool)> {
    if !user_regs_known {
        log::warn!("kernel BTF lacks task_struct.stack or struct pt_regs: no fault attribution");
        return Ok((false, false));
    }
    // filemap faults are extra detail: their absence does not disable fault attribution.
    let filemap =
        super::attach_tracepoints(ebpf, tracefs, MM_FILEMAP_FAULT, &[FILEMAP_FAULT], links)?;
    Ok((true, filemap))
}
