//! Reading blocker attribution: the waits charged to the holders they waited behind (BLOCKED).

use anyhow::Result;

use super::{Family, Probes};
use crate::model::Harvest;

pub(super) const FAMILY: Family = Family {
    read,
    maps: &[BLOCKED, HOLDERS, HOLDERS_BY_SLOT, HOLDER_INFO],
    ..Family::NOTHING
};

/// Waits by the holder they were charged to.
pub(super) const BLOCKED: &str = "BLOCKED";
/// Who holds or waits for each target mm's lock (by mm; HOLDERS_BY_SLOT for slot targets).
pub(super) const HOLDERS: &str = "HOLDERS";
const HOLDERS_BY_SLOT: &str = "HOLDERS_BY_SLOT";
/// The holds that blocked someone, for their waiters to find.
pub(super) const HOLDER_INFO: &str = "HOLDER_INFO";

fn read(probes: &Probes, harvest: &mut Harvest) -> Result<()> {
    harvest.blocked = super::read_shared(&probes.ebpf, BLOCKED)?;
    Ok(())
}
