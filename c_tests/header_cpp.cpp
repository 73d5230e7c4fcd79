// mcast.h compiles alone as C++ (C++17, -Wall -Wextra -Wpedantic -Werror), with C linkage.
#include "mcast.h"

int main() {
  mcast_status_t status = MCAST_SUCCESS;
  mcast_context_t ctx = {0};
  const char *(*last_error)(void) = &mcast_last_error;
  (void)ctx;
  (void)last_error;
  return static_cast<int>(status);
}
