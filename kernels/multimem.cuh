// kernels/multimem.cuh: the multicast primitives (mc_*): multimem.ld_reduce and multimem.st (the
// instructions are mcast/device.h's raw-address forms, chosen here per dtype and operator), or
// their emulation over the peers' unicast pointers (-DMCAST_EMULATE_MULTIMEM).

// mc_ld_reduce_v16<D,O>(a, mc)    16-byte multimem.ld_reduce (vector form or 2/4 scalar forms)
// mc_ld_reduce_unit<D,O>(a, mc)   one scalar unit: 4 bytes (a 16-bit pair, or one 32-bit element)
//                                 or 8 bytes (one 64-bit element); bits in the low end of a u64
// mc_st_v16(a, mc, v)             16-byte multimem.st (.v4.f32 bit copy), mc an out_mc address
// mc_st_unit<U>(a, mc, bits)      4- or 8-byte multimem.st
// Not provided (no hardware form): f32/f64 min/max (routed to the P2P kernels by the host), any
// 16-bit scalar (the host routes odd 16-bit counts and non-4-byte-aligned ranges to P2P).
template <int D>
struct McUnit {
  static const u32 bytes = sizeof(typename Ty<D>::E) >= 8 ? 8 : 4;
};

#if defined(MCAST_EMULATE_MULTIMEM)
// Emulation: the multicast offset (mc - data_mc, or mc - sync_mc) applied to every rank's unicast
// address; reductions in rank order with f32 accumulation for 16-bit floats (as .acc::f32).
template <int D, int O>
__device__ __forceinline__ V16 mc_ld_reduce_v16(const McastArgs& a, u64 mc) {
  const u64 off = mc - a.data_mc;
  Vec<D> acc;
  acc.load(ld16(a.data[0] + off));
  for (u32 p = 1; p < a.nranks; ++p) acc.template reduce<O>(ld16(a.data[p] + off));
  return acc.pack();
}
template <int D, int O>
__device__ __forceinline__ u64 mc_ld_reduce_unit(const McastArgs& a, u64 mc) {
  typedef typename Ty<D>::E E;
  const u64 off = mc - a.data_mc;
  const int n = McUnit<D>::bytes / sizeof(E);
  union {
    u64 b;
    E e[8 / sizeof(E)];
  } u;
  u.b = 0;
  for (int i = 0; i < n; ++i) {
    typename Ty<D>::A acc = Ty<D>::up(*(const E*)(a.data[0] + off + i * sizeof(E)));
    for (u32 p = 1; p < a.nranks; ++p) acc = Op<O>::f(acc, Ty<D>::up(*(const E*)(a.data[p] + off + i * sizeof(E))));
    u.e[i] = Ty<D>::down(acc);
  }
  return u.b;
}
// Stores go to out (mc relative to out_mc), loads come from data (mc relative to data_mc).
__device__ __forceinline__ void mc_st_v16(const McastArgs& a, u64 mc, V16 v) {
  const u64 off = mc - a.out_mc;
  for (u32 p = 0; p < a.nranks; ++p) st16(a.out[p] + off, v);
}
template <u32 U>
__device__ __forceinline__ void mc_st_unit(const McastArgs& a, u64 mc, u64 bits) {
  const u64 off = mc - a.out_mc;
  for (u32 p = 0; p < a.nranks; ++p) {
    if (U == 8)
      *(u64*)(a.out[p] + off) = bits;
    else
      *(u32*)(a.out[p] + off) = (u32)bits;
  }
}
#else
// Real multimem forms: mcast/device.h's raw-address hardware functions (one implementation with
// the device API), chosen per (dtype, operator) here.
template <int D, int O>
__device__ __forceinline__ u32 mc_ldr32(u64 mc);
template <int D, int O>
__device__ __forceinline__ u64 mc_ldr64(u64 mc);
#define LDR32(D, O, FN)                               \
  template <>                                         \
  __device__ __forceinline__ u32 mc_ldr32<D, O>(u64 mc) { \
    return FN(mc);                                    \
  }
#define LDR64(D, O, FN)                               \
  template <>                                         \
  __device__ __forceinline__ u64 mc_ldr64<D, O>(u64 mc) { \
    return FN(mc);                                    \
  }
