/* A team across simulated NVLink domains with NCCL as the engine between them: the stand-in NCCL
 * over MPI (nccl_standin.c), loaded by mcast through MCAST_NET=nccl MCAST_NET_NCCL=<its path>.
 *   mpirun -np P hier_nccl D STANDIN [fail]   (P ranks in D domains of P/D ranks:
 *                     MCAST_DOMAIN=D<rank/(P/D)> set by each rank before its first call; device =
 *                     its index in its domain)
 * Every collective (all-reduce, reduce-scatter, all-gather, broadcast) in place, out of place
 * (_into) and on device pointers (mcast_mem_alloc memory, which on the simulator is host
 * memory), every dtype and op, counts 1, odd and one large enough to be chunked, against a host
 * reference on small integers (exact in every dtype and order). Then: the team reports the
 * domains and "nccl 2.27.7"; the stand-in saw one rail communicator per process made with
 * maxCTAs 4 and carried collectives; destroying the team destroyed it.
 * With `fail`: rank 1's NCCL all-reduce fails (STANDIN_NCCL_FAIL_RANK=1): its call returns
 * MCAST_ERROR_DRIVER naming ncclAllReduce and its result, every other rank gets the same status
 * within seconds, and mcast_team_abort aborts the rail communicator (ncclCommAbort). */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static int rank, nranks;

static const mcast_dtype_t dtypes[8] = {MCAST_FLOAT32, MCAST_FLOAT64, MCAST_FLOAT16, MCAST_BFLOAT16,
                                        MCAST_INT32,   MCAST_UINT32,  MCAST_INT64,   MCAST_UINT64};
static const char *const dtype_names[8] = {"f32", "f64", "f16", "bf16", "i32", "u32", "i64", "u64"};
static const char *const op_names[3] = {"sum", "min", "max"};

static size_t esize(mcast_dtype_t d) {
  return d == MCAST_FLOAT64 || d == MCAST_INT64 || d == MCAST_UINT64 ? 8 : d == MCAST_FLOAT16 || d == MCAST_BFLOAT16 ? 2 : 4;
}

static int is_unsigned(mcast_dtype_t d) { return d == MCAST_UINT32 || d == MCAST_UINT64; }

/* Rank r's element i: a small integer (|v| <= 15), non-negative for unsigned dtypes. */
static long value(mcast_dtype_t d, int r, size_t i) {
  long v = (long)((i * 13 + (size_t)r * 7) % 31);
  return is_unsigned(d) ? v : v - 15;
}

static uint16_t half_of(long v) { /* IEEE half of a small integer (exact) */
  if (v == 0) return 0;
  uint16_t sign = v < 0 ? 0x8000 : 0;
  unsigned long a = (unsigned long)(v < 0 ? -v : v);
  int e = 0;
  while ((a >> e) > 1) e++;
  return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)(((a << 10) >> e) & 0x3ff));
}

static void put(void *p, mcast_dtype_t d, size_t i, long v) {
  float f = (float)v;
  uint32_t bits;
  switch (d) {
    case MCAST_FLOAT32: ((float *)p)[i] = f; break;
    case MCAST_FLOAT64: ((double *)p)[i] = (double)v; break;
    case MCAST_FLOAT16: ((uint16_t *)p)[i] = half_of(v); break;
    case MCAST_BFLOAT16:
      memcpy(&bits, &f, sizeof bits);
      ((uint16_t *)p)[i] = (uint16_t)(bits >> 16);
      break;
    case MCAST_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
    case MCAST_UINT32: ((uint32_t *)p)[i] = (uint32_t)v; break;
    case MCAST_INT64: ((int64_t *)p)[i] = v; break;
    default: ((uint64_t *)p)[i] = (uint64_t)v; break;
  }
}

static long fold(mcast_op_t op, long a, long b) {
  return op == MCAST_SUM ? a + b : op == MCAST_MIN ? (a < b ? a : b) : (a > b ? a : b);
}

static long reduce(mcast_dtype_t d, mcast_op_t op, size_t i) {
  long acc = value(d, 0, i);
  for (int q = 1; q < nranks; q++) acc = fold(op, acc, value(d, q, i));
  return acc;
}

