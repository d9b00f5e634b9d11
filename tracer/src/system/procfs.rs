//! What /proc says about the traced processes: names, liveness, threads, executable mappings.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};

/// The user a process runs as (the owner of its /proc directory: its effective uid).
pub fn owner_uid(pid: u32) -> Option<u32> {
    std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(format!("/proc/{pid}")).ok()?).into()
}

pub fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// Fails with "no such process" unless `pid` is a live user process: not merely a thread id,
/// and not a kernel thread, which has no address space of its own (its mm would be empty or
/// borrowed).
pub fn require_process(pid: u32) -> Result<()> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"));
    match status {
        Ok(text) if tgid_of(&text) == Some(pid) => {}
        Ok(_) => bail!("{pid} is a thread, not a process: pass its process id (tgid)"),
        Err(_) => bail!("no such process: {pid}"),
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    if stat_flags(&stat).is_some_and(|flags| flags & PF_KTHREAD != 0) {
        bail!("{pid} is a kernel thread: it has no address space (mmap_lock) of its own to trace");
    }
    Ok(())
}

/// PF_KTHREAD in the flags of /proc/PID/stat (include/linux/sched.h).
const PF_KTHREAD: u64 = 0x0020_0000;

/// Field `number` of a /proc/PID/stat line, numbered as in proc(5) (3 is the state), for
/// numbers from 3: they follow the last ')', since comm may hold spaces and parentheses.
fn stat_field(stat: &str, number: usize) -> Option<&str> {
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(number.checked_sub(3)?)
}

/// A numeric field of a /proc/PID/stat line (see `stat_field`).
fn stat_number(stat: &str, number: usize) -> Option<u64> {
    stat_field(stat, number)?.parse().ok()
}

/// Field 9 (flags) of /proc/PID/stat.
fn stat_flags(stat: &str) -> Option<u64> {
    stat_number(stat, 9)
}

fn tgid_of(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// True while the thread `tid` (a process's leader included) runs; false once it is gone or a
/// zombie (exited, not yet reaped). Of a process, [`process_has_ended`] is the question.
pub fn is_alive(tid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{tid}/stat")) {
        Ok(stat) => !matches!(stat_state(&stat), Some('Z' | 'X')),
        Err(_) => false,
    }
}

/// True once the whole process `pid` has ended: it is gone, or its leader is a zombie and no
/// other thread is left. The leader turns zombie as soon as it exits itself, while the process's
/// other threads may still be running (the leader called pthread_exit) or still be in do_exit,
/// where exit_mm and the last one's exit_mmap take mmap_lock. Joined threads too:
/// pthread_join returns when the kernel clears the thread id, before exit_mm.
pub fn process_has_ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat_has_ended(&stat),
        Err(_) => true,
    }
}

/// Field 3 (state) of a leader's /proc/PID/stat is Z or X and field 20 (num_threads, which
/// counts the zombie leader until it is reaped) says it is alone.
fn stat_has_ended(stat: &str) -> bool {
    let leader_exited = matches!(stat_state(stat), Some('Z' | 'X'));
    leader_exited && stat_number(stat, 20).is_none_or(|threads| threads <= 1)
}

/// Minor + major faults (its exited threads included) of `pid`'s threads; with `children`, also those of the children it
/// has waited for (the kernel adds an exited child's faults, its own children's included, to
/// its parent's when the parent reaps it: a traced command's whole tree).
pub fn faults_taken(pid: u32, children: bool) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_faults(&stat, children)
}

fn stat_faults(stat: &str, children: bool) -> Option<u64> {
    let field = |number: usize| stat_number(stat, number);
    // minflt (10), cminflt (11), majflt (12), cmajflt (13).
    let own = field(10)? + field(12)?;
    Some(if children {
        own + field(11)? + field(13)?
    } else {
        own
    })
}

/// The state letter of /proc/PID/stat (field 3).
fn stat_state(stat: &str) -> Option<char> {
    stat_field(stat, 3)?.chars().next()
}

