/* API.md "Symmetric buffers" and "Leak tracking" through the installed package: a round trip on
 * every rank, peer and local pointers (host pointers on the simulator), the multicast pointer,
 * range and argument checks, handle rules, live counts and the snprintf-like leak report.
 * Runs with MCAST_BACKEND=sim. */
#include <stdint.h>
#include <string.h>

#include "check.h"

#define RANKS 4
#define SIZE ((size_t)3 * 1024 * 1024 + 17) /* not a multiple of anything */

static unsigned char pattern(int rank, size_t i) { return (unsigned char)(rank * 37 + i * 7 + 1); }

static void check_round_trip(mcast_buffer_t buf, int ranks) {
  unsigned char *data = malloc(SIZE), *back = malloc(SIZE);
  void *local = NULL, *peer = NULL;
  size_t bytes = 0, i;
  int r, p;

  CHECK(data != NULL && back != NULL);
  CHECK_OK(mcast_buffer_size(buf, &bytes));
  CHECK(bytes == SIZE);
  /* Distinct data on every rank, written in one call. */
  for (r = 0; r < ranks; r++) {
    for (i = 0; i < SIZE; i++) data[i] = pattern(r, i);
    CHECK_OK(mcast_buffer_write(buf, r, 0, data, SIZE));
  }
  for (r = 0; r < ranks; r++) {
    for (i = 0; i < SIZE; i++) data[i] = pattern(r, i);
    memset(back, 0, SIZE);
    CHECK_OK(mcast_buffer_read(buf, r, 0, back, SIZE));
    CHECK(memcmp(back, data, SIZE) == 0);
    /* The local pointer is rank r's copy (a host pointer on the simulator). */
    CHECK_OK(mcast_buffer_local_ptr(buf, r, &local));
    CHECK(local != NULL);
    CHECK(memcmp(local, data, SIZE) == 0);
    /* Every peer pointer of rank r shows that peer's data. */
    for (p = 0; p < ranks; p++) {
      peer = NULL;
      CHECK_OK(mcast_buffer_peer_ptr(buf, r, p, &peer));
      CHECK(peer != NULL);
      CHECK(((unsigned char *)peer)[0] == pattern(p, 0));
      CHECK(((unsigned char *)peer)[SIZE / 2] == pattern(p, SIZE / 2));
      CHECK(((unsigned char *)peer)[SIZE - 1] == pattern(p, SIZE - 1));
    }
  }
  /* Partial writes at an offset land there and nowhere else, on that rank only. */
  memset(data, 0xee, 100);
  CHECK_OK(mcast_buffer_write(buf, 1, SIZE - 100, data, 100));
  CHECK_OK(mcast_buffer_read(buf, 1, SIZE - 101, back, 101));
  CHECK(back[0] == pattern(1, SIZE - 101));
  CHECK(memcmp(back + 1, data, 100) == 0);
  CHECK_OK(mcast_buffer_read(buf, 0, SIZE - 100, back, 100));
  CHECK(back[0] == pattern(0, SIZE - 100) && back[99] == pattern(0, SIZE - 1));
  /* A store through a peer pointer is seen by the owner's read. */
  CHECK_OK(mcast_buffer_peer_ptr(buf, 0, ranks - 1, &peer));
  ((unsigned char *)peer)[5] = 0x5c;
  CHECK_OK(mcast_buffer_read(buf, ranks - 1, 5, back, 1));
  CHECK(back[0] == 0x5c);
  free(data);
  free(back);
}

