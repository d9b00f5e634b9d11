//! Checked wrappers around the memory syscalls the workload makes.
//!
//! The functions that take mmap_lock (or fault, which may fall back to it) are
//! `#[inline(never)]` and named for what they do, so each shows up as its own frame in the user
//! stacks the tracer records.

use std::hint::black_box;
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::{self, NonNull};

use anyhow::{bail, Result};

/// Where a mapping's pages come from.
#[derive(Debug, Clone, Copy)]
pub enum Backing<'fd> {
    /// Private anonymous memory, readable and writable.
    Anonymous,
    /// A private, read-only view of an open file.
    File(BorrowedFd<'fd>),
}

/// A live mapping. `unmap_region` unmaps it and reports failure; dropping it (on error paths)
/// unmaps it quietly.
#[derive(Debug)]
pub struct Region {
    start: NonNull<u8>,
    len: usize,
}

impl Region {
    pub fn start(&self) -> *mut u8 {
        self.start.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the region was returned by a successful mmap() of `len` bytes and nothing
        // else unmaps it (unmap_region skips this destructor).
        unsafe { libc::munmap(self.start().cast(), self.len) };
    }
}

/// Maps `len` bytes backed by `backing`: every mmap() takes mmap_lock for write.
#[inline(never)]
pub fn map_region(len: usize, backing: Backing<'_>) -> Result<Region> {
    let (prot, flags, fd) = match backing {
        Backing::Anonymous => (
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
        ),
        Backing::File(fd) => (libc::PROT_READ, libc::MAP_PRIVATE, fd.as_raw_fd()),
    };
    mmap_checked(len, prot, flags, fd)
}

/// Maps `len` bytes of anonymous memory and faults all of it in before returning.
///
/// mmap() takes mmap_lock for write only to insert the VMA; MAP_POPULATE then faults every page
/// in while holding mmap_lock for read, which for tens of MiB is a long hold that keeps every
/// mmap()/munmap() of the other threads waiting (and, as the rwsem queues readers behind waiting
/// writers, their faults that fall back to mmap_lock too).
#[inline(never)]
pub fn map_populated(len: usize) -> Result<Region> {
    mmap_checked(
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
        -1,
    )
}

/// Maps `len` bytes of a file shared and read-only, faulting nothing in: mmap() takes
/// mmap_lock for write only to insert the VMA, and the pages stay wherever they are (on disk,
/// if nothing has read them) until something touches them.
#[inline(never)]
pub fn map_shared_file(len: usize, fd: BorrowedFd<'_>) -> Result<Region> {
    mmap_checked(len, libc::PROT_READ, libc::MAP_SHARED, fd.as_raw_fd())
}

fn mmap_checked(
    len: usize,
    prot: libc::c_int,
    flags: libc::c_int,
    fd: libc::c_int,
) -> Result<Region> {
    // SAFETY: a fresh mapping at an address the kernel picks cannot alias anything we own.
    let start = unsafe { libc::mmap(ptr::null_mut(), len, prot, flags, fd, 0) };
    if start == libc::MAP_FAILED {
        bail!(
            "mmap({len} bytes, prot {prot:#x}, flags {flags:#x}, fd {fd}) failed: {}",
            io::Error::last_os_error()
        );
    }
    let Some(start) = NonNull::new(start.cast::<u8>()) else {
        bail!("mmap({len} bytes) returned address 0");
    };
    Ok(Region { start, len })
}

