//! Modes `filemap` and `proc-mem-read`: a holder of mmap_lock asleep on disk I/O, from outside
//! the process.
//!
//! Reading another process's memory (/proc/<pid>/mem here; cmdline and environ work the same
//! way, which is how ps and top ran into it) goes through access_remote_vm(). That takes the
//! target's mmap_lock for read and, where a page is not in memory, faults it in while holding
//! the lock, without the retry that lets the target's own faults drop the lock during I/O. When
//! the page must come from disk, every mmap() and munmap() in the target waits for the disk.
//! `filemap` is the target: a file mapped but never touched, plus threads that need the write
//! lock. `proc-mem-read` is the outside reader.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::churn::{self, ChurnJob};
use crate::cli::{FilemapArgs, ProcMemReadArgs};
use crate::emit;
use crate::fileio::{self, ScratchFile};
use crate::memory;
use crate::start::Start;
use crate::threads::{join_named, spawn_named};

/// Mode `filemap`: creates and maps the file, prints `mapped ...` before waiting at the start
/// gates, then churns anonymous mappings in `--threads` threads. The mapping is never touched
/// here: only an outside reader faults its pages in.
pub fn run_filemap(args: &FilemapArgs, start: Start, out: &mut dyn Write) -> Result<()> {
    let scratch = create_clean_file(&args.dir, args.file_size)?;
    let mapping = memory::map_shared_file(args.file_size, scratch.file().as_fd())?;
    // The path goes last: the one field that could contain spaces.
    emit(
        out,
        format_args!(
            "mapped addr={:#x} len={} file={}",
            mapping.start().addr(),
            mapping.len(),
            scratch.path().display()
        ),
    )?;
    start.begin(out)?;
    let started = Instant::now();
    let job = ChurnJob::anonymous_until(args.map_size, started + args.seconds)?;
    let iterations = run_mappers(job, args.threads)?;
    emit(
        out,
        format_args!(
            "iterations={iterations} elapsed_ns={}",
            started.elapsed().as_nanos()
        ),
    )?;
    memory::unmap_region(mapping)
}

/// Creates the file and writes it back to disk, so that nothing dirty pins its pages: dropping
/// them from the page cache must really drop them.
fn create_clean_file(dir: &Path, len: usize) -> Result<ScratchFile> {
    let scratch = ScratchFile::create(dir, "filemap", len)?;
    scratch
        .file()
        .sync_all()
        .with_context(|| format!("fsync({})", scratch.path().display()))?;
    Ok(scratch)
}

/// Runs `threads` threads of anonymous map/touch/unmap to the job's deadline; returns their
/// total iterations.
fn run_mappers(job: ChurnJob<'_>, threads: u32) -> Result<u64> {
    let stop = AtomicBool::new(false);
    thread::scope(|scope| {
        let mappers = (0..threads)
            .map(|index| {
                let stop = &stop;
                spawn_named(scope, format!("mapper-{index}"), move || {
                    churn::churn_worker(job, stop)
                })
            })
            .collect::<Result<Vec<_>>>()
            .inspect_err(|_| stop.store(true, Ordering::Relaxed))?;
        let counts: Vec<Result<u64>> = mappers.into_iter().map(join_named).collect();
        counts.into_iter().sum()
    })
}

/// Mode `proc-mem-read`: per round, evicts the range's pages (unmapping them from the target,
/// then dropping the file from the page cache), then reads [addr, addr+len) of the target
/// through /proc/<pid>/mem and prints how long the reading took.
pub fn run_proc_mem_read(args: &ProcMemReadArgs, out: &mut dyn Write) -> Result<()> {
    let mem_path = PathBuf::from(format!("/proc/{}/mem", args.pid));
    let mut buffer = vec![0; args.chunk.min(args.len)];
    let mut total = 0u64;
    for _ in 0..args.rounds {
        // The previous round's faults left the pages mapped in the target, and the page cache
        // keeps mapped pages whatever fadvise says: unmap them first.
        page_out_remote(args.pid, args.addr, args.len)?;
        drop_cached_pages(&args.file)?;
        let mem =
            File::open(&mem_path).with_context(|| format!("opening {}", mem_path.display()))?;
        // Only the reading is timed: that is where the target's mmap_lock is held.
        let started = Instant::now();
        total += read_remote_memory(&mem, &mem_path, args.addr, args.len, &mut buffer)?;
        emit(
            out,
            format_args!("round_ns={}", started.elapsed().as_nanos()),
        )?;
    }
    emit(out, format_args!("rounds={} bytes={total}", args.rounds))
}

