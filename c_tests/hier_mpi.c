/* Teams across NVLink domains over libmcast_mpi, on the simulator, under mpirun:
 *
 *   hier_mpi contiguous D     D domains of consecutive ranks (MCAST_DOMAIN set per rank from its
 *                             MPI rank before the context is made): every collective form (the
 *                             four collectives, in place / _into / pointer, on allocated buffers,
 *                             registered memory and plain device memory, every dtype and op, odd
 *                             counts) against a host reference; team info; split; device handles
 *   hier_mpi interleaved D    the same with domain = rank % D (ranks of a domain not consecutive)
 *   hier_mpi fail             an engine wrapping libmcast_mpi's whose all_reduce fails on rank 1
 *                             (after moving the data, so no peer hangs): every rank's team fails
 *                             with MCAST_ERROR_DRIVER, naming the engine, function and value
 *   hier_mpi none             MCAST_NET=none and no engine registered: NOT_SUPPORTED on every
 *                             rank, naming the domains and the engine tried
 *   hier_mpi disagree         two domains whose ranks agree inside each domain but not across
 *                             (domain B passes half the count): every rank's call fails with
 *                             INVALID_ARGUMENT naming the count, both values and ranks 0 and
 *                             B's first, before MPI sees a call of another count; no rank's
 *                             buffer is written; synchronize and mcast_team_get_error report it */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mcast/mpi.h>

static int g_rank, g_size;

#define OK(call)                                                                                     \
  do {                                                                                               \
    mcast_status_t s_ = (call);                                                                      \
    if (s_ != MCAST_SUCCESS) {                                                                       \
      fprintf(stderr, "rank %d: %s:%d: %s: %s: %s\n", g_rank, __FILE__, __LINE__, #call,             \
              mcast_status_string(s_), mcast_last_error());                                          \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                  \
    }                                                                                                \
  } while (0)

#define CHECK(cond)                                                                                  \
  do {                                                                                               \
    if (!(cond)) {                                                                                   \
      fprintf(stderr, "rank %d: %s:%d: check failed: %s\n", g_rank, __FILE__, __LINE__, #cond);     \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                  \
    }                                                                                                \
  } while (0)

static int mpi_allgather(const void *send, void *recv, size_t bytes, void *user) {
  return MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, *(MPI_Comm *)user);
}

static mcast_status_t make_team(mcast_context_t ctx, mcast_team_t *team) {
  static MPI_Comm comm;
  comm = MPI_COMM_WORLD;
  mcast_oob_t oob;
  memset(&oob, 0, sizeof oob);
  oob.struct_size = sizeof oob;
  oob.allgather = mpi_allgather;
  oob.user = &comm;
  oob.rank = g_rank;
  oob.nranks = g_size;
  int ndev = 0;
  OK(mcast_device_count(ctx, &ndev));
  return mcast_team_init_oob(ctx, &oob, g_rank % ndev, team);
}

/* ---- values: small integers, exact in every dtype (16-bit ones included) ---------------- */

static const mcast_dtype_t DTYPES[] = {MCAST_FLOAT32, MCAST_FLOAT64, MCAST_FLOAT16, MCAST_BFLOAT16,
                                       MCAST_INT32,   MCAST_UINT32,  MCAST_INT64,   MCAST_UINT64};
static const char *DTYPE_NAMES[] = {"f32", "f64", "f16", "bf16", "i32", "u32", "i64", "u64"};
static const mcast_op_t OPS[] = {MCAST_SUM, MCAST_MIN, MCAST_MAX};

static size_t esize(mcast_dtype_t d) {
  switch (d) {
    case MCAST_FLOAT64: case MCAST_INT64: case MCAST_UINT64: return 8;
    case MCAST_FLOAT16: case MCAST_BFLOAT16: return 2;
    default: return 4;
  }
}

static int is_unsigned(mcast_dtype_t d) { return d == MCAST_UINT32 || d == MCAST_UINT64; }

/* Rank q's element i. */
static long value(mcast_dtype_t d, int q, size_t i) {
  long v = (long)((q * 7 + (long)(i % 1009) * 3) % 11);
  return is_unsigned(d) ? v : v - 5;
}

