/* The stand-in NCCL (nccl_standin.c) by itself, under mpirun -np P (P even), linked to it
 * directly: a communicator over every process and one per "rail" (the processes of equal
 * rank % 2, their ids made by each rail's first process), every collective in place and out of
 * place for f32, f64, bf16, f16, i32 and u64 with every reduction it serves, against a host
 * reference on small integers (products only where exact); a count that does not match the id is ncclInvalidUsage on every
 * process, with a message. So a failure of the mcast tests that use the stand-in is mcast's. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#define NCHECK(cond)                                                                     \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      fprintf(stderr, "%s:%d: CHECK failed: %s (%s)\n", __FILE__, __LINE__, #cond,       \
              ncclGetLastError(NULL));                                                   \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                      \
    }                                                                                    \
  } while (0)
#define NOK(call) NCHECK((call) == ncclSuccess)

static const ncclDataType_t dtypes[6] = {ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat16, ncclInt32, ncclUint64};
static const size_t sizes[6] = {4, 8, 2, 2, 4, 8};

static long value(int r, size_t i) { return (long)((i * 5 + (size_t)r * 3) % 7) + 1; } /* 1..7: products stay exact */

static void put(void *p, ncclDataType_t d, size_t i, long v) {
  float f = (float)v;
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  switch (d) {
    case ncclFloat32: ((float *)p)[i] = f; break;
    case ncclFloat64: ((double *)p)[i] = (double)v; break;
    case ncclBfloat16: ((uint16_t *)p)[i] = (uint16_t)(bits >> 16); break;
    /* half of an integer <= 2048: rebias float's exponent, keep the top 10 mantissa bits */
    case ncclFloat16: ((uint16_t *)p)[i] = (uint16_t)((((bits >> 23) & 0xff) - 112) << 10 | ((bits >> 13) & 0x3ff)); break;
    case ncclInt32: ((int32_t *)p)[i] = (int32_t)v; break;
    default: ((uint64_t *)p)[i] = (uint64_t)v; break;
  }
}

static long fold(ncclRedOp_t op, long a, long b) {
  return op == ncclSum ? a + b : op == ncclProd ? a * b : op == ncclMin ? (a < b ? a : b) : (a > b ? a : b);
}

/* The world ranks of `comm`'s members, by communicator rank. */
static int members[64];

static void check_comm(ncclComm_t comm, int me, int n) {
  const size_t count = 33;
  for (int di = 0; di < 6; di++) {
    ncclDataType_t d = dtypes[di];
    size_t es = sizes[di], total = count * (size_t)n;
    unsigned char *in = malloc(total * es), *out = malloc(total * es), *want = malloc(total * es);
    NCHECK(in && out && want);
    for (int inplace = 0; inplace <= 1; inplace++) {
      for (int op = ncclSum; op <= ncclMin; op++) {
        if (op == ncclProd && (sizes[di] == 2 || n > 4)) continue; /* products of 1..7 overflow 16-bit floats' precision */
        /* all-reduce */
        for (size_t i = 0; i < count; i++) {
          long acc = value(members[0], i);
          for (int q = 1; q < n; q++) acc = fold((ncclRedOp_t)op, acc, value(members[q], i));
          put(in, d, i, value(members[me], i));
          put(want, d, i, acc);
        }
        void *dst = inplace ? (void *)in : (void *)out;
        NOK(ncclAllReduce(in, dst, count, d, (ncclRedOp_t)op, comm, NULL));
        NCHECK(memcmp(dst, want, count * es) == 0);
        /* reduce-scatter: block `me` of the reduction */
        for (size_t i = 0; i < total; i++) put(in, d, i, value(members[me], i));
        for (size_t i = 0; i < count; i++) {
          size_t at = (size_t)me * count + i;
          long acc = value(members[0], at);
          for (int q = 1; q < n; q++) acc = fold((ncclRedOp_t)op, acc, value(members[q], at));
          put(want, d, i, acc);
        }
        dst = inplace ? (void *)(in + (size_t)me * count * es) : (void *)out;
        NOK(ncclReduceScatter(in, dst, count, d, (ncclRedOp_t)op, comm, NULL));
        NCHECK(memcmp(dst, want, count * es) == 0);
      }
      /* all-gather */
      unsigned char *dst = inplace ? in : out;
      unsigned char *src = inplace ? in + (size_t)me * count * es : in;
      for (size_t i = 0; i < total; i++) put(want, d, i, value(members[i / count], i % count));
      for (size_t i = 0; i < count; i++) put(src, d, i, value(members[me], i));
      NOK(ncclAllGather(src, dst, count, d, comm, NULL));
      NCHECK(memcmp(dst, want, total * es) == 0);
      /* broadcast from the last member */
      for (size_t i = 0; i < count; i++) {
        put(in, d, i, value(members[me], i));
        put(want, d, i, value(members[n - 1], i));
      }
      dst = inplace ? in : out;
      NOK(ncclBroadcast(in, dst, count, d, n - 1, comm, NULL));
      NCHECK(memcmp(dst, want, count * es) == 0);
    }
    free(in);
    free(out);
    free(want);
  }
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  NCHECK(n % 2 == 0 && n <= 64);
  int version = 0;
  NOK(ncclGetVersion(&version));
  NCHECK(version == 22707);

  /* Every process. */
  ncclUniqueId id;
  if (rank == 0) NOK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t world;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.maxCTAs = 4;
  NOK(ncclCommInitRankConfig(&world, n, id, rank, &config));
  for (int q = 0; q < n; q++) members[q] = q;
  check_comm(world, rank, n);

  /* The rails: processes of equal rank % 2, each rail's id made by its first process. */
  ncclUniqueId mine, all[64];
  memset(&mine, 0, sizeof mine);
  if (rank < 2) NOK(ncclGetUniqueId(&mine));
  MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all, sizeof mine, MPI_BYTE, MPI_COMM_WORLD);
  ncclComm_t rail;
  NOK(ncclCommInitRank(&rail, n / 2, all[rank % 2], rank / 2));
  for (int q = 0; q < n / 2; q++) members[q] = rank % 2 + 2 * q;
  check_comm(rail, rank / 2, n / 2);

  /* A count that does not match: refused on every process, nothing made. */
  ncclComm_t bad = NULL;
  if (rank == 0) NOK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  NCHECK(ncclCommInitRank(&bad, n + 1, id, rank) == ncclInvalidUsage && bad == NULL);
  NCHECK(strstr(ncclGetLastError(NULL), "processes came with this id") != NULL);

  ncclResult_t async = ncclInternalError;
  NOK(ncclCommGetAsyncError(rail, &async));
  NCHECK(async == ncclSuccess);
  NOK(ncclCommAbort(rail));
  NOK(ncclCommDestroy(world));
  if (rank == 0) printf("stand-in NCCL: %d processes, every collective checked\n", n);
  MPI_Finalize();
  return 0;
}
