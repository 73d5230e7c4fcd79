/* API.md "Conventions" and "Status codes": fixed numbers, one static name per status, a name for
 * unknown values, and a thread-local last-error message that is never NULL. */
#include <pthread.h>
#include <string.h>

#include "check.h"

static void check_name(mcast_status_t status, unsigned value, const char *name) {
  const char *text = mcast_status_string(status);
  if ((unsigned)status != value) {
    fprintf(stderr, "%s is %u, API.md says %u\n", name, (unsigned)status, value);
    exit(1);
  }
  if (text == NULL || strcmp(text, name) != 0) {
    fprintf(stderr, "mcast_status_string(%u) is \"%s\", expected \"%s\"\n", value,
            text ? text : "(null)", name);
    exit(1);
  }
}

static void *other_thread(void *arg) {
  const char *message = mcast_last_error();
  mcast_context_t never_issued = {0x5eed5eedu};
  (void)arg;
  /* A new thread has no failure yet. */
  CHECK(message != NULL);
  CHECK(message[0] == '\0');
  CHECK_STATUS(mcast_context_destroy(never_issued), MCAST_ERROR_INVALID_HANDLE);
  message = mcast_last_error();
  CHECK(message != NULL && message[0] != '\0');
  return NULL;
}

int main(void) {
  const unsigned unknown[] = {12u, 77u, 1000u, 0x7fffffffu, 0xffffffffu};
  const char *message;
  char main_message[1024];
  pthread_t thread;
  size_t i;

  check_name(MCAST_SUCCESS, 0, "MCAST_SUCCESS");
  check_name(MCAST_ERROR_INVALID_ARGUMENT, 1, "MCAST_ERROR_INVALID_ARGUMENT");
  check_name(MCAST_ERROR_INVALID_HANDLE, 2, "MCAST_ERROR_INVALID_HANDLE");
  check_name(MCAST_ERROR_OUT_OF_MEMORY, 3, "MCAST_ERROR_OUT_OF_MEMORY");
  check_name(MCAST_ERROR_NOT_SUPPORTED, 4, "MCAST_ERROR_NOT_SUPPORTED");
  check_name(MCAST_ERROR_DRIVER_UNAVAILABLE, 5, "MCAST_ERROR_DRIVER_UNAVAILABLE");
  check_name(MCAST_ERROR_DRIVER, 6, "MCAST_ERROR_DRIVER");
  check_name(MCAST_ERROR_SYSTEM_NOT_READY, 7, "MCAST_ERROR_SYSTEM_NOT_READY");
  check_name(MCAST_ERROR_IN_USE, 8, "MCAST_ERROR_IN_USE");
  check_name(MCAST_ERROR_TIMEOUT, 9, "MCAST_ERROR_TIMEOUT");
  check_name(MCAST_ERROR_INTERNAL, 10, "MCAST_ERROR_INTERNAL");
  check_name(MCAST_ERROR_ABORTED, 11, "MCAST_ERROR_ABORTED");

  /* A value no status has (a C caller can pass any integer): a name, never NULL. */
  for (i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    const char *text = mcast_status_string((mcast_status_t)unknown[i]);
    CHECK(text != NULL);
    if (strcmp(text, "MCAST_ERROR_UNKNOWN") != 0) {
      fprintf(stderr, "mcast_status_string(%u) is \"%s\", expected \"MCAST_ERROR_UNKNOWN\"\n",
              unknown[i], text);
      return 1;
    }
  }
  /* Static strings: the same pointer every time. */
  CHECK(mcast_status_string(MCAST_ERROR_TIMEOUT) == mcast_status_string(MCAST_ERROR_TIMEOUT));

  /* Last error: "" before any failure, a message after one, never NULL. */
  message = mcast_last_error();
  CHECK(message != NULL);
  CHECK(message[0] == '\0');
  CHECK_STATUS(mcast_context_create(NULL, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  message = mcast_last_error();
  CHECK(message != NULL && message[0] != '\0');
  CHECK(strlen(message) < sizeof main_message);
  strcpy(main_message, message);

  /* Thread-local: another thread's failure leaves this thread's message alone. */
  CHECK(pthread_create(&thread, NULL, other_thread, NULL) == 0);
  CHECK(pthread_join(thread, NULL) == 0);
  CHECK(strcmp(mcast_last_error(), main_message) == 0);
  return 0;
}
