//! Attaching the lock contention family (the sleeping part of each wait).

use anyhow::Result;
use aya::Ebpf;
use tracer_common::Config;

use crate::system::tracefs::{Tracefs, CONTENTION_BEGIN, CONTENTION_END};

pub fn configure(tracefs: &Tracefs, config: &mut Config) -> Result<()> {
    if tracefs.has(&CONTENTION_BEGIN) && tracefs.has(&CONTENTION_END) {
        config.contention_begin_lock = tracefs.field_offset(&CONTENTION_BEGIN, "lock_addr", 8)?;
        config.contention_end_lock = tracefs.field_offset(&CONTENTION_END, "lock_addr", 8)?;
    }
    Ok(())
}

pub fn attach(ebpf: &mut Ebpf, tracefs: &Tracefs) -> Result<bool> {
    Ok(
        super::attach_tracepoints(ebpf, tracefs, "contention_begin", &[CONTENTION_BEGIN])?
            && super::attach_tracepoints(ebpf, tracefs, "contention_end", &[CONTENTION_END])?,
    )
}
