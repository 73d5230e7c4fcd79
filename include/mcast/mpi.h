/* libmcast_mpi: MPI as mcast's engine between NVLink domains (docs/domains.md). Built with the
 * MPI compiler wrapper where one is found (mpicc); CMake target mcast::mpi, pkg-config mcast-mpi.
 *
 *   mcast_context_set_net(ctx, mcast_mpi_net_ops(), mcast_mpi_net_user(MPI_COMM_WORLD));
 *
 * Teams made in ctx afterwards whose ranks span several NVLink domains run their rails over MPI:
 * rail j is MPI_Comm_split(comm, j, domain). The engine is blocking (mcast synchronises the
 * stream before each call). Device memory is staged through host memory when the MPI is not
 * CUDA-aware (MPIX_Query_cuda_support, where Open MPI has it) and the pointer is CUDA device
 * memory (cuPointerGetAttribute, libcuda.so.1 loaded at run time); otherwise MPI reads it
 * directly, as on mcast's simulator, whose device memory is host memory. Integer reductions use
 * MPI's; floating-point ones (and every 16-bit type, which MPI lacks) gather the operands and
 * reduce them on the host in domain order, so every rank computes the same bits (16-bit sums
 * accumulate in float, as mcast's kernels do). */
#ifndef MCAST_MPI_H
#define MCAST_MPI_H

#if defined(__GNUC__)
#pragma GCC system_header /* #include_next below is a GCC/Clang extension */
#endif

/* MPI's own header. A program that puts PREFIX/include/mcast on its include path (for
 * <nccl.h>: mcast::nccl, mcast-nccl.pc) finds this file as <mpi.h>; #include_next then goes on
 * to MPI's. */
#if defined(__has_include_next)
#if __has_include_next(<mpi.h>)
#include_next <mpi.h>
#else
#include <mpi.h>
#endif
#else
#include <mpi.h>
#endif

#include "../mcast.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The engine table (static; never NULL). */
const mcast_net_ops_t *mcast_mpi_net_ops(void);

/* The `user` for mcast_context_set_net over `comm`, which must hold exactly the processes of the
 * teams made with it (MPI_COMM_WORLD for whole-job teams). Collective over `comm` (it is
 * duplicated). Released by the table's `release` when the context no longer uses it (context
 * destroy, or another engine registered); pass it to one context only. NULL when MPI is not
 * initialised or the duplication fails. */
void *mcast_mpi_net_user(MPI_Comm comm);

#ifdef __cplusplus
}
#endif

#endif /* MCAST_MPI_H */
