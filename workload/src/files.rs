//! Mode `files`: Edwin's read-vs-mmap comparison (LKML, 2008: clamd scanning files). Threads
//! read the same set of page-cached files over and over, either with pread() into a buffer,
//! which needs no mmap_lock at all once the buffer is faulted in, or by mapping each file,
//! reading one byte per page and unmapping it, which takes mmap_lock for write twice per file
//! (mmap and munmap) so that the threads queue on it. pread scales with threads; mmap does not.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Instant;

use anyhow::Result;

use crate::cli::{FilesArgs, ReadMethod};
use crate::emit;
use crate::fileio::{self, ScratchDir};
use crate::memory::{self, Backing, Region};
use crate::threads::{join_named, spawn_named};

/// pread() size: large enough for few syscalls, as a scanner reading a file would use.
const PREAD_CHUNK: usize = 1 << 20;

pub fn run(args: &FilesArgs, out: &mut dyn Write) -> Result<()> {
    let set = FileSet::create(&args.dir, args.files, args.file_size)?;
    let started = Instant::now();
    let job = ReadJob {
        files: &set.files,
        method: args.method,
        file_size: args.file_size,
        page_size: memory::page_size()?,
        deadline: started + args.seconds,
    };
    let tally = run_readers(job, args.threads)?;
    let elapsed = started.elapsed();
    emit(
        out,
        format_args!(
            "files_read={} bytes={} elapsed_ns={} method={}",
            tally.files,
            tally.bytes,
            elapsed.as_nanos(),
            method_name(args.method)
        ),
    )
}

fn method_name(method: ReadMethod) -> &'static str {
    match method {
        ReadMethod::Pread => "pread",
        ReadMethod::Mmap => "mmap",
    }
}

/// One of the files the threads read, with its name for error messages.
#[derive(Debug)]
struct DataFile {
    path: PathBuf,
    file: File,
}

/// The files, in a fresh directory removed with them when the set is dropped.
#[derive(Debug)]
struct FileSet {
    files: Vec<DataFile>,
    _dir: ScratchDir,
}

impl FileSet {
    /// Creates `count` files of `len` non-zero bytes. They are left in the page cache (no
    /// fsync, no dropping): the comparison is about the locking, not the disk.
    fn create(parent: &Path, count: u32, len: usize) -> Result<Self> {
        let dir = ScratchDir::create(parent)?;
        let files = (0..count)
            .map(|index| {
                let path = dir.path().join(format!("file-{index}"));
                let mut file = fileio::create_new(&path)?;
                fileio::fill(&mut file, len, &path)?;
                Ok(DataFile { path, file })
            })
            .collect::<Result<_>>()?;
        Ok(Self { files, _dir: dir })
    }
}

/// What every reading thread does.
#[derive(Debug, Clone, Copy)]
struct ReadJob<'files> {
    files: &'files [DataFile],
    method: ReadMethod,
    file_size: usize,
    page_size: usize,
    deadline: Instant,
}

/// What the threads read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Tally {
    files: u64,
    bytes: u64,
}

impl Tally {
    fn add(self, other: Tally) -> Tally {
        Tally {
            files: self.files + other.files,
            bytes: self.bytes + other.bytes,
        }
    }
}

/// Runs `threads` readers to the deadline; a failing one stops the others early, and the first
/// error is returned once all are joined.
fn run_readers(job: ReadJob<'_>, threads: u32) -> Result<Tally> {
    let stop = AtomicBool::new(false);
    thread::scope(|scope| {
        let readers = (0..threads)
            .map(|index| {
                let stop = &stop;
                spawn_named(scope, format!("files-{index}"), move || {
                    // Each thread starts at a different file, as scanners would.
                    let first = usize::try_from(index).unwrap_or(0) % job.files.len();
                    files_worker(job, first, stop)
                        .inspect_err(|_| stop.store(true, Ordering::Relaxed))
                })
            })
            .collect::<Result<Vec<_>>>()
            .inspect_err(|_| stop.store(true, Ordering::Relaxed))?;
        let tallies: Vec<Result<Tally>> = readers.into_iter().map(join_named).collect();
        tallies
            .into_iter()
            .try_fold(Tally::default(), |sum, tally| Ok(sum.add(tally?)))
    })
}

/// One thread: reads whole files, round-robin from `first`, until the deadline (at least one
/// file, so a short run still reads) or until another thread fails.
#[inline(never)]
fn files_worker(job: ReadJob<'_>, first: usize, stop: &AtomicBool) -> Result<Tally> {
    // Per thread, allocated once: after its first pass the buffer takes no more page faults.
    let mut buffer = match job.method {
        ReadMethod::Pread => vec![0; job.file_size],
        ReadMethod::Mmap => Vec::new(),
    };
    let mut tally = Tally::default();
    for file in job.files.iter().cycle().skip(first) {
        let bytes = match job.method {
            ReadMethod::Pread => read_file_pread(file, &mut buffer)?,
            ReadMethod::Mmap => read_file_mmap(file, job.file_size, job.page_size)?,
        };
        tally = tally.add(Tally {
            files: 1,
            bytes: bytes as u64,
        });
        if Instant::now() >= job.deadline || stop.load(Ordering::Relaxed) {
            break;
        }
    }
    Ok(tally)
}

