//! Names of JIT-compiled code: the `/tmp/perf-PID.map` a runtime writes for perf (a JVM with
//! `-XX:+DumpPerfMapAtExit` or `jcmd PID Compiler.perfmap`, node `--perf-basic-prof`, .NET
//! `DOTNET_PerfMapEnabled`): one `START SIZE NAME` line per code blob, in hex.
//!
//! The file lies in a directory everyone writes to and the target controls its contents, so it
//! is read as hostile input: not through a symlink, only when regular and owned by the target's
//! own user (or root), at most MAX_BYTES of it, names cut to MAX_NAME bytes and printed
//! escaped like every name the target controls.

use std::io::Read as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::PathBuf;

/// The most of a map read (a large JVM's map is a few MiB).
const MAX_BYTES: u64 = 64 << 20;
/// The longest name kept (C++ and Java signatures run long; beyond this they say nothing more).
const MAX_NAME: usize = 512;

/// Code ranges and their names, by start address.
#[derive(Debug, Default, PartialEq)]
pub struct PerfMap {
    ranges: Vec<(u64, u64, String)>,
}

/// Where process `pid`'s map is.
pub fn path_of(pid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/perf-{pid}.map"))
}

/// The identity of a map file as last read, to read it again only when it changed (a runtime
/// appends as it compiles, or writes it all at its exit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    inode: u64,
    size: u64,
    modified_ns: i64,
}

/// The stamp of `pid`'s map, if there is one a process of user `owner` may have written: a
/// regular file (not followed through a symlink) owned by `owner` or by root.
pub fn stamp(pid: u32, owner: u32) -> Option<Stamp> {
    let meta = std::fs::symlink_metadata(path_of(pid)).ok()?;
    acceptable(&meta, owner).then(|| Stamp {
        dev: meta.dev(),
        inode: meta.ino(),
        size: meta.size(),
        modified_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
    })
}

fn acceptable(meta: &std::fs::Metadata, owner: u32) -> bool {
    meta.file_type().is_file() && (meta.uid() == owner || meta.uid() == 0)
}

/// Reads `pid`'s map if it is acceptable (see `stamp`), checking the file opened, not the path.
pub fn read(pid: u32, owner: u32) -> Option<PerfMap> {
    let path = path_of(pid);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(&path)
        .ok()?;
    if !acceptable(&file.metadata().ok()?, owner) {
        log::info!(
            "not reading {}: not a regular file of the target's user",
            path.display()
        );
        return None;
    }
    let mut bytes = Vec::new();
    file.take(MAX_BYTES).read_to_end(&mut bytes).ok()?;
    Some(parse(&String::from_utf8_lossy(&bytes)))
}

/// The map's lines as perf reads them (`START SIZE NAME`, hex, `0x` optional); malformed lines
/// and empty ranges are skipped.
pub fn parse(text: &str) -> PerfMap {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let mut ranges: Vec<(u64, u64, String)> = text
        .lines()
        .filter_map(|line| {
            let mut parts = line.trim().splitn(3, ' ');
            let start = hex(parts.next()?)?;
            let size = hex(parts.next()?)?;
            let name = parts.next()?.trim();
            let end = start.checked_add(size)?;
            (size > 0 && !name.is_empty()).then(|| (start, end, cut(name).to_string()))
        })
        .collect();
    ranges.sort_by_key(|&(start, _, _)| start);
    PerfMap { ranges }
}

/// `name` cut to MAX_NAME bytes, at a character boundary.
fn cut(name: &str) -> &str {
    if name.len() <= MAX_NAME {
        return name;
    }
    let mut end = MAX_NAME;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

impl PerfMap {
    /// The name of the code at `addr`, and `addr`'s offset in it. Of overlapping ranges (a
    /// runtime reusing freed code space appends the new blob), the last one to start.
    pub fn lookup(&self, addr: u64) -> Option<(&str, u64)> {
        let after = self.ranges.partition_point(|&(start, _, _)| start <= addr);
        self.ranges[..after]
            .iter()
            .rev()
            .find(|&&(_, end, _)| addr < end)
            .map(|(start, _, name)| (name.as_str(), addr - start))
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_read_as_perf_reads_them_and_bad_ones_skipped() {
        let map = parse(
            "7f1d90945000 1000 Interpreter\n\
             0x7f1d90a00000 0x40 LFoo;::bar\n\
             nonsense line\n\
             7f1d90b00000 0 empty\n\
             ffffffffffffffff 10 overflows\n\
             7f1d90c00000 10\n\
             7f1d90d00000 20 name with spaces (and args)\n",
        );
        assert_eq!(map.lookup(0x7f1d9094555a), Some(("Interpreter", 0x55a)));
        assert_eq!(map.lookup(0x7f1d90a0003f), Some(("LFoo;::bar", 0x3f)));
        assert_eq!(map.lookup(0x7f1d90a00040), None, "end is exclusive");
        assert_eq!(
            map.lookup(0x7f1d90b00000),
            None,
            "an empty range names nothing"
        );
        assert_eq!(
            map.lookup(0x7f1d90d00001).map(|(n, _)| n),
            Some("name with spaces (and args)")
        );
        assert_eq!(map.ranges.len(), 3);
    }

    #[test]
    fn the_last_blob_to_start_names_reused_code_space_and_names_are_capped() {
        let long = "x".repeat(MAX_NAME + 100);
        let map = parse(&format!("1000 100 old\n1080 10 new\n2000 10 {long}\n"));
        assert_eq!(map.lookup(0x1085), Some(("new", 5)));
        assert_eq!(map.lookup(0x1095), Some(("old", 0x95)));
        assert_eq!(map.lookup(0x2000).unwrap().0.len(), MAX_NAME);
        assert_eq!(cut("é".repeat(400).as_str()).len(), MAX_NAME);
    }

    #[test]
    fn only_a_regular_file_of_the_targets_user_or_root_is_read() {
        // This process's own map path: the test writes one and reads it back as itself.
        let pid = std::process::id();
        let path = path_of(pid);
        std::fs::write(&path, "1000 10 mine\n").unwrap();
        let me = unsafe { libc::geteuid() };
        assert_eq!(
            read(pid, me).and_then(|m| m.lookup(0x1000).map(|(n, _)| n.to_owned())),
            Some("mine".to_owned())
        );
        assert!(stamp(pid, me).is_some());
        // Another user's (unless the file is root's, which any target may trust).
        if me != 0 {
            assert_eq!(read(pid, me + 1), None);
        }
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &path).unwrap();
        assert_eq!(read(pid, me), None, "a symlink is not followed");
        assert_eq!(stamp(pid, me), None);
        std::fs::remove_file(&path).unwrap();
    }
}
