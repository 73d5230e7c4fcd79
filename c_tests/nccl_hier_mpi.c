/* libmcast_nccl with a communicator across simulated NVLink domains, one MPI process per rank
 * (the id sent with MPI_Bcast), the stand-in NCCL over MPI (nccl_standin.c) as
 * MCAST_NCCL_FALLBACK:
 *   mpirun -np P nccl_hier_mpi D MODE STANDIN   (D domains of P/D ranks: MCAST_DOMAIN=D<rank/(P/D)>
 *                                                 set by each rank before its first call)
 *   MODE hier   MCAST_NCCL_HIER=on: mcast inside each domain, the stand-in between them (one rail
 *               communicator made with maxCTAs 4, beside the whole fallback communicator)
 *   MODE whole  MCAST_NCCL_HIER unset: the communicator is the stand-in's whole (no rail)
 *   MODE bad    MCAST_NCCL_HIER=maybe: ncclCommInitRank is ncclInvalidUsage naming the variable
 *   MODE noflat as hier, but the stand-in refuses communicators of P ranks on every process
 *               (STANDIN_NCCL_FAIL_INIT_NRANKS=P): the flat fallback communicator is not made, the
 *               communicator comes up without it (the rail's only), and ncclSend / ncclRecv, which
 *               would need it, are ncclInvalidUsage saying why
 *   MODE partflat as noflat, but only process 1 fails (STANDIN_NCCL_FAIL_INIT_RANK=1): the other
 *               ranks made theirs and destroy it, so no rank holds a communicator its peers lack
 *   MODE wholefail as whole, but the stand-in refuses communicators of P ranks on every process:
 *               ncclCommInitRank fails on every rank, and ncclGetLastError carries the fallback
 *               NCCL's own reason
 * hier, noflat, partflat and whole run ncclAllReduce (sum, min, max), ncclReduceScatter,
 * ncclAllGather and ncclBroadcast on ncclMemAlloc memory, in and out of place, for f32, bf16 and
 * i64, against a host reference; destroying the communicator leaves no stand-in communicator
 * alive. */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <mpi.h>
#include <stdint.h>
#include <string.h>

#include "nccl_check.h"

static int rank, n, partflat_mode;

static long value(int r, size_t i) { return (long)((i * 11 + (size_t)r * 5) % 23) - 11; }

static const ncclDataType_t dtypes[3] = {ncclFloat32, ncclBfloat16, ncclInt64};
static const size_t sizes[3] = {4, 2, 8};

static void put(void *p, ncclDataType_t d, size_t i, long v) {
  float f = (float)v;
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  if (d == ncclFloat32) ((float *)p)[i] = f;
  else if (d == ncclBfloat16) ((uint16_t *)p)[i] = (uint16_t)(bits >> 16); /* exact for small integers */
  else ((int64_t *)p)[i] = v;
}

static long fold(ncclRedOp_t op, long a, long b) {
  return op == ncclSum ? a + b : op == ncclMin ? (a < b ? a : b) : (a > b ? a : b);
}

static long reduce(ncclRedOp_t op, size_t i) {
  long acc = value(0, i);
  for (int q = 1; q < n; q++) acc = fold(op, acc, value(q, i));
  return acc;
}

typedef void (*stats_fn)(int *, int *, int *, int *);

static void standin_stats(const char *path, int *live, int *made, int *colls, int *max_ctas) {
  void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD); /* the copy libmcast_nccl loaded */
  NCHECK(h != NULL);
  stats_fn f;
  *(void **)&f = dlsym(h, "standinNcclStats");
  NCHECK(f != NULL);
  f(live, made, colls, max_ctas);
  dlclose(h);
}

