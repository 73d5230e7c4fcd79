// examples/kernels/fused_rmsnorm.cuh: all-reduce + residual add + RMSNorm in one kernel (bf16,
// token-sharded), with mcast/device.h.
//
//   x   symmetric [tokens][hidden] bf16: each rank's partial sums in; the normalized output out,
//       on every rank
//   res symmetric [tokens][hidden] bf16: the residual in (the same on every rank); the new
//       residual h = bf16(sum(x) + res) out, on every rank
//   w   [hidden] bf16 weight, this rank's device memory
//   out = bf16(h * rsqrt(mean(h^2) + eps) * w)
//
// Rank r owns tokens [r * share, (r + 1) * share): one CTA per token at a time load-reduces the
// token's row over every rank (f32 accumulation), adds the residual, reduces the sum of squares
// across the CTA and stores h and the output on every rank (multimem.st, or its emulation).
// hidden % 8 == 0 and hidden <= 8 * FUSED_MAX_VPT * blockDim.x.
#include "mcast/device.h"

#define FUSED_MAX_VPT 4

// rsqrt(mean of squares + eps) of one token from each thread's sum of squares `ss`: a sum across
// the CTA (warps, then the first warp) through s_warp, free again for the next token on return.
static __device__ __forceinline__ float cta_rstd(float ss, float *s_warp, unsigned hidden, float eps) {
  for (int m = 16; m > 0; m >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, m);
  if ((threadIdx.x & 31) == 0) s_warp[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float t = threadIdx.x < (blockDim.x + 31) / 32 ? s_warp[threadIdx.x] : 0.0f;
    for (int m = 16; m > 0; m >>= 1) t += __shfl_xor_sync(0xffffffffu, t, m);
    if (threadIdx.x == 0) s_warp[0] = t;
  }
  __syncthreads();
  const float rstd = rsqrtf(s_warp[0] / (float)hidden + eps);
  __syncthreads();
  return rstd;
}

// out = bf16(h * rstd * w) for this thread's vectors of one token (vector v of the token is
// h[k], v = threadIdx.x + k * blockDim.x), each handed to store(v, packed).
template <class Store>
static __device__ __forceinline__ void scale_out(const float (&h)[FUSED_MAX_VPT][8], float rstd,
                                                 const unsigned short *w, unsigned vecs, Store store) {
  for (int k = 0; k < FUSED_MAX_VPT; ++k) {
    const unsigned v = threadIdx.x + k * blockDim.x;
    if (v >= vecs) break;
    const mcast_dev_v16_t wv = *(const mcast_dev_v16_t *)(w + 8 * v);
    float y[8];
    for (int i = 0; i < 8; ++i) y[i] = h[k][i] * rstd * mcast_dev_bf16x8_get(wv, i);
    store(v, mcast_dev_pack_bf16x8(y));
  }
}

extern "C" __global__ void fused_all_reduce_rmsnorm(const __grid_constant__ mcast_dev_team_t team,
                                                    const __grid_constant__ mcast_dev_buffer_t x,
                                                    const __grid_constant__ mcast_dev_buffer_t res,
                                                    const unsigned short *w, unsigned tokens, unsigned hidden,
                                                    float eps, int *status) {
  __shared__ float s_warp[32];
  int st = mcast_dev_barrier(&team, blockIdx.x, MCAST_DEV_ACQ_REL, 0);
  if (st == MCAST_DEV_SUCCESS) {
    const unsigned share = (tokens + team.nranks - 1) / team.nranks, begin = share * team.rank;
    const unsigned end = begin + share < tokens ? begin + share : tokens, vecs = hidden / 8;
    for (unsigned tok = begin + blockIdx.x; tok < end; tok += gridDim.x) {
      float h[FUSED_MAX_VPT][8];
      float ss = 0.0f;
      for (int k = 0; k < FUSED_MAX_VPT; ++k) {
        const unsigned v = threadIdx.x + k * blockDim.x;
        if (v >= vecs) break;
        const size_t off = 2 * ((size_t)tok * hidden + 8 * v);
        const mcast_dev_v16_t sum = mcast_dev_mm_ld_add_bf16x8(&x, off);
        const mcast_dev_v16_t r = *(const mcast_dev_v16_t *)mcast_dev_local(&res, off);
        for (int i = 0; i < 8; ++i) {
          const float s = mcast_dev_bf16x8_get(sum, i) + mcast_dev_bf16x8_get(r, i);
          h[k][i] = mcast_dev_bf16_to_f32(mcast_dev_f32_to_bf16(s));
          ss += h[k][i] * h[k][i];
        }
        mcast_dev_mm_st_bf16x8(&res, off, mcast_dev_pack_bf16x8(h[k]));
      }
      const float rstd = cta_rstd(ss, s_warp, hidden, eps);
      scale_out(h, rstd, w, vecs, [&](unsigned v, mcast_dev_v16_t y) {
        mcast_dev_mm_st_bf16x8(&x, 2 * ((size_t)tok * hidden + 8 * v), y);
      });
    }
    st = mcast_dev_barrier(&team, blockIdx.x, MCAST_DEV_ACQ_REL, 0);
  }
  if (st != MCAST_DEV_SUCCESS && threadIdx.x == 0) atomicCAS(status, 0, st);
}

