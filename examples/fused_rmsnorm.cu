// examples/fused_rmsnorm.cu: all-reduce + residual add + RMSNorm fused in one kernel
// (kernels/fused_rmsnorm.cuh: multimem loads and stores on a multicast team, pushes into the
// peers' memory on a P2P team) on two ranks, checked against a host reference eager and over
// CUDA-graph replays; with --bench, timed against mcast_all_reduce followed by a separate
// RMSNorm kernel, eager and from CUDA graphs, for messages of 8 KiB to 32 MiB (BENCHMARKS.md).
//   fused_rmsnorm [replays]      (default 1000)
//   fused_rmsnorm --bench [iters]
#include "example.h"
#include "kernels/fused_rmsnorm.cuh"

#include <chrono>
#include <cmath>
#include <functional>
#include <cstring>
#include <vector>

static const unsigned HIDDEN = 4096;
static const float EPS = 1e-6f;

struct Problem {
  unsigned tokens;
  mcast_buffer_t x, res;
  unsigned short *w[RANKS];
  int *status[RANKS];
  // P2P teams (no multicast): fused_push_rmsnorm's landing planes and per-CTA call counts.
  mcast_buffer_t scratch;
  unsigned *epoch[RANKS];
};

// The fused kernel for the team's transport: multimem loads and stores where the team has
// multicast, pushes into the peers' memory where it has not (kernels/fused_rmsnorm.cuh).
static bool push(const Ranks &r) {
  mcast_team_info_t info{};
  info.struct_size = sizeof info;
  CHECK_MCAST(mcast_team_get_info(r.team, &info));
  return info.transport != MCAST_TRANSPORT_MULTICAST;
}

// The push kernel's grid: CTAs of 256 threads (a warp per token), at most 128 of them, so every
// CTA of both ranks is resident at once even where the ranks share a GPU (its waits spin).
static const unsigned PUSH_CTAS = 128, PUSH_THREADS = 256;

static float input(int rank, size_t e) { return (float)((int)((e * 2654435761u + rank * 40503u) % 17) - 8) / 8.0f; }
static float resid(size_t e) { return (float)((int)((e * 11u) % 13) - 6) / 4.0f; }
static float weight(size_t i) { return 0.5f + (float)(i % 5) / 4.0f; }

static void fill(const Ranks &r, const Problem &p) {
  const size_t elems = (size_t)p.tokens * HIDDEN;
  std::vector<unsigned short> host(elems);
  for (int i = 0; i < RANKS; ++i) {
    for (size_t e = 0; e < elems; ++e) host[e] = float_to_bf16(input(i, e));
    CHECK_MCAST(mcast_buffer_write(p.x, i, 0, host.data(), elems * 2));
    for (size_t e = 0; e < elems; ++e) host[e] = float_to_bf16(resid(e));
    CHECK_MCAST(mcast_buffer_write(p.res, i, 0, host.data(), elems * 2));
  }
  (void)r;
}

