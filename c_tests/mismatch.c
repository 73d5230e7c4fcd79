/* README "When a team fails": ranks that disagree on a collective's count, dtype, op, broadcast
 * root or buffer offset, through the installed package on the simulator, one process and one
 * thread issuing both ranks: every rank's mcast_synchronize and mcast_team_get_error give
 * MCAST_ERROR_INVALID_ARGUMENT, the message names the field, the values and the ranks, no
 * rank's data changes, and the team refuses its next call (sticky). Runs with MULTICAST and P2P
 * on the simulator, and on GPUs (P2P, the barrier and the LL kernels; a team of one GPU twice
 * where there is one), including counts so far apart that the ranks choose different kernels. */
#include <stdint.h>
#include <string.h>

#include "check.h"

#define RANKS 2
#define BYTES (1 << 20)

static unsigned char pattern(int r, int i) { return (unsigned char)(((r * 31 + i * 7) % 251) | 1); }

/* One call of one rank: collective 'a' all-reduce (dtype, op), 'b' broadcast (root). */
typedef struct {
  char kind;
  size_t count, offset;
  mcast_dtype_t dtype;
  mcast_op_t op;
  int root;
} call_t;

static mcast_status_t issue(mcast_buffer_t buf, int r, const call_t *c) {
  if (c->kind == 'b') return mcast_broadcast(buf, r, c->root, c->offset, c->count, NULL);
  return mcast_all_reduce(buf, r, c->offset, c->count, c->dtype, c->op, NULL);
}

static int devices[RANKS] = {0, 1};

static void disagree(mcast_context_t ctx, const call_t calls[RANKS], const char *says) {
  mcast_team_t team;
  mcast_buffer_t buf;
  mcast_status_t err;
  static unsigned char bytes[BYTES];
  int r, i;

  CHECK_OK(mcast_team_create(ctx, devices, RANKS, &team));
  CHECK_OK(mcast_buffer_alloc(team, BYTES, &buf));
  for (r = 0; r < RANKS; r++) {
    for (i = 0; i < BYTES; i++) bytes[i] = pattern(r, i);
    CHECK_OK(mcast_buffer_write(buf, r, 0, bytes, BYTES));
  }
  for (r = 0; r < RANKS; r++) CHECK_OK(issue(buf, r, &calls[r]));
  for (r = 0; r < RANKS; r++) {
    CHECK_STATUS(mcast_synchronize(team, r, NULL), MCAST_ERROR_INVALID_ARGUMENT);
    if (strstr(mcast_last_error(), says) == NULL) {
      fprintf(stderr, "rank %d: the message lacks \"%s\": %s\n", r, says, mcast_last_error());
      exit(1);
    }
  }
  CHECK_OK(mcast_team_get_error(team, &err));
  CHECK(err == MCAST_ERROR_INVALID_ARGUMENT);
  for (r = 0; r < RANKS; r++) {
    CHECK_OK(mcast_buffer_read(buf, r, 0, bytes, BYTES));
    for (i = 0; i < BYTES; i++) CHECK(bytes[i] == pattern(r, i));
    /* Sticky: the next call is refused with the same error. */
    CHECK_STATUS(issue(buf, r, &calls[0]), MCAST_ERROR_INVALID_ARGUMENT);
    CHECK(strstr(mcast_last_error(), says) != NULL);
  }
  CHECK_OK(mcast_buffer_free(buf));
  CHECK_OK(mcast_team_destroy(team));
}

int main(void) {
  mcast_context_t ctx;
  const call_t f32 = {'a', 1024, 0, MCAST_FLOAT32, MCAST_SUM, 0};
  call_t c[RANKS];

  int n = 0;
  mcast_status_t status;

  status = mcast_context_create(NULL, &ctx);
  if (status == MCAST_ERROR_DRIVER_UNAVAILABLE) {
    fprintf(stderr, "skipped: %s\n", mcast_last_error());
    return 77;
  }
  CHECK_OK(status);
  CHECK_OK(mcast_device_count(ctx, &n));
  if (n < 1) {
    fprintf(stderr, "skipped: no device\n");
    CHECK_OK(mcast_context_destroy(ctx));
    return 77;
  }
  if (n < 2) devices[1] = 0;

  c[0] = f32, c[1] = f32, c[1].count = 512;
  disagree(ctx, c, "ranks disagree on count: rank 0 has 1024, rank 1 has 512");
  c[0] = f32, c[1] = f32, c[1].dtype = MCAST_INT32;
  disagree(ctx, c, "ranks disagree on dtype: rank 0 has f32, rank 1 has i32");
  c[0] = f32, c[1] = f32, c[0].dtype = c[1].dtype = MCAST_INT32, c[1].op = MCAST_MAX;
  disagree(ctx, c, "ranks disagree on op: rank 0 has sum, rank 1 has max");
  c[0] = f32, c[0].kind = 'b', c[0].count = 4096, c[1] = c[0], c[1].root = 1;
  disagree(ctx, c, "ranks disagree on root: rank 0 has 0, rank 1 has 1");
  c[0] = f32, c[1] = f32, c[1].offset = 4096;
  disagree(ctx, c, "ranks disagree on offset: rank 0 has 0, rank 1 has 4096");
  /* Counts that choose different kernels where LL is on (LL against a barrier kernel). */
  c[0] = f32, c[1] = f32, c[1].count = BYTES / 4;
  disagree(ctx, c, "ranks disagree on count: rank 0 has 1024, rank 1 has 262144");

  check_no_leaks(ctx);
  CHECK_OK(mcast_context_destroy(ctx));
  return 0;
}