/// Reads the whole file into `buffer` (its size) with pread() in 1 MiB chunks. Returns the
/// bytes read.
#[inline(never)]
fn read_file_pread(file: &DataFile, buffer: &mut [u8]) -> Result<usize> {
    let mut offset = 0u64;
    for chunk in buffer.chunks_mut(PREAD_CHUNK) {
        fileio::pread_exact(&file.file, chunk, offset, &file.path.display())?;
        offset += chunk.len() as u64;
    }
    Ok(buffer.len())
}

/// Maps the file, reads one byte of every page and unmaps it. Returns the bytes mapped.
#[inline(never)]
fn read_file_mmap(file: &DataFile, len: usize, page_size: usize) -> Result<usize> {
    let region = map_file(file, len)?;
    memory::read_pages(&region, page_size);
    unmap_file(region)?;
    Ok(len)
}

/// mmap() of the file, private and read-only: mmap_lock for write.
#[inline(never)]
fn map_file(file: &DataFile, len: usize) -> Result<Region> {
    memory::map_region(len, Backing::File(file.file.as_fd()))
}

/// munmap() of a file mapping: mmap_lock for write.
#[inline(never)]
fn unmap_file(region: Region) -> Result<()> {
    memory::unmap_region(region)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::protocol::{field, lines};

    fn args(method: ReadMethod) -> FilesArgs {
        FilesArgs {
            method,
            threads: 2,
            files: 3,
            file_size: 256 * 1024,
            seconds: Duration::ZERO,
            dir: std::env::temp_dir(),
        }
    }

    fn summary(args: &FilesArgs) -> String {
        let mut output = Vec::new();
        run(args, &mut output).expect("files runs");
        let lines = lines(&output);
        assert_eq!(lines.len(), 1, "{lines:?}");
        lines[0].clone()
    }

    #[test]
    fn each_method_reads_whole_files_and_names_itself() {
        for (method, name) in [(ReadMethod::Pread, "pread"), (ReadMethod::Mmap, "mmap")] {
            let line = summary(&args(method));
            // No time at all still reads one file per thread.
            assert_eq!(field(&line, "files_read"), 2, "{line}");
            assert_eq!(field(&line, "bytes"), 2 * 256 * 1024, "{line}");
            assert!(field(&line, "elapsed_ns") > 0, "{line}");
            assert!(line.ends_with(&format!(" method={name}")), "{line}");
        }
    }

    #[test]
    fn the_file_directory_is_removed_afterwards() {
        let parent = fileio::ScratchDir::create(&std::env::temp_dir()).expect("parent");
        let mut args = args(ReadMethod::Mmap);
        args.dir = parent.path().to_owned();
        summary(&args);
        let left: Vec<_> = std::fs::read_dir(parent.path()).expect("list").collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_missing_directory_fails_naming_it() {
        let mut args = args(ReadMethod::Pread);
        args.dir = PathBuf::from("/nonexistent/mmapsem");
        let error = run(&args, &mut Vec::new()).expect_err("must fail");
        let message = format!("{error:#}");
        assert!(message.contains("/nonexistent/mmapsem"), "{message}");
        assert!(message.contains("os error 2"), "{message}");
    }

    #[test]
    fn both_readers_see_the_files_bytes() {
        let set = FileSet::create(&std::env::temp_dir(), 1, 3 * PREAD_CHUNK / 2).expect("files");
        let file = &set.files[0];
        let mut buffer = vec![0; 3 * PREAD_CHUNK / 2];
        assert_eq!(
            read_file_pread(file, &mut buffer).expect("pread"),
            buffer.len()
        );
        // Byte 5 of the second 1 MiB chunk: the chunks land at the right offsets.
        assert_eq!(buffer[PREAD_CHUNK + 5], fileio::filler_byte(5));
        assert!(buffer.iter().all(|&byte| byte != 0));

        let page = memory::page_size().expect("page size");
        let len = read_file_mmap(file, buffer.len(), page).expect("mmap read");
        assert_eq!(len, buffer.len());
    }

    #[test]
    fn a_file_shorter_than_the_buffer_fails_naming_it() {
        let set = FileSet::create(&std::env::temp_dir(), 1, 1000).expect("files");
        let file = &set.files[0];
        let error = read_file_pread(file, &mut [0; 2000]).expect_err("must fail");
        let message = error.to_string();
        let expected = format!("pread({}, 1000 bytes at offset 0x3e8)", file.path.display());
        assert!(message.starts_with(&expected), "{message}");
    }
}
