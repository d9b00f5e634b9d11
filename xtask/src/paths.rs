//! Where things are: the workspace, its target directory, cargo's bin directory, and the PATH
//! children get.

use std::path::{Path, PathBuf};

/// The workspace root, found from where this crate lives rather than from the current
/// directory or the executable's location, so `cargo xtask` works from any subdirectory.
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// `CARGO_TARGET_DIR` when set (relative to the workspace root, as cargo reads it there),
/// otherwise `<root>/target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => workspace_root().join(dir),
        _ => workspace_root().join("target"),
    }
}

/// A binary built by the workspace, e.g. `binary("release", "mmapsem-trace")`.
pub fn binary(profile: &str, name: &str) -> PathBuf {
    target_dir().join(profile).join(name)
}

/// `$CARGO_HOME`, or `~/.cargo` as cargo and rustup default to.
pub fn cargo_home() -> PathBuf {
    match std::env::var_os("CARGO_HOME") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => home_dir().join(".cargo"),
    }
}

/// Where `cargo install` puts binaries such as bpf-linker.
pub fn cargo_bin() -> PathBuf {
    cargo_home().join("bin")
}

fn home_dir() -> PathBuf {
    std::env::var_os("HOME")
        .filter(|home| !home.is_empty())
        .map_or_else(|| PathBuf::from("/root"), PathBuf::from)
}

/// The PATH every child gets: cargo's bin directory first, so that the build (aya-build runs
/// bpf-linker from PATH) uses the bpf-linker that `setup` checked, even when the user's shell
/// has no `~/.cargo/bin` on PATH (CI, sudo).
pub fn child_path_dirs() -> Vec<PathBuf> {
    let inherited: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect())
        .unwrap_or_default();
    with_first_dir(cargo_bin(), inherited)
}

fn with_first_dir(first: PathBuf, rest: Vec<PathBuf>) -> Vec<PathBuf> {
    if rest.first() == Some(&first) {
        return rest;
    }
    std::iter::once(first).chain(rest).collect()
}

/// The first executable file called `name` in `dirs`, as a shell would find it.
pub fn find_executable(name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter()
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_bin_goes_first_once() {
        let bin = PathBuf::from("/root/.cargo/bin");
        let usr = PathBuf::from("/usr/bin");
        assert_eq!(
            with_first_dir(bin.clone(), vec![usr.clone()]),
            vec![bin.clone(), usr.clone()]
        );
        assert_eq!(
            with_first_dir(bin.clone(), vec![bin.clone(), usr.clone()]),
            vec![bin, usr]
        );
    }

    #[test]
    fn workspace_root_holds_the_workspace_manifest() {
        let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
        assert!(manifest.contains("[workspace]"));
    }

    #[test]
    fn finds_executables_only() {
        let dirs = vec![PathBuf::from("/nonexistent"), PathBuf::from("/bin")];
        assert_eq!(find_executable("sh", &dirs), Some(PathBuf::from("/bin/sh")));
        assert_eq!(find_executable("no-such-program-xtask", &dirs), None);
    }
}
