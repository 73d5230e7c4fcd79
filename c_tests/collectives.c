/* API.md "Collectives" through the installed package, on the simulator (4 simulated GPUs):
 * teams of 1, 2, 3 and 4 ranks on distinct devices, every collective, every dtype and op, odd
 * counts and aligned non-zero offsets against a host reference (collectives_check.h), argument
 * checks, and a rank that never arrives (timeout_ms = 200: MCAST_ERROR_TIMEOUT, sticky).
 * The transport follows MCAST_MULTICAST: auto -> MULTICAST for 2+ ranks, off -> P2P (ctest
 * runs both). Argument "quick" or MCAST_TEST_QUICK set skips the counts above the one-shot limit
 * (for slow tools run by hand).
 * On the simulator any pointer value names a stream: rank r uses (mcast_stream_t)(r + 1). */
#include <stdint.h>
#include <string.h>

static int coll_large_counts = 1;
#define COLL_LARGE_COUNTS coll_large_counts
#include "collectives_check.h"

/* On the simulator any value names a stream; the device is implied by the rank. */
static mcast_stream_t test_stream_create(int rank, int device) {
  (void)device;
  return (mcast_stream_t)(uintptr_t)(rank + 1);
}

static void test_stream_destroy(mcast_stream_t stream) { (void)stream; }

static mcast_context_t create_context(uint32_t timeout_ms, mcast_multicast_t *multicast) {
  mcast_config_t config;
  mcast_context_t ctx = {0};
  mcast_config_init(&config); /* reads MCAST_MULTICAST */
  config.backend = MCAST_BACKEND_SIM;
  config.sim_devices = 4;
  config.sim_device_memory = 256u << 20;
  config.timeout_ms = timeout_ms;
  config.retry_backoff_ms = 1;
  CHECK_OK(mcast_context_create(&config, &ctx));
  if (multicast) *multicast = config.multicast;
  return ctx;
}

int main(int argc, char **argv) {
  static const int devices[4] = {0, 1, 2, 3};
  mcast_multicast_t multicast = MCAST_MULTICAST_AUTO;
  mcast_context_t ctx;
  int n;

  if ((argc > 1 && strcmp(argv[1], "quick") == 0) || getenv("MCAST_TEST_QUICK") != NULL) coll_large_counts = 0;
  ctx = create_context(60000, &multicast);
  CHECK(multicast == MCAST_MULTICAST_AUTO || multicast == MCAST_MULTICAST_OFF);
  for (n = 1; n <= 4; n++) {
    mcast_transport_t want =
        (multicast == MCAST_MULTICAST_AUTO && n >= 2) ? MCAST_TRANSPORT_MULTICAST : MCAST_TRANSPORT_P2P;
    coll_team(ctx, devices, n, want);
  }
  coll_check_nothing_live(ctx);
  CHECK_OK(mcast_context_destroy(ctx));

  ctx = create_context(200, NULL);
  coll_timeout(ctx, devices, 2);
  coll_timeout(ctx, devices, 4);
  coll_check_nothing_live(ctx);
  CHECK_OK(mcast_context_destroy(ctx));
  printf("%lu collective cases passed (%s)\n", coll_cases_run,
         multicast == MCAST_MULTICAST_AUTO ? "MCAST_MULTICAST=auto" : "MCAST_MULTICAST=off");
  return 0;
}
