/* API.md "Conventions": no function unwinds into C; a Rust panic becomes MCAST_ERROR_INTERNAL.
 * Runs with MCAST_SIM_FAULTS=cuMemCreate=PANIC@1: the simulated driver panics in the first
 * cuMemCreate, which mcast_team_create makes. The call must come back as INTERNAL with a message
 * naming the panic, and the context must stay usable afterwards. */
#include <string.h>

#include "check.h"

int main(void) {
  mcast_config_t config;
  mcast_context_t ctx = {0};
  mcast_team_t team = {0x5555u}, second = {0};
  mcast_team_info_t info;
  mcast_live_counts_t counts;
  mcast_buffer_t buf = {0};
  const int devices[2] = {0, 1};
  unsigned char out = 0, in = 0xa5;
  const char *fault = getenv("MCAST_SIM_FAULTS");

  CHECK(fault != NULL && strcmp(fault, "cuMemCreate=PANIC@1") == 0);
  mcast_config_init(&config);
  config.backend = MCAST_BACKEND_SIM;
  CHECK_OK(mcast_context_create(&config, &ctx));

  /* The panic is caught at the boundary: INTERNAL, *out untouched, the message says what. */
  CHECK_STATUS(mcast_team_create(ctx, devices, 2, &team), MCAST_ERROR_INTERNAL);
  CHECK(team.id == 0x5555u);
  CHECK(strstr(mcast_last_error(), "mcast_team_create") != NULL);
  CHECK(strstr(mcast_last_error(), "injected panic in cuMemCreate") != NULL);

  /* The failed create left nothing behind (API.md: on failure nothing is left allocated). */
  memset(&counts, 0xff, sizeof counts);
  counts.struct_size = sizeof counts;
  CHECK_OK(mcast_context_live_counts(ctx, &counts));
  CHECK(counts.teams == 0);
  CHECK(counts.buffers == 0);
  CHECK(counts.multicast_objects == 0);
  CHECK(counts.physical_allocations == 0);
  CHECK(counts.mappings == 0);
  CHECK(counts.reservations == 0);
  CHECK(counts.device_bytes == 0);

  /* Nothing is left locked: the same context creates a team and moves data through it. */
  CHECK_OK(mcast_team_create(ctx, devices, 2, &second));
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  CHECK_OK(mcast_team_get_info(second, &info));
  CHECK(info.size == 2);
  CHECK(info.transport == MCAST_TRANSPORT_MULTICAST);
  CHECK_OK(mcast_buffer_alloc(second, 4096, &buf));
  CHECK_OK(mcast_buffer_write(buf, 1, 100, &in, 1));
  CHECK_OK(mcast_buffer_read(buf, 1, 100, &out, 1));
  CHECK(out == 0xa5);
  CHECK_OK(mcast_buffer_free(buf));
  CHECK_OK(mcast_team_destroy(second));

  CHECK_OK(mcast_context_live_counts(ctx, &counts));
  CHECK(counts.teams == 0);
  CHECK_OK(mcast_context_destroy(ctx));
  return 0;
}
