/* One small program built three times: against mcast::mcast_shared, mcast::mcast_static (and
 * nothing else) and mcast::mcast. Runs with MCAST_BACKEND=sim. */
#include <string.h>

#include "check.h"

int main(void) {
  int major = -1;
  int count = 0;
  mcast_context_t ctx = {0};

  mcast_get_version(&major, NULL, NULL);
  CHECK(major == MCAST_VERSION_MAJOR);
  CHECK(strcmp(mcast_status_string(MCAST_ERROR_INVALID_HANDLE), "MCAST_ERROR_INVALID_HANDLE") == 0);
  CHECK_OK(mcast_context_create(NULL, &ctx));
  CHECK_OK(mcast_device_count(ctx, &count));
  CHECK(count > 0);
  CHECK_OK(mcast_context_destroy(ctx));
  printf("mcast %d.%d.%d: %d simulated devices\n", MCAST_VERSION_MAJOR, MCAST_VERSION_MINOR,
         MCAST_VERSION_PATCH, count);
  return 0;
}