pub fn thread_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The thread ids of `pid` now.
pub fn thread_ids(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// When thread `tid` of `pid` started, on the CLOCK_MONOTONIC (bpf_ktime_get_ns) scale, rounded
/// down to the clock tick /proc counts in (field 22 of stat: ticks since boot, which includes
/// suspend; the monotonic clock does not).
pub fn thread_start_ns(pid: u32, tid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    let ticks = stat_start_ticks(&stat)?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let since_boot = ticks.saturating_mul(1_000_000_000 / hz);
    let suspended = clock_ns(libc::CLOCK_BOOTTIME).saturating_sub(monotonic_ns());
    Some(since_boot.saturating_sub(suspended))
}

/// Field 22 (starttime) of /proc/PID/stat.
fn stat_start_ticks(stat: &str) -> Option<u64> {
    stat_number(stat, 22)
}

/// CLOCK_MONOTONIC in ns: the clock of bpf_ktime_get_ns and task start times.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes a valid timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Threads of every process now (`threads` of /proc/loadavg's running/total field).
pub fn machine_threads() -> usize {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| loadavg_threads(&text))
        .unwrap_or(0)
}

fn loadavg_threads(loadavg: &str) -> Option<usize> {
    loadavg
        .split_whitespace()
        .nth(3)?
        .split_once('/')?
        .1
        .parse()
        .ok()
}

/// (tid, name) of every thread of `pid` now.
pub fn thread_names(pid: u32) -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let tid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        let name = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
        Some((tid, name.trim_end().to_string()))
    })
    .collect()
}

/// One executable file mapping of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    pub path: PathBuf,
    /// The mapped file's device (st_dev) and inode as /proc/PID/maps gave them, to tell the
    /// file mapped from whatever is at `path` later (a package upgrade, a hostile target).
    pub dev: u64,
    pub inode: u64,
}

/// Parses /proc/PID/maps, keeping executable mappings backed by a file (what user stack
/// addresses can point into).
pub fn parse_exec_mappings(maps: &str) -> Vec<Mapping> {
    maps.lines().filter_map(parse_maps_line).collect()
}

fn parse_maps_line(line: &str) -> Option<Mapping> {
    let perms = line.split_whitespace().nth(1)?;
    perms.contains('x').then(|| parse_file_mapping(line))?
}

/// One line of /proc/PID/maps, if it maps a file (executable or not).
fn parse_file_mapping(line: &str) -> Option<Mapping> {
    let mut cols = line.splitn(6, char::is_whitespace);
    let range = cols.next()?;
    let _perms = cols.next()?;
    let offset = cols.next()?;
    let dev = cols.next()?;
    let inode = cols.next()?;
    let path = cols.next()?.trim_start();
    if !path.starts_with('/') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let (major, minor) = dev.split_once(':')?;
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        file_offset: u64::from_str_radix(offset, 16).ok()?,
        path: PathBuf::from(path.trim_end_matches(" (deleted)")),
        dev: libc::makedev(
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        ),
        inode: inode.parse().ok()?,
    })
}

/// Largest object file opened to symbolize or unwind: bigger ones (a sparse 1 TiB file mapped
/// executable) are refused rather than mapped and parsed.
pub const MAX_OBJECT_BYTES: u64 = 4 << 30;

/// The file behind one executable mapping, opened as a hostile process's file must be: the
/// path inside the process's root if it is still the (device, inode) that was mapped; else the
/// mapping itself through /proc/PID/map_files while the process lives (the file mapped even if
/// deleted or replaced); else the recorded path, again only if it is still the file mapped.
/// The root path comes first because a map_files lookup takes the target's mmap_lock: behind
/// a queue of writers it waited for seconds, stalling the tracer on the very lock it watches.
/// Never blocks on the file (a FIFO at the path), never opens anything but a regular file of
/// at most `MAX_OBJECT_BYTES`.
pub fn open_mapped_object(pid: u32, mapping: &Mapping) -> Result<File> {
    let id = (mapping.dev, mapping.inode);
    if let Some(file) = kept_objects().get(&id).and_then(|f| f.try_clone().ok()) {
        return Ok(file);
    }
    let file = open_mapped_object_now(pid, mapping)?;
    let mut kept = kept_objects();
    if kept.len() < MAX_KEPT_OBJECTS {
        if let Ok(copy) = file.try_clone() {
            kept.insert(id, copy);
        }
    }
    Ok(file)
}

