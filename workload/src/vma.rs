//! Mode `vma-lock`: the per-VMA lock inside mmap_lock write holds (Linux 6.4 on). Threads fault
//! in pages of one shared anonymous region over and over, each in its own slice (MADV_DONTNEED,
//! then a write to every page): page faults under that VMA's lock, taken for read. A writer
//! changes the protection of the region's first page and back, which splits the VMA and merges
//! it again: each mprotect() holds mmap_lock for write while it waits for the faults in flight
//! to leave the VMA.

use std::io::Write;
use std::thread;
use std::time::Instant;

use anyhow::{bail, Result};

use crate::cli::VmaLockArgs;
use crate::emit;
use crate::memory::{disable_huge_pages, map_region, page_size, Backing};
use crate::stop;
use crate::threads::{join_named, spawn_named};

pub fn run(args: &VmaLockArgs, out: &mut dyn Write) -> Result<()> {
    let page = page_size()?;
    let slice = args.slice_pages as usize * page;
    let region = map_region(page + slice * args.threads as usize, Backing::Anonymous)?;
    disable_huge_pages(&region)?;
    let base = region.start() as usize;
    let started = Instant::now();
    let deadline = started + args.seconds;
    let (rounds, mprotects) = thread::scope(|scope| -> Result<(u64, u64)> {
        let faulters = (0..args.threads as usize)
            .map(|i| {
                let at = base + page + i * slice;
                spawn_named(scope, format!("vma-fault-{i}"), move || {
                    Ok(fault_loop(at, slice, page, deadline))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mprotects = protect_loop(base, page, deadline)?;
        let mut rounds = 0;
        for faulter in faulters {
            rounds += join_named(faulter)?;
        }
        Ok((rounds, mprotects))
    })?;
    drop(region);
    emit(
        out,
        format_args!(
            "fault_rounds={rounds} mprotects={mprotects} elapsed_ns={}",
            started.elapsed().as_nanos()
        ),
    )
}

/// Drops and faults in again the pages of `[at, at + len)` until the deadline; the rounds made.
fn fault_loop(at: usize, len: usize, page: usize, deadline: Instant) -> u64 {
    let mut rounds = 0;
    while Instant::now() < deadline && !stop::requested() {
        refault_slice(at, len, page);
        rounds += 1;
    }
    rounds
}

/// One round: MADV_DONTNEED (which takes mmap_lock for read), then a write fault per page,
/// each under the VMA's own lock.
#[inline(never)]
fn refault_slice(at: usize, len: usize, page: usize) {
    let start = at as *mut u8;
    // SAFETY: the slice lies inside the region mapped for this mode, readable and writable.
    unsafe {
        libc::madvise(start.cast(), len, libc::MADV_DONTNEED);
        for offset in (0..len).step_by(page) {
            start.add(offset).write_volatile(1);
        }
    }
}

/// Makes the first page read-only and writable again until the deadline; the calls made.
fn protect_loop(base: usize, page: usize, deadline: Instant) -> Result<u64> {
    let mut calls = 0;
    while Instant::now() < deadline && !stop::requested() {
        protect_first_page(base, page, libc::PROT_READ)?;
        protect_first_page(base, page, libc::PROT_READ | libc::PROT_WRITE)?;
        calls += 2;
    }
    Ok(calls)
}

/// mprotect() of the region's first page: a split (or a merge) of the VMA the faults are in.
#[inline(never)]
fn protect_first_page(base: usize, page: usize, prot: libc::c_int) -> Result<()> {
    // SAFETY: the first page of the region mapped for this mode; nothing else touches it.
    let rc = unsafe { libc::mprotect(base as *mut libc::c_void, page, prot) };
    if rc != 0 {
        bail!("mprotect: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::protocol::{field, lines};

    #[test]
    fn vma_lock_faults_and_protects_until_the_deadline() {
        let args = VmaLockArgs {
            threads: 2,
            slice_pages: 16,
            seconds: Duration::from_millis(100),
        };
        let mut output = Vec::new();
        run(&args, &mut output).expect("vma-lock runs");
        let lines = lines(&output);
        assert!(field(&lines[0], "fault_rounds") > 0, "{lines:?}");
        assert!(field(&lines[0], "mprotects") > 0, "{lines:?}");
    }
}
