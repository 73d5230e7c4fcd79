/* The NCCL API over mcast (libmcast_nccl), one process, on the simulator (4 devices): what a
 * program written for NCCL does, checked against host references.
 *   nccl_api args          NCCL's documented results for bad arguments, errors, versions
 *   nccl_api collectives   ncclCommInitAll(4): all four collectives in and out of place, in groups,
 *                          on ncclMemAlloc memory, registered and not; ncclBcast
 *   nccl_api split         ncclCommSplit into two colors with reversed keys, NOCOLOR, sub-team
 *                          all-reduce
 *   nccl_api abort         async error, ncclCommAbort, a non-blocking ncclCommInitRankConfig
 * On the simulator device memory is host memory, so results are read directly after
 * ncclCommFinalize (which returns once the work in flight is complete). */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "nccl_check.h"

#define NDEV 4

/* ncclMemAlloc allocates on MCAST_SIM_DEVICE when the thread has no communicator of its own. */
static void *alloc_on(int dev, size_t bytes) {
  char d[16];
  void *p = NULL;
  snprintf(d, sizeof d, "%d", dev);
  setenv("MCAST_SIM_DEVICE", d, 1);
  NCHECK_OK(ncclMemAlloc(&p, bytes));
  unsetenv("MCAST_SIM_DEVICE");
  NCHECK(p != NULL);
  return p;
}

static void finalize_all(ncclComm_t *comms, int n) {
  for (int r = 0; r < n; r++) NCHECK_OK(ncclCommFinalize(comms[r]));
}

static float value(int r, size_t i) { return (float)((int)((i * 7 + (size_t)r * 3) % 11) - 5); }

