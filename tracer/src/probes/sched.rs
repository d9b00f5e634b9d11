//! The scheduler family: sched_switch as a BTF tracepoint (holders' off-CPU time) and the sleeps
//! it locates. (sched_process_exit and fork, the targets' lifecycle, attach with mmap_lock.)

use anyhow::Result;
use aya::Ebpf;

use super::{Family, Probes};
use crate::model::Harvest;

pub(super) const FAMILY: Family = Family {
    attach: |at, features| {
        if at.setup.settings.attribution {
            features.offcpu = attach(at.ebpf)?;
        }
        Ok(())
    },
    read,
    maps: &[SLEEPS],
    programs: &[SCHED_SWITCH],
    ..Family::NOTHING
};

/// Holds' sleeping time by kernel stack (written by the mmap_lock programs, from what
/// sched_switch saw); the daemon's forgetting of gone threads clears it too.
pub(super) const SLEEPS: &str = "SLEEPS";
const SCHED_SWITCH: &str = "sched_switch";

/// Holds' sleeping time by the kernel stack they slept in (SLEEPS).
fn read(probes: &Probes, harvest: &mut Harvest) -> Result<()> {
    harvest.sleeps = super::read_shared(&probes.ebpf, SLEEPS)?;
    Ok(())
}

fn attach(ebpf: &mut Ebpf) -> Result<bool> {
    super::attach_optional_btf(
        ebpf,
        SCHED_SWITCH,
        "sched_switch",
        "holders' off-CPU time is left out",
    )
}
