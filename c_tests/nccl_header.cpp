/* <nccl.h> of libmcast_nccl compiled alone as C++17 (-Wpedantic): the checks of nccl_header.c. */
#include "nccl_header.c"
