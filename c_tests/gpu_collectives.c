/* GPU: the collectives checks of collectives_check.h on real CUDA devices over P2P (never
 * multicast: DESIGN.md, safety rule; ctest sets MCAST_MULTICAST=off and the config says OFF):
 * teams of 1, 2 and 4 ranks on device 0 repeated, then teams on distinct devices when the
 * machine has more (2, and up to 4, where peer access allows), each rank on its own CUDA stream;
 * argument checks; a rank that never arrives (timeout_ms = 200). Exits 77 (skipped) where no
 * CUDA driver or device exists. Built only where CMake finds the CUDA runtime. */
#include <string.h>

#include "cuda_rt.h"

#include "collectives_check.h"

/* A stream belongs to the device current when it is created: the rank's own. */
static mcast_stream_t test_stream_create(int rank, int device) {
  cudaStream_t s = NULL;
  int err = cudaSetDevice(device);
  if (err == 0) err = cudaStreamCreate(&s);
  if (err != 0) {
    fprintf(stderr, "cudaStreamCreate for rank %d failed: %d\n", rank, err);
    exit(1);
  }
  return s;
}

static void test_stream_destroy(mcast_stream_t stream) { CHECK(cudaStreamDestroy(stream) == 0); }

static mcast_status_t create_context(uint32_t timeout_ms, mcast_context_t *ctx) {
  mcast_config_t config;
  mcast_config_init(&config);
  config.backend = MCAST_BACKEND_CUDA;
  config.multicast = MCAST_MULTICAST_OFF; /* never multicast on a GPU */
  config.timeout_ms = timeout_ms;
  return mcast_context_create(&config, ctx);
}

/* Each rank's all-reduce captured in a CUDA graph (strict global capture mode), then the graphs
 * replayed: the barrier epochs live on the device, so every replay pairs up correctly. In place,
 * each replay doubles the sum: after 3 replays every rank holds 4 * (x0 + x1), exactly (small
 * integers in float). */
static void graph_replay(mcast_context_t ctx, const int *devices) {
  enum { N = 2, COUNT = 4096, REPLAYS = 3 };
  static float host[N][COUNT], got[COUNT];
  mcast_team_t team = {0};
  mcast_buffer_t buf = {0};
  mcast_stream_t streams[N];
  cudaGraph_t graphs[N];
  cudaGraphExec_t execs[N];
  int r, k, i;

  CHECK_OK(mcast_team_create(ctx, devices, N, &team));
  CHECK_OK(mcast_buffer_alloc(team, sizeof host[0], &buf));
  for (r = 0; r < N; r++) streams[r] = test_stream_create(r, devices[r]);
  for (r = 0; r < N; r++)
    for (i = 0; i < COUNT; i++) host[r][i] = (float)((i * 7 + r * 3) % 9) - 4.0f;
  /* A first call loads the kernels: capture comes after it. */
  for (r = 0; r < N; r++) CHECK_OK(mcast_all_reduce(buf, r, 0, COUNT, MCAST_FLOAT32, MCAST_SUM, streams[r]));
  for (r = 0; r < N; r++) CHECK_OK(mcast_synchronize(team, r, streams[r]));
  for (r = 0; r < N; r++) CHECK_OK(mcast_buffer_write(buf, r, 0, host[r], sizeof host[r]));
  for (r = 0; r < N; r++) {
    CHECK(cudaStreamBeginCapture(streams[r], 0) == 0);
    CHECK_OK(mcast_all_reduce(buf, r, 0, COUNT, MCAST_FLOAT32, MCAST_SUM, streams[r]));
    CHECK(cudaStreamEndCapture(streams[r], &graphs[r]) == 0);
    CHECK(cudaGraphInstantiate(&execs[r], graphs[r], 0) == 0);
  }
  for (k = 0; k < REPLAYS; k++)
    for (r = 0; r < N; r++) CHECK(cudaGraphLaunch(execs[r], streams[r]) == 0);
  for (r = 0; r < N; r++) CHECK_OK(mcast_synchronize(team, r, streams[r]));
  for (r = 0; r < N; r++) {
    CHECK_OK(mcast_buffer_read(buf, r, 0, got, sizeof got));
    for (i = 0; i < COUNT; i++) CHECK(got[i] == 4.0f * (host[0][i] + host[1][i]));
  }
  for (r = 0; r < N; r++) {
    CHECK(cudaGraphExecDestroy(execs[r]) == 0);
    CHECK(cudaGraphDestroy(graphs[r]) == 0);
    test_stream_destroy(streams[r]);
  }
  CHECK_OK(mcast_buffer_free(buf));
  CHECK_OK(mcast_team_destroy(team));
  printf("graph replay: %d captured all-reduces replayed %d times on devices %d,%d: correct\n", N, REPLAYS,
         devices[0], devices[1]);
}

int main(void) {
  static const int zeros[4] = {0, 0, 0, 0}, distinct[4] = {0, 1, 2, 3};
  mcast_context_t ctx = {0};
  mcast_status_t status = create_context(60000, &ctx);
  int count = 0, n, r;

  if (status == MCAST_ERROR_DRIVER_UNAVAILABLE) {
    printf("skipped: no CUDA driver or device: %s\n", mcast_last_error());
    return 77;
  }
  CHECK_OK(status);
  CHECK_OK(mcast_device_count(ctx, &count));
  CHECK(count > 0);
  for (n = 1; n <= 4; n *= 2) coll_team(ctx, zeros, n, MCAST_TRANSPORT_P2P);
  for (n = 2; n <= 4 && n <= count; n++) {
    int ok = 1, can = 0, p;
    for (r = 0; r < n && ok; r++) {
      for (p = 0; p < n && ok; p++) {
        if (r == p) continue;
        CHECK_OK(mcast_device_can_access_peer(ctx, r, p, &can));
        ok = can;
      }
    }
    if (!ok) {
      printf("devices 0..%d: no peer access between every pair: distinct-device team of %d skipped\n", n - 1, n);
      continue;
    }
    coll_team(ctx, distinct, n, MCAST_TRANSPORT_P2P);
  }
  graph_replay(ctx, zeros);
  if (count >= 2) graph_replay(ctx, distinct);
  coll_check_nothing_live(ctx);
  CHECK_OK(mcast_context_destroy(ctx));

  CHECK_OK(create_context(200, &ctx));
  coll_timeout(ctx, zeros, 2);
  coll_check_nothing_live(ctx);
  CHECK_OK(mcast_context_destroy(ctx));
  printf("%lu collective cases passed on %d GPU(s), P2P\n", coll_cases_run, count);
  return 0;
}
