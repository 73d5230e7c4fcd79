//! The sync region of each rank (signal words, local state, team state), the push scratch, the
//! staging area and the LL landing area that follow it, and the launch geometry the kernels are built for; each value
//! mirrors a `#define` of `kernels/abi.cuh` (a test parses the source and compares).

use crate::kernels::SYNC_BYTES;

/// Threads per block of every collective kernel (`MCAST_THREADS`).
pub const THREADS: u32 = 512;
/// 16-byte accesses in flight per thread (`MCAST_UNROLL`).
pub const UNROLL: u32 = 4;
/// Barrier slots in the sync region: the most blocks any kernel may use (`MCAST_MAX_BLOCKS`).
pub const MAX_BLOCKS: u32 = 64;

/// Sync region layout (per rank, [`SYNC_BYTES`] bytes, zeroed at team creation).
///
/// `[SIGNAL_OFFSET, LOCAL_OFFSET)`: signal words written by every rank of the team (by peers
/// through peer mappings or `multimem.red`, and by the rank itself): one `u32` arrival counter per
/// block slot `b` at `SIGNAL_OFFSET + b * SIGNAL_STRIDE`.
pub const SIGNAL_OFFSET: usize = 0;
/// Stride of the per-slot signal counters (one 128-byte line each).
pub const SIGNAL_STRIDE: usize = 64;
/// Start of the local state: written only by this rank's own kernels (never by peers).
pub const LOCAL_OFFSET: usize = 4096;
/// `u32` device error word: [`ERR_NONE`] or the first error code (set atomically, sticky). The
/// runtime reads it after `cuStreamSynchronize`; while it is set every collective kernel of this
/// rank returns at once without touching data (the barrier counters are no longer consistent:
/// the runtime must quiesce all ranks and zero their sync regions, or drop the team).
pub const ERROR_WORD_OFFSET: usize = 4096;
/// `u32` detail of the first error: `(block slot + 1) | (barrier index in the kernel << 8)`.
pub const ERROR_INFO_OFFSET: usize = 4100;
/// [`MISSING_WORDS`] `u32` bit words: bit `q % 32` of word `q / 32` is set when rank `q` did not
/// arrive in a wait of this rank that timed out (the kernel that timed out sets them before it
/// tells the other ranks through their state words).
pub const MISSING_OFFSET: usize = 4104;
/// Words of the missing-rank bits: one bit per rank of the largest team.
pub const MISSING_WORDS: usize = 3;
/// `u64` address of the team's doorbell in this process: a word of mapped host memory
/// (`runtime::doorbell`) that a kernel rings (stores 1 to, after a system-scope fence) once it
/// has recorded an error, so the host learns of device errors with a plain load and no driver
/// call (`MCAST_DOORBELL_OFFSET`). Written by the host at team creation; 0 rings nothing.
pub const DOORBELL_OFFSET: usize = 4120;
/// `u32` per block slot `b` at `EPOCH_OFFSET + 4 * b`: barriers this rank has completed on slot
/// `b` (the target of slot `b`'s counter is that number times `nranks`).
pub const EPOCH_OFFSET: usize = 4352;
/// Local state: the record of a call whose signatures disagreed ([`ERR_MISMATCH`]): the peer's
/// signature (two `u64`), then this rank's; the error detail word holds the peer's rank
/// (`MCAST_MISMATCH_OFFSET`).
pub const MISMATCH_OFFSET: usize = 5120;
/// `u32` team state word, read by every device wait: anything but [`STATE_OK`] ends it within
/// microseconds. [`state_timeout`]`(t)` once rank `t` timed out (its kernel writes it in every
/// rank's sync region, its own first; the first failure stays), [`STATE_ABORTED`] once the team
/// was aborted (the host writes it in every rank's region, through the peer mappings for ranks
/// of other processes). Outside the local state: peers write it.
pub const STATE_OFFSET: usize = 8192;
/// 16 bytes per writer `w` at `SIG_OFFSET + 16 * w`, teams larger than [`BAR_SIG_MAX_RANKS`]:
/// the call signature ([`signature`](super::signature)) rank `w` stored before its entry
/// barrier, read after it.
/// Written by peers; a writer stores the next only after every rank passed the exit barrier
/// of the kernel that read it (`MCAST_SIG_OFFSET`).
pub const SIG_OFFSET: usize = 8448;
/// The LL kernels' signature lines: per LL block slot `b`, parity `s` and writer row `w` (the
/// writers other than the rank, as in the landing), two LL lines (32 bytes) at
/// `LL_SIG_OFFSET + 32 * ((b * 2 + s) * (LL_MAX_RANKS - 1) + w)`, reused like the landing rows
/// (`MCAST_LL_SIG_OFFSET`).
pub const LL_SIG_OFFSET: usize = 9728;
/// The push kernels' signature lines: per block slot `b`, parity `s` (of the call's first
/// sequence number) and writer row `w` (the writers other than the rank), two flagged lines (32
/// bytes) at `PUSH_SIG_OFFSET + 32 * ((b * 2 + s) * (PUSH_MAX_RANKS - 1) + w)`, flagged with that
/// sequence number and stored after the call's first publish (`MCAST_PUSH_SIG_OFFSET`).
pub const PUSH_SIG_OFFSET: usize = 24576;
/// The entry barriers' signature lines, teams of at most [`BAR_SIG_MAX_RANKS`]: per block slot
/// `b` and writer row `w` (the writers other than the rank), two flagged lines (32 bytes) at
/// `BAR_SIG_OFFSET + 32 * (b * (BAR_SIG_MAX_RANKS - 1) + w)`, flagged with slot `b`'s barrier
/// epoch (`MCAST_BAR_SIG_OFFSET`; larger teams use [`SIG_OFFSET`]).
pub const BAR_SIG_OFFSET: usize = 36864;
/// Most ranks whose entry barriers carry the signature in flagged lines (`MCAST_BAR_SIG_MAX_RANKS`).
pub const BAR_SIG_MAX_RANKS: u32 = 8;
/// End of the used part of the sync region; the rest is reserved.
pub const SYNC_USED_BYTES: usize = BAR_SIG_OFFSET + 32 * MAX_BLOCKS as usize * (BAR_SIG_MAX_RANKS as usize - 1);
/// Start of the push kernels' scratch, from a rank's sync region (`MCAST_SCRATCH_OFFSET`): the
/// scratch follows the sync region in the team's first segment.
pub const SCRATCH_OFFSET: usize = 65536;
/// Bytes of one scratch row of a team of two: the most one block of a push kernel moves per
/// step (`MCAST_PUSH_CHUNK`). Large, because each block waits once per step for its stores to
/// reach the peer: measured on 2 x H200 (pointer form, bf16, CUDA graph), 16/32/64 KiB rows took
/// 366/278/239 us at 64 MiB (before the loads were batched; after, 32/64 KiB: 219/214 us).
pub const PUSH_CHUNK: u64 = 65536;
/// Bytes of one scratch row of a team of three or four (`MCAST_PUSH_CHUNK_WIDE`): its scratch
/// holds a row per peer.
pub const PUSH_CHUNK_WIDE: u64 = 32768;

