/* Assertions for the C tests: on failure print where, what, and mcast_last_error(), exit 1. */
#ifndef MCAST_TEST_CHECK_H
#define MCAST_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The context's live counts (every field poisoned first, so a field the library fails to write
 * shows). */
static inline mcast_live_counts_t live_counts(mcast_context_t ctx) {
  mcast_live_counts_t counts;
  memset(&counts, 0xff, sizeof counts);
  counts.struct_size = sizeof counts;
  CHECK_OK(mcast_context_live_counts(ctx, &counts));
  return counts;
}

/* Nothing of the context is alive: no team, buffer, multicast object, allocation, mapping or
 * reservation. */
static inline void check_no_leaks(mcast_context_t ctx) {
  const mcast_live_counts_t c = live_counts(ctx);
  CHECK(c.teams == 0 && c.buffers == 0 && c.multicast_objects == 0 && c.physical_allocations == 0 &&
        c.mappings == 0 && c.reservations == 0);
}

#endif
