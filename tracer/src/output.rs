//! Writing reports safely as root: the destination is checked before tracing starts, and the
//! file is written to a fresh temporary beside it (O_EXCL, never through a planted symlink) and
//! renamed into place, so a reader never sees half a report.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};

/// Where a report goes.
#[derive(Clone, Debug)]
pub enum Destination {
    Stdout,
    File(PathBuf),
}

impl Destination {
    /// Fails now, before any tracing, if the file could not be written at the end.
    pub fn check_writable(&self) -> Result<()> {
        let Destination::File(path) = self else {
            return Ok(());
        };
        if path.is_dir() {
            bail!("cannot write {}: it is a directory", path.display());
        }
        let probe = tempfile::Builder::new()
            .prefix(".mmapsem-trace-")
            .tempfile_in(parent_dir(path))
            .with_context(|| format!("cannot write {}", path.display()))?;
        drop(probe);
        Ok(())
    }

    pub fn write(&self, contents: &str) -> Result<()> {
        match self {
            Destination::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(contents.as_bytes())
                    .and_then(|_| out.flush())
                    .context("writing report to stdout")
            }
            Destination::File(path) => write_atomically(path, contents),
        }
    }
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Writes via a temporary in the same directory and renames it over `path`. rename(2) replaces
/// a symlink at `path` instead of following it.
pub fn write_atomically(path: &Path, contents: &str) -> Result<()> {
    let mut tmp = tempfile::Builder::new()
        .prefix(".mmapsem-trace-")
        .tempfile_in(parent_dir(path))
        .with_context(|| format!("cannot write {}", path.display()))?;
    tmp.write_all(contents.as_bytes())
        .and_then(|_| tmp.as_file().sync_all())
        .with_context(|| format!("cannot write {}", path.display()))?;
    tmp.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_replaces_a_planted_symlink_without_following_it() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let out = dir.path().join("report.json");
        std::os::unix::fs::symlink(&victim, &out).unwrap();
        write_atomically(&out, "{}").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "{}");
        assert!(!std::fs::symlink_metadata(&out)
            .unwrap()
            .file_type()
            .is_symlink());
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
            .contains("directory"));
        let fine = Destination::File(dir.path().join("r.txt"));
        fine.check_writable().unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "probe file removed"
        );
    }
}
