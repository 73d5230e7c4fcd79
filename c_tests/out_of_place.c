/* API.md "Out-of-place collectives" through the installed package, on the simulator: every
 * _into form between two buffers of a team (float sums, int max, bytes), NCCL's in-place forms
 * through the _into functions, count 0 as a no-op, and the refusals (overlap, buffers of
 * different teams), with nothing left behind. Runs with MCAST_BACKEND=sim, MULTICAST and P2P. */
#include <stdint.h>
#include <string.h>

#include "check.h"

#define RANKS 3
#define COUNT 1000 /* elements per block; not a multiple of 16 bytes for every type */

static void sync_all(mcast_team_t team) {
  int r;
  for (r = 0; r < RANKS; r++) CHECK_OK(mcast_synchronize(team, r, NULL));
}

int main(void) {
  mcast_context_t ctx;
  mcast_team_t team, other;
  mcast_buffer_t send, recv, foreign;
  mcast_live_counts_t counts;
  const int devices[RANKS] = {0, 1, 2};
  const size_t bytes = (size_t)RANKS * COUNT * sizeof(float) + 64;
  float f[RANKS * COUNT];
  int32_t v[RANKS * COUNT];
  unsigned char b[RANKS * 100];
  int r, q, i;

  CHECK_OK(mcast_context_create(NULL, &ctx));
  CHECK_OK(mcast_team_create(ctx, devices, RANKS, &team));
  CHECK_OK(mcast_team_create(ctx, devices, RANKS, &other));
  CHECK_OK(mcast_buffer_alloc(team, bytes, &send));
  CHECK_OK(mcast_buffer_alloc(team, bytes, &recv));
  CHECK_OK(mcast_buffer_alloc(other, bytes, &foreign));

  /* all_reduce_into: send at 0, recv at 4 bytes (skewed modulo 16 against send). */
  for (r = 0; r < RANKS; r++) {
    for (i = 0; i < COUNT; i++) f[i] = (float)(r + 1) * (float)(i % 17);
    CHECK_OK(mcast_buffer_write(send, r, 0, f, COUNT * sizeof(float)));
  }
  for (r = 0; r < RANKS; r++)
    CHECK_OK(mcast_all_reduce_into(send, 0, recv, 4, r, COUNT, MCAST_FLOAT32, MCAST_SUM, NULL));
  sync_all(team);
  for (r = 0; r < RANKS; r++) {
    CHECK_OK(mcast_buffer_read(recv, r, 4, f, COUNT * sizeof(float)));
    for (i = 0; i < COUNT; i++) CHECK(f[i] == 6.0f * (float)(i % 17));
    /* send is untouched */
    CHECK_OK(mcast_buffer_read(send, r, 0, f, sizeof(float) * 2));
    CHECK(f[1] == (float)(r + 1));
  }

  /* reduce_scatter_into: RANKS blocks of COUNT int32 in send; rank r's max of block r in recv. */
  for (r = 0; r < RANKS; r++) {
    for (i = 0; i < RANKS * COUNT; i++) v[i] = (i * 7 + r * 13) % 101 - 50;
    CHECK_OK(mcast_buffer_write(send, r, 0, v, sizeof v));
  }
  for (r = 0; r < RANKS; r++)
    CHECK_OK(mcast_reduce_scatter_into(send, 0, recv, 16, r, COUNT, MCAST_INT32, MCAST_MAX, NULL));
  sync_all(team);
  for (r = 0; r < RANKS; r++) {
    CHECK_OK(mcast_buffer_read(recv, r, 16, v, COUNT * sizeof(int32_t)));
    for (i = 0; i < COUNT; i++) {
      int e = r * COUNT + i, want = -1000;
      for (q = 0; q < RANKS; q++) {
        int x = (e * 7 + q * 13) % 101 - 50;
        if (x > want) want = x;
      }
      CHECK(v[i] == want);
    }
  }

  /* all_gather_into and broadcast_into on odd byte counts and offsets. */
  for (r = 0; r < RANKS; r++) {
    for (i = 0; i < 100; i++) b[i] = (unsigned char)(r * 31 + i);
    CHECK_OK(mcast_buffer_write(send, r, 3, b, 100));
  }
  for (r = 0; r < RANKS; r++) CHECK_OK(mcast_all_gather_into(send, 3, recv, 5, r, 99, NULL));
  sync_all(team);
  for (r = 0; r < RANKS; r++) {
    CHECK_OK(mcast_buffer_read(recv, r, 5, b, RANKS * 99));
    for (q = 0; q < RANKS; q++)
      for (i = 0; i < 99; i++) CHECK(b[q * 99 + i] == (unsigned char)(q * 31 + i));
  }
  for (r = 0; r < RANKS; r++) CHECK_OK(mcast_broadcast_into(send, 3, recv, 1, r, 2, 77, NULL));
  sync_all(team);
  for (r = 0; r < RANKS; r++) {
    CHECK_OK(mcast_buffer_read(recv, r, 1, b, 77));
    for (i = 0; i < 77; i++) CHECK(b[i] == (unsigned char)(2 * 31 + i));
  }

  /* NCCL's in-place form of all_gather through the _into function: rank r sends block r. */
  for (r = 0; r < RANKS; r++) {
    for (i = 0; i < 64; i++) b[i] = (unsigned char)(r + 100);
    CHECK_OK(mcast_buffer_write(recv, r, (size_t)r * 64, b, 64));
  }
  for (r = 0; r < RANKS; r++) CHECK_OK(mcast_all_gather_into(recv, (size_t)r * 64, recv, 0, r, 64, NULL));
  sync_all(team);
  for (r = 0; r < RANKS; r++) {
    CHECK_OK(mcast_buffer_read(recv, r, 0, b, RANKS * 64));
    for (q = 0; q < RANKS; q++) CHECK(b[q * 64] == (unsigned char)(q + 100) && b[q * 64 + 63] == b[q * 64]);
  }

  /* Count 0: a no-op once handles and rank are checked; then the usual refusals. */
  CHECK_OK(mcast_all_reduce_into(send, (size_t)1 << 40, recv, 0, 0, 0, MCAST_FLOAT32, MCAST_SUM, NULL));
  CHECK_OK(mcast_all_reduce(send, 0, (size_t)1 << 40, 0, MCAST_FLOAT32, MCAST_SUM, NULL));
  CHECK_OK(mcast_broadcast(send, 1, 0, 0, 0, NULL));
  CHECK_STATUS(mcast_all_gather_into(send, 0, recv, 0, RANKS, 0, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_all_gather_into(send, 0, (mcast_buffer_t){0}, 0, 0, 0, NULL), MCAST_ERROR_INVALID_HANDLE);
  CHECK_STATUS(mcast_all_reduce_into(send, 0, foreign, 0, 0, 4, MCAST_FLOAT32, MCAST_SUM, NULL),
               MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "mcast_all_reduce_into") != NULL);
  CHECK(strstr(mcast_last_error(), "different teams") != NULL);
  CHECK_STATUS(mcast_all_reduce_into(send, 0, send, 8, 0, 4, MCAST_FLOAT32, MCAST_SUM, NULL),
               MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "overlap") != NULL);
  CHECK_STATUS(mcast_reduce_scatter_into(send, 0, recv, 2, 0, 4, MCAST_FLOAT32, MCAST_SUM, NULL),
               MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_all_reduce_into(send, 0, recv, 0, 0, 4, (mcast_dtype_t)99, MCAST_SUM, NULL),
               MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_broadcast_into(send, 0, recv, bytes, 0, 0, 1, NULL), MCAST_ERROR_INVALID_ARGUMENT);

  CHECK_OK(mcast_buffer_free(foreign));
  CHECK_OK(mcast_buffer_free(recv));
  CHECK_OK(mcast_buffer_free(send));
  CHECK_OK(mcast_team_destroy(other));
  CHECK_OK(mcast_team_destroy(team));
  memset(&counts, 0xff, sizeof counts);
  counts.struct_size = sizeof counts;
  CHECK_OK(mcast_context_live_counts(ctx, &counts));
  CHECK(counts.teams == 0 && counts.buffers == 0 && counts.multicast_objects == 0 && counts.mappings == 0);
  CHECK_OK(mcast_context_destroy(ctx));
  return 0;
}
