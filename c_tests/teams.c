/* API.md "Teams" through the installed package: the transport chosen at creation, team info,
 * argument checks, IN_USE, and the handle rules (zero, stale, double-destroyed, foreign, and
 * handles of a destroyed context). Runs with MCAST_BACKEND=sim (4 simulated devices). */
#include <stddef.h>
#include <string.h>

#include "check.h"

static mcast_context_t create_context(void) {
  mcast_config_t config;
  mcast_context_t ctx = {0};
  mcast_config_init(&config);
  config.backend = MCAST_BACKEND_SIM;
  config.multicast = MCAST_MULTICAST_AUTO;
  config.sim_devices = 4;
  CHECK_OK(mcast_context_create(&config, &ctx));
  return ctx;
}

static mcast_team_info_t team_info(mcast_team_t team) {
  mcast_team_info_t info;
  memset(&info, 0xab, sizeof info);
  info.struct_size = sizeof info;
  CHECK_OK(mcast_team_get_info(team, &info));
  CHECK(info.struct_size == sizeof info);
  CHECK(memchr(info.transport_reason, '\0', sizeof info.transport_reason) != NULL);
  return info;
}

static mcast_team_t create_team(mcast_context_t ctx, const int *devices, int n) {
  mcast_team_t team = {0};
  CHECK_OK(mcast_team_create(ctx, devices, n, &team));
  CHECK(team.id != 0);
  return team;
}

static void check_transports(mcast_context_t ctx) {
  const int four[4] = {0, 1, 2, 3}, pair[2] = {3, 1}, repeated[3] = {1, 1, 0}, same[2] = {2, 2};
  const int one[1] = {2};
  mcast_team_t team;
  mcast_team_info_t info;

  /* 2+ distinct, usable devices: MULTICAST, no reason, a multicast object for its first segment. */
  team = create_team(ctx, four, 4);
  info = team_info(team);
  CHECK(info.size == 4);
  CHECK(info.transport == MCAST_TRANSPORT_MULTICAST);
  CHECK(info.transport_reason[0] == '\0');
  CHECK(info.granularity > 0 && (info.granularity & (info.granularity - 1)) == 0);
  CHECK(info.multicast_objects >= 1);
  CHECK(info.bytes_reserved > 0);
  CHECK_OK(mcast_team_destroy(team));

  team = create_team(ctx, pair, 2);
  info = team_info(team);
  CHECK(info.size == 2);
  CHECK(info.transport == MCAST_TRANSPORT_MULTICAST);
  CHECK_OK(mcast_team_destroy(team));

  /* A device repeated: P2P, and the reason names the device. */
  team = create_team(ctx, repeated, 3);
  info = team_info(team);
  CHECK(info.size == 3);
  CHECK(info.transport == MCAST_TRANSPORT_P2P);
  CHECK(strstr(info.transport_reason, "device 1") != NULL);
  CHECK(info.multicast_objects == 0);
  CHECK(info.bytes_reserved > 0);
  CHECK_OK(mcast_team_destroy(team));

  team = create_team(ctx, same, 2);
  CHECK(team_info(team).transport == MCAST_TRANSPORT_P2P);
  CHECK_OK(mcast_team_destroy(team));

  /* One rank: P2P, the reason says so. */
  team = create_team(ctx, one, 1);
  info = team_info(team);
  CHECK(info.size == 1);
  CHECK(info.transport == MCAST_TRANSPORT_P2P);
  CHECK(strstr(info.transport_reason, "one rank") != NULL);
  CHECK(info.multicast_objects == 0);
  CHECK_OK(mcast_team_destroy(team));
}

/* Each bad create fails with INVALID_ARGUMENT, says why, and leaves *out alone. */
static void check_bad_create(mcast_context_t ctx, const int *devices, int n, const char *what) {
  mcast_team_t team = {0x77u};
  mcast_status_t status = mcast_team_create(ctx, devices, n, &team);
  if (status != MCAST_ERROR_INVALID_ARGUMENT || team.id != 0x77u || mcast_last_error()[0] == '\0') {
    fprintf(stderr, "mcast_team_create(%s) returned %s, team.id %#llx\n  mcast_last_error: %s\n",
            what, mcast_status_string(status), (unsigned long long)team.id, mcast_last_error());
    exit(1);
  }
}