/// Unmaps the region. munmap() takes mmap_lock for write to detach the VMA, then (on 6.x
/// kernels) downgrades it to read while the pages and page tables are freed.
#[inline(never)]
pub fn unmap_region(region: Region) -> Result<()> {
    let region = ManuallyDrop::new(region);
    // SAFETY: the region was returned by a successful mmap() of `len` bytes; ManuallyDrop keeps
    // its destructor from unmapping it a second time.
    let rc = unsafe { libc::munmap(region.start().cast(), region.len) };
    if rc == -1 {
        bail!(
            "munmap({:p}, {} bytes) failed: {}",
            region.start(),
            region.len,
            io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Writes one byte to every page of a writable region.
///
/// The first write fault on a fresh anonymous VMA must attach an anon_vma to it, which the
/// per-VMA-lock fault path cannot do: it gives up and retries under mmap_lock (read). Later
/// faults on the same VMA are usually handled under the per-VMA lock alone.
#[inline(never)]
pub fn touch_pages(region: &Region, page_size: usize) {
    let start = black_box(region.start());
    for offset in (0..region.len).step_by(page_size) {
        // SAFETY: `offset < len`, and the region is mapped readable and writable.
        unsafe { start.add(offset).write_volatile(1) };
    }
}

/// Reads one byte from every page of a readable region, returning their sum so the reads have a
/// visible result.
#[inline(never)]
pub fn read_pages(region: &Region, page_size: usize) -> u64 {
    let start = black_box(region.start());
    let mut sum = 0u64;
    for offset in (0..region.len).step_by(page_size) {
        // SAFETY: `offset < len`, and the region is mapped readable.
        sum += u64::from(unsafe { start.add(offset).read_volatile() });
    }
    black_box(sum)
}

/// Asks mincore() which pages of the region are resident, returning how many are.
/// `residency` is scratch space for the kernel's one byte per page.
///
/// mincore() takes mmap_lock for read around each walk of the page tables, so a loop of these
/// calls is a stream of short read holds that a writer has to slot in between.
#[inline(never)]
pub fn query_residency(
    region: &Region,
    page_size: usize,
    residency: &mut Vec<u8>,
) -> Result<usize> {
    residency.resize(region.len.div_ceil(page_size), 0);
    // SAFETY: `residency` has one writable byte for every page of the region.
    let rc = unsafe { libc::mincore(region.start().cast(), region.len, residency.as_mut_ptr()) };
    if rc == -1 {
        bail!(
            "mincore({:p}, {} bytes) failed: {}",
            region.start(),
            region.len,
            io::Error::last_os_error()
        );
    }
    // Bit 0 says resident; the other bits are reserved.
    Ok(residency.iter().filter(|&&state| state & 1 == 1).count())
}

/// Asks the kernel to back the region with 4 KiB pages only.
///
/// With transparent huge pages a 512 MiB region would need only 256 PMD entries, and an
/// mprotect() over it would finish almost at once; 4 KiB pages give 131072 PTEs to rewrite,
/// which is what makes the write hold long and predictable.
pub fn disable_huge_pages(region: &Region) -> Result<()> {
    // SAFETY: madvise only changes how the kernel backs our own mapping.
    let rc = unsafe { libc::madvise(region.start().cast(), region.len, libc::MADV_NOHUGEPAGE) };
    if rc == -1 {
        bail!(
            "madvise({:p}, {} bytes, MADV_NOHUGEPAGE) failed: {}",
            region.start(),
            region.len,
            io::Error::last_os_error()
        );
    }
    Ok(())
}

/// The size of a base page, the step at which faults happen.
pub fn page_size() -> Result<usize> {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    match usize::try_from(size) {
        Ok(size) if size > 0 => Ok(size),
        _ => bail!(
            "sysconf(_SC_PAGESIZE) failed: {}",
            io::Error::last_os_error()
        ),
    }
}

/// Nanoseconds on CLOCK_MONOTONIC, the clock the kernel's tracepoint timestamps compare with.
pub fn monotonic_ns() -> Result<u64> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    if rc == -1 {
        bail!(
            "clock_gettime(CLOCK_MONOTONIC) failed: {}",
            io::Error::last_os_error()
        );
    }
    // CLOCK_MONOTONIC is never negative, so these conversions cannot fail in practice.
    let seconds = u64::try_from(now.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec).unwrap_or(0);
    Ok(seconds * 1_000_000_000 + nanos)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn touched_anonymous_pages_hold_the_written_byte() {
        let page = page_size().expect("page size");
        let region = map_region(4 * page, Backing::Anonymous).expect("mmap");
        assert_eq!(region.len(), 4 * page);
        touch_pages(&region, page);
        assert_eq!(read_pages(&region, page), 4);
        // The byte after each page start stays zero: only one byte per page is written.
        // SAFETY: offset 1 is inside the mapped, readable region.
        assert_eq!(unsafe { region.start().add(1).read_volatile() }, 0);
        unmap_region(region).expect("munmap");
    }

    #[test]
    fn failed_mmap_names_the_call_and_errno() {
        // A zero-length mapping is always EINVAL.
        let error = map_region(0, Backing::Anonymous).expect_err("zero-length mmap must fail");
        let message = error.to_string();
        assert!(message.starts_with("mmap(0 bytes"), "{message}");
        assert!(message.contains("os error 22"), "{message}");
    }

    #[test]
    fn populated_region_is_usable_and_huge_pages_can_be_refused() {
        let page = page_size().expect("page size");
        let region = map_populated(8 * page).expect("mmap populate");
        disable_huge_pages(&region).expect("madvise");
        assert_eq!(read_pages(&region, page), 0);
        unmap_region(region).expect("munmap");
    }

    #[test]
    fn residency_counts_the_touched_pages() {
        let page = page_size().expect("page size");
        let region = map_region(16 * page, Backing::Anonymous).expect("mmap");
        let mut residency = Vec::new();
        assert_eq!(
            query_residency(&region, page, &mut residency).expect("mincore"),
            0
        );
        assert_eq!(residency.len(), 16);
        touch_pages(&region, page);
        assert_eq!(
            query_residency(&region, page, &mut residency).expect("mincore"),
            16
        );
        unmap_region(region).expect("munmap");
    }

    #[test]
    fn shared_file_mapping_reads_the_files_bytes() {
        let page = page_size().expect("page size");
        let dir = std::env::temp_dir();
        let scratch = crate::fileio::ScratchFile::create(&dir, "test", 4 * page).expect("file");
        let region = map_shared_file(4 * page, scratch.file().as_fd()).expect("mmap");
        // SAFETY: offset `page + 3` is inside the mapped, readable region.
        let byte = unsafe { region.start().add(page + 3).read_volatile() };
        assert_eq!(byte, crate::fileio::filler_byte(page + 3));
        unmap_region(region).expect("munmap");
    }

    #[test]
    fn monotonic_clock_moves_forward() {
        let before = monotonic_ns().expect("clock");
        std::thread::sleep(std::time::Duration::from_millis(2));
        let after = monotonic_ns().expect("clock");
        assert!(after >= before + 2_000_000, "{before} -> {after}");
    }
}
