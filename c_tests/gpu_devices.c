/* GPU: a CUDA-backend context sees real devices with sane properties. Exits 77 (skipped) where
 * no CUDA driver or device exists. Runs with MCAST_BACKEND=cuda and MCAST_MULTICAST=off. */
#include <string.h>

#include "cuda_rt.h"

int main(void) {
  mcast_context_t ctx = gpu_context();
  int count = 0, device;

  CHECK_OK(mcast_device_count(ctx, &count));
  CHECK(count > 0);
  for (device = 0; device < count; device++) {
    mcast_device_info_t info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK_OK(mcast_device_get_info(ctx, device, &info));
    printf("device %d: %s, sm_%d%d, %llu MiB, multicast supported %d usable %d (%s)\n", device,
           info.name, info.cc_major, info.cc_minor, (unsigned long long)(info.total_memory >> 20),
           info.multicast_supported, info.multicast_usable, info.multicast_reason);
    CHECK(info.ordinal == device);
    CHECK(memchr(info.name, '\0', sizeof info.name) != NULL);
    CHECK(info.name[0] != '\0');
    CHECK(info.total_memory > 0);
    CHECK(info.cc_major >= 7);
    CHECK(memchr(info.multicast_reason, '\0', sizeof info.multicast_reason) != NULL);
    /* MCAST_MULTICAST=off: never usable, and the reason says so. */
    CHECK(info.multicast_usable == 0);
    CHECK(info.multicast_reason[0] != '\0');
  }
  {
    mcast_device_info_t info;
    info.struct_size = sizeof info;
    CHECK_STATUS(mcast_device_get_info(ctx, count, &info), MCAST_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(mcast_device_get_info(ctx, -1, &info), MCAST_ERROR_INVALID_ARGUMENT);
  }
  CHECK_OK(mcast_context_destroy(ctx));
  return 0;
}
