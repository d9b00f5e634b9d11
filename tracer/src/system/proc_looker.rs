//! Reads what /proc says of traced processes on a thread of its own. Reading /proc/PID/maps
//! takes the process's mmap_lock on kernels before 6.16 (and on later ones when the per-VMA
//! read fails), so a target whose lock is queued with writers can keep a read waiting for
//! seconds: the collect loop asks, goes on, and takes the answers when they come, so that the
//! duration, signals and the live view are honoured whatever the target does.

use std::collections::HashSet;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::Instant;

use super::procfs::{self, Mapping};

/// What one look at a process found; None or empty where the read failed (it exited).
#[derive(Debug, Default)]
pub struct ProcessLook {
    pub pid: u32,
    pub mappings: Option<Vec<Mapping>>,
    pub thread_names: Vec<(u32, String)>,
    pub comm: Option<String>,
    /// The user it runs as.
    pub uid: Option<u32>,
}

enum Reply {
    Look(ProcessLook),
    /// Every process of one request was looked at.
    Done,
}

/// The reading thread and the requests it has not finished.
pub struct ProcLooker {
    requests: Sender<Vec<u32>>,
    replies: Receiver<Reply>,
    outstanding: usize,
    /// Processes asked about and not answered yet (not asked again meanwhile).
    asked: HashSet<u32>,
}

impl Default for ProcLooker {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcLooker {
    pub fn new() -> Self {
        let (requests, inbox) = mpsc::channel::<Vec<u32>>();
        let (outbox, replies) = mpsc::channel();
        // Detached: a read stuck on a target's lock must not hold up the tracer's exit.
        let spawned = std::thread::Builder::new()
            .name("proc-looker".into())
            .spawn(move || serve(&inbox, &outbox));
        if let Err(err) = spawned {
            log::warn!("no thread to read /proc on ({err}): processes are not looked at");
        }
        Self {
            requests,
            replies,
            outstanding: 0,
            asked: HashSet::new(),
        }
    }

    /// Whether an earlier request is still being read (a stalled target, most likely).
    pub fn busy(&self) -> bool {
        self.outstanding > 0
    }

    /// Asks for a look at `pids` (those already asked about and not answered are left out).
    pub fn ask(&mut self, pids: &[u32]) {
        let new: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|&pid| self.asked.insert(pid))
            .collect();
        if new.is_empty() || self.requests.send(new).is_err() {
            return;
        }
        self.outstanding += 1;
    }

    /// The looks that have arrived, without waiting.
    pub fn arrived(&mut self) -> Vec<ProcessLook> {
        let mut looks = Vec::new();
        while let Ok(reply) = self.replies.try_recv() {
            self.take(reply, &mut looks);
        }
        looks
    }

    /// The looks that arrive until every request is answered or `deadline` passes.
    pub fn arrived_by(&mut self, deadline: Instant) -> Vec<ProcessLook> {
        let mut looks = self.arrived();
        while self.busy() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.replies.recv_timeout(left) {
                Ok(reply) => self.take(reply, &mut looks),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
            }
        }
        looks
    }

    fn take(&mut self, reply: Reply, looks: &mut Vec<ProcessLook>) {
        match reply {
            Reply::Look(look) => {
                self.asked.remove(&look.pid);
                looks.push(look);
            }
            Reply::Done => self.outstanding = self.outstanding.saturating_sub(1),
        }
    }
}

fn serve(inbox: &Receiver<Vec<u32>>, outbox: &Sender<Reply>) {
    for pids in inbox {
        for pid in pids {
            if outbox.send(Reply::Look(look_at(pid))).is_err() {
                return;
            }
        }
        if outbox.send(Reply::Done).is_err() {
            return;
        }
    }
}

/// The names first: they need no lock of the target's, while its maps may wait for seconds
/// behind its writers, by which time a short-lived process has ended, unnamed.
fn look_at(pid: u32) -> ProcessLook {
    let comm = procfs::comm(pid);
    let uid = procfs::owner_uid(pid);
    let thread_names = procfs::thread_names(pid);
    let mappings = procfs::exec_mappings(pid);
    if let Some(mappings) = &mappings {
        procfs::keep_mapped_objects(pid, mappings);
    }
    ProcessLook {
        pid,
        mappings,
        thread_names,
        comm,
        uid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn looks_arrive_for_each_process_asked_about_once() {
        let me = std::process::id();
        let mut looker = ProcLooker::new();
        looker.ask(&[me, me, u32::MAX - 1]);
        looker.ask(&[me]);
        assert!(looker.busy());
        let looks = looker.arrived_by(Instant::now() + Duration::from_secs(10));
        assert!(!looker.busy());
        assert_eq!(looks.len(), 2, "{looks:?}");
        let mine = looks.iter().find(|l| l.pid == me).unwrap();
        assert!(mine.mappings.as_ref().is_some_and(|m| !m.is_empty()));
        assert!(mine.thread_names.iter().any(|(tid, _)| *tid == me));
        assert!(mine.comm.is_some());
        let gone = looks.iter().find(|l| l.pid != me).unwrap();
        assert!(gone.mappings.is_none() && gone.comm.is_none());
        // Answered, so it can be asked about again.
        looker.ask(&[me]);
        assert_eq!(
            looker
                .arrived_by(Instant::now() + Duration::from_secs(10))
                .len(),
            1
        );
    }

    #[test]
    fn waiting_for_looks_ends_at_the_deadline() {
        let mut looker = ProcLooker::new();
        let many: Vec<u32> = (1..=50_000).collect();
        looker.ask(&many);
        let start = Instant::now();
        let _ = looker.arrived_by(start);
        assert!(start.elapsed() < Duration::from_secs(1));
    }
}
