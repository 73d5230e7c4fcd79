// bench/cuda-load-wait.cu: which CUDA driver calls wait for a kernel already running in the same
// context? Kernel `spin` waits (at most 2 s, by %globaltimer) for a flag that kernel `release`,
// launched after the call under test on another stream, sets; a call that waits for running
// kernels therefore takes the 2 s and the spinner times out. This is the situation of a
// collective kernel waiting for a peer rank that the same host thread has not issued yet.
// Modes: 0 cuModuleLoadData; 1 cuModuleGetFunction + launch of a function never loaded;
// 2 cuFuncLoad + launch; 3 launch of a function loaded earlier; 4 cuLibraryLoadData +
// cuLibraryGetKernel + cuKernelGetFunction + launch; 5 as 4 with cuFuncLoad.
// Build and run on a GPU machine (sm_90 PTX inside):
//   nvcc -O2 -o /tmp/load-wait bench/cuda-load-wait.cu -lcuda
//   for m in 0 1 2 3 4 5; do for l in LAZY EAGER; do CUDA_MODULE_LOADING=$l /tmp/load-wait $m; done; done
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define CK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char* s; cuGetErrorString(r, &s); printf("%s: %s\n", #x, s); exit(1); } } while (0)
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static const char* ptx_a =
".version 8.0\n.target sm_90\n.address_size 64\n"
".visible .entry spin(.param .u64 f, .param .u64 o) {\n .reg .u64 %a<8>; .reg .u32 %r<4>; .reg .pred %p<3>;\n"
" ld.param.u64 %a1, [f]; ld.param.u64 %a6, [o]; mov.u64 %a2, %globaltimer;\n"
"L: ld.volatile.global.u32 %r1, [%a1]; setp.ne.u32 %p1, %r1, 0; @%p1 bra D;\n"
" mov.u64 %a3, %globaltimer; sub.u64 %a4, %a3, %a2; setp.lt.u64 %p2, %a4, 2000000000; @%p2 bra L;\n"
" st.global.u32 [%a6], 2; ret;\nD: st.global.u32 [%a6], 1; ret; }\n"
".visible .entry release(.param .u64 f) { .reg .u64 %a<2>; ld.param.u64 %a1, [f]; st.volatile.global.u32 [%a1], 1; ret; }\n";
static const char* ptx_b =
".version 8.0\n.target sm_90\n.address_size 64\n"
".visible .entry other(.param .u64 f) { .reg .u64 %a<2>; ld.param.u64 %a1, [f]; st.volatile.global.u32 [%a1], 1; ret; }\n";
int main(int argc, char** argv) {
  if (argc != 2 || atoi(argv[1]) < 0 || atoi(argv[1]) > 5) {
    fprintf(stderr, "usage: %s MODE (0-5, see the file's first lines)\n", argv[0]);
    return 2;
  }
  int mode = atoi(argv[1]);
  CK(cuInit(0)); CUdevice d; CK(cuDeviceGet(&d, 0)); CUcontext c; CK(cuDevicePrimaryCtxRetain(&c, d)); CK(cuCtxSetCurrent(c));
  CUmodule ma, mb; CK(cuModuleLoadData(&ma, ptx_a)); CUfunction spin, rel; CK(cuModuleGetFunction(&spin, ma, "spin")); CK(cuModuleGetFunction(&rel, ma, "release"));
  CK(cuFuncLoad(spin)); CK(cuFuncLoad(rel));
  CUmoduleLoadingMode lm; CK(cuModuleGetLoadingMode(&lm)); printf("loading mode %s\n", lm == CU_MODULE_LAZY_LOADING ? "lazy" : "eager");
  CUdeviceptr flag, out; CK(cuMemAlloc(&flag, 4)); CK(cuMemAlloc(&out, 4)); CK(cuMemsetD32(flag, 0, 1)); CK(cuMemsetD32(out, 0, 1)); CK(cuCtxSynchronize());
  CUstream s1, s2; CK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING)); CK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  if (mode >= 1) CK(cuModuleLoadData(&mb, ptx_b));
  CUfunction other = 0; if (mode >= 2) CK(cuModuleGetFunction(&other, mb, "other"));
  if (mode >= 3) CK(cuFuncLoad(other));
  CUdeviceptr dummy; CK(cuMemAlloc(&dummy, 4)); void* pb[] = {&dummy};
  void* pa[] = {&flag, &out}; CK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s1, pa, 0));
  double t0 = now();
  if (mode == 0) CK(cuModuleLoadData(&mb, ptx_b));
  if (mode == 1) CK(cuModuleGetFunction(&other, mb, "other"));
  if (mode == 2) CK(cuFuncLoad(other));
  if (mode == 3 || mode == 2 || mode == 1) CK(cuLaunchKernel(other, 1, 1, 1, 1, 1, 1, 0, s2, pb, 0));
  if (mode == 4 || mode == 5) {
    CUlibrary lib; CUkernel k; CUfunction f;
    CK(cuLibraryLoadData(&lib, ptx_b, 0, 0, 0, 0, 0, 0));
    double tl = now();
    CK(cuLibraryGetKernel(&k, lib, "other"));
    CK(cuKernelGetFunction(&f, k));
    double tg = now();
    if (mode == 5) CK(cuFuncLoad(f));
    double tf = now();
    CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s2, pb, 0));
    printf("  library: load %.3f s, get kernel+function %.3f s, cuFuncLoad %.3f s\n", tl - t0, tg - tl, tf - tg);
  }
  double t1 = now();
  void* pr[] = {&flag}; CK(cuLaunchKernel(rel, 1, 1, 1, 1, 1, 1, 0, s2, pr, 0));
  CK(cuCtxSynchronize()); unsigned o; CK(cuMemcpyDtoH(&o, out, 4));
  const char* what[] = {"cuModuleLoadData", "cuModuleGetFunction+launch", "cuFuncLoad+launch", "launch of a loaded new function", "cuLibraryLoadData+get+launch", "cuLibraryLoadData+get+cuFuncLoad+launch"};
  printf("%-34s while a kernel spins: %.3f s; spinner %s\n", what[mode], t1 - t0, o == 1 ? "released (no wait)" : "timed out (the call waited for it)");
  return 0;
}
