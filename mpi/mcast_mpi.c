/* libmcast_mpi: MPI as mcast's engine between NVLink domains; see include/mcast/mpi.h.
 *
 * Each function returns 0 on success, else one of the MCAST_MPI_E* codes below (mcast puts the
 * value in its error message), or an MPI error code when an MPI call fails. */
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mcast/mpi.h>

#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#endif

enum {
  MCAST_MPI_EARG = -1,    /* an argument no MPI call accepts: NULL, a count over INT_MAX */
  MCAST_MPI_ENOMEM = -2,  /* a host allocation failed */
  MCAST_MPI_ERAIL = -3,   /* the rail's MPI communicator is not the size or order mcast expects */
  MCAST_MPI_ECOPY = -4,   /* a staging copy between device and host memory failed */
  MCAST_MPI_EDTYPE = -5,  /* an unknown dtype or op */
};

typedef struct {
  MPI_Comm comm;
} mpi_user;

typedef struct {
  MPI_Comm comm;
  int rank, size;
} mpi_rail;

/* ---- device memory: staged through the host where MPI cannot read it ------------------- */

typedef int (*cu_pointer_get_attribute_fn)(void *data, int attribute, unsigned long long ptr);
typedef int (*cu_memcpy_fn)(unsigned long long dst, unsigned long long src, size_t bytes);

static struct {
  int tried;
  cu_pointer_get_attribute_fn attr;
  cu_memcpy_fn copy;
} cuda;

static int cuda_aware(void) {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support();
#else
  return 0;
#endif
}

/* True when `p` is CUDA device memory that this MPI cannot read. The driver is loaded once, at
 * the first call; without it (or for memory the driver does not know, such as the simulator's,
 * which is host memory) nothing is staged. Called under MPI's thread rules by mcast's ranks. */
static int needs_staging(const void *p) {
  enum { CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2, CU_MEMORYTYPE_DEVICE = 2 };
  if (cuda_aware()) return 0;
  if (!cuda.tried) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (lib != NULL) {
      cuda.attr = (cu_pointer_get_attribute_fn)dlsym(lib, "cuPointerGetAttribute");
      cuda.copy = (cu_memcpy_fn)dlsym(lib, "cuMemcpy");
    }
    cuda.tried = 1;
  }
  if (cuda.attr == NULL || cuda.copy == NULL) return 0;
  unsigned int type = 0;
  return cuda.attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (unsigned long long)(uintptr_t)p) == 0 &&
         type == CU_MEMORYTYPE_DEVICE;
}

/* A buffer as MPI sees it: the caller's pointer, or a host copy of it. */
typedef struct {
  void *dev;
  void *host;
  size_t bytes;
  int staged;
} view;

static int view_open(view *v, const void *p, size_t bytes, int read) {
  v->dev = (void *)p;
  v->bytes = bytes;
  v->staged = needs_staging(p);
  v->host = v->dev;
  if (!v->staged) return 0;
  v->host = malloc(bytes ? bytes : 1);
  if (v->host == NULL) return MCAST_MPI_ENOMEM;
  if (read && bytes > 0 &&
      cuda.copy((unsigned long long)(uintptr_t)v->host, (unsigned long long)(uintptr_t)p, bytes) != 0) {
    free(v->host);
    return MCAST_MPI_ECOPY;
  }
  return 0;
}

/* Writes a staged view back (when `write`) and frees it. */
static int view_close(view *v, int write, int rc) {
  if (!v->staged) return rc;
  if (write && rc == 0 && v->bytes > 0 &&
      cuda.copy((unsigned long long)(uintptr_t)v->dev, (unsigned long long)(uintptr_t)v->host, v->bytes) != 0)
    rc = MCAST_MPI_ECOPY;
  free(v->host);
  return rc;
}

/* ---- dtypes and reductions ------------------------------------------------------------- */

static size_t dtype_size(mcast_dtype_t d) {
  switch (d) {
    case MCAST_FLOAT32: case MCAST_INT32: case MCAST_UINT32: return 4;
    case MCAST_FLOAT64: case MCAST_INT64: case MCAST_UINT64: return 8;
    case MCAST_FLOAT16: case MCAST_BFLOAT16: return 2;
  }
  return 0;
}