enum kind { ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, BROADCAST };
static const char *const kind_names[4] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast"};
enum form { IN_PLACE, INTO, POINTER };
static const char *const form_names[3] = {"in place", "_into", "pointer"};

static mcast_context_t ctx;
static mcast_team_t team;
static int device;
static unsigned long cases;

/* Elements in and out of one case: all-reduce count/count, reduce-scatter N*count/count,
 * all-gather count/N*count, broadcast count/count. */
static size_t in_count(enum kind k, size_t count) { return k == REDUCE_SCATTER ? count * (size_t)nranks : count; }
static size_t out_count(enum kind k, size_t count) { return k == ALL_GATHER ? count * (size_t)nranks : count; }

static long expected(enum kind k, mcast_dtype_t d, mcast_op_t op, int root, size_t count, size_t i) {
  switch (k) {
    case ALL_REDUCE: return reduce(d, op, i);
    case REDUCE_SCATTER: return reduce(d, op, (size_t)rank * count + i);
    case ALL_GATHER: return value(d, (int)(i / count), i % count);
    default: return value(d, root, i);
  }
}

/* The input this rank writes: its values, at the place the in-place convention wants them. */
static void fill_input(void *in, enum kind k, mcast_dtype_t d, size_t count) {
  if (k == ALL_GATHER) {
    for (size_t i = 0; i < count; i++) put(in, d, i, value(d, rank, i));
    return;
  }
  for (size_t i = 0; i < in_count(k, count); i++) put(in, d, i, value(d, rank, i));
}

static void run_case(enum kind k, enum form f, mcast_dtype_t d, mcast_op_t op, size_t count, int root) {
  size_t es = esize(d), in_bytes = in_count(k, count) * es, out_bytes = out_count(k, count) * es;
  size_t span = in_bytes > out_bytes ? in_bytes : out_bytes;
  unsigned char *host = malloc(span), *want = malloc(out_bytes);
  CHECK(host != NULL && want != NULL);
  memset(host, 0, span);
  fill_input(host, k, d, count);
  for (size_t i = 0; i < out_count(k, count); i++) put(want, d, i, expected(k, d, op, root, count, i));
  /* Where this rank's input goes, and where its output is read, in one buffer of `span` bytes
   * (in place: the all-gather's input is block `rank`, the reduce-scatter's output block `rank`). */
  size_t in_at = k == ALL_GATHER && f == IN_PLACE ? (size_t)rank * count * es : 0;
  size_t out_at = k == REDUCE_SCATTER && f == IN_PLACE ? (size_t)rank * count * es : 0;
  mcast_stream_t s = NULL;
  if (f == POINTER) {
    unsigned char *send = NULL, *recv = NULL;
    CHECK_OK(mcast_mem_alloc(ctx, device, span, (void **)&send));
    CHECK_OK(mcast_mem_alloc(ctx, device, span, (void **)&recv));
    memcpy(send, host, in_bytes); /* the simulator's device memory is host memory */
    memset(recv, 0xA5, span);
    switch (k) {
      case ALL_REDUCE: CHECK_OK(mcast_team_all_reduce(team, rank, send, recv, count, d, op, s)); break;
      case REDUCE_SCATTER: CHECK_OK(mcast_team_reduce_scatter(team, rank, send, recv, count, d, op, s)); break;
      case ALL_GATHER: CHECK_OK(mcast_team_all_gather(team, rank, send, recv, count * es, s)); break;
      default: CHECK_OK(mcast_team_broadcast(team, rank, root, send, recv, count * es, s)); break;
    }
    CHECK_OK(mcast_synchronize(team, rank, s));
    memcpy(host, recv, out_bytes);
    CHECK_OK(mcast_mem_free(ctx, send));
    CHECK_OK(mcast_mem_free(ctx, recv));
  } else {
    mcast_buffer_t a, b;
    CHECK_OK(mcast_buffer_alloc(team, span, &a));
    CHECK_OK(mcast_buffer_write(a, rank, in_at, host, k == ALL_GATHER ? count * es : in_bytes));
    mcast_buffer_t out = a;
    if (f == INTO) {
      CHECK_OK(mcast_buffer_alloc(team, span, &b));
      out = b;
      switch (k) {
        case ALL_REDUCE: CHECK_OK(mcast_all_reduce_into(a, 0, b, 0, rank, count, d, op, s)); break;
        case REDUCE_SCATTER: CHECK_OK(mcast_reduce_scatter_into(a, 0, b, 0, rank, count, d, op, s)); break;
        case ALL_GATHER: CHECK_OK(mcast_all_gather_into(a, 0, b, 0, rank, count * es, s)); break;
        default: CHECK_OK(mcast_broadcast_into(a, 0, b, 0, rank, root, count * es, s)); break;
      }
    } else {
      switch (k) {
        case ALL_REDUCE: CHECK_OK(mcast_all_reduce(a, rank, 0, count, d, op, s)); break;
        case REDUCE_SCATTER: CHECK_OK(mcast_reduce_scatter(a, rank, 0, count, d, op, s)); break;
        case ALL_GATHER: CHECK_OK(mcast_all_gather(a, rank, 0, count * es, s)); break;
        default: CHECK_OK(mcast_broadcast(a, rank, root, 0, count * es, s)); break;
      }
    }
    CHECK_OK(mcast_synchronize(team, rank, s));
    CHECK_OK(mcast_buffer_read(out, rank, out_at, host, out_bytes));
    if (f == INTO) CHECK_OK(mcast_buffer_free(b));
    CHECK_OK(mcast_buffer_free(a));
  }
  if (memcmp(host, want, out_bytes) != 0) {
    size_t i = 0;
    while (memcmp(host + i * es, want + i * es, es) == 0) i++;
    fprintf(stderr, "rank %d: %s %s %s %s count %zu root %d: element %zu differs from the reference\n", rank,
            kind_names[k], form_names[f], dtype_names[d], k <= REDUCE_SCATTER ? op_names[op] : "-", count, root, i);
    exit(1);
  }
  free(host);
  free(want);
  cases++;
}