static Problem problem(const Ranks &r, unsigned tokens) {
  Problem p{};
  p.tokens = tokens;
  const size_t bytes = (size_t)tokens * HIDDEN * 2;
  CHECK_MCAST(mcast_buffer_alloc(r.team, bytes, &p.x));
  CHECK_MCAST(mcast_buffer_alloc(r.team, bytes, &p.res));
  if (push(r)) CHECK_MCAST(mcast_buffer_alloc(r.team, 2 * RANKS * bytes, &p.scratch));
  std::vector<unsigned short> w(HIDDEN);
  for (unsigned i = 0; i < HIDDEN; ++i) w[i] = float_to_bf16(weight(i));
  for (int i = 0; i < RANKS; ++i) {
    CHECK_CUDA(cudaSetDevice(r.dev[i]));
    CHECK_CUDA(cudaMalloc(&p.w[i], HIDDEN * 2));
    CHECK_CUDA(cudaMemcpy(p.w[i], w.data(), HIDDEN * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMalloc(&p.status[i], sizeof(int)));
    CHECK_CUDA(cudaMemset(p.status[i], 0, sizeof(int)));
    if (p.scratch.id != 0) {
      CHECK_CUDA(cudaMalloc(&p.epoch[i], PUSH_CTAS * sizeof(unsigned)));
      CHECK_CUDA(cudaMemset(p.epoch[i], 0, PUSH_CTAS * sizeof(unsigned)));
    }
  }
  return p;
}

static void problem_free(const Ranks &r, Problem &p) {
  for (int i = 0; i < RANKS; ++i) {
    CHECK_CUDA(cudaSetDevice(r.dev[i]));
    CHECK_CUDA(cudaFree(p.w[i]));
    CHECK_CUDA(cudaFree(p.status[i]));
    if (p.epoch[i]) CHECK_CUDA(cudaFree(p.epoch[i]));
  }
  if (p.scratch.id != 0) CHECK_MCAST(mcast_buffer_free(p.scratch));
  CHECK_MCAST(mcast_buffer_free(p.x));
  CHECK_MCAST(mcast_buffer_free(p.res));
}

static unsigned grid_for(unsigned tokens) {
  const unsigned share = (tokens + RANKS - 1) / RANKS;
  return share < 32 ? share : 32;
}

static void launch_fused(const Ranks &r, const Problem &p, int i) {
  if (p.scratch.id != 0) {
    fused_push_rmsnorm<<<p.tokens < PUSH_CTAS ? p.tokens : PUSH_CTAS, PUSH_THREADS, 0, r.stream[i]>>>(
        r.handle[i], buffer_handle(p.x, i), buffer_handle(p.res, i), buffer_handle(p.scratch, i), p.w[i], p.tokens,
        HIDDEN, EPS, p.epoch[i], p.status[i]);
    return;
  }
  fused_all_reduce_rmsnorm<<<grid_for(p.tokens), HIDDEN / 8 / FUSED_MAX_VPT, 0, r.stream[i]>>>(
      r.handle[i], buffer_handle(p.x, i), buffer_handle(p.res, i), p.w[i], p.tokens, HIDDEN, EPS, p.status[i]);
}

static void launch_all_reduce(const Ranks &r, const Problem &p, int i) {
  CHECK_MCAST(mcast_all_reduce(p.x, i, 0, (size_t)p.tokens * HIDDEN, MCAST_BFLOAT16, MCAST_SUM, r.stream[i]));
}

static void launch_norm(const Ranks &r, const Problem &p, int i) {
  void *x = nullptr, *res = nullptr;
  CHECK_MCAST(mcast_buffer_local_ptr(p.x, i, &x));
  CHECK_MCAST(mcast_buffer_local_ptr(p.res, i, &res));
  const unsigned grid = p.tokens < 132 ? p.tokens : 132;
  rmsnorm_residual<<<grid, HIDDEN / 8 / FUSED_MAX_VPT, 0, r.stream[i]>>>((unsigned short *)x, (unsigned short *)res,
                                                                           p.w[i], p.tokens, HIDDEN, EPS);
}

// The unfused pair on one rank (captured per rank: a capture launches nothing).
static void launch_unfused(const Ranks &r, const Problem &p, int i) {
  launch_all_reduce(r, p, i);
  launch_norm(r, p, i);
}

// The host reference: the rank-order f32 sum rounded to bf16 (what the emulated multimem load
// returns), h = bf16(sum + residual) exactly, out within bf16 rounding of the f32 formula.
static void check(const Ranks &r, const Problem &p, const char *what) {
  const size_t elems = (size_t)p.tokens * HIDDEN;
  std::vector<unsigned short> out(elems), h(elems);
  for (int i = 0; i < RANKS; ++i) {
    int st = -1;
    CHECK_CUDA(cudaSetDevice(r.dev[i]));
    CHECK_CUDA(cudaMemcpy(&st, p.status[i], sizeof st, cudaMemcpyDeviceToHost));
    EXPECT(st == 0);
    CHECK_MCAST(mcast_buffer_read(p.x, i, 0, out.data(), elems * 2));
    CHECK_MCAST(mcast_buffer_read(p.res, i, 0, h.data(), elems * 2));
    for (unsigned t = 0; t < p.tokens; ++t) {
      std::vector<float> hr(HIDDEN);
      double ss = 0;
      for (unsigned k = 0; k < HIDDEN; ++k) {
        const size_t e = (size_t)t * HIDDEN + k;
        float sum = 0;
        for (int q = 0; q < RANKS; ++q) sum += bf16_to_float(float_to_bf16(input(q, e)));
        sum = bf16_to_float(float_to_bf16(sum));
        hr[k] = bf16_to_float(float_to_bf16(sum + bf16_to_float(float_to_bf16(resid(e)))));
        ss += (double)hr[k] * hr[k];
        if (h[e] != float_to_bf16(hr[k])) {
          std::fprintf(stderr, "%s: rank %d token %u: h[%u] = %g, want %g\n", what, i, t, k, bf16_to_float(h[e]), hr[k]);
          std::exit(1);
        }
      }
      const double rstd = 1.0 / std::sqrt(ss / HIDDEN + EPS);
      for (unsigned k = 0; k < HIDDEN; ++k) {
        const double want = hr[k] * rstd * bf16_to_float(float_to_bf16(weight(k)));
        const double got = bf16_to_float(out[(size_t)t * HIDDEN + k]);
        if (std::fabs(got - want) > 1e-2 * std::fabs(want) + 1e-3) {
          std::fprintf(stderr, "%s: rank %d token %u: out[%u] = %g, want %g\n", what, i, t, k, got, want);
          std::exit(1);
        }
      }
    }
  }
}

static void run_all(const Ranks &r, const Problem &p, void (*launch)(const Ranks &, const Problem &, int)) {
  for (int i = 0; i < RANKS; ++i) {
    CHECK_CUDA(cudaSetDevice(r.dev[i]));
    launch(r, p, i);
  }
}

static void capture(const Ranks &r, const Problem &p, void (*launch)(const Ranks &, const Problem &, int), int times,
                    cudaGraphExec_t exec[RANKS]) {
  for (int i = 0; i < RANKS; ++i) {
    cudaGraph_t g;
    CHECK_CUDA(cudaSetDevice(r.dev[i]));
    CHECK_CUDA(cudaStreamBeginCapture(r.stream[i], cudaStreamCaptureModeThreadLocal));
    for (int k = 0; k < times; ++k) launch(r, p, i);
    CHECK_CUDA(cudaStreamEndCapture(r.stream[i], &g));
    CHECK_CUDA(cudaGraphInstantiate(&exec[i], g, 0));
    CHECK_CUDA(cudaGraphDestroy(g));
  }
}

static double time_us(const Ranks &r, int iters, const std::function<void()> &step) {
  step();
  ranks_sync(r);
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < iters; ++k) step();
  ranks_sync(r);
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
}

