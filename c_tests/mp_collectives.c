/* One process per rank (mcast_get_unique_id, mcast_team_init_rank): the parent forks N ranks,
 * rank 0 makes the id and shares it (shared memory, a process-shared barrier), and each rank
 * joins the team and runs its part.
 *   mp_collectives N collectives   every collective checked on every rank
 *   mp_collectives N absent        rank N-1 exits without joining: the others get
 *                                  MCAST_ERROR_TIMEOUT within timeout_ms
 *   mp_collectives N killed        rank N-1 is killed (SIGKILL) after the team is built, before
 *                                  the collective: the others get MCAST_ERROR_TIMEOUT from
 *                                  mcast_synchronize, and destroy everything without a leak
 *   mp_collectives N fault         rank 1 alone fails a buffer allocation (injected): every
 *                                  rank gets an error naming rank 1
 *   mp_collectives N oob           as collectives, the team made with mcast_team_init_oob over
 *                                  an allgather in shared memory (a process-shared barrier)
 *   mp_collectives N registered    every rank registers mcast_mem_alloc memory (mcast_buffer_register):
 *                                  all-reduce and all-gather into registered buffers, the
 *                                  pointer form on the registered pointers, free, no leak
 *   mp_collectives N registered-oob  as registered, the team made with mcast_team_init_oob
 *   mp_collectives N register-bad  rank 1 alone registers host memory: every rank gets
 *                                  MCAST_ERROR_INVALID_ARGUMENT naming rank 1, nothing is left
 *   mp_collectives N cross-host    as collectives, on simulated hosts (MCAST_MP_HOSTS unset: 2);
 *                                  where fabric handles are unavailable setup must fail on every
 *                                  rank with MCAST_ERROR_NOT_SUPPORTED naming rank, host and
 *                                  reason (MCAST_MP_EXPECT=not_supported demands that outcome)
 *   mp_collectives N domains       two NVLink domains (MCAST_DOMAIN=A for the first half of the
 *                                  ranks, B for the rest; the engine between them from MCAST_NET):
 *                                  an all-reduce checked, then domain B passes half the count:
 *                                  every rank's call returns MCAST_ERROR_INVALID_ARGUMENT naming
 *                                  both counts and ranks, synchronize and mcast_team_get_error
 *                                  keep it, and no rank's buffer is written. Needs an engine and
 *                                  (on CUDA) a GPU per rank; without, exit 77 (skipped)
 * MCAST_MP_HOSTS=H puts rank r on simulated host "host<r % H>" (MCAST_HOST_ID).
 * The backend and multicast mode come from the environment (MCAST_BACKEND, MCAST_MULTICAST);
 * on CUDA, rank r uses device r % count, and without a device the test exits 77 (skipped). */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define TIMEOUT_MS 3000

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static mcast_context_t context(void) {
  mcast_config_t config;
  mcast_context_t ctx = {0};
  mcast_config_init(&config);
  config.timeout_ms = TIMEOUT_MS;
  config.retry_backoff_ms = 1;
  mcast_status_t s = mcast_context_create(&config, &ctx);
  if (s == MCAST_ERROR_DRIVER_UNAVAILABLE) exit(77);
  CHECK_OK(s);
  return ctx;
}