/* MPI's own type for the integers (whose reductions MPI computes exactly); MPI_DATATYPE_NULL
 * for the floating-point types, reduced here. */
static MPI_Datatype integer_type(mcast_dtype_t d) {
  switch (d) {
    case MCAST_INT32: return MPI_INT32_T;
    case MCAST_UINT32: return MPI_UINT32_T;
    case MCAST_INT64: return MPI_INT64_T;
    case MCAST_UINT64: return MPI_UINT64_T;
    default: return MPI_DATATYPE_NULL;
  }
}

static MPI_Op mpi_op(mcast_op_t op) {
  switch (op) {
    case MCAST_SUM: return MPI_SUM;
    case MCAST_MIN: return MPI_MIN;
    case MCAST_MAX: return MPI_MAX;
  }
  return MPI_OP_NULL;
}

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else { /* subnormal: normalise */
    int e = -1;
    do { e++; man <<= 1; } while ((man & 0x400) == 0);
    bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* Round to nearest even, as __float2half_rn. */
static uint16_t float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0);
  if (ax >= 0x477ff000u) return sign | 0x7c00; /* rounds to infinity */
  if (ax < 0x38800000u) {                      /* subnormal or zero */
    if (ax < 0x33000000u) return sign;
    uint32_t man = (ax & 0x7fffff) | 0x800000;
    int shift = 126 - (int)(ax >> 23);
    uint32_t r = man >> (shift - 10 + 1);
    uint32_t rest = man & ((1u << (shift - 10 + 1)) - 1), half = 1u << (shift - 10);
    if (rest > half || (rest == half && (r & 1))) r++;
    return sign | (uint16_t)r;
  }
  uint32_t r = ax - 0x38000000u; /* rebias 127 -> 15 */
  uint32_t out = r >> 13, rest = r & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (out & 1))) out++;
  return sign | (uint16_t)out;
}

static float bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static uint16_t float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
  return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* min/max keep the winning operand; a NaN operand yields the other (fminf, fmaxf). */
static int pick_second(double a, double b, mcast_op_t op) {
  if (isnan(b)) return 0;
  if (isnan(a)) return 1;
  return op == MCAST_MIN ? b < a : b > a;
}

/* out[i] = the reduction of in[k * stride + i] over k = 0..n-1, in that order (floating types). */
static void fold(void *out, const void *in, size_t n, size_t stride, size_t count, mcast_dtype_t d, mcast_op_t op) {
  size_t es = dtype_size(d);
  const unsigned char *src = in;
  unsigned char *dst = out;
  for (size_t i = 0; i < count; i++) {
    if (d == MCAST_FLOAT64) {
      double acc;
      memcpy(&acc, src + i * es, 8);
      for (size_t k = 1; k < n; k++) {
        double v;
        memcpy(&v, src + (k * stride + i) * es, 8);
        if (op == MCAST_SUM) acc += v;
        else if (pick_second(acc, v, op)) acc = v;
      }
      memcpy(dst + i * es, &acc, 8);
    } else if (d == MCAST_FLOAT32) {
      float acc;
      memcpy(&acc, src + i * es, 4);
      for (size_t k = 1; k < n; k++) {
        float v;
        memcpy(&v, src + (k * stride + i) * es, 4);
        if (op == MCAST_SUM) acc += v;
        else if (pick_second(acc, v, op)) acc = v;
      }
      memcpy(dst + i * es, &acc, 4);
    } else { /* 16-bit: sums accumulate in float and round once; min/max keep an operand */
      int bf = d == MCAST_BFLOAT16;
      uint16_t best, v;
      memcpy(&best, src + i * es, 2);
      float acc = bf ? bf16_to_float(best) : half_to_float(best);
      for (size_t k = 1; k < n; k++) {
        memcpy(&v, src + (k * stride + i) * es, 2);
        float fv = bf ? bf16_to_float(v) : half_to_float(v);
        if (op == MCAST_SUM) {
          acc += fv;
        } else if (pick_second(acc, fv, op)) {
          acc = fv;
          best = v;
        }
      }
      if (op == MCAST_SUM) best = bf ? float_to_bf16(acc) : float_to_half(acc);
      memcpy(dst + i * es, &best, 2);
    }
  }
}

