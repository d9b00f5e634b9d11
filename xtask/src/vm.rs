//! `cargo xtask vm --kernel debian-6.1|debian-6.12 -- CMD`: runs CMD as root on a Debian
//! distribution kernel, booted under QEMU, with this machine's root file system as the guest's
//! (read-only over 9p, under a tmpfs overlay that takes the guest's writes and is gone with it).
//!
//! The kernel comes from Debian's archive as the package `linux-image-amd64` depends on now
//! (its `-unsigned` build: the same kernel without the signature wrapper), fetched with
//! `apt-get download` and unpacked with `dpkg-deb -x`, never installed; 6.12 through a private
//! apt configuration under `target/vm`, so the system's sources are never touched. The
//! initramfs is busybox and the modules that mount the share. Everything is cached under
//! `target/vm/<kernel>`.
//!
//! KVM on these machines runs only kernels built for it (a Debian kernel hangs in its early
//! boot), so a kernel is first tried under KVM once, briefly, and run under TCG (full
//! emulation, about ten times slower) when it does not come up; the outcome is cached.

use std::fs;
use std::io::{BufRead as _, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::cmd::Cmd;
use crate::paths;
use crate::setup;

/// The kernels `--kernel` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kernel {
    /// Debian 12 (bookworm): Linux 6.1, no per-VMA locks.
    #[value(name = "debian-6.1")]
    Debian61,
    /// Debian 13 (trixie): Linux 6.12.
    #[value(name = "debian-6.12")]
    Debian612,
}

impl Kernel {
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Debian61 => "debian-6.1",
            Kernel::Debian612 => "debian-6.12",
        }
    }

    /// The Debian release whose archive has it; None: the system's own sources (bookworm).
    fn private_suite(self) -> Option<&'static str> {
        match self {
            Kernel::Debian61 => None,
            Kernel::Debian612 => Some("trixie"),
        }
    }
}

/// What the guest's console prints around the command's output.
const UP_MARK: &str = "mmapsem-vm: up";
const STATUS_MARK: &str = "mmapsem-vm: exit status ";
/// Modules that mount the host's root over virtio 9p with an overlay on it, the scratch disk
/// (virtio_blk, ext4 and the crc32c its checksums ask the crypto API for, which no modprobe
/// would load here) and the dummy interface that gives the guest an address beyond loopback,
/// leaves first where they depend on each other (their dependencies are added from their
/// modinfo).
const MODULES: [&str; 9] = [
    "virtio_pci",
    "9pnet_virtio",
    "9p",
    "overlay",
    "virtio_rng",
    "virtio_blk",
    "crc32c_generic",
    "ext4",
    "dummy",
];
/// The guest's scratch disk, in MiB: an ext4 file system at `SCRATCH_MOUNT` and the tests'
/// TMPDIR, so that their files live on a disk as on a real machine. On the overlay's tmpfs a
/// shared file mapping has no backing store to page out to and fault back from, and reading
/// such a page of another process through /proc/PID/mem after dropping it failed with EIO.
const SCRATCH_MIB: u64 = 3 * 1024;
const SCRATCH_MOUNT: &str = "/scratch";
/// About how many times slower a TCG guest runs than the host (a tracer's load: 0.8 s on the
/// host, 8 s in the guest).
const TCG_SLOWDOWN: u32 = 10;
/// How long a kernel gets to come up under KVM before it is taken to need TCG.
const KVM_PROBE: Duration = Duration::from_secs(25);

/// A kernel fetched and unpacked, with the accelerator it runs under: what `run` needs, made
/// one kernel at a time (apt and the KVM probe) so that guests can then boot side by side.
pub struct Prepared {
    kernel: Kernel,
    dir: PathBuf,
    tree: PathBuf,
    accel: Accel,
}

