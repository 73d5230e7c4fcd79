#!/bin/sh
# The link lines of README.md's "Getting started", against the installed package PREFIX:
#   pkgconfig_link.sh PREFIX static WORKDIR       cc + `pkg-config --libs mcast-static`: the
#       binary must not need libmcast.so (readelf -d) and must run on the simulator;
#   pkgconfig_link.sh PREFIX mpi WORKDIR          the getting-started program with its mpicc +
#       pkg-config + rpath line, from PREFIX/share/mcast/examples, run with mpirun -np 2 on the
#       simulator without LD_LIBRARY_PATH (the rpath must find libmcast.so).
set -eu
prefix="$1" mode="$2" work="$3"
mkdir -p "$work"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
unset LD_LIBRARY_PATH
case "$mode" in
  static)
    cat > "$work/static_app.c" <<'C'
#include <stdio.h>
#include "mcast.h"
int main(void) {
  mcast_context_t ctx;
  int count = 0;
  if (mcast_context_create(NULL, &ctx) != MCAST_SUCCESS) return 1;
  if (mcast_device_count(ctx, &count) != MCAST_SUCCESS || count < 1) return 1;
  printf("%d devices\n", count);
  return mcast_context_destroy(ctx) == MCAST_SUCCESS ? 0 : 1;
}
C
    # shellcheck disable=SC2046
    cc "$work/static_app.c" -o "$work/static_app" $(pkg-config --cflags --libs mcast-static)
    if readelf -d "$work/static_app" | grep -q 'NEEDED.*libmcast'; then
      echo "FAIL: a binary linked with mcast-static.pc still needs libmcast.so:" >&2
      readelf -d "$work/static_app" | grep NEEDED >&2
      exit 1
    fi
    MCAST_BACKEND=sim "$work/static_app"
    ;;
  mpi)
    src="$prefix/share/mcast/examples/getting_started/allreduce_mpi.c"
    # shellcheck disable=SC2046
    mpicc "$src" -o "$work/allreduce" $(pkg-config --cflags --libs mcast) \
      -Wl,-rpath,"$prefix/lib"
    readelf -d "$work/allreduce" | grep -q 'NEEDED.*libmcast\.so' || {
      echo "FAIL: the pkg-config build of allreduce does not link libmcast.so" >&2; exit 1; }
    MCAST_BACKEND=sim mpirun --allow-run-as-root --oversubscribe -np 2 "$work/allreduce"
    ;;
  *) echo "usage: pkgconfig_link.sh PREFIX static|mpi WORKDIR" >&2; exit 2 ;;
esac
