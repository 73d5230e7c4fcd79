// mcast/device.h alone in a host C++ translation unit: the structs, macros and layout asserts
// compile without CUDA (the device functions are compiled only by nvcc and NVRTC).
#include <mcast/device.h>

#include <cstddef>
#include <cstdio>

static_assert(sizeof(mcast_dev_team_t) == 128, "team handle");
static_assert(offsetof(mcast_dev_buffer_t, peer_stride) == 40, "buffer handle");

int main() {
  mcast_dev_buffer_t b{};
  b.struct_size = sizeof b;
  std::printf("device_header_cpp: ok (%u bytes, version %d)\n", b.struct_size, MCAST_DEV_VERSION);
  return b.struct_size == 128 ? 0 : 1;
}
