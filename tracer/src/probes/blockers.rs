//! Reading blocker attribution: the waits charged to the holders they waited behind (BLOCKED).

use anyhow::Result;
use tracer_common::map_names;

use super::{Family, Probes};
use crate::model::Harvest;

pub(super) const FAMILY: Family = Family {
    read,
    ..Family::NOTHING
};

fn read(probes: &Probes, harvest: &mut Harvest) -> Result<()> {
    harvest.blocked = super::read_shared(&probes.ebpf, map_names::BLOCKED)?;
    Ok(())
}
