//! Mode `files`: Edwin's read-vs-mmap comparison (LKML, 2008: clamd scanning files). Threads
//! take files from a shared list over and over, as a scanner's workers take them from its
//! queue, open each, and read it either with pread() into a buffer, which needs no mmap_lock at
//! all once the buffer is faulted in, or by mapping it, reading one byte per page and unmapping
//! it, which takes mmap_lock for write twice per file (mmap and munmap) so that the threads
//! queue on it. pread scales with threads; mmap does not. With tens of thousands of small files
//! (`--files 20000 --file-size 1K-16K`) the lock is taken hundreds of thousands of times a
//! second: the heaviest load a tracer of it meets in practice.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::cli::{FilesArgs, ReadMethod, SizeRange};
use crate::emit;
use crate::fileio::{self, ScratchDir};
use crate::memory::{self, Backing, Region};
use crate::start::Start;
use crate::threads::{join_named, spawn_named};

/// pread() size: large enough for few syscalls, as a scanner reading a file would use.
const PREAD_CHUNK: usize = 1 << 20;

/// Creates the files, waits at the start gates, reads until the deadline and prints the
/// summary. The files are made before the gates: writing tens of thousands of them takes a
/// while that is neither work nor something a tracer attached meanwhile should see.
pub fn run(args: &FilesArgs, start: Start, out: &mut dyn Write) -> Result<()> {
    let set = FileSet::create(&args.dir, args.files, args.file_size)?;
    start.begin(out)?;
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let job = ReadJob {
        files: &set.files,
        next: &next,
        method: args.method,
        largest: args.file_size.max,
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

/// One of the files the threads read. It is opened for each read, as a scanner does, which
/// also keeps tens of thousands of files within any limit on open descriptors.
#[derive(Debug)]
struct DataFile {
    path: PathBuf,
    len: usize,
}

impl DataFile {
    fn open(&self) -> Result<File> {
        File::open(&self.path).with_context(|| format!("opening {}", self.path.display()))
    }
}

/// The files, in a fresh directory removed with them when the set is dropped.
#[derive(Debug)]
struct FileSet {
    files: Vec<DataFile>,
    _dir: ScratchDir,
}

impl FileSet {
    /// Creates `count` files of non-zero bytes, sized by `sizes`. They are left in the page
    /// cache (no fsync, no dropping): the comparison is about the locking, not the disk.
    fn create(parent: &Path, count: u32, sizes: SizeRange) -> Result<Self> {
        let dir = ScratchDir::create(parent)?;
        let files = (0..count)
            .map(|index| {
                let path = dir.path().join(format!("file-{index}"));
                let len = size_of_file(sizes, index);
                let mut file = fileio::create_new(&path)?;
                fileio::fill(&mut file, len, &path)?;
                Ok(DataFile { path, len })
            })
            .collect::<Result<_>>()?;
        Ok(Self { files, _dir: dir })
    }
}

/// The size of file `index`: log-uniform over `sizes` (as many files of 1-2 KiB as of 8-16
/// KiB, as in real trees, where small files are the many), picked by a hash of the index so
/// that every run makes the same files.
fn size_of_file(sizes: SizeRange, index: u32) -> usize {
    if sizes.min == sizes.max {
        return sizes.min;
    }
    // The top 53 bits of the hash: a uniform f64 in [0, 1).
    let unit = (splitmix64(u64::from(index)) >> 11) as f64 / (1u64 << 53) as f64;
    let (min, max) = (sizes.min as f64, sizes.max as f64);
    let size = (min * (max / min).powf(unit)).round() as usize;
    size.clamp(sizes.min, sizes.max)
}

/// SplitMix64's output function: consecutive inputs give unrelated, well-spread outputs.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What every reading thread does.
#[derive(Debug, Clone, Copy)]
struct ReadJob<'files> {
    files: &'files [DataFile],
    /// The shared cursor into `files`: each take goes to one thread, like a work queue.
    next: &'files AtomicUsize,
    method: ReadMethod,
    /// The largest file's size, for pread's buffer.
    largest: usize,
    page_size: usize,
    deadline: Instant,
}

impl ReadJob<'_> {
    /// The next file in the list, round and round.
    fn take(&self) -> &DataFile {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        &self.files[index % self.files.len()]
    }
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
                    files_worker(job, stop).inspect_err(|_| stop.store(true, Ordering::Relaxed))
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

/// One thread: reads whole files taken from the shared list until the deadline (at least one
/// file, so a short run still reads) or until another thread fails.
#[inline(never)]
fn files_worker(job: ReadJob<'_>, stop: &AtomicBool) -> Result<Tally> {
    // Per thread, allocated once: after its first pass the buffer takes no more page faults.
    let mut buffer = match job.method {
        ReadMethod::Pread => vec![0; job.largest],
        ReadMethod::Mmap => Vec::new(),
    };
    let mut tally = Tally::default();
    loop {
        let file = job.take();
        let bytes = match job.method {
            ReadMethod::Pread => read_file_pread(file, &mut buffer[..file.len])?,
            ReadMethod::Mmap => read_file_mmap(file, job.page_size)?,
        };
        tally = tally.add(Tally {
            files: 1,
            bytes: bytes as u64,
        });
        if Instant::now() >= job.deadline || stop.load(Ordering::Relaxed) {
            return Ok(tally);
        }
    }
}

/// Reads the file into `buffer` (as much as it holds) with pread() in 1 MiB chunks. Returns
/// the bytes read.
#[inline(never)]
fn read_file_pread(file: &DataFile, buffer: &mut [u8]) -> Result<usize> {
    let opened = file.open()?;
    let mut offset = 0u64;
    for chunk in buffer.chunks_mut(PREAD_CHUNK) {
        fileio::pread_exact(&opened, chunk, offset, &file.path.display())?;
        offset += chunk.len() as u64;
    }
    Ok(buffer.len())
}

/// Maps the file, reads one byte of every page and unmaps it. Returns the bytes mapped.
#[inline(never)]
fn read_file_mmap(file: &DataFile, page_size: usize) -> Result<usize> {
    let opened = file.open()?;
    let region = map_file(&opened, file.len)?;
    memory::read_pages(&region, page_size);
    unmap_file(region)?;
    Ok(file.len)
}

/// mmap() of the file, private and read-only: mmap_lock for write.
#[inline(never)]
fn map_file(file: &File, len: usize) -> Result<Region> {
    memory::map_region(len, Backing::File(file.as_fd()))
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
            file_size: SizeRange::exactly(256 * 1024),
            seconds: Duration::ZERO,
            dir: std::env::temp_dir(),
        }
    }

    /// The mode's output after `started`: its summary line.
    fn summary(args: &FilesArgs) -> String {
        let mut output = Vec::new();
        let start = Start {
            gate: None,
            delay: Duration::ZERO,
        };
        run(args, start, &mut output).expect("files runs");
        let lines = lines(&output);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines[0], "started");
        lines[1].clone()
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
    fn files_of_a_range_are_read_at_their_own_sizes() {
        let sizes = SizeRange {
            min: 1000,
            max: 20_000,
        };
        for method in [ReadMethod::Pread, ReadMethod::Mmap] {
            let line = summary(&FilesArgs {
                file_size: sizes,
                ..args(method)
            });
            // The two threads took the first two files of the list, one each.
            let expected = size_of_file(sizes, 0) + size_of_file(sizes, 1);
            assert_eq!(field(&line, "bytes"), expected as u64, "{line}");
        }
    }

    #[test]
    fn sizes_spread_over_the_range_and_repeat_from_run_to_run() {
        let sizes = SizeRange {
            min: 1024,
            max: 16 * 1024,
        };
        let picked: Vec<usize> = (0..1000).map(|index| size_of_file(sizes, index)).collect();
        assert!(picked.iter().all(|size| (1024..=16 * 1024).contains(size)));
        // Log-uniform: the geometric middle (4 KiB) splits them about in half.
        let below = picked.iter().filter(|&&size| size < 4096).count();
        assert!((400..600).contains(&below), "{below} of 1000 below 4 KiB");
        let again: Vec<usize> = (0..1000).map(|index| size_of_file(sizes, index)).collect();
        assert_eq!(picked, again);
        assert_eq!(size_of_file(SizeRange::exactly(4096), 7), 4096);
    }

    #[test]
    fn the_files_have_their_picked_sizes() {
        let sizes = SizeRange { min: 1, max: 9000 };
        let set = FileSet::create(&std::env::temp_dir(), 5, sizes).expect("files");
        for (index, file) in (0..).zip(&set.files) {
            assert_eq!(file.len, size_of_file(sizes, index));
            let on_disk = std::fs::metadata(&file.path).expect("metadata").len();
            assert_eq!(on_disk, file.len as u64, "{}", file.path.display());
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
        let start = Start {
            gate: None,
            delay: Duration::ZERO,
        };
        let error = run(&args, start, &mut Vec::new()).expect_err("must fail");
        let message = format!("{error:#}");
        assert!(message.contains("/nonexistent/mmapsem"), "{message}");
        assert!(message.contains("os error 2"), "{message}");
    }

    #[test]
    fn both_readers_see_the_files_bytes() {
        let len = 3 * PREAD_CHUNK / 2;
        let set =
            FileSet::create(&std::env::temp_dir(), 1, SizeRange::exactly(len)).expect("files");
        let file = &set.files[0];
        let mut buffer = vec![0; len];
        assert_eq!(read_file_pread(file, &mut buffer).expect("pread"), len);
        // Byte 5 of the second 1 MiB chunk: the chunks land at the right offsets.
        assert_eq!(buffer[PREAD_CHUNK + 5], fileio::filler_byte(5));
        assert!(buffer.iter().all(|&byte| byte != 0));

        let page = memory::page_size().expect("page size");
        assert_eq!(read_file_mmap(file, page).expect("mmap read"), len);
    }

    #[test]
    fn a_file_shorter_than_the_buffer_fails_naming_it() {
        let set =
            FileSet::create(&std::env::temp_dir(), 1, SizeRange::exactly(1000)).expect("files");
        let file = &set.files[0];
        let error = read_file_pread(file, &mut [0; 2000]).expect_err("must fail");
        let message = error.to_string();
        let expected = format!("pread({}, 1000 bytes at offset 0x3e8)", file.path.display());
        assert!(message.starts_with(&expected), "{message}");
    }

    #[test]
    fn a_file_gone_from_the_list_fails_naming_it() {
        let set =
            FileSet::create(&std::env::temp_dir(), 1, SizeRange::exactly(1000)).expect("files");
        let file = &set.files[0];
        std::fs::remove_file(&file.path).expect("remove");
        let page = memory::page_size().expect("page size");
        let message = format!("{:#}", read_file_mmap(file, page).expect_err("must fail"));
        let expected = format!("opening {}", file.path.display());
        assert!(message.starts_with(&expected), "{message}");
        assert!(message.contains("os error 2"), "{message}");
    }
}