// h = bf16(bf16(rank-order f32 sum of x) + res) for the 8 elements at byte `off`: this rank's x
// from its buffer, the others' from their planes (fused_push_rmsnorm).
static __device__ __forceinline__ void push_sum(const mcast_dev_buffer_t &x, const mcast_dev_buffer_t &res,
                                                const char *planes, size_t plane, int n, int me, size_t off,
                                                float h[8]) {
  float acc[8];
  for (int q = 0; q < n; ++q) {
    const mcast_dev_v16_t a = *(const mcast_dev_v16_t *)(q == me ? (const char *)mcast_dev_local(&x, off)
                                                                  : planes + (size_t)q * plane + off);
    for (int i = 0; i < 8; ++i) acc[i] = q == 0 ? mcast_dev_bf16x8_get(a, i) : acc[i] + mcast_dev_bf16x8_get(a, i);
  }
  const mcast_dev_v16_t r = *(const mcast_dev_v16_t *)mcast_dev_local(&res, off);
  for (int i = 0; i < 8; ++i)
    h[i] = mcast_dev_bf16_to_f32(
        mcast_dev_f32_to_bf16(mcast_dev_bf16_to_f32(mcast_dev_f32_to_bf16(acc[i])) + mcast_dev_bf16x8_get(r, i)));
}

// The CTA's tokens one at a time, every thread on each (FUSED_MAX_VPT vectors a thread at most).
static __device__ void push_norm_cta(const mcast_dev_buffer_t &x, const mcast_dev_buffer_t &res, const char *planes,
                                     size_t plane, int n, int me, const unsigned short *w, unsigned tokens,
                                     unsigned hidden, float eps) {
  __shared__ float s_warp[32];
  const unsigned vecs = hidden / 8;
  for (unsigned tok = blockIdx.x; tok < tokens; tok += gridDim.x) {
    float h[FUSED_MAX_VPT][8];
    float ss = 0.0f;
    for (int k = 0; k < FUSED_MAX_VPT; ++k) {
      const unsigned v = threadIdx.x + k * blockDim.x;
      if (v >= vecs) break;
      const size_t off = 2 * ((size_t)tok * hidden + 8 * v);
      push_sum(x, res, planes, plane, n, me, off, h[k]);
      for (int i = 0; i < 8; ++i) ss += h[k][i] * h[k][i];
      *(mcast_dev_v16_t *)mcast_dev_local(&res, off) = mcast_dev_pack_bf16x8(h[k]);
    }
    const float rstd = cta_rstd(ss, s_warp, hidden, eps);
    scale_out(h, rstd, w, vecs, [&](unsigned v, mcast_dev_v16_t y) {
      *(mcast_dev_v16_t *)mcast_dev_local(&x, 2 * ((size_t)tok * hidden + 8 * v)) = y;
    });
  }
}

