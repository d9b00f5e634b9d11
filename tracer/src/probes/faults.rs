//! Attaching the fault family (faults taken, faults that fell back to mmap_lock, filemap
//! faults under it).

use anyhow::Result;
use aya::Ebpf;

use crate::system::tracefs::{Tracefs, FILEMAP_FAULT, PAGE_FAULT_USER};

pub fn attach(ebpf: &mut Ebpf, tracefs: &Tracefs) -> Result<bool> {
    let user = super::attach_tracepoints(ebpf, tracefs, "page_fault_user", &[PAGE_FAULT_USER])?;
    // filemap faults are extra detail: their absence does not disable fault attribution.
    super::attach_tracepoints(ebpf, tracefs, "mm_filemap_fault", &[FILEMAP_FAULT])?;
    Ok(user)
}
