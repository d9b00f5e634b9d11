//! Attaching the mm syscall family (per-syscall totals, `--syscall-times`). The lock programs
//! name a lock operation's syscall from the registers the thread saved on entry, so that
//! this family's tracepoints, which slow every syscall on the machine, are attached only when
//! asked for; its syscall numbers are configured either way.

use anyhow::Result;
use aya::Ebpf;
use tracer_common::{Config, SyscallTotals, COPYING_SYSCALLS, MM_SYSCALLS};

use super::{Family, Probes};
use crate::model::{sections::syscalls, Features, Harvest};
use crate::system::tracefs::{Needed, Tracefs};

/// This architecture's numbers for MM_SYSCALLS, in that order.
const NUMBERS: [libc::c_long; MM_SYSCALLS.len()] = [
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
];

/// This architecture's numbers of the syscalls of READ_CAUSE and of WRITE_CAUSE.
const READING: [libc::c_long; COPYING_SYSCALLS] = [
    libc::SYS_read,
    libc::SYS_pread64,
    libc::SYS_readv,
    libc::SYS_preadv,
    libc::SYS_preadv2,
    libc::SYS_recvfrom,
];
const WRITING: [libc::c_long; COPYING_SYSCALLS] = [
    libc::SYS_write,
    libc::SYS_pwrite64,
    libc::SYS_writev,
    libc::SYS_pwritev,
    libc::SYS_pwritev2,
    libc::SYS_sendto,
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
    maps: &[SYSCALLS_ACTIVE, SYSCALL_TOTALS],
    programs: &[MM_SYSCALL_ENTER, MM_SYSCALL_EXIT],
};

/// The mm syscall each thread is in (cleared for threads gone, by the daemon).
pub(super) const SYSCALLS_ACTIVE: &str = "SYSCALLS_ACTIVE";
const SYSCALL_TOTALS: &str = "SYSCALL_TOTALS";
const MM_SYSCALL_ENTER: &str = "mm_syscall_enter";
const MM_SYSCALL_EXIT: &str = "mm_syscall_exit";

/// syscalls:sys_enter_NAME / sys_exit_NAME (CONFIG_FTRACE_SYSCALLS) for each of MM_SYSCALLS,
/// in the same order.
const MM_SYSCALL_TRACEPOINTS: [(Needed, Needed); MM_SYSCALLS.len()] = [
    syscall_pair("sys_enter_mmap", "sys_exit_mmap"),
    syscall_pair("sys_enter_munmap", "sys_exit_munmap"),
    syscall_pair("sys_enter_mprotect", "sys_exit_mprotect"),
    syscall_pair("sys_enter_mremap", "sys_exit_mremap"),
    syscall_pair("sys_enter_madvise", "sys_exit_madvise"),
    syscall_pair("sys_enter_brk", "sys_exit_brk"),
];

const fn syscall_pair(enter: &'static str, exit: &'static str) -> (Needed, Needed) {
    const SINCE: &str = "2.6.33 with CONFIG_FTRACE_SYSCALLS";
    (
        Needed {
            category: "syscalls",
            name: enter,
            since: SINCE,
        },
        Needed {
            category: "syscalls",
            name: exit,
            since: SINCE,
        },
    )
}

/// The per-syscall totals (SYSCALL_TOTALS).
fn read(probes: &Probes, harvest: &mut Harvest) -> Result<()> {
    let map = super::map_ref(&probes.ebpf, SYSCALL_TOTALS)?;
    harvest.sections.syscalls = syscalls::Raw(super::read_array(&map, SyscallTotals::merge)?);
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
    for (slot, nr) in config.syscalls.read_nrs.iter_mut().zip(READING) {
        *slot = nr as i32;
    }
    for (slot, nr) in config.syscalls.write_nrs.iter_mut().zip(WRITING) {
        *slot = nr as i32;
    }
    config.syscalls.process_nrs = [
        libc::SYS_execve,
        libc::SYS_execveat,
        libc::SYS_clone,
        libc::SYS_clone3,
        libc::SYS_fork,
        libc::SYS_vfork,
    ]
    .map(|nr| nr as i32);
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
        super::attach_tracepoints(ebpf, tracefs, MM_SYSCALL_EXIT, &exits, links)?
            && super::attach_tracepoints(ebpf, tracefs, MM_SYSCALL_ENTER, &enters, links)?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syscall_tracepoints_follow_mm_syscalls() {
        for (name, (enter, exit)) in tracer_common::MM_SYSCALLS
            .iter()
            .zip(MM_SYSCALL_TRACEPOINTS)
        {
            assert_eq!(enter.name, format!("sys_enter_{name}"));
            assert_eq!(exit.name, format!("sys_exit_{name}"));
        }
    }
}
