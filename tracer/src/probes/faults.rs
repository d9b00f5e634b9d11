//! Attaching the fault family. Lock operations serving user page faults are recognised by the
//! mmap_lock programs themselves (from the saved user registers), so the family needs no
//! program on every fault; mm_filemap_fault adds the filemap faults taken under mmap_lock.

use anyhow::Result;
use aya::Ebpf;

use super::{Family, Probes};
use crate::model::{sections::faults, Harvest};
use crate::system::tracefs::{Needed, Tracefs};

pub(super) const FAMILY: Family = Family {
    attach: |at, features| {
        if at.setup.settings.attribution {
            let user_regs_known = at.config.user_regs.known != 0;
            (features.faults, features.filemap) =
                attach(at.ebpf, at.setup.tracefs, user_regs_known, at.links)?;
        }
        Ok(())
    },
    read,
    maps: &[FAULT_COUNTS],
    programs: &[MM_FILEMAP_FAULT],
    ..Family::NOTHING
};

const FAULT_COUNTS: &str = "FAULT_COUNTS";
const MM_FILEMAP_FAULT: &str = "mm_filemap_fault";

/// Optional: without it (before Linux 6.4) the filemap faults are not counted.
const FILEMAP_FAULT: Needed = Needed {
    category: "filemap",
    name: "mm_filemap_fault",
    since: "6.4",
};

/// The fault counters (FAULT_COUNTS); user space adds the targets' own user faults later.
fn read(probes: &Probes, harvest: &mut Harvest) -> Result<()> {
    let map = super::map_ref(&probes.ebpf, FAULT_COUNTS)?;
    harvest.sections.faults = faults::Raw(super::read_array(&map, |into: &mut u64, v| *into += v)?);
    Ok(())
}

/// Whether fault attribution is available (it needs the saved-register offsets from BTF),
/// and whether the filemap faults are traced.
fn attach(
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