static int bench(const Ranks &r, int iters) {
  std::printf("| bytes | tokens | fused eager us | unfused eager us | fused graph us | unfused graph us |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (size_t bytes = 8 << 10; bytes <= (size_t)32 << 20; bytes *= 4) {
    const unsigned tokens = (unsigned)(bytes / (HIDDEN * 2)) ? (unsigned)(bytes / (HIDDEN * 2)) : 1;
    Problem p = problem(r, tokens);
    fill(r, p);
    const double fe = time_us(r, iters, [&] { run_all(r, p, launch_fused); });
    // Eagerly, one thread issues the all-reduce on every rank before any rank's RMSNorm: a
    // kernel's first launch loads it, and that load waits for the device's running kernels
    // (README, "One thread driving several ranks").
    const double ue = time_us(r, iters, [&] {
      run_all(r, p, launch_all_reduce);
      run_all(r, p, launch_norm);
    });
    const int per_graph = 10;
    cudaGraphExec_t f[RANKS], u[RANKS];
    capture(r, p, launch_fused, per_graph, f);
    capture(r, p, launch_unfused, per_graph, u);
    auto replay = [&](cudaGraphExec_t *e) {
      for (int i = 0; i < RANKS; ++i) {
        CHECK_CUDA(cudaSetDevice(r.dev[i]));
        CHECK_CUDA(cudaGraphLaunch(e[i], r.stream[i]));
      }
    };
    const double fg = time_us(r, iters / per_graph + 1, [&] { replay(f); }) / per_graph;
    const double ug = time_us(r, iters / per_graph + 1, [&] { replay(u); }) / per_graph;
    std::printf("| %zu | %u | %.1f | %.1f | %.1f | %.1f |\n", (size_t)tokens * HIDDEN * 2, tokens, fe, ue, fg, ug);
    for (int i = 0; i < RANKS; ++i) {
      CHECK_CUDA(cudaGraphExecDestroy(f[i]));
      CHECK_CUDA(cudaGraphExecDestroy(u[i]));
    }
    problem_free(r, p);
  }
  return 0;
}

int main(int argc, char **argv) {
  Ranks r = ranks_open();
  if (argc > 1 && std::strcmp(argv[1], "--bench") == 0) {
    bench(r, argc > 2 ? std::atoi(argv[2]) : 200);
    ranks_close(r);
    return 0;
  }
  const int replays = argc > 1 ? std::atoi(argv[1]) : 1000;
  Problem p = problem(r, 37);  // tokens not a multiple of the ranks
  fill(r, p);
  run_all(r, p, launch_fused);
  ranks_sync(r);
  check(r, p, "eager");
  std::printf("eager: ok\n");
  // Graph replays: the kernel works in place, so every 100th replay starts from fresh inputs and
  // is checked; the ones between run on the previous outputs (barriers and slots used each time).
  cudaGraphExec_t exec[RANKS];
  capture(r, p, launch_fused, 1, exec);
  for (int k = 0; k < replays; ++k) {
    if (k % 100 == 0) {
      ranks_sync(r);
      fill(r, p);
    }
    for (int i = 0; i < RANKS; ++i) {
      CHECK_CUDA(cudaSetDevice(r.dev[i]));
      CHECK_CUDA(cudaGraphLaunch(exec[i], r.stream[i]));
    }
    if (k % 100 == 0) {
      ranks_sync(r);
      check(r, p, "graph replay");
    }
  }
  ranks_sync(r);
  std::printf("%d graph replays: ok\n", replays);
  for (int i = 0; i < RANKS; ++i) CHECK_CUDA(cudaGraphExecDestroy(exec[i]));
  problem_free(r, p);
  ranks_close(r);
  return 0;
}
