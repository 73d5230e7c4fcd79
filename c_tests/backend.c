/* mcast_context_get_info: the backend a context runs on and why, and the warning printed when
 * backend AUTO falls back to the simulator.
 *   backend sim:  MCAST_BACKEND=sim; SIM, "requested", no warning.
 *   backend auto: MCAST_BACKEND=auto, MCAST_LOG empty (the default level). Without a usable CUDA
 *                 driver: SIM, the reason names what was missing and MCAST_BACKEND=cuda, and the
 *                 warning is on stderr exactly once for two contexts. Where a driver and a device
 *                 exist: CUDA and no warning.
 * stderr (file descriptor 2, where the library's log goes) is captured in a temporary file. */
#define _POSIX_C_SOURCE 200809L /* mkstemp, dup, off_t */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static const char *const WARNING = "running on the SIMULATOR";

static int saved_stderr = -1;
static char captured[4096];

static void capture_begin(void) {
  char path[] = "/tmp/mcast_backend_XXXXXX";
  const int fd = mkstemp(path);
  CHECK(fd >= 0);
  unlink(path);
  fflush(stderr);
  saved_stderr = dup(2);
  CHECK(saved_stderr >= 0 && dup2(fd, 2) == 2);
  close(fd);
}

/* Restores stderr and returns what was written to it meanwhile. */
static const char *capture_end(void) {
  fflush(stderr);
  const off_t end = lseek(2, 0, SEEK_END);
  CHECK(end >= 0 && lseek(2, 0, SEEK_SET) == 0);
  const size_t want = (size_t)end < sizeof captured - 1 ? (size_t)end : sizeof captured - 1;
  const ssize_t got = read(2, captured, want);
  CHECK(got == (ssize_t)want);
  captured[got] = '\0';
  CHECK(dup2(saved_stderr, 2) == 2);
  close(saved_stderr);
  fputs(captured, stderr); /* shown by ctest --output-on-failure */
  return captured;
}

static int count(const char *text, const char *what) {
  int n = 0;
  for (const char *p = strstr(text, what); p; p = strstr(p + 1, what)) n++;
  return n;
}

static mcast_context_info_t info_of(mcast_context_t ctx) {
  mcast_context_info_t info;
  memset(&info, 0x5a, sizeof info);
  info.struct_size = sizeof info;
  CHECK_OK(mcast_context_get_info(ctx, &info));
  CHECK(info.struct_size == sizeof info);
  CHECK(memchr(info.backend_reason, '\0', sizeof info.backend_reason) != NULL);
  CHECK(info.backend_reason[0] != '\0');
  CHECK(info.driver_version > 0);
  return info;
}

static void check_bad_arguments(mcast_context_t ctx) {
  mcast_context_info_t info;
  memset(&info, 0x5a, sizeof info);
  info.struct_size = 4;
  CHECK_STATUS(mcast_context_get_info(ctx, &info), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "struct_size") != NULL);
  CHECK(info.device_count == 0x5a5a5a5a && info.backend_reason[0] == 0x5a); /* untouched */
  CHECK_STATUS(mcast_context_get_info(ctx, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  info.struct_size = sizeof info;
  const mcast_context_t never = {0x7fff0000ffffull}, zero = {0};
  CHECK_STATUS(mcast_context_get_info(never, &info), MCAST_ERROR_INVALID_HANDLE);
  CHECK_STATUS(mcast_context_get_info(zero, &info), MCAST_ERROR_INVALID_HANDLE);
}

int main(int argc, char **argv) {
  if (argc != 2 || (strcmp(argv[1], "sim") != 0 && strcmp(argv[1], "auto") != 0)) {
    fprintf(stderr, "usage: backend sim|auto\n");
    return 2;
  }
  const int is_auto = strcmp(argv[1], "auto") == 0;
  mcast_context_t ctx, second;
  int devices = -1;

  capture_begin();
  CHECK_OK(mcast_context_create(NULL, &ctx)); /* MCAST_BACKEND from the environment */
  CHECK_OK(mcast_context_create(NULL, &second));
  const char *err = capture_end();

  const mcast_context_info_t info = info_of(ctx);
  CHECK_OK(mcast_device_count(ctx, &devices));
  CHECK(info.device_count == devices);
  CHECK(info_of(second).backend == info.backend);
  printf("backend %s: %s (driver %d, %d devices)\n",
         info.backend == MCAST_BACKEND_SIM ? "SIM" : "CUDA", info.backend_reason,
         info.driver_version, info.device_count);
  if (!is_auto) {
    CHECK(info.backend == MCAST_BACKEND_SIM);
    CHECK(strcmp(info.backend_reason, "backend SIM requested") == 0);
    CHECK(count(err, WARNING) == 0);
  } else if (info.backend == MCAST_BACKEND_SIM) {
    /* The fallback: why, in the reason and in one warning on stderr. */
    CHECK(strstr(info.backend_reason, "libcuda.so.1") || strstr(info.backend_reason, "no device"));
    CHECK(strstr(info.backend_reason, "MCAST_BACKEND=cuda") != NULL);
    CHECK(count(err, WARNING) == 1);
    CHECK(count(err, "MCAST_BACKEND=cuda") == 1);
    CHECK(strstr(err, " WARN ") != NULL);
  } else {
    CHECK(info.backend == MCAST_BACKEND_CUDA);
    CHECK(count(err, WARNING) == 0);
  }
  check_bad_arguments(ctx);
  CHECK_OK(mcast_context_destroy(second));
  CHECK_OK(mcast_context_destroy(ctx));
  return 0;
}