/// Bytes of one push scratch row for a team of `nranks`.
pub fn push_row_capacity(nranks: u32) -> u64 {
    if nranks <= 2 {
        PUSH_CHUNK
    } else {
        PUSH_CHUNK_WIDE
    }
}
/// Most ranks the push kernels serve (`MCAST_PUSH_MAX_RANKS`): their scratch grows with the team.
pub const PUSH_MAX_RANKS: u32 = 4;
/// Scratch slots per block slot (`MCAST_PUSH_SLOTS`): a rank stores step y + 1 while a peer may
/// still reduce step y - 1, so three slots keep every row untouched until its reader is done.
pub const PUSH_SLOTS: usize = 3;
/// Offset, within a block slot's signal words, of the push flags: the `u32` at
/// `SIGNAL_OFFSET + b * SIGNAL_STRIDE + PUSH_FLAG_OFFSET + 4 * writer` is the last push step
/// `writer` published to this rank (`MCAST_PUSH_FLAG_OFFSET`).
pub const PUSH_FLAG_OFFSET: usize = 4;
/// `u32` per block slot `b` at `PUSH_SEQ_OFFSET + 4 * b` (local state): push steps this rank has
/// completed on slot `b` (`MCAST_PUSH_SEQ_OFFSET`).
pub const PUSH_SEQ_OFFSET: usize = 4608;

/// Bytes of a team's scratch per rank: [`PUSH_SLOTS`] slots of one row per peer for every block
/// slot, for teams the push kernels serve; none otherwise.
pub fn scratch_bytes(nranks: u32) -> usize {
    if (2..=PUSH_MAX_RANKS).contains(&nranks) {
        PUSH_SLOTS * (nranks as usize - 1) * push_row_capacity(nranks) as usize * MAX_BLOCKS as usize
    } else {
        0
    }
}