static int args(void) {
  int v = 0;
  NCHECK_OK(ncclGetVersion(&v));
  NCHECK(v == NCCL_VERSION_CODE);
  NCHECK_RESULT(ncclGetVersion(NULL), ncclInvalidArgument);
  NCHECK(ncclGetLastError(NULL)[0] != '\0');
  for (int r = 0; r <= ncclNumResults; r++) NCHECK(ncclGetErrorString((ncclResult_t)r) != NULL);

  ncclUniqueId id;
  NCHECK_RESULT(ncclGetUniqueId(NULL), ncclInvalidArgument);
  NCHECK_OK(ncclGetUniqueId(&id));
  ncclComm_t comm = NULL;
  NCHECK_RESULT(ncclCommInitRank(NULL, 1, id, 0), ncclInvalidArgument);
  NCHECK_RESULT(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument);
  NCHECK_RESULT(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
  NCHECK_RESULT(ncclCommInitRank(&comm, 2, id, -1), ncclInvalidArgument);
  NCHECK(comm == NULL);
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.magic = 0;
  NCHECK_RESULT(ncclCommInitRankConfig(&comm, 1, id, 0, &bad), ncclInvalidArgument);
  NCHECK(strstr(ncclGetLastError(NULL), "NCCL_CONFIG_INITIALIZER") != NULL);

  /* NULL communicator everywhere. */
  int x = -7;
  NCHECK_RESULT(ncclCommCount(NULL, &x), ncclInvalidArgument);
  NCHECK_RESULT(ncclCommCuDevice(NULL, &x), ncclInvalidArgument);
  NCHECK_RESULT(ncclCommUserRank(NULL, &x), ncclInvalidArgument);
  NCHECK(x == -7);
  NCHECK_RESULT(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, NULL, NULL), ncclInvalidArgument);
  NCHECK_RESULT(ncclCommFinalize(NULL), ncclInvalidArgument);
  NCHECK_OK(ncclCommDestroy(NULL));
  NCHECK_OK(ncclCommAbort(NULL));

  /* A team of one. */
  NCHECK_OK(ncclCommInitRank(&comm, 1, id, 0));
  NCHECK_OK(ncclCommCount(comm, &x));
  NCHECK(x == 1);
  NCHECK_RESULT(ncclCommCount(comm, NULL), ncclInvalidArgument);
  float *buf = alloc_on(0, 1024);
  NCHECK_RESULT(ncclAllReduce(buf, buf, 4, (ncclDataType_t)99, ncclSum, comm, NULL), ncclInvalidArgument);
  NCHECK(strstr(ncclGetLastError(NULL), "99") != NULL);
  NCHECK_RESULT(ncclAllReduce(buf, buf, 4, ncclFloat, (ncclRedOp_t)-5, comm, NULL), ncclInvalidArgument);
  NCHECK_RESULT(ncclBroadcast(buf, buf, 4, ncclFloat, 1, comm, NULL), ncclInvalidArgument);
  NCHECK(strstr(ncclGetLastError(NULL), "root") != NULL);
  /* Not served, no fallback: ncclInvalidUsage naming the call and the variable. */
  NCHECK_RESULT(ncclAllReduce(buf, buf, 4, ncclFloat, ncclProd, comm, NULL), ncclInvalidUsage);
  NCHECK(strstr(ncclGetLastError(NULL), "ncclProd") != NULL);
  NCHECK(strstr(ncclGetLastError(NULL), "MCAST_NCCL_FALLBACK") != NULL);
  NCHECK_RESULT(ncclAllReduce(buf, buf, 4, ncclInt8, ncclSum, comm, NULL), ncclInvalidUsage);
  NCHECK_RESULT(ncclReduce(buf, buf, 4, ncclFloat, ncclSum, 0, comm, NULL), ncclInvalidUsage);
  NCHECK_RESULT(ncclSend(buf, 4, ncclFloat, 0, comm, NULL), ncclInvalidUsage);
  NCHECK(strstr(ncclGetLastError(NULL), "ncclSend") != NULL);
  NCHECK_RESULT(ncclSend(buf, 4, ncclFloat, 3, comm, NULL), ncclInvalidArgument);
  /* Served on a team of one: the identity. */
  for (int i = 0; i < 4; i++) buf[i] = (float)i;
  NCHECK_OK(ncclAllReduce(buf, buf + 4, 4, ncclFloat, ncclSum, comm, NULL));
  NCHECK_OK(ncclCommFinalize(comm));
  for (int i = 0; i < 4; i++) NCHECK(buf[4 + i] == (float)i);
  /* Count 0 is a no-op. */
  NCHECK_OK(ncclAllReduce(buf, buf, 0, ncclFloat, ncclSum, comm, NULL));
  /* Freed memory is refused once; a destroyed communicator is an invalid argument. */
  NCHECK_OK(ncclMemFree(buf));
  NCHECK_RESULT(ncclMemFree(buf), ncclInvalidArgument);
  NCHECK_OK(ncclMemFree(NULL));
  NCHECK_RESULT(ncclMemAlloc(NULL, 16), ncclInvalidArgument);
  NCHECK_OK(ncclCommDestroy(comm));
  NCHECK_RESULT(ncclCommCount(comm, &x), ncclInvalidArgument);
  NCHECK_RESULT(ncclCommDestroy(comm), ncclInvalidArgument);
  NCHECK_RESULT(ncclGroupEnd(), ncclInvalidUsage);
  return 0;
}

/* Every collective on ncclCommInitAll(NDEV) communicators, in groups, in and out of place. */
/* registered: 0 plain ncclMemAlloc memory, 1 ncclCommRegister, 2 ncclCommWindowRegister
 * (NCCL_WIN_COLL_SYMMETRIC windows, served as mcast registrations). */