LDR32(D_F32, O_SUM, mcast_dev__hw_ld4_add_f32)
LDR32(D_BF16, O_SUM, mcast_dev__hw_ld4_add_bf16x2)
LDR32(D_BF16, O_MIN, mcast_dev__hw_ld4_min_bf16x2)
LDR32(D_BF16, O_MAX, mcast_dev__hw_ld4_max_bf16x2)
LDR32(D_F16, O_SUM, mcast_dev__hw_ld4_add_f16x2)
LDR32(D_F16, O_MIN, mcast_dev__hw_ld4_min_f16x2)
LDR32(D_F16, O_MAX, mcast_dev__hw_ld4_max_f16x2)
LDR32(D_I32, O_SUM, mcast_dev__hw_ld4_add_s32)
LDR32(D_I32, O_MIN, mcast_dev__hw_ld4_min_s32)
LDR32(D_I32, O_MAX, mcast_dev__hw_ld4_max_s32)
LDR32(D_U32, O_SUM, mcast_dev__hw_ld4_add_u32)
LDR32(D_U32, O_MIN, mcast_dev__hw_ld4_min_u32)
LDR32(D_U32, O_MAX, mcast_dev__hw_ld4_max_u32)
LDR64(D_F64, O_SUM, mcast_dev__hw_ld8_add_f64)
LDR64(D_I64, O_SUM, mcast_dev__hw_ld8_add_u64)  // same bits as s64 add
LDR64(D_I64, O_MIN, mcast_dev__hw_ld8_min_s64)
LDR64(D_I64, O_MAX, mcast_dev__hw_ld8_max_s64)
LDR64(D_U64, O_SUM, mcast_dev__hw_ld8_add_u64)
LDR64(D_U64, O_MIN, mcast_dev__hw_ld8_min_u64)
LDR64(D_U64, O_MAX, mcast_dev__hw_ld8_max_u64)

template <int D, int O>
__device__ __forceinline__ u64 mc_ld_reduce_unit(const McastArgs&, u64 mc) {
  if constexpr (McUnit<D>::bytes == 8) return mc_ldr64<D, O>(mc);
  else return mc_ldr32<D, O>(mc);
}
// Default 16-byte form: 4 (or 2) scalar ld_reduces (integers, f64: no vector forms).
template <int D, int O>
struct McV16 {
  static __device__ __forceinline__ V16 ld(u64 mc) {
    V16 v;
    if constexpr (McUnit<D>::bytes == 8) {
      const u64 lo = mc_ldr64<D, O>(mc), hi = mc_ldr64<D, O>(mc + 8);
      v.x = (u32)lo;
      v.y = (u32)(lo >> 32);
      v.z = (u32)hi;
      v.w = (u32)(hi >> 32);
    } else {
      v.x = mc_ldr32<D, O>(mc);
      v.y = mc_ldr32<D, O>(mc + 4);
      v.z = mc_ldr32<D, O>(mc + 8);
      v.w = mc_ldr32<D, O>(mc + 12);
    }
    return v;
  }
};
// The vector forms: mcast/device.h's.
#define LDV4_DEV(D, O, FN)                                                  \
  template <>                                                               \
  struct McV16<D, O> {                                                      \
    static __device__ __forceinline__ V16 ld(u64 mc) {                      \
      const mcast_dev_v16_t r = FN(mc);                                     \
      V16 v;                                                                \
      v.x = r.x;                                                            \
      v.y = r.y;                                                            \
      v.z = r.z;                                                            \
      v.w = r.w;                                                            \
      return v;                                                             \
    }                                                                       \
  };
LDV4_DEV(D_F32, O_SUM, mcast_dev__hw_ld16_add_f32x4)
LDV4_DEV(D_BF16, O_SUM, mcast_dev__hw_ld16_add_bf16x8)
LDV4_DEV(D_BF16, O_MIN, mcast_dev__hw_ld16_min_bf16x8)
LDV4_DEV(D_BF16, O_MAX, mcast_dev__hw_ld16_max_bf16x8)
LDV4_DEV(D_F16, O_SUM, mcast_dev__hw_ld16_add_f16x8)
LDV4_DEV(D_F16, O_MIN, mcast_dev__hw_ld16_min_f16x8)
LDV4_DEV(D_F16, O_MAX, mcast_dev__hw_ld16_max_f16x8)

template <int D, int O>
__device__ __forceinline__ V16 mc_ld_reduce_v16(const McastArgs&, u64 mc) {
  return McV16<D, O>::ld(mc);
}
// Stores: mcast/device.h's forms.
__device__ __forceinline__ void mc_st_v16(const McastArgs&, u64 mc, V16 v) {
  mcast_dev_v16_t w;
  w.x = v.x;
  w.y = v.y;
  w.z = v.z;
  w.w = v.w;
  mcast_dev__hw_st16(mc, w);
}
template <u32 U>
__device__ __forceinline__ void mc_st_unit(const McastArgs&, u64 mc, u64 bits) {
  if (U == 8)
    mcast_dev__hw_st8(mc, bits);
  else
    mcast_dev__hw_st4(mc, (u32)bits);
}
#endif

// Host preconditions of every kernel using these (checked by src/kernels before choosing them):
// data_mc and the range are multiples of the scalar unit (4 bytes; 8 for 64-bit types), (D,O) has
// a multimem form.
