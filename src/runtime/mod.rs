//! The runtime: contexts, teams, symmetric buffers, collectives, handles and leak tracking.
//! It knows nothing of C; `capi` converts its errors to status codes.

pub mod buffer;
pub mod ce;
pub mod collective;
pub mod comm;
pub mod config;
pub mod context;
pub mod device_api;
pub mod doorbell;
pub mod env;
pub mod error;
pub mod handles;
pub mod hier;
pub mod launch;
pub mod mem_alloc;
pub mod memory;
pub mod net;
pub mod policy;
pub mod registry;
pub mod retry;
pub mod segment;
pub mod team;
pub mod teams;

pub use error::{Error, ErrorKind, Result};