/// Opens the object of each of `mappings` not opened yet, so that it can be read after the
/// process exits even where its path no longer leads to it (see `kept_objects`).
pub fn keep_mapped_objects(pid: u32, mappings: &[Mapping]) {
    for mapping in mappings {
        let known = kept_objects().contains_key(&(mapping.dev, mapping.inode));
        if !known {
            let _ = open_mapped_object(pid, mapping);
        }
    }
}

/// Objects kept open at most: under the default limit of 1 024 descriptors.
const MAX_KEPT_OBJECTS: usize = 512;

/// The mapped objects opened so far, by the (device, inode) /proc/PID/maps gave them: once a
/// process exits, its map_files are gone, and its path may not lead to the same (device, inode)
/// even when nothing was replaced (on overlayfs, as in containers, maps names the layer's inode
/// while a path gives the overlay's), so the file opened while it lived is what is read then.
fn kept_objects() -> std::sync::MutexGuard<'static, std::collections::HashMap<(u64, u64), File>> {
    static KEPT: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<(u64, u64), File>>,
    > = std::sync::OnceLock::new();
    KEPT.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn open_mapped_object_now(pid: u32, mapping: &Mapping) -> Result<File> {
    let mut in_root = PathBuf::from(format!("/proc/{pid}/root"));
    in_root.push(mapping.path.strip_prefix("/").unwrap_or(&mapping.path));
    let same = |path: &Path| open_regular(path).and_then(|file| same_file(file, mapping));
    if let Ok(file) = same(&in_root) {
        return Ok(file);
    }
    let map_file = format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        mapping.start, mapping.end
    );
    if let Ok(file) = open_regular(Path::new(&map_file)) {
        return Ok(file);
    }
    same(&mapping.path)
}

/// Opens `path` without side effects first (O_PATH: no FIFO wait, no device open), then for
/// reading only if it is a regular file within the size cap.
pub fn open_regular(path: &Path) -> Result<File> {
    let handle = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    check_regular(&handle.metadata()?, path)?;
    // Reopened through the descriptor: the same inode as checked, whatever the path is now.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))
        .with_context(|| format!("reopening {}", path.display()))?;
    check_regular(&file.metadata()?, path)?;
    Ok(file)
}

fn check_regular(meta: &std::fs::Metadata, path: &Path) -> Result<()> {
    if !meta.file_type().is_file() {
        bail!("{} is not a regular file", path.display());
    }
    if meta.len() > MAX_OBJECT_BYTES {
        bail!(
            "{} is {} bytes, over the {MAX_OBJECT_BYTES}-byte cap",
            path.display(),
            meta.len()
        );
    }
    Ok(())
}

/// `file` if it is the file `mapping` mapped, else an error saying the path was replaced.
fn same_file(file: File, mapping: &Mapping) -> Result<File> {
    let meta = file.metadata()?;
    let mapped = (mapping.dev, mapping.inode);
    if (meta.dev(), meta.ino()) != mapped && mapped_identity(&file) != Some(mapped) {
        bail!(
            "{} was replaced since it was mapped",
            mapping.path.display()
        );
    }
    Ok(file)
}

