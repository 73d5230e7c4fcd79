/* GPU: the collectives checks of collectives_check.h on real CUDA devices over P2P (never
 * multicast: DESIGN.md, safety rule; ctest sets MCAST_MULTICAST=off and the config says OFF):
 * teams of 1, 2 and 4 ranks on device 0 repeated, then teams on distinct devices when the
 * machine has more (2, and up to 4, where peer access allows), each rank on its own CUDA stream;
 * argument checks; a rank that never arrives (timeout_ms = 200). Exits 77 (skipped) where no
 * CUDA driver or device exists. Built only where CMake finds the CUDA runtime. */
#include <string.h>

typedef struct CUstream_st *cudaStream_t;
extern int cudaSetDevice(int device);
extern int cudaStreamCreate(cudaStream_t *stream);
extern int cudaStreamDestroy(cudaStream_t stream);

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
  coll_check_nothing_live(ctx);
  CHECK_OK(mcast_context_destroy(ctx));

  CHECK_OK(create_context(200, &ctx));
  coll_timeout(ctx, zeros, 2);
  coll_check_nothing_live(ctx);
  CHECK_OK(mcast_context_destroy(ctx));
  printf("%lu collective cases passed on %d GPU(s), P2P\n", coll_cases_run, count);
  return 0;
}
