//! Devices: the driver version, the devices this process sees (see `identity.rs`), their
//! properties and NVLink fabric, peer access and binding a thread to a device.

use super::{fabric, identity, SimDriver, INVALID_VALUE};
use crate::driver::{DResult, Device, DeviceOps, DeviceProps, FabricInfo, FabricState};

impl DeviceOps for SimDriver {
    fn driver_version(&self) -> DResult<i32> {
        self.call("cuDriverGetVersion", || Ok(13000))
    }

    fn device_count(&self) -> DResult<i32> {
        self.call("cuDeviceGetCount", || i32::try_from(self.gpus.len()).map_err(|_| INVALID_VALUE))
    }

    fn device_props(&self, dev: Device) -> DResult<DeviceProps> {
        self.call("cuDeviceGetAttribute", || {
            self.check_dev(dev)?;
            Ok(DeviceProps {
                name: "mcast simulated GPU".to_string(),
                cc_major: 9,
                cc_minor: 0,
                total_memory: self.config.device_memory,
                sm_count: 132,
                multicast_supported: self.config.multicast_supported,
                vmm_supported: true,
                posix_fd_supported: true,
                fabric_supported: self.config.fabric_supported,
                uuid: self.gpus[dev as usize].1,
                pci_bus_id: identity::pci_bus_id(self.gpus[dev as usize].0),
            })
        })
    }

    fn fabric_info(&self, dev: Device) -> DResult<FabricInfo> {
        self.call("nvmlDeviceGetGpuFabricInfoV", || {
            self.check_dev(dev)?;
            if !self.config.fabric_supported {
                return Ok(FabricInfo::default());
            }
            Ok(FabricInfo {
                cluster_uuid: fabric::cluster_uuid(&self.config.fabric.0),
                clique_id: self.config.fabric.1,
                state: FabricState::Completed,
            })
        })
    }

    fn can_access_peer(&self, dev: Device, peer: Device) -> DResult<bool> {
        self.call("cuDeviceCanAccessPeer", || {
            self.check_dev(dev)?;
            self.check_dev(peer)?;
            Ok(true)
        })
    }

    fn bind_thread(&self, dev: Device) -> DResult<()> {
        self.call("cuCtxSetCurrent", || self.check_dev(dev))
    }
}
