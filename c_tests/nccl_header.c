/* <nccl.h> of libmcast_nccl compiles alone (C11 -Wpedantic) and its initializers fill the
 * structs as NCCL's documentation says. */
#include <nccl.h>

#include <stdio.h>

int main(void) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  ncclUniqueId id;
  int ok = config.size == sizeof config && config.magic == 0xcafebeef &&
           config.version == NCCL_VERSION_CODE && config.blocking == NCCL_CONFIG_UNDEF_INT &&
           sim.size == sizeof sim && sizeof id.internal == NCCL_UNIQUE_ID_BYTES &&
           NCCL_VERSION_CODE == NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH) &&
           NCCL_VERSION(2, 27, 7) == 22707 && NCCL_VERSION(2, 8, 4) == 2804 && ncclNumTypes == 12 &&
           ncclBfloat16 == 9 && ncclMin == 3 && ncclInvalidUsage == 5 && sizeof(ncclRedOp_t) == 4;
  if (!ok) {
    fprintf(stderr, "nccl.h: an initializer or a constant is off\n");
    return 1;
  }
  return 0;
}
