//! Writing reports safely as root: the destination is checked before tracing starts, and what
//! is at the path decides how it is written.
//!
//! - A regular file, or nothing yet: a fresh temporary beside it (O_EXCL, never through a
//!   planted symlink) renamed into place, so a reader never sees half a report; a replaced
//!   file keeps its permission bits and owner.
//! - A character device or a FIFO (`/dev/null`, a named pipe): opened and written to, never
//!   replaced: renaming a file over `/dev/null` would break the whole machine.
//! - The tracer's own stdout or stderr under another name (`/dev/stdout`, `/proc/self/fd/1`):
//!   written to that descriptor, as the user asked.
//! - A symlink to a device or FIFO owned by root or the user running the tracer, in a
//!   directory nobody else can change it in: written through, like the device itself. Any
//!   other symlink is replaced, never followed: one left by another user (in /tmp, say) must
//!   not redirect root's write.
//! - A directory, block device or socket: refused.

use std::fs::{File, Metadata, OpenOptions};
use std::io::Write as _;
use std::os::fd::AsFd as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};

use crate::cli::STDOUT_NAME;

/// Where a report goes.
#[derive(Clone, Debug)]
pub enum Destination {
    Stdout,
    File(PathBuf),
}

/// How a path is written, decided by what is there now.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// The tracer's own open descriptor (1 or 2) under another name.
    OwnDescriptor(i32),
    /// A device or FIFO, opened for writing; `follow` when reached through a trusted symlink.
    WriteThrough { follow: bool },
    /// A temporary beside the path renamed over it, with the permissions and owner of the
    /// regular file it replaces, if any.
    Replace { keep: Option<(u32, u32, u32)> },
}

impl Destination {
    /// `-` is standard output; anything else a file.
    pub fn from_arg(path: &Path) -> Self {
        if path == Path::new(STDOUT_NAME) {
            Destination::Stdout
        } else {
            Destination::File(path.to_path_buf())
        }
    }

    /// Fails now, before any tracing, if the file could not be written at the end.
    pub fn check_writable(&self) -> Result<()> {
        let Destination::File(path) = self else {
            return Ok(());
        };
        let cannot = || format!("cannot write {}", path.display());
        match target(path).with_context(cannot)? {
            Target::Replace { .. } => {
                let probe = tempfile::Builder::new()
                    .prefix(".mmapsem-trace-")
                    .tempfile_in(parent_dir(path))
                    .with_context(cannot)?;
                drop(probe);
            }
            // Opening a FIFO would wait for its reader; a device is checked by writing.
            Target::WriteThrough { .. } | Target::OwnDescriptor(_) => {}
        }
        Ok(())
    }

    pub fn write(&self, contents: &str) -> Result<()> {
        self.write_bytes(contents.as_bytes())
    }

    /// `write` for binary contents (a gzipped profile).
    pub fn write_bytes(&self, contents: &[u8]) -> Result<()> {
        match self {
            Destination::Stdout => {
                write_descriptor(1, contents).context("writing report to stdout")
            }
            Destination::File(path) => write_file(path, contents),
        }
    }

    /// What identifies the file a destination replaces, to refuse two outputs to one file
    /// (one would silently replace the other): its device and inode when it exists (whatever
    /// the spelling, hard or symbolic link), else its directory's canonical path and its
    /// name. None for what is written to rather than replaced (stdout, a device, a FIFO),
    /// where two outputs follow each other.
    pub fn replaced_file(&self) -> Option<Identity> {
        let Destination::File(path) = self else {
            return None;
        };
        if !matches!(target(path), Ok(Target::Replace { .. })) {
            return None;
        }
        if let Ok(meta) = std::fs::metadata(path) {
            return Some(Identity::Inode(meta.dev(), meta.ino()));
        }
        let dir = parent_dir(path);
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        Some(Identity::Path(
            dir.join(path.file_name().unwrap_or_default()),
        ))
    }
}

/// See Destination::replaced_file.
#[derive(Debug, PartialEq, Eq)]
pub enum Identity {
    Inode(u64, u64),
    Path(PathBuf),
}

