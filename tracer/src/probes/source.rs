//! What the collect loop reads of the kernel side while the programs trace, as traits: the
//! probes implement them, and the loop's unit tests fake them. They live with the probes, the
//! lower layer, so that the probes import nothing of the loop above them.

use std::collections::{HashMap, HashSet};

use anyhow::Result;
use tracer_common::StateKey;

use crate::model::unwound::StackRecord;
use crate::model::Harvest;

/// The kernel state a sink may let go of (the daemon, once it has folded the dead).
pub trait Forget {
    /// The threads with a lock state, each with whether it still holds an aggregation left
    /// pending (which user space must not drop).
    fn thread_states(&self) -> Result<Vec<(StateKey, bool)>>;
    /// What the threads of processes that are gone left pending, which the kernel will never
    /// add to its maps (an exec leaves the old mm's last operation pending), as a harvest;
    /// their states are deleted.
    fn take_pending(&self, gone: &HashSet<u32>) -> Result<Harvest>;
    /// Deletes the entries of processes that are gone; returns how many.
    fn forget_processes(&self, gone: &HashSet<u32>) -> Result<usize>;
    /// Deletes the per-thread state of threads that are gone; returns how many.
    fn forget_threads(&self, states: &[StateKey]) -> Result<usize>;
}

/// What the collect loop reads of the kernel side while the programs trace: the probes, or a
/// fake in tests.
pub trait Source: Forget {
    /// Whether the programs follow the listed targets' forks (a traced command's tree).
    fn follows_forks(&self) -> bool;
    /// The processes the programs follow from the listed targets' forks.
    fn inherited_pids(&self) -> Result<Vec<u32>>;
    /// System-wide: the processes whose mm the programs have registered so far.
    fn registered_pids(&self) -> Result<Vec<u32>>;
    /// The names the traced processes took at their last exec during the trace.
    fn exec_names(&self) -> Result<HashMap<u32, String>>;
    /// Each locking process's cgroup (v2) id, as the programs recorded it.
    fn process_cgroups(&self) -> Result<HashMap<u32, u64>>;
    /// `--cgroup`: adds the cgroups created below the given ones since the last call.
    fn refresh_cgroup_filter(&mut self) -> Result<()>;
    /// The processes whose user stacks the collected data refers to.
    fn user_stack_owners(&self) -> Result<HashSet<u32>>;
    /// (summed lifetimes inside the trace in ns, number) of the target threads that exited.
    fn exited_threads(&self) -> Result<(u64, u64)>;
    /// How many traced processes have exited so far (their last thread).
    fn exited_processes(&self) -> Result<u64>;
    /// System-wide, traced processes whose last thread has exited and that have not been let go
    /// of yet (all they did is in the maps), with how long that thread lived (ns).
    fn exited_pids(&self) -> Result<HashMap<u32, u64>>;
    /// When the trace was armed (monotonic ns).
    fn trace_start_ns(&self) -> u64;
    /// Moves the timeline events written so far into memory.
    fn drain_timeline(&mut self);
    /// The user stack copies and events written since the last call.
    fn drain_user_stacks(&mut self) -> Vec<StackRecord>;
    /// The frames of one stack of the stack map, if it is still there.
    fn stack(&self, id: i32) -> Option<Vec<u64>>;
    /// The cumulative maps, read while the programs keep running.
    fn snapshot(&self) -> Result<Harvest>;
    /// Stops the programs recording (they stay attached until the source is dropped).
    fn disarm(&mut self) -> Result<()>;
    /// Everything the programs collected, read once they are disarmed: the maps, the
    /// timeline's last events, and the aggregation left pending in the threads' states.
    fn final_harvest(&mut self) -> Result<Harvest>;
}
