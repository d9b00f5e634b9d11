//! Mode `hold`: takes mmap_lock for write for a known time and reports how long.
//!
//! mprotect() holds mmap_lock for write across its whole page-table walk, so over a large
//! region of 4 KiB pages one call is one long write hold. Each call's own duration, measured on
//! CLOCK_MONOTONIC right around it, is printed so tests can compare it with the longest write
//! hold the tracer measured: the syscall's duration bounds the hold from above.
//!
//! With `--readers`, threads call mincore() (a read of mmap_lock) in a tight loop across all the
//! mprotect() calls: readers that arrive while the writer holds the lock queue behind it, and the
//! writer queues behind the readers inside.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::{self, Scope};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::cli::HoldArgs;
use crate::emit;
use crate::memory::{self, Backing, Region};
use crate::threads::{join_named, spawn_named, Handle};

/// Pages of each reader's region: a small walk, so each read hold is short.
const READER_PAGES: usize = 16;

pub fn run(args: &HoldArgs, out: &mut dyn Write) -> Result<()> {
    let region = populate_region(args.size_mib)?;
    emit(
        out,
        format_args!(
            "populated bytes={} elapsed_ns={}",
            region.len(),
            region.populate_time.as_nanos()
        ),
    )?;
    let (longest, reader_calls) = hold_beside_readers(&region.region, args, out)?;
    emit(out, format_args!("reader_calls={reader_calls}"))?;
    emit(out, format_args!("max_mprotect_ns={longest}"))?;
    memory::unmap_region(region.region)
}

/// Starts the readers, runs the timed mprotect() calls, then stops the readers. Returns the
/// longest call's duration and the readers' total number of mincore() calls.
fn hold_beside_readers(
    region: &Region,
    args: &HoldArgs,
    out: &mut dyn Write,
) -> Result<(u64, u64)> {
    let stop = AtomicBool::new(false);
    let running = AtomicU32::new(0);
    let colliding_reader = AtomicU32::new(0);
    thread::scope(|scope| {
        let readers = spawn_readers(scope, args, &colliding_reader, &running, &stop, out)
            .inspect_err(|_| stop.store(true, Ordering::Relaxed))?;
        wait_for_readers(args.readers, &running, &stop);
        let longest = hold_rounds(region, args, out);
        stop.store(true, Ordering::Relaxed);
        let reader_calls = readers.into_iter().map(join_named).sum::<Result<u64>>();
        Ok((longest?, reader_calls?))
    })
}

/// The timed mprotect() calls, each printed; returns the longest.
fn hold_rounds(region: &Region, args: &HoldArgs, out: &mut dyn Write) -> Result<u64> {
    let gap = Duration::from_millis(args.gap_ms);
    let mut longest = 0;
    for round in 0..args.repeat {
        // The gap also separates the first hold from the faults of populate_region.
        thread::sleep(gap);
        let held_ns = hold_write_lock(region, protection_for_round(round))?;
        emit(out, format_args!("mprotect_ns={held_ns}"))?;
        longest = longest.max(held_ns);
    }
    Ok(longest)
}

fn spawn_readers<'scope, 'env>(
    scope: &'scope Scope<'scope, 'env>,
    args: &HoldArgs,
    colliding_reader: &'env AtomicU32,
    running: &'env AtomicU32,
    stop: &'env AtomicBool,
    out: &mut dyn Write,
) -> Result<Vec<Handle<'scope, u64>>> {
    let mut readers = Vec::new();
    if let Some(modulo) = args.reader_tid_modulo {
        let (reader, tid) =
            spawn_reader_at_tid_modulo(scope, modulo, colliding_reader, running, stop)?;
        emit(out, format_args!("writer_tid={}", gettid()))?;
        emit(out, format_args!("colliding_reader_tid={tid}"))?;
        readers.push(reader);
    }
    for index in readers.len() as u32..args.readers {
        readers.push(spawn_named(scope, format!("reader-{index}"), move || {
            read_lock_loop(running, stop).inspect_err(|_| stop.store(true, Ordering::Relaxed))
        })?);
    }
    Ok(readers)
}

