/* A program written for NCCL, served by mcast (libmcast_nccl): one process, one communicator
 * per visible GPU (ncclCommInitAll), memory from ncclMemAlloc registered with ncclCommRegister,
 * one grouped all-reduce, the result checked on the host. Nothing here is mcast-specific: the
 * same source builds against NCCL's own nccl.h and libnccl.
 * Build: cc allreduce_nccl.c -o allreduce_nccl $(pkg-config --cflags --libs mcast-nccl) \
 *          -I$CUDA_HOME/include -L$CUDA_HOME/lib64 -lcudart -Wl,-rpath,$(pkg-config --variable=libdir mcast)
 *        (or CMake: target_link_libraries(app PRIVATE mcast::nccl CUDA::cudart))
 * Run:   MCAST_MULTICAST=off ./allreduce_nccl   (on a shared machine: peer to peer) */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#define CUDA_CHECK(call)                                                             \
  do {                                                                               \
    cudaError_t e_ = (call);                                                         \
    if (e_ != cudaSuccess) {                                                         \
      fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));             \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)
#define NCCL_CHECK(call)                                                             \
  do {                                                                               \
    ncclResult_t r_ = (call);                                                        \
    if (r_ != ncclSuccess) {                                                         \
      fprintf(stderr, "%s failed: %s: %s\n", #call, ncclGetErrorString(r_),          \
              ncclGetLastError(NULL));                                               \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

enum { MAX_DEV = 8, N = 1 << 20 };

int main(void) {
  int ndev = 0;
  CUDA_CHECK(cudaGetDeviceCount(&ndev));
  if (ndev < 1) {
    fprintf(stderr, "no GPU\n");
    return 77; /* skipped */
  }
  if (ndev > MAX_DEV) ndev = MAX_DEV;
  int devs[MAX_DEV];
  for (int i = 0; i < ndev; i++) devs[i] = i;
  ncclComm_t comms[MAX_DEV];
  NCCL_CHECK(ncclCommInitAll(comms, ndev, devs)); /* rank i on GPU i */

  float *send[MAX_DEV], *recv[MAX_DEV];
  void *hsend[MAX_DEV], *hrecv[MAX_DEV];
  cudaStream_t streams[MAX_DEV];
  static float host[N];
  for (int i = 0; i < ndev; i++) {
    CUDA_CHECK(cudaSetDevice(devs[i])); /* ncclMemAlloc allocates on the current device */
    CUDA_CHECK(cudaStreamCreate(&streams[i]));
    NCCL_CHECK(ncclMemAlloc((void **)&send[i], N * sizeof(float)));
    NCCL_CHECK(ncclMemAlloc((void **)&recv[i], N * sizeof(float)));
    for (int k = 0; k < N; k++) host[k] = (float)(i + k % 1000);
    CUDA_CHECK(cudaMemcpy(send[i], host, sizeof host, cudaMemcpyHostToDevice));
  }
  /* Registration is collective: every rank registers, here in one group. */
  NCCL_CHECK(ncclGroupStart());
  for (int i = 0; i < ndev; i++) {
    NCCL_CHECK(ncclCommRegister(comms[i], send[i], N * sizeof(float), &hsend[i]));
    NCCL_CHECK(ncclCommRegister(comms[i], recv[i], N * sizeof(float), &hrecv[i]));
  }
  NCCL_CHECK(ncclGroupEnd());

  NCCL_CHECK(ncclGroupStart()); /* one thread drives every rank: a group */
  for (int i = 0; i < ndev; i++)
    NCCL_CHECK(ncclAllReduce(send[i], recv[i], N, ncclFloat32, ncclSum, comms[i], streams[i]));
  NCCL_CHECK(ncclGroupEnd());

  long wrong = 0;
  for (int i = 0; i < ndev; i++) {
    CUDA_CHECK(cudaSetDevice(devs[i]));
    CUDA_CHECK(cudaStreamSynchronize(streams[i]));
    CUDA_CHECK(cudaMemcpy(host, recv[i], sizeof host, cudaMemcpyDeviceToHost));
    for (int k = 0; k < N; k++) wrong += host[k] != (float)(ndev * (ndev - 1) / 2 + ndev * (k % 1000));
  }
  printf("%d rank(s): %s\n", ndev, wrong ? "WRONG" : "ok");

  for (int i = 0; i < ndev; i++) { /* every rank deregisters before the memory is freed */
    NCCL_CHECK(ncclCommDeregister(comms[i], hsend[i]));
    NCCL_CHECK(ncclCommDeregister(comms[i], hrecv[i]));
  }
  for (int i = 0; i < ndev; i++) {
    NCCL_CHECK(ncclMemFree(send[i]));
    NCCL_CHECK(ncclMemFree(recv[i]));
    NCCL_CHECK(ncclCommDestroy(comms[i]));
    CUDA_CHECK(cudaSetDevice(devs[i]));
    CUDA_CHECK(cudaStreamDestroy(streams[i]));
  }
  return wrong != 0;
}
