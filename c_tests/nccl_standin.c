/* A stand-in NCCL written over MPI, for the tests of NCCL as the engine between NVLink domains
 * (MCAST_NET=nccl MCAST_NET_NCCL=<this library>) and of libmcast_nccl's MCAST_NCCL_HIER=on with
 * it as MCAST_NCCL_FALLBACK, under mpirun without a GPU. Built by c_tests/CMakeLists.txt only,
 * never installed.
 *
 * It moves real data: on the simulator a device pointer is a host address (src/driver/mod.rs:
 * DevicePtr), so the collectives hand the caller's pointers to MPI as they are. They run
 * synchronously when called and ignore the stream: a caller must have completed the stream's
 * earlier work (on the simulator nothing else can enqueue on its streams).
 *
 * Communicators: ncclGetUniqueId writes a mark, the calling process's MPI_COMM_WORLD rank and a
 * serial number. ncclCommInitRank splits MPI_COMM_WORLD by that creator rank, keyed by the rank
 * asked for, and checks that every member came with the same id and that the count and ranks
 * match. MPI_Comm_split is collective over MPI_COMM_WORLD: every process of the job must make its
 * communicators in the same order, one at a time (true of a team over the whole job, whose
 * processes each sit on one rail). The program initialises MPI (MPI_THREAD_MULTIPLE where several
 * threads may call).
 *
 * ncclCommFinalize and ncclGroupStart/End have nothing to wait for (libmcast_nccl forwards them to
 * its fallback). ncclGetVersion says 2.27.7; ncclCommInitRankConfig records the config's maxCTAs, and
 * standinNcclStats() tells a test how many communicators and collectives there were.
 * STANDIN_NCCL_FAIL_RANK makes one process's all-reduces fail (see failing_here);
 * STANDIN_NCCL_FAIL_INIT_NRANKS makes the creation of communicators of that size fail (see
 * init_fails_here). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>
#include <nccl.h>

#define API __attribute__((visibility("default")))
#define STANDIN_MAGIC 0x4e49444e41545321ull /* "!STANDIN" */

struct ncclComm {
  uint64_t magic;
  MPI_Comm mpi;
  int rank, nranks;
};

static int live_comms, made_comms, collectives, last_max_ctas = -1;
static unsigned serial;
static char last_error[256];

static ncclResult_t fail(ncclResult_t r, const char *what) {
  snprintf(last_error, sizeof last_error, "stand-in NCCL: %s", what);
  return r;
}

static int live(ncclComm_t c) { return c != NULL && c->magic == STANDIN_MAGIC; }

static int mpi_ready(void) {
  int init = 0, done = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&done);
  return init && !done;
}

/* What a test reads back (dlopen the library with RTLD_NOLOAD): communicators alive and made,
 * collectives run, and the maxCTAs of the last ncclCommInitRankConfig (-1: none). */
API void standinNcclStats(int *live_out, int *made_out, int *collectives_out, int *max_ctas_out) {
  *live_out = live_comms;
  *made_out = made_comms;
  *collectives_out = collectives;
  *max_ctas_out = last_max_ctas;
}

API ncclResult_t ncclGetVersion(int *version) {
  if (version == NULL) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = 22707;
  return ncclSuccess;
}

API const char *ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "unhandled system error (the stand-in's MPI call failed)";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    default: return "unknown result code";
  }
}

API const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return last_error;
}

API ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (id == NULL) return fail(ncclInvalidArgument, "ncclGetUniqueId: id is NULL");
  if (!mpi_ready()) return fail(ncclInvalidUsage, "ncclGetUniqueId: MPI is not initialised (the program must call MPI_Init)");
  int world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  uint64_t mark = STANDIN_MAGIC;
  unsigned s = ++serial;
  memset(id, 0, sizeof *id);
  memcpy(id->internal, &mark, sizeof mark);
  memcpy(id->internal + 8, &world, sizeof world);
  memcpy(id->internal + 12, &s, sizeof s);
  return ncclSuccess;
}

