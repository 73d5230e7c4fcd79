/* The CUDA runtime functions the GPU tests call, declared here so they need no CUDA header
 * (CUDA 12+ signatures; the tests link CUDA::cudart), and the tests' context: the CUDA backend,
 * multicast off (never a multicast object on a shared GPU machine: DESIGN.md, safety rule), or
 * exit 77 (skipped) where no CUDA driver or device exists. */
#ifndef MCAST_TEST_CUDA_RT_H
#define MCAST_TEST_CUDA_RT_H

#include <stddef.h>

#include "check.h"

typedef struct CUstream_st *cudaStream_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
extern int cudaSetDevice(int device);
extern int cudaStreamCreate(cudaStream_t *stream);
extern int cudaStreamDestroy(cudaStream_t stream);
extern int cudaMalloc(void **ptr, size_t size);
extern int cudaFree(void *ptr);
extern int cudaMemcpy(void *dst, const void *src, size_t count, int kind); /* 4: cudaMemcpyDefault */
extern int cudaStreamBeginCapture(cudaStream_t stream, int mode);         /* 0: cudaStreamCaptureModeGlobal */
extern int cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
extern int cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags);
extern int cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
extern int cudaGraphExecDestroy(cudaGraphExec_t exec);
extern int cudaGraphDestroy(cudaGraph_t graph);

/* A CUDA-backend context with multicast off, or exit 77 where there is no CUDA. */
static inline mcast_context_t gpu_context(void) {
  mcast_config_t config;
  mcast_context_t ctx = {0};
  mcast_status_t status;
  mcast_config_init(&config);
  config.backend = MCAST_BACKEND_CUDA;
  config.multicast = MCAST_MULTICAST_OFF;
  status = mcast_context_create(&config, &ctx);
  if (status == MCAST_ERROR_DRIVER_UNAVAILABLE) {
    printf("skipped: no CUDA driver or device: %s\n", mcast_last_error());
    exit(77);
  }
  CHECK_OK(status);
  return ctx;
}

#endif
