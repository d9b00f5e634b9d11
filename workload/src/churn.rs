//! Mode `churn`: the clamd pattern. Worker threads map a region, fault every page in and unmap
//! it, over and over. Each mmap() and munmap() takes the process's one mmap_lock for write, and
//! the first fault on every fresh anonymous VMA falls back from the per-VMA lock to mmap_lock,
//! so the workers queue behind each other and adding threads makes each iteration slower.

use std::fs::{self, File};
use std::hint::black_box;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::thread::{self, Scope};
use std::time::Instant;

use anyhow::{Context, Result};

use crate::cli::{ChurnArgs, Source};
use crate::emit;
use crate::fileio;
use crate::memory::{self, Backing, Region};
use crate::threads::{join_named, spawn_named, Handle};

/// When a worker stops.
#[derive(Debug, Clone, Copy)]
enum Budget {
    /// After this many iterations.
    Iterations(u64),
    /// At this instant (checked between iterations).
    Until(Instant),
}

impl Budget {
    fn allows(self, done: u64) -> bool {
        match self {
            Budget::Iterations(limit) => done < limit,
            Budget::Until(deadline) => Instant::now() < deadline,
        }
    }
}

/// What every worker does each iteration.
#[derive(Debug, Clone, Copy)]
pub struct ChurnJob<'fd> {
    backing: Backing<'fd>,
    map_size: usize,
    page_size: usize,
    budget: Budget,
}

impl ChurnJob<'static> {
    /// Anonymous map/touch/unmap of `map_size` bytes until `deadline`: the churn other modes
    /// run as writers queueing on mmap_lock.
    pub fn anonymous_until(map_size: usize, deadline: Instant) -> Result<Self> {
        Ok(Self {
            backing: Backing::Anonymous,
            map_size,
            page_size: memory::page_size()?,
            budget: Budget::Until(deadline),
        })
    }
}

/// Threads beside the workers that only add pressure, running until the workers are done.
#[derive(Debug, Clone, Copy)]
struct Pressure {
    /// The MAP_POPULATE writer's mapping size, when there is a writer.
    writer_size: Option<usize>,
    /// CPU hogs.
    hogs: u32,
}

/// Iteration counts of one run.
#[derive(Debug, Default)]
struct Counts {
    per_worker: Vec<u64>,
    writer: u64,
}

pub fn run(args: &ChurnArgs, out: &mut dyn Write) -> Result<()> {
    let backing_file = match args.source {
        Source::Anon => None,
        Source::File => Some(create_backing_file(args.map_size)?),
    };
    let backing = match &backing_file {
        Some(file) => Backing::File(file.as_fd()),
        None => Backing::Anonymous,
    };
    let started = Instant::now();
    let job = ChurnJob {
        backing,
        map_size: args.map_size,
        page_size: memory::page_size()?,
        budget: match args.iterations {
            Some(limit) => Budget::Iterations(limit),
            None => Budget::Until(started + args.seconds),
        },
    };
    let pressure = Pressure {
        writer_size: args.writer.then_some(args.writer_size),
        hogs: args.hogs,
    };
    let counts = run_threads(job, args.threads, pressure, args.together)?;
    let elapsed = started.elapsed();
    emit(
        out,
        format_args!(
            "iterations={} writer_iterations={} elapsed_ns={} hogs={}",
            counts.per_worker.iter().sum::<u64>(),
            counts.writer,
            elapsed.as_nanos(),
            args.hogs
        ),
    )
}

/// Runs the workers, plus the pressure threads, to the end of the budget.
///
/// A failing thread raises `stop` so the others end early too; the first error is returned once
/// every thread has been joined.
fn run_threads(
    job: ChurnJob<'_>,
    threads: u32,
    pressure: Pressure,
    together: bool,
) -> Result<Counts> {
    let stop = AtomicBool::new(false);
    // With `together`, the workers start churning once all exist (2 000 started one by one on a
    // busy lock took most of a minute); else each starts at once, and short-lived ones come and
    // go without ever all existing.
    let start_line = StartLine::default();
    if !together {
        start_line.open();
    }
    thread::scope(|scope| {
        let spawned = spawn_all(scope, job, threads, pressure, &stop, &start_line);
        // Opened on failure too (after the stop), so that the started workers see the stop.
        let spawned = spawned.inspect_err(|_| stop.store(true, Ordering::Relaxed));
        start_line.open();
        let spawned = spawned?;
        let per_worker: Vec<Result<u64>> = spawned.workers.into_iter().map(join_named).collect();
        // The pressure threads run until the workers are done.
        stop.store(true, Ordering::Relaxed);
        let writer = spawned.writer.map(join_named).transpose();
        let hogs: Result<Vec<u64>> = spawned.hogs.into_iter().map(join_named).collect();
        let counts = Counts {
            per_worker: per_worker.into_iter().collect::<Result<_>>()?,
            writer: writer?.unwrap_or(0),
        };
        hogs?;
        Ok(counts)
    })
}