/* STANDIN_NCCL_FAIL_INIT_NRANKS=<N>: ncclCommInitRank and ncclCommInitRankConfig fail with
 * ncclInvalidUsage for communicators of exactly N ranks (as a real NCCL refuses a communicator
 * with two ranks on one GPU), on every process, or with STANDIN_NCCL_FAIL_INIT_RANK=<MPI_COMM_WORLD
 * rank> on that process only. The failure comes after the members met (MPI_Comm_split stays
 * collective over MPI_COMM_WORLD), so the other members' calls return and their communicators
 * are complete. */
static int init_fails_here(int nranks) {
  const char *n = getenv("STANDIN_NCCL_FAIL_INIT_NRANKS");
  const char *r = getenv("STANDIN_NCCL_FAIL_INIT_RANK");
  if (n == NULL || *n == 0 || atoi(n) != nranks) return 0;
  if (r == NULL || *r == 0) return 1;
  int world = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  return atoi(r) == world;
}

static ncclResult_t init(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  if (comm == NULL) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  *comm = NULL;
  if (nranks < 1 || rank < 0 || rank >= nranks) return fail(ncclInvalidArgument, "ncclCommInitRank: bad nranks or rank");
  if (!mpi_ready()) return fail(ncclInvalidUsage, "ncclCommInitRank: MPI is not initialised (the program must call MPI_Init)");
  uint64_t mark;
  int creator;
  unsigned s;
  memcpy(&mark, id.internal, sizeof mark);
  memcpy(&creator, id.internal + 8, sizeof creator);
  memcpy(&s, id.internal + 12, sizeof s);
  if (mark != STANDIN_MAGIC || creator < 0) return fail(ncclInvalidArgument, "ncclCommInitRank: not a unique id of the stand-in");
  MPI_Comm mpi;
  if (MPI_Comm_split(MPI_COMM_WORLD, creator, rank, &mpi) != MPI_SUCCESS)
    return fail(ncclSystemError, "ncclCommInitRank: MPI_Comm_split failed");
  int size = 0, me = -1;
  long mine[2] = {(long)s, (long)nranks}, lo[2], hi[2];
  MPI_Comm_size(mpi, &size);
  MPI_Comm_rank(mpi, &me);
  MPI_Allreduce(mine, lo, 2, MPI_LONG, MPI_MIN, mpi);
  MPI_Allreduce(mine, hi, 2, MPI_LONG, MPI_MAX, mpi);
  if (size != nranks || me != rank || lo[0] != hi[0] || lo[1] != hi[1]) {
    MPI_Comm_free(&mpi);
    char why[160];
    snprintf(why, sizeof why, "ncclCommInitRank: %d processes came with this id, asked for %d (rank %d), ids %s", size,
             nranks, rank, lo[0] == hi[0] ? "equal" : "differ");
    return fail(ncclInvalidUsage, why);
  }
  if (init_fails_here(nranks)) {
    MPI_Comm_free(&mpi);
    char why[160];
    snprintf(why, sizeof why,
             "ncclCommInitRank: failure injected for communicators of %d ranks "
             "(STANDIN_NCCL_FAIL_INIT_NRANKS)",
             nranks);
    return fail(ncclInvalidUsage, why);
  }
  struct ncclComm *c = calloc(1, sizeof *c);
  if (c == NULL) {
    MPI_Comm_free(&mpi);
    return fail(ncclSystemError, "ncclCommInitRank: out of memory");
  }
  c->magic = STANDIN_MAGIC;
  c->mpi = mpi;
  c->rank = rank;
  c->nranks = nranks;
  live_comms++;
  made_comms++;
  *comm = c;
  return ncclSuccess;
}

API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  return init(comm, nranks, id, rank);
}