static int collectives(int registered) {
  ncclComm_t comms[NDEV];
  int devs[NDEV] = {3, 2, 1, 0};
  NCHECK_RESULT(ncclCommInitAll(NULL, NDEV, devs), ncclInvalidArgument);
  NCHECK_OK(ncclCommInitAll(comms, NDEV, devs));
  for (int r = 0; r < NDEV; r++) {
    int n = 0, d = -1, rank = -1;
    NCHECK_OK(ncclCommCount(comms[r], &n));
    NCHECK_OK(ncclCommCuDevice(comms[r], &d));
    NCHECK_OK(ncclCommUserRank(comms[r], &rank));
    NCHECK(n == NDEV && d == devs[r] && rank == r);
  }
  const size_t count = 10007; /* odd: tails on every path */
  const size_t bytes = NDEV * count * sizeof(float);
  float *send[NDEV], *recv[NDEV];
  void *handles[2 * NDEV];
  ncclWindow_t wins[2 * NDEV];
  for (int r = 0; r < NDEV; r++) {
    send[r] = alloc_on(devs[r], bytes);
    recv[r] = alloc_on(devs[r], bytes);
  }
  if (registered == 1) {
    NCHECK_OK(ncclGroupStart());
    for (int r = 0; r < NDEV; r++) {
      NCHECK_OK(ncclCommRegister(comms[r], send[r], bytes, &handles[2 * r]));
      NCHECK_OK(ncclCommRegister(comms[r], recv[r], bytes, &handles[2 * r + 1]));
    }
    NCHECK_OK(ncclGroupEnd());
  } else if (registered == 2) {
    NCHECK_RESULT(ncclCommWindowRegister(comms[0], send[0], bytes, &wins[0], 0x40), ncclInvalidArgument);
    NCHECK_RESULT(ncclCommWindowRegister(comms[0], send[0], bytes, NULL, NCCL_WIN_COLL_SYMMETRIC),
                  ncclInvalidArgument);
    NCHECK_OK(ncclGroupStart());
    for (int r = 0; r < NDEV; r++) {
      NCHECK_OK(ncclCommWindowRegister(comms[r], send[r], bytes, &wins[2 * r], NCCL_WIN_COLL_SYMMETRIC));
      NCHECK_OK(ncclCommWindowRegister(comms[r], recv[r], bytes, &wins[2 * r + 1], NCCL_WIN_DEFAULT));
    }
    NCHECK_OK(ncclGroupEnd());
  }
  for (int inplace = 0; inplace <= 1; inplace++) {
    /* all-reduce (sum), out of place or in place */
    for (int r = 0; r < NDEV; r++)
      for (size_t i = 0; i < count; i++) (inplace ? recv : send)[r][i] = value(r, i);
    NCHECK_OK(ncclGroupStart());
    for (int r = 0; r < NDEV; r++)
      NCHECK_OK(ncclAllReduce(inplace ? recv[r] : send[r], recv[r], count, ncclFloat, ncclSum, comms[r], NULL));
    NCHECK_OK(ncclGroupEnd());
    finalize_all(comms, NDEV);
    for (int r = 0; r < NDEV; r++)
      for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int q = 0; q < NDEV; q++) want += value(q, i);
        NCHECK(recv[r][i] == want);
      }
    /* reduce-scatter (max): rank r gets block r */
    for (int r = 0; r < NDEV; r++)
      for (size_t i = 0; i < NDEV * count; i++) (inplace ? recv : send)[r][i] = value(r, i);
    NCHECK_OK(ncclGroupStart());
    for (int r = 0; r < NDEV; r++) {
      const float *s = inplace ? recv[r] : send[r];
      float *d = inplace ? recv[r] + (size_t)r * count : recv[r];
      NCHECK_OK(ncclReduceScatter(s, d, count, ncclFloat, ncclMax, comms[r], NULL));
    }
    NCHECK_OK(ncclGroupEnd());
    finalize_all(comms, NDEV);
    for (int r = 0; r < NDEV; r++) {
      const float *got = inplace ? recv[r] + (size_t)r * count : recv[r];
      for (size_t i = 0; i < count; i++) {
        float want = -1e30f;
        for (int q = 0; q < NDEV; q++) want = value(q, (size_t)r * count + i) > want ? value(q, (size_t)r * count + i) : want;
        NCHECK(got[i] == want);
      }
    }
    /* all-gather: block q of every rank's recv is rank q's send */
    for (int r = 0; r < NDEV; r++) {
      float *s = inplace ? recv[r] + (size_t)r * count : send[r];
      for (size_t i = 0; i < count; i++) s[i] = value(r, i) + 100.0f * (float)r;
    }
    NCHECK_OK(ncclGroupStart());
    for (int r = 0; r < NDEV; r++) {
      const float *s = inplace ? recv[r] + (size_t)r * count : send[r];
      NCHECK_OK(ncclAllGather(s, recv[r], count, ncclFloat, comms[r], NULL));
    }
    NCHECK_OK(ncclGroupEnd());
    finalize_all(comms, NDEV);
    for (int r = 0; r < NDEV; r++)
      for (int q = 0; q < NDEV; q++)
        for (size_t i = 0; i < count; i++) NCHECK(recv[r][(size_t)q * count + i] == value(q, i) + 100.0f * (float)q);
    /* broadcast from rank 2 (ncclBcast in place, ncclBroadcast out of place), int32 */
    int32_t *si[NDEV], *ri[NDEV];
    for (int r = 0; r < NDEV; r++) {
      si[r] = (int32_t *)send[r];
      ri[r] = (int32_t *)recv[r];
      for (size_t i = 0; i < count; i++) (inplace ? ri : si)[r][i] = (int32_t)(i * 31 + (size_t)r);
    }
    NCHECK_OK(ncclGroupStart());
    for (int r = 0; r < NDEV; r++) {
      if (inplace)
        NCHECK_OK(ncclBcast(ri[r], count, ncclInt32, 2, comms[r], NULL));
      else
        NCHECK_OK(ncclBroadcast(si[r], ri[r], count, ncclInt32, 2, comms[r], NULL));
    }
    NCHECK_OK(ncclGroupEnd());
    finalize_all(comms, NDEV);
    for (int r = 0; r < NDEV; r++)
      for (size_t i = 0; i < count; i++) NCHECK(ri[r][i] == (int32_t)(i * 31 + 2));
  }
  if (registered == 1) {
    for (int r = 0; r < NDEV; r++) {
      /* Registered memory is in use: it cannot be freed until deregistered. */
      NCHECK(ncclMemFree(send[r]) != ncclSuccess);
      NCHECK_OK(ncclCommDeregister(comms[r], handles[2 * r]));
      NCHECK_OK(ncclCommDeregister(comms[r], handles[2 * r + 1]));
      NCHECK_RESULT(ncclCommDeregister(comms[r], handles[2 * r]), ncclInvalidArgument);
    }
  } else if (registered == 2) {
    for (int r = 0; r < NDEV; r++) {
      /* Window memory is registered: it cannot be freed until the window is deregistered. */
      NCHECK(ncclMemFree(send[r]) != ncclSuccess);
      NCHECK_OK(ncclCommWindowDeregister(comms[r], wins[2 * r]));
      NCHECK_OK(ncclCommWindowDeregister(comms[r], wins[2 * r + 1]));
      NCHECK_RESULT(ncclCommWindowDeregister(comms[r], wins[2 * r]), ncclInvalidArgument);
    }
  }
  for (int r = 0; r < NDEV; r++) {
    NCHECK_OK(ncclMemFree(send[r]));
    NCHECK_OK(ncclMemFree(recv[r]));
    NCHECK_OK(ncclCommDestroy(comms[r]));
  }
  return 0;
}