static void collectives(ncclComm_t comm) {
  const size_t count = 517;
  unsigned char *send, *recv, *want = malloc((size_t)n * count * 8);
  NCHECK(want != NULL);
  NCHECK_OK(ncclMemAlloc((void **)&send, (size_t)n * count * 8));
  NCHECK_OK(ncclMemAlloc((void **)&recv, (size_t)n * count * 8));
  for (int di = 0; di < 3; di++) {
    ncclDataType_t d = dtypes[di];
    size_t es = sizes[di];
    for (int inplace = 0; inplace <= 1; inplace++) {
      unsigned char *src = inplace ? recv : send;
      for (int op = ncclSum; op <= ncclMin; op++) {
        if (op == ncclProd) continue;
        for (size_t i = 0; i < count; i++) put(src, d, i, value(rank, i)), put(want, d, i, reduce((ncclRedOp_t)op, i));
        NCHECK_OK(ncclAllReduce(src, recv, count, d, (ncclRedOp_t)op, comm, NULL));
        NCHECK_OK(ncclCommFinalize(comm));
        NCHECK(memcmp(recv, want, count * es) == 0);
      }
      for (size_t i = 0; i < (size_t)n * count; i++) put(src, d, i, value(rank, i));
      for (size_t i = 0; i < count; i++) put(want, d, i, reduce(ncclSum, (size_t)rank * count + i));
      unsigned char *dst = inplace ? recv + (size_t)rank * count * es : recv;
      NCHECK_OK(ncclReduceScatter(src, dst, count, d, ncclSum, comm, NULL));
      NCHECK_OK(ncclCommFinalize(comm));
      NCHECK(memcmp(dst, want, count * es) == 0);
      unsigned char *mine = inplace ? recv + (size_t)rank * count * es : send;
      for (size_t i = 0; i < count; i++) put(mine, d, i, value(rank, i));
      for (size_t i = 0; i < (size_t)n * count; i++) put(want, d, i, value((int)(i / count), i % count));
      NCHECK_OK(ncclAllGather(mine, recv, count, d, comm, NULL));
      NCHECK_OK(ncclCommFinalize(comm));
      NCHECK(memcmp(recv, want, (size_t)n * count * es) == 0);
      for (size_t i = 0; i < count; i++) put(src, d, i, value(rank, i)), put(want, d, i, value(n - 1, i));
      NCHECK_OK(ncclBroadcast(src, recv, count, d, n - 1, comm, NULL));
      NCHECK_OK(ncclCommFinalize(comm));
      NCHECK(memcmp(recv, want, count * es) == 0);
    }
  }
  NCHECK_OK(ncclMemFree(send));
  NCHECK_OK(ncclMemFree(recv));
  free(want);
}

/* Calls that would go to the flat fallback communicator fail, saying why (the stand-in's own
 * error on a rank whose creation failed, the failing rank on the others), on the communicator and
 * on one split from it; both still serve collectives. */
static void no_flat_calls(ncclComm_t comm) {
  float buf[4] = {0};
  int peer = (rank + 1) % n;
  const char *why = "the flat fallback communicator could not be made";
  NCHECK_RESULT(ncclSend(buf, 4, ncclFloat32, peer, comm, NULL), ncclInvalidUsage);
  NCHECK(strstr(ncclGetLastError(NULL), "ncclSend") != NULL);
  NCHECK(strstr(ncclGetLastError(NULL), why) != NULL);
  if (rank == 1 || !partflat_mode)
    NCHECK(strstr(ncclGetLastError(NULL), "failure injected for communicators of") != NULL);
  else
    NCHECK(strstr(ncclGetLastError(NULL), "rank 1") != NULL);
  NCHECK_RESULT(ncclRecv(buf, 4, ncclFloat32, peer, comm, NULL), ncclInvalidUsage);
  NCHECK(strstr(ncclGetLastError(NULL), "ncclRecv") != NULL);
  NCHECK(strstr(ncclGetLastError(NULL), why) != NULL);
  /* The communicator still serves collectives after the refusals. */
  float *one;
  NCHECK_OK(ncclMemAlloc((void **)&one, sizeof *one));
  *one = 1.0f;
  NCHECK_OK(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, comm, NULL));
  NCHECK_OK(ncclCommFinalize(comm));
  NCHECK(*one == (float)n);
  /* A communicator split from it has none either, and says why. */
  ncclComm_t child = NULL;
  NCHECK_OK(ncclCommSplit(comm, 0, rank, &child, NULL));
  NCHECK(child != NULL);
  NCHECK_RESULT(ncclSend(buf, 4, ncclFloat32, peer, child, NULL), ncclInvalidUsage);
  NCHECK(strstr(ncclGetLastError(NULL), why) != NULL);
  *one = 1.0f;
  NCHECK_OK(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, child, NULL));
  NCHECK_OK(ncclCommFinalize(child));
  NCHECK(*one == (float)n);
  NCHECK_OK(ncclCommDestroy(child));
  NCHECK_OK(ncclMemFree(one));
}

