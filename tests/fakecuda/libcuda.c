/* A stand-in for the CUDA driver (libcuda.so.1), for tests and measurements on
 * machines without a GPU: every call succeeds and does nothing, except that it
 * hands out handles, counts library loads, unloads and launches, records the last
 * launch (the entry point, its configuration and the bytes of each parameter, for a
 * layout the test sets with fake_set_layout), and refuses a launch whose grid is
 * REFUSED_GRID_X wide (CUDA_ERROR_INVALID_VALUE). cuda.bindings finds its functions
 * through cuGetProcAddress_v2; any function not listed here answers CUDA_SUCCESS. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef int CUresult;

typedef struct {
  unsigned grid[3], block[3], shmem;
  void *stream;
  void *attrs;
  unsigned nattrs;
} launch_config; /* CUlaunchConfig */

static __thread void *current_ctx;
static uintptr_t next_handle = 0x10000;
static long loads, unloads, launches;
static int layout_n;
static unsigned layout_size[64];
static unsigned char last_params[64][32];
static launch_config last_config;
static void *last_function;
static int last_entry; /* 1: cuLaunchKernel, 2: cuLaunchKernelEx */

#define REFUSED_GRID_X 77777
#define CUDA_ERROR_INVALID_VALUE 1

static CUresult ok(void) { return 0; }
static CUresult handle_out(void **p) {
  next_handle += 0x100;
  *p = (void *)next_handle;
  return 0;
}

CUresult cuInit(unsigned flags) { return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGet(int *d, int ordinal) { *d = 0; return 0; }
CUresult cuDeviceGetName(char *s, int len, int d) { strncpy(s, "fake", (size_t)len); return 0; }
CUresult cuDeviceTotalMem(size_t *bytes, int d) { *bytes = (size_t)1 << 34; return 0; }
CUresult cuDeviceGetUuid(unsigned char *uuid, int d) { memset(uuid, 0, 16); return 0; }
CUresult cuDeviceGetAttribute(int *value, int attribute, int d) {
  switch (attribute) {
    case 75: *value = 9; break;           /* compute capability major */
    case 76: *value = 0; break;           /* minor */
    case 16: *value = 132; break;         /* multiprocessors */
    case 10: *value = 32; break;          /* warp size */
    case 1: case 2: *value = 1024; break; /* threads per block, block dim x */
    case 3: *value = 64; break;           /* block dim z */
    case 4: *value = 2147483647; break;   /* grid dim x */
    case 5: case 6: *value = 65535; break;
    default: *value = 1;
  }
  return 0;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, int d) { *ctx = (void *)0x1000; return 0; }
CUresult cuDevicePrimaryCtxGetState(int d, unsigned *flags, int *active) { *flags = 0; *active = 1; return 0; }
CUresult cuCtxGetCurrent(void **ctx) { *ctx = current_ctx; return 0; }
CUresult cuCtxSetCurrent(void *ctx) { current_ctx = ctx; return 0; }
CUresult cuCtxPushCurrent(void *ctx) { current_ctx = ctx; return 0; }
CUresult cuCtxPopCurrent(void **ctx) { if (ctx) *ctx = current_ctx; return 0; }
CUresult cuCtxGetDevice(int *d) { *d = 0; return 0; }
CUresult cuCtxGetId(void *ctx, unsigned long long *id) { *id = 1; return 0; }
CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return 0;
}
CUresult cuStreamCreate(void **s, unsigned flags) { return handle_out(s); }
CUresult cuStreamCreateWithPriority(void **s, unsigned flags, int priority) { return handle_out(s); }
CUresult cuStreamGetCtx(void *s, void **ctx) { *ctx = (void *)0x1000; return 0; }
CUresult cuStreamGetCtx_v2(void *s, void **ctx, void **green) {
  *ctx = (void *)0x1000;
  if (green) *green = 0;
  return 0;
}
CUresult cuStreamGetDevice(void *s, int *d) { *d = 0; return 0; }
CUresult cuStreamGetId(void *s, unsigned long long *id) { *id = (uintptr_t)s; return 0; }
CUresult cuStreamGetFlags(void *s, unsigned *flags) { *flags = 0; return 0; }
CUresult cuStreamGetPriority(void *s, int *priority) { *priority = 0; return 0; }
CUresult cuLibraryLoadData(void **lib, const void *code, void *a, void *b, unsigned n, void *c, void *d, unsigned m) {
  loads++;
  return handle_out(lib);
}
CUresult cuLibraryUnload(void *lib) { unloads++; return 0; }
CUresult cuLibraryGetKernel(void **kernel, void *lib, const char *name) { return handle_out(kernel); }
CUresult cuLibraryGetModule(void **module, void *lib) { return handle_out(module); }
CUresult cuKernelGetFunction(void **function, void *kernel) { return handle_out(function); }
CUresult cuKernelGetAttribute(int *value, int attribute, void *kernel, int d) { *value = 0; return 0; }
CUresult cuFuncGetAttribute(int *value, int attribute, void *function) { *value = 0; return 0; }
CUresult cuGetErrorString(int error, const char **s) { *s = "fake error"; return 0; }
CUresult cuGetErrorName(int error, const char **s) { *s = "CUDA_ERROR_FAKE"; return 0; }