/// Bytes per rank of a team's staging area: where the pointer form (`mcast_team_*`) copies the
/// caller's plain device memory before running the in-place kernels on it, in chunks of at most
/// this size. With LL off and the default device-API slots, 1 MiB keeps the first segment within
/// the same multiple of a 2 MiB granularity for every team size; with LL, teams of 2, 4, 6 and 8
/// ranks take 2 MiB more for it.
pub const STAGE_BYTES: usize = 1 << 20;

/// Offset of the staging area from a rank's sync region: after the push scratch.
pub fn stage_offset(nranks: u32) -> usize {
    SCRATCH_OFFSET + scratch_bytes(nranks)
}

/// Most ranks the LL kernels serve (`MCAST_LL_MAX_RANKS`): their landing area grows with the team.
pub const LL_MAX_RANKS: u32 = 8;
/// Most blocks of an LL kernel (`MCAST_LL_MAX_BLOCKS`): LL block slots in the landing area.
pub const LL_MAX_BLOCKS: u32 = 32;
/// LL lines one thread sends per call (`MCAST_LL_LINES`).
pub const LL_LINES: u32 = 2;
/// Payload bytes one block of an LL kernel sends to each peer (`MCAST_LL_PART`): 8 per line.
pub const LL_PART: u64 = THREADS as u64 * LL_LINES as u64 * 8;
/// Bytes of one LL row (`MCAST_LL_ROW`): 16-byte lines carrying 8 payload bytes each.
pub const LL_ROW: u64 = 2 * LL_PART;
/// `u32` per block slot `b` at `LL_SEQ_OFFSET + 4 * b` (local state): the flag of the last LL
/// call this rank made on slot `b` (`MCAST_LL_SEQ_OFFSET`).
pub const LL_SEQ_OFFSET: usize = 4864;

/// Offset of the LL landing area from a rank's sync region: after the staging area.
pub fn ll_offset(nranks: u32) -> usize {
    stage_offset(nranks) + STAGE_BYTES
}

/// Bytes of a team's LL landing area per rank: per LL block slot, two parities of one row per
/// writer other than the rank, for teams the LL kernels serve; none otherwise.
pub fn ll_bytes(nranks: u32) -> usize {
    if (2..=LL_MAX_RANKS).contains(&nranks) {
        LL_MAX_BLOCKS as usize * 2 * (nranks as usize - 1) * LL_ROW as usize
    } else {
        0
    }
}

/// Bytes a team reserves per rank at the start of its first segment: the sync region, the push
/// scratch, the staging area, for a team that runs the LL kernels (`ll`) their landing area, then
/// `device_slots` device-API slots.
pub fn team_reserved_bytes(nranks: u32, ll: bool, device_slots: u32) -> usize {
    device_offset(nranks, ll) + device_bytes(nranks, device_slots)
}

/// Offset of a team's device-API slots (`mcast/device.h`) from a rank's sync region: after
/// everything the library's own kernels use, so the two never share a counter.
pub fn device_offset(nranks: u32, ll: bool) -> usize {
    ll_offset(nranks) + if ll { ll_bytes(nranks) } else { 0 }
}

/// Bytes per rank of `slots` device-API slots for a team of `nranks` (the layout comment of
/// `mcast/device.h`): per slot a barrier arrival counter and its epoch, and per slot and rank a
/// signal counter and its consumed count, all `u32`.
pub fn device_bytes(nranks: u32, slots: u32) -> usize {
    8 * slots as usize + 8 * slots as usize * nranks as usize
}

/// Error word value: no error.
pub const ERR_NONE: u32 = 0;
/// Error word value: a barrier wait exceeded `timeout_ns` (maps to `MCAST_ERROR_TIMEOUT`).
pub const ERR_TIMEOUT: u32 = 1;
/// Error word value: a barrier wait ended because the team was aborted (maps to
/// `MCAST_ERROR_ABORTED`).
pub const ERR_ABORTED: u32 = 2;
/// Error word value: a device-API call with `MCAST_DEV_DEBUG` was given a bad argument (maps to
/// `MCAST_ERROR_INVALID_ARGUMENT`; the detail word says which, see [`DEVICE_INFO`]).
pub const ERR_INVALID: u32 = 3;
/// Error word value: the ranks' call signatures disagreed at a kernel's entry (maps to
/// `MCAST_ERROR_INVALID_ARGUMENT`; the detail word is the peer that disagreed, the record at
/// [`MISMATCH_OFFSET`] both signatures). No data was written by the kernel that found it.
pub const ERR_MISMATCH: u32 = 4;
/// Detail word bit of an error recorded by the device API (`MCAST_DEV_INFO_DEVICE_API`): the
/// rest is `what << 24 | value` (`MCAST_DEV_INFO_*` of `mcast/device.h`).
pub const DEVICE_INFO: u32 = 0x8000_0000;
/// State word value: the team is usable.
pub const STATE_OK: u32 = 0;
/// State word value (low byte): a rank timed out; its number is in the bits above
/// ([`state_timeout`], [`timed_out_rank`]). Every wait ends at once, recording [`ERR_TIMEOUT`].
pub const STATE_TIMEOUT: u32 = 1;
/// State word value: the team was aborted; every wait ends at once, recording [`ERR_ABORTED`].
pub const STATE_ABORTED: u32 = 2;

