//! How memory and multicast objects travel between the processes of a team: exported as a
//! file descriptor (sent over the rendezvous socket) or a fabric handle (64 bytes of the
//! exchange), imported on the other side.

use std::os::fd::{AsRawFd, OwnedFd};

use crate::driver::{DResult, Driver, HandleTypes, MemHandle, FABRIC_HANDLE_BYTES};
use crate::runtime::comm::{Comm, Part};
use crate::runtime::error::Result;

/// An exported memory or multicast object, as it travels over the rendezvous.
pub(super) enum Exported {
    Fd(OwnedFd),
    Fabric([u8; FABRIC_HANDLE_BYTES]),
}

impl Exported {
    /// Exports `handle` as `ht` (POSIX_FD or FABRIC).
    pub(super) fn of(driver: &dyn Driver, handle: MemHandle, ht: HandleTypes) -> DResult<Exported> {
        if ht == HandleTypes::FABRIC {
            driver.mem_export_fabric(handle).map(Exported::Fabric)
        } else {
            driver.mem_export_fd(handle).map(Exported::Fd)
        }
    }

    /// Imports what `part` carries as `ht`; `None` when nothing arrived.
    pub(super) fn import(driver: &dyn Driver, part: &Part, ht: HandleTypes) -> Option<DResult<MemHandle>> {
        if ht == HandleTypes::FABRIC {
            let bytes: &[u8; FABRIC_HANDLE_BYTES] = part.bytes.as_slice().try_into().ok()?;
            Some(driver.mem_import_fabric(bytes))
        } else {
            part.fds.first().map(|fd| driver.mem_import_fd(fd.as_raw_fd()))
        }
    }
}

/// How a handle type is named in messages.
pub(super) fn handle_type_name(ht: HandleTypes) -> &'static str {
    if ht == HandleTypes::FABRIC {
        "a fabric handle"
    } else {
        "a file descriptor"
    }
}

/// Exchanges what this rank exported (nothing for `Ok(None)`; a failed export travels as this
/// rank's status) with every rank; the export is closed once the exchange is over.
pub(super) fn exchange(comm: &Comm, label: &str, exported: Result<Option<Exported>>) -> Result<Vec<Part>> {
    let (status, bytes, fds) = match &exported {
        Ok(Some(Exported::Fd(fd))) => (Ok(()), &[][..], vec![fd.as_raw_fd()]),
        Ok(Some(Exported::Fabric(bytes))) => (Ok(()), &bytes[..], vec![]),
        Ok(None) => (Ok(()), &[][..], vec![]),
        Err(e) => (Err(e.clone()), &[][..], vec![]),
    };
    comm.exchange(label, status, bytes, &fds)
}
