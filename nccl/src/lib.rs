//! `libmcast_nccl`: the NCCL API over mcast.
//!
//! A program written for NCCL links this library instead of `libnccl` (or puts it in front with
//! `LD_PRELOAD`) and runs its collectives on mcast teams, unchanged. The header is
//! `include/mcast/nccl.h`, written from NCCL's documented API.
//!
//! - [`api`]: the exported `nccl*` functions: argument checks, the panic boundary, the status.
//! - [`comm`]: a communicator = one rank of an mcast team (`mcast_team_init_rank`),
//!   registrations, counters.
//! - [`process`]: the process-wide mcast context, and the device a new rank uses.
//! - [`group`]: `ncclGroupStart`/`End`: calls of a group are queued on the calling thread and
//!   run at the end, every communicator's calls on a thread of their own when one of them waits
//!   for its peers (creation, split, registration), so one thread can drive many ranks.
//! - [`domains`]: a communicator across NVLink domains: whole on the fallback NCCL, refused, or
//!   with `MCAST_NCCL_HIER=on` served by mcast inside each domain and the fallback NCCL between.
//! - [`fallback`]: what mcast does not serve goes to the NCCL named by `MCAST_NCCL_FALLBACK`
//!   through a communicator created beside the mcast team; the fallback communicators this
//!   library made, and the calls NCCL makes on them that arrive here.
//! - [`types`]: NCCL's enums and their mapping onto mcast's; a failed call ([`types::Failure`]).
//!
//! It calls mcast only through its C API (`mcast::capi`), the contract every C program uses.
#![allow(non_camel_case_types)]

pub mod api;
pub mod comm;
pub mod domains;
pub mod fallback;
pub mod group;
pub mod process;
pub mod types;
