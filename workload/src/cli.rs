//! Command line: global start gating plus one subcommand per workload mode.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Reproduces mmap_lock contention on demand (the 2008 clamd problem: many threads mapping,
/// faulting and unmapping, where adding threads makes the whole process slower).
///
/// Prints `ready pid=<pid>` first, `started` when the work begins and a summary at the end.
#[derive(Debug, Parser)]
#[command(name = "mmapsem-workload", version)]
pub struct Cli {
    /// Seconds to sleep before the work starts (after SIGUSR1 when --wait-signal is also given).
    #[arg(
        long,
        global = true,
        display_order = 100,
        value_name = "SECS",
        default_value = "0",
        value_parser = parse_seconds
    )]
    pub start_delay: Duration,

    /// Stay idle until SIGUSR1 arrives, so a tracer can attach to the pid first.
    #[arg(long, global = true, display_order = 101)]
    pub wait_signal: bool,

    /// End the map/unmap loops early when standard input closes (--seconds stays the limit):
    /// a caller ends the work when it has seen enough, however slow the machine.
    #[arg(long, global = true, display_order = 102)]
    pub until_stdin_closes: bool,

    #[command(subcommand)]
    pub mode: Mode,
}

#[derive(Debug, Subcommand)]
pub enum Mode {
    /// Worker threads that map, fault in and unmap regions in a loop.
    Churn(ChurnArgs),
    /// Hold mmap_lock for write for a known time with mprotect() over a large region.
    Hold(HoldArgs),
    /// Threads that only sleep, then exit.
    Idle(IdleArgs),
    /// Start short-lived processes one after another, as a shell loop or a build does: each
    /// runs a program that exits at once, waited for before the next.
    Spawn(SpawnArgs),
    /// Threads faulting pages of one region in and out beside a thread whose mprotect() splits
    /// and merges that region's VMA: mmap_lock write holds that wait for the per-VMA lock.
    VmaLock(VmaLockArgs),
    /// Threads reading a set of files over and over, with pread() or through mmap().
    Files(FilesArgs),
    /// Map a file without touching it (for proc-mem-read to fault in), while threads churn
    /// anonymous mappings.
    Filemap(FilemapArgs),
    /// From outside, read another process's memory through /proc/<pid>/mem after dropping the
    /// file behind it from the page cache.
    ProcMemRead(ProcMemReadArgs),
    /// A hostile target: abuse its own files (see --kind), then map and unmap in a loop.
    Hostile(HostileArgs),
}

#[derive(Debug, Args)]
pub struct HostileArgs {
    /// What to do: fifo and replaced act on the running executable (a copy named hostile-*).
    #[arg(long, value_enum)]
    pub kind: HostileKind,

    /// Wall time to map and unmap for.
    #[arg(long, value_name = "SECS", default_value = "3", value_parser = parse_seconds)]
    pub seconds: Duration,

    /// Where `sparse` creates its 1 TiB file.
    #[arg(long, default_value = "/tmp")]
    pub dir: PathBuf,

    /// The ELF object `replaced` renames over the executable (default: the C library).
    #[arg(long)]
    pub decoy: Option<PathBuf>,

    /// The shared library `library-fifo` dlopens: it must export `void churn_lib(double
    /// seconds)`, which maps and unmaps for that long.
    #[arg(long, required_if_eq("kind", "library-fifo"))]
    pub library: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HostileKind {
    /// Replace the executable's file with a FIFO at the same path.
    Fifo,
    /// Rename another ELF object (--decoy, else a copy of libc) over the executable.
    Replaced,
    /// Map a 1 TiB sparse file PROT_READ|PROT_EXEC.
    Sparse,
    /// Name the process with an escape sequence and a newline.
    Names,
    /// dlopen --library, replace its file with a FIFO at the same path, then churn from inside
    /// the library.
    LibraryFifo,
}

impl HostileKind {
    pub fn name(self) -> &'static str {
        match self {
            HostileKind::Fifo => "fifo",
            HostileKind::Replaced => "replaced",
            HostileKind::Sparse => "sparse",
            HostileKind::Names => "names",
            HostileKind::LibraryFifo => "library-fifo",
        }
    }
}

#[derive(Debug, Args)]
pub struct ChurnArgs {
    /// Number of worker threads.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: u32,

