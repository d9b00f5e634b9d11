//! Attaching the mm syscall family (per-syscall totals, `--syscall-times`). The lock programs
//! name a lock operation's syscall from the registers the thread saved on entry, so that
//! this family's tracepoints, which slow every syscall on the machine, are attached only when
//! asked for; its syscall numbers are configured either way.

use anyhow::Result;
use aya::Ebpf;
use tracer_common::{map_names, program_names, Config, SyscallTotals, MM_SYSCALLS};

use super::{Family, Probes};
use crate::model::{Features, Harvest};

use crate::system::tracefs::{Tracefs, MM_SYSCALL_TRACEPOINTS};

/// This architecture's numbers for MM_SYSCALLS, in that order.
const NUMBERS: [libc::c_long; MM_SYSCALLS.len()] = [
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
];

pub(super) const FAMILY: Family = Family {
    configure: |setup, config| configure(setup.tracefs, config),
    attach: |at, features: &mut Features| {
        if at.setup.settings.attribution && at.setup.settings.syscall_times {
            features.syscalls = attach(at.ebpf, at.setup.tracefs, at.links)?;
        }
        Ok(())
    },
    read,
};

/// The per-syscall totals (SYSCALL_TOTALS).
fn read(probes: &Probes, harvest: &mut Harvest) -> Result<()> {
    let map = super::map_ref(&probes.ebpf, map_names::SYSCALL_TOTALS)?;
    harvest.syscalls = super::read_array(&map, SyscallTotals::merge)?;
    Ok(())
}

fn configure(tracefs: &Tracefs, config: &mut Config) -> Result<()> {
    let (enter, _) = &MM_SYSCALL_TRACEPOINTS[0];
    if tracefs.has(enter) {
        config.syscalls.nr_offset = tracefs.field_offset(enter, "__syscall_nr", 4)?;
    }
    for (slot, nr) in config.syscalls.nrs.iter_mut().zip(NUMBERS) {
        *slot = nr as i32;
    }
    Ok(())
}

fn attach(ebpf: &mut Ebpf, tracefs: &Tracefs, links: &mut super::ClassicLinks) -> Result<bool> {
    let enters: Vec<_> = MM_SYSCALL_TRACEPOINTS
        .iter()
        .map(|(enter, _)| *enter)
        .collect();
    let exits: Vec<_> = MM_SYSCALL_TRACEPOINTS
        .iter()
        .map(|(_, exit)| *exit)
        .collect();
    Ok(
        super::attach_tracepoints(ebpf, tracefs, program_names::MM_SYSCALL_EXIT, &exits, links)?
            && super::attach_tracepoints(
                ebpf,
                tracefs,
                program_names::MM_SYSCALL_ENTER,
                &enters,
                links,
            )?,
    )
}
