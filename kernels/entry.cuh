// kernels/entry.cuh: entry-point conventions: KERNEL and ARGS, the module selection flags
// (MCAST_SELECT, MCAST_WHEN) and the (dtype, operator) lists the collectives instantiate.

// Names: mcast_<collective>_<path>[_twoshot][_<dtype>_<op>]; see KernelId::name in src/kernels/abi/.
#define KERNEL extern "C" __global__ void __launch_bounds__(MCAST_THREADS)
#define ARGS const __grid_constant__ McastArgs a
// The first statement of every entry point. A kernel launched programmatically (programmatic
// dependent launch: src/kernels/cuda.rs, programmatic_on) may start once the blocks of the kernel
// before it on its stream have exited, before that kernel's memory operations are complete and
// visible; griddepcontrol.wait returns once they are (at once after a plain launch), so nothing
// this kernel reads or writes can race the kernel before it. Before sm_90 launches are never
// programmatic and there is nothing to wait for.
#if __CUDA_ARCH__ >= 900
#define MCAST_ENTRY asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define MCAST_ENTRY ((void)0)
#endif

// Selection (src/kernels/select.rs): with -DMCAST_SELECT the host compiles only the entry points
// of one module, one collective for one dtype and operator (every algorithm of it: P2P one-shot,
// push, two-shot and multicast), and defines each MCAST_SEL_<collective|dtype|op> to 1 or 0.
// Without it every entry point is compiled (what scripts/check-kernels checks).
#ifndef MCAST_SELECT
#define MCAST_SEL_all_reduce 1
#define MCAST_SEL_reduce_scatter 1
#define MCAST_SEL_broadcast 1
#define MCAST_SEL_all_gather 1
#define MCAST_SEL_f32 1
#define MCAST_SEL_f64 1
#define MCAST_SEL_f16 1
#define MCAST_SEL_bf16 1
#define MCAST_SEL_i32 1
#define MCAST_SEL_u32 1
#define MCAST_SEL_i64 1
#define MCAST_SEL_u64 1
#define MCAST_SEL_sum 1
#define MCAST_SEL_min 1
#define MCAST_SEL_max 1
#define MCAST_SEL_ll 1
#endif
// MCAST_WHEN(c, d, o)(definitions...) keeps the definitions when all three flags are 1. The
// flags are expanded before MCAST_PASTE4 pastes them (they are not operands of ## here).
#define MCAST_PASTE4(a, b, c, d) a##b##c##d
#define MCAST_WHEN(c, d, o) MCAST_PASTE4(MCAST_WHEN_, c, d, o)
#define MCAST_WHEN_111(...) __VA_ARGS__
#define MCAST_WHEN_110(...)
#define MCAST_WHEN_101(...)
#define MCAST_WHEN_100(...)
#define MCAST_WHEN_011(...)
#define MCAST_WHEN_010(...)
#define MCAST_WHEN_001(...)
#define MCAST_WHEN_000(...)

// MCAST_IF_LL(definitions...) keeps the LL entry points when MCAST_SEL_ll is 1 (teams that run
// them; the others' modules leave them out).
#define MCAST_PASTE2(a, b) a##b
#define MCAST_IF_LL_(f) MCAST_PASTE2(MCAST_IF_LL_, f)
#define MCAST_IF_LL MCAST_IF_LL_(MCAST_SEL_ll)
#define MCAST_IF_LL_1(...) __VA_ARGS__
#define MCAST_IF_LL_0(...)

// The (dtype, operator) pairs, as M(dtype name, dtype code, operator name, operator code): those
// with a multimem.ld_reduce form (f32/f64 min/max have none, the host uses P2P for them), and
// every pair.
#define MCAST_EACH_OP(M, DN, D) M(DN, D, sum, O_SUM) M(DN, D, min, O_MIN) M(DN, D, max, O_MAX)
#define MCAST_EACH_MULTIMEM_REDUCTION(M) \
  M(f32, D_F32, sum, O_SUM)              \
  M(f64, D_F64, sum, O_SUM)              \
  MCAST_EACH_OP(M, f16, D_F16)           \
  MCAST_EACH_OP(M, bf16, D_BF16)         \
  MCAST_EACH_OP(M, i32, D_I32)           \
  MCAST_EACH_OP(M, u32, D_U32)           \
  MCAST_EACH_OP(M, i64, D_I64)           \
  MCAST_EACH_OP(M, u64, D_U64)
#define MCAST_EACH_REDUCTION(M)                           \
  MCAST_EACH_MULTIMEM_REDUCTION(M)                        \
  M(f32, D_F32, min, O_MIN) M(f32, D_F32, max, O_MAX)     \
  M(f64, D_F64, min, O_MIN) M(f64, D_F64, max, O_MAX)