static void check_invalid_arguments(mcast_context_t ctx) {
  const int ok[2] = {0, 1}, past[2] = {0, 4}, negative[2] = {-1, 0};
  int many[73];
  mcast_team_t team;
  mcast_team_info_t info;
  mcast_live_counts_t counts;
  int i;

  for (i = 0; i < 73; i++) many[i] = i % 4;
  check_bad_create(ctx, NULL, 2, "devices NULL");
  check_bad_create(ctx, ok, 0, "ndevices 0");
  check_bad_create(ctx, ok, -1, "ndevices -1");
  check_bad_create(ctx, many, 73, "ndevices 73");
  check_bad_create(ctx, past, 2, "device 4 of 4");
  check_bad_create(ctx, negative, 2, "device -1");
  CHECK_STATUS(mcast_team_create(ctx, ok, 2, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  /* 72 ranks is the most, and allowed (one device may host several ranks under P2P). */
  team = create_team(ctx, many, 72);
  CHECK(team_info(team).size == 72);
  CHECK_OK(mcast_team_destroy(team));

  /* Nothing was left behind by the failures. */
  memset(&counts, 0, sizeof counts);
  counts.struct_size = sizeof counts;
  CHECK_OK(mcast_context_live_counts(ctx, &counts));
  CHECK(counts.teams == 0 && counts.physical_allocations == 0 && counts.multicast_objects == 0);

  team = create_team(ctx, ok, 2);
  CHECK_STATUS(mcast_team_get_info(team, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  memset(&info, 0x11, sizeof info);
  info.struct_size = 0;
  CHECK_STATUS(mcast_team_get_info(team, &info), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "struct_size") != NULL);
  info.struct_size = (uint32_t)offsetof(mcast_team_info_t, domains) - 1;
  CHECK_STATUS(mcast_team_get_info(team, &info), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(info.size == 0x11111111);
  /* A caller built against the first version (up to bytes_reserved) is served up to its size. */
  info.struct_size = (uint32_t)offsetof(mcast_team_info_t, domains);
  CHECK_OK(mcast_team_get_info(team, &info));
  CHECK(info.size == 2 && info.domains == 0x11111111 && info.net_engine[0] == 0x11);
  /* One process, one host: one NVLink domain of every rank, no engine between domains. */
  info = team_info(team);
  CHECK(info.domains == 1 && info.domain_size == 2 && info.net_engine[0] == '\0');
  CHECK_OK(mcast_team_destroy(team));
}

static void check_in_use_and_stale(mcast_context_t ctx) {
  const int devices[2] = {0, 1};
  const mcast_team_t zero = {0};
  mcast_team_t team = create_team(ctx, devices, 2), as_team;
  mcast_buffer_t buf = {0}, buf2 = {0}, as_buffer;
  mcast_team_info_t info;
  size_t bytes = 0;

  CHECK_OK(mcast_buffer_alloc(team, 1000, &buf));
  CHECK_OK(mcast_buffer_alloc(team, 3u << 20, &buf2));
  /* Live buffers: destroy is refused and nothing changes. */
  CHECK_STATUS(mcast_team_destroy(team), MCAST_ERROR_IN_USE);
  CHECK(strstr(mcast_last_error(), "mcast_team_destroy") != NULL);
  CHECK(team_info(team).size == 2);
  CHECK_OK(mcast_buffer_size(buf, &bytes));
  CHECK(bytes == 1000);
  CHECK_OK(mcast_buffer_free(buf));
  CHECK_STATUS(mcast_team_destroy(team), MCAST_ERROR_IN_USE); /* buf2 still lives */
  CHECK_OK(mcast_buffer_size(buf2, &bytes));
  CHECK(bytes == 3u << 20);

  /* Foreign handles: a buffer id as a team, a team id as a buffer, a context id as a team.
   * (info is initialised: the library reads struct_size before it looks at the handle.) */
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  as_team.id = buf2.id;
  CHECK_STATUS(mcast_team_get_info(as_team, &info), MCAST_ERROR_INVALID_HANDLE);
  CHECK_STATUS(mcast_team_destroy(as_team), MCAST_ERROR_INVALID_HANDLE);
  as_buffer.id = team.id;
  CHECK_STATUS(mcast_buffer_size(as_buffer, &bytes), MCAST_ERROR_INVALID_HANDLE);
  CHECK_STATUS(mcast_buffer_free(as_buffer), MCAST_ERROR_INVALID_HANDLE);
  as_team.id = ctx.id;
  CHECK_STATUS(mcast_team_destroy(as_team), MCAST_ERROR_INVALID_HANDLE);
  CHECK_OK(mcast_buffer_size(buf2, &bytes)); /* the real ones are untouched */
  CHECK(team_info(team).size == 2);

  CHECK_OK(mcast_buffer_free(buf2));
  CHECK_OK(mcast_team_destroy(team));

  /* Stale and double-destroyed: INVALID_HANDLE, out-params untouched. */
  memset(&info, 0x22, sizeof info);
  info.struct_size = sizeof info;
  CHECK_STATUS(mcast_team_get_info(team, &info), MCAST_ERROR_INVALID_HANDLE);
  CHECK(info.size == 0x22222222);
  CHECK(strstr(mcast_last_error(), "mcast_team_get_info") != NULL);
  CHECK_STATUS(mcast_team_destroy(team), MCAST_ERROR_INVALID_HANDLE);
  buf.id = 0x99u;
  CHECK_STATUS(mcast_buffer_alloc(team, 64, &buf), MCAST_ERROR_INVALID_HANDLE);
  CHECK(buf.id == 0x99u);
  as_team.id = 0x7fffffff00000001ull; /* never issued */
  CHECK_STATUS(mcast_team_destroy(as_team), MCAST_ERROR_INVALID_HANDLE);

  /* The zero handle: destroy is a no-op, every other use is INVALID_HANDLE. */
  CHECK_OK(mcast_team_destroy(zero));
  CHECK_STATUS(mcast_team_get_info(zero, &info), MCAST_ERROR_INVALID_HANDLE);
  CHECK_STATUS(mcast_buffer_alloc(zero, 64, &buf), MCAST_ERROR_INVALID_HANDLE);
}

/* Destroying a context invalidates its teams and buffers (and leaves other contexts alone). */
static void check_destroyed_context(void) {
  const int devices[2] = {0, 1};
  mcast_context_t ctx = create_context(), other = create_context();
  mcast_team_t team = create_team(ctx, devices, 2), kept = create_team(other, devices, 2);
  mcast_buffer_t buf = {0}, kept_buf = {0};
  mcast_team_info_t info;
  size_t bytes = 0;

  CHECK_OK(mcast_buffer_alloc(team, 4096, &buf));
  CHECK_OK(mcast_buffer_alloc(kept, 4096, &kept_buf));
  CHECK_OK(mcast_context_destroy(ctx)); /* the team and buffer are leaked: reported, not fatal */
  info.struct_size = sizeof info;
  CHECK_STATUS(mcast_team_get_info(team, &info), MCAST_ERROR_INVALID_HANDLE);
  CHECK_STATUS(mcast_buffer_size(buf, &bytes), MCAST_ERROR_INVALID_HANDLE);
  CHECK_STATUS(mcast_buffer_alloc(team, 64, &buf), MCAST_ERROR_INVALID_HANDLE);
  CHECK_STATUS(mcast_buffer_free(buf), MCAST_ERROR_INVALID_HANDLE);
  CHECK_STATUS(mcast_team_destroy(team), MCAST_ERROR_INVALID_HANDLE);
  CHECK_STATUS(mcast_team_create(ctx, devices, 2, &team), MCAST_ERROR_INVALID_HANDLE);

  CHECK(team_info(kept).transport == MCAST_TRANSPORT_MULTICAST);
  CHECK_OK(mcast_buffer_size(kept_buf, &bytes));
  CHECK(bytes == 4096);
  CHECK_OK(mcast_buffer_free(kept_buf));
  CHECK_OK(mcast_team_destroy(kept));
  CHECK_OK(mcast_context_destroy(other));
}

int main(void) {
  mcast_context_t ctx = create_context();
  mcast_live_counts_t counts;

  check_transports(ctx);
  check_invalid_arguments(ctx);
  check_in_use_and_stale(ctx);
  memset(&counts, 0xff, sizeof counts);
  counts.struct_size = sizeof counts;
  CHECK_OK(mcast_context_live_counts(ctx, &counts));
  CHECK(counts.teams == 0 && counts.buffers == 0);
  CHECK(counts.physical_allocations == 0 && counts.multicast_objects == 0);
  CHECK(counts.mappings == 0 && counts.reservations == 0 && counts.device_bytes == 0);
  CHECK_OK(mcast_context_destroy(ctx));
  check_destroyed_context();
  return 0;
}