    /// Wall time to run for (ignored when --iterations is given).
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = parse_seconds)]
    pub seconds: Duration,

    /// Iterations per worker thread; when given it wins over --seconds.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub iterations: Option<u64>,

    /// Size of each mapping, in bytes or with a binary suffix (64K, 4M, 1G).
    #[arg(long, value_name = "BYTES", default_value = "4M", value_parser = parse_size)]
    pub map_size: usize,

    /// What backs the mappings.
    #[arg(long, value_enum, default_value_t = Source::Anon)]
    pub source: Source,

    /// Add one thread that maps with MAP_POPULATE and unmaps large regions in a loop.
    #[arg(long)]
    pub writer: bool,

    /// Size of the writer thread's mappings (binary suffixes allowed).
    #[arg(long, value_name = "BYTES", default_value = "64M", value_parser = parse_size, requires = "writer")]
    pub writer_size: usize,

    /// Extra threads that only burn CPU until the workers finish, so lock holders get
    /// preempted.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub hogs: u32,

    /// Workers start once all of them exist, so that thousands really queue at once (started
    /// one by one while the others churn, each new thread's stack mmap() waits in their queue).
    #[arg(long)]
    pub together: bool,
}

/// What backs the churn workers' mappings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Source {
    /// Private anonymous memory, written page by page.
    Anon,
    /// A private read-only mapping of a temporary file, read page by page.
    File,
}

#[derive(Debug, Args)]
pub struct HoldArgs {
    /// Size of the region, in MiB.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    pub size_mib: u64,

    /// Number of timed mprotect() calls.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,

    /// Sleep before each mprotect() call, in milliseconds.
    #[arg(long, default_value_t = 50)]
    pub gap_ms: u64,

    /// Threads calling mincore() (a read of mmap_lock) in a loop while the mprotect() calls run.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub readers: u32,

    /// Run the first reader on a thread whose id equals the main thread's (the mprotect
    /// caller's) modulo M: threads are spawned and dropped until one has such an id. A tracer
    /// that keeps per-thread state at index tid % M sees both at one index.
    #[arg(long, value_name = "M", requires = "readers", value_parser = clap::value_parser!(u32).range(2..))]
    pub reader_tid_modulo: Option<u32>,
}

#[derive(Debug, Args)]
pub struct IdleArgs {
    /// Wall time before exiting.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_seconds)]
    pub seconds: Duration,

    /// Number of sleeping threads besides the main one.
    #[arg(long, default_value_t = 2)]
    pub threads: u32,
}

#[derive(Debug, Args)]
pub struct VmaLockArgs {
    /// Number of faulting threads.
    #[arg(long, default_value_t = 4)]
    pub threads: u32,

    /// Pages each faulting thread drops and faults in per round.
    #[arg(long, default_value_t = 64)]
    pub slice_pages: u32,

    /// Wall time to run for.
    #[arg(long, value_name = "SECS", default_value = "3", value_parser = parse_seconds)]
    pub seconds: Duration,
}

#[derive(Debug, Args)]
pub struct SpawnArgs {
    /// How many processes to start.
    #[arg(long, default_value_t = 100)]
    pub count: u32,

    /// At most this many a second (0: as fast as they run).
    #[arg(long, default_value_t = 0)]
    pub per_second: u32,

    /// The program each runs, without arguments.
    #[arg(long, default_value = "/bin/true")]
    pub program: PathBuf,
}

#[derive(Debug, Args)]
pub struct FilesArgs {
    /// How each file is read.
    #[arg(long, value_enum)]
    pub method: ReadMethod,

    /// Number of reading threads.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: u32,

    /// Number of files.
    #[arg(long, value_name = "K", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub files: u32,

    /// Size of each file (binary suffixes allowed), or a range MIN-MAX such as 1K-16K: sizes
    /// spread log-uniformly over it, the same on every run, as in a real tree (/usr/share)
    /// where small files are the many.
    #[arg(long, value_name = "BYTES|MIN-MAX", default_value = "4M", value_parser = parse_size_range)]
    pub file_size: SizeRange,

    /// Wall time to run for.
    #[arg(long, value_name = "SECS", default_value = "3", value_parser = parse_seconds)]
    pub seconds: Duration,

    /// Directory in which a fresh subdirectory holds the files while the mode runs.
    #[arg(long, value_name = "PATH", default_value_os_t = std::env::temp_dir())]
    pub dir: PathBuf,
}

/// The sizes of the `files` mode's files, `min == max` for a single size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeRange {
    pub min: usize,
    pub max: usize,
}

