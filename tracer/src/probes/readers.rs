//! Reading the maps: everything the programs collected as a `Harvest`, and the typed readers
//! and deleters every family's `read` uses.

use super::*;

/// Everything the programs collected, read without disturbing them, with `timeline` (drained
/// separately) added: what every family reads, the loss counters and names all share, then
/// the stacks that any of it references.
pub(super) fn read_maps(
    probes: &Probes,
    timeline: Vec<tracer_common::TimelineEvent>,
) -> Result<Harvest> {
    let ebpf = &probes.ebpf;
    let mut harvest = Harvest {
        counters: read_counters(&map_ref(ebpf, COUNTERS)?)?,
        locker_comms: read_comms(&map_ref(ebpf, LOCKER_COMMS)?),
        process_cgroups: cgroups::read_process_cgroups(ebpf)?,
        features: probes.features,
        timeline,
        run_stats: self_cost::read_runs(ebpf, &probes.run_stats),
        tracer_cpu: self_cost::tracer_cpu_since(probes.cpu_at_start),
        ..Harvest::default()
    };
    for family in &FAMILIES {
        (family.read)(probes, &mut harvest)?;
    }
    let ids: HashSet<u32> = harvest
        .stack_refs()
        .into_iter()
        .map(|r| match r {
            StackRef::Kernel(id) | StackRef::User { id, .. } => id as u32,
        })
        .collect();
    harvest.stacks = read_stacks(&map_ref(ebpf, STACKS)?, &ids);
    Ok(harvest)
}

/// The last operations that threads left pending (see `pending`), folded into the final
/// harvest: the programs are disarmed, so no thread flushes them meanwhile. Every state is a
/// target's (the programs make none for other mms), including those of mms that are gone: an
/// exec leaves the old mm's last operation pending, with no later step on that mm to flush it.
pub(super) fn fold_pending(ebpf: &Ebpf, capacity: usize, harvest: &mut Harvest) -> Result<()> {
    let states: BpfHashMap<_, StateKey, LockState> = map_ref(ebpf, LOCK_STATE)?;
    let pending: Vec<LockState> = states
        .iter()
        .filter_map(|r| r.ok())
        .map(|(_, st)| st)
        .filter(|st| st.pending_wait.is_some() || st.pending_holds.iter().any(|h| h.is_some()))
        .collect();
    fold_states(ebpf, capacity, harvest, &pending)
}

/// Adds what `pending` (lock states) left pending to `harvest`.
pub(super) fn fold_states(
    ebpf: &Ebpf,
    capacity: usize,
    harvest: &mut Harvest,
    pending: &[LockState],
) -> Result<()> {
    let holders: aya::maps::Array<_, HolderRecord> = map_ref(ebpf, blockers::HOLDER_INFO)?;
    let mask = holders.len() - 1;
    pending::fold(harvest, pending, capacity, |id| {
        let record = holders.get(&holder_slot(id, mask), 0).ok()?;
        (record.id == *id).then_some(record.holder)
    });
    Ok(())
}

pub(super) fn read_target_mms(ebpf: &Ebpf) -> Result<HashMap<u64, u32>> {
    let mms: BpfHashMap<_, u64, u32> = map_ref(ebpf, TARGET_MMS)?;
    Ok(mms.iter().filter_map(|r| r.ok()).collect())
}

pub(super) fn map<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<T>
where
    T: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>,
{
    let m = ebpf
        .map_mut(name)
        .ok_or_else(|| anyhow!("eBPF object has no map {name}"))?;
    Ok(T::try_from(m)?)
}

pub(super) fn map_ref<'a, T>(ebpf: &'a Ebpf, name: &str) -> Result<T>
where
    T: TryFrom<&'a aya::maps::Map, Error = aya::maps::MapError>,
{
    let m = ebpf
        .map(name)
        .ok_or_else(|| anyhow!("eBPF object has no map {name}"))?;
    Ok(T::try_from(m)?)
}

