/* API.md "Teams: split, abort, errors", through the installed package (MCAST_BACKEND=sim):
 * - mcast_team_abort from another thread ends an mcast_synchronize blocked on a rank that never
 *   arrives, well before timeout_ms; later calls return MCAST_ERROR_ABORTED; mcast_team_get_error
 *   reports it; destroy releases everything, the live buffer included, and a new team works;
 * - a timeout is seen by mcast_team_get_error, the team is destroyed and replaced;
 * - mcast_team_split of 4 ranks into two teams of 2 (keys reversing the order) and NOCOLOR,
 *   an all-reduce in each;
 * - two ranks on one device given the same stream: MCAST_ERROR_INVALID_ARGUMENT at once;
 * - the zero handle, NULL arguments, a bad color. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "check.h"

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static mcast_stream_t stream_of(int rank) { return (mcast_stream_t)(uintptr_t)(rank + 1); }

struct aborter {
  mcast_team_t team;
  double at;
};

static void *abort_later(void *arg) {
  struct aborter *a = (struct aborter *)arg;
  struct timespec pause = {0, 200 * 1000 * 1000};
  nanosleep(&pause, NULL);
  a->at = now_s();
  CHECK_OK(mcast_team_abort(a->team));
  return NULL;
}

static void check_empty(mcast_context_t ctx) {
  mcast_live_counts_t counts;
  memset(&counts, 0xff, sizeof counts);
  counts.struct_size = sizeof counts;
  CHECK_OK(mcast_context_live_counts(ctx, &counts));
  CHECK(counts.teams == 0 && counts.buffers == 0 && counts.device_bytes == 0);
  CHECK(counts.physical_allocations == 0 && counts.mappings == 0 && counts.reservations == 0);
}

/* All-reduce (int32 sum) of 10 + rank over every rank of `team` (ranks 0..n-1 in this process). */
static void check_all_reduce(mcast_team_t team, int n) {
  mcast_buffer_t buf = {0};
  int r, want = 0;
  CHECK_OK(mcast_buffer_alloc(team, 4096, &buf));
  for (r = 0; r < n; r++) {
    int32_t v = 10 + r;
    want += v;
    CHECK_OK(mcast_buffer_write(buf, r, 0, &v, sizeof v));
  }
  for (r = 0; r < n; r++) CHECK_OK(mcast_all_reduce(buf, r, 0, 1, MCAST_INT32, MCAST_SUM, stream_of(r)));
  for (r = 0; r < n; r++) {
    int32_t got = 0;
    CHECK_OK(mcast_synchronize(team, r, stream_of(r)));
    CHECK_OK(mcast_buffer_read(buf, r, 0, &got, sizeof got));
    CHECK(got == want);
  }
  CHECK_OK(mcast_buffer_free(buf));
}