fn fd_metadata(fd: i32) -> Option<Metadata> {
    // SAFETY: borrowing a descriptor of this process for the call only, never closing it.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let file = File::from(fd.try_clone_to_owned().ok()?);
    file.metadata().ok()
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Decides how `path` is written (see the module's doc).
fn target(path: &Path) -> Result<Target> {
    if let Ok(meta) = std::fs::metadata(path) {
        for fd in [1, 2] {
            if fd_metadata(fd).is_some_and(|own| same_file(&own, &meta)) {
                return Ok(Target::OwnDescriptor(fd));
            }
        }
    }
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Target::Replace { keep: None })
        }
        Err(err) => return Err(err.into()),
    };
    let kind = meta.file_type();
    if kind.is_symlink() {
        let trusted = std::fs::metadata(parent_dir(path))
            .is_ok_and(|dir| symlink_is_trusted(meta.uid(), &dir, effective_uid()));
        let points_to = std::fs::metadata(path).map(|m| m.file_type());
        return Ok(match points_to {
            Ok(kind) if trusted && (kind.is_char_device() || kind.is_fifo()) => {
                Target::WriteThrough { follow: true }
            }
            // Replaced, never followed.
            _ => Target::Replace { keep: None },
        });
    }
    if kind.is_file() {
        return Ok(Target::Replace {
            keep: Some((meta.mode() & 0o777, meta.uid(), meta.gid())),
        });
    }
    if kind.is_char_device() || kind.is_fifo() {
        return Ok(Target::WriteThrough { follow: false });
    }
    let what = if kind.is_dir() {
        "a directory"
    } else if kind.is_block_device() {
        "a block device"
    } else {
        "a socket"
    };
    bail!("it is {what}")
}

fn same_file(a: &Metadata, b: &Metadata) -> bool {
    a.dev() == b.dev() && a.ino() == b.ino()
}

fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Whether a symlink owned by `link_owner` in directory `dir` can only have been made by root
/// or by `me`: its owner is one of them, and no one else can replace it (the directory is
/// theirs and writable by nobody else, or sticky, as /tmp is, where only a link's owner may
/// remove it).
fn symlink_is_trusted(link_owner: u32, dir: &Metadata, me: u32) -> bool {
    let ours = |uid: u32| uid == 0 || uid == me;
    let others_can_write = dir.mode() & 0o022 != 0;
    let sticky = dir.mode() & libc::S_ISVTX != 0;
    ours(link_owner) && ours(dir.uid()) && (!others_can_write || sticky)
}

fn write_file(path: &Path, contents: &[u8]) -> Result<()> {
    let cannot = || format!("cannot write {}", path.display());
    match target(path).with_context(cannot)? {
        Target::OwnDescriptor(fd) => write_descriptor(fd, contents).with_context(cannot),
        Target::WriteThrough { follow } => {
            write_through(path, follow, contents).with_context(cannot)
        }
        Target::Replace { keep } => replace(path, keep, contents).with_context(cannot),
    }
}

fn write_descriptor(fd: i32, contents: &[u8]) -> std::io::Result<()> {
    if fd == 2 {
        let mut err = std::io::stderr().lock();
        return err.write_all(contents).and_then(|()| err.flush());
    }
    let mut out = std::io::stdout().lock();
    out.write_all(contents).and_then(|()| out.flush())
}

/// Writes into the device or FIFO at `path` without creating or truncating anything.
fn write_through(path: &Path, follow: bool, contents: &[u8]) -> Result<()> {
    let mut options = OpenOptions::new();
    options.write(true);
    if !follow {
        // Swapped for a symlink since it was looked at: refused (ELOOP), not followed.
        options.custom_flags(libc::O_NOFOLLOW);
    }
    let mut file = options.open(path)?;
    let kind = file.metadata()?.file_type();
    if !(kind.is_char_device() || kind.is_fifo()) {
        bail!("it changed from a device or FIFO while being opened");
    }
    file.write_all(contents)?;
    Ok(())
}

