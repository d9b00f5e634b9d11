//! The probes as the collect loop reads them while the programs trace (`Source`) and what a
//! daemon lets go of (`Forget`).

use super::*;

impl Forget for Probes {
    fn thread_states(&self) -> Result<Vec<(StateKey, bool)>> {
        Ok(read_shared::<StateKey, LockState>(&self.ebpf, LOCK_STATE)?
            .into_iter()
            .map(|(key, st)| {
                let pending =
                    st.pending_wait.is_some() || st.pending_holds.iter().any(|h| h.is_some());
                (key, pending)
            })
            .collect())
    }

    fn take_pending(&self, gone: &HashSet<u32>) -> Result<Harvest> {
        let of_gone = |st: &LockState| {
            [&st.pending_wait, &st.pending_holds[0], &st.pending_holds[1]]
                .iter()
                .any(|p| {
                    p.is_some() && (gone.contains(&p.key.pid) || gone.contains(&p.key.locker_pid))
                })
        };
        let (keys, states): (Vec<StateKey>, Vec<LockState>) =
            read_shared::<StateKey, LockState>(&self.ebpf, LOCK_STATE)?
                .into_iter()
                .filter(|(_, st)| of_gone(st))
                .unzip();
        let mut harvest = Harvest::default();
        if states.is_empty() {
            return Ok(harvest);
        }
        // Bound by no map: it goes to user space's windows.
        fold_states(&self.ebpf, usize::MAX, &mut harvest, &states)?;
        delete_from(&self.ebpf, LOCK_STATE, &keys)?;
        Ok(harvest)
    }

    /// Deletes the kernel entries of processes that are gone, as the mm owner or as an outside
    /// locker: nothing adds to them any more, and a daemon that has folded them into its
    /// series must not let the dead fill its maps. Returns the entries deleted.
    fn forget_processes(&self, gone: &HashSet<u32>) -> Result<usize> {
        if gone.is_empty() {
            return Ok(0);
        }
        let of_gone = |k: &AggKey| gone.contains(&k.pid) || gone.contains(&k.locker_pid);
        let mut deleted = delete_where::<AggKey, AggValue>(&self.ebpf, AGG, of_gone)?;
        // Empty without attribution (--lean): one read each. A living waiter's waits behind a
        // gone outside locker (a /proc reader loop makes one a second) go too.
        deleted += delete_where::<BlockKey, BlockValue>(&self.ebpf, blockers::BLOCKED, |k| {
            crate::model::involves_gone(k, gone)
        })?;
        deleted += delete_where::<SleepKey, u64>(&self.ebpf, sched::SLEEPS, |k| of_gone(&k.hold))?;
        let comms: Vec<u32> = gone.iter().copied().collect();
        deleted += delete_from(&self.ebpf, LOCKER_COMMS, &comms)?;
        deleted += delete_from(&self.ebpf, EXEC_COMMS, &comms)?;
        deleted += delete_from(&self.ebpf, cgroups::PROCESS_CGROUPS, &comms)?;
        delete_from(&self.ebpf, EXITED_PIDS, &comms)?;
        if deleted > 0 {
            // A map that refused an insert is marked full, and the programs stop trying to
            // insert into it (see tracer-ebpf's slot_of): it has room again.
            let full = map_named(&self.ebpf, MAP_FULL)?;
            batch::fill_array(full, 0).context("clearing MAP_FULL")?;
        }
        Ok(deleted)
    }

    /// Deletes the per-thread state of threads that are gone: their lock states (`states`),
    /// and by thread id, what attribution keeps of them. The maps are LRUs, so the dead would
    /// only be evicted once full, with the living among them.
    fn forget_threads(&self, states: &[StateKey]) -> Result<usize> {
        let mut deleted = delete_from(&self.ebpf, LOCK_STATE, states)?;
        let mut tids: Vec<u32> = states.iter().map(|k| k.tid).collect();
        tids.dedup();
        for name in [TID_HOLDING, syscalls::SYSCALLS_ACTIVE] {
            deleted += delete_from(&self.ebpf, name, &tids)?;
        }
        Ok(deleted)
    }
}

impl Source for Probes {
    fn follows_forks(&self) -> bool {
        self.follows_forks
    }

    /// The processes the programs follow from the listed targets' forks, alive now (inherit).
    fn inherited_pids(&self) -> Result<Vec<u32>> {
        let tgids: BpfHashMap<_, u32, u32> = map_ref(&self.ebpf, TARGET_TGIDS)?;
        Ok(tgids
            .iter()
            .filter_map(|r| r.ok())
            .filter(|&(_, parent)| parent != 0)
            .map(|(pid, _)| pid)
            .collect())
    }

    /// The processes whose mm the programs have registered so far (system-wide mode: every
    /// process that locked its own mm; some may have exited since).
    fn exec_names(&self) -> Result<HashMap<u32, String>> {
        Ok(read_comms(&map_ref(&self.ebpf, EXEC_COMMS)?))
    }

