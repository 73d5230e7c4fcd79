/* The doors of the multi-process bootstrap, through the installed package: mcast_team_init_oob
 * with bad arguments (NULL oob, wrong struct_size, NULL allgather, nranks out of range, rank out
 * of range, device out of range, a callback returning non-zero) gives MCAST_ERROR_INVALID_ARGUMENT
 * with a clear message, calls the callback the documented number of times and leaks nothing;
 * a one-rank team forms through it; unique ids of another version and a malformed
 * MCAST_BOOTSTRAP_ADDR are refused; MCAST_BOOTSTRAP_ADDR=ip:port without MCAST_BOOTSTRAP_SECRET,
 * or with one shorter than 32 hex digits, is refused by mcast_get_unique_id and
 * mcast_team_init_rank; with a good secret rank 0 listens there. */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static int calls;
static int result;

static int gather(const void *send, void *recv, size_t bytes, void *user) {
  (void)user;
  calls++;
  memcpy(recv, send, bytes); /* one rank: the allgather is a copy */
  return result;
}

static mcast_oob_t oob(int rank, int nranks) {
  mcast_oob_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.allgather = gather;
  o.user = NULL;
  o.rank = rank;
  o.nranks = nranks;
  return o;
}

static void expect_invalid(mcast_context_t ctx, const mcast_oob_t *o, int device, int want_calls,
                           const char *words) {
  mcast_team_t team = {0};
  calls = 0;
  CHECK_STATUS(mcast_team_init_oob(ctx, o, device, &team), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(team.id == 0);
  CHECK(calls == want_calls);
  CHECK(strstr(mcast_last_error(), words) != NULL);
}

int main(void) {
  mcast_context_t ctx;
  mcast_config_t config;
  mcast_config_init(&config);
  config.timeout_ms = 2000;
  CHECK_OK(mcast_context_create(&config, &ctx));
  CHECK(strcmp(mcast_status_string(MCAST_ERROR_ABORTED), "MCAST_ERROR_ABORTED") == 0);
  CHECK(MCAST_ERROR_ABORTED == 11);

  mcast_oob_t o = oob(0, 1);
  mcast_team_t team = {0};
  CHECK_STATUS(mcast_team_init_oob(ctx, NULL, 0, &team), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "oob is NULL") != NULL);
  CHECK_STATUS(mcast_team_init_oob(ctx, &o, 0, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  o.struct_size = 8;
  expect_invalid(ctx, &o, 0, 0, "struct_size");
  o = oob(0, 1);
  o.allgather = NULL;
  expect_invalid(ctx, &o, 0, 0, "allgather is NULL");
  o = oob(0, 0);
  expect_invalid(ctx, &o, 0, 0, "nranks is 0");
  o = oob(0, 73);
  expect_invalid(ctx, &o, 0, 0, "a team has 1 to"); /* 1 to MAX_RANKS (72) */
  /* A bad rank or device still takes part in the allgather (once), so every rank fails. */
  o = oob(1, 1);
  expect_invalid(ctx, &o, 0, 1, "rank 1 is out of range");
  o = oob(-1, 1);
  expect_invalid(ctx, &o, 0, 1, "out of range");
  o = oob(0, 1);
  expect_invalid(ctx, &o, 99, 1, "device 99");
  result = 5;
  expect_invalid(ctx, &o, 0, 1, "returned 5");
  result = 0;
  check_no_leaks(ctx);

  /* A one-rank team through the application's allgather. */
  calls = 0;
  CHECK_OK(mcast_team_init_oob(ctx, &o, 0, &team));
  CHECK(calls == 1);
  mcast_buffer_t buf;
  CHECK_OK(mcast_buffer_alloc(team, 4096, &buf));
  CHECK_OK(mcast_all_reduce(buf, 0, 0, 1024, MCAST_FLOAT32, MCAST_SUM, NULL));
  CHECK_OK(mcast_synchronize(team, 0, NULL));
  CHECK_OK(mcast_buffer_free(buf));
  CHECK_OK(mcast_team_destroy(team));
  check_no_leaks(ctx);

  /* Unique ids: garbage and other versions are refused; out NULL. */
  mcast_unique_id_t id;
  memset(&id, 0, sizeof id);
  CHECK_STATUS(mcast_team_init_rank(ctx, id, 1, 0, 0, &team), MCAST_ERROR_INVALID_ARGUMENT);
  memcpy(id.internal, "MCASTID1", 8);
  CHECK_STATUS(mcast_team_init_rank(ctx, id, 1, 0, 0, &team), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "another version") != NULL);
  CHECK_STATUS(mcast_get_unique_id(NULL), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_OK(mcast_get_unique_id(&id));
  CHECK_STATUS(mcast_team_init_rank(ctx, id, 73, 0, 0, &team), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_team_init_rank(ctx, id, 0, 0, 0, &team), MCAST_ERROR_INVALID_ARGUMENT);

  /* MCAST_BOOTSTRAP_ADDR: malformed is refused; ip:port makes an id with no listener and rank 0
     listens there. */
  setenv("MCAST_BOOTSTRAP_ADDR", "not-an-address", 1);
  CHECK_STATUS(mcast_get_unique_id(&id), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "MCAST_BOOTSTRAP_ADDR") != NULL);
  setenv("MCAST_BOOTSTRAP_ADDR", "127.0.0.1:0", 1);
  /* No secret, or a short one: refused, naming the variable and how to make one. */
  CHECK_STATUS(mcast_get_unique_id(&id), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "MCAST_BOOTSTRAP_SECRET") != NULL);
  CHECK(strstr(mcast_last_error(), "openssl rand -hex 32") != NULL);
  setenv("MCAST_BOOTSTRAP_SECRET", "0123456789abcdef", 1);
  CHECK_STATUS(mcast_get_unique_id(&id), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "MCAST_BOOTSTRAP_SECRET has 16 hex digits") != NULL);
  setenv("MCAST_BOOTSTRAP_SECRET", "5b0e9d27c4f1a3866a1fd0c3e97b4528", 1);
  CHECK_OK(mcast_get_unique_id(&id));
  /* Port 0 is no address to meet at: the id is refused when used. */
  CHECK_STATUS(mcast_team_init_rank(ctx, id, 1, 0, 0, &team), MCAST_ERROR_INVALID_ARGUMENT);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", 20000 + (int)(getpid() % 20000));
  setenv("MCAST_BOOTSTRAP_ADDR", addr, 1);
  CHECK_OK(mcast_get_unique_id(&id));
  /* An env-mode id is not joined from an environment with a bad secret. */
  unsetenv("MCAST_BOOTSTRAP_SECRET");
  CHECK_STATUS(mcast_team_init_rank(ctx, id, 1, 0, 0, &team), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "MCAST_BOOTSTRAP_SECRET") != NULL);
  unsetenv("MCAST_BOOTSTRAP_ADDR");
  CHECK_OK(mcast_team_init_rank(ctx, id, 1, 0, 0, &team));
  CHECK_OK(mcast_team_destroy(team));
  check_no_leaks(ctx);
  CHECK_OK(mcast_context_destroy(ctx));
  printf("oob_args: ok\n");
  return 0;
}