/* ---- the table ------------------------------------------------------------------------- */

static int checked(size_t count, size_t es, int *out) {
  if (es == 0) return MCAST_MPI_EDTYPE;
  if (count > (size_t)INT_MAX / es) return MCAST_MPI_EARG;
  *out = (int)(count * es);
  return 0;
}

static int comm_create(void *user, int rail, int domain, int ndomains, const mcast_oob_t *oob, void **comm) {
  (void)oob; /* MPI already connects the ranks */
  mpi_user *u = user;
  if (u == NULL || comm == NULL) return MCAST_MPI_EARG;
  mpi_rail *r = malloc(sizeof *r);
  if (r == NULL) return MCAST_MPI_ENOMEM;
  int rc = MPI_Comm_split(u->comm, rail, domain, &r->comm);
  if (rc != MPI_SUCCESS) {
    free(r);
    return rc;
  }
  MPI_Comm_rank(r->comm, &r->rank);
  MPI_Comm_size(r->comm, &r->size);
  if (r->rank != domain || r->size != ndomains) {
    MPI_Comm_free(&r->comm);
    free(r);
    return MCAST_MPI_ERAIL;
  }
  *comm = r;
  return 0;
}

static int all_reduce(void *comm, const void *send, void *recv, size_t count, mcast_dtype_t dtype, mcast_op_t op,
                      mcast_stream_t stream) {
  (void)stream;
  mpi_rail *r = comm;
  int bytes, rc;
  if ((rc = checked(count, dtype_size(dtype), &bytes)) != 0) return rc;
  if (mpi_op(op) == MPI_OP_NULL) return MCAST_MPI_EDTYPE;
  view s, d;
  if ((rc = view_open(&s, send, (size_t)bytes, 1)) != 0) return rc;
  if ((rc = view_open(&d, recv, (size_t)bytes, 0)) != 0) return view_close(&s, 0, rc);
  MPI_Datatype t = integer_type(dtype);
  if (t != MPI_DATATYPE_NULL) {
    rc = MPI_Allreduce(send == recv && !s.staged ? MPI_IN_PLACE : s.host, d.host, (int)count, t, mpi_op(op), r->comm);
  } else {
    unsigned char *all = malloc((size_t)bytes * (size_t)r->size + 1);
    if (all == NULL) {
      rc = MCAST_MPI_ENOMEM;
    } else {
      rc = MPI_Allgather(s.host, bytes, MPI_BYTE, all, bytes, MPI_BYTE, r->comm);
      if (rc == MPI_SUCCESS) fold(d.host, all, (size_t)r->size, count, count, dtype, op);
      free(all);
    }
  }
  rc = view_close(&d, 1, rc);
  return view_close(&s, 0, rc);
}

static int reduce_scatter(void *comm, const void *send, void *recv, size_t recv_count, mcast_dtype_t dtype,
                          mcast_op_t op, mcast_stream_t stream) {
  (void)stream;
  mpi_rail *r = comm;
  int bytes, rc;
  if ((rc = checked(recv_count, dtype_size(dtype), &bytes)) != 0) return rc;
  if ((size_t)bytes * (size_t)r->size > INT_MAX) return MCAST_MPI_EARG;
  if (mpi_op(op) == MPI_OP_NULL) return MCAST_MPI_EDTYPE;
  view s, d;
  if ((rc = view_open(&s, send, (size_t)bytes * (size_t)r->size, 1)) != 0) return rc;
  if ((rc = view_open(&d, recv, (size_t)bytes, 0)) != 0) return view_close(&s, 0, rc);
  MPI_Datatype t = integer_type(dtype);
  unsigned char *mine = malloc((size_t)bytes * (size_t)r->size + 1);
  if (mine == NULL) {
    rc = MCAST_MPI_ENOMEM;
  } else if (t != MPI_DATATYPE_NULL) {
    /* recv may lie inside send (in place): reduce into a separate buffer first. */
    rc = MPI_Reduce_scatter_block(s.host, mine, (int)recv_count, t, mpi_op(op), r->comm);
    if (rc == MPI_SUCCESS) memcpy(d.host, mine, (size_t)bytes);
  } else {
    /* block k of `mine` = member k's block for this member, then reduced in member order */
    rc = MPI_Alltoall(s.host, bytes, MPI_BYTE, mine, bytes, MPI_BYTE, r->comm);
    if (rc == MPI_SUCCESS) fold(d.host, mine, (size_t)r->size, recv_count, recv_count, dtype, op);
  }
  free(mine);
  rc = view_close(&d, 1, rc);
  return view_close(&s, 0, rc);
}

