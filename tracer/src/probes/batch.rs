//! Reading a whole hash map in a few syscalls (BPF_MAP_LOOKUP_BATCH), where aya's iterator
//! takes two per key: the live view and interval reports read the aggregation maps every
//! refresh, thousands of entries each.

use std::os::fd::{AsFd as _, AsRawFd as _};

use anyhow::{anyhow, bail, Result};
use aya::{
    maps::{Map, MapData},
    Pod,
};

/// BPF_MAP_LOOKUP_BATCH from include/uapi/linux/bpf.h.
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// The kernel's ENOTSUPP (not in libc: it never reaches user space but here).
const ENOTSUPP: i32 = 524;
/// Keys and values fetched per syscall.
const CHUNK: usize = 1024;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Every entry of a hash map or array shared by all CPUs (not a per-CPU one: its values are
/// laid out per CPU; an array's keys are its indices), `None` when the kernel has no batch operations for it (before 5.6), so that the
/// caller falls back to iterating.
pub fn lookup_all<K: Pod, V: Pod>(map: &Map) -> Result<Option<Vec<(K, V)>>> {
    let data = match map {
        Map::HashMap(data) | Map::LruHashMap(data) | Map::Array(data) => data,
        _ => bail!("batched lookup of a map that is not a shared hash map or array"),
    };
    lookup_all_in::<K, V>(data)
}

fn lookup_all_in<K: Pod, V: Pod>(data: &MapData) -> Result<Option<Vec<(K, V)>>> {
    let fd = data.fd().as_fd().as_raw_fd();
    let mut keys = vec![std::mem::MaybeUninit::<K>::uninit(); CHUNK];
    let mut values = vec![std::mem::MaybeUninit::<V>::uninit(); CHUNK];
    // The batch token of hash maps is a bucket index (u32), of arrays an index; room for a key
    // is more than enough.
    let token_len = std::mem::size_of::<K>().max(8);
    let (mut token_in, mut token_out) = (vec![0u8; token_len], vec![0u8; token_len]);
    let mut out = Vec::new();
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { token_in.as_ptr() as u64 },
            out_batch: token_out.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        // SAFETY: attr points at buffers of `count` keys and values and two tokens, all alive
        // for the call; the kernel writes at most that much.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>(),
            )
        };
        let errno = std::io::Error::last_os_error();
        let got = attr.count as usize;
        for i in 0..got.min(CHUNK) {
            // SAFETY: the kernel filled the first `got` keys and values.
            out.push(unsafe { (keys[i].assume_init(), values[i].assume_init()) });
        }
        if ret == 0 {
            std::mem::swap(&mut token_in, &mut token_out);
            first = false;
            continue;
        }
        return match errno.raw_os_error() {
            // The end of the map: the last entries came with it.
            Some(libc::ENOENT) => Ok(Some(out)),
            Some(libc::EINVAL | ENOTSUPP | libc::EOPNOTSUPP) if first => Ok(None),
            _ => Err(anyhow!("BPF_MAP_LOOKUP_BATCH: {errno}")),
        };
    }
}

/// BPF_MAP_DELETE_ELEM from include/uapi/linux/bpf.h.
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;

/// The element-operation members of `union bpf_attr`.
#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// Deletes `keys` from a hash map shared by all CPUs; returns how many were there. Through the
/// map's fd, so that a reader holding the map (`&Map`) can delete.
pub fn delete_keys<K: Pod>(map: &Map, keys: &[K]) -> Result<usize> {
    let data = match map {
        Map::HashMap(data) | Map::LruHashMap(data) => data,
        _ => bail!("deleting from a map that is not a shared hash map"),
    };
    let fd = data.fd().as_fd().as_raw_fd();
    let mut deleted = 0;
    for key in keys {
        let attr = ElemAttr {
            map_fd: fd as u32,
            _pad: 0,
            key: key as *const K as u64,
            value: 0,
            flags: 0,
        };
        // SAFETY: attr points at a live key of the map's key size for the call.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_DELETE_ELEM,
                &attr as *const ElemAttr,
                std::mem::size_of::<ElemAttr>(),
            )
        };
        if ret == 0 {
            deleted += 1;
            continue;
        }
        let errno = std::io::Error::last_os_error();
        // Gone already (an LRU evicted it): nothing to do.
        if errno.raw_os_error() != Some(libc::ENOENT) {
            return Err(anyhow!("BPF_MAP_DELETE_ELEM: {errno}"));
        }
    }
    Ok(deleted)
}

/// BPF_MAP_UPDATE_ELEM from include/uapi/linux/bpf.h.
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;

/// Sets every slot of an array of u32 shared by all CPUs to `value`, through the map's fd (as
/// `delete_keys`, for a reader holding the map).
pub fn fill_array(map: &Map, value: u32) -> Result<()> {
    let Map::Array(data) = map else {
        bail!("filling a map that is not an array");
    };
    let fd = data.fd().as_fd().as_raw_fd();
    for index in 0..data.info()?.max_entries() {
        let attr = ElemAttr {
            map_fd: fd as u32,
            _pad: 0,
            key: &index as *const u32 as u64,
            value: &value as *const u32 as u64,
            flags: 0,
        };
        // SAFETY: attr points at a live u32 index and value for the call.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_UPDATE_ELEM,
                &attr as *const ElemAttr,
                std::mem::size_of::<ElemAttr>(),
            )
        };
        if ret != 0 {
            let errno = std::io::Error::last_os_error();
            return Err(anyhow!("BPF_MAP_UPDATE_ELEM: {errno}"));
        }
    }
    Ok(())
}
