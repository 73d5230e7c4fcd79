/* API.md "Every function is thread-safe": 8 threads allocate, write, read back and free buffers
 * on one team at once; afterwards no buffer is left. Runs with MCAST_BACKEND=sim. */
#include <pthread.h>
#include <string.h>

#include "check.h"

#define THREADS 8
#define ROUNDS 100
#define RANKS 4

static mcast_team_t team;

static void *worker(void *arg) {
  int t = (int)(size_t)arg, round, r;
  unsigned char data[5000], back[5000];
  for (round = 0; round < ROUNDS; round++) {
    /* Sizes differ per thread and round; some need a segment of their own. */
    size_t bytes = (size_t)(t + 1) * 487 + (size_t)round * 61, size = 0, i;
    mcast_buffer_t buf = {0};
    if (round % 10 == 9) bytes = ((size_t)3 << 20) + (size_t)t;
    CHECK_OK(mcast_buffer_alloc(team, bytes, &buf));
    CHECK(buf.id != 0);
    CHECK_OK(mcast_buffer_size(buf, &size));
    CHECK(size == bytes);
    for (r = 0; r < RANKS; r++) {
      size_t n = bytes < sizeof data ? bytes : sizeof data;
      for (i = 0; i < n; i++) data[i] = (unsigned char)(t * 31 + r * 7 + round + i);
      CHECK_OK(mcast_buffer_write(buf, r, bytes - n, data, n));
    }
    for (r = 0; r < RANKS; r++) {
      size_t n = bytes < sizeof data ? bytes : sizeof data;
      for (i = 0; i < n; i++) data[i] = (unsigned char)(t * 31 + r * 7 + round + i);
      memset(back, 0, n);
      CHECK_OK(mcast_buffer_read(buf, r, bytes - n, back, n));
      CHECK(memcmp(back, data, n) == 0);
    }
    CHECK_OK(mcast_buffer_free(buf));
    CHECK_STATUS(mcast_buffer_free(buf), MCAST_ERROR_INVALID_HANDLE);
  }
  return NULL;
}

int main(void) {
  mcast_config_t config;
  mcast_context_t ctx = {0};
  mcast_live_counts_t counts;
  const int devices[RANKS] = {0, 1, 2, 3};
  pthread_t threads[THREADS];
  size_t t;

  mcast_config_init(&config);
  config.backend = MCAST_BACKEND_SIM;
  config.sim_devices = RANKS;
  CHECK_OK(mcast_context_create(&config, &ctx));
  CHECK_OK(mcast_team_create(ctx, devices, RANKS, &team));
  for (t = 0; t < THREADS; t++) CHECK(pthread_create(&threads[t], NULL, worker, (void *)t) == 0);
  for (t = 0; t < THREADS; t++) CHECK(pthread_join(threads[t], NULL) == 0);

  memset(&counts, 0xff, sizeof counts);
  counts.struct_size = sizeof counts;
  CHECK_OK(mcast_context_live_counts(ctx, &counts));
  CHECK(counts.teams == 1);
  CHECK(counts.buffers == 0);
  CHECK_OK(mcast_team_destroy(team));
  CHECK_OK(mcast_context_live_counts(ctx, &counts));
  CHECK(counts.teams == 0 && counts.buffers == 0 && counts.device_bytes == 0);
  CHECK_OK(mcast_context_destroy(ctx));
  return 0;
}
