/* GPU: memory the application owns and out-of-place collectives on real CUDA devices over P2P
 * (never multicast: DESIGN.md, safety rule; ctest sets MCAST_MULTICAST=off and the config says
 * OFF), on device 0 repeated and on two devices where peer access allows:
 * - mcast_mem_alloc memory registered on every rank, mcast_all_reduce_into between two
 *   registered buffers, results read from the application's own pointers with cudaMemcpy;
 * - cudaMalloc memory: refused by mcast_buffer_register (NOT_SUPPORTED), served by
 *   mcast_team_all_reduce (in and out of place, past one scratch step, unaligned pointers);
 * - mcast_all_reduce_into captured in a CUDA graph and replayed.
 * Exits 77 (skipped) where no CUDA driver or device exists. Built only where CMake finds the
 * CUDA runtime. */
#include <string.h>

#include "cuda_rt.h"

#define N 2
#define COUNT (1 << 20) /* 4 MiB of floats: several chunks of the pointer form's scratch */
#define DEFAULT_KIND 4

static float host[N][COUNT], got[COUNT];

static void to_device(void *dst, const void *src, size_t bytes) { CHECK(cudaMemcpy(dst, src, bytes, DEFAULT_KIND) == 0); }
static void to_host(void *dst, const void *src, size_t bytes) { CHECK(cudaMemcpy(dst, src, bytes, DEFAULT_KIND) == 0); }

static void fill(void) {
  int r, i;
  for (r = 0; r < N; r++)
    for (i = 0; i < COUNT; i++) host[r][i] = (float)((i * 7 + r * 3) % 9) - 4.0f;
}

/* got == k * (host[0] + host[1]) */
static void expect_sum(float k) {
  int i;
  for (i = 0; i < COUNT; i++) CHECK(got[i] == k * (host[0][i] + host[1][i]));
}