    fn process_cgroups(&self) -> Result<HashMap<u32, u64>> {
        cgroups::read_process_cgroups(&self.ebpf)
    }

    fn refresh_cgroup_filter(&mut self) -> Result<()> {
        self.cgroup_filter.refresh(&mut self.ebpf)
    }

    fn registered_pids(&self) -> Result<Vec<u32>> {
        let mut pids: Vec<u32> = read_target_mms(&self.ebpf)?.into_values().collect();
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
    }

    /// The processes whose user stacks the collected data refers to (its entries, its blocking
    /// records, the timeline drained so far): the mapping lists to keep for symbolizing them.
    fn user_stack_owners(&self) -> Result<HashSet<u32>> {
        let entries: Vec<(AggKey, AggValue)> = read_shared(&self.ebpf, AGG)?;
        let blocked: Vec<(BlockKey, BlockValue)> = read_shared(&self.ebpf, blockers::BLOCKED)?;
        let timeline = self.timeline.iter().flat_map(TimelineReader::keys);
        // Empty without attribution (--lean).
        let wakers: Vec<(WakeKey, WakeValue)> = read_shared(&self.ebpf, wakers::WAKERS)?;
        let owners = entries
            .iter()
            .map(|(key, _)| key)
            .chain(timeline)
            .filter(|key| key.user_stack >= 0)
            .map(user_stack_owner)
            .chain(
                blocked
                    .iter()
                    .filter(|(key, _)| key.holder.user_stack >= 0)
                    .map(|(key, _)| holder_stack_owner(key)),
            )
            .chain(
                wakers
                    .iter()
                    .filter(|(key, _)| key.waker_user_stack >= 0)
                    .map(|(key, _)| key.waker_pid),
            );
        Ok(owners.collect())
    }

    fn exited_threads(&self) -> Result<(u64, u64)> {
        let exits: PerCpuArray<_, u64> = map_ref(&self.ebpf, THREAD_EXITS)?;
        let sum = |slot: u32| -> Result<u64> { Ok(exits.get(&slot, 0)?.iter().sum()) };
        Ok((sum(EXITED_LIFETIME_NS)?, sum(EXITED_THREADS)?))
    }

    fn exited_pids(&self) -> Result<HashMap<u32, u64>> {
        read_shared::<u32, u64>(&self.ebpf, EXITED_PIDS).map(|pids| pids.into_iter().collect())
    }

    fn exited_processes(&self) -> Result<u64> {
        let exits: PerCpuArray<_, u64> = map_ref(&self.ebpf, THREAD_EXITS)?;
        Ok(exits.get(&EXITED_PROCESSES, 0)?.iter().sum())
    }

    fn trace_start_ns(&self) -> u64 {
        self.trace_start_ns
    }

    /// Moves the timeline events the kernel has written so far into memory (call it often:
    /// the ring buffer is bounded, and what does not fit is dropped and counted).
    fn drain_timeline(&mut self) {
        if let Some(timeline) = &mut self.timeline {
            timeline.drain();
        }
    }

    /// The user stack copies and events the kernel has written since the last call (call it
    /// often: the ring buffer is bounded, and what does not fit is dropped and counted).
    fn drain_user_stacks(&mut self) -> Vec<StackRecord> {
        self.user_stacks
            .as_mut()
            .map(UserStackReader::drain)
            .unwrap_or_default()
    }

    /// The frames of one stack of the stack map (a frame-pointer user stack, say), if it is
    /// still there.
    fn stack(&self, id: i32) -> Option<Vec<u64>> {
        let map: StackTraceMap<&MapData> = map_ref(&self.ebpf, STACKS).ok()?;
        let ids = HashSet::from([u32::try_from(id).ok()?]);
        read_stacks(&map, &ids).remove(&id)
    }

    /// Reads the cumulative maps while the programs keep running (the live and interval
    /// views). The timeline is left alone: it is drained by `drain_timeline` and `harvest`.
    fn snapshot(&self) -> Result<Harvest> {
        read_maps(self, Vec::new())
    }

    fn disarm(&mut self) -> Result<()> {
        self.set_armed(false)
    }

    fn final_harvest(&mut self) -> Result<Harvest> {
        self.set_armed(false)?;
        let (events, dropped_here) = match self.timeline.take() {
            Some(timeline) => timeline.finish(),
            None => (Vec::new(), 0),
        };
        // Disarmed above, so the maps no longer move; dropping the probes afterwards detaches
        // the programs.
        let mut harvest = read_maps(self, events)?;
        fold_pending(&self.ebpf, self.agg_capacity, &mut harvest)?;
        if let Some((_, n)) = harvest
            .counters
            .iter_mut()
            .find(|(c, _)| *c == Counter::TimelineDropped)
        {
            *n += dropped_here;
        }
        Ok(harvest)
    }
}
