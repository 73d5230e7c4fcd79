/* Getting started: two (or more) MPI processes, one GPU each, sum a vector with mcast.
 * Build: mpicc allreduce_mpi.c -o allreduce $(pkg-config --cflags --libs mcast) \
 *          -Wl,-rpath,$(pkg-config --variable=libdir mcast)
 * Run:   MCAST_BACKEND=sim mpirun -np 2 ./allreduce      (the simulator, no GPU needed)
 *        mpirun -np 2 ./allreduce                          (GPUs: rank i of a host uses GPU i) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "mcast.h"

#define CHECK(call)                                                                  \
  do {                                                                               \
    mcast_status_t s_ = (call);                                                      \
    if (s_ != MCAST_SUCCESS) {                                                       \
      fprintf(stderr, "%s failed: %s: %s\n", #call, mcast_status_string(s_),         \
              mcast_last_error());                                                   \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                  \
    }                                                                                \
  } while (0)

/* mcast calls this once, inside mcast_team_init_oob, on every rank. */
static int mpi_allgather(const void *send, void *recv, size_t bytes, void *user) {
  return MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE,
                       *(MPI_Comm *)user);
}

int main(int argc, char **argv) {
  enum { N = 1024 };
  int rank, nranks, local_rank, ndev, wrong = 0, any_wrong = 0;
  float x[N];
  MPI_Comm comm = MPI_COMM_WORLD, local;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &nranks);
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &local_rank); /* this process's GPU: its rank on its host */

  mcast_context_t ctx;
  CHECK(mcast_context_create(NULL, &ctx)); /* NULL: defaults and MCAST_* variables */
  mcast_context_info_t info = {.struct_size = sizeof info};
  CHECK(mcast_context_get_info(ctx, &info)); /* GPUs, or the simulator where there is no driver */
  if (rank == 0)
    printf("mcast on %s (%s)\n", info.backend == MCAST_BACKEND_CUDA ? "CUDA" : "the SIMULATOR",
           info.backend_reason);
  CHECK(mcast_device_count(ctx, &ndev));
  if (local_rank >= ndev) {
    fprintf(stderr, "rank %d: local rank %d but only %d GPUs\n", rank, local_rank, ndev);
    MPI_Abort(comm, 1);
  }
  mcast_oob_t oob = {.struct_size = sizeof oob, .allgather = mpi_allgather, .user = &comm,
                     .rank = rank, .nranks = nranks};
  mcast_team_t team;
  CHECK(mcast_team_init_oob(ctx, &oob, local_rank, &team)); /* collective */
  mcast_buffer_t buf;
  CHECK(mcast_buffer_alloc(team, sizeof x, &buf)); /* collective: every rank's copy */

  for (int i = 0; i < N; i++) x[i] = (float)(rank + i);
  CHECK(mcast_buffer_write(buf, rank, 0, x, sizeof x));
  CHECK(mcast_all_reduce(buf, rank, 0, N, MCAST_FLOAT32, MCAST_SUM, NULL)); /* enqueued */
  CHECK(mcast_synchronize(team, rank, NULL));                              /* done */
  CHECK(mcast_buffer_read(buf, rank, 0, x, sizeof x));
  for (int i = 0; i < N; i++) /* sum over ranks r of (r + i) */
    wrong += x[i] != (float)(nranks * (nranks - 1) / 2 + nranks * i);
  printf("rank %d of %d: %s\n", rank, nranks, wrong ? "WRONG" : "ok");

  CHECK(mcast_buffer_free(buf));
  CHECK(mcast_team_destroy(team));
  CHECK(mcast_context_destroy(ctx));
  MPI_Allreduce(&wrong, &any_wrong, 1, MPI_INT, MPI_SUM, comm);
  MPI_Comm_free(&local);
  MPI_Finalize();
  return any_wrong != 0;
}
