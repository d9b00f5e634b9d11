//! Mode `hostile`: a target that does to its own files what a hostile (or merely upgraded)
//! process can, while it churns mappings from its own code so that its stacks point into them:
//!
//! - `fifo`: its executable's path becomes a FIFO (a tracer opening it blocks forever);
//! - `replaced`: another ELF object (`--decoy`, else the C library) is renamed over its executable,
//!   as a package upgrade does (symbolizing by path names the wrong functions);
//! - `sparse`: it maps a 1 TiB sparse file executable (a tracer reading mapped files whole
//!   tries to allocate 1 TiB);
//! - `names`: its name (comm) holds terminal escape sequences and a newline;
//! - `library-fifo`: it dlopens a library, replaces the library's file with a FIFO and maps
//!   and unmaps from inside the library (its stacks point into the FIFO's path).
//!
//! `fifo` and `replaced` change the running executable's own file, so they only run from a
//! copy whose file name starts with `hostile-`.

use std::ffi::CString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::churn::{churn_worker, ChurnJob};
use crate::cli::{HostileArgs, HostileKind};
use crate::emit;
use crate::start::Start;

/// What `names` calls itself: an escape sequence that turns a terminal red, a newline that
/// would start a forged report line (15 bytes: the kernel's limit).
pub const HOSTILE_COMM: &[u8] = b"\x1b[31mred\nfake";

/// Size of each churned mapping.
const MAP_SIZE: usize = 64 * 1024;

pub fn run(args: &HostileArgs, start: Start, out: &mut dyn Write) -> Result<()> {
    if args.kind == HostileKind::LibraryFifo {
        return churn_in_fifo_library(args, start, out);
    }
    let what = set_up(args)?;
    emit(
        out,
        format_args!("hostile kind={} {what}", args.kind.name()),
    )?;
    start.begin(out)?;
    let job = ChurnJob::anonymous_until(MAP_SIZE, Instant::now() + args.seconds)?;
    let iterations = churn_worker(job, &AtomicBool::new(false))?;
    emit(out, format_args!("iterations={iterations}"))
}

/// Does the hostile deed before the work starts; says what it did.
fn set_up(args: &HostileArgs) -> Result<String> {
    match args.kind {
        HostileKind::Fifo => {
            let exe = own_copy()?;
            fs::remove_file(&exe).with_context(|| format!("removing {}", exe.display()))?;
            make_fifo(&exe)?;
            Ok(format!("fifo={}", exe.display()))
        }
        HostileKind::Replaced => {
            let exe = own_copy()?;
            let decoy = match &args.decoy {
                Some(decoy) => decoy.clone(),
                None => libc_path()?,
            };
            let staged = exe.with_extension("new");
            fs::copy(&decoy, &staged).with_context(|| format!("copying {}", decoy.display()))?;
            fs::rename(&staged, &exe).with_context(|| format!("replacing {}", exe.display()))?;
            Ok(format!(
                "replaced={} with={}",
                exe.display(),
                decoy.display()
            ))
        }
        HostileKind::Sparse => {
            let path = args.dir.join("sparse-1T");
            map_sparse_exec(&path, 1 << 40)?;
            Ok(format!("sparse={}", path.display()))
        }
        HostileKind::Names => {
            set_comm(HOSTILE_COMM)?;
            Ok("comm=escaped".into())
        }
        HostileKind::LibraryFifo => unreachable!("run() handles it"),
    }
}

/// `library-fifo`: the library's code does the mapping, so that its frames, in a file that is
/// now a FIFO, are what the tracer symbolizes.
fn churn_in_fifo_library(args: &HostileArgs, start: Start, out: &mut dyn Write) -> Result<()> {
    let library = args.library.as_ref().context("--library is required")?;
    let c_path = CString::new(library.as_os_str().as_bytes())?;
    // SAFETY: a valid path; the handle stays open for the life of the process.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW) };
    if handle.is_null() {
        bail!("dlopen {} failed", library.display());
    }
    // SAFETY: a valid handle and a NUL-terminated name.
    let symbol = unsafe { libc::dlsym(handle, c"churn_lib".as_ptr()) };
    if symbol.is_null() {
        bail!("{} exports no churn_lib", library.display());
    }
    // SAFETY: the library's contract (see --library): void churn_lib(double seconds).
    let churn_lib: extern "C" fn(f64) = unsafe { std::mem::transmute(symbol) };
    fs::remove_file(library).with_context(|| format!("removing {}", library.display()))?;
    make_fifo(library)?;
    emit(
        out,
        format_args!("hostile kind=library-fifo fifo={}", library.display()),
    )?;
    start.begin(out)?;
    churn_lib(args.seconds.as_secs_f64());
    emit(out, format_args!("iterations=0"))
}

/// The running executable, if it is a copy made to be abused.
fn own_copy() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding the executable")?;
    let name = exe.file_name().map(|n| n.to_string_lossy().into_owned());
    if !name.is_some_and(|n| n.starts_with("hostile-")) {
        bail!(
            "{} would be replaced: run a copy named hostile-* for this kind",
            exe.display()
        );
    }
    Ok(exe)
}

fn make_fifo(path: &Path) -> Result<()> {
    let c_path = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("mkfifo {}", path.display()));
    }
    Ok(())
}

/// The C library this process maps: an ELF object full of symbols, nothing like ours.
fn libc_path() -> Result<PathBuf> {
    let maps = fs::read_to_string("/proc/self/maps").context("reading /proc/self/maps")?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| path.contains("/libc.so"))
        .map(PathBuf::from)
        .context("no libc.so in /proc/self/maps")
}

/// Creates a sparse file of `len` bytes and maps all of it readable and executable (never
/// touched: nothing is read from it, and it stays mapped until the process exits).
fn map_sparse_exec(path: &Path, len: u64) -> Result<()> {
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.set_len(len)
        .with_context(|| format!("extending {} to {len} bytes", path.display()))?;
    // SAFETY: a fresh mapping of our own file; the address is only kept by the kernel.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_EXEC,
            libc::MAP_PRIVATE,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("mapping {} executable", path.display()));
    }
    Ok(())
}

fn set_comm(name: &[u8]) -> Result<()> {
    let name = CString::new(name)?;
    // SAFETY: PR_SET_NAME reads a NUL-terminated string (truncated to 15 bytes).
    if unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error()).context("prctl(PR_SET_NAME)");
    }
    Ok(())
}
