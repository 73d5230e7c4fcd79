// examples/device_checks.cu: the device API's GPU checks (ctest -L gpu), on two ranks:
//   device_checks signals [rounds]  signals passed back and forth (default 10^4), payload checked
//   device_checks timeout           a barrier no peer joins returns TIMEOUT within its timeout and
//                                   poisons the team (mcast_team_get_error; later barriers fail at once)
//   device_checks abort             mcast_team_abort from another thread ends a device wait within 1 ms
#include "example.h"
#include "kernels/checks.cuh"

#include <chrono>
#include <cstring>
#include <thread>

static int signals(Ranks &r, unsigned rounds) {
  mcast_buffer_t buf;
  CHECK_MCAST(mcast_buffer_alloc(r.team, 64, &buf));
  int *status[RANKS];
  for (int i = 0; i < RANKS; ++i) {
    CHECK_CUDA(cudaSetDevice(r.dev[i]));
    CHECK_CUDA(cudaMalloc(&status[i], sizeof(int)));
    CHECK_CUDA(cudaMemset(status[i], 0, sizeof(int)));
  }
  // Twice: the second launch continues from the counters the first left (graph-replay rule).
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < RANKS; ++i) {
      CHECK_CUDA(cudaSetDevice(r.dev[i]));
      ping_pong<<<1, 32, 0, r.stream[i]>>>(r.handle[i], buffer_handle(buf, i), 7, rounds, status[i]);
    }
    ranks_sync(r);
    for (int i = 0; i < RANKS; ++i) {
      int st = -1;
      CHECK_CUDA(cudaMemcpy(&st, status[i], sizeof st, cudaMemcpyDeviceToHost));
      if (st != 0) std::fprintf(stderr, "rank %d: status %d\n", i, st);
      EXPECT(st == 0);
    }
  }
  std::printf("signals: %u rounds x 2 launches: ok\n", rounds);
  for (int i = 0; i < RANKS; ++i) CHECK_CUDA(cudaFree(status[i]));
  CHECK_MCAST(mcast_buffer_free(buf));
  return 0;
}

struct Probe {
  int *status;
  unsigned long long *ended;
};

static Probe probe(int dev) {
  Probe p{};
  CHECK_CUDA(cudaSetDevice(dev));
  CHECK_CUDA(cudaMalloc(&p.status, sizeof(int)));
  CHECK_CUDA(cudaMalloc(&p.ended, sizeof(unsigned long long)));
  CHECK_CUDA(cudaMemset(p.status, 0xff, sizeof(int)));
  return p;
}

static int read_status(const Probe &p) {
  int st = -1;
  CHECK_CUDA(cudaMemcpy(&st, p.status, sizeof st, cudaMemcpyDeviceToHost));
  return st;
}

static int timeout(Ranks &r) {
  const Probe p = probe(r.dev[0]);
  const unsigned long long limit = 50ull * 1000 * 1000;  // 50 ms
  const auto t0 = std::chrono::steady_clock::now();
  lone_barrier<<<1, 64, 0, r.stream[0]>>>(r.handle[0], 3, limit, p.status, p.ended);  // rank 1 never joins
  CHECK_CUDA(cudaStreamSynchronize(r.stream[0]));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("timeout: barrier returned %d after %.1f ms\n", read_status(p), ms);
  EXPECT(read_status(p) == MCAST_ERROR_TIMEOUT);
  EXPECT(ms < 50 + 1000);
  mcast_status_t e = MCAST_SUCCESS;
  CHECK_MCAST(mcast_team_get_error(r.team, &e));
  EXPECT(e == MCAST_ERROR_TIMEOUT);
  std::printf("timeout: the team reports %s: %s\n", mcast_status_string(e), mcast_last_error());
  // Poisoned: the next barrier returns the error at once, without signalling or waiting.
  const auto t1 = std::chrono::steady_clock::now();
  lone_barrier<<<1, 64, 0, r.stream[0]>>>(r.handle[0], 4, 0, p.status, p.ended);
  CHECK_CUDA(cudaStreamSynchronize(r.stream[0]));
  const double again = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
  EXPECT(read_status(p) == MCAST_ERROR_TIMEOUT);
  EXPECT(again < 20);
  std::printf("timeout: a later barrier failed at once (%.2f ms): ok\n", again);
  return 0;
}

static int abort_wait(Ranks &r) {
  const Probe p = probe(r.dev[0]);
  // No timeout (0 means the team's: 30 s by default); only the abort can end it.
  lone_barrier<<<1, 64, 0, r.stream[0]>>>(r.handle[0], 5, 0, p.status, p.ended);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the kernel is spinning now
  EXPECT(cudaStreamQuery(r.stream[0]) == cudaErrorNotReady);
  std::chrono::steady_clock::time_point aborted;
  std::thread other([&] {
    aborted = std::chrono::steady_clock::now();
    CHECK_MCAST(mcast_team_abort(r.team));
  });
  other.join();
  // Wait for the kernel by polling (a synchronize would see the aborted team's error first).
  while (cudaStreamQuery(r.stream[0]) == cudaErrorNotReady) {
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - aborted).count();
  std::printf("abort: the wait returned %d %.3f ms after mcast_team_abort\n", read_status(p), ms);
  EXPECT(read_status(p) == MCAST_ERROR_ABORTED);
  EXPECT(ms < 1.0 + 0.5);  // within 1 ms of the abort (+ the host's polling)
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "signals";
  Ranks r = ranks_open();
  int rc = 2;
  if (std::strcmp(mode, "signals") == 0) rc = signals(r, argc > 2 ? (unsigned)std::atoi(argv[2]) : 10000);
  else if (std::strcmp(mode, "timeout") == 0) rc = timeout(r);
  else if (std::strcmp(mode, "abort") == 0) rc = abort_wait(r);
  else std::fprintf(stderr, "unknown mode %s\n", mode);
  // A failed team is destroyed without waiting for peers.
  for (int i = 0; i < RANKS; ++i) {
    CHECK_CUDA(cudaSetDevice(r.dev[i]));
    cudaStreamDestroy(r.stream[i]);
  }
  mcast_team_destroy(r.team);
  CHECK_MCAST(mcast_context_destroy(r.ctx));
  return rc;
}