typedef void (*stats_fn)(int *, int *, int *, int *);

static void standin_stats(const char *path, int *live, int *made, int *colls, int *max_ctas) {
  void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD); /* the copy mcast loaded */
  CHECK(h != NULL);
  stats_fn f;
  *(void **)&f = dlsym(h, "standinNcclStats");
  CHECK(f != NULL);
  f(live, made, colls, max_ctas);
  dlclose(h);
}

static int run_fail(const char *standin) {
  CHECK(setenv("STANDIN_NCCL_FAIL_RANK", "1", 1) == 0);
  mcast_buffer_t buf;
  CHECK_OK(mcast_buffer_alloc(team, 4096, &buf));
  mcast_status_t s = mcast_all_reduce(buf, rank, 0, 16, MCAST_FLOAT32, MCAST_SUM, NULL);
  const char *why = "ncclAllReduce returned 2 (unhandled system error";
  if (rank == 1) {
    CHECK(s == MCAST_ERROR_DRIVER);
    CHECK(strstr(mcast_last_error(), why) != NULL);
    CHECK(strstr(mcast_last_error(), "failure injected") != NULL);
  } else {
    CHECK(s == MCAST_SUCCESS || s == MCAST_ERROR_DRIVER);
  }
  /* every rank learns it within seconds (told over the team's connections) */
  double t0 = MPI_Wtime();
  do s = mcast_synchronize(team, rank, NULL);
  while (s == MCAST_SUCCESS && MPI_Wtime() - t0 < 5);
  CHECK(s == MCAST_ERROR_DRIVER);
  CHECK(strstr(mcast_last_error(), why) != NULL);
  MPI_Barrier(MPI_COMM_WORLD); /* every rank saw the failure before any aborts */
  CHECK_OK(mcast_buffer_free(buf));
  int live, made, colls, max_ctas;
  standin_stats(standin, &live, &made, &colls, &max_ctas);
  CHECK(live == 1);
  /* every rank freed its buffer before any aborts: a peer's abort reaches this rank's team at
     once, and a buffer free (a call of the whole team) after it is refused with ABORTED */
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK_OK(mcast_team_abort(team));
  standin_stats(standin, &live, &made, &colls, &max_ctas);
  CHECK(live == 0); /* ncclCommAbort */
  mcast_team_destroy(team);
  CHECK_OK(mcast_context_destroy(ctx));
  printf("rank %d: the rail's failure is every rank's: %s\n", rank, mcast_status_string(s));
  MPI_Finalize();
  return 0;
}

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  CHECK(argc == 3 || (argc == 4 && strcmp(argv[3], "fail") == 0));
  int ndomains = atoi(argv[1]);
  const char *standin = argv[2];
  CHECK(ndomains >= 2 && nranks % ndomains == 0);
  int per = nranks / ndomains;
  char label[16];
  snprintf(label, sizeof label, "D%d", rank / per);
  CHECK(setenv("MCAST_DOMAIN", label, 1) == 0);
  CHECK(strcmp(getenv("MCAST_NET"), "nccl") == 0 && strcmp(getenv("MCAST_NET_NCCL"), standin) == 0);
  device = rank % per;

  CHECK_OK(mcast_context_create(NULL, &ctx));
  mcast_unique_id_t id;
  if (rank == 0) CHECK_OK(mcast_get_unique_id(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  CHECK_OK(mcast_team_init_rank(ctx, id, nranks, rank, device, &team));

  mcast_team_info_t info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  CHECK_OK(mcast_team_get_info(team, &info));
  CHECK(info.size == nranks && info.domains == ndomains && info.domain_size == per);
  CHECK(strcmp(info.net_engine, "nccl 2.27.7") == 0);
  if (argc == 4) return run_fail(standin);

  /* Every dtype and op in place; every dtype with one op (turning) in the other two forms. */
  const size_t counts[2] = {1, 1001};
  for (int di = 0; di < 8; di++)
    for (int ci = 0; ci < 2; ci++) {
      mcast_dtype_t d = dtypes[di];
      for (int op = 0; op < 3; op++) {
        run_case(ALL_REDUCE, IN_PLACE, d, (mcast_op_t)op, counts[ci], 0);
        run_case(REDUCE_SCATTER, IN_PLACE, d, (mcast_op_t)op, counts[ci], 0);
      }
      mcast_op_t turn = (mcast_op_t)((di + ci) % 3);
      for (int f = INTO; f <= POINTER; f++) {
        run_case(ALL_REDUCE, (enum form)f, d, turn, counts[ci], 0);
        run_case(REDUCE_SCATTER, (enum form)f, d, turn, counts[ci], 0);
      }
      for (int f = IN_PLACE; f <= POINTER; f++) {
        run_case(ALL_GATHER, (enum form)f, d, MCAST_SUM, counts[ci], 0);
        run_case(BROADCAST, (enum form)f, d, MCAST_SUM, counts[ci], (di + f) % nranks);
      }
    }
  /* Large enough to be cut in chunks (odd, so the last chunk is short). */
  for (int f = IN_PLACE; f <= POINTER; f++)
    for (int k = ALL_REDUCE; k <= BROADCAST; k++)
      run_case((enum kind)k, (enum form)f, MCAST_FLOAT32, MCAST_SUM, 300001, nranks - 1);

  int live, made, colls, max_ctas;
  standin_stats(standin, &live, &made, &colls, &max_ctas);
  CHECK(live == 1 && made == 1); /* one rail communicator per process */
  CHECK(max_ctas == 4);          /* made with the engine's CTA limit */
  CHECK(colls > 0);              /* the rails carried the traffic between domains */
  CHECK_OK(mcast_team_destroy(team));
  standin_stats(standin, &live, &made, &colls, &max_ctas);
  CHECK(live == 0);
  CHECK_OK(mcast_context_destroy(ctx));
  printf("rank %d of %d (domain %s): %lu cases ok, %d rail collectives\n", rank, nranks, label, cases, colls);
  MPI_Finalize();
  return 0;
}
