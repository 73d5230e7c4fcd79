// examples/example.h: what the example programs share: a CUDA context of two ranks (on two GPUs,
// or sharing the one there is), one stream per rank, and checks that print and exit. Exit 77
// (ctest: skipped) where there is no CUDA driver or device.
#ifndef MCAST_EXAMPLE_H
#define MCAST_EXAMPLE_H

#include <cuda_runtime.h>
#include <mcast.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#define RANKS 2

#define CHECK_MCAST(call)                                                                             \
  do {                                                                                                \
    mcast_status_t s_ = (call);                                                                       \
    if (s_ != MCAST_SUCCESS) {                                                                        \
      std::fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, mcast_status_string(s_), \
                   mcast_last_error());                                                               \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)
#define CHECK_CUDA(call)                                                                                    \
  do {                                                                                                      \
    cudaError_t e_ = (call);                                                                                \
    if (e_ != cudaSuccess) {                                                                                \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));           \
      std::exit(1);                                                                                         \
    }                                                                                                       \
  } while (0)
#define EXPECT(cond)                                                                      \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);            \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

struct Ranks {
  mcast_context_t ctx;
  mcast_team_t team;
  int dev[RANKS];
  cudaStream_t stream[RANKS];
  mcast_dev_team_t handle[RANKS];
};

// A CUDA context (the MCAST_* environment applies: the GPU tests run with MCAST_MULTICAST=off),
// a team of two ranks, their streams and team handles.
static inline Ranks ranks_open() {
  Ranks r{};
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("skipped: no CUDA device\n");
    std::exit(77);
  }
  mcast_config_t config;
  mcast_config_init(&config);
  config.backend = MCAST_BACKEND_CUDA;
  const mcast_status_t s = mcast_context_create(&config, &r.ctx);
  if (s == MCAST_ERROR_DRIVER_UNAVAILABLE) {
    std::printf("skipped: %s\n", mcast_last_error());
    std::exit(77);
  }
  CHECK_MCAST(s);
  mcast_context_info_t info{};
  info.struct_size = sizeof info;
  CHECK_MCAST(mcast_context_get_info(r.ctx, &info));
  std::printf("mcast on %s (%s), CUDA driver %d\n", info.backend == MCAST_BACKEND_CUDA ? "CUDA" : "the SIMULATOR",
              info.backend_reason, info.driver_version);
  for (int i = 0; i < RANKS; ++i) r.dev[i] = ndev > 1 ? i : 0;
  CHECK_MCAST(mcast_team_create(r.ctx, r.dev, RANKS, &r.team));
  for (int i = 0; i < RANKS; ++i) {
    CHECK_CUDA(cudaSetDevice(r.dev[i]));
    CHECK_CUDA(cudaStreamCreateWithFlags(&r.stream[i], cudaStreamNonBlocking));
    r.handle[i].struct_size = sizeof r.handle[i];
    CHECK_MCAST(mcast_team_device_handle(r.team, i, &r.handle[i]));
  }
  return r;
}

static inline mcast_dev_buffer_t buffer_handle(mcast_buffer_t buf, int rank) {
  mcast_dev_buffer_t b{};
  b.struct_size = sizeof b;
  CHECK_MCAST(mcast_buffer_device_handle(buf, rank, &b));
  return b;
}

static inline void ranks_sync(const Ranks &r) {
  for (int i = 0; i < RANKS; ++i) {
    CHECK_CUDA(cudaSetDevice(r.dev[i]));
    CHECK_CUDA(cudaStreamSynchronize(r.stream[i]));
    CHECK_MCAST(mcast_synchronize(r.team, i, r.stream[i]));
  }
}

static inline void ranks_close(Ranks &r) {
  for (int i = 0; i < RANKS; ++i) {
    CHECK_CUDA(cudaSetDevice(r.dev[i]));
    CHECK_CUDA(cudaStreamDestroy(r.stream[i]));
  }
  CHECK_MCAST(mcast_team_destroy(r.team));
  CHECK_MCAST(mcast_context_destroy(r.ctx));
}

// bf16 <-> float on the host (round to nearest even).
static inline float bf16_to_float(unsigned short h) {
  unsigned u = (unsigned)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
static inline unsigned short float_to_bf16(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#endif