/// Writes via a temporary in the same directory and renames it over `path`. rename(2) replaces
/// a symlink at `path` instead of following it.
fn replace(path: &Path, keep: Option<(u32, u32, u32)>, contents: &[u8]) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut tmp = tempfile::Builder::new()
        .prefix(".mmapsem-trace-")
        // A new file as the shell would make it (the umask applies); a replaced one gets
        // its predecessor's bits below.
        .permissions(std::fs::Permissions::from_mode(0o666))
        .tempfile_in(parent_dir(path))?;
    tmp.write_all(contents)?;
    if let Some((mode, uid, gid)) = keep {
        // The owner first: chown clears set-id bits, and only permission bits are kept
        // anyway. Only root may give a file away; anyone else keeps their own.
        let _ = std::os::unix::fs::fchown(tmp.as_file().as_fd(), Some(uid), Some(gid));
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    tmp.as_file().sync_all()?;
    // The bare io error: PersistError's message repeats it.
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn writes_and_replaces_a_planted_symlink_without_following_it() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let out = dir.path().join("report.json");
        std::os::unix::fs::symlink(&victim, &out).unwrap();
        write_file(&out, b"{}").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "{}");
        assert!(!std::fs::symlink_metadata(&out)
            .unwrap()
            .file_type()
            .is_symlink());
    }

    #[test]
    fn a_replaced_file_keeps_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("report.txt");
        std::fs::write(&out, "old").unwrap();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_file(&out, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "new");
        assert_eq!(mode(&out), 0o640);
        // Set-id bits are not carried over to a file written by root.
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o4755)).unwrap();
        write_file(&out, b"newer").unwrap();
        assert_eq!(mode(&out), 0o755);
    }

    #[test]
    fn a_new_file_gets_the_umask_not_0600() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("new.txt");
        write_file(&out, b"x").unwrap();
        // SAFETY: umask only swaps the process's mask; it is put back at once.
        let umask = unsafe {
            let mask = libc::umask(0o022);
            libc::umask(mask);
            mask
        };
        assert_eq!(mode(&out), 0o666 & !umask);
    }

    /// A FIFO stands in for any non-regular file: written to, never replaced.
    #[test]
    fn a_fifo_is_written_through_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
        };
        Destination::File(fifo.clone()).check_writable().unwrap();
        write_file(&fifo, b"through the pipe").unwrap();
        assert_eq!(reader.join().unwrap(), "through the pipe");
        assert!(std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo());
    }

    #[test]
    fn trusted_symlinks_are_ours_in_a_directory_no_one_else_changes() {
        let dir = |mode: u32| {
            let d = tempfile::tempdir().unwrap();
            std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(mode)).unwrap();
            let meta = std::fs::metadata(d.path()).unwrap();
            (d, meta)
        };
        let me = effective_uid();
        let (_d, private) = dir(0o755);
        assert!(symlink_is_trusted(me, &private, me));
        assert!(
            symlink_is_trusted(0, &private, me),
            "root's own links (/dev)"
        );
        assert!(
            !symlink_is_trusted(65534, &private, me),
            "another user's link"
        );
        let (_d, open) = dir(0o777);
        assert!(!symlink_is_trusted(me, &open, me), "anyone could swap it");
        let (_d, tmp) = dir(0o1777);
        assert!(symlink_is_trusted(me, &tmp, me), "sticky: only its owner");
        assert!(!symlink_is_trusted(65534, &tmp, me), "planted in /tmp");
    }

    #[test]
    fn directories_block_devices_and_sockets_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = Destination::File(dir.path().to_path_buf())
            .check_writable()
            .unwrap_err();
        assert!(format!("{err:#}").ends_with("it is a directory"), "{err:#}");
        let socket = dir.path().join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let err = Destination::File(socket).check_writable().unwrap_err();
        assert!(format!("{err:#}").ends_with("it is a socket"), "{err:#}");
    }

    #[test]
    fn one_file_under_two_spellings_has_one_identity() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("r.txt");
        let dotted = dir.path().join(".").join("r.txt");
        let id = |p: &Path| Destination::File(p.to_path_buf()).replaced_file().unwrap();
        assert_eq!(id(&file), id(&dotted), "not there yet");
        std::fs::write(&file, "").unwrap();
        let hard = dir.path().join("hard");
        std::fs::hard_link(&file, &hard).unwrap();
        let soft = dir.path().join("soft");
        std::os::unix::fs::symlink(&file, &soft).unwrap();
        assert_eq!(id(&file), id(&dotted));
        assert_eq!(id(&file), id(&hard));
        assert_eq!(id(&file), id(&soft));
        assert_ne!(id(&file), id(&dir.path().join("other")));
        assert_eq!(Destination::Stdout.replaced_file(), None);
    }

    #[test]
    fn dash_is_stdout() {
        assert!(matches!(
            Destination::from_arg(Path::new("-")),
            Destination::Stdout
        ));
        assert!(matches!(
            Destination::from_arg(Path::new("./-")),
            Destination::File(_)
        ));
    }

    #[test]
    fn unwritable_destinations_fail_early() {
        let missing = Destination::File("/nonexistent-dir-mmapsem/report.json".into());
        let err = missing.check_writable().unwrap_err();
        assert!(format!("{err:#}").contains("cannot write /nonexistent-dir-mmapsem/report.json"));
        let dir = tempfile::tempdir().unwrap();
        let is_dir = Destination::File(dir.path().to_path_buf());
        assert!(is_dir
            .check_writable()
            .unwrap_err()
            .to_string()
            .contains("cannot write"));
        let fine = Destination::File(dir.path().join("r.txt"));
        fine.check_writable().unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "probe file removed"
        );
    }
}