static void collectives(mcast_team_t team, int n, int r) {
  const size_t count = 100003;
  mcast_buffer_t buf;
  float *f = malloc(count * sizeof *f);
  int32_t *x = malloc((size_t)n * count * sizeof *x);
  unsigned char *bytes = malloc((size_t)n * 4099);
  CHECK(f && x && bytes);
  CHECK_OK(mcast_buffer_alloc(team, (size_t)n * count * 8, &buf));
  /* Another process's rank is refused. */
  void *p;
  CHECK_STATUS(mcast_buffer_local_ptr(buf, (r + 1) % n, &p), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_synchronize(team, (r + 1) % n, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  /* All-reduce, f32 sum: exact on small integers. */
  for (size_t i = 0; i < count; i++) f[i] = (float)((r + 1) * (int)(i % 7));
  CHECK_OK(mcast_buffer_write(buf, r, 0, f, count * sizeof *f));
  CHECK_OK(mcast_all_reduce(buf, r, 0, count, MCAST_FLOAT32, MCAST_SUM, NULL));
  CHECK_OK(mcast_synchronize(team, r, NULL));
  CHECK_OK(mcast_buffer_read(buf, r, 0, f, count * sizeof *f));
  for (size_t i = 0; i < count; i++) CHECK(f[i] == (float)((int)(i % 7) * n * (n + 1) / 2));
  /* All-reduce, i32 max. */
  for (size_t i = 0; i < count; i++) x[i] = (int32_t)((i * 13 + (size_t)r * 5) % 101) - 50;
  CHECK_OK(mcast_buffer_write(buf, r, 0, x, count * sizeof *x));
  CHECK_OK(mcast_all_reduce(buf, r, 0, count, MCAST_INT32, MCAST_MAX, NULL));
  CHECK_OK(mcast_synchronize(team, r, NULL));
  CHECK_OK(mcast_buffer_read(buf, r, 0, x, count * sizeof *x));
  for (size_t i = 0; i < count; i++) {
    int32_t want = -1000;
    for (int q = 0; q < n; q++) {
      int32_t v = (int32_t)((i * 13 + (size_t)q * 5) % 101) - 50;
      if (v > want) want = v;
    }
    CHECK(x[i] == want);
  }
  /* Reduce-scatter, i32 sum: rank r keeps block r. */
  for (size_t i = 0; i < (size_t)n * count; i++) x[i] = (int32_t)(i % 9) + r;
  CHECK_OK(mcast_buffer_write(buf, r, 0, x, (size_t)n * count * sizeof *x));
  CHECK_OK(mcast_reduce_scatter(buf, r, 0, count, MCAST_INT32, MCAST_SUM, NULL));
  CHECK_OK(mcast_synchronize(team, r, NULL));
  CHECK_OK(mcast_buffer_read(buf, r, (size_t)r * count * sizeof *x, x, count * sizeof *x));
  for (size_t i = 0; i < count; i++) {
    size_t g = (size_t)r * count + i;
    CHECK(x[i] == (int32_t)(g % 9) * n + n * (n - 1) / 2);
  }
  /* Broadcast from the last rank, then all-gather. */
  const size_t block = 4099;
  for (size_t i = 0; i < (size_t)n * block; i++) bytes[i] = (unsigned char)(i * 31 + (size_t)r * 7);
  CHECK_OK(mcast_buffer_write(buf, r, 0, bytes, (size_t)n * block));
  CHECK_OK(mcast_broadcast(buf, r, n - 1, 0, block, NULL));
  CHECK_OK(mcast_synchronize(team, r, NULL));
  CHECK_OK(mcast_buffer_read(buf, r, 0, bytes, block));
  for (size_t i = 0; i < block; i++) CHECK(bytes[i] == (unsigned char)(i * 31 + (size_t)(n - 1) * 7));
  for (size_t i = 0; i < (size_t)n * block; i++) bytes[i] = (unsigned char)(i * 31 + (size_t)r * 7);
  CHECK_OK(mcast_buffer_write(buf, r, 0, bytes, (size_t)n * block));
  CHECK_OK(mcast_all_gather(buf, r, 0, block, NULL));
  CHECK_OK(mcast_synchronize(team, r, NULL));
  CHECK_OK(mcast_buffer_read(buf, r, 0, bytes, (size_t)n * block));
  for (size_t i = 0; i < (size_t)n * block; i++)
    CHECK(bytes[i] == (unsigned char)(i * 31 + (i / block) * 7));
  CHECK_OK(mcast_buffer_free(buf));
  free(f);
  free(x);
  free(bytes);
}

/* Registered memory of every rank: mcast_mem_alloc, mcast_buffer_register, out of place and
   the pointer form on the registered pointers; the memory outlives the registration. */
static void registered(mcast_context_t ctx, mcast_team_t team, int n, int r, int device) {
  const size_t count = 50021, block = count * sizeof(int32_t);
  void *ps = NULL, *pr = NULL;
  CHECK_OK(mcast_mem_alloc(ctx, device, (size_t)n * block, &ps));
  CHECK_OK(mcast_mem_alloc(ctx, device, (size_t)n * block, &pr));
  mcast_buffer_t send, recv;
  CHECK_OK(mcast_buffer_register(team, &ps, (size_t)n * block, &send));
  CHECK_OK(mcast_buffer_register(team, &pr, (size_t)n * block, &recv));
  CHECK_STATUS(mcast_mem_free(ctx, ps), MCAST_ERROR_IN_USE);
  int32_t *x = malloc((size_t)n * block);
  CHECK(x);
  for (size_t i = 0; i < count; i++) x[i] = (int32_t)((size_t)(r + 1) * (i % 11));
  CHECK_OK(mcast_buffer_write(send, r, 0, x, block));
  CHECK_OK(mcast_all_reduce_into(send, 0, recv, 0, r, count, MCAST_INT32, MCAST_SUM, NULL));
  CHECK_OK(mcast_synchronize(team, r, NULL));
  CHECK_OK(mcast_buffer_read(recv, r, 0, x, block));
  for (size_t i = 0; i < count; i++) CHECK(x[i] == (int32_t)(i % 11) * n * (n + 1) / 2);
  /* All-gather of every rank's first block. */
  for (size_t i = 0; i < count; i++) x[i] = (int32_t)(i % 5) + 100 * r;
  CHECK_OK(mcast_buffer_write(send, r, 0, x, block));
  CHECK_OK(mcast_all_gather_into(send, 0, recv, 0, r, block, NULL));
  CHECK_OK(mcast_synchronize(team, r, NULL));
  CHECK_OK(mcast_buffer_read(recv, r, 0, x, (size_t)n * block));
  for (size_t i = 0; i < (size_t)n * count; i++) CHECK(x[i] == (int32_t)(i % count % 5) + 100 * (int32_t)(i / count));
  /* The pointer form on the registered pointers, in place. */
  for (size_t i = 0; i < count; i++) x[i] = (int32_t)(i % 3) - r;
  CHECK_OK(mcast_buffer_write(send, r, 0, x, block));
  CHECK_OK(mcast_team_all_reduce(team, r, ps, ps, count, MCAST_INT32, MCAST_SUM, NULL));
  CHECK_OK(mcast_synchronize(team, r, NULL));
  CHECK_OK(mcast_buffer_free(recv));
  CHECK_OK(mcast_buffer_free(send));
  CHECK_OK(mcast_mem_free(ctx, pr));
  /* The memory stays with its owner: read it through a fresh registration. */
  CHECK_OK(mcast_buffer_register(team, &ps, block, &send));
  CHECK_OK(mcast_buffer_read(send, r, 0, x, block));
  for (size_t i = 0; i < count; i++) CHECK(x[i] == (int32_t)(i % 3) * n - n * (n - 1) / 2);
  CHECK_OK(mcast_buffer_free(send));
  CHECK_OK(mcast_mem_free(ctx, ps));
  free(x);
}

/* The oob role's allgather: shared memory made before fork, a process-shared barrier. */
struct shared_gather {
  pthread_barrier_t barrier;
  int n;
  mcast_unique_id_t id; /* made by rank 0, read by the others after the barrier */
  unsigned char data[72 * 1024];
};
/* Two NVLink domains that disagree (see the usage at the top). */
static void domains(mcast_team_t team, int n, int r) {
  enum { N = 1024 };
  static float before[N], after[N];
  const int in_b = r >= n / 2;
  mcast_buffer_t buf;
  CHECK_OK(mcast_buffer_alloc(team, sizeof before, &buf));
  for (int i = 0; i < N; i++) before[i] = (float)((r + 1) * (i % 13));
  CHECK_OK(mcast_buffer_write(buf, r, 0, before, sizeof before));
  CHECK_OK(mcast_all_reduce(buf, r, 0, N, MCAST_FLOAT32, MCAST_SUM, NULL));
  CHECK_OK(mcast_synchronize(team, r, NULL));
  CHECK_OK(mcast_buffer_read(buf, r, 0, after, sizeof after));
  for (int i = 0; i < N; i++) CHECK(after[i] == (float)((i % 13) * n * (n + 1) / 2));
  for (int i = 0; i < N; i++) before[i] = (float)(r * N + i);
  CHECK_OK(mcast_buffer_write(buf, r, 0, before, sizeof before));
  char says[96];
  snprintf(says, sizeof says, "ranks disagree on count: rank 0 has %d, rank %d has %d", N, n / 2, N / 2);
  mcast_status_t s = mcast_all_reduce(buf, r, 0, in_b ? N / 2 : N, MCAST_FLOAT32, MCAST_SUM, NULL);
  if (s != MCAST_ERROR_INVALID_ARGUMENT || strstr(mcast_last_error(), says) == NULL) {
    fprintf(stderr, "rank %d: want INVALID_ARGUMENT with \"%s\", got %s: %s\n", r, says, mcast_status_string(s),
            mcast_last_error());
    exit(1);
  }
  CHECK_STATUS(mcast_synchronize(team, r, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), says) != NULL);
  mcast_status_t kept = MCAST_SUCCESS;
  CHECK_OK(mcast_team_get_error(team, &kept));
  CHECK(kept == MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_OK(mcast_buffer_read(buf, r, 0, after, sizeof after));
  CHECK(memcmp(before, after, sizeof before) == 0);
  CHECK_OK(mcast_buffer_free(buf));
  printf("rank %d: caught across domains: %s\n", r, says);
  fflush(stdout);
}

static struct shared_gather *shared;
static int my_rank;

static int shm_allgather(const void *send, void *recv, size_t bytes, void *user) {
  struct shared_gather *g = user;
  if (bytes * 72 > sizeof g->data) return 1;
  memcpy(g->data + (size_t)my_rank * bytes, send, bytes);
  pthread_barrier_wait(&g->barrier);
  memcpy(recv, g->data, bytes * (size_t)g->n);
  pthread_barrier_wait(&g->barrier);
  return 0;
}

/* Roles whose team is made with mcast_team_init_oob. */
static int is_oob(const char *role) { return strcmp(role, "oob") == 0 || strcmp(role, "registered-oob") == 0; }

static mcast_status_t join(const char *role, mcast_context_t ctx, mcast_unique_id_t id, int n, int r, int device,
                           mcast_team_t *team) {
  if (!is_oob(role)) return mcast_team_init_rank(ctx, id, n, r, device, team);
  /* The allgather writes this rank's block, waits, copies all blocks out, waits again. */
  mcast_oob_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.allgather = shm_allgather;
  o.user = shared;
  o.rank = r;
  o.nranks = n;
  return mcast_team_init_oob(ctx, &o, device, team);
}

static int rank_main(const char *role, int n, int r) {
  /* Rank 0 makes the id (as with MPI: rank 0 makes it, MPI_Bcast moves it); the parent makes
     none, so no process forks while the id's listener threads run. */
  if (r == 0 && !is_oob(role)) CHECK_OK(mcast_get_unique_id(&shared->id));
  pthread_barrier_wait(&shared->barrier);
  mcast_unique_id_t id = shared->id;
  if (strcmp(role, "absent") == 0 && r == n - 1) _exit(3);
  const char *hosts = getenv("MCAST_MP_HOSTS");
  int nhosts = hosts ? atoi(hosts) : (strcmp(role, "cross-host") == 0 ? 2 : 0);
  if (nhosts > 0) {
    char host[32];
    snprintf(host, sizeof host, "host%d", r % nhosts);
    setenv("MCAST_HOST_ID", host, 1);
  }
  if (strcmp(role, "fault") == 0 && r == 1) setenv("MCAST_SIM_FAULTS", "cuMemCreate=INVALID_VALUE@3", 1);
  const int two_domains = strcmp(role, "domains") == 0;
  if (two_domains) setenv("MCAST_DOMAIN", r < n / 2 ? "A" : "B", 1);
  mcast_context_t ctx = context();
  int count = 0;
  CHECK_OK(mcast_device_count(ctx, &count));
  CHECK(count > 0);
  const char *backend = getenv("MCAST_BACKEND");
  if (two_domains && backend && strcmp(backend, "cuda") == 0 && count < n) {
    /* NCCL's rails need a GPU per rank (every rank sees the same count and skips). */
    if (r == 0) {
      printf("domains: %d GPU(s) for %d ranks: skipped\n", count, n);
      fflush(stdout);
    }
    CHECK_OK(mcast_context_destroy(ctx));
    return 77;
  }
  mcast_team_t team = {0};
  double t0 = now_s();
  if (strcmp(role, "absent") == 0) {
    CHECK_STATUS(mcast_team_init_rank(ctx, id, n, r, r % count, &team), MCAST_ERROR_TIMEOUT);
    CHECK(now_s() - t0 < 2.0 * TIMEOUT_MS / 1000.0 + 2.0);
    check_no_leaks(ctx);
    CHECK_OK(mcast_context_destroy(ctx));
    return 0;
  }
  mcast_status_t joined = join(role, ctx, id, n, r, r % count, &team);
  const char *expect = getenv("MCAST_MP_EXPECT");
  if (strcmp(role, "cross-host") == 0 && (joined == MCAST_ERROR_NOT_SUPPORTED ||
                                          (expect && strcmp(expect, "not_supported") == 0))) {
    CHECK_STATUS(joined, MCAST_ERROR_NOT_SUPPORTED);
    const char *msg = mcast_last_error();
    CHECK(strstr(msg, "rank ") != NULL && strstr(msg, "host") != NULL && strstr(msg, "fabric") != NULL);
    if (r == 0) printf("rank 0: team across hosts refused as expected: %s\n", msg);
    CHECK(now_s() - t0 < 2.0 * TIMEOUT_MS / 1000.0 + 2.0);
    check_no_leaks(ctx);
    CHECK_OK(mcast_context_destroy(ctx));
    return 0;
  }
  if (two_domains && joined == MCAST_ERROR_NOT_SUPPORTED) {
    if (r == 0) {
      printf("domains: no engine between the domains (%s): skipped\n", mcast_last_error());
      fflush(stdout);
    }
    check_no_leaks(ctx);
    CHECK_OK(mcast_context_destroy(ctx));
    return 77;
  }
  CHECK_OK(joined);
  if (two_domains) {
    domains(team, n, r);
  } else if (strcmp(role, "collectives") == 0 || strcmp(role, "oob") == 0 || strcmp(role, "cross-host") == 0) {
    collectives(team, n, r);
  } else if (strcmp(role, "registered") == 0 || strcmp(role, "registered-oob") == 0) {
    registered(ctx, team, n, r, r % count);
  } else if (strcmp(role, "register-bad") == 0) {
    void *p = NULL;
    static char host[4096];
    CHECK_OK(mcast_mem_alloc(ctx, r % count, 4096, &p));
    void *mine = r == 1 ? (void *)host : p;
    mcast_buffer_t buf = {0};
    t0 = now_s();
    CHECK_STATUS(mcast_buffer_register(team, &mine, sizeof host, &buf), MCAST_ERROR_INVALID_ARGUMENT);
    const char *msg = mcast_last_error();
    CHECK(strstr(msg, "rank 1") != NULL && strstr(msg, "not device memory") != NULL);
    CHECK(buf.id == 0);
    CHECK(now_s() - t0 < 2.0 * TIMEOUT_MS / 1000.0 + 2.0);
    CHECK_OK(mcast_mem_free(ctx, p));
  } else if (strcmp(role, "killed") == 0) {
    mcast_buffer_t buf;
    CHECK_OK(mcast_buffer_alloc(team, 1 << 20, &buf));
    if (r == n - 1) raise(SIGKILL);
    t0 = now_s();
    CHECK_OK(mcast_all_reduce(buf, r, 0, 1024, MCAST_FLOAT32, MCAST_SUM, NULL));
    CHECK_STATUS(mcast_synchronize(team, r, NULL), MCAST_ERROR_TIMEOUT);
    CHECK(now_s() - t0 < 2.0 * TIMEOUT_MS / 1000.0 + 2.0);
    CHECK_OK(mcast_buffer_free(buf));
  } else if (strcmp(role, "fault") == 0) {
    mcast_buffer_t buf;
    mcast_status_t s = mcast_buffer_alloc(team, 4 << 20, &buf);
    CHECK(s != MCAST_SUCCESS);
    CHECK(strstr(mcast_last_error(), "rank 1") != NULL);
  } else {
    fprintf(stderr, "unknown role %s\n", role);
    return 2;
  }
  CHECK_OK(mcast_team_destroy(team));
  check_no_leaks(ctx);
  CHECK_OK(mcast_context_destroy(ctx));
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr,
            "usage: %s NRANKS collectives|absent|killed|fault|oob|cross-host|registered|registered-oob|"
            "register-bad|domains\n",
            argv[0]);
    return 2;
  }
  int n = atoi(argv[1]);
  const char *role = argv[2];
  pid_t pids[72];
  CHECK(n >= 1 && n <= 72);
  shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK(shared != MAP_FAILED);
  pthread_barrierattr_t attr;
  CHECK(pthread_barrierattr_init(&attr) == 0);
  CHECK(pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED) == 0);
  CHECK(pthread_barrier_init(&shared->barrier, &attr, (unsigned)n) == 0);
  shared->n = n;
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    CHECK(pids[r] >= 0);
    if (pids[r] == 0) {
      fflush(stdout);
      my_rank = r;
      _exit(rank_main(role, n, r));
    }
  }
  int failed = 0, skipped = 0;
  for (int r = 0; r < n; r++) {
    int st = 0;
    CHECK(waitpid(pids[r], &st, 0) == pids[r]);
    int expected_death = (strcmp(role, "killed") == 0 || strcmp(role, "absent") == 0) && r == n - 1;
    if (expected_death) continue;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
      skipped++;
    } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d of %d (%s) failed: status %#x\n", r, n, role, (unsigned)st);
      failed++;
    }
  }
  if (failed) return 1;
  if (skipped) return 77;
  printf("mp_collectives %d %s: ok\n", n, role);
  return 0;
}
