/* Memory the application owns: one process drives a team of every device it sees (up to 8),
 * allocates each rank's input and output with mcast_mem_alloc (registrable memory, like
 * ncclMemAlloc), registers both with the team and all-reduces out of place: each output holds
 * the sum, each input is left as it was. Then the teardown order: buffers, memory, team.
 * Build: cc registered.c -o registered $(pkg-config --cflags --libs mcast) \
 *          -Wl,-rpath,$(pkg-config --variable=libdir mcast)
 * Run:   MCAST_BACKEND=sim ./registered               (the simulator, no GPU needed)
 *        MCAST_MULTICAST=off ./registered             (GPUs, peer to peer) */
#include <stdio.h>
#include <stdlib.h>

#include "mcast.h"

#define CHECK(call)                                                                  \
  do {                                                                               \
    mcast_status_t s_ = (call);                                                      \
    if (s_ != MCAST_SUCCESS) {                                                       \
      fprintf(stderr, "%s failed: %s: %s\n", #call, mcast_status_string(s_),         \
              mcast_last_error());                                                   \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

enum { MAX_RANKS = 8, N = 4096 };

int main(void) {
  mcast_context_t ctx;
  CHECK(mcast_context_create(NULL, &ctx)); /* NULL: defaults and MCAST_* variables */
  mcast_context_info_t info = {.struct_size = sizeof info};
  CHECK(mcast_context_get_info(ctx, &info)); /* say what runs: GPUs, or the simulator */
  printf("mcast on %s (%s)\n", info.backend == MCAST_BACKEND_CUDA ? "CUDA" : "the SIMULATOR",
         info.backend_reason);
  int ndev = 0;
  CHECK(mcast_device_count(ctx, &ndev));
  int n = ndev < MAX_RANKS ? ndev : MAX_RANKS, devices[MAX_RANKS];
  for (int r = 0; r < n; r++) devices[r] = r; /* rank r on device r */
  mcast_team_t team;
  CHECK(mcast_team_create(ctx, devices, n, &team)); /* MULTICAST where usable, else P2P */

  void *in[MAX_RANKS], *out[MAX_RANKS];
  for (int r = 0; r < n; r++) {
    CHECK(mcast_mem_alloc(ctx, devices[r], N * sizeof(float), &in[r]));
    CHECK(mcast_mem_alloc(ctx, devices[r], N * sizeof(float), &out[r]));
  }
  mcast_buffer_t send, recv; /* ptrs[r]: rank r's memory */
  CHECK(mcast_buffer_register(team, in, N * sizeof(float), &send));
  CHECK(mcast_buffer_register(team, out, N * sizeof(float), &recv));

  static float host[N];
  for (int r = 0; r < n; r++) { /* rank r's input: r + i (or cudaMemcpy into in[r] on a GPU) */
    for (int i = 0; i < N; i++) host[i] = (float)(r + i);
    CHECK(mcast_buffer_write(send, r, 0, host, sizeof host));
  }
  for (int r = 0; r < n; r++) /* each rank on its own device's default stream (NULL) */
    CHECK(mcast_all_reduce_into(send, 0, recv, 0, r, N, MCAST_FLOAT32, MCAST_SUM, NULL));
  for (int r = 0; r < n; r++) CHECK(mcast_synchronize(team, r, NULL));

  long wrong = 0;
  for (int r = 0; r < n; r++) {
    CHECK(mcast_buffer_read(recv, r, 0, host, sizeof host));
    for (int i = 0; i < N; i++) wrong += host[i] != (float)(n * (n - 1) / 2 + n * i);
    CHECK(mcast_buffer_read(send, r, 0, host, sizeof host)); /* the input is untouched */
    for (int i = 0; i < N; i++) wrong += host[i] != (float)(r + i);
  }
  printf("%d rank(s): %s\n", n, wrong ? "WRONG" : "ok");

  /* Memory still registered cannot be freed: the buffers go first, the memory stays yours. */
  if (mcast_mem_free(ctx, in[0]) != MCAST_ERROR_IN_USE) {
    fprintf(stderr, "mcast_mem_free of registered memory did not return MCAST_ERROR_IN_USE\n");
    return 1;
  }
  CHECK(mcast_buffer_free(send));
  CHECK(mcast_buffer_free(recv));
  for (int r = 0; r < n; r++) {
    CHECK(mcast_mem_free(ctx, in[r]));
    CHECK(mcast_mem_free(ctx, out[r]));
  }
  CHECK(mcast_team_destroy(team));
  CHECK(mcast_context_destroy(ctx));
  return wrong != 0;
}
