//! The object files user frames are symbolized from. Each is opened once, as a hostile target's
//! file must be (`procfs::open_mapped_object`: the mapped file itself, regular, size-capped),
//! and kept open: blazesym reads it as /proc/self/fd/N, which names the checked inode whatever
//! the target does to the path afterwards.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use object::Object as _;

use crate::system::procfs::{self, Mapping};
use crate::text::escaped_path;

/// Where separate debug files are looked for, and only there: root installs them, whereas the
/// target controls the directory of its objects and what their debug links name.
pub const DEBUG_DIRS: [&str; 2] = ["/usr/lib/debug", "/lib/debug"];

/// The directories debug files are looked for in: those given (`--debug-dir`, first), then
/// DEBUG_DIRS.
pub fn debug_dirs(given: &[PathBuf]) -> Vec<PathBuf> {
    given
        .iter()
        .cloned()
        .chain(DEBUG_DIRS.iter().map(PathBuf::from))
        .collect()
}

/// Sections naming other files that blazesym would open when reading an object's DWARF (next
/// to the object, or at the path they give): such objects are read for their symbol tables
/// only, and their debug file is looked for here instead.
const LINK_SECTIONS: [&str; 3] = [".gnu_debuglink", ".gnu_debugaltlink", ".debug_sup"];

/// One opened object, and its separate debug file if one is installed.
pub struct Object {
    /// Kept open so that `path` goes on naming the checked file.
    _file: File,
    /// /proc/self/fd/N of `_file`.
    pub path: PathBuf,
    /// Whether blazesym may read the object's DWARF (it names no other file).
    pub own_dwarf: bool,
    pub debug: Option<DebugFile>,
    /// (file offset range, vaddr) of each segment: debug files are looked up by vaddr.
    segments: Segments,
}

/// A debug file found in `DEBUG_DIRS`, open like the object.
pub struct DebugFile {
    _file: File,
    pub path: PathBuf,
}

impl Object {
    /// The ELF virtual address of `file_offset`, for looking it up in the debug file.
    pub fn vaddr_of(&self, file_offset: u64) -> Option<u64> {
        self.segments.vaddr_of(file_offset)
    }
}

/// Where an ELF object's segments are: (file offset range, virtual address) each, to turn a
/// mapped file offset into the address its unwind and debug info speak of.
#[derive(Clone, Debug, Default)]
pub struct Segments(Vec<(Range<u64>, u64)>);

impl Segments {
    pub fn of(elf: &object::File<'_>) -> Self {
        use object::ObjectSegment as _;
        Self(
            elf.segments()
                .map(|s| {
                    let (offset, size) = s.file_range();
                    (offset..offset + size, s.address())
                })
                .collect(),
        )
    }

    /// The virtual address of `file_offset`, inside one of the segments.
    pub fn vaddr_of(&self, file_offset: u64) -> Option<u64> {
        let (range, vaddr) = self.0.iter().find(|(r, _)| r.contains(&file_offset))?;
        Some(vaddr + (file_offset - range.start))
    }
}

/// Objects opened so far, by the mapping that named them and by (device, inode).
#[derive(Default)]
pub struct ObjectFiles {
    /// Where debug files are looked for (`debug_dirs`).
    debug_dirs: Vec<PathBuf>,
    by_id: HashMap<(u64, u64), Rc<Object>>,
    /// (pid, start, device, inode) of a mapping -> its object, None if refused.
    by_mapping: HashMap<(u32, u64, u64, u64), Option<Rc<Object>>>,
}

impl ObjectFiles {
    pub fn new(debug_dirs: Vec<PathBuf>) -> Self {
        raise_fd_limit();
        Self {
            debug_dirs,
            ..Self::default()
        }
    }

    /// The object `mapping` of process `pid` maps, or None if it cannot be opened safely (then
    /// its frames are shown as module+offset).
    pub fn get(&mut self, pid: u32, mapping: &Mapping) -> Option<Rc<Object>> {
        let key = (pid, mapping.start, mapping.dev, mapping.inode);
        if let Some(known) = self.by_mapping.get(&key) {
            return known.clone();
        }
        let object = match procfs::open_mapped_object(pid, mapping) {
            Ok(file) => self.object_for(file, mapping),
            Err(err) => {
                log::info!(
                    "not symbolizing frames in {}: {err:#}",
                    escaped_path(&mapping.path)
                );
                None
            }
        };
        self.by_mapping.insert(key, object.clone());
        object
    }

    fn object_for(&mut self, file: File, mapping: &Mapping) -> Option<Rc<Object>> {
        let meta = file.metadata().ok()?;
        let id = (meta.dev(), meta.ino());
        if let Some(known) = self.by_id.get(&id) {
            return Some(Rc::clone(known));
        }
        let object = Rc::new(inspect(file, &mapping.path, &self.debug_dirs)?);
        self.by_id.insert(id, Rc::clone(&object));
        Some(object)
    }
}

/// Reads what symbolization needs to know of an object before blazesym sees it.
fn inspect(file: File, recorded_path: &Path, debug_dirs: &[PathBuf]) -> Option<Object> {
    // SAFETY: read-only, dropped before returning; a target truncating the file meanwhile
    // could fault the read (SIGBUS), as for any tool that maps objects.
    let data = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let elf = object::File::parse(&*data).ok()?;
    let own_dwarf = LINK_SECTIONS
        .iter()
        .all(|name| elf.section_by_name(name).is_none());
    let build_id = elf.build_id().ok().flatten();
    // An object without a debug link may still have its debug file by build id.
    let (name, crc) = match elf.gnu_debuglink() {
        Ok(Some((name, crc))) => (OsStr::from_bytes(name), crc),
        _ => (OsStr::new(""), 0),
    };
    let debug = if build_id.is_some() || !name.is_empty() {
        find_debug_file(debug_dirs, name, crc, build_id, recorded_path)
    } else {
        None
    };
    let segments = Segments::of(&elf);
    Some(Object {
        path: fd_path(&file),
        _file: file,
        own_dwarf,
        debug,
        segments,
    })
}

