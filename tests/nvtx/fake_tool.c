/* A stand-in for an NVTX tool's injection library (what Nsight Systems names in
 * NVTX_INJECTION64_PATH), for tests/nvtx.rs. It attaches through the NVTX v3 protocol as a tool
 * does: InitializeInjectionNvtx2 gets the export table of callbacks, asks for the CORE and CORE2
 * modules' function tables and writes its functions into their slots. Every call is appended
 * as one line to the file named by FAKE_NVTX_LOG:
 *   init <CORE size> <CORE2 size> <NVTX version>
 *   create <domain name>
 *   push <domain name or -> <message>     (or "bad-attributes ..." for a malformed struct)
 *   pop <domain name or ->
 * FAKE_NVTX_MODE: "domain" (default: both modules), "core" (only nvtxRangePushA/nvtxRangePop),
 * "fail" (InitializeInjectionNvtx2 returns 0). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*fn_t)(void);
typedef const void *(*get_export_table_t)(uint32_t);
typedef struct {
  size_t struct_size;
  int (*get_module_function_table)(int module, fn_t ***table, unsigned *size);
} callbacks_t;
typedef struct {
  size_t struct_size;
  uint32_t version;
  uint32_t reserved0;
  void (*set_injection_nvtx_version)(uint32_t);
} version_info_t;
typedef struct {
  uint16_t version, size;
  uint32_t category;
  int32_t color_type;
  uint32_t color;
  int32_t payload_type, reserved0;
  uint64_t payload;
  int32_t message_type;
  const char *message;
} attributes_t;

static FILE *out;
static char domain_name[64] = "?";

static void record(const char *fmt, const char *a, const char *b) {
  if (!out) return;
  fprintf(out, fmt, a, b);
  fflush(out);
}

static void *domain_create_a(const char *name) {
  snprintf(domain_name, sizeof domain_name, "%s", name);
  record("create %s%s\n", name, "");
  return domain_name;
}
static int domain_range_push_ex(void *domain, const attributes_t *a) {
  const char *d = domain ? (const char *)domain : "-";
  if (!a || a->version != 3 || a->size != sizeof(attributes_t) || a->message_type != 1 || !a->message)
    record("bad-attributes %s%s\n", d, "");
  else
    record("push %s %s\n", d, a->message);
  return 0;
}
static int domain_range_pop(void *domain) {
  record("pop %s%s\n", domain ? (const char *)domain : "-", "");
  return 0;
}
static int range_push_a(const char *message) {
  record("push - %s%s\n", message, "");
  return 0;
}
static int range_pop(void) {
  record("pop -%s%s\n", "", "");
  return 0;
}

int InitializeInjectionNvtx2(get_export_table_t get) {
  const char *path = getenv("FAKE_NVTX_LOG"), *mode = getenv("FAKE_NVTX_MODE");
  if (!mode) mode = "domain";
  out = path ? fopen(path, "a") : NULL;
  const callbacks_t *cb = (const callbacks_t *)get(1);
  const version_info_t *vi = (const version_info_t *)get(3);
  if (!cb || cb->struct_size < sizeof *cb || !vi || vi->struct_size < sizeof *vi) return 0;
  vi->set_injection_nvtx_version(3);
  fn_t **core = NULL, **core2 = NULL;
  unsigned ncore = 0, ncore2 = 0;
  if (!cb->get_module_function_table(1, &core, &ncore) || !cb->get_module_function_table(5, &core2, &ncore2))
    return 0;
  char sizes[64];
  snprintf(sizes, sizeof sizes, "%u %u %u", ncore, ncore2, (unsigned)vi->version);
  record("init %s%s\n", sizes, "");
  if (strcmp(mode, "fail") == 0) return 0;
  if (ncore < 16 || ncore2 < 16 || core[0] || core2[0] || core[ncore] || core2[ncore2]) return 0;
  *core[9] = (fn_t)range_push_a;
  *core[11] = (fn_t)range_pop;
  if (strcmp(mode, "domain") == 0) {
    *core2[4] = (fn_t)domain_range_push_ex;
    *core2[5] = (fn_t)domain_range_pop;
    *core2[12] = (fn_t)domain_create_a;
  }
  return 1;
}