int main(int argc, char **argv) {
  /* preloaded: the NCCL is in the process before libmcast_nccl looks for it, as PyTorch's
     libtorch_cuda.so loads libnccl.so.2 at start: libmcast_nccl then uses that copy as it was
     loaded (no RTLD_DEEPBIND), so NCCL's calls of its own exported functions come to it. */
  if (argc == 4 && strcmp(argv[2], "preloaded") == 0) NCHECK(dlopen(argv[3], RTLD_NOW | RTLD_GLOBAL) != NULL);
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  NCHECK(argc == 4);
  int ndomains = atoi(argv[1]);
  const char *mode = argv[2], *standin = argv[3];
  NCHECK(ndomains >= 2 && n % ndomains == 0);
  NCHECK(strcmp(getenv("MCAST_NCCL_FALLBACK"), standin) == 0);
  char label[16];
  snprintf(label, sizeof label, "D%d", rank / (n / ndomains));
  NCHECK(setenv("MCAST_DOMAIN", label, 1) == 0);
  int noflat = strcmp(mode, "noflat") == 0, partflat = strcmp(mode, "partflat") == 0;
  int hier = strcmp(mode, "hier") == 0 || strcmp(mode, "preloaded") == 0 || noflat || partflat;
  int bad = strcmp(mode, "bad") == 0, wholefail = strcmp(mode, "wholefail") == 0;
  NCHECK(hier || bad || wholefail || strcmp(mode, "whole") == 0);
  if (hier) NCHECK(setenv("MCAST_NCCL_HIER", "on", 1) == 0);
  if (noflat || partflat || wholefail) {
    char nranks[16];
    snprintf(nranks, sizeof nranks, "%d", n); /* the flat communicator's size, not the rails' */
    NCHECK(setenv("STANDIN_NCCL_FAIL_INIT_NRANKS", nranks, 1) == 0);
    if (partflat) NCHECK(setenv("STANDIN_NCCL_FAIL_INIT_RANK", "1", 1) == 0);
    partflat_mode = partflat;
  }
  if (bad) NCHECK(setenv("MCAST_NCCL_HIER", "maybe", 1) == 0);

  ncclUniqueId id;
  if (rank == 0) NCHECK_OK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm = NULL;
  if (bad) {
    NCHECK(ncclCommInitRank(&comm, n, id, rank) == ncclInvalidUsage);
    NCHECK(strstr(ncclGetLastError(NULL), "MCAST_NCCL_HIER=\"maybe\": set it to on or off") != NULL);
    MPI_Finalize();
    return 0;
  }
  if (wholefail) {
    NCHECK(ncclCommInitRank(&comm, n, id, rank) != ncclSuccess);
    NCHECK(strstr(ncclGetLastError(NULL), "ncclCommInitRank failed: stand-in NCCL: ncclCommInitRank: failure injected") != NULL);
    MPI_Finalize();
    return 0;
  }
  NCHECK_OK(ncclCommInitRank(&comm, n, id, rank));
  int live, made, colls, max_ctas;
  standin_stats(standin, &live, &made, &colls, &max_ctas);
  if (noflat || partflat) {
    /* The rail's only; in partflat the ranks but 1 made a flat one and destroyed it. */
    NCHECK(live == 1 && made == (partflat && rank != 1 ? 2 : 1));
    NCHECK(max_ctas == 4);
  } else if (hier) {
    NCHECK(live == 2 && made == 2); /* the rail's and the whole fallback communicator */
    NCHECK(max_ctas == 4);          /* the rail's, made by the NCCL engine */
  } else {
    NCHECK(live == 1 && made == 1 && max_ctas == -1); /* the whole communicator only */
  }
  collectives(comm);
  if (noflat || partflat) no_flat_calls(comm);
  int before = colls;
  standin_stats(standin, &live, &made, &colls, &max_ctas);
  NCHECK(colls > before); /* between domains (hier) or everything (whole) went through the stand-in */
  NCHECK_OK(ncclCommDestroy(comm));
  standin_stats(standin, &live, &made, &colls, &max_ctas);
  NCHECK(live == 0);
  if (rank == 0) printf("%s: %d ranks in %d domains, collectives checked, %d stand-in collectives\n", mode, n, ndomains, colls);
  MPI_Finalize();
  return 0;
}
