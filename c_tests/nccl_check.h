/* Assertions for the NCCL-API tests (libmcast_nccl, #include <nccl.h>): on failure print where,
 * what, and ncclGetLastError(), exit 1. */
#ifndef MCAST_TEST_NCCL_CHECK_H
#define MCAST_TEST_NCCL_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include <nccl.h>

#define NCHECK(cond)                                                                           \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n  ncclGetLastError: %s\n", __FILE__, __LINE__, \
              #cond, ncclGetLastError(NULL));                                                  \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

#define NCHECK_RESULT(call, expected)                                                         \
  do {                                                                                        \
    ncclResult_t check_result_ = (call);                                                      \
    if (check_result_ != (expected)) {                                                        \
      fprintf(stderr, "%s:%d: %s\n  returned %d (%s), expected %s\n  ncclGetLastError: %s\n", \
              __FILE__, __LINE__, #call, (int)check_result_,                                  \
              ncclGetErrorString(check_result_), #expected, ncclGetLastError(NULL));          \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

#define NCHECK_OK(call) NCHECK_RESULT(call, ncclSuccess)

#endif
