//! cgroup v2: where the unified hierarchy is mounted, a cgroup's id (its directory's inode,
//! what `bpf_get_current_cgroup_id` returns on 64-bit kernels), and ids back to paths.
//!
//! Cgroup names are chosen by whoever may create cgroups (a delegated container's runtime):
//! they are returned as found, lossily decoded, and escaped where printed, like every name a
//! traced process controls.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified`
/// beside v1 controllers), from /proc/self/mountinfo.
pub fn unified_mount() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    cgroup2_mount_in(&mountinfo)
}

/// The first cgroup2 mount point in a mountinfo text (the fields after " - " are the type,
/// the source and the options; the fifth field is the mount point, octal-escaped).
fn cgroup2_mount_in(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        (fs.split_whitespace().next() == Some("cgroup2"))
            .then(|| mount.split_whitespace().nth(4).map(unescape_mountinfo))
            .flatten()
    })
}

/// Undoes mountinfo's `\ooo` escapes (of space, tab, newline and backslash).
fn unescape_mountinfo(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            let text = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(text, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    use std::os::unix::ffi::OsStringExt;
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// A cgroup given on the command line (`--cgroup`): its directory under the unified mount.
/// Accepts the path as /proc/PID/cgroup shows it (`/system.slice/redis.service`), relative
/// to the mount, or the directory itself (`/sys/fs/cgroup/system.slice/redis.service`).
pub fn resolve_given(given: &str, mount: &Path) -> Result<PathBuf> {
    let as_given = Path::new(given);
    let dir = if as_given.starts_with(mount) {
        as_given.to_path_buf()
    } else {
        mount.join(given.trim_start_matches('/'))
    };
    if dir
        .components()
        .any(|c| c == std::path::Component::ParentDir)
    {
        bail!("--cgroup {given}: a cgroup path may not contain '..'");
    }
    match std::fs::metadata(&dir) {
        Ok(meta) if meta.is_dir() => Ok(dir),
        _ => bail!(
            "--cgroup {given}: no such cgroup (cgroup v2 is mounted at {})",
            mount.display()
        ),
    }
}

/// The ids of `root` and of every cgroup below it (cgroupfs has no symlinks to follow).
/// Cgroups removed during the walk are skipped.
pub fn subtree_ids(root: &Path) -> Vec<u64> {
    let mut ids = Vec::new();
    walk(root, &mut |_, id| ids.push(id));
    ids
}

/// Calls `visit` with every cgroup directory at or below `root` and its id.
fn walk(root: &Path, visit: &mut dyn FnMut(&Path, u64)) {
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&dir) else {
            continue;
        };
        if !meta.is_dir() {
            continue;
        }
        visit(&dir, meta.ino());
        let Ok(children) = std::fs::read_dir(&dir) else {
            continue;
        };
        for child in children.flatten() {
            if child.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push(child.path());
            }
        }
    }
}

/// Names cgroup ids by their path under the unified mount (`/` for the root), learning the
/// hierarchy anew when an id is not known yet: a cgroup removed before it was looked up stays
/// unnamed.
#[derive(Debug)]
pub struct CgroupNames {
    mount: Option<PathBuf>,
    paths: HashMap<u64, String>,
    /// Ids a walk did not find: removed before it, never to be found (ids are inode numbers),
    /// so they trigger no more walks.
    missing: HashSet<u64>,
}

impl Default for CgroupNames {
    fn default() -> Self {
        Self::new()
    }
}

impl CgroupNames {
    pub fn new() -> Self {
        Self {
            mount: unified_mount(),
            paths: HashMap::new(),
            missing: HashSet::new(),
        }
    }

    /// Learns the paths of `ids` not known yet, walking the hierarchy at most once.
    pub fn learn_ids(&mut self, ids: impl IntoIterator<Item = u64>) {
        let unknown: Vec<u64> = ids
            .into_iter()
            .filter(|id| !self.paths.contains_key(id) && !self.missing.contains(id))
            .collect();
        if unknown.is_empty() {
            return;
        }
        self.learn();
        let missing = unknown
            .into_iter()
            .filter(|id| !self.paths.contains_key(id));
        self.missing.extend(missing);
    }

    /// Every cgroup named so far, by id (kept: the few thousand of a busy host at most).
    pub fn known(&self) -> &HashMap<u64, String> {
        &self.paths
    }

    /// Walks the hierarchy once per `paths_of` call that meets an unknown id; a walk of a
    /// machine's few thousand cgroups takes milliseconds.
    fn learn(&mut self) {
        let Some(mount) = &self.mount else {
            return;
        };
        let mut paths = HashMap::new();
        walk(mount, &mut |dir, id| {
            paths.insert(id, relative_path(mount, dir));
        });
        // Cgroups removed since keep their names: their processes' rows still need them.
        self.paths.extend(paths);
    }
}

/// `dir` as /proc/PID/cgroup writes it: `/` and the path below the mount.
fn relative_path(mount: &Path, dir: &Path) -> String {
    let below = dir.strip_prefix(mount).unwrap_or(dir);
    format!("/{}", below.to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup2_mount_is_found_beside_v1_controllers() {
        let mountinfo = "\
35 24 0:30 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
41 35 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
42 35 0:39 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
";
        assert_eq!(
            cgroup2_mount_in(mountinfo),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            cgroup2_mount_in("35 24 0:30 / /sys ro - sysfs sysfs rw\n"),
            None
        );
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        let line = "41 35 0:38 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount_in(line), Some(PathBuf::from("/mnt/cg two")));
    }

    #[test]
    fn paths_are_written_as_proc_writes_them() {
        let mount = Path::new("/sys/fs/cgroup");
        assert_eq!(relative_path(mount, mount), "/");
        assert_eq!(
            relative_path(mount, &mount.join("system.slice/redis.service")),
            "/system.slice/redis.service"
        );
    }

    #[test]
    fn a_given_cgroup_must_exist_and_stay_below_the_mount() {
        let mount = std::env::temp_dir().join(format!("cgroups-test-{}", std::process::id()));
        std::fs::create_dir_all(mount.join("a/b")).unwrap();
        assert_eq!(resolve_given("/a/b", &mount).unwrap(), mount.join("a/b"));
        assert_eq!(resolve_given("a", &mount).unwrap(), mount.join("a"));
        let full = mount.join("a").to_string_lossy().into_owned();
        assert_eq!(resolve_given(&full, &mount).unwrap(), mount.join("a"));
        let missing = resolve_given("/nope", &mount).unwrap_err().to_string();
        assert!(missing.contains("no such cgroup"), "{missing}");
        assert!(resolve_given("/a/../..", &mount).is_err());
        let mut ids = subtree_ids(&mount.join("a"));
        ids.sort_unstable();
        assert_eq!(ids.len(), 2, "a and a/b");
        let mut names = CgroupNames {
            mount: Some(mount.clone()),
            paths: HashMap::new(),
            missing: HashSet::new(),
        };
        let b_id = std::fs::metadata(mount.join("a/b")).unwrap().ino();
        names.learn_ids([b_id, u64::MAX]);
        assert_eq!(names.known()[&b_id], "/a/b");
        assert!(names.missing.contains(&u64::MAX), "not walked for again");
        std::fs::remove_dir_all(&mount).unwrap();
    }
}
