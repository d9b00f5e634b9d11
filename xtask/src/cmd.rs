//! Child commands: every one is printed before it runs (`+ cargo build --release`), and a
//! failure names the command and its exit status.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Context, Result};

use crate::paths;

/// Read-only probes (`rustup toolchain list`, `ldd ...`) are printed only when this is set, so
/// that `setup` stays at one line per step; commands that change something are always printed.
static VERBOSE: AtomicBool = AtomicBool::new(false);

pub fn set_verbose(verbose: bool) {
    VERBOSE.store(verbose, Ordering::Relaxed);
}

/// A command line that knows how to print itself the way a shell would run it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cmd {
    program: String,
    args: Vec<String>,
    /// Environment variables set for this command only (printed as `NAME=value`).
    envs: Vec<(String, String)>,
    /// Directories put in front of PATH for this command only (printed as `PATH=dir:$PATH`).
    path_prefix: Vec<PathBuf>,
    dir: Option<PathBuf>,
}

impl Cmd {
    pub fn new(program: &str) -> Self {
        Self {
            program: program.to_owned(),
            args: Vec::new(),
            envs: Vec::new(),
            path_prefix: Vec::new(),
            dir: None,
        }
    }

    /// `cargo` run in the workspace root, so that plain `cargo build` means the default members.
    pub fn cargo(args: &[&str]) -> Self {
        Self::new("cargo").args(args).dir(&paths::workspace_root())
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn args<S: AsRef<str>>(mut self, args: &[S]) -> Self {
        self.args
            .extend(args.iter().map(|arg| arg.as_ref().to_owned()));
        self
    }

    pub fn env(mut self, name: &str, value: impl Into<String>) -> Self {
        self.envs.push((name.to_owned(), value.into()));
        self
    }

    pub fn prepend_path(mut self, dir: &Path) -> Self {
        self.path_prefix.push(dir.to_owned());
        self
    }

    pub fn dir(mut self, dir: &Path) -> Self {
        self.dir = Some(dir.to_owned());
        self
    }

    #[cfg(test)]
    pub fn program(&self) -> &str {
        &self.program
    }

    #[cfg(test)]
    pub fn arguments(&self) -> &[String] {
        &self.args
    }

    #[cfg(test)]
    pub fn env_value(&self, name: &str) -> Option<&str> {
        self.envs
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    #[cfg(test)]
    pub fn path_prefix(&self) -> &[PathBuf] {
        &self.path_prefix
    }

    /// Runs with inherited stdio; fails unless the command exits with status 0.
    pub fn run(&self) -> Result<()> {
        let status = self.status()?;
        if status.success() {
            Ok(())
        } else {
            bail!("`{self}` failed: {status}")
        }
    }

    /// Runs with inherited stdio and returns the exit status, whatever it is.
    pub fn status(&self) -> Result<ExitStatus> {
        eprintln!("+ {self}");
        self.command()
            .status()
            .with_context(|| format!("could not start `{self}`"))
    }

    /// Starts the command with the given stdout/stderr; stdin is closed.
    pub fn spawn(&self, stdout: Stdio, stderr: Stdio) -> Result<Child> {
        eprintln!("+ {self}");
        self.command()
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("could not start `{self}`"))
    }

    /// Runs a read-only probe and returns what it printed, whatever its exit status: callers
    /// decide what a failure means. Only fails when the program cannot be started.
    pub fn probe(&self) -> Result<Probe> {
        if VERBOSE.load(Ordering::Relaxed) {
            eprintln!("+ {self}");
        }
        let output = self
            .command()
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("could not start `{self}`"))?;
        Ok(Probe {
            success: output.status.success(),
            status: output.status,
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }

    /// Like [`Cmd::probe`], but a non-zero exit is an error that quotes the command's stderr.
    pub fn probe_ok(&self) -> Result<String> {
        let probe = self.probe()?;
        if probe.success {
            Ok(probe.stdout)
        } else {
            bail!("`{self}` failed: {}: {}", probe.status, probe.stderr.trim())
        }
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        command.env("PATH", self.child_path());
        for (name, value) in &self.envs {
            command.env(name, value);
        }
        if let Some(dir) = &self.dir {
            command.current_dir(dir);
        }
        command
    }

    fn child_path(&self) -> OsString {
        let mut dirs = self.path_prefix.clone();
        dirs.extend(paths::child_path_dirs());
        std::env::join_paths(dirs).unwrap_or_else(|_| std::env::var_os("PATH").unwrap_or_default())
    }
}

impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.path_prefix.is_empty() {
            let dirs: Vec<String> = self
                .path_prefix
                .iter()
                .map(|dir| dir.display().to_string())
                .collect();
            write!(f, "PATH={}:$PATH ", shell_quote(&dirs.join(":")))?;
        }
        for (name, value) in &self.envs {
            write!(f, "{name}={} ", shell_quote(value))?;
        }
        write!(f, "{}", shell_quote(&self.program))?;
        for arg in &self.args {
            write!(f, " {}", shell_quote(arg))?;
        }
        Ok(())
    }
}

/// What a probe printed.
#[derive(Debug)]
pub struct Probe {
    pub success: bool,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Quotes a word for display only when a shell would need it, so that printed commands can be
/// pasted back into a shell.
fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,+@%^".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_prints_env_path_and_quotes() {
        let cmd = Cmd::new("cargo")
            .args(&["test", "--", "--skip", "two words"])
            .env("MMAPSEM_TRACER", "/t/debug/mmapsem-trace")
            .prepend_path(Path::new("/usr/lib/llvm-22/bin"));
        assert_eq!(
            cmd.to_string(),
            "PATH=/usr/lib/llvm-22/bin:$PATH MMAPSEM_TRACER=/t/debug/mmapsem-trace \
             cargo test -- --skip 'two words'"
        );
    }

    #[test]
    fn shell_quote_handles_quotes_and_empty() {
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("--features=llvm-22"), "--features=llvm-22");
    }

    #[test]
    fn failing_command_names_itself_and_its_status() {
        let err = Cmd::new("sh")
            .args(&["-c", "exit 3"])
            .run()
            .unwrap_err()
            .to_string();
        assert_eq!(err, "`sh -c 'exit 3'` failed: exit status: 3");
    }

    #[test]
    fn missing_program_is_reported() {
        let err = Cmd::new("/nonexistent/program").probe().unwrap_err();
        assert!(err
            .to_string()
            .contains("could not start `/nonexistent/program`"));
    }
}