/// Deletes the keys of the shared hash map `name` that `doomed` picks.
pub(super) fn delete_where<K: Pod, V: Pod>(
    ebpf: &Ebpf,
    name: &str,
    doomed: impl Fn(&K) -> bool,
) -> Result<usize> {
    let keys: Vec<K> = read_shared::<K, V>(ebpf, name)?
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| doomed(k))
        .collect();
    delete_from(ebpf, name, &keys)
}

pub(super) fn delete_from<K: Pod>(ebpf: &Ebpf, name: &str, keys: &[K]) -> Result<usize> {
    batch::delete_keys(map_named(ebpf, name)?, keys)
        .with_context(|| format!("deleting from {name}"))
}

pub(super) fn map_named<'a>(ebpf: &'a Ebpf, name: &str) -> Result<&'a aya::maps::Map> {
    ebpf.map(name)
        .ok_or_else(|| anyhow!("eBPF object has no map {name}"))
}

/// Every key of the hash map `name` (shared by all CPUs), with its value: in batches where the
/// kernel has them, else one key at a time.
pub(super) fn read_shared<K: Pod, V: Pod>(ebpf: &Ebpf, name: &str) -> Result<Vec<(K, V)>> {
    let raw = ebpf
        .map(name)
        .ok_or_else(|| anyhow!("eBPF object has no map {name}"))?;
    if let Some(all) = batch::lookup_all(raw).with_context(|| format!("reading {name}"))? {
        return Ok(all);
    }
    let map: BpfHashMap<&MapData, K, V> = map_ref(ebpf, name)?;
    map.iter()
        .map(|item| item.with_context(|| format!("reading {name}")))
        .collect()
}

/// Every value of the array `name`, shared by all CPUs, in index order.
pub(super) fn read_shared_array<V: Pod>(ebpf: &Ebpf, name: &str) -> Result<Vec<V>> {
    let raw = ebpf
        .map(name)
        .ok_or_else(|| anyhow!("eBPF object has no map {name}"))?;
    if let Some(all) =
        batch::lookup_all::<u32, V>(raw).with_context(|| format!("reading {name}"))?
    {
        return Ok(all.into_iter().map(|(_, value)| value).collect());
    }
    let map: aya::maps::Array<&MapData, V> = map_ref(ebpf, name)?;
    map.iter()
        .map(|item| item.with_context(|| format!("reading {name}")))
        .collect()
}

/// Every slot of a per-CPU array with its per-CPU values summed by `add`.
pub(super) fn read_array<V: Pod + Default + Copy, const N: usize>(
    map: &PerCpuArray<&MapData, V>,
    add: impl Fn(&mut V, &V),
) -> Result<[V; N]> {
    let mut out = [V::default(); N];
    for (i, slot) in out.iter_mut().enumerate() {
        for v in map.get(&(i as u32), 0)?.iter() {
            add(slot, v);
        }
    }
    Ok(out)
}

pub(super) fn read_stacks(
    map: &StackTraceMap<&MapData>,
    ids: &HashSet<u32>,
) -> HashMap<i32, Vec<u64>> {
    ids.iter()
        .filter_map(|&id| {
            let trace = map.get(&id, 0).ok()?;
            Some((id as i32, trace.frames().iter().map(|f| f.ip).collect()))
        })
        .collect()
}

pub(super) fn read_counters(map: &PerCpuArray<&MapData, u64>) -> Result<Vec<(Counter, u64)>> {
    let mut out = Vec::with_capacity(COUNTER_SLOTS as usize);
    for counter in Counter::ALL {
        let sum = map.get(&(counter as u32), 0)?.iter().sum();
        out.push((counter, sum));
    }
    Ok(out)
}

pub(super) fn read_comms(map: &BpfHashMap<&MapData, u32, [u8; 16]>) -> HashMap<u32, String> {
    map.iter()
        .filter_map(|r| r.ok())
        .map(|(pid, comm)| {
            let len = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
            (pid, String::from_utf8_lossy(&comm[..len]).into_owned())
        })
        .collect()
}
