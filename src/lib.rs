//! mcast: a runtime for CUDA multicast memory (NVLink SHARP).
//!
//! Layers, top to bottom (each calls only the one below):
//! - [`capi`]: the C boundary (`include/mcast.h` is generated from it);
//! - [`runtime`]: contexts, teams, symmetric buffers, collectives, the handle registry;
//! - [`kernels`]: NVRTC compilation and launch of the device kernels, and their host execution
//!   on the simulator;
//! - [`driver`]: the CUDA driver subset, real ([`driver::cuda`]) or simulated ([`driver::sim`]).
//!
//! Beside them, [`bootstrap`] (how processes meet), [`libpath`] (the rule for libraries named
//! by environment variables), [`dynlib`] (how such a library is loaded) and [`nvtx`] (the
//! calls as named ranges for Nsight Systems).

pub mod bootstrap;
pub mod capi;
pub mod driver;
pub mod dynlib;
pub mod kernels;
pub mod libpath;
pub mod logging;
pub mod nvtx;
pub mod runtime;
pub mod types;
