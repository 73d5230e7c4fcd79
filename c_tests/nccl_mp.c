/* The NCCL API over mcast with one process per rank, the way MPI programs use NCCL: rank 0 makes
 * the id with ncclGetUniqueId and hands it to the others (here through shared memory, where MPI
 * programs use MPI_Bcast); each calls ncclCommInitRank, allocates with ncclMemAlloc, runs all
 * four collectives in and out of place, checks them, and destroys. The parent only forks (before
 * any bootstrap thread exists) and waits.
 *   nccl_mp N   (2 <= N <= 4; on the simulator rank r uses device r % devices)
 *   nccl_mp domains   two ranks in two NVLink domains (MCAST_DOMAIN=A and B, set by each rank
 *               before its first call), no MCAST_NCCL_FALLBACK: ncclCommInitRank fails on both
 *               with ncclInvalidUsage, ncclGetLastError naming the domains and the variable
 *   nccl_mp domains-fallback   the same with MCAST_NCCL_FALLBACK (the stand-in NCCL): the
 *               communicator is the fallback's whole (its id carried from rank 0), an
 *               all-reduce is forwarded, the async error is the fallback's, destroy works */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nccl_check.h"

static int32_t value(int r, size_t i) { return (int32_t)((i * 13 + (size_t)r * 7) % 101) - 50; }

struct shared {
  pthread_barrier_t id_ready;
  ncclUniqueId id;
};

static int domains_main(struct shared *sh, int n, int r, int with_fallback) {
  NCHECK(setenv("MCAST_DOMAIN", r == 0 ? "A" : "B", 1) == 0);
  if (with_fallback) {
    NCHECK(getenv("MCAST_NCCL_FALLBACK") != NULL); /* the stand-in NCCL, set by ctest */
  } else {
    NCHECK(unsetenv("MCAST_NCCL_FALLBACK") == 0);
  }
  if (r == 0) NCHECK_OK(ncclGetUniqueId(&sh->id));
  int b = pthread_barrier_wait(&sh->id_ready);
  NCHECK(b == 0 || b == PTHREAD_BARRIER_SERIAL_THREAD);
  ncclComm_t comm = NULL;
  if (with_fallback) {
    static float send[16], recv[16];
    ncclResult_t async = ncclInternalError;
    NCHECK_OK(ncclCommInitRank(&comm, n, sh->id, r));
    /* No mcast team exists: a served all-reduce would fail; the fallback's succeeds. */
    NCHECK_OK(ncclAllReduce(send, recv, 16, ncclFloat, ncclSum, comm, NULL));
    NCHECK_OK(ncclCommGetAsyncError(comm, &async));
    NCHECK(async == ncclSuccess);
    NCHECK_OK(ncclCommDestroy(comm));
    return 0;
  }
  ncclResult_t res = ncclCommInitRank(&comm, n, sh->id, r);
  if (res != ncclInvalidUsage) fprintf(stderr, "rank %d: ncclCommInitRank returned %d\n", r, (int)res);
  NCHECK(res == ncclInvalidUsage);
  const char *why = ncclGetLastError(NULL);
  NCHECK(strstr(why, "2 NVLink domains") != NULL);
  NCHECK(strstr(why, "MCAST_DOMAIN=A (ranks 0)") != NULL && strstr(why, "MCAST_DOMAIN=B (ranks 1)") != NULL);
  NCHECK(strstr(why, "MCAST_NCCL_FALLBACK") != NULL);
  return 0;
}