/// Where the workers wait until every one of them exists.
#[derive(Default)]
struct StartLine {
    open: Mutex<bool>,
    opened: Condvar,
}

impl StartLine {
    fn wait(&self) {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let _open = self
            .opened
            .wait_while(open, |open| !*open)
            .unwrap_or_else(PoisonError::into_inner);
    }

    fn open(&self) {
        *self.open.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.opened.notify_all();
    }
}

/// The running threads of one churn run.
struct Spawned<'scope> {
    workers: Vec<Handle<'scope, u64>>,
    writer: Option<Handle<'scope, u64>>,
    hogs: Vec<Handle<'scope, u64>>,
}

fn spawn_all<'scope, 'env>(
    scope: &'scope Scope<'scope, 'env>,
    job: ChurnJob<'env>,
    threads: u32,
    pressure: Pressure,
    stop: &'env AtomicBool,
    start_line: &'env StartLine,
) -> Result<Spawned<'scope>> {
    let workers = (0..threads)
        .map(|index| {
            spawn_named(scope, format!("churn-{index}"), move || {
                start_line.wait();
                churn_worker(job, stop)
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let writer = pressure
        .writer_size
        .map(|size| spawn_named(scope, "writer".to_owned(), move || writer_loop(size, stop)))
        .transpose()?;
    let hogs = (0..pressure.hogs)
        .map(|index| spawn_named(scope, format!("hog-{index}"), move || Ok(burn_cpu(stop))))
        .collect::<Result<Vec<_>>>()?;
    Ok(Spawned {
        workers,
        writer,
        hogs,
    })
}

/// One worker: map, fault in, unmap until the budget runs out, another thread fails or the
/// caller closes standard input (--until-stdin-closes).
#[inline(never)]
pub fn churn_worker(job: ChurnJob<'_>, stop: &AtomicBool) -> Result<u64> {
    let mut done = 0;
    while job.budget.allows(done) && !stop.load(Ordering::Relaxed) && !crate::stop::requested() {
        if let Err(error) = churn_once(&job) {
            stop.store(true, Ordering::Relaxed);
            return Err(error);
        }
        done += 1;
    }
    Ok(done)
}

#[inline(never)]
fn churn_once(job: &ChurnJob<'_>) -> Result<()> {
    let region = memory::map_region(job.map_size, job.backing)?;
    fault_in(&region, job);
    memory::unmap_region(region)
}

/// Faults every page of a fresh mapping in: anonymous pages by writing (a read would only map
/// the shared zero page), file pages by reading through the page cache. File read faults are
/// handled under the per-VMA lock on recent kernels (6.18 here), so with the file source the
/// contention comes from mmap() and munmap() alone.
fn fault_in(region: &Region, job: &ChurnJob<'_>) {
    match job.backing {
        Backing::Anonymous => memory::touch_pages(region, job.page_size),
        Backing::File(_) => {
            memory::read_pages(region, job.page_size);
        }
    }
}

/// The writer thread: populate and unmap a large region until told to stop (at least once, so a
/// short run still has the writer's pressure in it).
#[inline(never)]
fn writer_loop(size: usize, stop: &AtomicBool) -> Result<u64> {
    let mut done = 0;
    loop {
        let cycle = populate_writer(size).and_then(memory::unmap_region);
        if let Err(error) = cycle {
            stop.store(true, Ordering::Relaxed);
            return Err(error);
        }
        done += 1;
        if stop.load(Ordering::Relaxed) {
            return Ok(done);
        }
    }
}

/// Maps and faults in the writer's whole region in one mmap(MAP_POPULATE) call, which keeps
/// mmap_lock held for a long stretch (see `memory::map_populated`).
#[inline(never)]
fn populate_writer(size: usize) -> Result<Region> {
    memory::map_populated(size)
}

/// A CPU hog: spins until `stop`, returning the number of spins.
///
/// With more runnable threads than CPUs the scheduler preempts threads wherever they are,
/// including workers inside mmap_lock (lock-holder preemption): every thread queued on the lock
/// then waits for a holder that is not even running.
#[inline(never)]
fn burn_cpu(stop: &AtomicBool) -> u64 {
    // Checking the flag only now and then keeps the loop almost pure arithmetic.
    const SPINS_PER_CHECK: u64 = 1000;
    let mut spins = 0u64;
    loop {
        for _ in 0..SPINS_PER_CHECK {
            spins = black_box(spins.wrapping_add(1));
        }
        if stop.load(Ordering::Relaxed) {
            return spins;
        }
    }
}

/// Creates the file the `file` source maps: `len` bytes in the temp directory under a unique
/// name.
fn create_backing_file(len: usize) -> Result<File> {
    create_unlinked_file(&fileio::unique_path(&std::env::temp_dir(), "map"), len)
}

/// Creates a sparse file of `len` bytes at `path` and removes the name at once: the open
/// descriptor keeps the file alive for the mappings, and nothing is left behind even when a
/// test kills the process. (Reading a hole still allocates a page-cache page on the first
/// fault, which is all the workload needs.)
fn create_unlinked_file(path: &Path, len: usize) -> Result<File> {
    let file = fileio::create_new(path)?;
    fs::remove_file(path).with_context(|| format!("removing {}", path.display()))?;
    let len = u64::try_from(len).context("map size does not fit in a file length")?;
    file.set_len(len)
        .with_context(|| format!("extending {} to {len} bytes", path.display()))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::protocol::{field, lines};

    fn args(source: Source) -> ChurnArgs {
        ChurnArgs {
            threads: 2,
            seconds: Duration::from_secs(60),
            iterations: Some(2),
            map_size: 256 * 1024,
            source,
            writer: false,
            writer_size: 1 << 20,
            hogs: 0,
            together: false,
        }
    }

    /// Runs churn and returns its single summary line.
    fn summary(args: &ChurnArgs) -> String {
        let mut output = Vec::new();
        run(args, &mut output).expect("churn runs");
        let lines = lines(&output);
        assert_eq!(lines.len(), 1, "{lines:?}");
        lines[0].clone()
    }

    #[test]
    fn iterations_count_every_worker() {
        let line = summary(&args(Source::Anon));
        assert!(line.starts_with("iterations="), "{line}");
        assert_eq!(field(&line, "iterations"), 4);
        assert_eq!(field(&line, "writer_iterations"), 0);
        assert!(field(&line, "elapsed_ns") > 0);
        assert!(line.ends_with(" hogs=0"), "{line}");
    }

    #[test]
    fn hogs_spin_beside_the_workers_and_are_reported_last() {
        let mut args = args(Source::Anon);
        args.hogs = 3;
        let line = summary(&args);
        assert_eq!(field(&line, "iterations"), 4);
        assert!(line.ends_with(" hogs=3"), "{line}");
    }

    #[test]
    fn a_hog_checks_the_stop_flag_between_batches() {
        // Already stopped: exactly one batch of spins, then it returns.
        assert_eq!(burn_cpu(&AtomicBool::new(true)), 1000);
        let stop = AtomicBool::new(false);
        let spins = thread::scope(|scope| {
            let hog = scope.spawn(|| burn_cpu(&stop));
            thread::sleep(std::time::Duration::from_millis(20));
            stop.store(true, Ordering::Relaxed);
            hog.join().expect("hog joins")
        });
        // It stopped (the join returned), at a batch boundary.
        assert_eq!(spins % 1000, 0, "{spins}");
    }

    #[test]
    fn iterations_win_over_seconds() {
        let mut args = args(Source::Anon);
        args.seconds = Duration::ZERO;
        args.iterations = Some(3);
        assert_eq!(field(&summary(&args), "iterations"), 6);
    }

    #[test]
    fn file_source_maps_a_temp_file() {
        let line = summary(&args(Source::File));
        assert_eq!(field(&line, "iterations"), 4);
    }

    #[test]
    fn writer_runs_at_least_once() {
        let mut args = args(Source::Anon);
        args.writer = true;
        let line = summary(&args);
        assert_eq!(field(&line, "iterations"), 4);
        assert!(field(&line, "writer_iterations") >= 1, "{line}");
    }

    #[test]
    fn seconds_bound_the_run() {
        let mut args = args(Source::Anon);
        args.iterations = None;
        args.seconds = Duration::from_millis(200);
        let line = summary(&args);
        assert!(field(&line, "iterations") >= 2, "{line}");
        let elapsed = field(&line, "elapsed_ns");
        assert!((200_000_000..5_000_000_000).contains(&elapsed), "{line}");
    }

    #[test]
    fn an_unmappable_size_fails_with_the_call_named() {
        let mut args = args(Source::Anon);
        // More address space than x86-64 user space has.
        args.map_size = 1 << 62;
        let error = run(&args, &mut Vec::new()).expect_err("mapping must fail");
        let message = format!("{error:#}");
        assert!(message.contains("mmap("), "{message}");
        assert!(message.contains("os error 12"), "{message}");
    }

    #[test]
    fn budgets() {
        assert!(Budget::Iterations(2).allows(1));
        assert!(!Budget::Iterations(2).allows(2));
        assert!(!Budget::Until(Instant::now()).allows(0));
        assert!(Budget::Until(Instant::now() + Duration::from_secs(60)).allows(u64::MAX));
    }

    #[test]
    fn backing_file_is_sized_and_leaves_no_name_behind() {
        let path = fileio::unique_path(&std::env::temp_dir(), "map");
        let file = create_unlinked_file(&path, 12345).expect("temp file");
        assert_eq!(file.metadata().expect("metadata").len(), 12345);
        assert!(!path.exists(), "{} still exists", path.display());
    }
}