static int all_gather(void *comm, const void *send, void *recv, size_t send_count, mcast_dtype_t dtype,
                      mcast_stream_t stream) {
  (void)stream;
  mpi_rail *r = comm;
  int bytes, rc;
  if ((rc = checked(send_count, dtype_size(dtype), &bytes)) != 0) return rc;
  if ((size_t)bytes * (size_t)r->size > INT_MAX) return MCAST_MPI_EARG;
  size_t total = (size_t)bytes * (size_t)r->size;
  int in_place = (const unsigned char *)send == (unsigned char *)recv + (size_t)bytes * (size_t)r->rank;
  view s, d;
  if ((rc = view_open(&s, send, (size_t)bytes, 1)) != 0) return rc;
  if ((rc = view_open(&d, recv, total, in_place)) != 0) return view_close(&s, 0, rc);
  rc = MPI_Allgather(in_place ? MPI_IN_PLACE : s.host, bytes, MPI_BYTE, d.host, bytes, MPI_BYTE,
                     r->comm);
  rc = view_close(&d, 1, rc);
  return view_close(&s, 0, rc);
}

static int broadcast(void *comm, const void *send, void *recv, size_t count, mcast_dtype_t dtype, int root,
                     mcast_stream_t stream) {
  (void)stream;
  mpi_rail *r = comm;
  int bytes, rc;
  if ((rc = checked(count, dtype_size(dtype), &bytes)) != 0) return rc;
  if (root < 0 || root >= r->size) return MCAST_MPI_EARG;
  int is_root = r->rank == root;
  view d;
  if ((rc = view_open(&d, is_root ? send : recv, (size_t)bytes, is_root)) != 0) return rc;
  rc = MPI_Bcast(d.host, bytes, MPI_BYTE, root, r->comm);
  if (is_root && rc == MPI_SUCCESS && send != recv) {
    /* the root's own result: its send, into recv */
    view out;
    if ((rc = view_open(&out, recv, (size_t)bytes, 0)) == 0) {
      memcpy(out.host, d.host, (size_t)bytes);
      rc = view_close(&out, 1, rc);
    }
  }
  return view_close(&d, !is_root, rc);
}

/* MPI has no portable way to interrupt a blocked call on one communicator: nothing to do (a
 * blocked rail call ends when its peers arrive or the job ends). */
static int abort_comm(void *comm) {
  (void)comm;
  return 0;
}

static int destroy(void *comm) {
  mpi_rail *r = comm;
  if (r == NULL) return 0;
  int finalized = 0;
  MPI_Finalized(&finalized);
  int rc = finalized ? 0 : MPI_Comm_free(&r->comm);
  free(r);
  return rc;
}

static void release(void *user) {
  mpi_user *u = user;
  if (u == NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&u->comm);
  free(u);
}

static const mcast_net_ops_t ops = {
    .struct_size = sizeof(mcast_net_ops_t),
    .name = "mpi",
    .flags = 0,
    .comm_create = comm_create,
    .all_reduce = all_reduce,
    .reduce_scatter = reduce_scatter,
    .all_gather = all_gather,
    .broadcast = broadcast,
    .abort = abort_comm,
    .destroy = destroy,
    .release = release,
};

const mcast_net_ops_t *mcast_mpi_net_ops(void) { return &ops; }

void *mcast_mpi_net_user(MPI_Comm comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return NULL;
  mpi_user *u = malloc(sizeof *u);
  if (u == NULL) return NULL;
  if (MPI_Comm_dup(comm, &u->comm) != MPI_SUCCESS) {
    free(u);
    return NULL;
  }
  return u;
}