/// Installs what the guests need and fetches `kernel` (once; cached under target/vm).
pub fn prepare(kernel: Kernel) -> Result<Prepared> {
    setup::for_vm()?;
    let dir = paths::target_dir().join("vm").join(kernel.name());
    let tree = fetch_kernel(kernel, &dir)?;
    let accel = accelerator(&dir, &tree)?;
    Ok(Prepared {
        kernel,
        dir,
        tree,
        accel,
    })
}

impl Prepared {
    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// Runs `command` in the guest, with `env` besides the variables passed through, handing
    /// each line it prints to `on_line`; returns its exit status.
    pub fn run(
        &self,
        command: &[String],
        env: &[(&str, String)],
        timeout: Duration,
        on_line: &mut dyn FnMut(&str),
    ) -> Result<i32> {
        if command.is_empty() {
            bail!(
                "nothing to run: cargo xtask vm --kernel {} -- CMD",
                self.kernel.name()
            );
        }
        let mut env = env.to_vec();
        if self.accel == Accel::Tcg {
            // For the tests: how many times slower than the host this guest runs, to scale
            // their workloads' durations (not their measurements) by.
            env.push(("MMAPSEM_SLOWDOWN", TCG_SLOWDOWN.to_string()));
        }
        let script = guest_script(command, &env);
        let initramfs = self.dir.join("initramfs.cpio");
        build_initramfs(&self.tree, &script, &initramfs)?;
        let scratch = self.dir.join("scratch.img");
        make_scratch_disk(&scratch)?;
        let run = boot(
            &self.tree,
            &initramfs,
            Some(&scratch),
            self.accel,
            timeout,
            Some(on_line),
        )?;
        run.status
            .ok_or_else(|| anyhow!("the guest ended without the command's exit status"))
    }
}

/// The unpacked kernel package under `dir/kernel`, fetched the first time.
fn fetch_kernel(kernel: Kernel, dir: &Path) -> Result<PathBuf> {
    let tree = dir.join("kernel");
    if vmlinuz(&tree).is_ok() {
        return Ok(tree);
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let apt = AptConfig::for_kernel(kernel, &paths::target_dir().join("vm"))?;
    let package = format!("{}-unsigned", apt.newest_kernel()?);
    eprintln!("vm: fetching {package}");
    apt.download(&package, dir)?;
    let deb = fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.extension().is_some_and(|x| x == "deb")
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&package))
        })
        .ok_or_else(|| {
            anyhow!(
                "apt-get download left no {package} .deb in {}",
                dir.display()
            )
        })?;
    let unpacking = dir.join("kernel.partial");
    let _ = fs::remove_dir_all(&unpacking);
    Cmd::new("dpkg-deb")
        .arg("-x")
        .arg(deb.display().to_string())
        .arg(unpacking.display().to_string())
        .run()?;
    fs::rename(&unpacking, &tree)?;
    fs::remove_file(&deb)?;
    vmlinuz(&tree)?;
    Ok(tree)
}

