/* API.md "Context": mcast_config_init fills the documented defaults, then applies MCAST_*
 * environment variables; a malformed value is ignored.
 *   config defaults   every MCAST_* variable this test knows is removed first
 *   config env        run with MCAST_SIM_DEVICES=3 and MCAST_BACKEND=sim (ctest ENVIRONMENT)
 *   config malformed  run with MCAST_SIM_DEVICES=three and MCAST_BACKEND=sim */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "check.h"

static const char *const variables[] = {
    "MCAST_BACKEND",           "MCAST_MULTICAST",           "MCAST_OOM_RETRIES",
    "MCAST_RETRY_BACKOFF_MS",  "MCAST_TIMEOUT_MS",          "MCAST_SIM_DEVICES",
    "MCAST_SIM_DEVICE_MEMORY", "MCAST_SIM_MULTICAST_SLOTS", "MCAST_SIM_MULTICAST",
};

static void check_defaults_except_backend_and_devices(const mcast_config_t *config) {
  CHECK(config->struct_size == sizeof(mcast_config_t));
  CHECK(config->multicast == MCAST_MULTICAST_AUTO);
  CHECK(config->oom_retries == 3);
  CHECK(config->retry_backoff_ms == 10);
  CHECK(config->timeout_ms == 30000);
  CHECK(config->sim_device_memory == (uint64_t)1 << 30);
  CHECK(config->sim_multicast_slots == 128);
  CHECK(config->sim_multicast_supported == 1);
}

int main(int argc, char **argv) {
  mcast_config_t config;
  const char *mode = argc > 1 ? argv[1] : "defaults";

  memset(&config, 0xab, sizeof config);
  if (strcmp(mode, "defaults") == 0) {
    size_t i;
    for (i = 0; i < sizeof variables / sizeof variables[0]; i++) {
      CHECK(unsetenv(variables[i]) == 0);
    }
    mcast_config_init(&config);
    check_defaults_except_backend_and_devices(&config);
    CHECK(config.backend == MCAST_BACKEND_AUTO);
    CHECK(config.sim_devices == 4);
  } else if (strcmp(mode, "env") == 0) {
    CHECK(strcmp(getenv("MCAST_SIM_DEVICES"), "3") == 0);
    mcast_config_init(&config);
    check_defaults_except_backend_and_devices(&config);
    CHECK(config.backend == MCAST_BACKEND_SIM);
    CHECK(config.sim_devices == 3);
  } else if (strcmp(mode, "malformed") == 0) {
    CHECK(strcmp(getenv("MCAST_SIM_DEVICES"), "three") == 0);
    mcast_config_init(&config);
    check_defaults_except_backend_and_devices(&config);
    CHECK(config.backend == MCAST_BACKEND_SIM);
    CHECK(config.sim_devices == 4);
  } else {
    fprintf(stderr, "usage: config defaults|env|malformed\n");
    return 2;
  }
  /* NULL is ignored, not a crash. */
  mcast_config_init(NULL);
  return 0;
}
