//! `mmapsem-trace [options] -- CMD ARGS`: the command is forked and held just before its
//! execve until the programs are attached and armed, so that the trace covers it from its
//! first instruction (the ELF loader's own mmaps included); the tracer then exits with the
//! command's status.

use std::ffi::CString;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

use anyhow::{bail, Context as _, Result};

/// Exit status of a command that was not found (as shells use it).
const NOT_FOUND: i32 = 127;
/// Exit status of a command found but not executable (as shells use it), or whose tracer went
/// away before letting it run.
const NOT_EXECUTABLE: i32 = 126;
const NEVER_RELEASED: i32 = NOT_EXECUTABLE;

/// A command forked and waiting for `release` before it execs.
pub struct Launched {
    pub pid: u32,
    /// With the live view on the terminal: what the command wrote (its stdout and stderr go to
    /// a pipe instead of into the view's screen), kept for printing after the view closes.
    pub output: Option<CapturedOutput>,
    program: String,
    go: Option<OwnedFd>,
    /// Read end of a close-on-exec pipe: closed by a successful execve, or carrying its errno.
    exec_result: Option<OwnedFd>,
}

/// The command could not be executed: the tracer says so in one line and exits with the
/// status a shell would give (127 not found, 126 otherwise), without a report of its own fork.
#[derive(Debug)]
pub struct ExecFailed {
    pub program: String,
    pub error: std::io::Error,
}

impl ExecFailed {
    pub fn exit_code(&self) -> i32 {
        match self.error.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => NOT_FOUND,
            _ => NOT_EXECUTABLE,
        }
    }
}

impl std::fmt::Display for ExecFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let program = self.program.escape_debug();
        let error = std::io::Error::from_raw_os_error(self.error.raw_os_error().unwrap_or(0));
        // The bare strerror text, as a shell prints it ("No such file or directory").
        let message = error.to_string();
        let message = message.split(" (os error").next().unwrap_or(&message);
        write!(f, "cannot run {program}: {message}")
    }
}

impl std::error::Error for ExecFailed {}

/// Who a launched command runs as (`--user`): resolved before the fork, applied in the child
/// just before its execve, as `sudo -u USER` would, with HOME, USER and LOGNAME set for it.
pub struct Identity {
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: Vec<libc::gid_t>,
    env: Vec<CString>,
}

impl Identity {
    /// The user named `user` (a name or a numeric uid) in the password database.
    pub fn of(user: &str) -> Result<Self> {
        let name = CString::new(user).context("a user name contains a NUL byte")?;
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut buffer = vec![0 as libc::c_char; 16 * 1024];
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let (buf, len) = (buffer.as_mut_ptr(), buffer.len());
        // SAFETY: every pointer is to a live buffer of ours, `len` long for `buf`.
        let status = match user.parse::<libc::uid_t>() {
            Ok(uid) => unsafe { libc::getpwuid_r(uid, &mut entry, buf, len, &mut found) },
            Err(_) => unsafe { libc::getpwnam_r(name.as_ptr(), &mut entry, buf, len, &mut found) },
        };
        if status != 0 || found.is_null() {
            bail!("--user {}: no such user", user.escape_debug());
        }
        // SAFETY: getpwnam_r filled `entry` with C strings pointing into `buffer`.
        let (login, home) = unsafe {
            (
                std::ffi::CStr::from_ptr(entry.pw_name).to_owned(),
                std::ffi::CStr::from_ptr(entry.pw_dir).to_owned(),
            )
        };
        let groups = groups_of(&login, entry.pw_gid)?;
        let mut env: Vec<CString> = std::env::vars_os()
            .filter(|(key, _)| !matches!(key.to_str(), Some("HOME" | "USER" | "LOGNAME")))
            .filter_map(|(key, value)| {
                let mut pair = key.into_encoded_bytes();
                pair.push(b'=');
                pair.extend(value.into_encoded_bytes());
                CString::new(pair).ok()
            })
            .collect();
        for (key, value) in [("HOME", &home), ("USER", &login), ("LOGNAME", &login)] {
            let mut pair = format!("{key}=").into_bytes();
            pair.extend(value.as_bytes());
            env.push(CString::new(pair).expect("no NUL in a C string's bytes"));
        }
        Ok(Self {
            uid: entry.pw_uid,
            gid: entry.pw_gid,
            groups,
            env,
        })
    }