/// Unmaps [addr, addr+len) from the target's page tables and reclaims the pages, with
/// process_madvise(MADV_PAGEOUT) (root, or CAP_SYS_NICE and ptrace rights over the target).
/// This takes the target's mmap_lock for read too, but before the timed reading.
fn page_out_remote(pid: i32, addr: u64, len: usize) -> Result<()> {
    let pidfd = open_pidfd(pid)?;
    let range = libc::iovec {
        iov_base: usize::try_from(addr).context("address does not fit in a pointer")?
            as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: `range` is one valid iovec; the kernel only reads it. The range itself is in the
    // other process, which the call checks.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_process_madvise,
            pidfd.as_raw_fd(),
            &range,
            1,
            libc::MADV_PAGEOUT,
            0,
        )
    };
    if rc == -1 {
        bail!(
            "process_madvise(pid {pid}, {addr:#x}, {len} bytes, MADV_PAGEOUT) failed: {}",
            io::Error::last_os_error()
        );
    }
    Ok(())
}

fn open_pidfd(pid: i32) -> Result<OwnedFd> {
    // SAFETY: pidfd_open has no memory-safety preconditions.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = libc::c_int::try_from(rc).unwrap_or(-1);
    if fd == -1 {
        bail!("pidfd_open({pid}) failed: {}", io::Error::last_os_error());
    }
    // SAFETY: pidfd_open returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Asks the kernel to drop the file's pages from the page cache. It only drops clean pages that
/// no page table maps.
fn drop_cached_pages(path: &Path) -> Result<()> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: posix_fadvise has no memory-safety preconditions.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        // posix_fadvise returns the error number instead of setting errno.
        bail!(
            "posix_fadvise({}, POSIX_FADV_DONTNEED) failed: {}",
            path.display(),
            io::Error::from_raw_os_error(rc)
        );
    }
    Ok(())
}

/// Reads `len` bytes at `addr` of the process behind `mem` (its /proc/<pid>/mem, named by
/// `mem_path` in errors), `buffer.len()` bytes per pread(). Returns the bytes read.
///
/// Each pread() walks its range a page at a time, and each page is one access_remote_vm(): the
/// target's mmap_lock is taken for read, the page faulted in if needed (from disk, if it left
/// the page cache) and the lock released.
#[inline(never)]
fn read_remote_memory(
    mem: &File,
    mem_path: &Path,
    addr: u64,
    len: usize,
    buffer: &mut [u8],
) -> Result<u64> {
    let mut done = 0;
    while done < len {
        let now = (len - done).min(buffer.len());
        let at = addr + done as u64;
        fileio::pread_exact(mem, &mut buffer[..now], at, &mem_path.display())?;
        done += now;
    }
    Ok(done as u64)
}

#[cfg(test)]
mod tests {
    use std::process;
    use std::time::Duration;

    use super::*;
    use crate::memory::Region;
    use crate::protocol::{field, lines};

    /// A clean file of `pages` pages, mapped shared in this process and not touched.
    fn mapped_file(pages: usize) -> (ScratchFile, Region, usize) {
        let page = memory::page_size().expect("page size");
        let scratch = create_clean_file(&std::env::temp_dir(), pages * page).expect("file");
        let region = memory::map_shared_file(pages * page, scratch.file().as_fd()).expect("mmap");
        (scratch, region, page)
    }

    fn resident(region: &Region, page: usize) -> usize {
        memory::query_residency(region, page, &mut Vec::new()).expect("mincore")
    }

    fn self_mem() -> (File, PathBuf) {
        let path = PathBuf::from("/proc/self/mem");
        (File::open(&path).expect("open /proc/self/mem"), path)
    }