// The CTA's tokens one warp each: h stored into res while the sum of squares accumulates, then
// the warp's sum, then h read back (this lane's own stores) for the output.
static __device__ void push_norm_warp(const mcast_dev_buffer_t &x, const mcast_dev_buffer_t &res, const char *planes,
                                      size_t plane, int n, int me, const unsigned short *w, unsigned tokens,
                                      unsigned hidden, float eps) {
  const unsigned vecs = hidden / 8, lane = threadIdx.x & 31u, warps = blockDim.x / 32;
  for (unsigned tok = blockIdx.x + (threadIdx.x / 32) * gridDim.x; tok < tokens; tok += warps * gridDim.x) {
    float ss = 0.0f;
#pragma unroll 4
    for (unsigned v = lane; v < vecs; v += 32) {
      const size_t off = 2 * ((size_t)tok * hidden + 8 * v);
      float h[8];
      push_sum(x, res, planes, plane, n, me, off, h);
      for (int i = 0; i < 8; ++i) ss += h[i] * h[i];
      *(mcast_dev_v16_t *)mcast_dev_local(&res, off) = mcast_dev_pack_bf16x8(h);
    }
    for (int m = 16; m > 0; m >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, m);
    const float rstd = rsqrtf(ss / (float)hidden + eps);
#pragma unroll 4
    for (unsigned v = lane; v < vecs; v += 32) {
      const size_t off = 2 * ((size_t)tok * hidden + 8 * v);
      const mcast_dev_v16_t hv = *(const mcast_dev_v16_t *)mcast_dev_local(&res, off);
      const mcast_dev_v16_t wv = *(const mcast_dev_v16_t *)(w + 8 * v);
      float y[8];
      for (int i = 0; i < 8; ++i) y[i] = mcast_dev_bf16x8_get(hv, i) * rstd * mcast_dev_bf16x8_get(wv, i);
      *(mcast_dev_v16_t *)mcast_dev_local(&x, off) = mcast_dev_pack_bf16x8(y);
    }
  }
}

