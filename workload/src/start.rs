//! Holding the work back until a tracer has attached: SIGUSR1 and a start delay.

use std::io::{self, Write};
use std::mem::MaybeUninit;
use std::thread;
use std::time::Duration;

use anyhow::{bail, Result};

use crate::emit;

/// The gates between `ready` and `started`: SIGUSR1 (with --wait-signal), then the start delay.
pub struct Start {
    pub gate: Option<Sigusr1Gate>,
    pub delay: Duration,
}

impl Start {
    /// Waits at the gates, then prints `started`.
    pub fn begin(self, out: &mut dyn Write) -> Result<()> {
        if let Some(gate) = self.gate {
            gate.wait()?;
        }
        delay(self.delay);
        emit(out, format_args!("started"))
    }
}

/// SIGUSR1, blocked so that it stays pending until `wait` takes it.
///
/// Created before any other thread exists: threads inherit the creating thread's signal mask, so
/// no thread can ever have SIGUSR1 delivered (whose default action would kill the process), and a
/// signal sent early, even right after `ready` is printed, is kept pending rather than lost.
pub struct Sigusr1Gate {
    set: libc::sigset_t,
}

impl Sigusr1Gate {
    /// Blocks SIGUSR1 in the calling thread (and so in every thread it later starts).
    pub fn install() -> Result<Self> {
        let set = sigusr1_set()?;
        // SAFETY: `set` is an initialised signal set; a null old-set pointer is allowed.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            bail!(
                "pthread_sigmask(SIG_BLOCK, SIGUSR1) failed: {}",
                io::Error::from_raw_os_error(rc)
            );
        }
        Ok(Self { set })
    }

    /// Sleeps in the kernel until SIGUSR1 is pending, then consumes it.
    pub fn wait(&self) -> Result<()> {
        let mut signal: libc::c_int = 0;
        // SAFETY: `set` is initialised and `signal` is writable.
        let rc = unsafe { libc::sigwait(&self.set, &mut signal) };
        if rc != 0 {
            bail!(
                "sigwait(SIGUSR1) failed: {}",
                io::Error::from_raw_os_error(rc)
            );
        }
        if signal != libc::SIGUSR1 {
            bail!("sigwait(SIGUSR1) returned signal {signal}");
        }
        Ok(())
    }
}

fn sigusr1_set() -> Result<libc::sigset_t> {
    let mut set = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the whole set; sigaddset then only updates it.
    unsafe {
        if libc::sigemptyset(set.as_mut_ptr()) == -1 {
            bail!("sigemptyset failed: {}", io::Error::last_os_error());
        }
        if libc::sigaddset(set.as_mut_ptr(), libc::SIGUSR1) == -1 {
            bail!("sigaddset(SIGUSR1) failed: {}", io::Error::last_os_error());
        }
        Ok(set.assume_init())
    }
}

/// Sleeps for the start delay, if any.
fn delay(delay: Duration) {
    if !delay.is_zero() {
        thread::sleep(delay);
    }
}