/// State word value: this rank found a mismatch ([`ERR_MISMATCH`]); written in its own state
/// word only (every rank compares every peer's signature), it ends this rank's other waits
/// (blocks of a larger grid than a peer's; the device API's waits, which then return
/// `MCAST_DEV_ERROR_INVALID_ARGUMENT`).
pub const STATE_MISMATCH: u32 = 3;

/// The state word a rank that timed out writes: [`STATE_TIMEOUT`] and its rank.
pub const fn state_timeout(rank: u32) -> u32 {
    STATE_TIMEOUT | rank << 8
}

/// The rank that timed out, if `state` says one did.
pub fn timed_out_rank(state: u32) -> Option<usize> {
    (state & 0xff == STATE_TIMEOUT).then_some((state >> 8) as usize)
}

/// The error a wait records when it finds `state` (not [`STATE_OK`]): a rank's timeout is a
/// timeout here too, a mismatch a mismatch, anything else an abort (`state_error` in
/// `kernels/sync.cuh`).
pub fn state_error(state: u32) -> u32 {
    if timed_out_rank(state).is_some() {
        ERR_TIMEOUT
    } else if state == STATE_MISMATCH {
        ERR_MISMATCH
    } else {
        ERR_ABORTED
    }
}

const _: () = assert!(ERROR_INFO_OFFSET + 4 <= MISSING_OFFSET);
const _: () = assert!(MISSING_OFFSET + 4 * MISSING_WORDS <= DOORBELL_OFFSET);
const _: () = assert!(DOORBELL_OFFSET.is_multiple_of(8) && DOORBELL_OFFSET + 8 <= EPOCH_OFFSET);
const _: () = assert!(32 * MISSING_WORDS >= crate::kernels::MAX_RANKS);
const _: () = assert!(EPOCH_OFFSET + 4 * MAX_BLOCKS as usize <= PUSH_SEQ_OFFSET);
const _: () = assert!(PUSH_SEQ_OFFSET + 4 * MAX_BLOCKS as usize <= LL_SEQ_OFFSET);
const _: () = assert!(LL_SEQ_OFFSET + 4 * LL_MAX_BLOCKS as usize <= STATE_OFFSET);
const _: () = assert!(LL_MAX_BLOCKS <= MAX_BLOCKS);
const _: () = assert!(PUSH_FLAG_OFFSET >= 4 && PUSH_FLAG_OFFSET + 4 * PUSH_MAX_RANKS as usize <= SIGNAL_STRIDE);
const _: () = assert!(LL_SEQ_OFFSET + 4 * LL_MAX_BLOCKS as usize <= MISMATCH_OFFSET);
const _: () = assert!(MISMATCH_OFFSET + 32 <= STATE_OFFSET);
const _: () = assert!(STATE_OFFSET + 64 <= SIG_OFFSET);
const _: () = assert!(SIG_OFFSET + 16 * crate::kernels::MAX_RANKS <= LL_SIG_OFFSET);
const _: () = assert!(LL_SIG_OFFSET + 32 * 2 * LL_MAX_BLOCKS as usize * (LL_MAX_RANKS as usize - 1) <= PUSH_SIG_OFFSET);
const _: () = assert!(PUSH_SIG_OFFSET + 32 * 2 * MAX_BLOCKS as usize * (PUSH_MAX_RANKS as usize - 1) <= BAR_SIG_OFFSET);
const _: () = assert!(SIGNAL_OFFSET + SIGNAL_STRIDE * MAX_BLOCKS as usize <= LOCAL_OFFSET);
const _: () = assert!(SYNC_USED_BYTES <= SYNC_BYTES);
const _: () = assert!(SCRATCH_OFFSET == SYNC_BYTES);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::source::SOURCE;
    use crate::kernels::MAX_RANKS;

    fn define(name: &str) -> u64 {
        let prefix = format!("#define {name} ");
        let line = SOURCE.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("{name} not in source"));
        line[prefix.len()..].trim().parse().unwrap_or_else(|_| panic!("{name}: {line}"))
    }

    #[test]
    fn source_defines_match_rust_consts() {
        assert_eq!(define("MCAST_MAX_RANKS"), MAX_RANKS as u64);
        assert_eq!(define("MCAST_MAX_BLOCKS"), MAX_BLOCKS as u64);
        assert_eq!(define("MCAST_THREADS"), THREADS as u64);
        assert_eq!(define("MCAST_UNROLL"), UNROLL as u64);
        assert_eq!(define("MCAST_SIGNAL_OFFSET"), SIGNAL_OFFSET as u64);
        assert_eq!(define("MCAST_SIGNAL_STRIDE"), SIGNAL_STRIDE as u64);
        assert_eq!(define("MCAST_SCRATCH_OFFSET"), SCRATCH_OFFSET as u64);
        assert_eq!(define("MCAST_PUSH_CHUNK"), PUSH_CHUNK);
        assert_eq!(define("MCAST_PUSH_CHUNK_WIDE"), PUSH_CHUNK_WIDE);
        assert_eq!(define("MCAST_PUSH_MAX_RANKS"), PUSH_MAX_RANKS as u64);
        assert_eq!(define("MCAST_PUSH_SLOTS"), PUSH_SLOTS as u64);
        assert_eq!(define("MCAST_PUSH_FLAG_OFFSET"), PUSH_FLAG_OFFSET as u64);
        assert_eq!(define("MCAST_PUSH_SEQ_OFFSET"), PUSH_SEQ_OFFSET as u64);
        assert_eq!(define("MCAST_LOCAL_OFFSET"), LOCAL_OFFSET as u64);
        assert_eq!(define("MCAST_LL_MAX_RANKS"), LL_MAX_RANKS as u64);
        assert_eq!(define("MCAST_LL_MAX_BLOCKS"), LL_MAX_BLOCKS as u64);
        assert_eq!(define("MCAST_LL_LINES"), LL_LINES as u64);
        assert_eq!(define("MCAST_LL_PART"), LL_PART);
        assert_eq!(define("MCAST_LL_ROW"), LL_ROW);
        assert_eq!(define("MCAST_LL_SEQ_OFFSET"), LL_SEQ_OFFSET as u64);
        assert_eq!(define("MCAST_STAGE_BYTES"), STAGE_BYTES as u64);
        assert_eq!(define("MCAST_ERROR_OFFSET"), ERROR_WORD_OFFSET as u64);
        assert_eq!(define("MCAST_ERROR_INFO_OFFSET"), ERROR_INFO_OFFSET as u64);
        assert_eq!(define("MCAST_EPOCH_OFFSET"), EPOCH_OFFSET as u64);
        assert_eq!(define("MCAST_ERR_NONE"), ERR_NONE as u64);
        assert_eq!(define("MCAST_ERR_TIMEOUT"), ERR_TIMEOUT as u64);
        assert_eq!(define("MCAST_ERR_ABORTED"), ERR_ABORTED as u64);
        assert_eq!(define("MCAST_STATE_OFFSET"), STATE_OFFSET as u64);
        assert_eq!(define("MCAST_STATE_OK"), STATE_OK as u64);
        assert_eq!(define("MCAST_STATE_TIMEOUT"), STATE_TIMEOUT as u64);
        assert_eq!(define("MCAST_STATE_ABORTED"), STATE_ABORTED as u64);
        assert_eq!(define("MCAST_MISSING_OFFSET"), MISSING_OFFSET as u64);
        assert_eq!(define("MCAST_MISSING_WORDS"), MISSING_WORDS as u64);
        assert_eq!(define("MCAST_DOORBELL_OFFSET"), DOORBELL_OFFSET as u64);
        assert_eq!(define("MCAST_MISMATCH_OFFSET"), MISMATCH_OFFSET as u64);
        assert_eq!(define("MCAST_ERR_MISMATCH"), ERR_MISMATCH as u64);
        assert_eq!(define("MCAST_STATE_MISMATCH"), STATE_MISMATCH as u64);
        assert_eq!(define("MCAST_SIG_OFFSET"), SIG_OFFSET as u64);
        assert_eq!(define("MCAST_LL_SIG_OFFSET"), LL_SIG_OFFSET as u64);
        assert_eq!(define("MCAST_PUSH_SIG_OFFSET"), PUSH_SIG_OFFSET as u64);
        assert_eq!(define("MCAST_BAR_SIG_OFFSET"), BAR_SIG_OFFSET as u64);
        assert_eq!(define("MCAST_BAR_SIG_MAX_RANKS"), BAR_SIG_MAX_RANKS as u64);
        assert!(SOURCE.contains("sizeof(McastArgs) == 88 + 24 * MCAST_MAX_RANKS"));
    }
}
