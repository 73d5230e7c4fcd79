/* PyTorch's ProcessGroupNCCL over libmcast_nccl, from init to shutdown, one process per rank
 * (issue 17: destroy_process_group() failed with ncclInvalidArgument from ncclCommDestroy).
 * The calls, their order and their threads are PyTorch's (torch/csrc/distributed/c10d):
 *   init: ncclGetVersion; rank 0 ncclGetUniqueId, the id to the others (PyTorch: its store);
 *     ncclCommInitRankConfig with NCCL_CONFIG_INITIALIZER and config.blocking set (PyTorch sets it
 *     from TORCH_NCCL_USE_COMM_NONBLOCKING; non-blocking: ncclInProgress, then poll
 *     ncclCommGetAsyncError until ncclSuccess, NCCLComm::waitReady);
 *   the watchdog thread polls ncclCommGetAsyncError (NCCLComm::checkForNcclError) until shutdown
 *     joins it, also while the main thread finalizes;
 *   tensors registered with ncclCommRegister (TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK);
 *     all_reduce, all_gather_into_tensor, reduce_scatter_tensor, broadcast; with a fallback NCCL
 *     also a reduction mcast forwards (ncclProd);
 *   ProcessGroupNCCL::shutdown: ncclCommFinalize (ncclSuccess or ncclInProgress accepted), poll
 *     ncclCommGetAsyncError while ncclInProgress, ncclCommDeregister of every segment (the memory
 *     pool), join the watchdog, ncclCommDestroy (NCCLUtils.cpp:365) -- or, for abort,
 *     ncclCommDeregister then ncclCommAbort (NCCLComm::abort), here after a finalize.
 * With MCAST_NCCL_FALLBACK naming the fake NCCL this program is also linked with (as PyTorch's
 * libtorch_cuda.so is linked with libnccl.so.2), the fake's own calls to ncclCommGetAsyncError
 * during its destroy land in libmcast_nccl, as NCCL's do under LD_PRELOAD: they must go back.
 *   nccl_shutdown blocking|nonblocking destroy|abort fallback|nofallback */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl_check.h"

void fakeNcclStats(int *live, int *made, int *queries, int *collectives);

#define NRANKS 2

struct shared {
  pthread_barrier_t id_ready;
  pthread_barrier_t joined; /* every watchdog joined: a peer's abort is then no surprise */
  ncclUniqueId id;
};

struct watchdog {
  ncclComm_t comm;
  volatile int stop;
  long polls;
  ncclResult_t bad; /* first result other than ncclSuccess, else ncclSuccess */
};

static void nap(long ns) {
  struct timespec t = {0, ns};
  nanosleep(&t, NULL);
}

/* PyTorch's watchdog: checkForNcclError on every communicator, until shutdown. */
static void *watchdog_main(void *arg) {
  struct watchdog *w = arg;
  while (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE)) {
    ncclResult_t state = ncclInternalError;
    ncclResult_t r = ncclCommGetAsyncError(w->comm, &state);
    if ((r != ncclSuccess || state != ncclSuccess) && w->bad == ncclSuccess) w->bad = r != ncclSuccess ? r : state;
    __atomic_add_fetch(&w->polls, 1, __ATOMIC_RELEASE);
    nap(200 * 1000);
  }
  return NULL;
}

/* NCCLComm::waitReady: poll while ncclInProgress, then it must be ncclSuccess. */
static void wait_ready(ncclComm_t comm) {
  ncclResult_t state = ncclInProgress;
  for (int i = 0; state == ncclInProgress; i++) {
    NCHECK(i < 60 * 1000);
    nap(1000 * 1000);
    NCHECK_OK(ncclCommGetAsyncError(comm, &state));
  }
  NCHECK(state == ncclSuccess);
}

static float value(int r, size_t i) { return (float)((i * 7 + (size_t)r * 3) % 17) - 8.0f; }

