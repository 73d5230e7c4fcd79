/* Assertions for the C tests: on failure print where, what, and mcast_last_error(), exit 1. */
#ifndef MCAST_TEST_CHECK_H
#define MCAST_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "mcast.h"

#define CHECK(cond)                                                                            \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n  mcast_last_error: %s\n", __FILE__, __LINE__, \
              #cond, mcast_last_error());                                                      \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

#define CHECK_STATUS(call, expected)                                         \
  do {                                                                       \
    mcast_status_t check_status_ = (call);                                   \
    if (check_status_ != (expected)) {                                       \
      fprintf(stderr,                                                        \
              "%s:%d: %s\n  returned %s (%u), expected %s\n"                 \
              "  mcast_last_error: %s\n",                                    \
              __FILE__, __LINE__, #call, mcast_status_string(check_status_), \
              (unsigned)check_status_, #expected, mcast_last_error());       \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

#define CHECK_OK(call) CHECK_STATUS(call, MCAST_SUCCESS)

#endif