static CUresult record(int entry, const launch_config *config, void *f, void **params) {
  if (config->grid[0] == REFUSED_GRID_X) return CUDA_ERROR_INVALID_VALUE;
  launches++;
  last_entry = entry;
  last_config = *config;
  last_function = f;
  for (int i = 0; i < layout_n; i++) memcpy(last_params[i], params[i], layout_size[i]);
  return 0;
}
CUresult cuLaunchKernelEx(const launch_config *config, void *f, void **params, void **extra) {
  return record(2, config, f, params);
}
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, void *stream, void **params, void **extra) {
  launch_config config = {{gx, gy, gz}, {bx, by, bz}, shmem, stream, 0, 0};
  return record(1, &config, f, params);
}

/* For the test: what the driver saw. */
void fake_set_layout(int n, const unsigned *sizes) {
  layout_n = n;
  for (int i = 0; i < n; i++) layout_size[i] = sizes[i];
}
void fake_counts(long *out) { out[0] = loads; out[1] = unloads; out[2] = launches; }
void *fake_last_function(void) { return last_function; }
int fake_last_entry(void) { return last_entry; }
const launch_config *fake_last_config(void) { return &last_config; }
const unsigned char *fake_last_param(int i) { return last_params[i]; }

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status);

#define ENTRY(name) {#name, (void *)name}
static const struct {
  const char *name;
  void *fn;
} table[] = {
    ENTRY(cuInit), ENTRY(cuDriverGetVersion), ENTRY(cuDeviceGetCount), ENTRY(cuDeviceGet),
    ENTRY(cuDeviceGetName), ENTRY(cuDeviceTotalMem), ENTRY(cuDeviceGetUuid), ENTRY(cuDeviceGetAttribute),
    ENTRY(cuDevicePrimaryCtxRetain), ENTRY(cuDevicePrimaryCtxGetState), ENTRY(cuCtxGetCurrent),
    ENTRY(cuCtxSetCurrent), ENTRY(cuCtxPushCurrent), ENTRY(cuCtxPopCurrent), ENTRY(cuCtxGetDevice),
    ENTRY(cuCtxGetId), ENTRY(cuCtxGetStreamPriorityRange), ENTRY(cuStreamCreate), ENTRY(cuStreamCreateWithPriority),
    ENTRY(cuStreamGetDevice), ENTRY(cuStreamGetId), ENTRY(cuStreamGetFlags), ENTRY(cuStreamGetPriority),
    ENTRY(cuLibraryLoadData), ENTRY(cuLibraryUnload), ENTRY(cuLibraryGetKernel), ENTRY(cuLibraryGetModule),
    ENTRY(cuKernelGetFunction), ENTRY(cuKernelGetAttribute), ENTRY(cuFuncGetAttribute), ENTRY(cuGetErrorString),
    ENTRY(cuGetErrorName), ENTRY(cuLaunchKernelEx), ENTRY(cuLaunchKernel),
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
  if (status) *status = 0;
  if (!strcmp(symbol, "cuGetProcAddress")) {
    *pfn = (void *)cuGetProcAddress_v2;
    return 0;
  }
  if (!strcmp(symbol, "cuStreamGetCtx")) {
    *pfn = version >= 12050 ? (void *)cuStreamGetCtx_v2 : (void *)cuStreamGetCtx;
    return 0;
  }
  for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
    if (!strcmp(symbol, table[i].name)) {
      *pfn = table[i].fn;
      return 0;
    }
  }
  *pfn = (void *)ok;
  return 0;
}
