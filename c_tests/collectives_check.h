/* The collectives checks shared by collectives.c (simulator) and gpu_collectives.c (CUDA, P2P):
 * every collective, dtype and op against a host reference on small-integer data (exact in every
 * dtype and summation order), odd counts, aligned non-zero offsets, a poisoned margin that must
 * stay untouched, bit-identical results on every rank, argument checks, and a rank that never
 * arrives (MCAST_ERROR_TIMEOUT, sticky).
 *
 * The including file defines, before including this header:
 *   static mcast_stream_t test_stream_create(int rank, int device);
 *   static void test_stream_destroy(mcast_stream_t stream);
 * and may define COLL_LARGE_COUNTS 0 to skip the counts above the one-shot limit. */
#ifndef MCAST_TEST_COLLECTIVES_CHECK_H
#define MCAST_TEST_COLLECTIVES_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "check.h"

#ifndef COLL_LARGE_COUNTS
#define COLL_LARGE_COUNTS 1
#endif

#define COLL_MAX_RANKS 8
#define COLL_MARGIN 64
#define COLL_POISON 0xA5

static mcast_stream_t test_stream_create(int rank, int device);
static void test_stream_destroy(mcast_stream_t stream);

static const mcast_dtype_t coll_dtypes[8] = {MCAST_FLOAT32, MCAST_FLOAT64, MCAST_FLOAT16, MCAST_BFLOAT16,
                                             MCAST_INT32,   MCAST_UINT32,  MCAST_INT64,   MCAST_UINT64};
static const char *const coll_dtype_names[8] = {"f32", "f64", "f16", "bf16", "i32", "u32", "i64", "u64"};
static const mcast_op_t coll_ops[3] = {MCAST_SUM, MCAST_MIN, MCAST_MAX};
static const char *const coll_op_names[3] = {"sum", "min", "max"};

enum coll_kind { COLL_BROADCAST, COLL_ALL_REDUCE, COLL_REDUCE_SCATTER, COLL_ALL_GATHER };
static const char *const coll_kind_names[4] = {"broadcast", "all_reduce", "reduce_scatter", "all_gather"};

static unsigned long coll_cases_run;

static size_t coll_dtype_size(mcast_dtype_t d) {
  switch (d) {
    case MCAST_FLOAT64:
    case MCAST_INT64:
    case MCAST_UINT64:
      return 8;
    case MCAST_FLOAT16:
    case MCAST_BFLOAT16:
      return 2;
    default:
      return 4;
  }
}

static int coll_is_unsigned(mcast_dtype_t d) { return d == MCAST_UINT32 || d == MCAST_UINT64; }

/* IEEE half of a small integer (|v| <= 2048: exact). */
static uint16_t coll_half_of(long v) {
  uint16_t sign = v < 0 ? 0x8000u : 0;
  unsigned long a = (unsigned long)(v < 0 ? -v : v);
  int e = 0;
  if (a == 0) return sign;
  while ((a >> (e + 1)) != 0) e++;
  return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)(((a << (10 - e)) & 0x3ffu)));
}

/* The bytes of the small integer v as dtype d (exact for every dtype). */
static void coll_encode(mcast_dtype_t d, long v, unsigned char *out) {
  switch (d) {
    case MCAST_FLOAT32: {
      float f = (float)v;
      memcpy(out, &f, 4);
      break;
    }
    case MCAST_FLOAT64: {
      double f = (double)v;
      memcpy(out, &f, 8);
      break;
    }
    case MCAST_FLOAT16: {
      uint16_t h = coll_half_of(v);
      memcpy(out, &h, 2);
      break;
    }
    case MCAST_BFLOAT16: {
      float f = (float)v;
      uint32_t bits;
      uint16_t b;
      memcpy(&bits, &f, 4);
      b = (uint16_t)(bits >> 16);
      memcpy(out, &b, 2);
      break;
    }
    case MCAST_INT32: {
      int32_t x = (int32_t)v;
      memcpy(out, &x, 4);
      break;
    }
    case MCAST_UINT32: {
      uint32_t x = (uint32_t)v;
      memcpy(out, &x, 4);
      break;
    }
    case MCAST_INT64: {
      int64_t x = (int64_t)v;
      memcpy(out, &x, 8);
      break;
    }
    default: {
      uint64_t x = (uint64_t)v;
      memcpy(out, &x, 8);
      break;
    }
  }
}