// The same operation for teams without multicast (P2P), by push: each rank stores its rows of x
// into every peer's `scratch` (one plane per sender, two parities), signals, and then every rank
// normalizes every token from its own memory, so no rank writes another's x or res and the
// data crosses NVLink once, one way (the multimem kernel above reads across it and writes back
// across it). CTA b handles tokens b, b + gridDim.x, ... (all its threads on each token when
// it has at most two, else one warp per token); it pushes exactly
// the rows its peer's CTA b will read, so a signal per (peer, CTA) on slot b is the only
// synchronisation: no barrier. The same grid on every rank.
//
//   scratch symmetric, 2 * nranks * tokens * hidden bf16: [parity][sender][token][hidden]
//   epoch   [gridDim.x] unsigned, this rank's device memory, zero before the first call: CTA b's
//           calls so far. The parity is epoch[b] & 1: a peer's CTA b writes parity p of call
//           k + 2 only after this rank's CTA b signalled in call k + 1, which comes after this
//           rank's call k (the one reading parity p) ended on its stream.
// Sums in rank order 0..n-1 in f32, rounded to bf16 (the multimem kernel's emulation gives the
// same bits), so both kernels produce identical outputs.
extern "C" __global__ void fused_push_rmsnorm(const __grid_constant__ mcast_dev_team_t team,
                                              const __grid_constant__ mcast_dev_buffer_t x,
                                              const __grid_constant__ mcast_dev_buffer_t res,
                                              const __grid_constant__ mcast_dev_buffer_t scratch,
                                              const unsigned short *w, unsigned tokens, unsigned hidden, float eps,
                                              unsigned *epoch, int *status) {
  __shared__ int s_st;
  const int n = team.nranks, me = team.rank;
  const unsigned vecs = hidden / 8;
  const size_t elems = (size_t)tokens * hidden;
  const unsigned parity = epoch[blockIdx.x] & 1u;
  const size_t plane = 2 * elems;                      // bytes of one sender's plane
  const size_t base = (size_t)parity * n * plane;      // this parity's planes
  if (threadIdx.x == 0) s_st = MCAST_DEV_SUCCESS;
  // 1. Push this CTA's rows to every peer, 16 bytes a thread at a time, several in flight.
  const unsigned rows = tokens > blockIdx.x ? (tokens - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  const unsigned total = rows * vecs;
  for (int q = 1; q < n; ++q) {
    const int p = (me + q) % n;
    char *dst = (char *)mcast_dev_peer(&scratch, p, base + (size_t)me * plane);
    const char *src = (const char *)mcast_dev_local(&x, 0);
#pragma unroll 4
    for (unsigned i = threadIdx.x; i < total; i += blockDim.x) {
      const size_t off = 2 * ((size_t)(blockIdx.x + (i / vecs) * gridDim.x) * hidden + 8 * (i % vecs));
      *(mcast_dev_v16_t *)(dst + off) = *(const mcast_dev_v16_t *)(src + off);
    }
  }
  __syncthreads();
  // 2. Signal every peer (thread 0 releases what the CTA stored, which bar.sync made visible to
  // it), then wait for every peer's rows, one thread per peer.
  if (threadIdx.x == 0)
    for (int q = 1; q < n; ++q) mcast_dev_signal(&team, (me + q) % n, blockIdx.x, MCAST_DEV_RELEASE);
  if (threadIdx.x >= 1 && (int)threadIdx.x < n) {
    const int st = mcast_dev_wait(&team, (me + (int)threadIdx.x) % n, blockIdx.x, MCAST_DEV_ACQUIRE, 0);
    if (st != MCAST_DEV_SUCCESS) atomicCAS(&s_st, MCAST_DEV_SUCCESS, st);
  }
  __syncthreads();
  if (s_st != MCAST_DEV_SUCCESS) {
    if (threadIdx.x == 0) atomicCAS(status, 0, s_st);
    return;
  }
  // 3. Every token of this CTA from local memory. Few tokens (at most two a CTA): the whole CTA
  // on each, for latency; more: one warp per token, many in flight, for bandwidth.
  const char *planes = (const char *)mcast_dev_local(&scratch, base);
  if (tokens <= 2 * gridDim.x)
    push_norm_cta(x, res, planes, plane, n, me, w, tokens, hidden, eps);
  else
    push_norm_warp(x, res, planes, plane, n, me, w, tokens, hidden, eps);
  if (threadIdx.x == 0) epoch[blockIdx.x] += 1;
}

// The unfused comparison: RMSNorm with residual add on an already all-reduced x (every rank does
// every token of its own copy), for examples/fused_rmsnorm.cu --bench.
extern "C" __global__ void rmsnorm_residual(unsigned short *x, unsigned short *res, const unsigned short *w,
                                            unsigned tokens, unsigned hidden, float eps) {
  __shared__ float s_warp[32];
  const unsigned vecs = hidden / 8;
  for (unsigned tok = blockIdx.x; tok < tokens; tok += gridDim.x) {
    float h[FUSED_MAX_VPT][8];
    float ss = 0.0f;
    for (int k = 0; k < FUSED_MAX_VPT; ++k) {
      const unsigned v = threadIdx.x + k * blockDim.x;
      if (v >= vecs) break;
      const size_t e = (size_t)tok * hidden + 8 * v;
      const mcast_dev_v16_t a = *(const mcast_dev_v16_t *)(x + e), r = *(const mcast_dev_v16_t *)(res + e);
      for (int i = 0; i < 8; ++i) {
        h[k][i] = mcast_dev_bf16_to_f32(mcast_dev_f32_to_bf16(mcast_dev_bf16x8_get(a, i) + mcast_dev_bf16x8_get(r, i)));
        ss += h[k][i] * h[k][i];
      }
      *(mcast_dev_v16_t *)(res + e) = mcast_dev_pack_bf16x8(h[k]);
    }
    const float rstd = cta_rstd(ss, s_warp, hidden, eps);
    scale_out(h, rstd, w, vecs,
              [&](unsigned v, mcast_dev_v16_t y) { *(mcast_dev_v16_t *)(x + (size_t)tok * hidden + 8 * v) = y; });
  }
}