static int rank_main(struct shared *sh, int n, int r) {
  if (r == 0) NCHECK_OK(ncclGetUniqueId(&sh->id));
  int b = pthread_barrier_wait(&sh->id_ready);
  NCHECK(b == 0 || b == PTHREAD_BARRIER_SERIAL_THREAD);
  ncclUniqueId id = sh->id;
  ncclComm_t comm;
  NCHECK_OK(ncclCommInitRank(&comm, n, id, r));
  int got_n = 0, got_r = -1;
  NCHECK_OK(ncclCommCount(comm, &got_n));
  NCHECK_OK(ncclCommUserRank(comm, &got_r));
  NCHECK(got_n == n && got_r == r);
  const size_t count = 4099;
  int32_t *send, *recv;
  NCHECK_OK(ncclMemAlloc((void **)&send, (size_t)n * count * sizeof *send));
  NCHECK_OK(ncclMemAlloc((void **)&recv, (size_t)n * count * sizeof *recv));
  for (int inplace = 0; inplace <= 1; inplace++) {
    int32_t *src = inplace ? recv : send;
    /* all-reduce, min */
    for (size_t i = 0; i < count; i++) src[i] = value(r, i);
    NCHECK_OK(ncclAllReduce(src, recv, count, ncclInt32, ncclMin, comm, NULL));
    NCHECK_OK(ncclCommFinalize(comm));
    for (size_t i = 0; i < count; i++) {
      int32_t want = value(0, i);
      for (int q = 1; q < n; q++) want = value(q, i) < want ? value(q, i) : want;
      NCHECK(recv[i] == want);
    }
    /* reduce-scatter, sum */
    for (size_t i = 0; i < (size_t)n * count; i++) src[i] = value(r, i);
    int32_t *dst = inplace ? recv + (size_t)r * count : recv;
    NCHECK_OK(ncclReduceScatter(src, dst, count, ncclInt32, ncclSum, comm, NULL));
    NCHECK_OK(ncclCommFinalize(comm));
    for (size_t i = 0; i < count; i++) {
      int32_t want = 0;
      for (int q = 0; q < n; q++) want += value(q, (size_t)r * count + i);
      NCHECK(dst[i] == want);
    }
    /* all-gather */
    int32_t *mine = inplace ? recv + (size_t)r * count : send;
    for (size_t i = 0; i < count; i++) mine[i] = value(r, i) + 1000 * r;
    NCHECK_OK(ncclAllGather(mine, recv, count, ncclInt32, comm, NULL));
    NCHECK_OK(ncclCommFinalize(comm));
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < count; i++) NCHECK(recv[(size_t)q * count + i] == value(q, i) + 1000 * q);
    /* broadcast from the last rank */
    for (size_t i = 0; i < count; i++) src[i] = value(r, i);
    NCHECK_OK(ncclBroadcast(src, recv, count, ncclInt32, n - 1, comm, NULL));
    NCHECK_OK(ncclCommFinalize(comm));
    for (size_t i = 0; i < count; i++) NCHECK(recv[i] == value(n - 1, i));
  }
  NCHECK_OK(ncclMemFree(send));
  NCHECK_OK(ncclMemFree(recv));
  NCHECK_OK(ncclCommDestroy(comm));
  return 0;
}

int main(int argc, char **argv) {
  int domains = argc > 1 && strncmp(argv[1], "domains", 7) == 0;
  int with_fallback = argc > 1 && strcmp(argv[1], "domains-fallback") == 0;
  int n = domains ? 2 : argc > 1 ? atoi(argv[1]) : 2;
  if (n < 2 || n > 4) {
    fprintf(stderr, "usage: nccl_mp N (2..4) | domains | domains-fallback\n");
    return 2;
  }
  struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  NCHECK(sh != MAP_FAILED);
  pthread_barrierattr_t attr;
  NCHECK(pthread_barrierattr_init(&attr) == 0);
  NCHECK(pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED) == 0);
  NCHECK(pthread_barrier_init(&sh->id_ready, &attr, (unsigned)n) == 0);
  pid_t pids[4];
  for (int r = 0; r < n; r++) {
    fflush(NULL);
    pids[r] = fork();
    NCHECK(pids[r] >= 0);
    if (pids[r] == 0) _exit(domains ? domains_main(sh, n, r, with_fallback) : rank_main(sh, n, r));
  }
  int failed = 0;
  for (int r = 0; r < n; r++) {
    int st = 0;
    NCHECK(waitpid(pids[r], &st, 0) == pids[r]);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d failed (status %d)\n", r, st);
      failed = 1;
    }
  }
  return failed;
}