API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
  if (config != NULL) {
    if (config->magic != 0xcafebeef || config->size < offsetof(ncclConfig_t, netName))
      return fail(ncclInvalidArgument, "ncclCommInitRankConfig: config not made by NCCL_CONFIG_INITIALIZER");
    if (config->version >= NCCL_VERSION(2, 17, 0)) last_max_ctas = config->maxCTAs;
  }
  return init(comm, nranks, id, rank);
}

static void release(ncclComm_t c) {
  MPI_Comm_free(&c->mpi);
  c->magic = 0;
  free(c);
  live_comms--;
}

API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  if (!live(comm)) return fail(ncclInvalidArgument, "ncclCommDestroy: not a live communicator");
  release(comm);
  return ncclSuccess;
}

/* Collectives complete before they return: nothing is left to finalize. */
API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return live(comm) ? ncclSuccess : fail(ncclInvalidArgument, "ncclCommFinalize: not a live communicator");
}

/* Open MPI frees a communicator locally; an abort never waits for the other members. */
API ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error) {
  if (!live(comm) || async_error == NULL) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: bad arguments");
  *async_error = ncclSuccess;
  return ncclSuccess;
}

/* Groups: every call runs when it is made, so a group only has to be balanced. */
static _Thread_local int group_depth;

API ncclResult_t ncclGroupStart(void) {
  group_depth++;
  return ncclSuccess;
}

API ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  group_depth--;
  return ncclSuccess;
}

/* ---- dtypes and reductions ---- */

static float f16_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal: value man * 2^-24, normalised */
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while (!(man & 0x400u));
      bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static uint16_t float_to_f16(float f) { /* round to nearest even */
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520 and up: infinity */
  if (a < 0x38800000u) {                                   /* under 2^-14: subnormal */
    float v;
    memcpy(&v, &a, sizeof v);
    return (uint16_t)(sign | (uint16_t)nearbyintf(v * 16777216.0f));
  }
  uint32_t h = (((a >> 23) - 112) << 10) | ((a & 0x7fffffu) >> 13), rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++;
  return (uint16_t)(sign | h);
}

