/* The version macros, mcast_get_version() and the version in Cargo.toml agree. */
#include <stdio.h>
#include <string.h>

#include "check.h"

int main(void) {
  int major = -1, minor = -1, patch = -1;
  char text[64];

  mcast_get_version(&major, &minor, &patch);
  CHECK(major == MCAST_VERSION_MAJOR);
  CHECK(minor == MCAST_VERSION_MINOR);
  CHECK(patch == MCAST_VERSION_PATCH);

  snprintf(text, sizeof text, "%d.%d.%d", MCAST_VERSION_MAJOR, MCAST_VERSION_MINOR,
           MCAST_VERSION_PATCH);
  if (strcmp(text, MCAST_CARGO_VERSION) != 0) {
    fprintf(stderr, "mcast.h says %s, Cargo.toml says %s\n", text, MCAST_CARGO_VERSION);
    return 1;
  }

  /* NULL pointers are skipped. */
  mcast_get_version(NULL, NULL, NULL);
  minor = -1;
  mcast_get_version(NULL, &minor, NULL);
  CHECK(minor == MCAST_VERSION_MINOR);
  return 0;
}
