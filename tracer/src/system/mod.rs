//! What the running system tells us at startup: kernel struct offsets (BTF), tracepoint layouts
//! (tracefs), processes (procfs), cgroups, JIT code names (perf maps) and our privileges.

pub mod btf;
pub mod cgroups;
pub mod perf_map;
pub mod priority;
pub mod privilege;
pub mod proc_looker;
pub mod procfs;
pub mod tracefs;