    /// In the forked child: drops to this identity. Only async-signal-safe calls.
    unsafe fn assume(&self) -> bool {
        // SAFETY: the groups vector is alive in this copy of the process.
        unsafe {
            libc::setgroups(self.groups.len(), self.groups.as_ptr()) == 0
                && libc::setgid(self.gid) == 0
                && libc::setuid(self.uid) == 0
        }
    }
}

/// The supplementary groups of `login` (with `gid`), as initgroups would set them.
fn groups_of(login: &std::ffi::CStr, gid: libc::gid_t) -> Result<Vec<libc::gid_t>> {
    let mut count: libc::c_int = 64;
    loop {
        let mut groups = vec![0 as libc::gid_t; count as usize];
        // SAFETY: `groups` holds `count` entries; getgrouplist updates `count`.
        let got =
            unsafe { libc::getgrouplist(login.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if got >= 0 {
            groups.truncate(count as usize);
            return Ok(groups);
        }
        if count as usize <= groups.len() {
            bail!("cannot read the groups of {}", login.to_string_lossy());
        }
    }
}

/// The output of a command run beside the live view: the last CAPTURED_BYTES of it, and
/// whether the pipe was read to its end.
#[derive(Clone, Default)]
pub struct CapturedOutput {
    kept: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    closed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// How long `take` waits for the reader to reach the end of the pipe: a command's last
/// writes may still be in it when the trace ends with the command's exit.
const LAST_WRITES: std::time::Duration = std::time::Duration::from_millis(500);

/// How much of a command's output is kept while the live view runs (the end of it).
const CAPTURED_BYTES: usize = 1 << 20;

impl CapturedOutput {
    /// Reads `pipe` until every writer closed it (on a thread of its own: the command's own
    /// children may keep it open after the trace).
    fn drain(pipe: OwnedFd) -> Self {
        let captured = Self::default();
        let buffer = captured.clone();
        std::thread::spawn(move || {
            let mut pipe = std::fs::File::from(pipe);
            let mut chunk = [0u8; 8192];
            while let Ok(n @ 1..) = std::io::Read::read(&mut pipe, &mut chunk) {
                let mut kept = buffer.kept.lock().unwrap_or_else(|e| e.into_inner());
                kept.extend_from_slice(&chunk[..n]);
                let excess = kept.len().saturating_sub(CAPTURED_BYTES);
                kept.drain(..excess);
            }
            buffer
                .closed
                .store(true, std::sync::atomic::Ordering::Release);
        });
        captured
    }

    /// What was captured, once the pipe is read to its end or LAST_WRITES has passed (the
    /// command's children may keep it open).
    pub fn take(&self) -> Vec<u8> {
        let deadline = std::time::Instant::now() + LAST_WRITES;
        while !self.closed.load(std::sync::atomic::Ordering::Acquire)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        std::mem::take(&mut *self.kept.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Launched {
    /// Forks `command`, held before its execve. With `quiet`, its stdin is /dev/null and its
    /// stdout and stderr are captured (the live view owns the terminal).
    pub fn spawn_held(command: &[String], user: Option<&Identity>, quiet: bool) -> Result<Self> {
        let Some(program) = command.first() else {
            bail!("no command after --");
        };
        // Said before the programs load (seconds on a slow machine, and warnings about the
        // kernel that would bury the one line that matters); the execve's own errno still
        // decides when the file changes in between.
        find_executable(program)?;
        // Everything the child needs is allocated before fork: between fork and exec it may
        // only make async-signal-safe calls.
        let args = command
            .iter()
            .map(|arg| CString::new(arg.as_bytes()))
            .collect::<Result<Vec<_>, _>>()
            .context("a command argument contains a NUL byte")?;
        let mut argv: Vec<*const libc::c_char> = args.iter().map(|arg| arg.as_ptr()).collect();
        argv.push(std::ptr::null());
        let mut envp: Vec<*const libc::c_char> = user
            .map(|id| id.env.iter().map(|pair| pair.as_ptr()).collect())
            .unwrap_or_default();
        envp.push(std::ptr::null());
        let (wait_end, go_end) = cloexec_pipe()?;
        let (result_end, report_end) = cloexec_pipe()?;
        let quiet_fds = if quiet {
            let null = std::fs::File::open("/dev/null").context("opening /dev/null")?;
            let (read_end, write_end) = cloexec_pipe()?;
            Some((OwnedFd::from(null), read_end, write_end))
        } else {
            None
        };
        // SAFETY: the child branch only calls read, execvp, write and _exit.
        match unsafe { libc::fork() } {
            -1 => Err(std::io::Error::last_os_error()).context("fork"),
            0 => {
                drop(go_end);
                drop(result_end);
                if let Some((null, _, write_end)) = &quiet_fds {
                    // SAFETY: dup2 on descriptors this copy owns; the copies lose CLOEXEC.
                    unsafe {
                        libc::dup2(null.as_raw_fd(), 0);
                        libc::dup2(write_end.as_raw_fd(), 1);
                        libc::dup2(write_end.as_raw_fd(), 2);
                    }
                }
                // SAFETY: argv and envp are NUL-terminated and point into `args` and the
                // identity, alive in this copy.
                unsafe {
                    wait_then_exec(
                        wait_end.as_raw_fd(),
                        report_end.as_raw_fd(),
                        argv.as_ptr(),
                        user.map(|id| (id, envp.as_ptr())),
                    )
                }
            }
            pid => {
                drop(wait_end);
                drop(report_end);
                log::debug!("launched {program} as pid {pid}, held before execve");
                let output = quiet_fds.map(|(_, read_end, _)| CapturedOutput::drain(read_end));
                Ok(Self {
                    pid: pid as u32,
                    output,
                    program: program.clone(),
                    go: Some(go_end),
                    exec_result: Some(result_end),
                })
            }
        }
    }

    /// The name the kernel will give the command once it has exec'd: its file name, cut to
    /// the 15 bytes of a comm.
    pub fn comm(&self) -> String {
        let name = std::path::Path::new(&self.program).file_name().map_or_else(
            || self.program.clone(),
            |n| n.to_string_lossy().into_owned(),
        );
        name.chars()
            .scan(0, |bytes, c| {
                *bytes += c.len_utf8();
                (*bytes <= 15).then_some(c)
            })
            .collect()
    }

    /// Lets the command exec and run; fails with ExecFailed (the child reaped) when its execve
    /// failed.
    pub fn release(&mut self) -> Result<()> {
        if let Some(go) = self.go.take() {
            let byte = [1u8];
            // SAFETY: writing one byte from a valid buffer to an open pipe.
            let written = unsafe { libc::write(go.as_raw_fd(), byte.as_ptr().cast(), 1) };
            if written != 1 {
                return Err(std::io::Error::last_os_error()).context("releasing the command");
            }
        }
        let Some(result) = self.exec_result.take() else {
            return Ok(());
        };
        let Some(errno) = read_exec_errno(&result)? else {
            return Ok(());
        };
        // The child exits right after reporting: reap it, and leave no report of it.
        let _ = wait_for(self.pid);
        Err(ExecFailed {
            program: self.program.clone(),
            error: std::io::Error::from_raw_os_error(errno),
        }
        .into())
    }

    /// Waits for the command to end; returns its exit code, or 128 + the signal that killed
    /// it, as shells report it.
    pub fn wait(self) -> Result<i32> {
        wait_for(self.pid)
    }

    /// Ends a command still running when the trace ended (`q`, `-d`): SIGTERM, then SIGKILL if
    /// it has not exited after `grace`, as `perf stat --timeout` does. Returns its own status
    /// when it had already ended by itself, None when it was stopped here.
    pub fn stop(self, grace: std::time::Duration) -> Result<Option<i32>> {
        if let Some(status) = self.exited()? {
            return Ok(Some(status));
        }
        self.forward(libc::SIGTERM);
        let deadline = std::time::Instant::now() + grace;
        while std::time::Instant::now() < deadline {
            if self.exited()?.is_some() {
                return Ok(None);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        self.forward(libc::SIGKILL);
        wait_for(self.pid)?;
        Ok(None)
    }

    /// The command's exit status if it has ended (reaping it), else None.
    fn exited(&self) -> Result<Option<i32>> {
        let mut status = 0;
        // SAFETY: polling our own child with a valid status pointer.
        match unsafe { libc::waitpid(self.pid as i32, &mut status, libc::WNOHANG) } {
            0 => Ok(None),
            -1 => Err(std::io::Error::last_os_error()).context("waiting for the command"),
            _ => Ok(Some(exit_code(status))),
        }
    }

    /// Passes a signal that ended the trace on to the command, which would otherwise keep the
    /// tracer waiting for it.
    pub fn forward(&self, signal: i32) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.pid as i32, signal) };
    }
}

fn wait_for(pid: u32) -> Result<i32> {
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own child with a valid status pointer.
        let got = unsafe { libc::waitpid(pid as i32, &mut status, 0) };
        if got == pid as i32 {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err).with_context(|| format!("waiting for pid {pid}"));
        }
    }
    Ok(exit_code(status))
}

/// What the child reported on its close-on-exec pipe: nothing (end of file) when execve
/// succeeded, else its errno.
fn read_exec_errno(pipe: &OwnedFd) -> Result<Option<i32>> {
    let mut bytes = [0u8; 4];
    let mut got = 0;
    while got < bytes.len() {
        // SAFETY: reading into the unfilled tail of a valid buffer.
        let n = unsafe {
            libc::read(
                pipe.as_raw_fd(),
                bytes[got..].as_mut_ptr().cast(),
                bytes.len() - got,
            )
        };
        match n {
            0 => break,
            n if n > 0 => got += n as usize,
            _ => {
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() != Some(libc::EINTR) {
                    return Err(err).context("reading whether the command started");
                }
            }
        }
    }
    Ok((got == bytes.len()).then(|| i32::from_ne_bytes(bytes)))
}

fn exit_code(status: i32) -> i32 {
    if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        libc::WEXITSTATUS(status)
    }
}

fn cloexec_pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors that we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe2");
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The file `program` names, looked up in $PATH as execvp does when it has no slash; else
/// the error execvp would give: ENOENT when nothing is there, EACCES when only files that
/// cannot be executed (or directories) are.
fn find_executable(program: &str) -> Result<std::path::PathBuf, ExecFailed> {
    let candidates: Vec<std::path::PathBuf> = if program.contains('/') {
        vec![program.into()]
    } else {
        let path =
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/bin:/usr/bin".into());
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .collect()
    };
    let mut errno = libc::ENOENT;
    for candidate in candidates {
        match std::fs::metadata(&candidate) {
            Ok(meta) if meta.is_file() && is_executable(&candidate) => return Ok(candidate),
            Ok(_) => errno = libc::EACCES,
            Err(err) if err.raw_os_error() == Some(libc::EACCES) => errno = libc::EACCES,
            Err(_) => {}
        }
    }
    Err(ExecFailed {
        program: program.to_owned(),
        error: std::io::Error::from_raw_os_error(errno),
    })
}

/// Whether this process may execute `path` (for root: any execute bit is set).
fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path.
    unsafe { libc::access(path.as_ptr(), libc::X_OK) == 0 }
}

/// In the forked child: blocks until the tracer writes its byte (or exits without it, which
/// closes the pipe), then execs; if that fails, writes its errno to `report` for the tracer.
/// Never returns.
unsafe fn wait_then_exec(
    fd: i32,
    report: i32,
    argv: *const *const libc::c_char,
    user: Option<(&Identity, *const *const libc::c_char)>,
) -> ! {
    let mut byte = 0u8;
    let got = loop {
        // SAFETY: reading one byte into a valid buffer.
        let n = unsafe { libc::read(fd, (&mut byte as *mut u8).cast(), 1) };
        // SAFETY: errno of this thread.
        if n >= 0 || unsafe { *libc::__errno_location() } != libc::EINTR {
            break n;
        }
    };
    if got != 1 {
        // SAFETY: leaving the child without running the parent's atexit handlers.
        unsafe { libc::_exit(NEVER_RELEASED) };
    }
    // SAFETY: argv[0] and the array are valid, NUL-terminated C strings; errno is this
    // thread's; the errno bytes are a valid buffer.
    unsafe {
        match user {
            Some((identity, envp)) => {
                if identity.assume() {
                    libc::execvpe(*argv, argv, envp);
                }
            }
            None => {
                libc::execvp(*argv, argv);
            }
        }
        let errno = *libc::__errno_location();
        let bytes = errno.to_ne_bytes();
        libc::write(report, bytes.as_ptr().cast(), bytes.len());
        let status = if errno == libc::ENOENT || errno == libc::ENOTDIR {
            NOT_FOUND
        } else {
            NOT_EXECUTABLE
        };
        libc::_exit(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_held(command: &[&str]) -> i32 {
        let command: Vec<String> = command.iter().map(|s| (*s).to_owned()).collect();
        let mut launched = Launched::spawn_held(&command, None, false).unwrap();
        launched.release().unwrap();
        launched.wait().unwrap()
    }

    fn exec_failure(command: &str) -> ExecFailed {
        let err = Launched::spawn_held(&[command.to_owned()], None, false)
            .err()
            .expect("refused before the fork");
        err.downcast::<ExecFailed>().expect("an ExecFailed")
    }

    #[test]
    fn commands_are_looked_up_in_path_like_execvp() {
        assert!(find_executable("sh").unwrap().is_absolute());
        assert_eq!(
            find_executable("no-such-mmapsem-cmd")
                .unwrap_err()
                .exit_code(),
            127
        );
        // A directory is there but cannot be run.
        assert_eq!(find_executable("/").unwrap_err().exit_code(), 126);
    }

    #[test]
    fn exit_status_and_signals_are_passed_on() {
        assert_eq!(run_held(&["sh", "-c", "exit 7"]), 7);
        assert_eq!(
            run_held(&["sh", "-c", "kill -TERM $$"]),
            128 + libc::SIGTERM
        );
    }

    #[test]
    fn a_command_that_cannot_run_is_refused_before_the_fork() {
        let missing = exec_failure("/nonexistent/program");
        assert_eq!(missing.exit_code(), 127);
        assert_eq!(
            missing.to_string(),
            "cannot run /nonexistent/program: No such file or directory"
        );
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("not-executable");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        let refused = exec_failure(&script.display().to_string());
        assert_eq!(refused.exit_code(), 126);
        assert!(
            refused.to_string().ends_with(": Permission denied"),
            "{refused}"
        );
    }

    #[test]
    fn an_execve_that_fails_after_the_fork_fails_the_release() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("no-interpreter");
        std::fs::write(&script, "#!/nonexistent-mmapsem-interpreter\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut launched =
            Launched::spawn_held(&[script.display().to_string()], None, false).unwrap();
        let err = launched.release().unwrap_err();
        let failed = err.downcast::<ExecFailed>().expect("an ExecFailed");
        assert_eq!(failed.exit_code(), 127, "{failed}");
    }

    #[test]
    fn comm_is_the_file_name_cut_to_15_bytes() {
        let launched = Launched {
            pid: 0,
            output: None,
            program: "/work/target/release/mmapsem-workload".to_owned(),
            go: None,
            exec_result: None,
        };
        assert_eq!(launched.comm(), "mmapsem-workloa");
    }

    #[test]
    fn a_command_never_released_does_not_run() {
        let dir = std::env::temp_dir().join(format!("mmapsem-launch-{}", std::process::id()));
        let command = vec![
            "touch".to_owned(),
            dir.display().to_string(), // would be created if the command ran
        ];
        let mut launched = Launched::spawn_held(&command, None, false).unwrap();
        // The tracer gives up before releasing it: the pipe closes.
        drop(launched.go.take());
        assert_eq!(launched.wait().unwrap(), NEVER_RELEASED);
        assert!(!dir.exists());
    }
}