static int rank_main(struct shared *sh, int r, int nonblocking, int abort_it, int fallback) {
  int version = 0;
  NCHECK_OK(ncclGetVersion(&version));
  NCHECK(version >= 22700);
  if (r == 0) NCHECK_OK(ncclGetUniqueId(&sh->id));
  int b = pthread_barrier_wait(&sh->id_ready);
  NCHECK(b == 0 || b == PTHREAD_BARRIER_SERIAL_THREAD);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = nonblocking ? 0 : 1;
  ncclComm_t comm = NULL;
  ncclResult_t init = ncclCommInitRankConfig(&comm, NRANKS, sh->id, r, &config);
  NCHECK(init == ncclSuccess || (nonblocking && init == ncclInProgress));
  NCHECK(comm != NULL);
  if (nonblocking) wait_ready(comm);

  struct watchdog w = {comm, 0, 0, ncclSuccess};
  pthread_t wd;
  NCHECK(pthread_create(&wd, NULL, watchdog_main, &w) == 0);

  const size_t count = 1024;
  float *send, *recv;
  NCHECK_OK(ncclMemAlloc((void **)&send, NRANKS * count * sizeof *send));
  NCHECK_OK(ncclMemAlloc((void **)&recv, NRANKS * count * sizeof *recv));
  void *hsend = NULL, *hrecv = NULL;
  NCHECK_OK(ncclCommRegister(comm, send, NRANKS * count * sizeof *send, &hsend));
  NCHECK_OK(ncclCommRegister(comm, recv, NRANKS * count * sizeof *recv, &hrecv));
  NCHECK(hsend != NULL && hrecv != NULL);

  for (size_t i = 0; i < NRANKS * count; i++) send[i] = value(r, i);
  NCHECK_OK(ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, NULL));
  NCHECK_OK(ncclCommFinalize(comm));
  for (size_t i = 0; i < count; i++) NCHECK(recv[i] == value(0, i) + value(1, i));
  NCHECK_OK(ncclAllGather(send, recv, count, ncclFloat32, comm, NULL));
  NCHECK_OK(ncclCommFinalize(comm));
  for (int q = 0; q < NRANKS; q++)
    for (size_t i = 0; i < count; i++) NCHECK(recv[(size_t)q * count + i] == value(q, i));
  NCHECK_OK(ncclReduceScatter(send, recv, count, ncclFloat32, ncclSum, comm, NULL));
  NCHECK_OK(ncclCommFinalize(comm));
  for (size_t i = 0; i < count; i++) NCHECK(recv[i] == value(0, (size_t)r * count + i) + value(1, (size_t)r * count + i));
  NCHECK_OK(ncclBroadcast(send, recv, count, ncclFloat32, 1, comm, NULL));
  if (fallback) NCHECK_OK(ncclAllReduce(send, send, count, ncclFloat32, ncclProd, comm, NULL));
  else NCHECK_RESULT(ncclAllReduce(send, send, count, ncclFloat32, ncclProd, comm, NULL), ncclInvalidUsage);

  /* ProcessGroupNCCL::shutdown (or abort) */
  long polled = __atomic_load_n(&w.polls, __ATOMIC_ACQUIRE);
  ncclResult_t fin = ncclCommFinalize(comm);
  NCHECK(fin == ncclSuccess || (nonblocking && fin == ncclInProgress));
  wait_ready(comm);
  /* The watchdog has asked at least once since the finalize began, before anything is
   * deregistered: on a loaded machine its thread may not have run at all yet. */
  for (int i = 0; __atomic_load_n(&w.polls, __ATOMIC_ACQUIRE) <= polled; i++) {
    NCHECK(i < 10 * 1000);
    nap(1000 * 1000);
  }
  for (size_t i = 0; i < count; i++) NCHECK(recv[i] == value(1, i));
  NCHECK_OK(ncclCommDeregister(comm, hsend));
  NCHECK_OK(ncclCommDeregister(comm, hrecv));
  __atomic_store_n(&w.stop, 1, __ATOMIC_RELEASE);
  NCHECK(pthread_join(wd, NULL) == 0);
  NCHECK_RESULT(w.bad, ncclSuccess);
  int live = -1, made = -1, queries = -1, collectives = -1;
  if (fallback) {
    fakeNcclStats(&live, &made, &queries, &collectives);
    NCHECK(live == 1 && made == 1 && collectives == 1);
  }
  b = pthread_barrier_wait(&sh->joined);
  NCHECK(b == 0 || b == PTHREAD_BARRIER_SERIAL_THREAD);
  if (abort_it) {
    ncclResult_t a = ncclCommAbort(comm);
    for (int i = 0; a == ncclInProgress; i++) {
      NCHECK(i < 60 * 1000);
      nap(1000 * 1000);
      NCHECK_OK(ncclCommGetAsyncError(comm, &a));
    }
    NCHECK_RESULT(a, ncclSuccess);
  } else {
    NCHECK_OK(ncclCommDestroy(comm));
  }
  if (fallback) {
    int queries_before = queries;
    fakeNcclStats(&live, &made, &queries, &collectives);
    /* The fake's communicator is gone, and its destroy/abort asked its own state through
     * ncclCommGetAsyncError, which came back to it from libmcast_nccl. */
    NCHECK(live == 0 && made == 1);
    NCHECK(queries > queries_before);
  }
  /* The communicator is gone: a call on it is the caller's bug, answered, not a crash. */
  ncclResult_t state;
  NCHECK_RESULT(ncclCommGetAsyncError(comm, &state), ncclInvalidArgument);
  NCHECK(strstr(ncclGetLastError(NULL), "not a live communicator") != NULL);
  NCHECK_RESULT(ncclCommDestroy(comm), ncclInvalidArgument);
  NCHECK_OK(ncclMemFree(send));
  NCHECK_OK(ncclMemFree(recv));
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: nccl_shutdown blocking|nonblocking destroy|abort fallback|nofallback\n");
    return 2;
  }
  int nonblocking = strcmp(argv[1], "nonblocking") == 0;
  int abort_it = strcmp(argv[2], "abort") == 0;
  int fallback = strcmp(argv[3], "fallback") == 0;
  const char *env = getenv("MCAST_NCCL_FALLBACK");
  NCHECK(fallback == (env != NULL && env[0] != '\0'));
  struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  NCHECK(sh != MAP_FAILED);
  pthread_barrierattr_t attr;
  NCHECK(pthread_barrierattr_init(&attr) == 0);
  NCHECK(pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED) == 0);
  NCHECK(pthread_barrier_init(&sh->id_ready, &attr, NRANKS) == 0);
  NCHECK(pthread_barrier_init(&sh->joined, &attr, NRANKS) == 0);
  pid_t pids[NRANKS];
  for (int r = 0; r < NRANKS; r++) {
    fflush(NULL);
    pids[r] = fork();
    NCHECK(pids[r] >= 0);
    if (pids[r] == 0) {
      alarm(120); /* a rank left waiting by a failed peer fails instead of hanging */
      _exit(rank_main(sh, r, nonblocking, abort_it, fallback));
    }
  }
  int failed = 0;
  for (int r = 0; r < NRANKS; r++) {
    int st = 0;
    NCHECK(waitpid(pids[r], &st, 0) == pids[r]);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d failed (status %d)\n", r, st);
      failed = 1;
    }
  }
  if (!failed) { /* a rank killed inside a barrier would leave it busy */
    NCHECK(pthread_barrier_destroy(&sh->id_ready) == 0);
    NCHECK(pthread_barrier_destroy(&sh->joined) == 0);
  }
  NCHECK(munmap(sh, sizeof *sh) == 0);
  return failed;
}
