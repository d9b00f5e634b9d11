//! Mode `churn`: the clamd pattern. Worker threads map a region, fault every page in and unmap
//! it, over and over. Each mmap() and munmap() takes the process's one mmap_lock for write, and
//! the first fault on every fresh anonymous VMA falls back from the per-VMA lock to mmap_lock,
//! so the workers queue behind each other and adding threads makes each iteration slower.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::{self, Scope, ScopedJoinHandle};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context, Result};

use crate::cli::{ChurnArgs, Source};
use crate::emit;
use crate::memory::{self, Backing, Region};

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
struct ChurnJob<'fd> {
    backing: Backing<'fd>,
    map_size: usize,
    page_size: usize,
    budget: Budget,
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
    let writer_size = args.writer.then_some(args.writer_size);
    let counts = run_threads(job, args.threads, writer_size)?;
    let elapsed = started.elapsed();
    emit(
        out,
        format_args!(
            "iterations={} writer_iterations={} elapsed_ns={}",
            counts.per_worker.iter().sum::<u64>(),
            counts.writer,
            elapsed.as_nanos()
        ),
    )
}

/// Runs the workers (and the writer, when `writer_size` is given) to the end of the budget.
///
/// A failing thread raises `stop` so the others end early too; the first error is returned once
/// every thread has been joined.
fn run_threads(job: ChurnJob<'_>, threads: u32, writer_size: Option<usize>) -> Result<Counts> {
    let stop = AtomicBool::new(false);
    thread::scope(|scope| {
        let spawned = spawn_all(scope, job, threads, writer_size, &stop);
        let (workers, writer) = spawned.inspect_err(|_| stop.store(true, Ordering::Relaxed))?;
        let per_worker: Vec<Result<u64>> = workers.into_iter().map(join_counted).collect();
        // The writer only adds pressure: it runs until the workers are done.
        stop.store(true, Ordering::Relaxed);
        let writer = writer.map(join_counted).transpose();
        Ok(Counts {
            per_worker: per_worker.into_iter().collect::<Result<_>>()?,
            writer: writer?.unwrap_or(0),
        })
    })
}

type Handle<'scope> = ScopedJoinHandle<'scope, Result<u64>>;

fn spawn_all<'scope, 'env>(
    scope: &'scope Scope<'scope, 'env>,
    job: ChurnJob<'env>,
    threads: u32,
    writer_size: Option<usize>,
    stop: &'env AtomicBool,
) -> Result<(Vec<Handle<'scope>>, Option<Handle<'scope>>)> {
    let workers = (0..threads)
        .map(|index| {
            spawn_named(scope, format!("churn-{index}"), move || {
                churn_worker(job, stop)
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let writer = writer_size
        .map(|size| spawn_named(scope, "writer".to_owned(), move || writer_loop(size, stop)))
        .transpose()?;
    Ok((workers, writer))
}

/// Spawns a scoped thread named `name` (the name shows up as the thread's comm in traces).
fn spawn_named<'scope, 'env, F>(
    scope: &'scope Scope<'scope, 'env>,
    name: String,
    body: F,
) -> Result<Handle<'scope>>
where
    F: FnOnce() -> Result<u64> + Send + 'scope,
{
    thread::Builder::new()
        .name(name.clone())
        .spawn_scoped(scope, body)
        .with_context(|| format!("spawning thread {name}"))
}

fn join_counted(handle: Handle<'_>) -> Result<u64> {
    let name = handle.thread().name().unwrap_or("unnamed").to_owned();
    handle
        .join()
        .map_err(|_| anyhow!("thread {name} panicked"))?
        .with_context(|| format!("thread {name}"))
}

/// One worker: map, fault in, unmap until the budget runs out or another thread fails.
#[inline(never)]
fn churn_worker(job: ChurnJob<'_>, stop: &AtomicBool) -> Result<u64> {
    let mut done = 0;
    while job.budget.allows(done) && !stop.load(Ordering::Relaxed) {
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

/// Creates the file the `file` source maps: `len` bytes in the temp directory under a unique
/// name.
fn create_backing_file(len: usize) -> Result<File> {
    create_unlinked_file(&unique_temp_path(), len)
}

/// Creates a sparse file of `len` bytes at `path` and removes the name at once: the open
/// descriptor keeps the file alive for the mappings, and nothing is left behind even when a
/// test kills the process. (Reading a hole still allocates a page-cache page on the first
/// fault, which is all the workload needs.)
fn create_unlinked_file(path: &Path, len: usize) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    fs::remove_file(path).with_context(|| format!("removing {}", path.display()))?;
    let len = u64::try_from(len).context("map size does not fit in a file length")?;
    file.set_len(len)
        .with_context(|| format!("extending {} to {len} bytes", path.display()))?;
    Ok(file)
}

/// A path no other run (nor another call in this process) uses.
fn unique_temp_path() -> PathBuf {
    static CREATED: AtomicU64 = AtomicU64::new(0);
    let serial = CREATED.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since_epoch| since_epoch.as_nanos());
    std::env::temp_dir().join(format!(
        "mmapsem-workload-{}-{nanos}-{serial}.map",
        process::id()
    ))
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
        let path = unique_temp_path();
        assert_ne!(path, unique_temp_path());
        let file = create_unlinked_file(&path, 12345).expect("temp file");
        assert_eq!(file.metadata().expect("metadata").len(), 12345);
        assert!(!path.exists(), "{} still exists", path.display());
    }
}
