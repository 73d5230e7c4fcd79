// examples/kernels/checks.cuh: kernels of the device API's GPU checks (examples/device_checks.cu):
// signals passed many times, a barrier no peer joins, a wait an abort ends.
#include "mcast/device.h"

// Ping-pong between rank 0 and rank 1 on `slot`, `rounds` times: each round rank 0 writes the
// round number into rank 1's copy, signals; rank 1 waits, checks, answers the same way. One thread.
extern "C" __global__ void ping_pong(const __grid_constant__ mcast_dev_team_t team,
                                     const __grid_constant__ mcast_dev_buffer_t buf, unsigned slot, unsigned rounds,
                                     int *status) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const int me = team.rank, other = 1 - team.rank;
  for (unsigned i = 1; i <= rounds; ++i) {
    if (me == 1) {
      const int st = mcast_dev_wait(&team, other, slot, MCAST_DEV_ACQUIRE, 0);
      if (st != MCAST_DEV_SUCCESS) { atomicCAS(status, 0, st); return; }
      if (*(volatile unsigned *)mcast_dev_local(&buf, 0) != i) { atomicCAS(status, 0, 1000 + (int)i); return; }
    }
    *(volatile unsigned *)mcast_dev_peer(&buf, other, 0) = i;
    mcast_dev_signal(&team, other, slot, MCAST_DEV_RELEASE);
    if (me == 0) {
      const int st = mcast_dev_wait(&team, other, slot, MCAST_DEV_ACQUIRE, 0);
      if (st != MCAST_DEV_SUCCESS) { atomicCAS(status, 0, st); return; }
      if (*(volatile unsigned *)mcast_dev_local(&buf, 0) != i) { atomicCAS(status, 0, 1000 + (int)i); return; }
    }
  }
}

// A barrier on `slot` with `timeout_ns` (0: the team's), its status in *status, the global timer
// at the end in *ended (ns).
extern "C" __global__ void lone_barrier(const __grid_constant__ mcast_dev_team_t team, unsigned slot,
                                        unsigned long long timeout_ns, int *status, unsigned long long *ended) {
  const int st = mcast_dev_barrier(&team, slot, MCAST_DEV_ACQ_REL, timeout_ns);
  if (threadIdx.x == 0) {
    *status = st;
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    *ended = t;
  }
}
