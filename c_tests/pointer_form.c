/* API.md "Collectives on any device pointer" through the installed package, on the simulator:
 * NCCL's sendbuff/recvbuff form on device memory that is in no registered buffer (here
 * mcast_mem_alloc memory left unregistered: to the team it is plain device memory), for all four
 * collectives on a team of 5 ranks (beyond the push one-shot: everything goes through the team's
 * staging area), out of place and in place, a message larger than the staging area, calls back to
 * back with one synchronize, the argument doors, and nothing left at the end. Runs with
 * MCAST_BACKEND=sim, MULTICAST and P2P. */
#include <stdint.h>
#include <string.h>

#include "check.h"

#define RANKS 5
#define BIG (300 * 1000) /* floats: 1.2 MB, past the 1 MiB staging area */
#define BLOCK 1001       /* bytes per rank for all-gather, elements per rank for reduce-scatter */

static float value(int r, size_t i) { return (float)((r * 7 + (int)(i % 11)) - 5); }

int main(void) {
  mcast_config_t config;
  mcast_context_t ctx;
  mcast_team_t team;
  mcast_live_counts_t counts;
  int devices[RANKS];
  void *a[RANKS], *b[RANKS], *g[RANKS], *rs_in[RANKS], *rs_out[RANKS];
  const size_t big = BIG * sizeof(float);
  int r, q;
  size_t i;

  mcast_config_init(&config);
  config.sim_devices = RANKS;
  CHECK_OK(mcast_context_create(&config, &ctx));
  for (r = 0; r < RANKS; r++) devices[r] = r;
  CHECK_OK(mcast_team_create(ctx, devices, RANKS, &team));
  for (r = 0; r < RANKS; r++) {
    CHECK_OK(mcast_mem_alloc(ctx, r, big, &a[r]));
    CHECK_OK(mcast_mem_alloc(ctx, r, big, &b[r]));
    CHECK_OK(mcast_mem_alloc(ctx, r, RANKS * BLOCK, &g[r]));
    CHECK_OK(mcast_mem_alloc(ctx, r, RANKS * BLOCK * sizeof(int32_t), &rs_in[r]));
    CHECK_OK(mcast_mem_alloc(ctx, r, BLOCK * sizeof(int32_t), &rs_out[r]));
    /* Simulated device memory is host memory: fill it directly (cudaMemcpy on a GPU). */
    for (i = 0; i < BIG; i++) ((float *)a[r])[i] = value(r, i);
    for (i = 0; i < BLOCK; i++) ((unsigned char *)g[r])[r * BLOCK + i] = (unsigned char)(r * 31 + i);
    for (i = 0; i < RANKS * BLOCK; i++) ((int32_t *)rs_in[r])[i] = (int32_t)(r + i);
  }

  /* Back to back, one synchronize: all-reduce a -> b (out of place, chunked), broadcast from
   * rank 3 in place on b's first 777 bytes, all-gather in place in g (NCCL's layout: send is
   * block r of recv), reduce-scatter rs_in -> rs_out. */
  for (r = 0; r < RANKS; r++)
    CHECK_OK(mcast_team_all_reduce(team, r, a[r], b[r], BIG, MCAST_FLOAT32, MCAST_SUM, NULL));
  for (r = 0; r < RANKS; r++) CHECK_OK(mcast_team_broadcast(team, r, 3, b[r], b[r], 777, NULL));
  for (r = 0; r < RANKS; r++)
    CHECK_OK(mcast_team_all_gather(team, r, (char *)g[r] + r * BLOCK, g[r], BLOCK, NULL));
  for (r = 0; r < RANKS; r++)
    CHECK_OK(mcast_team_reduce_scatter(team, r, rs_in[r], rs_out[r], BLOCK, MCAST_INT32, MCAST_SUM, NULL));
  for (r = 0; r < RANKS; r++) CHECK_OK(mcast_synchronize(team, r, NULL));
  for (r = 0; r < RANKS; r++) {
    for (i = 0; i < BIG; i++) {
      float want = 0;
      for (q = 0; q < RANKS; q++) want += value(q, i);
      CHECK(((float *)b[r])[i] == want);
    }
    for (q = 0; q < RANKS; q++)
      for (i = 0; i < BLOCK; i++) CHECK(((unsigned char *)g[r])[q * BLOCK + i] == (unsigned char)(q * 31 + i));
    for (i = 0; i < BLOCK; i++) {
      int32_t want = 0;
      for (q = 0; q < RANKS; q++) want += (int32_t)(q + r * BLOCK + i);
      CHECK(((int32_t *)rs_out[r])[i] == want);
    }
  }

  /* The doors: NULL, misaligned for the dtype, memory of another rank's device, overlap. */
  CHECK_STATUS(mcast_team_all_reduce(team, 0, NULL, b[0], 4, MCAST_FLOAT32, MCAST_SUM, NULL),
               MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "NULL") != NULL);
  /* Element-aligned is enough (bf16 at 2 bytes runs, as in NCCL); an odd address is not. */
  CHECK_STATUS(mcast_team_all_reduce(team, 0, (char *)a[0] + 1, b[0], 4, MCAST_BFLOAT16, MCAST_SUM, NULL),
               MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "multiple of 2") != NULL);
  CHECK_STATUS(mcast_team_all_gather(team, 0, a[1], b[0], 4, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "device 1") != NULL);
  CHECK_STATUS(mcast_team_broadcast(team, 0, 0, a[0], (char *)a[0] + 1, 16, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "overlap") != NULL);
  CHECK_OK(mcast_team_reduce_scatter(team, 0, NULL, NULL, 0, MCAST_INT32, MCAST_SUM, NULL)); /* count 0 */

  for (r = 0; r < RANKS; r++) {
    CHECK_OK(mcast_mem_free(ctx, a[r]));
    CHECK_OK(mcast_mem_free(ctx, b[r]));
    CHECK_OK(mcast_mem_free(ctx, g[r]));
    CHECK_OK(mcast_mem_free(ctx, rs_in[r]));
    CHECK_OK(mcast_mem_free(ctx, rs_out[r]));
  }
  CHECK_OK(mcast_team_destroy(team));
  memset(&counts, 0xff, sizeof counts);
  counts.struct_size = sizeof counts;
  CHECK_OK(mcast_context_live_counts(ctx, &counts));
  CHECK(counts.teams == 0 && counts.buffers == 0 && counts.physical_allocations == 0 && counts.mappings == 0 &&
        counts.multicast_objects == 0 && counts.device_bytes == 0);
  CHECK_OK(mcast_context_destroy(ctx));
  return 0;
}
