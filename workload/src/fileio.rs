//! Files the workload creates for itself (under unique names, removed again) and reads back.

use std::fmt::Display;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

/// A path in `dir` that no other run (nor another call in this process) uses.
pub fn unique_path(dir: &Path, extension: &str) -> PathBuf {
    static CREATED: AtomicU64 = AtomicU64::new(0);
    let serial = CREATED.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since_epoch| since_epoch.as_nanos());
    dir.join(format!(
        "mmapsem-workload-{}-{nanos}-{serial}.{extension}",
        process::id()
    ))
}

/// A fresh directory that is removed, with everything in it, when this is dropped (also when
/// the mode fails half-way).
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    pub fn create(parent: &Path) -> Result<Self> {
        let path = unique_path(parent, "dir");
        fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(error) = fs::remove_dir_all(&self.path) {
            eprintln!("warning: removing {}: {error}", self.path.display());
        }
    }
}

/// A file created under a unique name in `dir`, removed when this is dropped.
#[derive(Debug)]
pub struct ScratchFile {
    path: PathBuf,
    file: File,
}

impl ScratchFile {
    /// Creates the file and fills it with `len` bytes of non-zero data.
    pub fn create(dir: &Path, extension: &str, len: usize) -> Result<Self> {
        let path = unique_path(dir, extension);
        let mut file = create_new(&path)?;
        // From here on the drop removes the file, also if filling it fails.
        let scratch = Self {
            path: path.clone(),
            file: file.try_clone().context("duplicating a file descriptor")?,
        };
        fill(&mut file, len, &path)?;
        Ok(scratch)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file(&self) -> &File {
        &self.file
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        if let Err(error) = fs::remove_file(&self.path) {
            eprintln!("warning: removing {}: {error}", self.path.display());
        }
    }
}

/// Creates a file at `path`, which must not exist yet, open for reading and writing.
pub fn create_new(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))
}

/// Writes `len` bytes of non-zero data from the current position. Non-zero, because a file of
/// holes or zeroes would read back without real pages being needed (and tests check the bytes).
pub fn fill(file: &mut File, len: usize, path: &Path) -> Result<()> {
    // No bigger than the file: tens of thousands of small files would each build a whole block.
    let block: Vec<u8> = (0..FILL_BLOCK.min(len)).map(filler_byte).collect();
    let mut left = len;
    while left > 0 {
        let now = left.min(block.len());
        file.write_all(&block[..now])
            .with_context(|| format!("writing {}", path.display()))?;
        left -= now;
    }
    Ok(())
}

/// Size of the blocks `fill` writes: big enough for few syscalls, small enough to not matter.
const FILL_BLOCK: usize = 1 << 20;

/// The byte `fill` writes at `offset` within each block: never zero.
pub fn filler_byte(offset: usize) -> u8 {
    // `offset % 255` is below 255, so the cast cannot truncate and the sum cannot overflow.
    (offset % 255) as u8 + 1
}

/// Fills `buffer` from `file` at `offset` with pread(), looping over short reads. `what` names
/// the file in errors. Fails at end of file: every caller knows how much is there.
pub fn pread_exact(file: &File, buffer: &mut [u8], offset: u64, what: &dyn Display) -> Result<()> {
    let mut done = 0;
    while done < buffer.len() {
        let at = offset + done as u64;
        let position = libc::off_t::try_from(at)
            .with_context(|| format!("offset {at:#x} of {what} does not fit in off_t"))?;
        let rest = &mut buffer[done..];
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes.
        let rc = unsafe {
            libc::pread(
                file.as_raw_fd(),
                rest.as_mut_ptr().cast(),
                rest.len(),
                position,
            )
        };
        match rc {
            -1 => bail!(
                "pread({what}, {} bytes at offset {at:#x}) failed: {}",
                rest.len(),
                io::Error::last_os_error()
            ),
            0 => bail!(
                "pread({what}, {} bytes at offset {at:#x}) hit the end of the file",
                rest.len()
            ),
            // pread() returns at most `rest.len()`, so the count fits in usize.
            read => done += read.unsigned_abs(),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_paths_differ_and_live_in_the_given_dir() {
        let dir = std::env::temp_dir();
        let first = unique_path(&dir, "x");
        let second = unique_path(&dir, "x");
        assert_ne!(first, second);
        assert_eq!(first.parent(), Some(dir.as_path()));
        assert_eq!(first.extension().and_then(|e| e.to_str()), Some("x"));
    }

    #[test]
    fn scratch_dir_is_removed_with_its_contents() {
        let scratch = ScratchDir::create(&std::env::temp_dir()).expect("create");
        let path = scratch.path().to_owned();
        let inner = path.join("inner");
        fs::write(&inner, b"data").expect("write inside");
        drop(scratch);
        assert!(!path.exists(), "{} still exists", path.display());
    }

    #[test]
    fn scratch_file_holds_non_zero_data_and_is_removed() {
        let len = FILL_BLOCK + 300;
        let scratch = ScratchFile::create(&std::env::temp_dir(), "test", len).expect("create");
        let path = scratch.path().to_owned();
        let data = fs::read(&path).expect("read back");
        assert_eq!(data.len(), len);
        assert!(data.iter().all(|&byte| byte != 0));
        assert_eq!(data[FILL_BLOCK + 7], filler_byte(7));
        drop(scratch);
        assert!(!path.exists(), "{} still exists", path.display());
    }

    #[test]
    fn a_failed_fill_names_the_file() {
        let path = unique_path(&std::env::temp_dir(), "ro");
        create_new(&path).expect("create");
        // A read-only descriptor makes every write fail with EBADF.
        let mut read_only = File::open(&path).expect("open read-only");
        let error = fill(&mut read_only, 10, &path).expect_err("writing must fail");
        fs::remove_file(&path).expect("cleanup");
        let message = format!("{error:#}");
        assert!(
            message.starts_with(&format!("writing {}", path.display())),
            "{message}"
        );
        assert!(message.contains("os error 9"), "{message}");
    }

    #[test]
    fn pread_exact_reads_at_the_offset_and_refuses_to_run_past_the_end() {
        let scratch = ScratchFile::create(&std::env::temp_dir(), "test", 1000).expect("create");
        let mut buffer = [0u8; 10];
        pread_exact(scratch.file(), &mut buffer, 500, &"test file").expect("pread");
        let expected: Vec<u8> = (500..510).map(filler_byte).collect();
        assert_eq!(buffer.as_slice(), expected.as_slice());

        let error =
            pread_exact(scratch.file(), &mut buffer, 995, &"test file").expect_err("past the end");
        let message = error.to_string();
        assert!(message.starts_with("pread(test file, 5 bytes"), "{message}");
        assert!(message.contains("end of the file"), "{message}");
    }
}
