// examples/nvrtc_all_reduce.cpp: the all-reduce of one's own (kernels/all_reduce.cuh) compiled at
// run time with NVRTC: the header comes from mcast_device_header_source, handed to NVRTC by name
// (no include path, no CUDA headers), then loaded and launched with the driver API.
//   nvrtc_all_reduce            (reads MCAST_EXAMPLES_DIR/kernels/all_reduce.cuh)
#include <cuda.h>
#include <nvrtc.h>

#include "example.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#define CHECK_CU(call)                                                              \
  do {                                                                              \
    CUresult e_ = (call);                                                           \
    if (e_ != CUDA_SUCCESS) {                                                       \
      const char *s_ = nullptr;                                                     \
      cuGetErrorString(e_, &s_);                                                    \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, s_ ? s_ : "?"); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)
#define CHECK_NVRTC(call)                                                                                \
  do {                                                                                                   \
    nvrtcResult e_ = (call);                                                                             \
    if (e_ != NVRTC_SUCCESS) {                                                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, nvrtcGetErrorString(e_));       \
      std::exit(1);                                                                                      \
    }                                                                                                    \
  } while (0)

static std::vector<char> compile(int dev) {
  std::ifstream f(MCAST_EXAMPLES_DIR "/kernels/all_reduce.cuh");
  std::stringstream src;
  src << f.rdbuf();
  EXPECT(f.good() && !src.str().empty());
  const char *header = mcast_device_header_source(nullptr);
  const char *name = "mcast/device.h";
  nvrtcProgram prog;
  CHECK_NVRTC(nvrtcCreateProgram(&prog, src.str().c_str(), "all_reduce.cu", 1, &header, &name));
  int major = 0, minor = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  const std::string arch = "--gpu-architecture=sm_" + std::to_string(major * 10 + minor);
  const char *opts[] = {arch.c_str(), "-std=c++17"};
  const nvrtcResult rc = nvrtcCompileProgram(prog, 2, opts);
  size_t n = 0;
  nvrtcGetProgramLogSize(prog, &n);
  std::string log(n, '\0');
  nvrtcGetProgramLog(prog, &log[0]);
  if (rc != NVRTC_SUCCESS) {
    std::fprintf(stderr, "NVRTC: %s\n%s\n", nvrtcGetErrorString(rc), log.c_str());
    std::exit(1);
  }
  CHECK_NVRTC(nvrtcGetCUBINSize(prog, &n));
  std::vector<char> cubin(n);
  CHECK_NVRTC(nvrtcGetCUBIN(prog, cubin.data()));
  CHECK_NVRTC(nvrtcDestroyProgram(&prog));
  return cubin;
}

int main() {
  Ranks r = ranks_open();
  const unsigned long long n = 1 << 16;
  mcast_buffer_t buf;
  CHECK_MCAST(mcast_buffer_alloc(r.team, n * sizeof(float), &buf));
  std::vector<float> host(n);
  CUmodule mod[RANKS];
  CUfunction fn[RANKS];
  int *status[RANKS];
  for (int i = 0; i < RANKS; ++i) {
    for (unsigned long long k = 0; k < n; ++k) host[k] = (float)(i * 3 + (int)(k % 5));
    CHECK_MCAST(mcast_buffer_write(buf, i, 0, host.data(), n * sizeof(float)));
    CHECK_CUDA(cudaSetDevice(r.dev[i]));
    CHECK_CUDA(cudaFree(nullptr));  // the primary context is current
    const std::vector<char> cubin = compile(r.dev[i]);
    CHECK_CU(cuModuleLoadData(&mod[i], cubin.data()));
    CHECK_CU(cuModuleGetFunction(&fn[i], mod[i], "my_all_reduce"));
    CHECK_CUDA(cudaMalloc(&status[i], sizeof(int)));
    CHECK_CUDA(cudaMemset(status[i], 0, sizeof(int)));
  }
  for (int i = 0; i < RANKS; ++i) {
    mcast_dev_buffer_t b = buffer_handle(buf, i);
    unsigned long long count = n;
    void *args[] = {&r.handle[i], &b, &count, &status[i]};
    CHECK_CUDA(cudaSetDevice(r.dev[i]));
    CHECK_CU(cuLaunchKernel(fn[i], 4, 1, 1, 256, 1, 1, 0, (CUstream)r.stream[i], args, nullptr));
  }
  ranks_sync(r);
  for (int i = 0; i < RANKS; ++i) {
    int st = -1;
    CHECK_CUDA(cudaMemcpy(&st, status[i], sizeof st, cudaMemcpyDeviceToHost));
    EXPECT(st == 0);
    CHECK_MCAST(mcast_buffer_read(buf, i, 0, host.data(), n * sizeof(float)));
    for (unsigned long long k = 0; k < n; ++k) {
      float want = 0;
      for (int q = 0; q < RANKS; ++q) want += (float)(q * 3 + (int)(k % 5));
      EXPECT(host[k] == want);
    }
    CHECK_CU(cuModuleUnload(mod[i]));
    CHECK_CUDA(cudaFree(status[i]));
  }
  std::printf("nvrtc all-reduce: ok\n");
  CHECK_MCAST(mcast_buffer_free(buf));
  ranks_close(r);
  return 0;
}
