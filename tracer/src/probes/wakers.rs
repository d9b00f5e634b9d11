//! The wakers family: sched_waking as a BTF tracepoint, which records who woke a thread asleep
//! while holding a target's mmap_lock (a writer waiting for a VMA's readers is woken by the
//! last of them, at the end of its page fault).

use anyhow::Result;

use super::{Family, Probes};
use crate::model::{sections::wakers, Harvest};

pub(super) const FAMILY: Family = Family {
    attach: |at, features| {
        if at.setup.settings.attribution {
            features.wakers = super::attach_optional_btf(
                at.ebpf,
                SCHED_WAKING,
                "sched_waking",
                "who woke sleeping holders is left out",
            )?;
        }
        Ok(())
    },
    read,
    maps: &[WAKERS],
    programs: &[SCHED_WAKING],
    ..Family::NOTHING
};

pub(super) const WAKERS: &str = "WAKERS";
const SCHED_WAKING: &str = "sched_waking";

/// The holders' sleeps by who ended them (WAKERS).
fn read(probes: &Probes, harvest: &mut Harvest) -> Result<()> {
    harvest.sections.wakers = wakers::Raw(super::read_shared(&probes.ebpf, WAKERS)?);
    Ok(())
}
