/* API.md "Devices" on the simulator: count, info on every device, argument checks, peer access,
 * and the NVLS kill switch. One program, three ctest entries (argv[1]):
 *   default      MCAST_SIM_DEVICE_MEMORY=96M: multicast usable everywhere, reason ""
 *   killswitch   + NCCL_NVLS_ENABLE=0: not usable, the reason names it, granularities 0, a
 *                2-device team is P2P
 *   require      + NCCL_NVLS_ENABLE=0 and MCAST_MULTICAST=require: team creation NOT_SUPPORTED */
#include <stddef.h>
#include <string.h>

#include "check.h"

#define SIM_MEMORY (96ull << 20) /* MCAST_SIM_DEVICE_MEMORY=96M in CMakeLists.txt */

static int is_power_of_two(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

static void check_env(const char *name, const char *value) {
  const char *got = getenv(name);
  if (got == NULL || strcmp(got, value) != 0) {
    fprintf(stderr, "the test needs %s=%s in its environment (got %s)\n", name, value,
            got ? got : "nothing");
    exit(1);
  }
}

static mcast_device_info_t device_info(mcast_context_t ctx, int device) {
  mcast_device_info_t info;
  memset(&info, 0xab, sizeof info);
  info.struct_size = sizeof info;
  CHECK_OK(mcast_device_get_info(ctx, device, &info));
  CHECK(info.struct_size == sizeof info);
  return info;
}

/* Bad arguments fail and leave *info as it was. */
static void check_bad_info_calls(mcast_context_t ctx, int count) {
  mcast_device_info_t info, before;
  memset(&info, 0x5a, sizeof info);
  info.struct_size = sizeof info;
  before = info;
  CHECK_STATUS(mcast_device_get_info(ctx, count, &info), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "mcast_device_get_info") != NULL);
  CHECK(memcmp(&info, &before, sizeof info) == 0);
  CHECK_STATUS(mcast_device_get_info(ctx, -1, &info), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_device_get_info(ctx, 1000000, &info), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(memcmp(&info, &before, sizeof info) == 0);
  CHECK_STATUS(mcast_device_get_info(ctx, 0, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  info.struct_size = 0;
  CHECK_STATUS(mcast_device_get_info(ctx, 0, &info), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "struct_size") != NULL);
  /* Smaller than the first version of the struct (everything before uuid): refused. */
  info.struct_size = (uint32_t)offsetof(mcast_device_info_t, uuid) - 1;
  CHECK_STATUS(mcast_device_get_info(ctx, 0, &info), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "first version") != NULL);
}

/* A caller built against the first version of mcast_device_info_t (up to
 * granularity_recommended) is still served: its fields are filled, nothing past them. */
static void check_first_version_struct(mcast_context_t ctx) {
  mcast_device_info_t info, full;
  const size_t v1 = offsetof(mcast_device_info_t, uuid);
  full = device_info(ctx, 1);
  memset(&info, 0x5a, sizeof info);
  info.struct_size = (uint32_t)v1;
  CHECK_OK(mcast_device_get_info(ctx, 1, &info));
  CHECK(info.struct_size == v1);
  CHECK(info.ordinal == 1 && strcmp(info.name, full.name) == 0);
  CHECK(info.granularity_recommended == full.granularity_recommended);
  {
    const unsigned char *tail = (const unsigned char *)&info + v1;
    size_t i;
    for (i = 0; i < sizeof info - v1; i++) CHECK(tail[i] == 0x5a);
  }
}

/* Identity: a UUID per GPU, distinct; a PCI bus id; a fabric state in range. */
static void check_identity(mcast_context_t ctx, int count) {
  static const unsigned char zero[16];
  mcast_device_info_t a, b;
  int d, e;
  for (d = 0; d < count; d++) {
    a = device_info(ctx, d);
    CHECK(memcmp(a.uuid, zero, sizeof zero) != 0);
    CHECK(memchr(a.pci_bus_id, '\0', sizeof a.pci_bus_id) != NULL);
    CHECK(strlen(a.pci_bus_id) == 12 && a.pci_bus_id[4] == ':'); /* "0000:18:00.0" */
    CHECK(a.fabric_state >= MCAST_FABRIC_NONE && a.fabric_state <= MCAST_FABRIC_COMPLETED);
    for (e = 0; e < d; e++) {
      b = device_info(ctx, e);
      CHECK(memcmp(a.uuid, b.uuid, sizeof a.uuid) != 0);
      CHECK(strcmp(a.pci_bus_id, b.pci_bus_id) != 0);
    }
  }
  CHECK(memcmp(device_info(ctx, 0).uuid, device_info(ctx, 0).uuid, 16) == 0);
}

static void check_peer_access(mcast_context_t ctx, int count) {
  int d, p, can;
  for (d = 0; d < count; d++) {
    for (p = 0; p < count; p++) {
      can = -1;
      CHECK_OK(mcast_device_can_access_peer(ctx, d, p, &can));
      CHECK(can == 1); /* every simulated device reaches every other, and itself */
    }
  }
  can = -1;
  CHECK_STATUS(mcast_device_can_access_peer(ctx, 0, count, &can), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_device_can_access_peer(ctx, count, 0, &can), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_device_can_access_peer(ctx, -1, 0, &can), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_device_can_access_peer(ctx, 0, -1, &can), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(can == -1);
  CHECK_STATUS(mcast_device_can_access_peer(ctx, 0, 1, NULL), MCAST_ERROR_INVALID_ARGUMENT);
}

/* What every mode shares: count, the fixed fields of every device, the argument checks. */
static void check_devices(mcast_context_t ctx, int expect_usable) {
  int count = -1, d;
  mcast_device_info_t info;
  CHECK_OK(mcast_device_count(ctx, &count));
  CHECK(count == 3);
  for (d = 0; d < count; d++) {
    info = device_info(ctx, d);
    CHECK(info.ordinal == d);
    CHECK(memchr(info.name, '\0', sizeof info.name) != NULL);
    CHECK(strlen(info.name) > 0);
    CHECK(info.cc_major == 9 && info.cc_minor == 0);
    CHECK(info.total_memory == SIM_MEMORY);
    CHECK(info.multicast_supported == 1); /* what the (simulated) driver reports */
    CHECK(memchr(info.multicast_reason, '\0', sizeof info.multicast_reason) != NULL);
    if (expect_usable) {
      CHECK(info.multicast_usable == 1);
      CHECK(info.multicast_reason[0] == '\0');
      CHECK(is_power_of_two(info.granularity_min));
      CHECK(info.granularity_recommended >= info.granularity_min);
      CHECK(info.granularity_recommended % info.granularity_min == 0);
    } else {
      CHECK(info.multicast_usable == 0);
      CHECK(strstr(info.multicast_reason, "NCCL_NVLS_ENABLE=0") != NULL);
      /* Multicast is off: the driver was not asked for its multicast granularity. */
      CHECK(info.granularity_min == 0 && info.granularity_recommended == 0);
    }
  }
  check_bad_info_calls(ctx, count);
  check_first_version_struct(ctx);
  check_identity(ctx, count);
  check_peer_access(ctx, count);
}

static mcast_context_t create_context(void) {
  mcast_config_t config;
  mcast_context_t ctx = {0};
  mcast_config_init(&config); /* applies MCAST_SIM_DEVICE_MEMORY, MCAST_MULTICAST */
  config.backend = MCAST_BACKEND_SIM;
  config.sim_devices = 3;
  CHECK(config.sim_device_memory == SIM_MEMORY);
  CHECK_OK(mcast_context_create(&config, &ctx));
  return ctx;
}

/* A stale context: every device call is INVALID_HANDLE and writes nothing. */
static void check_stale(mcast_context_t ctx) {
  int count = -7, can = -7;
  mcast_device_info_t info;
  mcast_context_t zero = {0};
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  CHECK_STATUS(mcast_device_count(ctx, &count), MCAST_ERROR_INVALID_HANDLE);
  CHECK_STATUS(mcast_device_get_info(ctx, 0, &info), MCAST_ERROR_INVALID_HANDLE);
  CHECK_STATUS(mcast_device_can_access_peer(ctx, 0, 0, &can), MCAST_ERROR_INVALID_HANDLE);
  CHECK_STATUS(mcast_device_count(zero, &count), MCAST_ERROR_INVALID_HANDLE);
  CHECK(count == -7 && can == -7 && info.name[0] == '\0');
}

static void team_info(mcast_team_t team, mcast_team_info_t *info) {
  memset(info, 0, sizeof *info);
  info->struct_size = sizeof *info;
  CHECK_OK(mcast_team_get_info(team, info));
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  const int two[2] = {0, 2};
  mcast_context_t ctx;
  mcast_team_t team = {0};
  mcast_team_info_t info;

  check_env("MCAST_SIM_DEVICE_MEMORY", "96M");
  if (strcmp(mode, "default") == 0) {
    CHECK(getenv("NCCL_NVLS_ENABLE") == NULL);
    ctx = create_context();
    check_devices(ctx, 1);
    CHECK_OK(mcast_team_create(ctx, two, 2, &team));
    team_info(team, &info);
    CHECK(info.transport == MCAST_TRANSPORT_MULTICAST);
    CHECK(info.transport_reason[0] == '\0');
  } else if (strcmp(mode, "killswitch") == 0) {
    check_env("NCCL_NVLS_ENABLE", "0");
    ctx = create_context();
    check_devices(ctx, 0);
    /* Two distinct devices would be MULTICAST; the kill switch makes the team P2P and says so. */
    CHECK_OK(mcast_team_create(ctx, two, 2, &team));
    team_info(team, &info);
    CHECK(info.size == 2);
    CHECK(info.transport == MCAST_TRANSPORT_P2P);
    CHECK(strstr(info.transport_reason, "NCCL_NVLS_ENABLE=0") != NULL);
    CHECK(info.multicast_objects == 0);
  } else if (strcmp(mode, "require") == 0) {
    check_env("NCCL_NVLS_ENABLE", "0");
    check_env("MCAST_MULTICAST", "require");
    ctx = create_context();
    check_devices(ctx, 0);
    team.id = 0x4242u;
    CHECK_STATUS(mcast_team_create(ctx, two, 2, &team), MCAST_ERROR_NOT_SUPPORTED);
    CHECK(strstr(mcast_last_error(), "NCCL_NVLS_ENABLE=0") != NULL);
    CHECK(team.id == 0x4242u);
    team.id = 0;
  } else {
    fprintf(stderr, "usage: %s default|killswitch|require\n", argv[0]);
    return 2;
  }
  CHECK_OK(mcast_team_destroy(team));
  CHECK_OK(mcast_context_destroy(ctx));
  check_stale(ctx);
  return 0;
}
