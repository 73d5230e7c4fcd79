/* API.md "Conventions" and "Context": creation with and without a config, argument checks,
 * unknown enum values, the zero handle, double destroy, stale handles, struct_size, and
 * out-parameters written only on success. Runs with MCAST_BACKEND=sim. */
#include <string.h>

#include "check.h"

static const mcast_context_t zero_handle = {0};

static mcast_config_t sim_config(void) {
  mcast_config_t config;
  mcast_config_init(&config);
  config.backend = MCAST_BACKEND_SIM;
  return config;
}

/* A failing create leaves *out alone and says why. */
static void check_create_fails(const mcast_config_t *config, mcast_status_t expected,
                               const char *what) {
  mcast_context_t ctx = {0x1234u};
  mcast_status_t status = mcast_context_create(config, &ctx);
  if (status != expected) {
    fprintf(stderr, "mcast_context_create(%s) returned %s, expected %s\n  mcast_last_error: %s\n",
            what, mcast_status_string(status), mcast_status_string(expected), mcast_last_error());
    exit(1);
  }
  CHECK(ctx.id == 0x1234u);
  CHECK(mcast_last_error()[0] != '\0');
}

int main(void) {
  mcast_context_t ctx = {0}, other = {0}, never_issued = {0x7fff0000ffffull};
  mcast_config_t config;
  int count = -1;

  /* NULL config: mcast_config_init's defaults and environment (MCAST_BACKEND=sim). */
  CHECK_OK(mcast_context_create(NULL, &ctx));
  CHECK(ctx.id != 0);
  CHECK_OK(mcast_device_count(ctx, &count));
  CHECK(count > 0);
  CHECK_OK(mcast_context_destroy(ctx));

  /* An explicit SIM config; its sim_devices is what the context has. */
  config = sim_config();
  config.sim_devices = 2;
  CHECK_OK(mcast_context_create(&config, &ctx));
  CHECK_OK(mcast_device_count(ctx, &count));
  CHECK(count == 2);

  /* Two live contexts have different handles. */
  CHECK_OK(mcast_context_create(&config, &other));
  CHECK(other.id != 0 && other.id != ctx.id);
  CHECK_OK(mcast_context_destroy(other));

  /* NULL out-pointers. */
  CHECK_STATUS(mcast_context_create(&config, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(mcast_last_error()[0] != '\0');
  CHECK_STATUS(mcast_device_count(ctx, NULL), MCAST_ERROR_INVALID_ARGUMENT);

  /* Never trust an enum from C: unknown values are INVALID_ARGUMENT. */
  config = sim_config();
  config.backend = (mcast_backend_t)77;
  check_create_fails(&config, MCAST_ERROR_INVALID_ARGUMENT, "backend = 77");
  config = sim_config();
  config.multicast = (mcast_multicast_t)77;
  check_create_fails(&config, MCAST_ERROR_INVALID_ARGUMENT, "multicast = 77");

  /* The simulator models up to 72 GPUs (an NVL72 rack), not one more. */
  config = sim_config();
  config.sim_devices = 72;
  CHECK_OK(mcast_context_create(&config, &other));
  CHECK_OK(mcast_device_count(other, &count));
  CHECK(count == 72);
  CHECK_OK(mcast_context_destroy(other));
  config.sim_devices = 73;
  check_create_fails(&config, MCAST_ERROR_INVALID_ARGUMENT, "sim_devices = 73");

  /* struct_size must be filled (mcast_config_init or sizeof). */
  config = sim_config();
  config.struct_size = 0;
  check_create_fails(&config, MCAST_ERROR_INVALID_ARGUMENT, "struct_size = 0");

  /* The zero handle: destroy is a no-op, any other use is INVALID_HANDLE. */
  CHECK_OK(mcast_context_destroy(zero_handle));
  CHECK_STATUS(mcast_device_count(zero_handle, &count), MCAST_ERROR_INVALID_HANDLE);

  /* A handle never issued. */
  CHECK_STATUS(mcast_device_count(never_issued, &count), MCAST_ERROR_INVALID_HANDLE);
  CHECK_STATUS(mcast_context_destroy(never_issued), MCAST_ERROR_INVALID_HANDLE);

  /* Destroy, then every use of the stale handle is INVALID_HANDLE, and out-params stay put. */
  CHECK_OK(mcast_context_destroy(ctx));
  count = -1;
  CHECK_STATUS(mcast_device_count(ctx, &count), MCAST_ERROR_INVALID_HANDLE);
  CHECK(count == -1);
  CHECK(mcast_last_error()[0] != '\0');
  CHECK_STATUS(mcast_context_destroy(ctx), MCAST_ERROR_INVALID_HANDLE);

  /* A new context does not revive the old handle. */
  config = sim_config();
  CHECK_OK(mcast_context_create(&config, &other));
  CHECK(other.id != ctx.id);
  CHECK_STATUS(mcast_device_count(ctx, &count), MCAST_ERROR_INVALID_HANDLE);
  CHECK_OK(mcast_context_destroy(other));
  return 0;
}