static void run(mcast_context_t ctx, const int *devices) {
  const size_t bytes = sizeof host[0];
  mcast_team_t team = {0};
  mcast_buffer_t send = {0}, recv = {0}, refused = {0};
  mcast_stream_t streams[N];
  void *in[N], *out[N], *plain_in[N], *plain_out[N];
  cudaGraph_t graphs[N];
  cudaGraphExec_t execs[N];
  int r, k;

  fill();
  CHECK_OK(mcast_team_create(ctx, devices, N, &team));
  for (r = 0; r < N; r++) {
    CHECK(cudaSetDevice(devices[r]) == 0);
    CHECK(cudaStreamCreate(&streams[r]) == 0);
    CHECK_OK(mcast_mem_alloc(ctx, devices[r], bytes, &in[r]));
    CHECK_OK(mcast_mem_alloc(ctx, devices[r], bytes, &out[r]));
    CHECK(cudaMalloc(&plain_in[r], bytes) == 0);
    CHECK(cudaMalloc(&plain_out[r], bytes) == 0);
    to_device(in[r], host[r], bytes);
    to_device(plain_in[r], host[r], bytes);
  }
  /* Registered memory, out of place. */
  CHECK_OK(mcast_buffer_register(team, in, bytes, &send));
  CHECK_OK(mcast_buffer_register(team, out, bytes, &recv));
  for (r = 0; r < N; r++)
    CHECK_OK(mcast_all_reduce_into(send, 0, recv, 0, r, COUNT, MCAST_FLOAT32, MCAST_SUM, streams[r]));
  for (r = 0; r < N; r++) CHECK_OK(mcast_synchronize(team, r, streams[r]));
  for (r = 0; r < N; r++) {
    to_host(got, out[r], bytes);
    expect_sum(1.0f);
  }
  /* cudaMalloc memory does not register, and runs through the pointer form. */
  CHECK_STATUS(mcast_buffer_register(team, plain_in, bytes, &refused), MCAST_ERROR_NOT_SUPPORTED);
  for (r = 0; r < N; r++)
    CHECK_OK(mcast_team_all_reduce(team, r, plain_in[r], plain_out[r], COUNT, MCAST_FLOAT32, MCAST_SUM, streams[r]));
  for (r = 0; r < N; r++) CHECK_OK(mcast_synchronize(team, r, streams[r]));
  for (r = 0; r < N; r++) {
    to_host(got, plain_out[r], bytes);
    expect_sum(1.0f);
  }
  for (r = 0; r < N; r++)
    CHECK_OK(mcast_team_all_reduce(team, r, plain_out[r], plain_out[r], COUNT, MCAST_FLOAT32, MCAST_SUM, streams[r]));
  for (r = 0; r < N; r++) CHECK_OK(mcast_synchronize(team, r, streams[r]));
  for (r = 0; r < N; r++) {
    to_host(got, plain_out[r], bytes);
    expect_sum(2.0f);
  }
  /* Pointers that are not 16-byte aligned (the push kernel's element path), ranks at different
   * offsets, an odd count: recv[i] = sum of send[i + 1] over the ranks. */
  {
    const int odd = COUNT - 11;
    /* Uploads first: a cudaMemcpy between the ranks' launches would wait for rank 0's kernel,
     * which waits for rank 1's. */
    for (r = 0; r < N; r++) to_device(plain_in[r], host[r], bytes);
    for (r = 0; r < N; r++)
      CHECK_OK(mcast_team_all_reduce(team, r, (float *)plain_in[r] + 1, (float *)plain_out[r] + 2 + r, odd, MCAST_FLOAT32,
                                     MCAST_SUM, streams[r]));
    for (r = 0; r < N; r++) CHECK_OK(mcast_synchronize(team, r, streams[r]));
    for (r = 0; r < N; r++) {
      int i;
      to_host(got, (float *)plain_out[r] + 2 + r, (size_t)odd * sizeof(float));
      for (i = 0; i < odd; i++) CHECK(got[i] == host[0][i + 1] + host[1][i + 1]);
    }
  }
  /* The pointer form on registered memory: zero-copy, in place. */
  for (r = 0; r < N; r++)
    CHECK_OK(mcast_team_all_reduce(team, r, out[r], out[r], COUNT, MCAST_FLOAT32, MCAST_SUM, streams[r]));
  for (r = 0; r < N; r++) CHECK_OK(mcast_synchronize(team, r, streams[r]));
  for (r = 0; r < N; r++) {
    to_host(got, out[r], bytes);
    expect_sum(2.0f);
  }
  /* Out of place in a CUDA graph: every replay recomputes recv from the untouched send. */
  for (r = 0; r < N; r++) {
    CHECK(cudaStreamBeginCapture(streams[r], 0) == 0);
    CHECK_OK(mcast_all_reduce_into(send, 0, recv, 0, r, COUNT, MCAST_FLOAT32, MCAST_SUM, streams[r]));
    CHECK(cudaStreamEndCapture(streams[r], &graphs[r]) == 0);
    CHECK(cudaGraphInstantiate(&execs[r], graphs[r], 0) == 0);
  }
  for (k = 0; k < 3; k++)
    for (r = 0; r < N; r++) CHECK(cudaGraphLaunch(execs[r], streams[r]) == 0);
  for (r = 0; r < N; r++) CHECK_OK(mcast_synchronize(team, r, streams[r]));
  for (r = 0; r < N; r++) {
    to_host(got, out[r], bytes);
    expect_sum(1.0f);
    CHECK(cudaGraphExecDestroy(execs[r]) == 0);
    CHECK(cudaGraphDestroy(graphs[r]) == 0);
  }
  /* Teardown: the memory is refused while registered, then freed after the buffers. */
  CHECK_STATUS(mcast_mem_free(ctx, in[0]), MCAST_ERROR_IN_USE);
  CHECK_OK(mcast_buffer_free(send));
  CHECK_OK(mcast_buffer_free(recv));
  for (r = 0; r < N; r++) {
    CHECK_OK(mcast_mem_free(ctx, in[r]));
    CHECK_OK(mcast_mem_free(ctx, out[r]));
    CHECK(cudaFree(plain_in[r]) == 0);
    CHECK(cudaFree(plain_out[r]) == 0);
    CHECK(cudaStreamDestroy(streams[r]) == 0);
  }
  CHECK_OK(mcast_team_destroy(team));
  printf("devices %d,%d: registered, out of place, pointer form and graph replay correct\n", devices[0], devices[1]);
}

int main(void) {
  static const int same[N] = {0, 0}, distinct[N] = {0, 1};
  mcast_context_t ctx = gpu_context();
  int count = 0, can = 0;

  CHECK_OK(mcast_device_count(ctx, &count));
  run(ctx, same);
  if (count >= 2) {
    CHECK_OK(mcast_device_can_access_peer(ctx, 0, 1, &can));
    if (can) run(ctx, distinct);
  }
  check_no_leaks(ctx);
  CHECK_OK(mcast_context_destroy(ctx));
  return 0;
}