    #[test]
    fn remote_reads_return_the_mapped_files_bytes_in_chunks() {
        let (_scratch, region, _) = mapped_file(4);
        let (mem, path) = self_mem();
        // 4096 + 4096 + 1808: the last chunk is a short one.
        let mut buffer = vec![0; 4096];
        let addr = region.start().addr() as u64;
        let read = read_remote_memory(&mem, &path, addr, 10_000, &mut buffer).expect("read");
        assert_eq!(read, 10_000);
        let expected: Vec<u8> = (8192..10_000).map(fileio::filler_byte).collect();
        assert_eq!(&buffer[..1808], expected.as_slice());
    }

    #[test]
    fn reading_an_unmapped_address_fails_naming_the_file() {
        let (mem, path) = self_mem();
        let error = read_remote_memory(&mem, &path, 0, 10, &mut [0; 10]).expect_err("address 0");
        let message = error.to_string();
        assert!(
            message.starts_with("pread(/proc/self/mem, 10 bytes at offset 0x0)"),
            "{message}"
        );
        assert!(message.contains("os error 5"), "{message}");
    }

    /// The reason for page_out_remote: fadvise drops clean pages that nothing maps, but not the
    /// ones a read through /proc/<pid>/mem has mapped into the target.
    #[test]
    fn dropping_cached_pages_needs_them_unmapped_first() {
        let (scratch, region, page) = mapped_file(64);
        // mincore() on a file mapping reports page-cache residency: writing the file cached it.
        assert_eq!(resident(&region, page), 64);
        drop_cached_pages(scratch.path()).expect("fadvise");
        assert_eq!(resident(&region, page), 0);

        let (mem, path) = self_mem();
        let addr = region.start().addr() as u64;
        read_remote_memory(&mem, &path, addr, region.len(), &mut vec![0; 16 * page]).expect("read");
        assert_eq!(resident(&region, page), 64);
        drop_cached_pages(scratch.path()).expect("fadvise");
        assert_eq!(resident(&region, page), 64, "mapped pages stay cached");

        let pid = i32::try_from(process::id()).expect("pid fits");
        page_out_remote(pid, addr, region.len()).expect("process_madvise");
        drop_cached_pages(scratch.path()).expect("fadvise");
        assert_eq!(resident(&region, page), 0);
    }

    #[test]
    fn failures_name_the_call() {
        let error = page_out_remote(i32::MAX, 0, 4096).expect_err("no such process");
        let message = error.to_string();
        assert!(
            message.starts_with(&format!("pidfd_open({})", i32::MAX)),
            "{message}"
        );
        assert!(message.contains("os error 3"), "{message}");

        let error = drop_cached_pages(Path::new("/nonexistent/file")).expect_err("no file");
        let message = format!("{error:#}");
        assert!(
            message.starts_with("opening /nonexistent/file"),
            "{message}"
        );
    }

    #[test]
    fn filemap_prints_the_mapping_before_started_and_removes_its_file() {
        let args = FilemapArgs {
            file_size: 256 * 1024,
            dir: std::env::temp_dir(),
            threads: 1,
            seconds: Duration::ZERO,
            map_size: 64 * 1024,
        };
        let start = Start {
            gate: None,
            delay: Duration::ZERO,
        };
        let mut output = Vec::new();
        run_filemap(&args, start, &mut output).expect("filemap runs");
        let lines = lines(&output);
        assert_eq!(lines.len(), 3, "{lines:?}");

        let mapped = lines[0]
            .strip_prefix("mapped addr=0x")
            .expect("mapped line");
        let (addr, rest) = mapped.split_once(' ').expect("fields");
        assert_ne!(u64::from_str_radix(addr, 16).expect("hex address"), 0);
        assert_eq!(field(rest, "len"), 256 * 1024);
        let file = rest.split_once(" file=").expect("file field").1;
        assert!(
            file.starts_with(&*std::env::temp_dir().to_string_lossy()),
            "{file}"
        );
        assert!(!Path::new(file).exists(), "{file} is left behind");

        assert_eq!(lines[1], "started");
        // No time to churn: the count only has to be there.
        field(&lines[2], "iterations");
        field(&lines[2], "elapsed_ns");
    }
}