/* ncclCommSplit: colors r % 2, keys reversing the order; rank 3 with NOCOLOR. */
static int split(void) {
  ncclComm_t comms[NDEV], sub[NDEV];
  NCHECK_OK(ncclCommInitAll(comms, NDEV, NULL));
  NCHECK_OK(ncclGroupStart());
  for (int r = 0; r < NDEV; r++) {
    int color = r == 3 ? NCCL_SPLIT_NOCOLOR : r % 2;
    NCHECK_OK(ncclCommSplit(comms[r], color, -r, &sub[r], NULL));
  }
  NCHECK_OK(ncclGroupEnd());
  NCHECK(sub[3] == NULL);
  int n, rank;
  /* color 0: ranks 0 and 2, keys 0 and -2: old rank 2 is new rank 0 */
  NCHECK_OK(ncclCommCount(sub[0], &n));
  NCHECK(n == 2);
  NCHECK_OK(ncclCommUserRank(sub[0], &rank));
  NCHECK(rank == 1);
  NCHECK_OK(ncclCommUserRank(sub[2], &rank));
  NCHECK(rank == 0);
  NCHECK_OK(ncclCommCount(sub[1], &n));
  NCHECK(n == 1);
  int32_t *buf[NDEV];
  for (int r = 0; r < 3; r++) {
    buf[r] = alloc_on(r, 64 * sizeof(int32_t));
    for (int i = 0; i < 64; i++) buf[r][i] = r * 1000 + i;
  }
  NCHECK_OK(ncclGroupStart());
  for (int r = 0; r < 3; r++) NCHECK_OK(ncclAllReduce(buf[r], buf[r], 64, ncclInt32, ncclSum, sub[r], NULL));
  NCHECK_OK(ncclGroupEnd());
  for (int r = 0; r < 3; r++) NCHECK_OK(ncclCommFinalize(sub[r]));
  for (int i = 0; i < 64; i++) {
    NCHECK(buf[0][i] == 2000 + 2 * i && buf[2][i] == 2000 + 2 * i);
    NCHECK(buf[1][i] == 1000 + i);
  }
  for (int r = 0; r < 3; r++) {
    NCHECK_OK(ncclMemFree(buf[r]));
    NCHECK_OK(ncclCommDestroy(sub[r]));
  }
  for (int r = 0; r < NDEV; r++) NCHECK_OK(ncclCommDestroy(comms[r]));
  return 0;
}

