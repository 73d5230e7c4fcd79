/*
 * mcast/nccl.h: the NCCL API, served by mcast (libmcast_nccl).
 *
 * Written from NCCL's documented API (the NCCL user guide's API reference) so that programs
 * written for NCCL build against it unchanged. It follows the host API of NCCL 2.27: the names,
 * types, enum values and signatures are NCCL's. NCCL 2.28's device API (nccl_device.h) is not
 * provided, so NCCL_MINOR says 27 and programs such as nccl-tests take their host-API paths.
 *
 * Served by mcast: communicator creation and destruction, queries, errors, ncclMemAlloc/Free,
 * buffer registration (ncclCommRegister, and NCCL 2.27's symmetric windows, ncclCommWindowRegister,
 * served as mcast registrations), ncclAllReduce, ncclBroadcast, ncclBcast, ncclReduceScatter, ncclAllGather
 * and groups, for the types float, double, half, bfloat16, int32, uint32, int64, uint64 and the
 * operations sum, min, max. Every other call goes to the NCCL library named by
 * MCAST_NCCL_FALLBACK, or returns ncclInvalidUsage (ncclGetLastError says why).
 *
 * This file is not NCCL's and contains none of NCCL's code.
 */
#ifndef MCAST_NCCL_H
#define MCAST_NCCL_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

/* Like NCCL's header, bring in the CUDA runtime's types (cudaStream_t, half, __nv_bfloat16)
 * where the CUDA headers can be found, since NCCL programs rely on it; nothing below needs
 * them, so the header also compiles where CUDA is not installed. */
#if defined(__has_include)
#if __has_include(<cuda_runtime.h>)
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#if __has_include(<cuda_bf16.h>)
#include <cuda_bf16.h>
#endif
#define MCAST_NCCL_HAVE_CUDA_RUNTIME 1
#endif
#endif

#define NCCL_MAJOR 2
#define NCCL_MINOR 27
#define NCCL_PATCH 7
#define NCCL_SUFFIX ""

/* NCCL's version encoding: from 2.9 on, major * 10000 + minor * 100 + patch. */
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

#define NCCL_UNIQUE_ID_BYTES 128
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_COMM_NULL NULL

/* Window registration flags (ncclCommWindowRegister). */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01

/* Communicator CTA policies (ncclConfig_t.CTAPolicy). */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01

/* ncclCommShrink flags. */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

#ifdef __cplusplus
extern "C" {
#endif

/* The stream type of the CUDA runtime and driver (cudaStream_t, CUstream): callers pass their
 * streams unchanged without this header including CUDA's. */
#ifndef MCAST_NCCL_HAVE_CUDA_RUNTIME
typedef struct CUstream_st *cudaStream_t;
#endif

/* A communicator: one rank of a team. Opaque. */
typedef struct ncclComm *ncclComm_t;
/* A registered window (ncclCommWindowRegister). Opaque. */
typedef struct ncclWindow *ncclWindow_t;

/* Made by one rank with ncclGetUniqueId and given to every rank by the program (MPI_Bcast, a
 * file, a key-value store). */
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  /* Built-in operations come before ncclNumOps; operations made with ncclRedOpCreate* after. */
  ncclNumOps = 5,
  /* Forces a 32-bit signed enum. */
  ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

/* Where the scalar of ncclRedOpCreatePreMulSum lives. */
typedef enum {
  ncclScalarDevice = 0,
  ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

/* Communicator options for ncclCommInitRankConfig and ncclCommSplit. Initialise with
 * NCCL_CONFIG_INITIALIZER, then set the fields to change; the library reads only the first
 * `size` bytes. mcast honours `blocking`; the other fields are accepted and ignored. */
typedef struct ncclConfig {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char *netName;
  int splitShare;
  int trafficClass;
  const char *commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                                 \
  {                                                                                             \
    sizeof(ncclConfig_t), /* size */                                                            \
        0xcafebeef,       /* magic */                                                           \
        NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */                         \
        NCCL_CONFIG_UNDEF_INT,                            /* blocking */                        \
        NCCL_CONFIG_UNDEF_INT,                            /* cgaClusterSize */                  \
        NCCL_CONFIG_UNDEF_INT,                            /* minCTAs */                         \
        NCCL_CONFIG_UNDEF_INT,                            /* maxCTAs */                         \
        NCCL_CONFIG_UNDEF_PTR,                            /* netName */                         \
        NCCL_CONFIG_UNDEF_INT,                            /* splitShare */                      \
        NCCL_CONFIG_UNDEF_INT,                            /* trafficClass */                    \
        NCCL_CONFIG_UNDEF_PTR,                            /* commName */                        \
        NCCL_CONFIG_UNDEF_INT,                            /* collnetEnable */                   \
        NCCL_CONFIG_UNDEF_INT,                            /* CTAPolicy */                       \
        NCCL_CONFIG_UNDEF_INT,                            /* shrinkShare */                     \
        NCCL_CONFIG_UNDEF_INT,                            /* nvlsCTAs */                        \
  }

/* What ncclGroupSimulateEnd estimates. */
typedef struct ncclSimInfo {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER                                                               \
  {                                                                                             \
    sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),        \
        NCCL_UNDEF_FLOAT                                                                        \
  }

/* ---- Versions, ids, errors ---- */
ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
const char *ncclGetErrorString(ncclResult_t result);
/* The detail of the calling thread's last failure (comm may be NULL). Never NULL. */
const char *ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);

/* ---- Communicators ---- */
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config);
ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId *commIds, ncclConfig_t *config);
ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config);
ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                            ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);

/* ---- Memory ---- */
ncclResult_t ncclMemAlloc(void **ptr, size_t size);
ncclResult_t ncclMemFree(void *ptr);
ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle);
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                    int winFlags);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);

/* ---- Reduction operations ---- */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* ---- Collectives (asynchronous: enqueued on stream) ---- */
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                          ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                         int root, ncclComm_t comm, cudaStream_t stream);

/* ---- Point to point ---- */
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);

/* ---- Groups ---- */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MCAST_NCCL_H */
