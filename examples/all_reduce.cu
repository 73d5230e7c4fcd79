// examples/all_reduce.cu: the all-reduce of one's own (kernels/all_reduce.cuh) on two ranks,
// checked against a host reference, eager and over CUDA-graph replays.
//   all_reduce [replays]     (default 1000)
#include "example.h"
#include "kernels/all_reduce.cuh"

#include <vector>

int main(int argc, char **argv) {
  const int replays = argc > 1 ? std::atoi(argv[1]) : 1000;
  const size_t n = (size_t)1 << 20;  // floats per rank
  Ranks r = ranks_open();
  mcast_buffer_t buf;
  CHECK_MCAST(mcast_buffer_alloc(r.team, n * sizeof(float), &buf));
  int *status[RANKS];
  std::vector<float> in(n), back(n);
  // Rank i holds i + 1 + (k % 7): the sum is exact in f32, and every replay doubles it (times 2
  // = RANKS) exactly as long as it stays below 2^24: the check after replays allows for that.
  auto fill = [&] {
    for (int i = 0; i < RANKS; ++i) {
      for (size_t k = 0; k < n; ++k) in[k] = (float)(i + 1 + (int)(k % 7));
      CHECK_MCAST(mcast_buffer_write(buf, i, 0, in.data(), n * sizeof(float)));
    }
  };
  auto launch = [&](int i) {
    const mcast_dev_buffer_t b = buffer_handle(buf, i);
    my_all_reduce<<<8, 512, 0, r.stream[i]>>>(r.handle[i], b, n, status[i]);
  };
  for (int i = 0; i < RANKS; ++i) {
    CHECK_CUDA(cudaSetDevice(r.dev[i]));
    CHECK_CUDA(cudaMalloc(&status[i], sizeof(int)));
    CHECK_CUDA(cudaMemset(status[i], 0, sizeof(int)));
  }
  auto check = [&](double scale, const char *what) {
    for (int i = 0; i < RANKS; ++i) {
      int st = -1;
      CHECK_CUDA(cudaMemcpy(&st, status[i], sizeof st, cudaMemcpyDeviceToHost));
      EXPECT(st == 0);
      CHECK_MCAST(mcast_buffer_read(buf, i, 0, back.data(), n * sizeof(float)));
      for (size_t k = 0; k < n; ++k) {
        double want = 0;
        for (int q = 0; q < RANKS; ++q) want += q + 1 + (int)(k % 7);
        if (back[k] != (float)(want * scale)) {
          std::fprintf(stderr, "%s: rank %d element %zu: %g, want %g\n", what, i, k, back[k], want * scale);
          std::exit(1);
        }
      }
    }
  };
  // Eager.
  fill();
  for (int i = 0; i < RANKS; ++i) {
    CHECK_CUDA(cudaSetDevice(r.dev[i]));
    launch(i);
  }
  ranks_sync(r);
  check(1, "eager");
  std::printf("eager: ok\n");
  // Graphs: one per rank, replayed; each replay sums again (x RANKS), so refill every 16.
  cudaGraphExec_t exec[RANKS];
  for (int i = 0; i < RANKS; ++i) {
    cudaGraph_t g;
    CHECK_CUDA(cudaSetDevice(r.dev[i]));
    CHECK_CUDA(cudaStreamBeginCapture(r.stream[i], cudaStreamCaptureModeThreadLocal));
    launch(i);
    CHECK_CUDA(cudaStreamEndCapture(r.stream[i], &g));
    CHECK_CUDA(cudaGraphInstantiate(&exec[i], g, 0));
    CHECK_CUDA(cudaGraphDestroy(g));
  }
  for (int done = 0; done < replays;) {
    const int burst = replays - done < 16 ? replays - done : 16;
    fill();
    for (int k = 0; k < burst; ++k)
      for (int i = 0; i < RANKS; ++i) {
        CHECK_CUDA(cudaSetDevice(r.dev[i]));
        CHECK_CUDA(cudaGraphLaunch(exec[i], r.stream[i]));
      }
    ranks_sync(r);
    double scale = 1;
    for (int k = 1; k < burst; ++k) scale *= RANKS;
    check(scale, "graph burst");
    done += burst;
  }
  std::printf("%d graph replays: ok\n", replays);
  for (int i = 0; i < RANKS; ++i) {
    CHECK_CUDA(cudaGraphExecDestroy(exec[i]));
    CHECK_CUDA(cudaFree(status[i]));
  }
  CHECK_MCAST(mcast_buffer_free(buf));
  ranks_close(r);
  return 0;
}
