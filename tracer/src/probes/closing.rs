//! Closing the classic tracepoints' links off the user's path, once the tracer has exited.

use aya::programs::trace_point::TracePointLink;

use super::Probes;

/// The classic tracepoints' links, held apart from their programs so that they are closed
/// off the user's path. Closing one waits for the kernel's RCU grace periods
/// (perf_trace_event_unreg -> tracepoint_synchronize_unregister, 20-100 ms, under a mutex all
/// such closes share): the syscall and fault tracepoints' fourteen took 0.1-0.6 s, threads or
/// not, and the kernel does them before the tracer's exit is reported to its parent. So a child
/// process holds the links' last references: the tracer's own closes only drop a count, and
/// the child lets them go once the tracer has exited (its end of a pipe sees EOF). The
/// programs are disarmed before; the report is written meanwhile.
#[derive(Default)]
pub struct ClassicLinks(pub(super) Vec<TracePointLink>);

impl ClassicLinks {
    pub(super) fn close_after_exit(&mut self) {
        let links = std::mem::take(&mut self.0);
        if links.is_empty() {
            return;
        }
        if let Err(err) = hold_in_child_until_exit() {
            log::debug!("closing the tracepoint links before exiting: {err}");
        }
        drop(links);
    }
}

/// Forks a child that keeps every file of the tracer open until the tracer has exited.
fn hold_in_child_until_exit() -> std::io::Result<()> {
    let mut ends = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `ends`.
    if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let [read_end, write_end] = ends;
    // SAFETY: the child of this multi-threaded process calls only async-signal-safe functions
    // (close, read, _exit) and touches no memory but a local byte.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        0 => unsafe {
            // Not the terminal or the pipes of whoever waits for the tracer's output.
            for fd in [write_end, 0, 1, 2] {
                libc::close(fd);
            }
            let mut byte = 0u8;
            while libc::read(read_end, (&mut byte as *mut u8).cast(), 1) < 0
                && *libc::__errno_location() == libc::EINTR
            {}
            libc::_exit(0)
        },
        _ => {
            // The write end stays open until the tracer exits.
            // SAFETY: closes the descriptor this process no longer needs.
            unsafe { libc::close(read_end) };
            Ok(())
        }
    }
}

impl Drop for Probes {
    fn drop(&mut self) {
        self.classic_links.close_after_exit();
    }
}
