//! Building the workspace's default members (tracer, tracer-common, workload, xtask); the
//! eBPF crate is built by tracer's build.rs.

use anyhow::Result;

use crate::cmd::Cmd;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    Debug,
    Release,
}

pub fn build(profile: Profile) -> Result<()> {
    let cmd = match profile {
        Profile::Debug => Cmd::cargo(&["build"]),
        Profile::Release => Cmd::cargo(&["build", "--release"]),
    };
    cmd.run()
}
