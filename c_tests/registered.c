/* README.md "Your own memory, out of place" through the installed package, on the simulator: the
 * README example (memory from mcast_mem_alloc registered on every rank, mcast_all_reduce_into
 * between two registered buffers), the registration rules seen from C, and teardown in each
 * order with nothing left. Runs with MCAST_BACKEND=sim, MULTICAST and P2P. */
#include <stdint.h>
#include <string.h>

#include "check.h"

#define RANKS 2
#define COUNT 4096

int main(void) {
  mcast_context_t ctx;
  mcast_team_t team;
  mcast_buffer_t send, recv, again;
  void *in[RANKS], *out[RANKS], *bad[RANKS];
  const int devices[RANKS] = {0, 1};
  const size_t bytes = COUNT * sizeof(float);
  float host[COUNT];
  mcast_live_counts_t counts;
  int r, i;

  CHECK_OK(mcast_context_create(NULL, &ctx));
  CHECK_OK(mcast_team_create(ctx, devices, RANKS, &team));
  /* The application's memory, one allocation per rank (like ncclMemAlloc). */
  for (r = 0; r < RANKS; r++) {
    CHECK_OK(mcast_mem_alloc(ctx, devices[r], bytes, &in[r]));
    CHECK_OK(mcast_mem_alloc(ctx, devices[r], bytes, &out[r]));
    CHECK(in[r] != NULL && out[r] != NULL);
  }
  CHECK_OK(mcast_buffer_register(team, in, bytes, &send));
  CHECK_OK(mcast_buffer_register(team, out, bytes, &recv));
  for (r = 0; r < RANKS; r++) {
    for (i = 0; i < COUNT; i++) host[i] = (float)((r + 1) * (i % 100));
    CHECK_OK(mcast_buffer_write(send, r, 0, host, bytes)); /* or cudaMemcpy into in[r] */
  }
  for (r = 0; r < RANKS; r++)
    CHECK_OK(mcast_all_reduce_into(send, 0, recv, 0, r, COUNT, MCAST_FLOAT32, MCAST_SUM, NULL));
  for (r = 0; r < RANKS; r++) CHECK_OK(mcast_synchronize(team, r, NULL));
  for (r = 0; r < RANKS; r++) {
    /* The result is in the application's own memory (a host pointer on the simulator). */
    const float *mine = (const float *)out[r];
    for (i = 0; i < COUNT; i++) CHECK(mine[i] == (float)(3 * (i % 100)));
  }

  /* Rules: overlap with a live registration, NULL pointers, bytes 0, memory freed while
   * registered, a pointer that is no device memory, another team's rank count. */
  CHECK_STATUS(mcast_buffer_register(team, in, 16, &again), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "overlaps a live registration") != NULL);
  CHECK_STATUS(mcast_buffer_register(team, NULL, 16, &again), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_buffer_register(team, in, 16, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_buffer_register(team, in, 0, &again), MCAST_ERROR_INVALID_ARGUMENT);
  bad[0] = host;
  bad[1] = host;
  CHECK_STATUS(mcast_buffer_register(team, bad, 16, &again), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "not device memory") != NULL);
  bad[0] = out[1];
  bad[1] = out[0];
  CHECK_STATUS(mcast_buffer_register(team, bad, 16, &again), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_mem_free(ctx, in[0]), MCAST_ERROR_IN_USE);
  CHECK_STATUS(mcast_mem_free(ctx, host), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_OK(mcast_mem_free(ctx, NULL));
  CHECK_STATUS(mcast_mem_alloc(ctx, 0, 0, &bad[0]), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_mem_alloc(ctx, 99, 16, &bad[0]), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_mem_alloc(ctx, 0, 16, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  /* The team is not destroyed while registered buffers live. */
  CHECK_STATUS(mcast_team_destroy(team), MCAST_ERROR_IN_USE);

  /* Order 1: free the buffer, then the memory (which keeps its contents until then). */
  CHECK_OK(mcast_buffer_free(recv));
  CHECK(((const float *)out[1])[99] == 297.0f);
  for (r = 0; r < RANKS; r++) CHECK_OK(mcast_mem_free(ctx, out[r]));
  CHECK_STATUS(mcast_mem_free(ctx, out[0]), MCAST_ERROR_INVALID_ARGUMENT);
  counts = live_counts(ctx);
  CHECK(counts.buffers == 1);

  /* Order 2: context destroy with the team, the registered buffer and the memory alive: all
   * released (and reported at warn level as a leak). */
  (void)send;
  CHECK_OK(mcast_context_destroy(ctx));
  return 0;
}
