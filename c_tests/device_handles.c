/* API.md "Device API", host side, through the installed package (built as C99, so the handle
 * structs of mcast/device.h, which mcast.h includes, compile there): the handles hold the
 * buffer's local, peer and multicast pointers and the team's slots; the header text is there for
 * NVRTC; bad arguments get their statuses and leave the out-struct untouched.
 * Runs with MCAST_BACKEND=sim. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

#define RANKS 3

int main(void) {
  mcast_config_t cfg;
  mcast_context_t ctx;
  mcast_team_t team;
  mcast_buffer_t buf;
  mcast_dev_team_t t;
  mcast_dev_buffer_t b;
  const int devices[RANKS] = {0, 1, 2};
  size_t len = 0;
  const char *text;
  int r, p;

  /* The layout C sees is the one the library fills. */
  CHECK(sizeof(mcast_dev_team_t) == 128 && sizeof(mcast_dev_buffer_t) == 128);
  CHECK(offsetof(mcast_dev_team_t, dev_offset) == 56 && offsetof(mcast_dev_buffer_t, mc) == 48);

  mcast_config_init(&cfg);
  cfg.backend = MCAST_BACKEND_SIM;
  cfg.sim_devices = RANKS;
  CHECK_OK(mcast_context_create(&cfg, &ctx));
  CHECK_OK(mcast_team_create(ctx, devices, RANKS, &team));
  CHECK_OK(mcast_buffer_alloc(team, 4096, &buf));

  for (r = 0; r < RANKS; r++) {
    void *ptr = NULL;
    memset(&t, 0, sizeof t);
    t.struct_size = sizeof t;
    CHECK_OK(mcast_team_device_handle(team, r, &t));
    CHECK(t.version == MCAST_DEV_VERSION && t.rank == r && t.nranks == RANKS);
    CHECK(t.nslots == MCAST_DEV_DEFAULT_SLOTS);
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    CHECK_OK(mcast_buffer_device_handle(buf, r, &b));
    CHECK(b.bytes == 4096 && b.rank == r && b.nranks == RANKS);
    CHECK_OK(mcast_buffer_local_ptr(buf, r, &ptr));
    CHECK(b.local == (uint64_t)(uintptr_t)ptr);
    for (p = 0; p < RANKS; p++) {
      CHECK_OK(mcast_buffer_peer_ptr(buf, r, p, &ptr));
      CHECK(b.peer0 + (uint64_t)p * b.peer_stride == (uint64_t)(uintptr_t)ptr);
    }
    if (t.flags & MCAST_DEV_FLAG_MULTICAST) {
      CHECK_OK(mcast_buffer_multicast_ptr(buf, r, &ptr));
      CHECK(b.mc == (uint64_t)(uintptr_t)ptr && t.sync_mc != 0);
    } else {
      CHECK(b.mc == 0 && t.sync_mc == 0);
    }
  }

  /* Bad arguments. */
  memset(&t, 0x5a, sizeof t);
  t.struct_size = 16;
  CHECK_STATUS(mcast_team_device_handle(team, 0, &t), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "struct_size") != NULL);
  CHECK(t.struct_size == 16 && t.rank == 0x5a5a5a5a);
  t.struct_size = sizeof t;
  CHECK_STATUS(mcast_team_device_handle(team, RANKS, &t), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_team_device_handle(team, 0, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  b.struct_size = sizeof b;
  CHECK_STATUS(mcast_buffer_device_handle(buf, -1, &b), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_buffer_device_handle(buf, 0, NULL), MCAST_ERROR_INVALID_ARGUMENT);

  /* The header text for NVRTC: the installed header's. */
  text = mcast_device_header_source(&len);
  CHECK(text != NULL && len == strlen(text) && strstr(text, "mcast_dev_barrier") != NULL);
  CHECK(mcast_device_header_source(NULL) == text);

  CHECK_OK(mcast_buffer_free(buf));
  CHECK_STATUS(mcast_buffer_device_handle(buf, 0, &b), MCAST_ERROR_INVALID_HANDLE);
  CHECK_OK(mcast_team_destroy(team));
  CHECK_STATUS(mcast_team_device_handle(team, 0, &t), MCAST_ERROR_INVALID_HANDLE);
  check_no_leaks(ctx);
  CHECK_OK(mcast_context_destroy(ctx));
  printf("device_handles: ok\n");
  return 0;
}