int main(void) {
  mcast_config_t config;
  mcast_context_t ctx = {0};
  mcast_team_t team = {0}, zero = {0}, sub[4];
  mcast_buffer_t buf = {0}, other = {0};
  mcast_status_t error = MCAST_SUCCESS;
  struct aborter a;
  pthread_t thread;
  const int devices[4] = {0, 1, 2, 3}, same[2] = {0, 0};
  const int colors[4] = {0, 1, 0, 1}, keys[4] = {3, 2, 1, 0};
  int nocolor[4] = {1, MCAST_SPLIT_NOCOLOR, 1, 1}, bad[4] = {0, -5, 0, 0};
  double t;

  CHECK(strcmp(mcast_status_string(MCAST_ERROR_ABORTED), "MCAST_ERROR_ABORTED") == 0);
  CHECK(MCAST_ERROR_ABORTED == 11);

  mcast_config_init(&config);
  config.backend = MCAST_BACKEND_SIM;
  config.sim_devices = 4;
  config.timeout_ms = 60000;
  CHECK_OK(mcast_context_create(&config, &ctx));

  /* Abort from another thread while synchronize waits for ranks that never arrive. */
  CHECK_OK(mcast_team_create(ctx, devices, 2, &team));
  CHECK_OK(mcast_team_get_error(team, &error));
  CHECK(error == MCAST_SUCCESS);
  CHECK_OK(mcast_buffer_alloc(team, 4096, &buf));
  CHECK_OK(mcast_all_reduce(buf, 0, 0, 64, MCAST_FLOAT32, MCAST_SUM, stream_of(0)));
  a.team = team;
  CHECK(pthread_create(&thread, NULL, abort_later, &a) == 0);
  CHECK_STATUS(mcast_synchronize(team, 0, stream_of(0)), MCAST_ERROR_ABORTED);
  t = now_s();
  CHECK(pthread_join(thread, NULL) == 0);
  CHECK(t - a.at < 5.0); /* under 1 s natively; generous for valgrind; timeout_ms is 60 s */
  CHECK(strstr(mcast_last_error(), "aborted") != NULL);
  CHECK_STATUS(mcast_all_reduce(buf, 1, 0, 64, MCAST_FLOAT32, MCAST_SUM, stream_of(1)), MCAST_ERROR_ABORTED);
  CHECK_STATUS(mcast_buffer_alloc(team, 4096, &other), MCAST_ERROR_ABORTED);
  CHECK_STATUS(mcast_synchronize(team, 1, stream_of(1)), MCAST_ERROR_ABORTED);
  CHECK_OK(mcast_team_get_error(team, &error));
  CHECK(error == MCAST_ERROR_ABORTED);
  CHECK_OK(mcast_team_abort(team)); /* twice is harmless */
  t = now_s();
  CHECK_OK(mcast_team_destroy(team)); /* the live buffer goes with it */
  CHECK(now_s() - t < 5.0);
  CHECK_STATUS(mcast_buffer_free(buf), MCAST_ERROR_INVALID_HANDLE);
  CHECK_STATUS(mcast_team_abort(team), MCAST_ERROR_INVALID_HANDLE);
  check_empty(ctx);
  /* A new team on the same devices works. */
  CHECK_OK(mcast_team_create(ctx, devices, 2, &team));
  check_all_reduce(team, 2);
  CHECK_OK(mcast_team_destroy(team));
  CHECK_OK(mcast_context_destroy(ctx));

  /* A timeout, seen without synchronizing; destroy and replace. */
  config.timeout_ms = 50;
  CHECK_OK(mcast_context_create(&config, &ctx));
  CHECK_OK(mcast_team_create(ctx, devices, 2, &team));
  CHECK_OK(mcast_buffer_alloc(team, 4096, &buf));
  CHECK_OK(mcast_all_reduce(buf, 0, 0, 64, MCAST_FLOAT32, MCAST_SUM, stream_of(0)));
  t = now_s();
  do {
    CHECK_OK(mcast_team_get_error(team, &error));
  } while (error == MCAST_SUCCESS && now_s() - t < 5.0);
  CHECK(error == MCAST_ERROR_TIMEOUT);
  CHECK_STATUS(mcast_synchronize(team, 0, stream_of(0)), MCAST_ERROR_TIMEOUT);
  CHECK_STATUS(mcast_team_destroy(team), MCAST_ERROR_IN_USE); /* a timed-out team frees first */
  t = now_s();
  CHECK_OK(mcast_buffer_free(buf));
  CHECK_OK(mcast_team_destroy(team));
  CHECK(now_s() - t < 5.0);
  check_empty(ctx);
  CHECK_OK(mcast_team_create(ctx, devices, 2, &team));
  check_all_reduce(team, 2);
  CHECK_OK(mcast_team_destroy(team));

  /* Split: colors {0, 1, 0, 1}, keys reversing the order: {2, 0} and {3, 1}. */
  config.timeout_ms = 60000;
  CHECK_OK(mcast_context_destroy(ctx));
  CHECK_OK(mcast_context_create(&config, &ctx));
  CHECK_OK(mcast_team_create(ctx, devices, 4, &team));
  CHECK_STATUS(mcast_team_split(team, NULL, keys, sub), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_team_split(team, colors, keys, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_team_split(team, bad, keys, sub), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "colors[1]") != NULL);
  CHECK_STATUS(mcast_team_split(zero, colors, keys, sub), MCAST_ERROR_INVALID_HANDLE);
  CHECK_OK(mcast_team_split(team, colors, keys, sub));
  CHECK(sub[0].id == sub[2].id && sub[1].id == sub[3].id && sub[0].id != sub[1].id && sub[0].id != 0);
  check_all_reduce(sub[0], 2);
  check_all_reduce(sub[1], 2);
  /* Aborting one sub-team touches neither the other nor the parent. */
  CHECK_OK(mcast_team_abort(sub[0]));
  CHECK_OK(mcast_team_get_error(sub[1], &error));
  CHECK(error == MCAST_SUCCESS);
  CHECK_OK(mcast_team_get_error(team, &error));
  CHECK(error == MCAST_SUCCESS);
  check_all_reduce(team, 4);
  CHECK_OK(mcast_team_destroy(sub[0]));
  CHECK_OK(mcast_team_destroy(sub[1]));
  CHECK_OK(mcast_team_split(team, nocolor, keys, sub));
  CHECK(sub[1].id == 0 && sub[0].id != 0 && sub[0].id == sub[2].id && sub[0].id == sub[3].id);
  check_all_reduce(sub[0], 3);
  CHECK_OK(mcast_team_destroy(sub[0]));
  CHECK_OK(mcast_team_destroy(team));

  /* Two ranks on one device, one stream: refused at once, naming both ranks. */
  CHECK_OK(mcast_team_create(ctx, same, 2, &team));
  CHECK_OK(mcast_buffer_alloc(team, 4096, &buf));
  CHECK_OK(mcast_all_reduce(buf, 0, 0, 64, MCAST_FLOAT32, MCAST_SUM, NULL));
  t = now_s();
  CHECK_STATUS(mcast_all_reduce(buf, 1, 0, 64, MCAST_FLOAT32, MCAST_SUM, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(now_s() - t < 5.0);
  CHECK(strstr(mcast_last_error(), "ranks 0 and 1") != NULL);
  CHECK_STATUS(mcast_broadcast(buf, 1, 0, 0, 64, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_all_gather(buf, 1, 0, 64, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_reduce_scatter(buf, 1, 0, 8, MCAST_FLOAT32, MCAST_SUM, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  /* On its own stream rank 1 completes the collective. */
  CHECK_OK(mcast_all_reduce(buf, 1, 0, 64, MCAST_FLOAT32, MCAST_SUM, stream_of(1)));
  CHECK_OK(mcast_synchronize(team, 0, NULL));
  CHECK_OK(mcast_synchronize(team, 1, stream_of(1)));
  CHECK_OK(mcast_buffer_free(buf));
  CHECK_OK(mcast_team_destroy(team));

  /* The zero handle and NULL. */
  CHECK_STATUS(mcast_team_abort(zero), MCAST_ERROR_INVALID_HANDLE);
  CHECK_STATUS(mcast_team_get_error(zero, &error), MCAST_ERROR_INVALID_HANDLE);
  CHECK_OK(mcast_team_create(ctx, devices, 2, &team));
  CHECK_STATUS(mcast_team_get_error(team, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_OK(mcast_team_destroy(team));
  check_empty(ctx);
  CHECK_OK(mcast_context_destroy(ctx));
  return 0;
}
