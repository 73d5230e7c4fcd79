/* API.md "MCAST_ERROR_OUT_OF_MEMORY" and the retry policy, on the simulator. argv[1]:
 *   exhaust    MCAST_SIM_DEVICE_MEMORY=24M: allocate until OUT_OF_MEMORY; the message names
 *              cuMemCreate and CUDA_ERROR_OUT_OF_MEMORY; the failure leaves nothing behind and the
 *              team works again once a buffer is freed.
 *   transient  MCAST_SIM_FAULTS=cuMulticastCreate=OUT_OF_MEMORY@2x1: the 2nd cuMulticastCreate of
 *              each context (the first buffer needing a new segment) fails once. Without retries
 *              the allocation fails; with the default retry policy it succeeds. */
#include <string.h>

#include "check.h"

#define MIB ((size_t)1 << 20)
#define MAX_BUFFERS 64

static void check_env(const char *name, const char *value) {
  const char *got = getenv(name);
  if (got == NULL || strcmp(got, value) != 0) {
    fprintf(stderr, "the test needs %s=%s in its environment (got %s)\n", name, value,
            got ? got : "nothing");
    exit(1);
  }
}

static mcast_context_t create_context(uint32_t oom_retries) {
  mcast_config_t config;
  mcast_context_t ctx = {0};
  mcast_config_init(&config);
  config.backend = MCAST_BACKEND_SIM;
  config.sim_devices = 2;
  config.oom_retries = oom_retries;
  config.retry_backoff_ms = 1;
  CHECK_OK(mcast_context_create(&config, &ctx));
  return ctx;
}

/* Writes a different byte on each rank at both ends of buf and reads them back. */
static void check_usable(mcast_buffer_t buf, size_t bytes) {
  unsigned char in, out;
  int r;
  for (r = 0; r < 2; r++) {
    in = (unsigned char)(0x40 + r);
    CHECK_OK(mcast_buffer_write(buf, r, 0, &in, 1));
    CHECK_OK(mcast_buffer_write(buf, r, bytes - 1, &in, 1));
  }
  for (r = 0; r < 2; r++) {
    out = 0;
    CHECK_OK(mcast_buffer_read(buf, r, 0, &out, 1));
    CHECK(out == 0x40 + r);
    out = 0;
    CHECK_OK(mcast_buffer_read(buf, r, bytes - 1, &out, 1));
    CHECK(out == 0x40 + r);
  }
}

static void exhaust(void) {
  const int devices[2] = {0, 1};
  mcast_context_t ctx;
  mcast_team_t team = {0};
  mcast_buffer_t bufs[MAX_BUFFERS], failed;
  mcast_live_counts_t before, after;
  mcast_status_t status = MCAST_SUCCESS;
  int n = 0, i;

  check_env("MCAST_SIM_DEVICE_MEMORY", "24M");
  ctx = create_context(1);
  CHECK_OK(mcast_team_create(ctx, devices, 2, &team));
  while (n < MAX_BUFFERS) {
    before = live_counts(ctx);
    failed.id = 0x66u;
    status = mcast_buffer_alloc(team, 2 * MIB, &failed);
    if (status != MCAST_SUCCESS) break;
    bufs[n++] = failed;
  }
  /* 24 MiB per device holds fewer than 8 buffers of 2 MiB next to the team's own 16 MiB segment. */
  CHECK_STATUS(status, MCAST_ERROR_OUT_OF_MEMORY);
  CHECK(n >= 1 && n < 8);
  CHECK(failed.id == 0x66u);
  CHECK(strstr(mcast_last_error(), "mcast_buffer_alloc") != NULL);
  CHECK(strstr(mcast_last_error(), "cuMemCreate") != NULL);
  CHECK(strstr(mcast_last_error(), "CUDA_ERROR_OUT_OF_MEMORY") != NULL);
  /* The failure left nothing behind. */
  after = live_counts(ctx);
  CHECK(after.buffers == (uint64_t)n && after.buffers == before.buffers);
  CHECK(after.physical_allocations == before.physical_allocations);
  CHECK(after.multicast_objects == before.multicast_objects);
  CHECK(after.mappings == before.mappings);
  CHECK(after.reservations == before.reservations);
  CHECK(after.device_bytes == before.device_bytes);
  CHECK(after.device_bytes <= 2 * 24 * MIB);
  for (i = 0; i < n; i++) check_usable(bufs[i], 2 * MIB);

  /* Free one buffer: the same allocation succeeds again, and the team works. */
  CHECK_OK(mcast_buffer_free(bufs[n - 1]));
  CHECK_OK(mcast_buffer_alloc(team, 2 * MIB, &bufs[n - 1]));
  check_usable(bufs[n - 1], 2 * MIB);
  CHECK_STATUS(mcast_buffer_alloc(team, 2 * MIB, &failed), MCAST_ERROR_OUT_OF_MEMORY);

  for (i = 0; i < n; i++) CHECK_OK(mcast_buffer_free(bufs[i]));
  CHECK_OK(mcast_team_destroy(team));
  after = live_counts(ctx);
  CHECK(after.teams == 0 && after.buffers == 0 && after.device_bytes == 0);
  CHECK_OK(mcast_context_destroy(ctx));
}

static void transient(void) {
  const int devices[2] = {0, 1};
  mcast_context_t ctx;
  mcast_team_t team = {0};
  mcast_buffer_t buf = {0};

  check_env("MCAST_SIM_FAULTS", "cuMulticastCreate=OUT_OF_MEMORY@2x1");
  /* No retries: the fault reaches the caller, so it is really hit by this allocation. */
  ctx = create_context(0);
  CHECK_OK(mcast_team_create(ctx, devices, 2, &team)); /* cuMulticastCreate #1 */
  CHECK_STATUS(mcast_buffer_alloc(team, 4 * MIB, &buf), MCAST_ERROR_OUT_OF_MEMORY); /* #2 */
  CHECK(strstr(mcast_last_error(), "cuMulticastCreate") != NULL);
  CHECK(strstr(mcast_last_error(), "CUDA_ERROR_OUT_OF_MEMORY") != NULL);
  CHECK(live_counts(ctx).buffers == 0);
  CHECK_OK(mcast_team_destroy(team));
  CHECK_OK(mcast_context_destroy(ctx));

  /* The default retry policy absorbs the same one-off failure: the allocation succeeds. */
  ctx = create_context(3);
  CHECK_OK(mcast_team_create(ctx, devices, 2, &team));
  CHECK_OK(mcast_buffer_alloc(team, 4 * MIB, &buf));
  check_usable(buf, 4 * MIB);
  CHECK(live_counts(ctx).buffers == 1);
  CHECK_OK(mcast_buffer_free(buf));
  CHECK_OK(mcast_team_destroy(team));
  CHECK_OK(mcast_context_destroy(ctx));
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  if (strcmp(mode, "exhaust") == 0) {
    exhaust();
  } else if (strcmp(mode, "transient") == 0) {
    transient();
  } else {
    fprintf(stderr, "usage: %s exhaust|transient\n", argv[0]);
    return 2;
  }
  return 0;
}
