// Uses every function of mcast/device.h once (tests/device_header.rs compiles it with NVRTC).
#include "mcast/device.h"

extern "C" __global__ void use_all(const __grid_constant__ mcast_dev_team_t t,
                                   const __grid_constant__ mcast_dev_buffer_t b, unsigned long long *out) {
  unsigned long long acc = 0;
  const size_t o = 16 * (threadIdx.x + blockIdx.x * blockDim.x);
  acc += (unsigned long long)mcast_dev_local(&b, o) + (unsigned long long)mcast_dev_peer(&b, 1, o);
  acc += (unsigned long long)mcast_dev_mc(&b, o) + (unsigned)mcast_dev_has_multicast(&t);
  acc += (unsigned)mcast_dev_barrier(&t, blockIdx.x, MCAST_DEV_ACQ_REL, 0);
  acc += (unsigned)mcast_dev_barrier(&t, blockIdx.x, MCAST_DEV_RELAXED, 1000);
  if (threadIdx.x == 0) {
    mcast_dev_signal(&t, (t.rank + 1) % t.nranks, 3, MCAST_DEV_RELEASE);
    acc += (unsigned)mcast_dev_wait(&t, (t.rank + t.nranks - 1) % t.nranks, 3, MCAST_DEV_ACQUIRE, 0);
  }
  mcast_dev_v16_t v = mcast_dev_mm_ld_add_bf16x8(&b, o);
  v.x ^= mcast_dev_mm_ld_min_bf16x8(&b, o).x ^ mcast_dev_mm_ld_max_bf16x8(&b, o).y;
  v.y ^= mcast_dev_mm_ld_add_f16x8(&b, o).z ^ mcast_dev_mm_ld_min_f16x8(&b, o).w ^ mcast_dev_mm_ld_max_f16x8(&b, o).x;
  mcast_dev_mm_st_bf16x8(&b, o, v);
  mcast_dev_mm_st_f16x8(&b, o, v);
  mcast_dev_mm_red_add_bf16x8(&b, o, v);
  mcast_dev_mm_red_add_f16x8(&b, o, v);
  mcast_dev_f32x4_t f = mcast_dev_mm_ld_add_f32x4(&b, o);
  mcast_dev_mm_st_f32x4(&b, o, f);
  mcast_dev_mm_red_add_f32x4(&b, o, f);
  float s = mcast_dev_mm_ld_add_f32(&b, o);
  mcast_dev_mm_st_f32(&b, o, s);
  mcast_dev_mm_red_add_f32(&b, o, s);
  double d = mcast_dev_mm_ld_add_f64(&b, o);
  mcast_dev_mm_st_f64(&b, o, d);
  mcast_dev_mm_red_add_f64(&b, o, d);
  unsigned u = mcast_dev_mm_ld_add_u32(&b, o) + mcast_dev_mm_ld_min_u32(&b, o) + mcast_dev_mm_ld_max_u32(&b, o);
  mcast_dev_mm_st_u32(&b, o, u);
  mcast_dev_mm_red_add_u32(&b, o, u);
  mcast_dev_mm_red_min_u32(&b, o, u);
  mcast_dev_mm_red_max_u32(&b, o, u);
  int i = mcast_dev_mm_ld_add_s32(&b, o) + mcast_dev_mm_ld_min_s32(&b, o) + mcast_dev_mm_ld_max_s32(&b, o);
  mcast_dev_mm_st_s32(&b, o, i);
  mcast_dev_mm_red_add_s32(&b, o, i);
  mcast_dev_mm_red_min_s32(&b, o, i);
  mcast_dev_mm_red_max_s32(&b, o, i);
  unsigned long long q = mcast_dev_mm_ld_add_u64(&b, o) + mcast_dev_mm_ld_min_u64(&b, o) + mcast_dev_mm_ld_max_u64(&b, o);
  mcast_dev_mm_st_u64(&b, o, q);
  mcast_dev_mm_red_add_u64(&b, o, q);
  mcast_dev_mm_red_min_u64(&b, o, q);
  mcast_dev_mm_red_max_u64(&b, o, q);
  const float eight[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const mcast_dev_v16_t p = mcast_dev_pack_bf16x8(eight), h = mcast_dev_pack_f16x8(eight);
  acc += (unsigned)(mcast_dev_bf16x8_get(p, 3) + mcast_dev_f16x8_get(h, 5) + mcast_dev_bf16x2_hi(p.x) +
                    mcast_dev_f16x2_lo(h.y) + mcast_dev_bf16_to_f32(mcast_dev_f32_to_bf16(s)) +
                    mcast_dev_f16_to_f32(mcast_dev_f32_to_f16(s)));
  out[threadIdx.x] = acc + v.x + (unsigned)f.x + (unsigned long long)d + u + i + q;
}