static void put(mcast_dtype_t d, void *p, size_t i, long v) {
  unsigned char *b = (unsigned char *)p + i * esize(d);
  float f = (float)v;
  uint32_t x;
  memcpy(&x, &f, 4);
  switch (d) {
    case MCAST_FLOAT32: memcpy(b, &f, 4); break;
    case MCAST_FLOAT64: { double g = (double)v; memcpy(b, &g, 8); break; }
    case MCAST_BFLOAT16: { uint16_t h = (uint16_t)(x >> 16); memcpy(b, &h, 2); break; }
    case MCAST_FLOAT16: { /* small integers are normal halves (or zero) */
      uint16_t h = (uint16_t)((x >> 16) & 0x8000);
      if (v != 0) h |= (uint16_t)((((x >> 23) & 0xff) - 112) << 10 | ((x & 0x7fffff) >> 13));
      memcpy(b, &h, 2);
      break;
    }
    case MCAST_INT32: case MCAST_UINT32: { int32_t y = (int32_t)v; memcpy(b, &y, 4); break; }
    default: { int64_t y = v; memcpy(b, &y, 8); break; }
  }
}

static long get(mcast_dtype_t d, const void *p, size_t i) {
  const unsigned char *b = (const unsigned char *)p + i * esize(d);
  switch (d) {
    case MCAST_FLOAT32: { float f; memcpy(&f, b, 4); return lrintf(f); }
    case MCAST_FLOAT64: { double g; memcpy(&g, b, 8); return lrint(g); }
    case MCAST_BFLOAT16: {
      uint16_t h; memcpy(&h, b, 2);
      uint32_t x = (uint32_t)h << 16; float f; memcpy(&f, &x, 4); return lrintf(f);
    }
    case MCAST_FLOAT16: {
      uint16_t h; memcpy(&h, b, 2);
      uint32_t e = (h >> 10) & 0x1f, x = (uint32_t)(h & 0x8000) << 16;
      if (e != 0) x |= ((e + 112) << 23) | ((uint32_t)(h & 0x3ff) << 13);
      float f; memcpy(&f, &x, 4); return lrintf(f);
    }
    case MCAST_INT32: { int32_t y; memcpy(&y, b, 4); return y; }
    case MCAST_UINT32: { uint32_t y; memcpy(&y, b, 4); return (long)y; }
    default: { int64_t y; memcpy(&y, b, 8); return (long)y; }
  }
}

static long reduce(mcast_dtype_t d, mcast_op_t op, size_t i) {
  long acc = value(d, 0, i);
  for (int q = 1; q < g_size; q++) {
    long v = value(d, q, i);
    acc = op == MCAST_SUM ? acc + v : op == MCAST_MIN ? (v < acc ? v : acc) : (v > acc ? v : acc);
  }
  return acc;
}

static unsigned char byte_of(int q, size_t j) { return (unsigned char)(q * 31 + j * 7 + 1); }

/* ---- the memory under test -------------------------------------------------------------- */

enum { BYTES = 4 << 20 };

/* Where a form's send and recv live: two buffers of the team, or two device pointers. */
typedef struct {
  const char *name;
  int buffers;               /* 1: buffer forms (in place, _into); 0: pointer forms */
  mcast_buffer_t a, b;       /* buffer forms */
  unsigned char *pa, *pb;    /* this rank's copy of a and b (the simulator's memory is host memory) */
} place;

static void fill(const place *m, int second, size_t off, const void *src, size_t n) {
  if (m->buffers)
    OK(mcast_buffer_write(second ? m->b : m->a, g_rank, off, src, n));
  else
    memcpy((second ? m->pb : m->pa) + off, src, n);
}

static void fetch(const place *m, int second, size_t off, void *dst, size_t n) {
  if (m->buffers)
    OK(mcast_buffer_read(second ? m->b : m->a, g_rank, off, dst, n));
  else
    memcpy(dst, (second ? m->pb : m->pa) + off, n);
}

static long checks;