struct nb_rank {
  ncclUniqueId id;
  int rank;
  ncclComm_t comm;
  ncclResult_t first;
};

static void *nonblocking_init(void *arg) {
  struct nb_rank *a = arg;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  a->first = ncclCommInitRankConfig(&a->comm, 2, a->id, a->rank, &config);
  return NULL;
}

static int abort_test(void) {
  ncclComm_t comms[2];
  NCHECK_OK(ncclCommInitAll(comms, 2, NULL));
  ncclResult_t e = ncclInternalError;
  NCHECK_OK(ncclCommGetAsyncError(comms[0], &e));
  NCHECK(e == ncclSuccess);
  NCHECK_RESULT(ncclCommGetAsyncError(comms[0], NULL), ncclInvalidArgument);
  /* Abort ends the communicator at once; it is gone afterwards, and its peer reports the
   * abort as an asynchronous error. */
  NCHECK_OK(ncclCommAbort(comms[1]));
  NCHECK_RESULT(ncclCommCount(comms[1], &(int){0}), ncclInvalidArgument);
  NCHECK_OK(ncclCommGetAsyncError(comms[0], &e));
  NCHECK_OK(ncclCommAbort(comms[0]));

  /* Non-blocking creation from two threads: ncclInProgress, then success. */
  struct nb_rank ranks[2];
  pthread_t t[2];
  ncclUniqueId id;
  NCHECK_OK(ncclGetUniqueId(&id));
  for (int r = 0; r < 2; r++) {
    ranks[r].id = id;
    ranks[r].rank = r;
    ranks[r].comm = NULL;
    NCHECK(pthread_create(&t[r], NULL, nonblocking_init, &ranks[r]) == 0);
  }
  for (int r = 0; r < 2; r++) NCHECK(pthread_join(t[r], NULL) == 0);
  for (int r = 0; r < 2; r++) {
    NCHECK(ranks[r].first == ncclInProgress || ranks[r].first == ncclSuccess);
    NCHECK(ranks[r].comm != NULL);
    for (int spins = 0;; spins++) {
      NCHECK_OK(ncclCommGetAsyncError(ranks[r].comm, &e));
      if (e != ncclInProgress) break;
      NCHECK(spins < 100000);
      struct timespec ms = {0, 1000000};
      nanosleep(&ms, NULL);
    }
    NCHECK(e == ncclSuccess);
  }
  for (int r = 0; r < 2; r++) NCHECK_OK(ncclCommDestroy(ranks[r].comm));
  return 0;
}

int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "";
  if (strcmp(what, "args") == 0) return args();
  if (strcmp(what, "collectives") == 0) return collectives(0);
  if (strcmp(what, "registered") == 0) return collectives(1);
  if (strcmp(what, "windows") == 0) return collectives(2);
  if (strcmp(what, "split") == 0) return split();
  if (strcmp(what, "abort") == 0) return abort_test();
  fprintf(stderr, "usage: nccl_api args|collectives|registered|windows|split|abort\n");
  return 2;
}