fn vmlinuz(tree: &Path) -> Result<PathBuf> {
    let boot = tree.join("boot");
    fs::read_dir(&boot)
        .with_context(|| format!("reading {}", boot.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .ok_or_else(|| anyhow!("no vmlinuz in {}", boot.display()))
}

/// apt as this machine has it, or with a private configuration for another Debian release.
struct AptConfig {
    options: Vec<String>,
}

impl AptConfig {
    fn for_kernel(kernel: Kernel, vm_dir: &Path) -> Result<Self> {
        let Some(suite) = kernel.private_suite() else {
            return Ok(Self {
                options: Vec::new(),
            });
        };
        let root = vm_dir.join(format!("apt-{suite}"));
        for sub in ["lists/partial", "cache/archives/partial"] {
            fs::create_dir_all(root.join(sub))?;
        }
        let sources = root.join("sources.list");
        let keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
        fs::write(
            &sources,
            format!(
                "deb [signed-by={keyring}] http://deb.debian.org/debian {suite} main\n\
                 deb [signed-by={keyring}] http://deb.debian.org/debian-security \
                 {suite}-security main\n"
            ),
        )?;
        let at = |p: &Path| p.display().to_string();
        let options = [
            format!("Dir::Etc::SourceList={}", at(&sources)),
            "Dir::Etc::SourceParts=/nonexistent".to_string(),
            format!("Dir::State::Lists={}", at(&root.join("lists"))),
            format!("Dir::Cache={}", at(&root.join("cache"))),
            "Dir::State::status=/dev/null".to_string(),
            "APT::Architecture=amd64".to_string(),
        ]
        .into_iter()
        .flat_map(|o| ["-o".to_string(), o])
        .collect();
        let config = Self { options };
        config.apt("apt-get").arg("update").run()?;
        Ok(config)
    }

    fn apt(&self, program: &str) -> Cmd {
        Cmd::new(program)
            .args(&self.options)
            // The files go to a root-owned directory that apt's own user cannot write.
            .args(&["-o", "APT::Sandbox::User=root"])
            .env("DEBIAN_FRONTEND", "noninteractive")
    }

    /// The kernel package `linux-image-amd64` depends on (`linux-image-6.1.0-50-amd64`).
    fn newest_kernel(&self) -> Result<String> {
        let depends = self
            .apt("apt-cache")
            .args(&["depends", "linux-image-amd64"])
            .probe_ok()?;
        parse_kernel_dependency(&depends)
            .ok_or_else(|| anyhow!("linux-image-amd64 names no kernel package:\n{depends}"))
    }

    fn download(&self, package: &str, into: &Path) -> Result<()> {
        self.apt("apt-get")
            .args(&["download", package])
            .dir(into)
            .run()
    }
}

/// The kernel image package in `apt-cache depends linux-image-amd64`'s output.
fn parse_kernel_dependency(depends: &str) -> Option<String> {
    depends.lines().find_map(|line| {
        let name = line.trim().strip_prefix("Depends: ")?;
        (name.starts_with("linux-image-") && name.ends_with("-amd64")).then(|| name.to_string())
    })
}

/// The command as the guest's shell runs it: from the workspace, as root, with the variables
/// that steer the tests.
fn guest_script(command: &[String], env: &[(&str, String)]) -> String {
    let mut script = format!("export HOME=/root TERM=dumb LANG=C.UTF-8 TMPDIR={SCRATCH_MOUNT}\n");
    script.push_str(&format!(
        "export PATH={}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n",
        shell_quote(&paths::cargo_bin().display().to_string())
    ));
    for (name, value) in std::env::vars() {
        let passed = name.starts_with("MMAPSEM_")
            || name.starts_with("RUST_")
            || ["CI", "CARGO_HOME", "RUSTUP_HOME", "CARGO_TARGET_DIR"].contains(&name.as_str());
        if passed {
            script.push_str(&format!("export {name}={}\n", shell_quote(&value)));
        }
    }
    for (name, value) in env {
        script.push_str(&format!("export {name}={}\n", shell_quote(value)));
    }
    script.push_str(&format!(
        "cd {}\n",
        shell_quote(&paths::workspace_root().display().to_string())
    ));
    let words: Vec<String> = command.iter().map(|w| shell_quote(w)).collect();
    script.push_str(&words.join(" "));
    script.push('\n');
    script
}

fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The guest's /init: mount the host's root read-only with a tmpfs overlay, mount the
/// kernel's file systems in it, run the command there, print its status, power off. /tmp is
/// the overlay's like the rest: a workspace checked out under /tmp stays visible.
fn init_script() -> String {
    format!(
        r#"#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /lower /upper /newroot
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules/order); do insmod /modules/$m.ko || echo "mmapsem-vm: insmod $m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose host /lower || echo "mmapsem-vm: no 9p share"
mount -t tmpfs -o size=75% upper /upper
mkdir -p /upper/data /upper/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work /newroot || echo "mmapsem-vm: no overlay"
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs tmpfs /newroot/dev/shm
# What udev makes on a booted system; without them "/dev/stdout" names no file at all.
ln -s /proc/self/fd /newroot/dev/fd
ln -s /proc/self/fd/0 /newroot/dev/stdin
ln -s /proc/self/fd/1 /newroot/dev/stdout
ln -s /proc/self/fd/2 /newroot/dev/stderr
mount -t tmpfs tmpfs /newroot/run
mount -t tracefs tracefs /newroot/sys/kernel/tracing
mount -t debugfs debugfs /newroot/sys/kernel/debug
mount -t bpf bpf /newroot/sys/fs/bpf
mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup
mkdir -p /newroot{SCRATCH_MOUNT}
mount -t ext4 /dev/vda /newroot{SCRATCH_MOUNT} && chmod 1777 /newroot{SCRATCH_MOUNT} || echo "mmapsem-vm: no scratch disk"
cp /command /newroot/tmp/.mmapsem-vm-command
hostname mmapsem-vm
# Loopback for the daemon's tests, and an address beyond it on a dummy interface (no NIC,
# nothing leaves the guest) for the test that the default endpoint answers on loopback only.
ip link set lo up || ifconfig lo 127.0.0.1 up || echo "mmapsem-vm: no loopback"
ip addr add 10.0.2.15/24 dev dummy0 && ip link set dummy0 up && ip route add default dev dummy0 || echo "mmapsem-vm: no dummy0"
echo "{UP_MARK}, kernel $(uname -r)"
chroot /newroot /bin/sh /tmp/.mmapsem-vm-command < /dev/null
echo "{STATUS_MARK}$?"
poweroff -f
"#
    )
}

/// A fresh, empty ext4 image at `path` (sparse: it takes room only as the guest writes).
fn make_scratch_disk(path: &Path) -> Result<()> {
    let image = fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    image.set_len(SCRATCH_MIB << 20)?;
    drop(image);
    Cmd::new("mkfs.ext4")
        .args(&["-q", "-F", "-L", "mmapsem-scratch"])
        .arg(path.display().to_string())
        .run()
}

/// Writes the initramfs: busybox, /init, the command and the modules (decompressed: busybox
/// insmod reads plain ELF).
fn build_initramfs(tree: &Path, script: &str, out: &Path) -> Result<()> {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or_else(|| anyhow!("no busybox (Debian's busybox-static)"))?;
    let mut cpio = Cpio::default();
    for dir in ["bin", "modules", "proc", "sys", "dev"] {
        cpio.dir(dir);
    }
    cpio.file("bin/busybox", &fs::read(&busybox)?, 0o755);
    cpio.file("init", init_script().as_bytes(), 0o755);
    cpio.file("command", script.as_bytes(), 0o644);
    let modules = Modules::of(tree)?;
    let mut order = String::new();
    for name in modules.load_order(&MODULES)? {
        let bytes = modules.read(&name)?;
        cpio.file(&format!("modules/{name}.ko"), &bytes, 0o644);
        order.push_str(&name);
        order.push('\n');
    }
    cpio.file("modules/order", order.as_bytes(), 0o644);
    fs::write(out, cpio.finish()).with_context(|| format!("writing {}", out.display()))
}

/// The kernel package's modules, by name.
struct Modules {
    paths: std::collections::HashMap<String, PathBuf>,
    builtin: String,
}

impl Modules {
    fn of(tree: &Path) -> Result<Self> {
        let base = fs::read_dir(tree.join("lib/modules"))
            .or_else(|_| fs::read_dir(tree.join("usr/lib/modules")))
            .context("the kernel package has no lib/modules")?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .next()
            .ok_or_else(|| anyhow!("no module directory in the kernel package"))?;
        let mut paths = std::collections::HashMap::new();
        let mut stack = vec![base.join("kernel")];
        while let Some(dir) = stack.pop() {
            for entry in fs::read_dir(&dir)?.filter_map(|e| e.ok()) {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else if let Some(name) = module_name(&path) {
                    paths.insert(name, path);
                }
            }
        }
        let builtin = fs::read_to_string(base.join("modules.builtin")).unwrap_or_default();
        Ok(Self { paths, builtin })
    }

    fn is_builtin(&self, name: &str) -> bool {
        let file = format!("/{name}.ko");
        self.builtin
            .lines()
            .any(|l| l.replace('-', "_").ends_with(&file))
    }

    fn read(&self, name: &str) -> Result<Vec<u8>> {
        let path = &self.paths[name];
        let decompress = |program: &str| -> Result<Vec<u8>> {
            let mut child = Command::new(program)
                .args(["-dc", &path.display().to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .with_context(|| format!("running {program}"))?;
            let mut out = Vec::new();
            child.stdout.take().unwrap().read_to_end(&mut out)?;
            if !child.wait()?.success() {
                bail!("{program} could not decompress {}", path.display());
            }
            Ok(out)
        };
        match path.extension().and_then(|x| x.to_str()) {
            Some("xz") => decompress("xz"),
            Some("zst") => decompress("zstd"),
            Some("gz") => decompress("gzip"),
            _ => Ok(fs::read(path)?),
        }
    }

    /// `wanted` and what they depend on, each after its dependencies; built-in ones are
    /// left out, and so are wanted modules the kernel lacks (a warning says which).
    fn load_order(&self, wanted: &[&str]) -> Result<Vec<String>> {
        let mut order = Vec::new();
        for name in wanted {
            if self.is_builtin(name) {
                continue;
            }
            if !self.paths.contains_key(*name) {
                eprintln!("vm: the kernel has no module {name}; going on without it");
                continue;
            }
            self.visit(name, &mut order, 0)?;
        }
        Ok(order)
    }

    fn visit(&self, name: &str, order: &mut Vec<String>, depth: usize) -> Result<()> {
        if order.iter().any(|n| n == name) || self.is_builtin(name) {
            return Ok(());
        }
        if depth > 32 {
            bail!("module dependencies of {name} loop");
        }
        let bytes = self
            .read(name)
            .with_context(|| format!("module {name}, which another depends on"))?;
        for dep in modinfo_depends(&bytes) {
            self.visit(&dep, order, depth + 1)?;
        }
        order.push(name.to_string());
        Ok(())
    }
}

/// `foo` for `.../foo.ko`, `foo.ko.xz`, `foo.ko.zst` (dashes as underscores, as modprobe
/// names them).
fn module_name(path: &Path) -> Option<String> {
    let file = path.file_name()?.to_str()?;
    let stem = [".ko", ".ko.xz", ".ko.zst", ".ko.gz"]
        .into_iter()
        .find_map(|suffix| file.strip_suffix(suffix))?;
    Some(stem.replace('-', "_"))
}

/// The `depends=` entry of a module's .modinfo section.
fn modinfo_depends(module: &[u8]) -> Vec<String> {
    let needle = b"depends=";
    let Some(at) = module.windows(needle.len()).position(|w| w == needle) else {
        return Vec::new();
    };
    let rest = &module[at + needle.len()..];
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    String::from_utf8_lossy(&rest[..end])
        .split(',')
        .filter(|d| !d.is_empty())
        .map(|d| d.replace('-', "_"))
        .collect()
}

/// An initramfs in the kernel's "newc" cpio format, uncompressed.
#[derive(Default)]
struct Cpio {
    bytes: Vec<u8>,
    inode: u32,
}

impl Cpio {
    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, &[]);
    }

    fn file(&mut self, name: &str, data: &[u8], mode: u32) {
        self.entry(name, 0o100_000 | mode, data);
    }

    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.inode += 1;
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.inode,
            mode,
            0, // uid
            0, // gid
            1, // nlink
            0, // mtime
            data.len(),
            0, // devmajor
            0, // devminor
            0, // rdevmajor
            0, // rdevminor
            name.len() + 1,
            0, // check
        );
        self.bytes.extend_from_slice(header.as_bytes());
        self.bytes.extend_from_slice(name.as_bytes());
        self.bytes.push(0);
        self.pad();
        self.bytes.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.bytes.len().is_multiple_of(4) {
            self.bytes.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.bytes
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Accel {
    Kvm,
    Tcg,
}

/// KVM if this kernel came up under it (tried once, cached in `dir/accel`), else TCG.
fn accelerator(dir: &Path, tree: &Path) -> Result<Accel> {
    let cached = dir.join("accel");
    match fs::read_to_string(&cached).as_deref().map(str::trim) {
        Ok("kvm") => return Ok(Accel::Kvm),
        Ok("tcg") => return Ok(Accel::Tcg),
        _ => {}
    }
    let accel = if Path::new("/dev/kvm").exists() {
        let probe = dir.join("probe.cpio");
        build_initramfs(tree, "true\n", &probe)?;
        let came_up = boot(tree, &probe, None, Accel::Kvm, KVM_PROBE, None)?.came_up;
        if came_up {
            Accel::Kvm
        } else {
            eprintln!(
                "vm: this kernel does not come up under KVM here; running it under TCG \
                 (emulated, about ten times slower)"
            );
            Accel::Tcg
        }
    } else {
        Accel::Tcg
    };
    fs::write(&cached, if accel == Accel::Kvm { "kvm" } else { "tcg" })?;
    Ok(accel)
}

/// What a boot showed.
struct Boot {
    came_up: bool,
    status: Option<i32>,
}

/// Boots `tree`'s kernel with `initramfs` and hands the guest's console lines from the mark
/// on to `relay` (if any); kills QEMU past `timeout`.
fn boot(
    tree: &Path,
    initramfs: &Path,
    scratch: Option<&Path>,
    accel: Accel,
    timeout: Duration,
    mut relay: Option<&mut dyn FnMut(&str)>,
) -> Result<Boot> {
    let mut qemu = Command::new("qemu-system-x86_64");
    match accel {
        Accel::Kvm => qemu.args(["-accel", "kvm", "-cpu", "host"]),
        // One host thread for all vCPUs: with one per vCPU (thread=multi), QEMU 7.2 let a
        // vCPU run a tracepoint's call site while another patched it (attaching a program),
        // and 6.12 died of the int3 left there ("Oops: int3" in __schedule).
        Accel::Tcg => qemu.args(["-accel", "tcg,thread=single", "-cpu", "max"]),
    };
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    qemu.args([
        "-machine",
        "q35",
        "-m",
        "4G",
        "-nographic",
        "-no-reboot",
        "-net",
        "none",
    ])
    .args(["-smp", &cpus.to_string()])
    .arg("-kernel")
    .arg(vmlinuz(tree)?)
    .arg("-initrd")
    .arg(initramfs)
    .args(["-append", "console=ttyS0 quiet loglevel=3 panic=-1"])
    .args([
        "-virtfs",
        "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap",
    ])
    .args(["-device", "virtio-rng-pci"]);
    if let Some(disk) = scratch {
        // cache=unsafe: the guest's writes and flushes still reach QEMU as block I/O (what the
        // tests need), but nothing of a throwaway disk is forced to the host's disk.
        qemu.arg("-drive").arg(format!(
            "file={},format=raw,if=virtio,cache=unsafe",
            disk.display()
        ));
    }
    qemu.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = qemu.spawn().context("starting qemu-system-x86_64")?;
    let (lines, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let err_lines = lines.clone();
    std::thread::spawn(move || relay_lines(stdout, &lines));
    std::thread::spawn(move || relay_lines(stderr, &err_lines));
    let deadline = Instant::now() + timeout;
    let mut result = Boot {
        came_up: false,
        status: None,
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let line = line.trim_end_matches('\r');
                // The firmware's screen clearing shares a line with the first mark.
                if let Some(at) = line.find(STATUS_MARK) {
                    result.status = line[at + STATUS_MARK.len()..].trim().parse().ok();
                } else if let Some(at) = line.find(UP_MARK) {
                    result.came_up = true;
                    if relay.is_some() {
                        eprintln!("vm: {}", &line[at + "mmapsem-vm: ".len()..]);
                    }
                } else if let Some(relay) = relay.as_mut().filter(|_| result.came_up) {
                    if !is_kernel_noise(line) {
                        relay(line);
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                if relay.is_some() {
                    bail!("the guest ran past {} s; killed", timeout.as_secs());
                }
                return Ok(result);
            }
        }
    }
    let status = child.wait()?;
    if !status.success() && relay.is_some() {
        bail!("qemu-system-x86_64 failed: {status}");
    }
    Ok(result)
}

fn relay_lines(from: impl std::io::Read, to: &mpsc::Sender<String>) {
    for line in BufReader::new(from).split(b'\n').map_while(Result::ok) {
        if to
            .send(String::from_utf8_lossy(&line).into_owned())
            .is_err()
        {
            break;
        }
    }
}

/// Lines the guest kernel prints on the console besides the command's output.
fn is_kernel_noise(line: &str) -> bool {
    let timestamp = line.starts_with('[')
        && line[1..]
            .split(']')
            .next()
            .is_some_and(|t| t.trim().parse::<f64>().is_ok());
    timestamp && (line.contains("reboot: Power down") || line.contains("ACPI"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_package_is_read_off_the_metapackage() {
        let out = "linux-image-amd64\n  Depends: linux-image-6.1.0-50-amd64\n";
        assert_eq!(
            parse_kernel_dependency(out).as_deref(),
            Some("linux-image-6.1.0-50-amd64")
        );
        let trixie = "linux-image-amd64\n  Depends: linux-image-6.12.117+deb13-amd64\n";
        assert_eq!(
            parse_kernel_dependency(trixie).as_deref(),
            Some("linux-image-6.12.117+deb13-amd64")
        );
        assert_eq!(parse_kernel_dependency("linux-image-amd64\n"), None);
    }

    #[test]
    fn module_names_and_dependencies() {
        assert_eq!(
            module_name(Path::new("/k/fs/9p/9p.ko.xz")).as_deref(),
            Some("9p")
        );
        assert_eq!(
            module_name(Path::new("/k/net/9p/9pnet_virtio.ko")).as_deref(),
            Some("9pnet_virtio")
        );
        assert_eq!(module_name(Path::new("/k/modules.order")), None);
        let modinfo = b"\0license=GPL\0depends=virtio,9pnet,virtio_ring\0intree=Y\0";
        assert_eq!(modinfo_depends(modinfo), ["virtio", "9pnet", "virtio_ring"]);
        assert!(modinfo_depends(b"\0depends=\0").is_empty());
    }

    #[test]
    fn cpio_entries_are_newc_and_aligned() {
        let mut cpio = Cpio::default();
        cpio.file("init", b"#!/bin/sh\n", 0o755);
        let bytes = cpio.finish();
        assert!(bytes.starts_with(b"070701"));
        assert!(bytes.len().is_multiple_of(4));
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("init\0"));
        assert!(text.contains("TRAILER!!!\0"));
        // mode 0100755, file size 10 bytes.
        assert_eq!(&text[14..22], "000081ed");
        assert_eq!(&text[54..62], "0000000a");
    }

    #[test]
    fn the_command_is_quoted_for_the_guest_shell() {
        let script = guest_script(
            &["sh".into(), "-c".into(), "echo 'a b'".into()],
            &[("MMAPSEM_X", "1".into())],
        );
        assert!(script.contains("export MMAPSEM_X='1'\n"), "{script}");
        assert!(
            script.ends_with("'sh' '-c' 'echo '\\''a b'\\'''\n"),
            "{script}"
        );
    }
}