impl SizeRange {
    pub const fn exactly(size: usize) -> Self {
        Self {
            min: size,
            max: size,
        }
    }
}

/// How the `files` mode reads a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReadMethod {
    /// pread() into a buffer: no mmap_lock once the buffer is faulted in.
    Pread,
    /// mmap(), read one byte per page, munmap(): two write locks per file.
    Mmap,
}

#[derive(Debug, Args)]
pub struct FilemapArgs {
    /// Size of the mapped file (binary suffixes allowed).
    #[arg(long, value_name = "BYTES", default_value = "64M", value_parser = parse_size)]
    pub file_size: usize,

    /// Directory to create the file in.
    #[arg(long, value_name = "PATH", default_value_os_t = std::env::temp_dir())]
    pub dir: PathBuf,

    /// Number of threads churning anonymous mappings.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: u32,

    /// Wall time to churn for.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = parse_seconds)]
    pub seconds: Duration,

    /// Size of each churned mapping (binary suffixes allowed).
    #[arg(long, value_name = "BYTES", default_value = "1M", value_parser = parse_size)]
    pub map_size: usize,
}

#[derive(Debug, Args)]
pub struct ProcMemReadArgs {
    /// The process whose memory is read.
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    pub pid: i32,

    /// Start address in that process, in hex (`0x...`) or decimal.
    #[arg(long, value_name = "ADDRESS", value_parser = parse_address)]
    pub addr: u64,

    /// Number of bytes to read (binary suffixes allowed).
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub len: usize,

    /// The file mapped at that address, dropped from the page cache before each round.
    #[arg(long, value_name = "PATH")]
    pub file: PathBuf,

    /// Number of rounds.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,

    /// Bytes per pread() of /proc/<pid>/mem (binary suffixes allowed).
    #[arg(long, value_name = "BYTES", default_value = "1M", value_parser = parse_size)]
    pub chunk: usize,
}

/// Parses an address: `0x` followed by hex digits, or decimal digits (no sign).
pub fn parse_address(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let (digits, radix) = match trimmed
        .strip_prefix("0x")
        .or_else(|| trimmed.strip_prefix("0X"))
    {
        Some(hex) => (hex, 16),
        None => (trimmed, 10),
    };
    // from_str_radix alone would also take a leading `+`.
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(format!(
            "`{text}` is not an address (use 0x<hex> or decimal)"
        ));
    }
    u64::from_str_radix(digits, radix).map_err(|_| format!("`{text}` is too large"))
}

/// Parses a non-negative, finite number of seconds such as `5`, `0.25` or `1e-3`.
pub fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| format!("`{text}` is not a finite, non-negative number of seconds"))
}

/// Parses one size (`4M`) or a range of sizes (`1K-16K`), each as `parse_size`, the smaller
/// first.
pub fn parse_size_range(text: &str) -> Result<SizeRange, String> {
    let Some((min, max)) = text.split_once('-') else {
        return parse_size(text).map(SizeRange::exactly);
    };
    let range = SizeRange {
        min: parse_size(min)?,
        max: parse_size(max)?,
    };
    if range.min > range.max {
        return Err(format!("`{text}`: the smaller size goes first"));
    }
    Ok(range)
}