/// The (device, inode) another process's /proc/PID/maps shows for a mapping of `file`. They
/// differ from what stat says on overlayfs (a container's root, the CI guests' root): a
/// mapping is of the layer's file, stat is of the overlay's. Mapping one page of it here and
/// reading this process's own maps tells them without the target's mmap_lock, which the
/// fallback, a lookup in its /proc/PID/map_files, takes two or three times per object.
fn mapped_identity(file: &File) -> Option<(u64, u64)> {
    const LEN: usize = 4096;
    // SAFETY: a fresh private read-only mapping, never touched, unmapped below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            file.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return None;
    }
    let maps = File::open("/proc/self/maps").and_then(read_in_few_calls);
    // SAFETY: the mapping made above, of LEN bytes.
    unsafe { libc::munmap(addr, LEN) };
    String::from_utf8_lossy(&maps.ok()?)
        .lines()
        .filter_map(parse_file_mapping)
        .find(|m| m.start == addr as u64)
        .map(|m| (m.dev, m.inode))
}

/// The executable file mappings of `pid` now, if its maps could be read.
pub fn exec_mappings(pid: u32) -> Option<Vec<Mapping>> {
    let file = File::open(format!("/proc/{pid}/maps")).ok()?;
    let text = read_in_few_calls(file).ok()?;
    Some(parse_exec_mappings(&String::from_utf8_lossy(&text)))
}

/// What a read of /proc/PID/maps asks for at first: most processes' maps fit.
const MAPS_READ_BYTES: usize = 256 << 10;

/// Reads `file` to its end with as few read() calls as its size allows. Before Linux 6.17 every
/// read() of /proc/PID/maps takes the process's mmap_lock (for as many lines as fit the
/// buffer), so the tracer queues behind its target's writers once per call: std's
/// `read_to_string` starts with 32 bytes, then 8 KiB doubling, which took the lock a dozen
/// times per read of a busy target's maps on 6.12. The last read, at the end, takes no lock.
fn read_in_few_calls(mut file: impl std::io::Read) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; MAPS_READ_BYTES];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(2 * buf.len(), 0);
        }
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    buf.truncate(len);
    Ok(buf)
}

/// Every executable mapping seen during the trace, so that user addresses can be symbolized
/// after the process (or a library it unloaded) is gone.
#[derive(Clone, Debug, Default)]
pub struct MappingHistory {
    by_start: BTreeMap<u64, Mapping>,
    /// The user the process ran as when its mappings were read (whose files it may write).
    pub owner_uid: Option<u32>,
}

impl MappingHistory {
    pub fn add_all(&mut self, mappings: Vec<Mapping>) {
        for m in mappings {
            self.by_start.insert(m.start, m);
        }
    }

    /// The mapping containing `addr`, if any.
    pub fn find(&self, addr: u64) -> Option<&Mapping> {
        let (_, m) = self.by_start.range(..=addr).next_back()?;
        (addr < m.end).then_some(m)
    }

