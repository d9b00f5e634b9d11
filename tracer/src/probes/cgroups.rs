//! The cgroups of the locking processes (PROCESS_CGROUPS), and `--cgroup`'s filter
//! (CGROUP_FILTER): the ids of the given cgroups and of every cgroup below them, which the
//! programs look up when a process registers its mm system-wide. Cgroups created after the
//! start are added at each `CgroupFilter::refresh` (every second), before their processes' next locks register.

use std::collections::HashMap;
use std::path::PathBuf;

use super::*;
use crate::system::cgroups::subtree_ids;

pub(super) const PROCESS_CGROUPS: &str = "PROCESS_CGROUPS";
pub(super) const CGROUP_FILTER: &str = "CGROUP_FILTER";

/// Capacity of CGROUP_FILTER: cgroups at and below the given ones (a Kubernetes node has a few
/// hundred). Past it, the processes of the cgroups left out are not traced, with a warning.
pub(super) const FILTER_CGROUPS: u32 = 16384;

/// The given cgroups' directories (`--cgroup`), whose subtrees the filter holds.
#[derive(Debug, Default)]
pub(super) struct CgroupFilter {
    roots: Vec<PathBuf>,
    /// Cgroups the full filter refused at the last refresh: warned of once, not every second.
    refused: std::cell::Cell<usize>,
}

impl CgroupFilter {
    pub(super) fn new(roots: Vec<PathBuf>) -> Self {
        Self {
            roots,
            refused: std::cell::Cell::new(0),
        }
    }

    pub(super) fn is_on(&self) -> bool {
        !self.roots.is_empty()
    }

    /// Adds the ids of the given cgroups' subtrees as they are now (ids of removed cgroups
    /// stay: they are never reused while the tracer runs, being inode numbers of a live fs).
    pub(super) fn refresh(&self, ebpf: &mut Ebpf) -> Result<()> {
        if !self.is_on() {
            return Ok(());
        }
        let mut filter: BpfHashMap<_, u64, u8> = map(ebpf, CGROUP_FILTER)?;
        let mut refused = 0;
        for id in self.roots.iter().flat_map(|root| subtree_ids(root)) {
            if filter.get(&id, 0).is_err() && filter.insert(id, 1, 0).is_err() {
                refused += 1;
            }
        }
        if refused > self.refused.replace(refused) {
            log::warn!(
                "--cgroup: {refused} cgroups below the given ones past the filter's \
                 {FILTER_CGROUPS}: their processes are not traced"
            );
        }
        Ok(())
    }
}

/// Each locking process's cgroup id, as the programs recorded it: in batches (it is read at
/// every look and every snapshot, and holds an entry per process system-wide).
pub(super) fn read_process_cgroups(ebpf: &Ebpf) -> Result<HashMap<u32, u64>> {
    Ok(read_shared::<u32, u64>(ebpf, PROCESS_CGROUPS)?
        .into_iter()
        .collect())
}
