//! The simulated driver (placeholder until the simulator lands).

/// Configuration of the simulated system.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Number of simulated GPUs.
    pub devices: u32,
    /// Bytes of memory per simulated GPU.
    pub device_memory: u64,
    /// Multicast objects the simulated fabric holds at once.
    pub multicast_slots: u32,
    /// Value of `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`.
    pub multicast_supported: bool,
}

/// A simulated CUDA driver.
pub struct SimDriver {
    config: SimConfig,
}

impl SimDriver {
    /// A simulated system described by `config`.
    pub fn new(config: SimConfig) -> Self {
        SimDriver { config }
    }

    /// The configuration this simulator was made with.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }
}
