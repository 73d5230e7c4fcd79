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
      // Sum of squares across the CTA: warps, then the first warp.
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
      __syncthreads();  // s_warp is reused by the next token
      for (int k = 0; k < FUSED_MAX_VPT; ++k) {
        const unsigned v = threadIdx.x + k * blockDim.x;
        if (v >= vecs) break;
        const size_t off = 2 * ((size_t)tok * hidden + 8 * v);
        const mcast_dev_v16_t wv = *(const mcast_dev_v16_t *)(w + 8 * v);
        float y[8];
        for (int i = 0; i < 8; ++i) y[i] = h[k][i] * rstd * mcast_dev_bf16x8_get(wv, i);
        mcast_dev_mm_st_bf16x8(&x, off, mcast_dev_pack_bf16x8(y));
      }
    }
    st = mcast_dev_barrier(&team, blockIdx.x, MCAST_DEV_ACQ_REL, 0);
  }
  if (st != MCAST_DEV_SUCCESS && threadIdx.x == 0) atomicCAS(status, 0, st);
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
    for (int k = 0; k < FUSED_MAX_VPT; ++k) {
      const unsigned v = threadIdx.x + k * blockDim.x;
      if (v >= vecs) break;
      const size_t e = (size_t)tok * hidden + 8 * v;
      const mcast_dev_v16_t wv = *(const mcast_dev_v16_t *)(w + 8 * v);
      float y[8];
      for (int i = 0; i < 8; ++i) y[i] = h[k][i] * rstd * mcast_dev_bf16x8_get(wv, i);
      *(mcast_dev_v16_t *)(x + e) = mcast_dev_pack_bf16x8(y);
    }
  }
}