/* All-reduce: in place (recv = send), or out of place (send in a, recv in b). */
static void all_reduce(mcast_team_t team, const place *m, int in_place, mcast_dtype_t d, mcast_op_t op,
                       size_t count) {
  size_t es = esize(d), n = count * es;
  unsigned char *x = malloc(n), *y = malloc(n);
  for (size_t i = 0; i < count; i++) put(d, x, i, value(d, g_rank, i));
  fill(m, 0, 0, x, n);
  if (m->buffers && in_place)
    OK(mcast_all_reduce(m->a, g_rank, 0, count, d, op, NULL));
  else if (m->buffers)
    OK(mcast_all_reduce_into(m->a, 0, m->b, 0, g_rank, count, d, op, NULL));
  else
    OK(mcast_team_all_reduce(team, g_rank, m->pa, in_place ? m->pa : m->pb, count, d, op, NULL));
  OK(mcast_synchronize(team, g_rank, NULL));
  fetch(m, !in_place, 0, y, n);
  for (size_t i = 0; i < count; i++) {
    if (get(d, y, i) != reduce(d, op, i)) {
      fprintf(stderr, "rank %d: all_reduce %s %s count %zu op %d in_place %d: element %zu is %ld, expected %ld\n",
              g_rank, m->name, DTYPE_NAMES[d], count, (int)op, in_place, i, get(d, y, i), reduce(d, op, i));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  checks++;
  free(x);
  free(y);
}

/* Reduce-scatter: send = P blocks of count; rank g gets the reduction of block g. */
static void reduce_scatter(mcast_team_t team, const place *m, int in_place, mcast_dtype_t d, mcast_op_t op,
                           size_t count) {
  size_t es = esize(d), block = count * es, total = block * (size_t)g_size;
  unsigned char *x = malloc(total), *y = malloc(block);
  for (size_t i = 0; i < count * (size_t)g_size; i++) put(d, x, i, value(d, g_rank, i));
  fill(m, 0, 0, x, total);
  size_t mine = (size_t)g_rank * block;
  if (m->buffers && in_place)
    OK(mcast_reduce_scatter(m->a, g_rank, 0, count, d, op, NULL));
  else if (m->buffers)
    OK(mcast_reduce_scatter_into(m->a, 0, m->b, 0, g_rank, count, d, op, NULL));
  else
    OK(mcast_team_reduce_scatter(team, g_rank, m->pa, in_place ? m->pa + mine : m->pb, count, d, op, NULL));
  OK(mcast_synchronize(team, g_rank, NULL));
  fetch(m, !in_place, in_place ? mine : 0, y, block);
  for (size_t i = 0; i < count; i++) {
    size_t at = (size_t)g_rank * count + i;
    if (get(d, y, i) != reduce(d, op, at)) {
      fprintf(stderr, "rank %d: reduce_scatter %s %s count %zu op %d in_place %d: element %zu is %ld, expected %ld\n",
              g_rank, m->name, DTYPE_NAMES[d], count, (int)op, in_place, i, get(d, y, i), reduce(d, op, at));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  checks++;
  free(x);
  free(y);
}

/* All-gather of `bytes` per rank. */
static void all_gather(mcast_team_t team, const place *m, int in_place, size_t bytes) {
  size_t total = bytes * (size_t)g_size, mine = (size_t)g_rank * bytes;
  unsigned char *x = malloc(bytes), *y = malloc(total);
  for (size_t j = 0; j < bytes; j++) x[j] = byte_of(g_rank, j);
  fill(m, 0, in_place ? mine : 0, x, bytes);
  if (m->buffers && in_place)
    OK(mcast_all_gather(m->a, g_rank, 0, bytes, NULL));
  else if (m->buffers)
    OK(mcast_all_gather_into(m->a, 0, m->b, 0, g_rank, bytes, NULL));
  else
    OK(mcast_team_all_gather(team, g_rank, in_place ? m->pa + mine : m->pa, in_place ? m->pa : m->pb, bytes, NULL));
  OK(mcast_synchronize(team, g_rank, NULL));
  fetch(m, !in_place, 0, y, total);
  for (int q = 0; q < g_size; q++)
    for (size_t j = 0; j < bytes; j++)
      if (y[(size_t)q * bytes + j] != byte_of(q, j)) {
        fprintf(stderr, "rank %d: all_gather %s %zu bytes in_place %d: block %d byte %zu is %d, expected %d\n", g_rank,
                m->name, bytes, in_place, q, j, y[(size_t)q * bytes + j], byte_of(q, j));
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
  checks++;
  free(x);
  free(y);
}

static void broadcast(mcast_team_t team, const place *m, int in_place, size_t bytes, int root) {
  unsigned char *x = malloc(bytes), *y = malloc(bytes);
  for (size_t j = 0; j < bytes; j++) x[j] = byte_of(g_rank, j);
  fill(m, 0, 0, x, bytes);
  if (!in_place) { /* recv starts with something else */
    memset(y, 0xee, bytes);
    fill(m, 1, 0, y, bytes);
  }
  if (m->buffers && in_place)
    OK(mcast_broadcast(m->a, g_rank, root, 0, bytes, NULL));
  else if (m->buffers)
    OK(mcast_broadcast_into(m->a, 0, m->b, 0, g_rank, root, bytes, NULL));
  else
    OK(mcast_team_broadcast(team, g_rank, root, m->pa, in_place ? m->pa : m->pb, bytes, NULL));
  OK(mcast_synchronize(team, g_rank, NULL));
  fetch(m, !in_place, 0, y, bytes);
  for (size_t j = 0; j < bytes; j++)
    if (y[j] != byte_of(root, j)) {
      fprintf(stderr, "rank %d: broadcast %s %zu bytes from %d in_place %d: byte %zu is %d, expected %d\n", g_rank,
              m->name, bytes, root, in_place, j, y[j], byte_of(root, j));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  checks++;
  free(x);
  free(y);
}

/* Every collective form on the memory `m`. */
static void every_collective(mcast_team_t team, const place *m) {
  /* 3 and 1001: fewer elements than the domain size, and the short way; 20011 x 4 bytes and
     more: the domain reduce-scatter, rail all-reduce of a shard, domain all-gather, with a tail */
  const size_t counts[] = {3, 1001, 20011};
  for (int in_place = 0; in_place < 2; in_place++) {
    for (size_t di = 0; di < sizeof DTYPES / sizeof *DTYPES; di++)
      for (size_t oi = 0; oi < 3; oi++)
        for (size_t ci = 0; ci < 3; ci++) {
          mcast_dtype_t d = DTYPES[di];
          /* the largest count for one float, one 16-bit and one integer type (time) */
          if (ci == 2 && !(d == MCAST_FLOAT32 || d == MCAST_BFLOAT16 || d == MCAST_INT64)) continue;
          all_reduce(team, m, in_place, d, OPS[oi], counts[ci]);
          if (ci < 2 || oi == 0) reduce_scatter(team, m, in_place, d, OPS[oi], counts[ci] / 4 + 1);
        }
    const size_t bytes[] = {1, 13, 4097, 70001};
    for (size_t bi = 0; bi < 4; bi++) {
      all_gather(team, m, in_place, bytes[bi]);
      broadcast(team, m, in_place, bytes[bi], g_size - 1);
      broadcast(team, m, in_place, bytes[bi], 1);
    }
  }
}

static void every_form(mcast_context_t ctx, mcast_team_t team, int device) {
  place m;
  /* allocated buffers */
  memset(&m, 0, sizeof m);
  m.name = "buffer";
  m.buffers = 1;
  OK(mcast_buffer_alloc(team, BYTES, &m.a));
  OK(mcast_buffer_alloc(team, BYTES, &m.b));
  every_collective(team, &m);
  /* the pointer forms on the buffers' own pointers */
  void *pa, *pb;
  OK(mcast_buffer_local_ptr(m.a, g_rank, &pa));
  OK(mcast_buffer_local_ptr(m.b, g_rank, &pb));
  place bp = {"buffer pointers", 0, {0}, {0}, pa, pb};
  every_collective(team, &bp);
  OK(mcast_buffer_free(m.a));
  OK(mcast_buffer_free(m.b));
  /* registered memory: buffer forms and pointer forms */
  void *ra, *rb;
  OK(mcast_mem_alloc(ctx, device, BYTES, &ra));
  OK(mcast_mem_alloc(ctx, device, BYTES, &rb));
  place reg = {"registered", 1, {0}, {0}, ra, rb};
  OK(mcast_buffer_register(team, &ra, BYTES, &reg.a));
  OK(mcast_buffer_register(team, &rb, BYTES, &reg.b));
  every_collective(team, &reg);
  place regp = {"registered pointers", 0, {0}, {0}, ra, rb};
  every_collective(team, &regp);
  OK(mcast_buffer_free(reg.a));
  OK(mcast_buffer_free(reg.b));
  /* plain device memory (the same memory, no longer registered) */
  place plain = {"plain", 0, {0}, {0}, ra, rb};
  every_collective(team, &plain);
  OK(mcast_mem_free(ctx, ra));
  OK(mcast_mem_free(ctx, rb));
}

static void check_info(mcast_team_t team, int domains) {
  mcast_team_info_t info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  OK(mcast_team_get_info(team, &info));
  CHECK(info.size == g_size);
  CHECK(info.domains == domains);
  CHECK(info.domain_size == g_size / domains);
  CHECK(strcmp(info.net_engine, domains > 1 ? "mpi" : "") == 0);
}

static int run_layout(int interleaved, int domains) {
  char label[16];
  int domain = interleaved ? g_rank % domains : g_rank / (g_size / domains);
  snprintf(label, sizeof label, "D%d", domain);
  setenv("MCAST_DOMAIN", label, 1);
  mcast_context_t ctx;
  OK(mcast_context_create(NULL, &ctx));
  OK(mcast_context_set_net(ctx, mcast_mpi_net_ops(), mcast_mpi_net_user(MPI_COMM_WORLD)));
  mcast_team_t team;
  OK(make_team(ctx, &team));
  check_info(team, domains);
  int ndev = 0;
  OK(mcast_device_count(ctx, &ndev));
  /* device handles need NVLink between every rank: refused across domains */
  mcast_dev_team_t handle;
  memset(&handle, 0, sizeof handle);
  handle.struct_size = sizeof handle;
  CHECK(mcast_team_device_handle(team, g_rank, &handle) == MCAST_ERROR_NOT_SUPPORTED);
  CHECK(strstr(mcast_last_error(), "NVLink domains") != NULL);
  /* a rank of the team held by another process */
  CHECK(mcast_team_all_reduce(team, (g_rank + 1) % g_size, NULL, NULL, 1, MCAST_FLOAT32, MCAST_SUM, NULL) ==
        MCAST_ERROR_INVALID_ARGUMENT);
  every_form(ctx, team, g_rank % ndev);
  /* split by domain: teams within one domain; by parity: across domains again (or within) */
  mcast_team_t sub;
  OK(mcast_team_split(team, &domain, &g_rank, &sub));
  mcast_team_info_t info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  OK(mcast_team_get_info(sub, &info));
  CHECK(info.domains == 1 && info.size == g_size / domains && info.net_engine[0] == 0);
  OK(mcast_team_destroy(sub));
  OK(mcast_team_destroy(team));
  OK(mcast_context_destroy(ctx));
  printf("rank %d of %d: %s, %d domains: %ld collectives checked\n", g_rank, g_size,
         interleaved ? "interleaved" : "contiguous", domains, checks);
  return 0;
}

/* ---- an engine that fails on rank 1 --------------------------------------------------- */

static mcast_net_ops_t failing;

static int failing_all_reduce(void *comm, const void *send, void *recv, size_t count, mcast_dtype_t dtype,
                              mcast_op_t op, mcast_stream_t stream) {
  int rc = mcast_mpi_net_ops()->all_reduce(comm, send, recv, count, dtype, op, stream);
  return rc == 0 && g_rank == 1 ? 7 : rc;
}

static int run_fail(void) {
  setenv("MCAST_DOMAIN", g_rank < g_size / 2 ? "A" : "B", 1);
  mcast_context_t ctx;
  OK(mcast_context_create(NULL, &ctx));
  failing = *mcast_mpi_net_ops();
  failing.name = "mpi-failing";
  failing.all_reduce = failing_all_reduce;
  OK(mcast_context_set_net(ctx, &failing, mcast_mpi_net_user(MPI_COMM_WORLD)));
  mcast_team_t team;
  OK(make_team(ctx, &team));
  mcast_buffer_t buf;
  OK(mcast_buffer_alloc(team, 4096, &buf));
  mcast_status_t s = mcast_all_reduce(buf, g_rank, 0, 16, MCAST_FLOAT32, MCAST_SUM, NULL);
  if (g_rank == 1) {
    CHECK(s == MCAST_ERROR_DRIVER);
    CHECK(strstr(mcast_last_error(), "mpi-failing") != NULL);
    CHECK(strstr(mcast_last_error(), "all_reduce returned 7") != NULL);
  } else {
    CHECK(s == MCAST_SUCCESS || s == MCAST_ERROR_DRIVER);
  }
  /* every rank learns it within a few seconds (told over the team's connections) */
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    s = mcast_synchronize(team, g_rank, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t);
  } while (s == MCAST_SUCCESS && (t.tv_sec - t0.tv_sec) < 5);
  CHECK(s == MCAST_ERROR_DRIVER);
  CHECK(strstr(mcast_last_error(), "all_reduce returned 7") != NULL);
  MPI_Barrier(MPI_COMM_WORLD); /* every rank was told before any tears down (a peer's exit is news too) */
  OK(mcast_buffer_free(buf));
  mcast_team_destroy(team);
  OK(mcast_context_destroy(ctx));
  printf("rank %d: the engine's failure is every rank's: %s\n", g_rank, mcast_status_string(s));
  return 0;
}

static int run_none(void) {
  setenv("MCAST_DOMAIN", g_rank % 2 ? "odd" : "even", 1);
  setenv("MCAST_NET", "none", 1);
  mcast_context_t ctx;
  OK(mcast_context_create(NULL, &ctx));
  mcast_team_t team;
  mcast_status_t s = make_team(ctx, &team);
  CHECK(s == MCAST_ERROR_NOT_SUPPORTED);
  CHECK(strstr(mcast_last_error(), "2 NVLink domains") != NULL);
  CHECK(strstr(mcast_last_error(), "MCAST_DOMAIN=odd") != NULL);
  CHECK(strstr(mcast_last_error(), "MCAST_NET=none") != NULL);
  /* registering an engine and back to MCAST_NET: still refused */
  OK(mcast_context_set_net(ctx, mcast_mpi_net_ops(), mcast_mpi_net_user(MPI_COMM_WORLD)));
  OK(mcast_context_set_net(ctx, NULL, NULL));
  CHECK(make_team(ctx, &team) == MCAST_ERROR_NOT_SUPPORTED);
  /* a table with a NULL function is refused */
  mcast_net_ops_t bad = *mcast_mpi_net_ops();
  bad.broadcast = NULL;
  CHECK(mcast_context_set_net(ctx, &bad, NULL) == MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "ops->broadcast is NULL") != NULL);
  bad = *mcast_mpi_net_ops();
  bad.struct_size = 8;
  CHECK(mcast_context_set_net(ctx, &bad, NULL) == MCAST_ERROR_INVALID_ARGUMENT);
  OK(mcast_context_destroy(ctx));
  printf("rank %d: refused without an engine\n", g_rank);
  return 0;
}

static int run_disagree(void) {
  int in_b = g_rank >= g_size / 2;
  setenv("MCAST_DOMAIN", in_b ? "B" : "A", 1);
  mcast_context_t ctx;
  OK(mcast_context_create(NULL, &ctx));
  OK(mcast_context_set_net(ctx, mcast_mpi_net_ops(), mcast_mpi_net_user(MPI_COMM_WORLD)));
  mcast_team_t team;
  OK(make_team(ctx, &team));
  enum { N = 1024 };
  static float before[N], after[N];
  for (int i = 0; i < N; i++) before[i] = (float)(g_rank * N + i);
  mcast_buffer_t buf;
  OK(mcast_buffer_alloc(team, sizeof before, &buf));
  OK(mcast_buffer_write(buf, g_rank, 0, before, sizeof before));
  char says[96];
  snprintf(says, sizeof says, "ranks disagree on count: rank 0 has %d, rank %d has %d", N, g_size / 2, N / 2);
  mcast_status_t s = mcast_all_reduce(buf, g_rank, 0, in_b ? N / 2 : N, MCAST_FLOAT32, MCAST_SUM, NULL);
  if (s != MCAST_ERROR_INVALID_ARGUMENT || strstr(mcast_last_error(), says) == NULL) {
    fprintf(stderr, "rank %d: want INVALID_ARGUMENT with \"%s\", got %s: %s\n", g_rank, says,
            mcast_status_string(s), mcast_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  CHECK(mcast_synchronize(team, g_rank, NULL) == MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), says) != NULL);
  mcast_status_t kept = MCAST_SUCCESS;
  OK(mcast_team_get_error(team, &kept));
  CHECK(kept == MCAST_ERROR_INVALID_ARGUMENT);
  OK(mcast_buffer_read(buf, g_rank, 0, after, sizeof after));
  CHECK(memcmp(before, after, sizeof before) == 0);
  OK(mcast_buffer_free(buf));
  mcast_team_destroy(team);
  OK(mcast_context_destroy(ctx));
  printf("rank %d: caught across domains: %s\n", g_rank, says);
  return 0;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  int rc = 2;
  if (argc == 3 && (strcmp(argv[1], "contiguous") == 0 || strcmp(argv[1], "interleaved") == 0)) {
    int domains = atoi(argv[2]);
    CHECK(domains > 1 && g_size % domains == 0);
    rc = run_layout(argv[1][0] == 'i', domains);
  } else if (argc == 2 && strcmp(argv[1], "fail") == 0) {
    rc = run_fail();
  } else if (argc == 2 && strcmp(argv[1], "none") == 0) {
    rc = run_none();
  } else if (argc == 2 && strcmp(argv[1], "disagree") == 0) {
    rc = run_disagree();
  } else {
    fprintf(stderr, "usage: hier_mpi contiguous|interleaved DOMAINS | fail | none | disagree\n");
  }
  MPI_Finalize();
  return rc;
}
