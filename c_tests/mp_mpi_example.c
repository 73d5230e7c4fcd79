/* Example: one MPI rank per GPU, the team bootstrapped by the program's own MPI communicator.
 * mcast_team_init_oob calls MPI_Allgather (through the callback below) only during the call;
 * afterwards the team talks over its own connections, so a rank that dies later gives
 * MCAST_ERROR_TIMEOUT instead of a hang inside MPI. Every rank all-reduces, broadcasts and
 * all-gathers and checks the results.
 * Run: mpirun -np 4 ./mp_mpi_example (on the simulator: MCAST_BACKEND=sim; as root add
 * --allow-run-as-root; with more ranks than cores add --oversubscribe). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mcast.h"

#define OK(call)                                                                           \
  do {                                                                                     \
    mcast_status_t s_ = (call);                                                            \
    if (s_ != MCAST_SUCCESS) {                                                             \
      fprintf(stderr, "%s: %s: %s\n", #call, mcast_status_string(s_), mcast_last_error()); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                        \
    }                                                                                      \
  } while (0)

/* The mcast_oob_allgather_fn over an MPI communicator (passed as `user`). */
static int mpi_allgather(const void *send, void *recv, size_t bytes, void *user) {
  MPI_Comm comm = *(MPI_Comm *)user;
  return MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, comm);
}

int main(int argc, char **argv) {
  int rank, nranks, ndev, wrong = 0;
  MPI_Init(&argc, &argv);
  MPI_Comm comm = MPI_COMM_WORLD;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &nranks);

  mcast_context_t ctx;
  OK(mcast_context_create(NULL, &ctx));
  OK(mcast_device_count(ctx, &ndev));
  mcast_oob_t oob;
  memset(&oob, 0, sizeof oob);
  oob.struct_size = sizeof oob;
  oob.allgather = mpi_allgather;
  oob.user = &comm;
  oob.rank = rank;
  oob.nranks = nranks;
  mcast_team_t team;
  OK(mcast_team_init_oob(ctx, &oob, rank % ndev, &team));

  enum { N = 1 << 18 };
  float *x = malloc((size_t)nranks * N * sizeof *x);
  mcast_buffer_t buf;
  OK(mcast_buffer_alloc(team, (size_t)nranks * N * sizeof *x, &buf));
  /* All-reduce: the sum of every rank's (rank + i % 5). */
  for (int i = 0; i < N; i++) x[i] = (float)(rank + i % 5);
  OK(mcast_buffer_write(buf, rank, 0, x, N * sizeof *x));
  OK(mcast_all_reduce(buf, rank, 0, N, MCAST_FLOAT32, MCAST_SUM, NULL));
  OK(mcast_synchronize(team, rank, NULL));
  OK(mcast_buffer_read(buf, rank, 0, x, N * sizeof *x));
  for (int i = 0; i < N; i++) wrong += x[i] != (float)(nranks * (nranks - 1) / 2 + nranks * (i % 5));
  /* Broadcast from the last rank. */
  for (int i = 0; i < N; i++) x[i] = (float)(rank * 1000 + i % 7);
  OK(mcast_buffer_write(buf, rank, 0, x, N * sizeof *x));
  OK(mcast_broadcast(buf, rank, nranks - 1, 0, N * sizeof *x, NULL));
  OK(mcast_synchronize(team, rank, NULL));
  OK(mcast_buffer_read(buf, rank, 0, x, N * sizeof *x));
  for (int i = 0; i < N; i++) wrong += x[i] != (float)((nranks - 1) * 1000 + i % 7);
  /* All-gather: block r holds rank r's values. */
  for (int i = 0; i < N; i++) x[(size_t)rank * N + i] = (float)(rank * 3 + i % 11);
  OK(mcast_buffer_write(buf, rank, (size_t)rank * N * sizeof *x, x + (size_t)rank * N, N * sizeof *x));
  OK(mcast_all_gather(buf, rank, 0, N * sizeof *x, NULL));
  OK(mcast_synchronize(team, rank, NULL));
  OK(mcast_buffer_read(buf, rank, 0, x, (size_t)nranks * N * sizeof *x));
  for (int q = 0; q < nranks; q++)
    for (int i = 0; i < N; i++) wrong += x[(size_t)q * N + i] != (float)(q * 3 + i % 11);

  printf("rank %d of %d: %d wrong (%s)\n", rank, nranks, wrong, wrong ? "WRONG" : "ok");
  OK(mcast_buffer_free(buf));
  OK(mcast_team_destroy(team));
  OK(mcast_context_destroy(ctx));
  free(x);
  int any = 0;
  MPI_Allreduce(&wrong, &any, 1, MPI_INT, MPI_SUM, comm);
  MPI_Finalize();
  return any != 0;
}