/// Spawns threads until one's id equals the calling thread's modulo `modulo`: that one goes on
/// as reader 0, the others exit at once. Returns it and its id. Thread ids are handed out in
/// sequence, so this takes about `modulo` spawns; it gives up after four rounds of them (other
/// processes' forks may take the id). `matched` (0 before) receives the reader's id.
fn spawn_reader_at_tid_modulo<'scope, 'env>(
    scope: &'scope Scope<'scope, 'env>,
    modulo: u32,
    matched: &'env AtomicU32,
    running: &'env AtomicU32,
    stop: &'env AtomicBool,
) -> Result<(Handle<'scope, u64>, u32)> {
    let wanted = gettid() % modulo;
    for _ in 0..4 * modulo {
        let candidate = spawn_named(scope, "reader-0".into(), move || {
            let tid = gettid();
            if tid % modulo != wanted {
                return Ok(0);
            }
            matched.store(tid, Ordering::Release);
            read_lock_loop(running, stop).inspect_err(|_| stop.store(true, Ordering::Relaxed))
        })?;
        while !candidate.is_finished() && matched.load(Ordering::Acquire) == 0 {
            thread::yield_now();
        }
        match matched.load(Ordering::Acquire) {
            0 => {
                join_named(candidate)?;
            }
            tid => return Ok((candidate, tid)),
        }
    }
    bail!(
        "no thread got an id equal to {wanted} modulo {modulo} in {} spawns",
        4 * modulo
    )
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// Returns once every reader is in its loop (or one has failed and raised `stop`), so that the
/// first mprotect() already has them around even with no gap before it.
fn wait_for_readers(readers: u32, running: &AtomicU32, stop: &AtomicBool) {
    while running.load(Ordering::Acquire) < readers && !stop.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(1));
    }
}

/// One reader: maps its own small region, then calls mincore() over it until `stop` (at least
/// once). Returns the number of calls.
#[inline(never)]
fn read_lock_loop(running: &AtomicU32, stop: &AtomicBool) -> Result<u64> {
    let page_size = memory::page_size()?;
    let region = memory::map_region(READER_PAGES * page_size, Backing::Anonymous)?;
    let mut residency = Vec::with_capacity(READER_PAGES);
    running.fetch_add(1, Ordering::Release);
    let mut calls = 0;
    loop {
        memory::query_residency(&region, page_size, &mut residency)?;
        calls += 1;
        if stop.load(Ordering::Relaxed) {
            break;
        }
    }
    memory::unmap_region(region)?;
    Ok(calls)
}

/// The mapped, faulted-in region and the time populating it took.
struct PopulatedRegion {
    region: Region,
    populate_time: Duration,
}

impl PopulatedRegion {
    fn len(&self) -> usize {
        self.region.len()
    }
}

/// Maps `size_mib` MiB of private anonymous memory backed by 4 KiB pages and writes every page,
/// so each has a present PTE for mprotect() to rewrite.
fn populate_region(size_mib: u64) -> Result<PopulatedRegion> {
    let len = size_mib
        .checked_mul(1 << 20)
        .and_then(|len| usize::try_from(len).ok())
        .with_context(|| format!("{size_mib} MiB does not fit in the address space"))?;
    let page_size = memory::page_size()?;
    let region = memory::map_region(len, Backing::Anonymous)?;
    // Before the first touch: once huge pages back the region, the advice would not split them.
    memory::disable_huge_pages(&region)?;
    let started = Instant::now();
    memory::touch_pages(&region, page_size);
    Ok(PopulatedRegion {
        region,
        populate_time: started.elapsed(),
    })
}

/// Alternates read-only and read-write, starting with read-only: the region starts writable,
/// and every call must change each PTE (asking for the current protection would be a cheaper
/// walk).
fn protection_for_round(round: u32) -> libc::c_int {
    if round.is_multiple_of(2) {
        libc::PROT_READ
    } else {
        libc::PROT_READ | libc::PROT_WRITE
    }
}