static void check_bad_arguments(mcast_buffer_t buf, int ranks) {
  unsigned char byte = 0x42, out = 0x13;
  void *ptr = (void *)&out;
  size_t bytes = 77;

  /* Ranges: the last byte is fine, one past is not, nor an offset that wraps around. */
  CHECK_OK(mcast_buffer_write(buf, 0, SIZE - 1, &byte, 1));
  CHECK_OK(mcast_buffer_read(buf, 0, SIZE - 1, &out, 1));
  CHECK(out == 0x42);
  CHECK_STATUS(mcast_buffer_write(buf, 0, SIZE, &byte, 1), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "mcast_buffer_write") != NULL);
  CHECK_STATUS(mcast_buffer_read(buf, 0, SIZE, &out, 1), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_buffer_write(buf, 0, SIZE - 1, &byte, 2), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_buffer_read(buf, 0, 0, &out, SIZE + 1), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_buffer_write(buf, 0, SIZE_MAX, &byte, 2), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_buffer_read(buf, 0, 2, &out, SIZE_MAX), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(out == 0x42);
  /* Ranks out of range. */
  CHECK_STATUS(mcast_buffer_write(buf, ranks, 0, &byte, 1), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_buffer_read(buf, -1, 0, &out, 1), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_buffer_local_ptr(buf, ranks, &ptr), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_buffer_local_ptr(buf, -1, &ptr), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_buffer_peer_ptr(buf, 0, ranks, &ptr), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_buffer_peer_ptr(buf, ranks, 0, &ptr), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_buffer_peer_ptr(buf, 0, -1, &ptr), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(ptr == (void *)&out);
  /* NULL pointers. */
  CHECK_STATUS(mcast_buffer_write(buf, 0, 0, NULL, 1), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "src") != NULL);
  CHECK_STATUS(mcast_buffer_read(buf, 0, 0, NULL, 1), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mcast_last_error(), "dst") != NULL);
  CHECK_STATUS(mcast_buffer_local_ptr(buf, 0, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_buffer_peer_ptr(buf, 0, 0, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_buffer_multicast_ptr(buf, 0, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mcast_buffer_size(buf, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  /* The header: NULL is allowed with 0 bytes (a no-op). */
  CHECK_OK(mcast_buffer_write(buf, 0, 0, NULL, 0));
  CHECK_OK(mcast_buffer_read(buf, 0, 0, NULL, 0));
  CHECK_OK(mcast_buffer_size(buf, &bytes));
  CHECK(bytes == SIZE);
}

static void check_leak_report(mcast_context_t ctx) {
  static char big[65536];
  char small[8];
  size_t need, got;
  mcast_context_t zero = {0};

  need = mcast_context_leak_report(ctx, NULL, 0);
  CHECK(need > 0);
  CHECK(need < sizeof big);
  memset(big, 'x', sizeof big);
  got = mcast_context_leak_report(ctx, big, sizeof big);
  CHECK(got == need);
  CHECK(strlen(big) == need);
  CHECK(strstr(big, "team") != NULL);
  /* Truncation: len - 1 characters and a NUL, returning the full length. */
  memset(small, 'x', sizeof small);
  got = mcast_context_leak_report(ctx, small, sizeof small);
  CHECK(got == need);
  CHECK(small[sizeof small - 1] == '\0');
  CHECK(strncmp(small, big, sizeof small - 1) == 0);
  memset(small, 'x', sizeof small);
  CHECK(mcast_context_leak_report(ctx, small, 1) == need);
  CHECK(small[0] == '\0' && small[1] == 'x');
  /* len 0 with a buffer: nothing is written. */
  CHECK(mcast_context_leak_report(ctx, small, 0) == need);
  CHECK(small[0] == '\0' && small[1] == 'x');
  /* An invalid context: "" and 0, and a message. */
  memset(small, 'x', sizeof small);
  CHECK(mcast_context_leak_report(zero, small, sizeof small) == 0);
  CHECK(small[0] == '\0');
  CHECK(mcast_last_error()[0] != '\0');
}

int main(void) {
  mcast_config_t config;
  mcast_context_t ctx = {0};
  const int mc_devices[RANKS] = {0, 1, 2, 3}, p2p_devices[2] = {2, 2};
  mcast_team_t mc = {0}, p2p = {0};
  mcast_buffer_t buf = {0}, pbuf = {0}, zero_buf = {0};
  mcast_live_counts_t counts;
  void *ptr = NULL;
  char report[4096];
  int r;

  mcast_config_init(&config);
  config.backend = MCAST_BACKEND_SIM;
  config.sim_devices = RANKS;
  CHECK_OK(mcast_context_create(&config, &ctx));
  counts = live_counts(ctx);
  CHECK(counts.teams == 0 && counts.buffers == 0 && counts.device_bytes == 0);
  CHECK(mcast_context_leak_report(ctx, report, sizeof report) == 0 && report[0] == '\0');

  CHECK_OK(mcast_team_create(ctx, mc_devices, RANKS, &mc));
  counts = live_counts(ctx);
  CHECK(counts.teams == 1 && counts.buffers == 0);
  CHECK(counts.multicast_objects >= 1 && counts.physical_allocations >= RANKS);
  CHECK(counts.device_bytes > 0 && counts.mappings > 0 && counts.reservations > 0);

  /* Multicast team: the round trip, a multicast pointer on every rank. */
  CHECK_OK(mcast_buffer_alloc(mc, SIZE, &buf));
  counts = live_counts(ctx);
  CHECK(counts.buffers == 1);
  check_round_trip(buf, RANKS);
  for (r = 0; r < RANKS; r++) {
    ptr = NULL;
    CHECK_OK(mcast_buffer_multicast_ptr(buf, r, &ptr));
    CHECK(ptr != NULL);
  }
  CHECK_STATUS(mcast_buffer_multicast_ptr(buf, RANKS, &ptr), MCAST_ERROR_INVALID_ARGUMENT);
  check_bad_arguments(buf, RANKS);

  /* P2P team (one device twice): the same round trip, no multicast pointer. */
  CHECK_OK(mcast_team_create(ctx, p2p_devices, 2, &p2p));
  CHECK_OK(mcast_buffer_alloc(p2p, SIZE, &pbuf));
  check_round_trip(pbuf, 2);
  check_bad_arguments(pbuf, 2);
  ptr = (void *)&ptr;
  CHECK_STATUS(mcast_buffer_multicast_ptr(pbuf, 0, &ptr), MCAST_ERROR_NOT_SUPPORTED);
  CHECK(strstr(mcast_last_error(), "mcast_buffer_multicast_ptr") != NULL);
  CHECK(ptr == (void *)&ptr);
  counts = live_counts(ctx);
  CHECK(counts.teams == 2 && counts.buffers == 2);

  check_leak_report(ctx);

  /* Zero bytes, a NULL out. */
  zero_buf.id = 0x31u;
  CHECK_STATUS(mcast_buffer_alloc(mc, 0, &zero_buf), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(zero_buf.id == 0x31u);
  CHECK_STATUS(mcast_buffer_alloc(mc, 64, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK(live_counts(ctx).buffers == 2);

  /* Free; double free and use after free are INVALID_HANDLE; the zero handle frees nothing. */
  CHECK_OK(mcast_buffer_free(buf));
  CHECK_STATUS(mcast_buffer_free(buf), MCAST_ERROR_INVALID_HANDLE);
  CHECK(strstr(mcast_last_error(), "mcast_buffer_free") != NULL);
  CHECK_STATUS(mcast_buffer_local_ptr(buf, 0, &ptr), MCAST_ERROR_INVALID_HANDLE);
  CHECK_STATUS(mcast_buffer_write(buf, 0, 0, report, 1), MCAST_ERROR_INVALID_HANDLE);
  zero_buf.id = 0;
  CHECK_OK(mcast_buffer_free(zero_buf));
  CHECK_STATUS(mcast_buffer_local_ptr(zero_buf, 0, &ptr), MCAST_ERROR_INVALID_HANDLE);
  CHECK(live_counts(ctx).buffers == 1);
  CHECK_OK(mcast_buffer_free(pbuf));
  CHECK_STATUS(mcast_buffer_free(pbuf), MCAST_ERROR_INVALID_HANDLE);
  counts = live_counts(ctx);
  CHECK(counts.teams == 2 && counts.buffers == 0);

  CHECK_OK(mcast_team_destroy(mc));
  CHECK_OK(mcast_team_destroy(p2p));
  counts = live_counts(ctx);
  CHECK(counts.teams == 0 && counts.buffers == 0);
  CHECK(counts.multicast_objects == 0 && counts.physical_allocations == 0);
  CHECK(counts.mappings == 0 && counts.reservations == 0 && counts.device_bytes == 0);
  memset(report, 'x', sizeof report);
  CHECK(mcast_context_leak_report(ctx, report, sizeof report) == 0 && report[0] == '\0');

  CHECK_STATUS(mcast_context_live_counts(ctx, NULL), MCAST_ERROR_INVALID_ARGUMENT);
  counts.struct_size = 0;
  CHECK_STATUS(mcast_context_live_counts(ctx, &counts), MCAST_ERROR_INVALID_ARGUMENT);
  CHECK_OK(mcast_context_destroy(ctx));
  counts.struct_size = sizeof counts;
  CHECK_STATUS(mcast_context_live_counts(ctx, &counts), MCAST_ERROR_INVALID_HANDLE);
  return 0;
}