/// Parses a byte count: plain digits, or digits with a binary suffix K/M/G (1024-based; `KiB`,
/// `KB`, `k` all mean the same). Zero is refused: mmap() cannot map nothing.
pub fn parse_size(text: &str) -> Result<usize, String> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!("`{text}` does not start with a number of bytes"));
    }
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => {
            return Err(format!(
                "`{text}` has an unknown suffix `{suffix}` (use K, M or G)"
            ))
        }
    };
    let bytes = digits
        .parse::<u64>()
        .ok()
        .and_then(|count| count.checked_mul(1u64 << shift))
        .and_then(|bytes| usize::try_from(bytes).ok())
        .ok_or_else(|| format!("`{text}` is too large"))?;
    if bytes == 0 {
        return Err("the size must be at least one byte".to_owned());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("mmapsem-workload").chain(args.iter().copied()))
    }

    #[test]
    fn sizes_accept_plain_bytes_and_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 * 1024));
        assert_eq!(parse_size("64k"), Ok(64 * 1024));
        assert_eq!(parse_size("4M"), Ok(4 * MIB));
        assert_eq!(parse_size("4MiB"), Ok(4 * MIB));
        assert_eq!(parse_size("4mb"), Ok(4 * MIB));
        assert_eq!(parse_size("1G"), Ok(1024 * MIB));
        assert_eq!(parse_size(" 2M "), Ok(2 * MIB));
    }

    #[test]
    fn sizes_refuse_zero_garbage_and_overflow() {
        assert!(parse_size("0").is_err());
        assert!(parse_size("0M").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("-4M").is_err());
        assert!(parse_size("4T").is_err());
        assert!(parse_size("4 M").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("17179869184G").is_err());
    }

    #[test]
    fn seconds_accept_fractions_and_refuse_negative_or_infinite() {
        assert_eq!(parse_seconds("0"), Ok(Duration::ZERO));
        assert_eq!(parse_seconds("0.25"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_seconds("5"), Ok(Duration::from_secs(5)));
        assert!(parse_seconds("-1").is_err());
        assert!(parse_seconds("inf").is_err());
        assert!(parse_seconds("NaN").is_err());
        assert!(parse_seconds("soon").is_err());
    }

    #[test]
    fn churn_defaults() {
        let cli = parse(&["churn"]).expect("churn parses");
        assert_eq!(cli.start_delay, Duration::ZERO);
        assert!(!cli.wait_signal);
        let Mode::Churn(args) = cli.mode else {
            panic!("expected churn, got {:?}", cli.mode);
        };
        assert_eq!(args.threads, 4);
        assert_eq!(args.seconds, Duration::from_secs(5));
        assert_eq!(args.iterations, None);
        assert_eq!(args.map_size, 4 * MIB);
        assert_eq!(args.source, Source::Anon);
        assert!(!args.writer);
        assert_eq!(args.writer_size, 64 * MIB);
        assert_eq!(args.hogs, 0);
        assert!(!args.together);
    }

    #[test]
    fn churn_with_every_option() {
        let cli = parse(&[
            "--start-delay",
            "1.5",
            "--wait-signal",
            "churn",
            "--threads",
            "8",
            "--seconds",
            "2",
            "--iterations",
            "100",
            "--map-size",
            "64K",
            "--source",
            "file",
            "--writer",
            "--writer-size",
            "16M",
            "--hogs",
            "3",
            "--together",
        ])
        .expect("all options parse");
        assert_eq!(cli.start_delay, Duration::from_millis(1500));
        assert!(cli.wait_signal);
        let Mode::Churn(args) = cli.mode else {
            panic!("expected churn, got {:?}", cli.mode);
        };
        assert_eq!(args.threads, 8);
        assert_eq!(args.seconds, Duration::from_secs(2));
        assert_eq!(args.iterations, Some(100));
        assert_eq!(args.map_size, 64 * 1024);
        assert_eq!(args.source, Source::File);
        assert!(args.writer);
        assert_eq!(args.writer_size, 16 * MIB);
        assert_eq!(args.hogs, 3);
        assert!(args.together);
    }

    #[test]
    fn global_options_may_follow_the_mode() {
        let cli = parse(&["idle", "--wait-signal", "--start-delay", "0.5"]).expect("parses");
        assert!(cli.wait_signal);
        assert_eq!(cli.start_delay, Duration::from_millis(500));
    }

    #[test]
    fn churn_refuses_bad_values() {
        assert!(parse(&["churn", "--threads", "0"]).is_err());
        assert!(parse(&["churn", "--iterations", "0"]).is_err());
        assert!(parse(&["churn", "--map-size", "0"]).is_err());
        assert!(parse(&["churn", "--map-size", "4X"]).is_err());
        assert!(parse(&["churn", "--source", "stdin"]).is_err());
        assert!(parse(&["churn", "--seconds", "-1"]).is_err());
        assert!(parse(&["churn", "--hogs", "-1"]).is_err());
        assert!(parse(&["churn", "--hogs"]).is_err());
        // A writer size without a writer is a mistake, not a silent no-op.
        assert!(parse(&["churn", "--writer-size", "1M"]).is_err());
        assert!(parse(&["--start-delay", "-0.1", "churn"]).is_err());
    }

    #[test]
    fn hold_defaults_and_options() {
        let Mode::Hold(args) = parse(&["hold"]).expect("parses").mode else {
            panic!("expected hold");
        };
        assert_eq!(
            (args.size_mib, args.repeat, args.gap_ms, args.readers),
            (512, 3, 50, 0)
        );

        let cli = parse(&[
            "hold",
            "--size-mib",
            "8",
            "--repeat",
            "2",
            "--gap-ms",
            "0",
            "--readers",
            "4",
        ]);
        let Mode::Hold(args) = cli.expect("parses").mode else {
            panic!("expected hold");
        };
        assert_eq!(
            (args.size_mib, args.repeat, args.gap_ms, args.readers),
            (8, 2, 0, 4)
        );

        assert!(parse(&["hold", "--size-mib", "0"]).is_err());
        assert!(parse(&["hold", "--repeat", "0"]).is_err());
        assert!(parse(&["hold", "--readers", "many"]).is_err());
    }

    #[test]
    fn files_needs_a_method_and_has_defaults() {
        assert!(parse(&["files"]).is_err());
        assert!(parse(&["files", "--method", "read"]).is_err());
        let Mode::Files(args) = parse(&["files", "--method", "pread"]).expect("parses").mode else {
            panic!("expected files");
        };
        assert_eq!(args.method, ReadMethod::Pread);
        assert_eq!((args.threads, args.files), (4, 8));
        assert_eq!(args.file_size, SizeRange::exactly(4 * MIB));
        assert_eq!(args.seconds, Duration::from_secs(3));
        assert_eq!(args.dir, std::env::temp_dir());
    }

    #[test]
    fn files_with_every_option() {
        let cli = parse(&[
            "files",
            "--method",
            "mmap",
            "--threads",
            "1",
            "--files",
            "2",
            "--file-size",
            "64K",
            "--seconds",
            "0.5",
            "--dir",
            "/var/tmp",
        ]);
        let Mode::Files(args) = cli.expect("parses").mode else {
            panic!("expected files");
        };
        assert_eq!(args.method, ReadMethod::Mmap);
        assert_eq!((args.threads, args.files), (1, 2));
        assert_eq!(args.file_size, SizeRange::exactly(64 * 1024));
        assert_eq!(args.seconds, Duration::from_millis(500));
        assert_eq!(args.dir, PathBuf::from("/var/tmp"));

        for bad in [
            ["--threads", "0"],
            ["--files", "0"],
            ["--file-size", "0"],
            ["--file-size", "0-4K"],
            ["--file-size", "16K-1K"],
            ["--file-size", "1K-"],
            ["--file-size", "-16K"],
            ["--file-size", "1K-4K-16K"],
        ] {
            let mut args = vec!["files", "--method", "mmap"];
            args.extend(bad);
            assert!(parse(&args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn file_sizes_are_one_size_or_a_range() {
        assert_eq!(parse_size_range("64K"), Ok(SizeRange::exactly(64 * 1024)));
        assert_eq!(
            parse_size_range("1K-16K"),
            Ok(SizeRange {
                min: 1024,
                max: 16 * 1024
            })
        );
        assert_eq!(parse_size_range("4K-4K"), Ok(SizeRange::exactly(4096)));
        let error = parse_size_range("16K-1K").expect_err("reversed");
        assert!(error.contains("smaller size goes first"), "{error}");
    }

    #[test]
    fn filemap_defaults_and_options() {
        let Mode::Filemap(args) = parse(&["filemap"]).expect("parses").mode else {
            panic!("expected filemap");
        };
        assert_eq!((args.file_size, args.map_size), (64 * MIB, MIB));
        assert_eq!((args.threads, args.seconds), (2, Duration::from_secs(5)));
        assert_eq!(args.dir, std::env::temp_dir());

        let cli = parse(&[
            "--wait-signal",
            "filemap",
            "--file-size",
            "1G",
            "--dir",
            "/var/tmp",
            "--threads",
            "3",
            "--seconds",
            "0.25",
            "--map-size",
            "64K",
        ]);
        let cli = cli.expect("parses");
        assert!(cli.wait_signal);
        let Mode::Filemap(args) = cli.mode else {
            panic!("expected filemap");
        };
        assert_eq!((args.file_size, args.map_size), (1024 * MIB, 64 * 1024));
        assert_eq!(
            (args.threads, args.seconds),
            (3, Duration::from_millis(250))
        );
        assert_eq!(args.dir, PathBuf::from("/var/tmp"));

        assert!(!cli.until_stdin_closes);
        assert!(parse(&["--until-stdin-closes", "filemap"]).is_ok_and(|cli| cli.until_stdin_closes));
        assert!(parse(&["filemap", "--threads", "0"]).is_err());
        assert!(parse(&["filemap", "--map-size", "0"]).is_err());
    }

    const PROC_MEM_READ_REQUIRED: [(&str, &str); 4] = [
        ("--pid", "42"),
        ("--addr", "0x7f0000001000"),
        ("--len", "64M"),
        ("--file", "/tmp/f"),
    ];

    /// proc-mem-read with the required options, `changes` replacing or adding some.
    fn proc_mem_read(changes: &[(&'static str, &'static str)]) -> ProcMemReadArgs {
        try_proc_mem_read(changes).expect("parses")
    }

    fn try_proc_mem_read(
        changes: &[(&'static str, &'static str)],
    ) -> Result<ProcMemReadArgs, clap::Error> {
        let mut options = PROC_MEM_READ_REQUIRED.to_vec();
        for &(flag, value) in changes {
            match options.iter_mut().find(|(known, _)| *known == flag) {
                Some(option) => option.1 = value,
                None => options.push((flag, value)),
            }
        }
        let args: Vec<&str> = std::iter::once("proc-mem-read")
            .chain(options.iter().flat_map(|&(flag, value)| [flag, value]))
            .collect();
        match parse(&args)?.mode {
            Mode::ProcMemRead(args) => Ok(args),
            other => panic!("expected proc-mem-read, got {other:?}"),
        }
    }

    #[test]
    fn proc_mem_read_needs_its_target_and_has_defaults() {
        let args = proc_mem_read(&[]);
        assert_eq!(args.pid, 42);
        assert_eq!(args.addr, 0x7f00_0000_1000);
        assert_eq!(args.len, 64 * MIB);
        assert_eq!(args.file, PathBuf::from("/tmp/f"));
        assert_eq!((args.rounds, args.chunk), (3, MIB));

        // Each required option, left out, is an error.
        for (flag, _) in PROC_MEM_READ_REQUIRED {
            let partial: Vec<&str> = std::iter::once("proc-mem-read")
                .chain(
                    PROC_MEM_READ_REQUIRED
                        .iter()
                        .filter(|(other, _)| *other != flag)
                        .flat_map(|&(flag, value)| [flag, value]),
                )
                .collect();
            assert!(parse(&partial).is_err(), "{partial:?}");
        }
    }

    #[test]
    fn proc_mem_read_with_every_option() {
        let args = proc_mem_read(&[("--rounds", "1"), ("--chunk", "4K"), ("--addr", "4096")]);
        assert_eq!((args.rounds, args.chunk, args.addr), (1, 4096, 4096));
        assert_eq!(proc_mem_read(&[("--len", "12345")]).len, 12345);

        for bad in [
            ("--rounds", "0"),
            ("--chunk", "0"),
            ("--pid", "0"),
            ("--pid", "-1"),
            ("--len", "0"),
            ("--addr", "7f00"),
        ] {
            assert!(try_proc_mem_read(&[bad]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn addresses_are_hex_with_0x_or_decimal() {
        assert_eq!(parse_address("0x7fd2db800000"), Ok(0x7fd2_db80_0000));
        assert_eq!(parse_address("0X1F"), Ok(31));
        assert_eq!(parse_address("4096"), Ok(4096));
        assert_eq!(parse_address(" 0x10 "), Ok(16));
        assert!(parse_address("7fd2db800000").is_err());
        assert!(parse_address("0x").is_err());
        assert!(parse_address("0x+10").is_err());
        assert!(parse_address("+10").is_err());
        assert!(parse_address("-1").is_err());
        assert!(parse_address("0x1_000").is_err());
        assert!(parse_address("0x10000000000000000").is_err());
    }

    #[test]
    fn idle_defaults_and_options() {
        let Mode::Idle(args) = parse(&["idle"]).expect("parses").mode else {
            panic!("expected idle");
        };
        assert_eq!((args.seconds, args.threads), (Duration::from_secs(10), 2));

        let cli = parse(&["idle", "--seconds", "0.1", "--threads", "0"]);
        let Mode::Idle(args) = cli.expect("parses").mode else {
            panic!("expected idle");
        };
        assert_eq!(
            (args.seconds, args.threads),
            (Duration::from_millis(100), 0)
        );
    }

    #[test]
    fn a_mode_is_required() {
        assert!(parse(&[]).is_err());
        assert!(parse(&["--wait-signal"]).is_err());
        assert!(parse(&["spin"]).is_err());
        assert!(parse(&["proc_mem_read"]).is_err());
    }
}
