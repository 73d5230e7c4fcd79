//! Host-memory primitives behind the simulated device memory: memfd-backed physical
//! allocations, `PROT_NONE` address reservations and fixed mappings over them.
//!
//! Every function here is a thin, checked wrapper over one or two system calls.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;

/// A physical allocation: a sparse memfd plus one private "shadow" mapping of the whole file,
/// through which the simulator reaches the bytes without going through a device mapping
/// (multicast fan-out, bind of a handle that is mapped nowhere).
pub(super) struct Memfd {
    fd: OwnedFd,
    shadow: *mut u8,
    size: usize,
    identity: (u64, u64),
}

// SAFETY: `shadow` is a MAP_SHARED mapping owned by this value for its whole life; it is only
// unmapped in `Drop`. Concurrent access to the bytes is the simulated program's business, exactly
// as with device memory.
unsafe impl Send for Memfd {}
// SAFETY: see `Send`; `&Memfd` exposes only the address and the descriptor.
unsafe impl Sync for Memfd {}

impl Memfd {
    /// A zero-filled, sparse memfd of `size` bytes (no memory is used until a page is touched),
    /// named `mcast-sim:<tag>@<host tag>` so that another process importing the descriptor can
    /// tell what it is and which host made it (see [`memfd_tag`], [`memfd_host`]).
    pub(super) fn create(size: usize, tag: &str) -> io::Result<Memfd> {
        let host = crate::bootstrap::host::host_tag();
        let name =
            std::ffi::CString::new(format!("mcast-sim:{tag}@{host}")).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: the name is a valid NUL-terminated string; the result is checked.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = libc::off_t::try_from(size).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `fd` is a valid memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Self::adopt(fd, size)
    }

    /// Wraps a memfd of `size` bytes (made here or received from another process).
    pub(super) fn adopt(fd: OwnedFd, size: usize) -> io::Result<Memfd> {
        let identity = fd_identity(fd.as_raw_fd())?;
        // SAFETY: a fresh shared mapping of the whole file at an address the kernel chooses.
        let shadow = unsafe {
            libc::mmap(
                ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd.as_raw_fd(),
                0,
            )
        };
        if shadow == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Memfd { fd, shadow: shadow.cast(), size, identity })
    }

    /// The descriptor.
    pub(super) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Host address of byte 0 of the allocation (the shadow mapping).
    pub(super) fn shadow(&self) -> *mut u8 {
        self.shadow
    }

    /// `(st_dev, st_ino)` of the memfd: how an imported descriptor is recognised.
    pub(super) fn identity(&self) -> (u64, u64) {
        self.identity
    }
}

impl Drop for Memfd {
    fn drop(&mut self) {
        // SAFETY: `shadow`/`size` is exactly the mapping created in `create`, unmapped only here.
        unsafe { libc::munmap(self.shadow.cast(), self.size) };
    }
}

/// The `<tag>` of a memfd made by [`Memfd::create`] in any process, and its size; `None` when
/// the descriptor is not such a memfd.
pub(super) fn memfd_tag(fd: RawFd) -> Option<(String, usize)> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let link = link.to_string_lossy();
    let tag = link.strip_prefix("/memfd:mcast-sim:")?;
    let tag = tag.strip_suffix(" (deleted)").unwrap_or(tag);
    let tag = tag.rsplit_once('@').map_or(tag, |(t, _)| t);
    // SAFETY: `stat` is plain old data; fstat fills it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some((tag.to_string(), usize::try_from(st.st_size).ok()?))
}

/// The host tag ([`crate::bootstrap::host::host_tag`]) of the process that made a memfd of
/// [`Memfd::create`]; `None` when the descriptor is not such a memfd.
pub(super) fn memfd_host(fd: RawFd) -> Option<String> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let link = link.to_string_lossy();
    let tag = link.strip_prefix("/memfd:mcast-sim:")?;
    let tag = tag.strip_suffix(" (deleted)").unwrap_or(tag);
    tag.rsplit_once('@').map(|(_, h)| h.to_string())
}

/// `(st_dev, st_ino)` of an open descriptor.
pub(super) fn fd_identity(fd: RawFd) -> io::Result<(u64, u64)> {
    // SAFETY: `stat` is plain old data; fstat fills it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer; a bad `fd` makes fstat fail with EBADF.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)]
    Ok((st.st_dev as u64, st.st_ino as u64))
}

/// Reserves `size` bytes of address space aligned to `align` (a power of two), inaccessible.
pub(super) fn reserve(size: usize, align: usize) -> io::Result<u64> {
    let total = size.checked_add(align).ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a fresh anonymous PROT_NONE mapping at an address the kernel chooses.
    let base = unsafe {
        libc::mmap(
            ptr::null_mut(),
            total,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let base = base as usize;
    let start = (base + align - 1) & !(align - 1);
    let head = start - base;
    let tail = total - head - size;
    // SAFETY: both ranges lie inside the mapping just made and outside the kept range.
    unsafe {
        if head > 0 {
            libc::munmap(base as *mut libc::c_void, head);
        }
        if tail > 0 {
            libc::munmap((start + size) as *mut libc::c_void, tail);
        }
    }
    Ok(start as u64)
}

/// Gives back a range made by [`reserve`].
pub(super) fn unreserve(ptr: u64, size: usize) {
    // SAFETY: the caller passes exactly a reservation it owns and no longer uses.
    unsafe { libc::munmap(ptr as *mut libc::c_void, size) };
}

/// Maps `size` bytes of `fd` from `offset` read-write at `ptr`, replacing what is there.
pub(super) fn map_fixed(ptr: u64, size: usize, fd: RawFd, offset: usize) -> io::Result<()> {
    let off = libc::off_t::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: the caller guarantees `[ptr, ptr + size)` lies in a reservation it owns and that
    // nothing else is mapped there, so MAP_FIXED replaces only our own PROT_NONE pages.
    let got = unsafe {
        libc::mmap(
            ptr as *mut libc::c_void,
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            off,
        )
    };
    if got == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Turns `[ptr, ptr + size)` back into an inaccessible reservation.
pub(super) fn protect_none(ptr: u64, size: usize) -> io::Result<()> {
    // SAFETY: the caller guarantees the range lies in a reservation it owns; MAP_FIXED replaces
    // only our own pages.
    let got = unsafe {
        libc::mmap(
            ptr as *mut libc::c_void,
            size,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if got == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
