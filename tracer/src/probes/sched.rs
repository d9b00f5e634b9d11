//! The scheduler family: sched_switch as a BTF tracepoint (holders' off-CPU time) and the sleeps
//! it locates. (sched_process_exit and fork, the targets' lifecycle, attach with mmap_lock.)

use anyhow::{anyhow, Result};
use aya::{programs::BtfTracePoint, Ebpf};

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
    let btf = match super::kernel_btf() {
        Ok(btf) => btf,
        Err(err) => {
            log::warn!(
                "no kernel BTF for sched_switch ({err:#}): holders' off-CPU time is left out"
            );
            return Ok(false);
        }
    };
    let program = super::program::<BtfTracePoint>(ebpf, SCHED_SWITCH)?;
    if let Err(err) = program.load("sched_switch", &btf) {
        let err = super::load_failed(err, "loading the sched_switch BTF tracepoint");
        log::warn!(
            "{}: holders' off-CPU time is left out",
            crate::text::error_line(&err)
        );
        return Ok(false);
    }
    program
        .attach()
        .map_err(|e| super::explain_permission(anyhow!(e), "attaching tp_btf/sched_switch"))?;
    Ok(true)
}
