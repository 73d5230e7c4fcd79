//! Devices: the driver version, the devices, their properties, their place in an NVLink fabric,
//! peer access, and binding a thread to a device.

use super::{DResult, Device, DeviceProps, FabricInfo};

/// The devices the driver sees and what they can do. Part of [`super::Driver`].
pub trait DeviceOps {
    /// `cuDriverGetVersion`.
    fn driver_version(&self) -> DResult<i32>;

    /// `cuDeviceGetCount`.
    fn device_count(&self) -> DResult<i32>;

    /// Name, compute capability, memory and the capability attributes of `dev`.
    fn device_props(&self, dev: Device) -> DResult<DeviceProps>;

    /// The GPU's place in a multi-node NVLink fabric: NVML's GPU fabric info
    /// (`nvmlDeviceGetGpuFabricInfoV`), loaded at run time like the driver; no NVML, or a GPU
    /// without fabric support, is [`FabricState::None`](super::FabricState::None).
    fn fabric_info(&self, dev: Device) -> DResult<FabricInfo>;

    /// `cuDeviceCanAccessPeer`; a device can always access itself.
    fn can_access_peer(&self, dev: Device, peer: Device) -> DResult<bool>;

    /// Makes `dev`'s primary context current on the calling thread (`cuCtxSetCurrent`, what
    /// `cudaSetDevice` does), for a thread that drives one device: later calls on `dev` from it
    /// need not switch contexts.
    fn bind_thread(&self, dev: Device) -> DResult<()>;
}
