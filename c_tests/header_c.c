/* mcast.h compiles alone as C (C99 here, with -Wall -Wextra -Wpedantic -Werror) and names the
 * types API.md promises. */
#include "mcast.h"

int main(void) {
  mcast_status_t status = MCAST_SUCCESS;
  mcast_context_t ctx = {0};
  mcast_config_t config;
  (void)ctx;
  (void)config;
  return (int)status;
}
