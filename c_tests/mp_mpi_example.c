/* Example: one MPI rank per GPU. Rank 0 makes the unique id, MPI_Bcast moves it, every rank
 * joins the team with mcast_team_init_rank on its local GPU and all-reduces a buffer.
 * Built only where CMake finds MPI; run with e.g. `mpirun -np 2 ./mp_mpi_example`. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "mcast.h"

#define OK(call)                                                                                       \
  do {                                                                                                 \
    mcast_status_t s_ = (call);                                                                        \
    if (s_ != MCAST_SUCCESS) {                                                                         \
      fprintf(stderr, "%s: %s: %s\n", #call, mcast_status_string(s_), mcast_last_error());             \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                    \
    }                                                                                                  \
  } while (0)

int main(int argc, char **argv) {
  int rank, nranks, ndev;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  mcast_unique_id_t id;
  if (rank == 0) OK(mcast_get_unique_id(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  mcast_context_t ctx;
  OK(mcast_context_create(NULL, &ctx));
  OK(mcast_device_count(ctx, &ndev));
  mcast_team_t team;
  OK(mcast_team_init_rank(ctx, id, nranks, rank, rank % ndev, &team));
  enum { N = 1 << 20 };
  float *x = malloc(N * sizeof *x);
  for (int i = 0; i < N; i++) x[i] = (float)rank;
  mcast_buffer_t buf;
  OK(mcast_buffer_alloc(team, N * sizeof *x, &buf));
  OK(mcast_buffer_write(buf, rank, 0, x, N * sizeof *x));
  OK(mcast_all_reduce(buf, rank, 0, N, MCAST_FLOAT32, MCAST_SUM, NULL));
  OK(mcast_synchronize(team, rank, NULL));
  OK(mcast_buffer_read(buf, rank, 0, x, N * sizeof *x));
  int bad = x[0] != (float)(nranks * (nranks - 1) / 2);
  printf("rank %d: x[0] = %g (%s)\n", rank, (double)x[0], bad ? "WRONG" : "ok");
  OK(mcast_buffer_free(buf));
  OK(mcast_team_destroy(team));
  OK(mcast_context_destroy(ctx));
  free(x);
  MPI_Finalize();
  return bad;
}