fn fd_path(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// The installed debug file of an object whose debug link names `name` (checksum `crc`):
/// by build id, else by name, only inside `debug_dirs`.
fn find_debug_file(
    debug_dirs: &[PathBuf],
    name: &OsStr,
    crc: u32,
    build_id: Option<&[u8]>,
    recorded_path: &Path,
) -> Option<DebugFile> {
    for (path, check) in debug_candidates(debug_dirs, name, build_id, recorded_path) {
        let Ok(file) = procfs::open_regular(&path) else {
            continue;
        };
        if check == Check::Crc && !crc_matches(&file, crc) {
            log::debug!("{} does not match its debug link", escaped_path(&path));
            continue;
        }
        log::debug!(
            "debug info for {} from {}",
            escaped_path(recorded_path),
            escaped_path(&path)
        );
        return Some(DebugFile {
            path: fd_path(&file),
            _file: file,
        });
    }
    None
}

/// How a candidate debug file is known to be the right one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    /// Its path is the build id.
    BuildId,
    /// Its CRC32 is the one the debug link gives.
    Crc,
}

/// Where a debug file may be, GDB's order: `.build-id/xx/rest.debug`, then the link's name
/// in the debug directory and under the object's directory there. A name that is not a plain
/// file name (a path, `..`) is not followed.
fn debug_candidates(
    debug_dirs: &[PathBuf],
    name: &OsStr,
    build_id: Option<&[u8]>,
    recorded_path: &Path,
) -> Vec<(PathBuf, Check)> {
    let mut candidates = Vec::new();
    let plain_name = matches!(
        Path::new(name).components().collect::<Vec<_>>().as_slice(),
        [Component::Normal(_)]
    ) && !name.as_bytes().contains(&b'/');
    let object_dir = recorded_path
        .parent()
        .filter(|dir| {
            dir.components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        })
        .and_then(|dir| dir.strip_prefix("/").ok());
    for dir in debug_dirs {
        if let Some((first, rest)) = build_id
            .filter(|id| id.len() >= 2)
            .and_then(|id| id.split_first())
        {
            let hex: String = rest.iter().map(|b| format!("{b:02x}")).collect();
            candidates.push((
                dir.join(".build-id")
                    .join(format!("{first:02x}"))
                    .join(format!("{hex}.debug")),
                Check::BuildId,
            ));
        }
        if plain_name {
            candidates.push((dir.join(name), Check::Crc));
            if let Some(object_dir) = object_dir {
                candidates.push((dir.join(object_dir).join(name), Check::Crc));
            }
        }
    }
    candidates
}

fn crc_matches(file: &File, crc: u32) -> bool {
    // SAFETY: as in `inspect`.
    let Ok(data) = (unsafe { memmap2::Mmap::map(file) }) else {
        return false;
    };
    crc32fast::hash(&data) == crc
}

/// Objects stay open for the whole trace (one descriptor per distinct file): a system-wide
/// trace can see more than the usual soft limit of 1024.
fn raise_fd_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write a valid rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(candidates: &[(PathBuf, Check)]) -> Vec<String> {
        candidates
            .iter()
            .map(|(p, _)| p.display().to_string())
            .collect()
    }

    #[test]
    fn debug_files_are_looked_for_in_the_debug_directories() {
        let found = debug_candidates(
            &debug_dirs(&[PathBuf::from("/srv/debug")]),
            OsStr::new("libc.so.6.debug"),
            Some(&[0x93, 0xac, 0x61]),
            Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6"),
        );
        // A directory given with --debug-dir comes first.
        assert_eq!(
            paths(&found[..6]),
            [
                "/srv/debug/.build-id/93/ac61.debug",
                "/srv/debug/libc.so.6.debug",
                "/srv/debug/usr/lib/x86_64-linux-gnu/libc.so.6.debug",
                "/usr/lib/debug/.build-id/93/ac61.debug",
                "/usr/lib/debug/libc.so.6.debug",
                "/usr/lib/debug/usr/lib/x86_64-linux-gnu/libc.so.6.debug",
            ]
        );
        assert_eq!(found[0].1, Check::BuildId);
        assert_eq!(found[1].1, Check::Crc);
        assert_eq!(found.len(), 9);
        // No debug link: by build id alone.
        let by_id = debug_candidates(
            &debug_dirs(&[]),
            OsStr::new(""),
            Some(&[0x93, 0xac, 0x61]),
            Path::new("/usr/sbin/clamd"),
        );
        assert_eq!(
            paths(&by_id),
            [
                "/usr/lib/debug/.build-id/93/ac61.debug",
                "/lib/debug/.build-id/93/ac61.debug",
            ]
        );
    }

    #[test]
    fn debug_links_naming_paths_are_not_followed() {
        for hostile in [
            "/etc/shadow",
            "../../../../etc/shadow",
            "..",
            "a/b",
            "/dev/tty",
        ] {
            let found = debug_candidates(
                &debug_dirs(&[]),
                OsStr::new(hostile),
                None,
                Path::new("/tmp/x/lib.so"),
            );
            assert!(found.is_empty(), "{hostile}: {:?}", paths(&found));
        }
        let found = debug_candidates(
            &debug_dirs(&[]),
            OsStr::new("ok.debug"),
            None,
            Path::new("/tmp/x/lib.so"),
        );
        for path in paths(&found) {
            assert!(DEBUG_DIRS.iter().any(|d| path.starts_with(d)), "{path}");
        }
    }
}
