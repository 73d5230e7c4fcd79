/* A stand-in for a real NCCL as MCAST_NCCL_FALLBACK, for the simulator tests of the fallback.
 *
 * What matters is how it is linked, which is how NCCL is: every API function is defined weak
 * with default visibility under its name, with a strong alias under its profiling name
 * (pnccl...), and NCCL calls its own API functions by name from inside itself (ncclCommDestroy,
 * ncclCommFinalize and ncclCommAbort ask ncclCommGetAsyncError whether the communicator is
 * ready). Those calls go through the dynamic linker, so when libmcast_nccl comes first in the
 * process (LD_PRELOAD, or linked before libnccl as here) they land in libmcast_nccl with this
 * library's communicators. libmcast_nccl must send them back here.
 *
 * It does no communication: ncclGetUniqueId makes a marked id; ncclCommInitRank checks the mark
 * (so a rank whose id was not carried over from rank 0 fails); collectives count themselves.
 * fakeNcclStats() tells the test what happened. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nccl.h>

/* NCCL's linkage: weak `name`, strong `pname` aliasing it, both exported. */
#define FAKE_API(ret, name, ...)                                                                \
  __attribute__((visibility("default"))) ret p##name(__VA_ARGS__) __attribute__((alias(#name))); \
  __attribute__((visibility("default"), weak)) ret name(__VA_ARGS__)

#define FAKE_MAGIC 0x46414b454e43434cull /* "FAKENCCL" */
#define FAKE_DEAD 0xdeadull

struct fake_comm {
  uint64_t magic;
  int rank, nranks;
  ncclResult_t async;
  int finalized;
};

static int live_comms, made_comms, async_queries, collectives, group_depth;
static char last_error[256];

static ncclResult_t fail(ncclResult_t r, const char *what) {
  strncpy(last_error, what, sizeof last_error - 1);
  return r;
}

static int live(ncclComm_t c) { return c != NULL && ((struct fake_comm *)c)->magic == FAKE_MAGIC; }

/* What the test reads back: communicators alive and made, async-error queries that reached this
 * library, collectives run. */
__attribute__((visibility("default"))) void fakeNcclStats(int *live_out, int *made_out, int *queries_out,
                                                          int *collectives_out) {
  *live_out = live_comms;
  *made_out = made_comms;
  *queries_out = async_queries;
  *collectives_out = collectives;
}

FAKE_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId *id) {
  if (id == NULL) return fail(ncclInvalidArgument, "fake ncclGetUniqueId: id is NULL");
  memset(id, 0, sizeof *id);
  uint64_t mark = FAKE_MAGIC;
  memcpy(id->internal, &mark, sizeof mark);
  int pid = (int)getpid();
  memcpy(id->internal + sizeof mark, &pid, sizeof pid);
  return ncclSuccess;
}

FAKE_API(ncclResult_t, ncclCommInitRank, ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  uint64_t mark;
  memcpy(&mark, id.internal, sizeof mark);
  if (comm == NULL || nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "fake ncclCommInitRank: bad arguments");
  if (mark != FAKE_MAGIC) return fail(ncclInvalidArgument, "fake ncclCommInitRank: the id is not rank 0's");
  struct fake_comm *c = calloc(1, sizeof *c);
  if (c == NULL) return fail(ncclSystemError, "fake ncclCommInitRank: out of memory");
  c->magic = FAKE_MAGIC;
  c->rank = rank;
  c->nranks = nranks;
  c->async = ncclSuccess;
  live_comms++;
  made_comms++;
  *comm = (ncclComm_t)c;
  return ncclSuccess;
}

FAKE_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t *asyncError) {
  if (!live(comm) || asyncError == NULL)
    return fail(ncclInvalidArgument, "fake ncclCommGetAsyncError: not a live communicator of the fake NCCL");
  async_queries++;
  *asyncError = ((struct fake_comm *)comm)->async;
  return ncclSuccess;
}

/* NCCL's "the communicator must be ready": asks ncclCommGetAsyncError, by name. */
static ncclResult_t ensure_ready(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(comm, &state);
  if (r != ncclSuccess) return r;
  if (state == ncclInProgress) return fail(ncclInvalidArgument, "fake: communicator used before it was ready");
  return ncclSuccess;
}

static void release(struct fake_comm *c) {
  c->magic = FAKE_DEAD;
  live_comms--;
  free(c);
}

FAKE_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm) {
  if (!live(comm)) return fail(ncclInvalidArgument, "fake ncclCommFinalize: not a live communicator");
  ncclResult_t r = ensure_ready(comm);
  if (r != ncclSuccess) return r;
  struct fake_comm *c = (struct fake_comm *)comm;
  if (c->finalized) return fail(ncclInvalidArgument, "fake ncclCommFinalize: finalized twice");
  c->finalized = 1;
  return ncclSuccess;
}

FAKE_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  if (!live(comm)) return fail(ncclInvalidArgument, "fake ncclCommDestroy: already destroyed");
  ncclResult_t r = ensure_ready(comm);
  if (r != ncclSuccess) return r;
  release((struct fake_comm *)comm);
  return ncclSuccess;
}

FAKE_API(ncclResult_t, ncclCommAbort, ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  if (!live(comm)) return fail(ncclInvalidArgument, "fake ncclCommAbort: not a live communicator");
  (void)ensure_ready(comm); /* NCCL ignores the state when aborting */
  release((struct fake_comm *)comm);
  return ncclSuccess;
}

FAKE_API(ncclResult_t, ncclGroupStart, void) {
  group_depth++;
  return ncclSuccess;
}

FAKE_API(ncclResult_t, ncclGroupEnd, void) {
  if (group_depth == 0) return fail(ncclInvalidUsage, "fake ncclGroupEnd without ncclGroupStart");
  group_depth--;
  return ncclSuccess;
}

FAKE_API(const char *, ncclGetLastError, ncclComm_t comm) {
  (void)comm;
  return last_error;
}

/* Forwarded reductions (ncclProd and the like): counted, nothing computed. */
FAKE_API(ncclResult_t, ncclAllReduce, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  (void)sendbuff, (void)recvbuff, (void)count, (void)datatype, (void)op, (void)stream;
  ncclResult_t r = live(comm) ? ncclSuccess : fail(ncclInvalidArgument, "fake ncclAllReduce: bad comm");
  if (r == ncclSuccess) collectives++;
  return r;
}
