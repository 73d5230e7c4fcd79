// kernels/dtype.cuh: element types and operators: dtype/op codes (as mcast_dtype_t, mcast_op_t),
// storage and accumulation types, and Vec, a 16-byte vector unpacked into accumulators.

// Dtype codes as mcast_dtype_t; operator codes as mcast_op_t.
#define D_F32 0
#define D_F64 1
#define D_F16 2
#define D_BF16 3
#define D_I32 4
#define D_U32 5
#define D_I64 6
#define D_U64 7
#define O_SUM 0
#define O_MIN 1
#define O_MAX 2

// Ty<D>: E the storage type, A the accumulation type (f32 for 16-bit floats), up and down the
// conversions between them.
template <int D>
struct Ty;
#define MCAST_TY(D, ET, AT, UP, DOWN)                                \
  template <>                                                        \
  struct Ty<D> {                                                     \
    typedef ET E;                                                    \
    typedef AT A;                                                    \
    static __device__ __forceinline__ A up(E x) { return UP; }       \
    static __device__ __forceinline__ E down(A x) { return DOWN; }   \
  };
MCAST_TY(D_F32, float, float, x, x)
MCAST_TY(D_F64, double, double, x, x)
MCAST_TY(D_F16, u16, float, f16_to_f32(x), f32_to_f16(x))
MCAST_TY(D_BF16, u16, float, bf16_to_f32(x), f32_to_bf16(x))
MCAST_TY(D_I32, int, int, x, x)
MCAST_TY(D_U32, u32, u32, x, x)
MCAST_TY(D_I64, i64, i64, x, x)
MCAST_TY(D_U64, u64, u64, x, x)

// Sums of signed integers wrap (two's complement), computed in unsigned arithmetic.
__device__ __forceinline__ float op_sum(float a, float b) { return a + b; }
__device__ __forceinline__ double op_sum(double a, double b) { return a + b; }
__device__ __forceinline__ int op_sum(int a, int b) { return (int)((u32)a + (u32)b); }
__device__ __forceinline__ u32 op_sum(u32 a, u32 b) { return a + b; }
__device__ __forceinline__ i64 op_sum(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
__device__ __forceinline__ u64 op_sum(u64 a, u64 b) { return a + b; }

template <int O>
struct Op;
template <>
struct Op<O_SUM> {
  template <class A>
  static __device__ __forceinline__ A f(A a, A b) {
    return op_sum(a, b);
  }
};
template <>
struct Op<O_MIN> {
  template <class A>
  static __device__ __forceinline__ A f(A a, A b) {
    return b < a ? b : a;
  }
};
template <>
struct Op<O_MAX> {
  template <class A>
  static __device__ __forceinline__ A f(A a, A b) {
    return a < b ? b : a;
  }
};

// A 16-byte vector unpacked into accumulators.
template <int D>
struct Vec {
  typedef typename Ty<D>::E E;
  typedef typename Ty<D>::A A;
  static const int K = 16 / sizeof(E);
  A a[K];
  __device__ __forceinline__ void load(V16 v) {
    union {
      V16 v;
      E e[K];
    } u;
    u.v = v;
#pragma unroll
    for (int i = 0; i < K; ++i) a[i] = Ty<D>::up(u.e[i]);
  }
  __device__ __forceinline__ V16 pack() const {
    union {
      V16 v;
      E e[K];
    } u;
#pragma unroll
    for (int i = 0; i < K; ++i) u.e[i] = Ty<D>::down(a[i]);
    return u.v;
  }
  template <int O>
  __device__ __forceinline__ void reduce(V16 v) {
    Vec<D> o;
    o.load(v);
#pragma unroll
    for (int i = 0; i < K; ++i) a[i] = Op<O>::f(a[i], o.a[i]);
  }
};