static float bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static uint16_t float_to_bf16(float f) { /* round to nearest even */
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* 16-bit floats: MPI has no such types, so two named 2-byte types and user operations. */
static MPI_Datatype mpi_f16 = MPI_DATATYPE_NULL, mpi_bf16 = MPI_DATATYPE_NULL;
static MPI_Op half_ops[4]; /* by ncclRedOp_t: sum, prod, max, min */

static void half_fold(void *in, void *inout, int *len, MPI_Datatype *type, ncclRedOp_t op) {
  int bf = *type == mpi_bf16;
  uint16_t *a = in, *b = inout;
  for (int i = 0; i < *len; i++) {
    float x = bf ? bf16_to_float(a[i]) : f16_to_float(a[i]);
    float y = bf ? bf16_to_float(b[i]) : f16_to_float(b[i]);
    float r = op == ncclSum ? x + y : op == ncclProd ? x * y : op == ncclMax ? (x > y ? x : y) : (x < y ? x : y);
    b[i] = bf ? float_to_bf16(r) : float_to_f16(r);
  }
}
static void half_sum(void *in, void *io, int *n, MPI_Datatype *t) { half_fold(in, io, n, t, ncclSum); }
static void half_prod(void *in, void *io, int *n, MPI_Datatype *t) { half_fold(in, io, n, t, ncclProd); }
static void half_max(void *in, void *io, int *n, MPI_Datatype *t) { half_fold(in, io, n, t, ncclMax); }
static void half_min(void *in, void *io, int *n, MPI_Datatype *t) { half_fold(in, io, n, t, ncclMin); }

static void half_types(void) {
  if (mpi_f16 != MPI_DATATYPE_NULL) return;
  MPI_Type_contiguous(2, MPI_BYTE, &mpi_f16);
  MPI_Type_commit(&mpi_f16);
  MPI_Type_contiguous(2, MPI_BYTE, &mpi_bf16);
  MPI_Type_commit(&mpi_bf16);
  MPI_Op_create(half_sum, 1, &half_ops[ncclSum]);
  MPI_Op_create(half_prod, 1, &half_ops[ncclProd]);
  MPI_Op_create(half_max, 1, &half_ops[ncclMax]);
  MPI_Op_create(half_min, 1, &half_ops[ncclMin]);
}

/* The MPI type of `dtype` and its size in bytes; 0 when unknown. */
static size_t mpi_type(ncclDataType_t dtype, MPI_Datatype *t) {
  switch (dtype) {
    case ncclInt8: *t = MPI_INT8_T; return 1;
    case ncclUint8: *t = MPI_UINT8_T; return 1;
    case ncclInt32: *t = MPI_INT32_T; return 4;
    case ncclUint32: *t = MPI_UINT32_T; return 4;
    case ncclInt64: *t = MPI_INT64_T; return 8;
    case ncclUint64: *t = MPI_UINT64_T; return 8;
    case ncclFloat32: *t = MPI_FLOAT; return 4;
    case ncclFloat64: *t = MPI_DOUBLE; return 8;
    case ncclFloat16: half_types(); *t = mpi_f16; return 2;
    case ncclBfloat16: half_types(); *t = mpi_bf16; return 2;
    default: return 0;
  }
}

static int mpi_op(ncclRedOp_t op, ncclDataType_t dtype, MPI_Op *o) {
  if (op < ncclSum || op > ncclMin) return 0;
  if (dtype == ncclFloat16 || dtype == ncclBfloat16) {
    *o = half_ops[op];
    return 1;
  }
  *o = op == ncclSum ? MPI_SUM : op == ncclProd ? MPI_PROD : op == ncclMax ? MPI_MAX : MPI_MIN;
  return 1;
}

/* The checks every collective makes; the element size of `dtype` in `*size`. */
static ncclResult_t begin(const char *what, ncclComm_t comm, ncclDataType_t dtype, MPI_Datatype *t, size_t *size,
                          size_t count) {
  char why[128];
  if (!live(comm)) {
    snprintf(why, sizeof why, "%s: not a live communicator", what);
    return fail(ncclInvalidArgument, why);
  }
  /* As NCCL does before every collective (ncclCommEnsureReady): its own exported function, by
   * name, through the dynamic linker, so a library in front of NCCL receives this communicator. */
  ncclResult_t async = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(comm, &async);
  if (r != ncclSuccess) return r;
  if (async != ncclSuccess) return async;
  if ((*size = mpi_type(dtype, t)) == 0) {
    snprintf(why, sizeof why, "%s: dtype %d is not served", what, (int)dtype);
    return fail(ncclInvalidArgument, why);
  }
  if (count > (size_t)INT32_MAX) {
    snprintf(why, sizeof why, "%s: count %zu is more than MPI counts", what, count);
    return fail(ncclInvalidArgument, why);
  }
  if (!mpi_ready()) {
    snprintf(why, sizeof why, "%s: MPI is finalised", what);
    return fail(ncclInvalidUsage, why);
  }
  collectives++;
  return ncclSuccess;
}

static ncclResult_t done(int mpi_result, const char *what) {
  if (mpi_result == MPI_SUCCESS) return ncclSuccess;
  char why[128];
  snprintf(why, sizeof why, "%s: MPI returned %d", what, mpi_result);
  return fail(ncclSystemError, why);
}

/* STANDIN_NCCL_FAIL_RANK=<MPI_COMM_WORLD rank>: that process's all-reduces move the data, then
 * return ncclSystemError (its peers are not left waiting; a rank that hears of the failure
 * before its own rail call must still make it, or its rail peers wait in MPI forever). */
static int failing_here(void) {
  const char *v = getenv("STANDIN_NCCL_FAIL_RANK");
  int world = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  return v != NULL && *v != 0 && atoi(v) == world;
}

static int overlap(const void *a, size_t an, const void *b, size_t bn) {
  const char *x = a, *y = b;
  return x < y + bn && y < x + an;
}

API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  (void)stream;
  MPI_Datatype t;
  MPI_Op o;
  size_t size;
  ncclResult_t r = begin("ncclAllReduce", comm, datatype, &t, &size, count);
  if (r != ncclSuccess) return r;
  if (!mpi_op(op, datatype, &o)) return fail(ncclInvalidArgument, "ncclAllReduce: reduction not served");
  if (count == 0) return ncclSuccess;
  const void *src = sendbuff == recvbuff ? MPI_IN_PLACE : sendbuff;
  r = done(MPI_Allreduce(src, recvbuff, (int)count, t, o, comm->mpi), "ncclAllReduce");
  if (r == ncclSuccess && failing_here()) return fail(ncclSystemError, "ncclAllReduce: failure injected (STANDIN_NCCL_FAIL_RANK)");
  return r;
}

API ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                                   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  (void)stream;
  MPI_Datatype t;
  MPI_Op o;
  size_t size;
  ncclResult_t r = begin("ncclReduceScatter", comm, datatype, &t, &size, recvcount);
  if (r != ncclSuccess) return r;
  if (!mpi_op(op, datatype, &o)) return fail(ncclInvalidArgument, "ncclReduceScatter: reduction not served");
  if (recvcount == 0) return ncclSuccess;
  size_t bytes = recvcount * size;
  /* NCCL's in place is recvbuff == sendbuff + rank * recvcount; MPI's differs: go through a copy. */
  if (!overlap(sendbuff, bytes * (size_t)comm->nranks, recvbuff, bytes))
    return done(MPI_Reduce_scatter_block(sendbuff, recvbuff, (int)recvcount, t, o, comm->mpi), "ncclReduceScatter");
  void *tmp = malloc(bytes);
  if (tmp == NULL) return fail(ncclSystemError, "ncclReduceScatter: out of memory");
  r = done(MPI_Reduce_scatter_block(sendbuff, tmp, (int)recvcount, t, o, comm->mpi), "ncclReduceScatter");
  if (r == ncclSuccess) memcpy(recvbuff, tmp, bytes);
  free(tmp);
  return r;
}

API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                               ncclComm_t comm, cudaStream_t stream) {
  (void)stream;
  MPI_Datatype t;
  size_t size;
  ncclResult_t r = begin("ncclAllGather", comm, datatype, &t, &size, sendcount);
  if (r != ncclSuccess) return r;
  if (sendcount == 0) return ncclSuccess;
  size_t bytes = sendcount * size;
  char *mine = (char *)recvbuff + (size_t)comm->rank * bytes;
  if (sendbuff == mine)
    return done(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recvbuff, (int)sendcount, t, comm->mpi),
                "ncclAllGather");
  if (!overlap(sendbuff, bytes, recvbuff, bytes * (size_t)comm->nranks))
    return done(MPI_Allgather(sendbuff, (int)sendcount, t, recvbuff, (int)sendcount, t, comm->mpi), "ncclAllGather");
  memmove(mine, sendbuff, bytes);
  return done(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recvbuff, (int)sendcount, t, comm->mpi),
              "ncclAllGather");
}

API ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                               ncclComm_t comm, cudaStream_t stream) {
  (void)stream;
  MPI_Datatype t;
  size_t size;
  ncclResult_t r = begin("ncclBroadcast", comm, datatype, &t, &size, count);
  if (r != ncclSuccess) return r;
  if (root < 0 || root >= comm->nranks) return fail(ncclInvalidArgument, "ncclBroadcast: root out of range");
  if (count == 0) return ncclSuccess;
  if (comm->rank == root && sendbuff != recvbuff) memmove(recvbuff, sendbuff, count * size);
  return done(MPI_Bcast(recvbuff, (int)count, t, root, comm->mpi), "ncclBroadcast");
}