    /// Every mapping seen, by start address.
    pub fn iter(&self) -> impl Iterator<Item = &Mapping> {
        self.by_start.values()
    }

    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out at most what each read() asks for, as seq_file does, counting the calls.
    struct CountingReader<'a> {
        left: &'a [u8],
        calls: usize,
    }

    impl std::io::Read for CountingReader<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.calls += 1;
            let n = buf.len().min(self.left.len());
            buf[..n].copy_from_slice(&self.left[..n]);
            self.left = &self.left[n..];
            Ok(n)
        }
    }

    #[test]
    fn maps_are_read_in_one_call_and_the_end_when_they_fit() {
        for (size, calls) in [(0, 1), (100 << 10, 2), (MAPS_READ_BYTES, 2), (600 << 10, 4)] {
            let text: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let mut reader = CountingReader {
                left: &text,
                calls: 0,
            };
            let read = read_in_few_calls(&mut reader).unwrap();
            assert_eq!(read, text, "{size} bytes");
            assert_eq!(reader.calls, calls, "read() calls for {size} bytes");
        }
    }

    #[test]
    fn a_thread_starts_at_field_22_of_its_stat() {
        let stat = "42 (a (odd) name) S 1 42 42 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 3 0 \
                    123456 1000 200 18446744073709551615";
        assert_eq!(stat_start_ticks(stat), Some(123_456));
        let me = std::process::id();
        let started = thread_start_ns(me, me).expect("this test's own thread");
        assert!(started <= monotonic_ns());
    }

    #[test]
    fn loadavg_gives_the_machines_thread_count() {
        assert_eq!(loadavg_threads("0.52 0.58 0.59 3/1123 30212\n"), Some(1123));
        assert_eq!(loadavg_threads("garbage"), None);
    }

    const MAPS: &str = "\
55d0c0a00000-55d0c0a02000 r--p 00000000 fe:01 123 /usr/bin/cat
55d0c0a02000-55d0c0a07000 r-xp 00002000 fe:01 123 /usr/bin/cat
7f10aa000000-7f10aa200000 rw-p 00000000 00:00 0
7f10ab028000-7f10ab1bd000 r-xp 00028000 fe:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6
7f10ab300000-7f10ab301000 r-xp 00000000 fe:01 789 /tmp/my lib.so (deleted)
7ffd1c5f0000-7ffd1c5f2000 r-xp 00000000 00:00 0                          [vdso]
";

    #[test]
    fn keeps_executable_file_mappings_only() {
        let m = parse_exec_mappings(MAPS);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].start, 0x55d0c0a02000);
        assert_eq!(m[0].file_offset, 0x2000);
        assert_eq!(
            m[1].path,
            PathBuf::from("/usr/lib/x86_64-linux-gnu/libc.so.6")
        );
        assert_eq!(m[2].path, PathBuf::from("/tmp/my lib.so"));
    }

    #[test]
    fn maps_lines_give_the_mapped_files_identity() {
        let m = parse_exec_mappings(MAPS);
        assert_eq!((m[0].dev, m[0].inode), (libc::makedev(0xfe, 0x01), 123));
        assert_eq!(m[2].inode, 789);
    }

    #[test]
    fn only_regular_files_within_the_cap_are_opened() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        // Returns at once (no writer needed): a FIFO is refused before it is opened for reading.
        let err = open_regular(&fifo).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err:#}");
        assert!(open_regular(Path::new("/dev/null")).is_err());
        assert!(open_regular(dir.path()).is_err(), "a directory");
        let sparse = dir.path().join("sparse");
        File::create(&sparse)
            .unwrap()
            .set_len(MAX_OBJECT_BYTES + 1)
            .unwrap();
        let err = open_regular(&sparse).unwrap_err();
        assert!(err.to_string().contains("cap"), "{err:#}");
        let small = dir.path().join("small");
        std::fs::write(&small, b"x").unwrap();
        assert!(open_regular(&small).is_ok());
    }

    #[test]
    fn a_files_mapped_identity_is_what_maps_shows_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("object");
        std::fs::write(&path, [7u8; 10]).unwrap();
        let file = File::open(&path).unwrap();
        let meta = file.metadata().unwrap();
        // Not on overlayfs here: the identity mapped is the one stat gives.
        assert_eq!(mapped_identity(&file), Some((meta.dev(), meta.ino())));
        let other = File::open("/proc/self/exe").unwrap();
        assert_ne!(mapped_identity(&other), mapped_identity(&file));
    }

    #[test]
    fn a_path_replaced_since_it_was_mapped_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lib.so");
        std::fs::write(&path, b"old").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let mapping = Mapping {
            start: 0x1000,
            end: 0x2000,
            file_offset: 0,
            path: path.clone(),
            dev: meta.dev(),
            inode: meta.ino(),
        };
        // No such process: neither map_files nor the process's root, only the path.
        let gone = u32::MAX - 1;
        assert!(open_mapped_object(gone, &mapping).is_ok());
        let staged = dir.path().join("lib.so.new");
        std::fs::write(&staged, b"new").unwrap();
        std::fs::rename(&staged, &path).unwrap();
        // The file opened while it was the one mapped is kept: it is still what is read.
        let kept = open_mapped_object(gone, &mapping).unwrap();
        assert_eq!(kept.metadata().unwrap().ino(), meta.ino());
        // One never opened before is refused once its path leads elsewhere.
        let other = dir.path().join("other.so");
        std::fs::write(&other, b"old").unwrap();
        let other_meta = std::fs::metadata(&other).unwrap();
        let other_mapping = Mapping {
            path: other.clone(),
            dev: other_meta.dev(),
            inode: other_meta.ino(),
            ..mapping.clone()
        };
        std::fs::write(&staged, b"new").unwrap();
        std::fs::rename(&staged, &other).unwrap();
        let err = open_mapped_object(gone, &other_mapping).unwrap_err();
        assert!(err.to_string().contains("replaced"), "{err:#}");
    }

    #[test]
    fn a_live_processs_mapping_is_opened_through_map_files() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let mut mapping = parse_exec_mappings(&maps).remove(0);
        // Whatever the path says now, the mapping itself is read.
        mapping.path = "/nonexistent".into();
        let me = std::process::id();
        let file = open_mapped_object(me, &mapping).expect("map_files (needs root)");
        assert_eq!(file.metadata().unwrap().ino(), mapping.inode);
    }

    #[test]
    fn history_finds_the_containing_mapping() {
        let mut h = MappingHistory::default();
        h.add_all(parse_exec_mappings(MAPS));
        assert_eq!(h.find(0x7f10ab028000 + 5).unwrap().file_offset, 0x28000);
        assert!(h.find(0x7f10ab1bd000).is_none(), "end is exclusive");
        assert!(h.find(0x7f10aa000100).is_none(), "anonymous mapping");
        assert!(h.find(1).is_none());
    }

    #[test]
    fn stat_flags_tell_kernel_threads() {
        let kthreadd = "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 9";
        assert!(stat_flags(kthreadd).is_some_and(|f| f & PF_KTHREAD != 0));
        let user = "42 (a) b) c) S 1 42 42 0 -1 4194560 1234 7 5 0 9 3 0 0 20 0 3 0 100";
        assert!(stat_flags(user).is_some_and(|f| f & PF_KTHREAD == 0));
        assert_eq!(stat_flags("garbage"), None);
    }

    #[test]
    fn stat_faults_adds_minor_and_major() {
        let stat = "42 (a) b) c) S 1 42 42 0 -1 4194560 1234 7 5 2 9 3 0 0 20 0 3 0 100";
        assert_eq!(stat_faults(stat, false), Some(1239));
        assert_eq!(
            stat_faults(stat, true),
            Some(1239 + 7 + 2),
            "with reaped children's"
        );
        assert_eq!(stat_faults("42 (a) S 1 2", false), None);
    }

    #[test]
    fn stat_state_survives_odd_comms() {
        assert_eq!(stat_state("42 (a) b) c) S 1 2"), Some('S'));
        assert_eq!(stat_state("42 (zz) Z 1 2"), Some('Z'));
    }

    #[test]
    fn a_process_ends_when_its_zombie_leader_is_alone() {
        // Fields 3 (state) to 20 (num_threads) of a stat line.
        let stat = |state: char, threads: u32| {
            format!("42 (a) b) {state} 1 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 {threads} 0 99")
        };
        assert!(!stat_has_ended(&stat('S', 3)));
        assert!(!stat_has_ended(&stat('S', 1)));
        // The leader exited while two threads are still running or still exiting.
        assert!(!stat_has_ended(&stat('Z', 3)));
        assert!(stat_has_ended(&stat('Z', 1)));
        assert!(stat_has_ended(&stat('X', 1)));
    }

    #[test]
    fn own_process_is_alive_and_named() {
        let me = std::process::id();
        assert!(is_alive(me));
        assert!(!process_has_ended(me));
        require_process(me).unwrap();
        assert!(comm(me).is_some());
        assert!(thread_count(me) >= 1);
        assert!(thread_names(me).iter().any(|(tid, _)| *tid == me));
        assert!(require_process(u32::MAX - 1)
            .unwrap_err()
            .to_string()
            .contains("no such process"));
    }
}