/* Deterministic input: element i of rank r in case `seed`, a small integer (0..16 for unsigned
 * types, -8..8 otherwise). */
static long coll_value(mcast_dtype_t d, unsigned long seed, int r, size_t i) {
  uint64_t x = (uint64_t)seed * 0x9E3779B97F4A7C15ull + (uint64_t)(r + 1) * 0xBF58476D1CE4E5B9ull + (uint64_t)i;
  long v;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  v = (long)(x % 17);
  return coll_is_unsigned(d) ? v : v - 8;
}

static long coll_reduce(mcast_op_t op, long acc, long x) {
  switch (op) {
    case MCAST_MIN:
      return x < acc ? x : acc;
    case MCAST_MAX:
      return x > acc ? x : acc;
    default:
      return acc + x;
  }
}

static double coll_now(void) {
  struct timespec ts;
  timespec_get(&ts, TIME_UTC); /* C11 */
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void coll_fail(const char *what, enum coll_kind kind, int n, int rank, size_t count, size_t offset,
                      int dtype, int op) {
  fprintf(stderr, "MISMATCH: %s: %s, team of %d, rank %d, count %zu, offset %zu, dtype %s, op %s\n", what,
          coll_kind_names[kind], n, rank, count, offset, dtype >= 0 ? coll_dtype_names[dtype] : "-",
          op >= 0 ? coll_op_names[op] : "-");
  exit(1);
}

/* One collective on `team` (n ranks) with a fresh buffer, checked against the host reference.
 * For the reductions `count` is in elements (per block for reduce_scatter); for broadcast and
 * all_gather in bytes (per block for all_gather). */
static void coll_case(mcast_team_t team, int n, const mcast_stream_t *streams, enum coll_kind kind, size_t count,
                      size_t offset, int dti, int opi, int root, unsigned long seed) {
  mcast_dtype_t d = dti >= 0 ? coll_dtypes[dti] : MCAST_UINT32;
  mcast_op_t op = opi >= 0 ? coll_ops[opi] : MCAST_SUM;
  size_t esize = (kind == COLL_ALL_REDUCE || kind == COLL_REDUCE_SCATTER) ? coll_dtype_size(d) : 1;
  size_t blocks = (kind == COLL_REDUCE_SCATTER || kind == COLL_ALL_GATHER) ? (size_t)n : 1;
  size_t extent = count * esize * blocks, size = offset + extent + COLL_MARGIN;
  unsigned char *in[COLL_MAX_RANKS], *out[COLL_MAX_RANKS], *want = malloc(extent);
  mcast_buffer_t buf = {0};
  int r, q;
  size_t i;

  CHECK(want != NULL && n <= COLL_MAX_RANKS);
  CHECK_OK(mcast_buffer_alloc(team, size, &buf));
  for (r = 0; r < n; r++) {
    in[r] = malloc(size);
    out[r] = malloc(size);
    CHECK(in[r] != NULL && out[r] != NULL);
    memset(in[r], COLL_POISON, size);
    for (i = 0; i < count * blocks; i++) {
      if (esize == 1 && kind != COLL_ALL_REDUCE && kind != COLL_REDUCE_SCATTER) {
        in[r][offset + i] = (unsigned char)(coll_value(MCAST_UINT64, seed, r, i) * 15 + r);
      } else {
        coll_encode(d, coll_value(d, seed, r, i), in[r] + offset + i * esize);
      }
    }
    CHECK_OK(mcast_buffer_write(buf, r, 0, in[r], size));
  }
  for (r = 0; r < n; r++) {
    switch (kind) {
      case COLL_BROADCAST:
        CHECK_OK(mcast_broadcast(buf, r, root, offset, count, streams[r]));
        break;
      case COLL_ALL_REDUCE:
        CHECK_OK(mcast_all_reduce(buf, r, offset, count, d, op, streams[r]));
        break;
      case COLL_REDUCE_SCATTER:
        CHECK_OK(mcast_reduce_scatter(buf, r, offset, count, d, op, streams[r]));
        break;
      case COLL_ALL_GATHER:
        CHECK_OK(mcast_all_gather(buf, r, offset, count, streams[r]));
        break;
    }
  }
  for (r = 0; r < n; r++) CHECK_OK(mcast_synchronize(team, r, streams[r]));
  for (r = 0; r < n; r++) CHECK_OK(mcast_buffer_read(buf, r, 0, out[r], size));
  CHECK_OK(mcast_buffer_free(buf));

  /* The reference: the whole expected range (reduce_scatter: every block; rank r checks its own). */
  switch (kind) {
    case COLL_BROADCAST:
      memcpy(want, in[root] + offset, extent);
      break;
    case COLL_ALL_GATHER:
      for (q = 0; q < n; q++) memcpy(want + (size_t)q * count, in[q] + offset + (size_t)q * count, count);
      break;
    default:
      for (i = 0; i < count * blocks; i++) {
        long acc = coll_value(d, seed, 0, i);
        for (q = 1; q < n; q++) acc = coll_reduce(op, acc, coll_value(d, seed, q, i));
        coll_encode(d, acc, want + i * esize);
      }
      break;
  }
  for (r = 0; r < n; r++) {
    if (memcmp(out[r], in[r], offset) != 0 ||
        memcmp(out[r] + offset + extent, in[r] + offset + extent, COLL_MARGIN) != 0) {
      coll_fail("wrote outside its range", kind, n, r, count, offset, dti, opi);
    }
    if (kind == COLL_REDUCE_SCATTER) {
      size_t block = count * esize;
      if (memcmp(out[r] + offset + (size_t)r * block, want + (size_t)r * block, block) != 0) {
        coll_fail("its block differs from the host reference", kind, n, r, count, offset, dti, opi);
      }
    } else {
      if (memcmp(out[r] + offset, want, extent) != 0) {
        coll_fail("differs from the host reference", kind, n, r, count, offset, dti, opi);
      }
      if (memcmp(out[r] + offset, out[0] + offset, extent) != 0) {
        coll_fail("not bit-identical to rank 0", kind, n, r, count, offset, dti, opi);
      }
    }
  }
  for (r = 0; r < n; r++) {
    free(in[r]);
    free(out[r]);
  }
  free(want);
  coll_cases_run++;
}

/* Every collective, dtype and op on `team`: odd counts, aligned non-zero offsets, and (when
 * COLL_LARGE_COUNTS) a count past the one-shot limit (1 MiB for two ranks, 256 KiB above), for SUM. */
static void coll_sweep(mcast_team_t team, int n, const mcast_stream_t *streams) {
  static const size_t counts[3] = {1, 37, 1001};
  static const size_t byte_offsets[4] = {0, 1, 4, 13};
  static const size_t byte_counts[6] = {1, 3, 17, 999, 4097, 65537};
  unsigned long seed = 1000 + (unsigned long)n * 100000;
  int dti, opi, k;

  for (dti = 0; dti < 8; dti++) {
    size_t es = coll_dtype_size(coll_dtypes[dti]), align = es < 4 ? 4 : es;
    for (opi = 0; opi < 3; opi++) {
      for (k = 0; k < 3; k++) {
        size_t offset = (size_t)k * align * 3; /* 0, then aligned non-zero offsets */
        coll_case(team, n, streams, COLL_ALL_REDUCE, counts[k], offset, dti, opi, 0, seed++);
        coll_case(team, n, streams, COLL_REDUCE_SCATTER, counts[k], offset, dti, opi, 0, seed++);
      }
      if (COLL_LARGE_COUNTS && coll_ops[opi] == MCAST_SUM) {
        /* past the one-shot limit (1 MiB with two ranks, 256 KiB with more): the two-shot P2P kernel */
        size_t large = ((n <= 2 ? 1024 : 256) * 1024) / es + 3;
        coll_case(team, n, streams, COLL_ALL_REDUCE, large, align, dti, opi, 0, seed++);
        coll_case(team, n, streams, COLL_REDUCE_SCATTER, large / (size_t)n + 1, align, dti, opi, 0, seed++);
      }
    }
  }
  for (k = 0; k < 6; k++) {
    size_t bytes = byte_counts[k];
    if (!COLL_LARGE_COUNTS && bytes > 4097) continue;
    coll_case(team, n, streams, COLL_BROADCAST, bytes, byte_offsets[k % 4], -1, -1, k % n, seed++);
    coll_case(team, n, streams, COLL_BROADCAST, bytes, byte_offsets[(k + 1) % 4], -1, -1, n - 1, seed++);
    coll_case(team, n, streams, COLL_ALL_GATHER, bytes, byte_offsets[k % 4], -1, -1, 0, seed++);
  }
}

/* Invalid arguments give MCAST_ERROR_INVALID_ARGUMENT (or INVALID_HANDLE for a zero buffer),
 * enqueue nothing, and leave the team usable. */
static void coll_invalid_arguments(mcast_team_t team, int n, const mcast_stream_t *streams) {
  const mcast_status_t bad = MCAST_ERROR_INVALID_ARGUMENT;
  mcast_buffer_t buf = {0}, zero = {0};
  mcast_stream_t s = streams[0];
  size_t size = 4096;

  CHECK_OK(mcast_buffer_alloc(team, size, &buf));
  /* rank */
  CHECK_STATUS(mcast_all_reduce(buf, -1, 0, 1, MCAST_FLOAT32, MCAST_SUM, s), bad);
  CHECK_STATUS(mcast_all_reduce(buf, n, 0, 1, MCAST_FLOAT32, MCAST_SUM, s), bad);
  CHECK_STATUS(mcast_reduce_scatter(buf, n, 0, 1, MCAST_INT32, MCAST_MAX, s), bad);
  CHECK_STATUS(mcast_all_gather(buf, -1, 0, 1, s), bad);
  CHECK_STATUS(mcast_broadcast(buf, n, 0, 0, 1, s), bad);
  CHECK_STATUS(mcast_synchronize(team, n, s), bad);
  CHECK_STATUS(mcast_synchronize(team, -1, s), bad);
  /* root */
  CHECK_STATUS(mcast_broadcast(buf, 0, n, 0, 1, s), bad);
  CHECK_STATUS(mcast_broadcast(buf, 0, -1, 0, 1, s), bad);
  /* zero counts */
  /* Count 0 is a valid no-op (NCCL's rule), after the handle and rank checks. */
  CHECK_OK(mcast_all_reduce(buf, 0, 0, 0, MCAST_FLOAT32, MCAST_SUM, s));
  CHECK_OK(mcast_reduce_scatter(buf, 0, SIZE_MAX, 0, MCAST_FLOAT32, MCAST_SUM, s));
  CHECK_OK(mcast_broadcast(buf, 0, 0, 0, 0, s));
  CHECK_OK(mcast_all_gather(buf, 0, 0, 0, s));
  CHECK_STATUS(mcast_all_gather(buf, n, 0, 0, s), bad);
  CHECK_STATUS(mcast_broadcast(buf, 0, n, 0, 0, s), bad);
  /* range past the end, and overflowing */
  CHECK_STATUS(mcast_all_reduce(buf, 0, 0, size / 4 + 1, MCAST_FLOAT32, MCAST_SUM, s), bad);
  CHECK_STATUS(mcast_all_reduce(buf, 0, size - 4, 2, MCAST_INT32, MCAST_SUM, s), bad);
  CHECK_STATUS(mcast_all_reduce(buf, 0, 0, SIZE_MAX / 2, MCAST_FLOAT64, MCAST_SUM, s), bad);
  CHECK_STATUS(mcast_all_reduce(buf, 0, SIZE_MAX - 3, 1, MCAST_FLOAT32, MCAST_SUM, s), bad);
  CHECK_STATUS(mcast_reduce_scatter(buf, 0, 0, size / 8 / (size_t)n + 1, MCAST_UINT64, MCAST_MIN, s), bad);
  CHECK_STATUS(mcast_all_gather(buf, 0, 0, size / (size_t)n + 1, s), bad);
  CHECK_STATUS(mcast_all_gather(buf, 0, size % (size_t)n + 1, size / (size_t)n, s), bad);
  CHECK_STATUS(mcast_broadcast(buf, 0, 0, size - 10, 11, s), bad);
  CHECK_STATUS(mcast_broadcast(buf, 0, 0, SIZE_MAX, 1, s), bad);
  /* alignment: element size, 4 bytes for 16-bit types */
  CHECK_STATUS(mcast_all_reduce(buf, 0, 2, 1, MCAST_FLOAT32, MCAST_SUM, s), bad);
  CHECK_STATUS(mcast_all_reduce(buf, 0, 4, 1, MCAST_FLOAT64, MCAST_SUM, s), bad);
  CHECK_STATUS(mcast_all_reduce(buf, 0, 2, 1, MCAST_FLOAT16, MCAST_SUM, s), bad);
  CHECK_STATUS(mcast_reduce_scatter(buf, 0, 2, 1, MCAST_BFLOAT16, MCAST_MAX, s), bad);
  CHECK_STATUS(mcast_reduce_scatter(buf, 0, 12, 1, MCAST_UINT64, MCAST_MIN, s), bad);
  /* unknown dtype / op integers */
  CHECK_STATUS(mcast_all_reduce(buf, 0, 0, 1, (mcast_dtype_t)99, MCAST_SUM, s), bad);
  CHECK_STATUS(mcast_all_reduce(buf, 0, 0, 1, (mcast_dtype_t)8, MCAST_SUM, s), bad);
  CHECK_STATUS(mcast_all_reduce(buf, 0, 0, 1, MCAST_FLOAT32, (mcast_op_t)99, s), bad);
  CHECK_STATUS(mcast_all_reduce(buf, 0, 0, 1, MCAST_FLOAT32, (mcast_op_t)3, s), bad);
  CHECK_STATUS(mcast_reduce_scatter(buf, 0, 0, 1, (mcast_dtype_t)99, MCAST_SUM, s), bad);
  CHECK_STATUS(mcast_reduce_scatter(buf, 0, 0, 1, MCAST_INT32, (mcast_op_t)0xFFFFFFFFu, s), bad);
  CHECK(strstr(mcast_last_error(), "op") != NULL);
  /* zero and freed buffers, zero team */
  CHECK_STATUS(mcast_all_reduce(zero, 0, 0, 1, MCAST_FLOAT32, MCAST_SUM, s), MCAST_ERROR_INVALID_HANDLE);
  CHECK_STATUS(mcast_broadcast(zero, 0, 0, 0, 1, s), MCAST_ERROR_INVALID_HANDLE);
  {
    mcast_team_t no_team = {0};
    CHECK_STATUS(mcast_synchronize(no_team, 0, s), MCAST_ERROR_INVALID_HANDLE);
  }
  CHECK_OK(mcast_buffer_free(buf));
  CHECK_STATUS(mcast_all_gather(buf, 0, 0, 1, s), MCAST_ERROR_INVALID_HANDLE);
  /* Nothing was enqueued: the team still works. */
  coll_case(team, n, streams, COLL_ALL_REDUCE, 5, 8, 0, 0, 0, 7);
}

/* A rank that never arrives: with timeout_ms = 200, rank 0's all_reduce waits alone; its
 * synchronize returns MCAST_ERROR_TIMEOUT within a bounded time and the team keeps reporting
 * it. `ctx` must have timeout_ms = 200. */
static void coll_timeout(mcast_context_t ctx, const int *devices, int n) {
  mcast_team_t team = {0};
  mcast_buffer_t buf = {0};
  mcast_stream_t streams[COLL_MAX_RANKS];
  double start, took;
  int r;

  CHECK(n >= 2 && n <= COLL_MAX_RANKS);
  CHECK_OK(mcast_team_create(ctx, devices, n, &team));
  CHECK_OK(mcast_buffer_alloc(team, 4096, &buf));
  for (r = 0; r < n; r++) streams[r] = test_stream_create(r, devices[r]);
  CHECK_OK(mcast_all_reduce(buf, 0, 0, 256, MCAST_FLOAT32, MCAST_SUM, streams[0]));
  start = coll_now();
  CHECK_STATUS(mcast_synchronize(team, 0, streams[0]), MCAST_ERROR_TIMEOUT);
  took = coll_now() - start;
  printf("timeout: team of %d: MCAST_ERROR_TIMEOUT after %.3f s: %s\n", n, took, mcast_last_error());
  CHECK(took < 20.0);
  CHECK(strstr(mcast_last_error(), "timeout_ms = 200") != NULL);
  /* Sticky: every later collective and synchronize of the team reports it. */
  for (r = 0; r < n; r++) {
    CHECK_STATUS(mcast_all_reduce(buf, r, 0, 256, MCAST_FLOAT32, MCAST_SUM, streams[r]), MCAST_ERROR_TIMEOUT);
    CHECK_STATUS(mcast_broadcast(buf, r, 0, 0, 16, streams[r]), MCAST_ERROR_TIMEOUT);
    CHECK_STATUS(mcast_synchronize(team, r, streams[r]), MCAST_ERROR_TIMEOUT);
  }
  CHECK_STATUS(mcast_synchronize(team, 0, streams[0]), MCAST_ERROR_TIMEOUT);
  for (r = 0; r < n; r++) test_stream_destroy(streams[r]);
  CHECK_OK(mcast_buffer_free(buf));
  CHECK_OK(mcast_team_destroy(team));
}

/* A team on `devices`, checked for `transport`, swept, argument-checked and destroyed. */
static void coll_team(mcast_context_t ctx, const int *devices, int n, mcast_transport_t transport) {
  mcast_team_t team = {0};
  mcast_team_info_t info;
  mcast_stream_t streams[COLL_MAX_RANKS];
  unsigned long before = coll_cases_run;
  double start = coll_now();
  int r;

  CHECK_OK(mcast_team_create(ctx, devices, n, &team));
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  CHECK_OK(mcast_team_get_info(team, &info));
  CHECK(info.size == n);
  CHECK(info.transport == transport);
  for (r = 0; r < n; r++) streams[r] = test_stream_create(r, devices[r]);
  coll_sweep(team, n, streams);
  coll_invalid_arguments(team, n, streams);
  for (r = 0; r < n; r++) test_stream_destroy(streams[r]);
  CHECK_OK(mcast_team_destroy(team));
  printf("team of %d (%s): %lu cases passed in %.2f s\n", n,
         transport == MCAST_TRANSPORT_MULTICAST ? "MULTICAST" : "P2P", coll_cases_run - before,
         coll_now() - start);
}

/* Nothing left live in the context. */
static void coll_check_nothing_live(mcast_context_t ctx) {
  mcast_live_counts_t counts;
  memset(&counts, 0, sizeof counts);
  counts.struct_size = sizeof counts;
  CHECK_OK(mcast_context_live_counts(ctx, &counts));
  CHECK(counts.teams == 0 && counts.buffers == 0 && counts.multicast_objects == 0);
}

#endif
