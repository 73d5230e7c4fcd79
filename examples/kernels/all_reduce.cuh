// examples/kernels/all_reduce.cuh: an all-reduce of one's own with mcast/device.h: f32 sum, in
// place, of n floats (n % 4 == 0) of a symmetric buffer. One source for MULTICAST teams (multimem
// instructions) and P2P teams (their exact emulation); compiled by nvcc (examples/all_reduce.cu)
// and by NVRTC (examples/nvrtc_all_reduce.cpp, tests/device_header.rs).
#include "mcast/device.h"

extern "C" __global__ void my_all_reduce(const __grid_constant__ mcast_dev_team_t team,
                                         const __grid_constant__ mcast_dev_buffer_t buf, unsigned long long n,
                                         int *status) {
  // Every rank's input is written, and no rank still reads an earlier result.
  int st = mcast_dev_barrier(&team, blockIdx.x, MCAST_DEV_ACQ_REL, 0);
  if (st == MCAST_DEV_SUCCESS) {
    // Rank r sums its share of the 16-byte vectors over every rank and stores the sum on every rank.
    const unsigned long long vecs = n / 4, share = (vecs + team.nranks - 1) / team.nranks;
    const unsigned long long end = share * (team.rank + 1) < vecs ? share * (team.rank + 1) : vecs;
    for (unsigned long long i = share * team.rank + blockIdx.x * blockDim.x + threadIdx.x; i < end;
         i += (unsigned long long)gridDim.x * blockDim.x)
      mcast_dev_mm_st_f32x4(&buf, 16 * i, mcast_dev_mm_ld_add_f32x4(&buf, 16 * i));
    // Every rank's stores are done before any rank reads the result.
    st = mcast_dev_barrier(&team, blockIdx.x, MCAST_DEV_ACQ_REL, 0);
  }
  if (st != MCAST_DEV_SUCCESS && threadIdx.x == 0) atomicCAS(status, 0, st);
}
