// kernels/ptx.cuh: inline-PTX helpers: the global timer, system-scope acquire/release and
// atomics, bit casts and 16-bit float conversions, plain 16-byte loads and stores.

struct alignas(16) V16 {
  u32 x, y, z, w;
};

// The memory-order primitives are mcast/device.h's (one implementation for the device API and
// the library's kernels); these names keep the collectives' code short.
__device__ __forceinline__ u64 globaltimer() { return mcast_dev__globaltimer(); }
__device__ __forceinline__ u32 ld_acquire_sys(u64 addr) { return mcast_dev__ld_acquire(addr); }
__device__ __forceinline__ void red_release_sys_add(u64 addr, u32 v) { mcast_dev__red_add(addr, v, 1); }
__device__ __forceinline__ u32 atom_cas_u32(u64 addr, u32 cmp, u32 val) { return mcast_dev__cas(addr, cmp, val); }
__device__ __forceinline__ float u32_as_f32(u32 x) {
  float f;
  asm("mov.b32 %0, %1;" : "=f"(f) : "r"(x));
  return f;
}
__device__ __forceinline__ u32 f32_as_u32(float f) {
  u32 x;
  asm("mov.b32 %0, %1;" : "=r"(x) : "f"(f));
  return x;
}
__device__ __forceinline__ float bf16_to_f32(u16 h) {
#if __CUDA_ARCH__ >= 900
  float f;
  asm("cvt.f32.bf16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  return u32_as_f32(((u32)h) << 16);  // exact, same result
#endif
}
__device__ __forceinline__ u16 f32_to_bf16(float f) {
#if __CUDA_ARCH__ >= 800
  u16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  const u32 u = f32_as_u32(f);  // round to nearest even, as cvt.rn.bf16.f32
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40);
  return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}
__device__ __forceinline__ float f16_to_f32(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ u16 f32_to_f16(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

// Plain (weak) global accesses. Ordering against peers comes from the barriers (release/acquire
// at system scope, plus __syncthreads inside the block).
__device__ __forceinline__ V16 ld16(u64 addr) { return *(const V16*)addr; }
__device__ __forceinline__ void st16(u64 addr, V16 v) { *(V16*)addr = v; }
