//! Attaching the lock contention family (the sleeping part of each wait): BTF tracepoints
//! where the kernel allows them, else classic ones.

use anyhow::{anyhow, Result};
use aya::{programs::BtfTracePoint, Ebpf};
use tracer_common::Config;

use super::Family;
use crate::system::tracefs::{Needed, Tracefs};

pub(super) const FAMILY: Family = Family {
    configure: |setup, config| configure(setup.tracefs, config),
    attach: |at, features| {
        let settings = at.setup.settings;
        if settings.attribution {
            features.contention = attach(
                at.ebpf,
                at.setup.tracefs,
                settings.classic_tracepoints,
                at.links,
            )?;
        }
        Ok(())
    },
    programs: &[BTF_BEGIN, BTF_END, CLASSIC_BEGIN, CLASSIC_END],
    ..Family::NOTHING
};

/// The lock tracepoints (optional: without them waits are not split into spinning and
/// sleeping, with a warning).
const CONTENTION_BEGIN: Needed = Needed {
    category: "lock",
    name: "contention_begin",
    since: "5.19",
};
const CONTENTION_END: Needed = Needed {
    category: "lock",
    name: "contention_end",
    since: "5.19",
};

fn configure(tracefs: &Tracefs, config: &mut Config) -> Result<()> {
    if tracefs.has(&CONTENTION_BEGIN) && tracefs.has(&CONTENTION_END) {
        config.contention.begin_lock = tracefs.field_offset(&CONTENTION_BEGIN, "lock_addr", 8)?;
        config.contention.end_lock = tracefs.field_offset(&CONTENTION_END, "lock_addr", 8)?;
    }
    Ok(())
}

fn attach(
    ebpf: &mut Ebpf,
    tracefs: &Tracefs,
    force_classic: bool,
    links: &mut super::ClassicLinks,
) -> Result<bool> {
    let present = tracefs.has(&CONTENTION_BEGIN) && tracefs.has(&CONTENTION_END);
    if present && !force_classic {
        match load_btf(ebpf) {
            Ok(()) => {
                for (name, event) in BTF_PROGRAMS {
                    super::program::<BtfTracePoint>(ebpf, name)?
                        .attach()
                        .map_err(|e| {
                            super::explain_permission(
                                anyhow!(e),
                                &format!("attaching tp_btf/{event}"),
                            )
                        })?;
                }
                return Ok(true);
            }
            Err(err) => log::debug!("lock contention as BTF tracepoints: {err:#}"),
        }
    }
    Ok(
        super::attach_tracepoints(ebpf, tracefs, CLASSIC_BEGIN, &[CONTENTION_BEGIN], links)?
            && super::attach_tracepoints(ebpf, tracefs, CLASSIC_END, &[CONTENTION_END], links)?,
    )
}

/// The programs: BTF tracepoints, classic ones as the fallback.
const BTF_BEGIN: &str = "btf_contention_begin";
const BTF_END: &str = "btf_contention_end";
const CLASSIC_BEGIN: &str = "contention_begin";
const CLASSIC_END: &str = "contention_end";

const BTF_PROGRAMS: [(&str, &str); 2] =
    [(BTF_BEGIN, "contention_begin"), (BTF_END, "contention_end")];

fn load_btf(ebpf: &mut Ebpf) -> Result<()> {
    let btf = super::kernel_btf()?;
    for (name, event) in BTF_PROGRAMS {
        let started = std::time::Instant::now();
        let program = super::program::<BtfTracePoint>(ebpf, name)?;
        program
            .load(event, &btf)
            .map_err(|e| super::load_failed(e, &format!("loading {name}")))?;
        super::log_verified(name, program.info(), started.elapsed());
    }
    Ok(())
}
