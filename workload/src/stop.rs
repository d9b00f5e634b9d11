//! Ending the work early when standard input closes (`--until-stdin-closes`).
//!
//! A test that has seen what it needs closes the pipe, and the map/unmap loops end at their next
//! iteration instead of running out a --seconds chosen for the slowest machine. A test that dies
//! closes it too, so its workload never outlives it by more than one iteration.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use anyhow::{Context, Result};

static STDIN_CLOSED: AtomicBool = AtomicBool::new(false);

/// Starts the thread that waits for the end of standard input.
pub fn watch_stdin() -> Result<()> {
    thread::Builder::new()
        .name("stdin-watch".into())
        .spawn(|| {
            // What arrives is ignored; a read error ends the wait as the end of input does.
            let _ = io::copy(&mut io::stdin().lock(), &mut io::sink());
            STDIN_CLOSED.store(true, Ordering::Relaxed);
        })
        .context("starting the standard-input watcher")?;
    Ok(())
}

/// Whether standard input has closed under --until-stdin-closes (never without it).
pub fn requested() -> bool {
    STDIN_CLOSED.load(Ordering::Relaxed)
}