/// One mprotect() over the whole region, timed on CLOCK_MONOTONIC immediately around the call
/// (nothing else runs inside the timed span). Returns the call's duration in nanoseconds.
#[inline(never)]
fn hold_write_lock(region: &Region, protection: libc::c_int) -> Result<u64> {
    let before = memory::monotonic_ns()?;
    // SAFETY: the region is our own live mapping; changing its protection cannot invalidate a
    // Rust reference because none point into it.
    let rc = unsafe { libc::mprotect(region.start().cast(), region.len(), protection) };
    let after = memory::monotonic_ns()?;
    if rc == -1 {
        bail!(
            "mprotect({:p}, {} bytes, {protection:#x}) failed: {}",
            region.start(),
            region.len(),
            std::io::Error::last_os_error()
        );
    }
    Ok(after - before)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{field, lines};

    fn args(readers: u32) -> HoldArgs {
        HoldArgs {
            size_mib: 8,
            repeat: 2,
            gap_ms: 1,
            readers,
            reader_tid_modulo: None,
        }
    }

    fn output_lines(args: &HoldArgs) -> Vec<String> {
        let mut output = Vec::new();
        run(args, &mut output).expect("hold runs");
        lines(&output)
    }

    #[test]
    fn the_colliding_reader_shares_the_writers_tid_modulo() {
        let lines = output_lines(&HoldArgs {
            reader_tid_modulo: Some(64),
            ..args(2)
        });
        let value = |key: &str| {
            let line = lines.iter().find(|l| l.starts_with(&format!("{key}=")));
            field(line.unwrap_or_else(|| panic!("no {key} in {lines:?}")), key)
        };
        let (writer, reader) = (value("writer_tid"), value("colliding_reader_tid"));
        assert_ne!(writer, reader);
        assert_eq!(writer % 64, reader % 64, "{lines:?}");
        assert!(value("reader_calls") > 0, "{lines:?}");
    }

    #[test]
    fn hold_prints_each_mprotect_and_the_longest() {
        let lines = output_lines(&args(0));
        assert_eq!(lines.len(), 5, "{lines:?}");

        assert!(lines[0].starts_with("populated "), "{lines:?}");
        assert_eq!(field(&lines[0], "bytes"), 8 << 20);
        assert!(field(&lines[0], "elapsed_ns") > 0);

        let held: Vec<u64> = lines[1..3]
            .iter()
            .map(|line| {
                assert!(line.starts_with("mprotect_ns="), "{line}");
                field(line, "mprotect_ns")
            })
            .collect();
        // 2048 PTEs take far more than a microsecond and far less than a few seconds.
        for &ns in &held {
            assert!((1_000..5_000_000_000).contains(&ns), "{held:?}");
        }
        assert_eq!(lines[3], "reader_calls=0");
        assert!(lines[4].starts_with("max_mprotect_ns="), "{lines:?}");
        assert_eq!(field(&lines[4], "max_mprotect_ns"), held[0].max(held[1]));
    }

    #[test]
    fn readers_call_mincore_across_the_holds() {
        let lines = output_lines(&args(2));
        assert_eq!(lines.len(), 5, "{lines:?}");
        assert!(lines[1].starts_with("mprotect_ns="), "{lines:?}");
        assert!(lines[2].starts_with("mprotect_ns="), "{lines:?}");
        assert!(lines[3].starts_with("reader_calls="), "{lines:?}");
        // Every reader calls at least once, whatever the scheduling.
        assert!(field(&lines[3], "reader_calls") >= 2, "{lines:?}");
        assert!(lines[4].starts_with("max_mprotect_ns="), "{lines:?}");
    }

    #[test]
    fn a_reader_counts_its_calls_and_marks_itself_running() {
        let running = AtomicU32::new(0);
        // Already stopped: exactly one call.
        let calls = read_lock_loop(&running, &AtomicBool::new(true)).expect("reader runs");
        assert_eq!(calls, 1);
        assert_eq!(running.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn protection_alternates_starting_read_only() {
        assert_eq!(protection_for_round(0), libc::PROT_READ);
        assert_eq!(protection_for_round(1), libc::PROT_READ | libc::PROT_WRITE);
        assert_eq!(protection_for_round(2), libc::PROT_READ);
    }

    #[test]
    fn mprotect_changes_the_protection_it_reports() {
        let page = memory::page_size().expect("page size");
        let region = memory::map_region(page, Backing::Anonymous).expect("mmap");
        hold_write_lock(&region, libc::PROT_READ).expect("mprotect read-only");
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let address = region.start() as usize;
        // Neighbouring mappings of other tests may have merged with ours: find the VMA that
        // contains the address rather than one that starts there.
        let line = maps
            .lines()
            .find(|line| {
                let range = line.split(' ').next().unwrap_or_default();
                let (low, high) = range.split_once('-').expect("address range");
                let low = usize::from_str_radix(low, 16).expect("hex");
                let high = usize::from_str_radix(high, 16).expect("hex");
                (low..high).contains(&address)
            })
            .expect("region in maps");
        assert!(line.contains(" r--p "), "{line}");
        memory::unmap_region(region).expect("munmap");
    }

    #[test]
    fn failed_mprotect_names_the_call() {
        let page = memory::page_size().expect("page size");
        let region = memory::map_region(page, Backing::Anonymous).expect("mmap");
        // An unknown protection bit is EINVAL.
        let error = hold_write_lock(&region, 0x4000_0000).expect_err("must fail");
        let message = error.to_string();
        assert!(message.starts_with("mprotect("), "{message}");
        assert!(message.contains("os error 22"), "{message}");
    }
}
