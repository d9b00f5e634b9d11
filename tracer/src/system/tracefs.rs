//! Tracepoint presence and field layouts, read from tracefs at startup: layouts change between
//! kernels (memcg_path became memcg_id around 6.13), so nothing is compiled in.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context as _, Result};
use tracer_common::TracepointFields;

/// Tracing roots in the order the kernel documentation gives them.
const CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Test hook: point the tool at another tracefs tree (e.g. one lacking a tracepoint).
const OVERRIDE_ENV: &str = "MMAPSEM_TRACEFS";

/// Whether the tool runs with privileges its caller lacks (file capabilities, setuid): the
/// kernel's AT_SECURE, as the dynamic loader uses it.
pub fn secure_execution() -> bool {
    // SAFETY: getauxval reads the auxiliary vector; AT_SECURE is always present.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// The environment variable `name` (an MMAPSEM_* setting that changes what the tool reads),
/// unless the tool runs with privileges its caller lacks: then the environment is the
/// caller's, who must not point a privileged reader elsewhere.
pub fn trusted_env(name: &str) -> Option<std::ffi::OsString> {
    let value = std::env::var_os(name)?;
    if secure_execution() {
        log::warn!("ignoring {name}: running with file capabilities or setuid");
        return None;
    }
    Some(value)
}

#[derive(Clone, Debug)]
pub struct Tracefs {
    root: PathBuf,
}

/// A tracepoint the tool needs, with the kernel release that introduced it.
#[derive(Clone, Copy, Debug)]
pub struct Needed {
    pub category: &'static str,
    pub name: &'static str,
    pub since: &'static str,
}

// The core's tracepoints: the families name theirs in their probes modules. These stay here
// because the preflight (`run.rs`) requires them before anything loads, and reading their
// layouts (`mmap_lock_fields`) depends on which one it is.
pub const MMAP_LOCK_START: Needed = Needed {
    category: "mmap_lock",
    name: "mmap_lock_start_locking",
    since: "5.10",
};
pub const MMAP_LOCK_ACQUIRED: Needed = Needed {
    category: "mmap_lock",
    name: "mmap_lock_acquire_returned",
    since: "5.10",
};
pub const MMAP_LOCK_RELEASED: Needed = Needed {
    category: "mmap_lock",
    name: "mmap_lock_released",
    since: "5.10",
};

impl Tracefs {
    /// Finds tracefs, mounting it at /sys/kernel/tracing when nothing is mounted (we are
    /// privileged by now; systems without systemd often leave it unmounted).
    pub fn locate() -> Result<Self> {
        if let Some(root) = trusted_env(OVERRIDE_ENV) {
            return Ok(Self { root: root.into() });
        }
        if let Some(found) = Self::find_mounted() {
            return Ok(found);
        }
        if let Some(denied) = Self::unreadable() {
            bail!(
                "not enough privilege: cannot read tracefs at {} (mode 0700); without root, \
                 tracing needs CAP_DAC_READ_SEARCH besides CAP_BPF and CAP_PERFMON",
                denied.display()
            );
        }
        mount_tracefs(CANDIDATES[0])?;
        Self::find_mounted()
            .ok_or_else(|| anyhow!("tracefs mounted but {} has no events", CANDIDATES[0]))
    }

    /// A tracefs that is there but that we may not look into (a user without
    /// CAP_DAC_READ_SEARCH): mounting another one would fail with a misleading error.
    fn unreadable() -> Option<PathBuf> {
        CANDIDATES.iter().map(PathBuf::from).find(|root| {
            std::fs::read_dir(root)
                .is_err_and(|err| err.kind() == std::io::ErrorKind::PermissionDenied)
        })
    }

    fn find_mounted() -> Option<Self> {
        CANDIDATES
            .iter()
            .map(PathBuf::from)
            .find(|root| root.join("events").is_dir())
            .map(|root| Self { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn event_dir(&self, tp: &Needed) -> PathBuf {
        self.root.join("events").join(tp.category).join(tp.name)
    }

    /// Fails naming the tracepoint and the kernel that added it when it is missing.
    pub fn require(&self, tp: &Needed) -> Result<()> {
        if self.event_dir(tp).join("format").is_file() {
            return Ok(());
        }
        bail!(
            "kernel lacks tracepoint {}:{} (added in Linux {}; running {})",
            tp.category,
            tp.name,
            tp.since,
            kernel_release()
        )
    }

    pub fn has(&self, tp: &Needed) -> bool {
        self.event_dir(tp).join("format").is_file()
    }

    /// Offset of field `name` of `tp`, checking its size.
    pub fn field_offset(&self, tp: &Needed, name: &str, size: u32) -> Result<u32> {
        self.require(tp)?;
        let path = self.event_dir(tp).join("format");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        match parse_format(&text).into_iter().find(|f| f.name == name) {
            Some(f) if f.size == size => Ok(f.offset),
            Some(f) => bail!(
                "{}: field {name} has size {}, expected {size}",
                tp.name,
                f.size
            ),
            None => bail!("{}: no field {name} in {}", tp.name, path.display()),
        }
    }

    /// Offsets of the mm / write / success fields of one mmap_lock tracepoint.
    pub fn mmap_lock_fields(&self, tp: &Needed) -> Result<TracepointFields> {
        let is_acquire = tp.name == MMAP_LOCK_ACQUIRED.name;
        Ok(TracepointFields {
            mm: self.field_offset(tp, "mm", 8)?,
            write: self.field_offset(tp, "write", 1)?,
            success: if is_acquire {
                self.field_offset(tp, "success", 1)?
            } else {
                0
            },
            _pad: 0,
        })
    }
}

/// One `field:` line of a tracepoint format file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FormatField {
    pub name: String,
    pub offset: u32,
    pub size: u32,
}

/// Parses `field:TYPE NAME; offset:N; size:N; signed:N;` lines; other lines are skipped.
pub fn parse_format(text: &str) -> Vec<FormatField> {
    text.lines().filter_map(parse_field_line).collect()
}

fn parse_field_line(line: &str) -> Option<FormatField> {
    let mut parts = line.trim().split(';').map(str::trim);
    let decl = parts.next()?.strip_prefix("field:")?;
    let name = decl.split_whitespace().last()?;
    let name = name.split('[').next()?.trim_start_matches('*');
    let mut offset = None;
    let mut size = None;
    for part in parts {
        if let Some(v) = part.strip_prefix("offset:") {
            offset = v.parse().ok();
        } else if let Some(v) = part.strip_prefix("size:") {
            size = v.parse().ok();
        }
    }
    Some(FormatField {
        name: name.to_string(),
        offset: offset?,
        size: size?,
    })
}

fn mount_tracefs(at: &str) -> Result<()> {
    let target = std::ffi::CString::new(at)?;
    let fstype = c"tracefs";
    let source = c"nodev";
    // SAFETY: all pointers are valid NUL-terminated strings; data may be NULL.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        bail!("tracefs is not mounted and mounting it at {at} failed: {err} (try: mount -t tracefs nodev {at})");
    }
    Ok(())
}

pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACQUIRE_6_18: &str = "name: mmap_lock_acquire_returned
ID: 675
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:struct mm_struct * mm;\toffset:8;\tsize:8;\tsigned:0;
\tfield:u64 memcg_id;\toffset:16;\tsize:8;\tsigned:0;
\tfield:bool write;\toffset:24;\tsize:1;\tsigned:0;
\tfield:bool success;\toffset:25;\tsize:1;\tsigned:0;

print fmt: \"mm=%p\", REC->mm
";

    /// Before ~6.13 the events carried a memcg_path string (a __data_loc u32) instead.
    const ACQUIRE_6_1: &str = "format:
\tfield:struct mm_struct * mm;\toffset:8;\tsize:8;\tsigned:0;
\tfield:__data_loc char[] memcg_path;\toffset:16;\tsize:4;\tsigned:0;
\tfield:bool write;\toffset:20;\tsize:1;\tsigned:0;
\tfield:bool success;\toffset:21;\tsize:1;\tsigned:0;
";

    fn offset_of(fields: &[FormatField], name: &str) -> u32 {
        fields.iter().find(|f| f.name == name).unwrap().offset
    }

    #[test]
    fn parses_current_layout() {
        let f = parse_format(ACQUIRE_6_18);
        assert_eq!(f.len(), 6);
        assert_eq!(offset_of(&f, "mm"), 8);
        assert_eq!(offset_of(&f, "write"), 24);
        assert_eq!(offset_of(&f, "success"), 25);
    }

    #[test]
    fn parses_memcg_path_layout() {
        let f = parse_format(ACQUIRE_6_1);
        assert_eq!(offset_of(&f, "memcg_path"), 16);
        assert_eq!(offset_of(&f, "write"), 20);
        assert_eq!(offset_of(&f, "success"), 21);
    }

    #[test]
    fn missing_tracepoint_names_it_and_its_kernel() {
        let dir = tempfile::tempdir().unwrap();
        let fs = Tracefs {
            root: dir.path().to_path_buf(),
        };
        let err = fs.require(&MMAP_LOCK_RELEASED).unwrap_err().to_string();
        assert!(err.contains("mmap_lock:mmap_lock_released"), "{err}");
        assert!(err.contains("Linux 5.10"), "{err}");
    }

    #[test]
    fn reads_fields_from_a_tracefs_tree() {
        let dir = tempfile::tempdir().unwrap();
        let event = dir
            .path()
            .join("events/mmap_lock/mmap_lock_acquire_returned");
        std::fs::create_dir_all(&event).unwrap();
        std::fs::write(event.join("format"), ACQUIRE_6_1).unwrap();
        let fs = Tracefs {
            root: dir.path().to_path_buf(),
        };
        let fields = fs.mmap_lock_fields(&MMAP_LOCK_ACQUIRED).unwrap();
        assert_eq!((fields.mm, fields.write, fields.success), (8, 20, 21));
    }
}
