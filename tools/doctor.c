// `nofrag doctor`: will nofrag work on this machine, and if not, why and what
// to do. Each check runs the real thing where it can (a pool on the host
// backend; on each GPU a pool of the library's CUDA backend, a block spanning
// granules written and read back through the driver, a spill to host
// granules at the same address) rather than guessing from versions, and asks
// the driver only what those runs cannot show (VMM support, IPC handles,
// peer paths). Exit 0: nothing failed; 1: a check failed; 2: usage.
//
// The driver is loaded at run time, as the library loads it; without one the
// CUDA checks fail with the reason and the host backend's checks still run.
#include "cli.h"
#include "json.h"
#include "nofrag.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

typedef enum { DR_OK, DR_INFO, DR_WARN, DR_FAIL } dr_level;
static const char *const dr_names[] = {"ok", "info", "warn", "fail"};

typedef struct {
  char name[24];
  dr_level level;
  char detail[2048]; // a NOFRAG_CONF echoed whole (paths of up to PATH_MAX)
  char hint[400];
} dr_check;

typedef struct {
  dr_check v[64];
  size_t n;
} dr_report;

static void dr_add(dr_report *r, const char *name, dr_level level, const char *hint, const char *fmt, ...) {
  if (r->n == sizeof r->v / sizeof r->v[0]) return;
  dr_check *c = &r->v[r->n++];
  snprintf(c->name, sizeof c->name, "%s", name);
  c->level = level;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->detail, sizeof c->detail, fmt, ap);
  va_end(ap);
  snprintf(c->hint, sizeof c->hint, "%s", hint ? hint : "");
}

// The driver entry points the doctor calls itself (the library loads its own).
typedef int cu_res;
typedef struct {
  cu_res (*Init)(unsigned);
  cu_res (*DriverGetVersion)(int *);
  cu_res (*DeviceGetCount)(int *);
  cu_res (*DeviceGet)(int *, int);
  cu_res (*DeviceGetName)(char *, int, int);
  cu_res (*DeviceTotalMem)(size_t *, int);
  cu_res (*DeviceGetAttribute)(int *, int, int);
  cu_res (*DeviceCanAccessPeer)(int *, int, int);
  cu_res (*PrimaryCtxRetain)(void **, int);
  cu_res (*PrimaryCtxRelease)(int);
  cu_res (*CtxSetCurrent)(void *);
  cu_res (*MemsetD32)(unsigned long long, unsigned, size_t);
  cu_res (*MemcpyDtoH)(void *, unsigned long long, size_t);
  cu_res (*GetErrorName)(cu_res, const char **);
} dr_cu;

enum { // CUdevice_attribute values (cuda.h)
  ATTR_CC_MAJOR = 75, ATTR_CC_MINOR = 76, ATTR_VMM = 102, ATTR_POSIX_FD = 103, ATTR_HOST_VMM = 145,
};

static const char *cu_err(const dr_cu *cu, cu_res r) {
  const char *s = NULL;
  if (!cu->GetErrorName || cu->GetErrorName(r, &s) != 0 || !s) s = "CUDA_ERROR_UNKNOWN";
  return s;
}

// Loads the entry points; NULL (and the reason in why) without a driver.
static dr_cu *cu_open(dr_cu *cu, char *why, size_t n) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL); // never closed, as the library's
  if (!lib) {
    const char *e = dlerror();
    snprintf(why, n, "libcuda.so.1 not found: no NVIDIA driver on this machine (%s)", e ? e : "dlopen failed");
    return NULL;
  }
  const nfc_sym syms[] = {
      {&cu->Init, "cuInit"},
      {&cu->DriverGetVersion, "cuDriverGetVersion"},
      {&cu->DeviceGetCount, "cuDeviceGetCount"},
      {&cu->DeviceGet, "cuDeviceGet"},
      {&cu->DeviceGetName, "cuDeviceGetName"},
      {&cu->DeviceTotalMem, "cuDeviceTotalMem_v2"},
      {&cu->DeviceGetAttribute, "cuDeviceGetAttribute"},
      {&cu->DeviceCanAccessPeer, "cuDeviceCanAccessPeer"},
      {&cu->PrimaryCtxRetain, "cuDevicePrimaryCtxRetain"},
      {&cu->PrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
      {&cu->CtxSetCurrent, "cuCtxSetCurrent"},
      {&cu->MemsetD32, "cuMemsetD32_v2"},
      {&cu->MemcpyDtoH, "cuMemcpyDtoH_v2"},
      {&cu->GetErrorName, "cuGetErrorName"},
  };
  const char *missing = nfc_dlsyms(lib, syms, sizeof syms / sizeof syms[0]);
  if (missing) {
    snprintf(why, n, "libcuda.so.1 lacks %s: the NVIDIA driver is too old", missing);
    return NULL;
  }
  return cu;
}

// A pool from `conf`: a block of `size` bytes (not a multiple of the
// granule: it runs into partly used granules), filled word by word through
// the driver and read back, freed, the pool checked. 0, or -1 with the reason.
static int round_trip(const dr_cu *cu, const char *conf, size_t size, nf_stats_t *st, char *why, size_t n) {
  nf_pool_t *p = NULL;
  if (nf_pool_create_from_string(&p, conf) != NF_OK) {
    snprintf(why, n, "pool '%s': %s", conf, nf_last_error());
    return -1;
  }
  int rc = -1;
  void *a = nf_alloc(p, size, NULL);
  uint32_t *back = malloc(size);
  cu_res r = 0;
  if (!a) {
    snprintf(why, n, "nf_alloc(%zu B): %s", size, nf_last_error());
  } else if (!back) {
    snprintf(why, n, "out of host memory");
  } else if ((r = cu->MemsetD32((unsigned long long)(uintptr_t)a, 0x6e6f6672u, size / 4)) != 0 ||
             (r = cu->MemcpyDtoH(back, (unsigned long long)(uintptr_t)a, size)) != 0) {
    snprintf(why, n, "writing / reading the block through the driver: %s", cu_err(cu, r));
  } else {
    size_t bad = 0;
    for (size_t i = 0; i < size / 4; i++) bad += back[i] != 0x6e6f6672u;
    if (bad) snprintf(why, n, "%zu of %zu words read back wrong", bad, size / 4);
    else rc = 0;
  }
  free(back);
  nf_stats_get(p, st); // with the block live: what it took (spilled bytes)
  if (a && nf_free(p, a) != NF_OK && rc == 0) {
    snprintf(why, n, "nf_free: %s", nf_last_error());
    rc = -1;
  }
  if (nf_pool_check(p) != NF_OK && rc == 0) {
    snprintf(why, n, "nf_pool_check: %s", nf_last_error());
    rc = -1;
  }
  nf_pool_destroy(p);
  return rc;
}

static void check_library(dr_report *r) {
  nf_pool_t *p = NULL;
  if (nf_pool_create_from_string(&p, "backend:host,limit:64MiB") != NF_OK) {
    dr_add(r, "library", DR_FAIL, "the host backend needs memfd_create and mmap (Linux >= 3.17)",
           "nofrag %s: a host pool could not be made: %s", NF_VERSION, nf_last_error());
    return;
  }
  // Stitching, the library's core: the free granules of a fragmented pool
  // serve a request larger than any free range.
  void *b[8] = {0};
  int ok = 1;
  for (int i = 0; i < 8 && ok; i++) ok = (b[i] = nf_alloc(p, 8u << 20, NULL)) != NULL;
  for (int i = 0; ok && i < 8; i += 2) ok = nf_free(p, b[i]) == NF_OK && (b[i] = NULL) == NULL;
  void *big = ok ? nf_alloc(p, 32u << 20, NULL) : NULL;
  ok = ok && big && nf_pool_check(p) == NF_OK;
  char msg[512];
  snprintf(msg, sizeof msg, "%s", ok ? "" : nf_last_error());
  nf_pool_destroy(p);
  if (ok)
    dr_add(r, "library", DR_OK, NULL,
           "nofrag %s; host backend: 32 MiB served from 4 free 8 MiB ranges under a 64 MiB limit (stitching)",
           NF_VERSION);
  else
    dr_add(r, "library", DR_FAIL, "run the test suite (scripts/test.sh) and report the test that fails",
           "nofrag %s: the host backend's self-test failed: %s", NF_VERSION, msg);
}

static void check_config(dr_report *r) {
  const char *env = getenv("NOFRAG_CONF");
  if (!env || !*env) {
    dr_add(r, "config", DR_INFO, NULL, "NOFRAG_CONF unset: defaults (docs/configuration.md)");
    return;
  }
  nf_config_t c;
  char err[1024] = "", out[1536] = "";
  nf_config_default(&c);
  if (nf_config_parse(&c, env, err, sizeof err) != NF_OK) {
    dr_add(r, "config", DR_FAIL, "fix NOFRAG_CONF (keys: docs/configuration.md)", "NOFRAG_CONF='%s': %s", env, err);
    return;
  }
  nf_config_format(&c, out, sizeof out);
  dr_add(r, "config", DR_OK, NULL, "NOFRAG_CONF parses: %s", out);
}

static void check_os(dr_report *r, const char *monitor) {
  const char *dir = getenv("NOFRAG_SHM_DIR");
  if (!dir || !*dir) dir = "/dev/shm";
  if (access(dir, W_OK | X_OK) != 0)
    dr_add(r, "monitor", DR_WARN, "set NOFRAG_SHM_DIR to a writable tmpfs directory",
           "%s is not writable: `nofrag top` will not see this machine's pools", dir);
  else
    dr_add(r, "monitor", DR_OK, NULL, "pools publish to %s (`nofrag top`)%s", dir,
           monitor && strcmp(monitor, "0") == 0 ? "; NOFRAG_MONITOR=0 turns it off here" : "");
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    unsigned long long soft = rl.rlim_cur == RLIM_INFINITY ? ~0ull : (unsigned long long)rl.rlim_cur;
    dr_add(r, "open files", soft < 4096 ? DR_WARN : DR_OK, soft < 4096 ? "ulimit -n 65536" : NULL,
           "soft limit %llu: CUDA IPC (torch.multiprocessing) keeps one fd per shared 2 MiB granule", soft);
  }
  FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
  int scope = -1;
  if (f) {
    if (fscanf(f, "%d", &scope) != 1) scope = -1;
    fclose(f);
  }
  if (scope <= 0)
    dr_add(r, "ipc", DR_OK, NULL, "a process may fetch another's shared blocks (pidfd_getfd; %s)",
           scope == 0 ? "kernel.yama.ptrace_scope=0" : "no Yama ptrace restriction");
  else
    dr_add(r, "ipc", scope == 1 ? DR_INFO : DR_WARN, "sysctl kernel.yama.ptrace_scope=0, or CAP_SYS_PTRACE",
           "kernel.yama.ptrace_scope=%d: %s", scope,
           scope == 1 ? "only a parent may receive a child's shared CUDA blocks (torch.multiprocessing)"
                      : "no process may receive another's shared CUDA blocks");
}

// One GPU: what the driver says it supports, then the library's backend
// doing the real thing.
static void check_device(dr_report *r, const dr_cu *cu, int ord) {
  char name[24], dn[128] = "?";
  snprintf(name, sizeof name, "cuda:%d", ord);
  int dev = 0, vmm = 0, fd = 0, hvmm = 0, ma = 0, mi = 0;
  size_t total = 0;
  cu_res e = cu->DeviceGet(&dev, ord);
  if (e != 0) {
    dr_add(r, name, DR_FAIL, NULL, "cuDeviceGet: %s", cu_err(cu, e));
    return;
  }
  (void)cu->DeviceGetName(dn, sizeof dn, dev);
  (void)cu->DeviceTotalMem(&total, dev);
  (void)cu->DeviceGetAttribute(&ma, ATTR_CC_MAJOR, dev);
  (void)cu->DeviceGetAttribute(&mi, ATTR_CC_MINOR, dev);
  if (cu->DeviceGetAttribute(&vmm, ATTR_VMM, dev) != 0) vmm = 0;
  if (cu->DeviceGetAttribute(&fd, ATTR_POSIX_FD, dev) != 0) fd = 0;
  if (cu->DeviceGetAttribute(&hvmm, ATTR_HOST_VMM, dev) != 0) hvmm = 0;
  char tb[32];
  nf_format_bytes(tb, sizeof tb, total);
  if (!vmm) {
    dr_add(r, name, DR_FAIL, "PyTorch's native allocator is the alternative on this device",
           "%s (sm_%d%d, %s): no virtual memory management (cuMemMap): nofrag's CUDA backend cannot run", dn, ma,
           mi, tb);
    return;
  }
  char conf[96], why[512], sub[32]; // sub: the name of a check of this device's ("cuda:0 spill")
  nf_stats_t st;
  snprintf(conf, sizeof conf, "backend:cuda,device:%d,limit:64MiB", ord);
  void *ctx = NULL;
  if ((e = cu->PrimaryCtxRetain(&ctx, dev)) != 0 || (e = cu->CtxSetCurrent(ctx)) != 0) {
    dr_add(r, name, DR_FAIL, NULL, "%s: its primary context: %s", dn, cu_err(cu, e));
    return;
  }
  if (round_trip(cu, conf, (5u << 20) + 4096, &st, why, sizeof why) != 0) {
    dr_add(r, name, DR_FAIL, NULL, "%s (sm_%d%d, %s): the CUDA backend failed: %s", dn, ma, mi, tb, why);
  } else {
    char g[32];
    nf_format_bytes(g, sizeof g, st.granule);
    dr_add(r, name, DR_OK, NULL, "%s (sm_%d%d, %s): a block over 3 granules of %s mapped, written, read back", dn,
           ma, mi, tb, g);
    // spill:host: host granules at the same address (a device limit of two
    // granules; the block needs three).
    snprintf(conf, sizeof conf, "backend:cuda,device:%d,limit:%llu,spill:host,spill_limit:64MiB", ord,
             (unsigned long long)st.granule * 2);
    snprintf(sub, sizeof sub, "%s spill", name);
    if (!hvmm)
      dr_add(r, sub, DR_WARN, "offload to disk still works (nf_offload tier disk)",
             "no host memory through the VMM API on this device/driver: spill:host and host offload unavailable");
    else if (round_trip(cu, conf, (size_t)st.granule * 3, &st, why, sizeof why) != 0)
      dr_add(r, sub, DR_WARN, NULL, "spill:host failed: %s", why);
    else
      dr_add(r, sub, st.spilled ? DR_OK : DR_WARN, NULL, "%s: a block past the device limit, %llu B of it on pinned host memory, read back",
             st.spilled ? "spill:host works" : "spill:host made no host granule", (unsigned long long)st.spilled);
  }
  snprintf(sub, sizeof sub, "%s ipc", name);
  dr_add(r, sub, fd ? DR_OK : DR_WARN, fd ? NULL : "share tensors by copying them instead",
         fd ? "POSIX fd handles: torch.multiprocessing can share nofrag blocks"
            : "no POSIX fd handles: torch.multiprocessing cannot share nofrag blocks on this device");
  (void)cu->CtxSetCurrent(NULL);
  (void)cu->PrimaryCtxRelease(dev);
}

static void check_cuda(dr_report *r, int only) {
  dr_cu cu_ = {0}, *cu;
  char why[300];
  const char *host_only = "nofrag runs on the host backend only (backend:host; the replay and the tests need no GPU)";
  if (!(cu = cu_open(&cu_, why, sizeof why))) {
    dr_add(r, "driver", DR_FAIL, host_only, "%s", why);
    return;
  }
  int ver = 0, n = 0;
  cu_res e = cu->Init(0);
  if (e == 0) e = cu->DriverGetVersion(&ver);
  if (e == 0) e = cu->DeviceGetCount(&n);
  if (e != 0 || n == 0) {
    dr_add(r, "driver", DR_FAIL, host_only, "cuInit / cuDeviceGetCount: %s", e ? cu_err(cu, e) : "no CUDA device");
    return;
  }
  dr_add(r, "driver", ver < 12000 ? DR_WARN : DR_OK, ver < 12000 ? "nofrag is tested on CUDA 12.x and 13.x drivers" : NULL,
         "CUDA driver API %d.%d, %d device(s)", ver / 1000, ver % 1000 / 10, n);
  if (only >= n) {
    dr_add(r, "driver", DR_FAIL, NULL, "--device %d: the driver sees %d device(s)", only, n);
    return;
  }
  for (int d = 0; d < n; d++)
    if (only < 0 || only == d) check_device(r, cu, d);
  if (n < 2 || only >= 0) return;
  char pairs[300] = "", none[300] = "";
  for (int a = 0; a < n; a++)
    for (int b = 0; b < n; b++) {
      int can = 0, da = 0, db = 0;
      if (a == b || cu->DeviceGet(&da, a) || cu->DeviceGet(&db, b) || cu->DeviceCanAccessPeer(&can, da, db)) continue;
      char *dst = can ? pairs : none;
      size_t l = strlen(dst);
      snprintf(dst + l, sizeof pairs - l, "%s%d->%d", l ? " " : "", a, b);
    }
  const char *hint = "nf_pool_add_peer refuses those pairs: copy through the host";
  if (!*none) dr_add(r, "peers", DR_OK, NULL, "peer access: %s", pairs);
  else if (!*pairs) dr_add(r, "peers", DR_WARN, hint, "no peer access: %s", none);
  else dr_add(r, "peers", DR_WARN, hint, "peer access: %s; none for: %s", pairs, none);
}

static void print_text(const dr_report *r) {
  printf("nofrag doctor (nofrag %s)\n", NF_VERSION);
  for (size_t i = 0; i < r->n; i++) {
    const dr_check *c = &r->v[i];
    printf("  %-4s  %-14s %s\n", dr_names[c->level], c->name, c->detail);
    if (*c->hint) printf("        %-14s -> %s\n", "", c->hint);
  }
}

static void print_json(const dr_report *r, int failed) {
  printf("{\"version\": ");
  nfc_json_str(stdout, NF_VERSION);
  printf(", \"failed\": %d, \"checks\": [", failed);
  for (size_t i = 0; i < r->n; i++) {
    const dr_check *c = &r->v[i];
    printf("%s{\"name\": ", i ? ", " : "");
    nfc_json_str(stdout, c->name);
    printf(", \"status\": \"%s\", \"detail\": ", dr_names[c->level]);
    nfc_json_str(stdout, c->detail);
    printf(", \"hint\": ");
    nfc_json_str(stdout, c->hint);
    printf("}");
  }
  printf("]}\n");
}

static const char doctor_usage[] =
    "usage: nofrag doctor [--json] [--device N]\n"
    "Check that nofrag works on this machine: the library on the host backend, NOFRAG_CONF, the\n"
    "monitor's directory, IPC limits, the NVIDIA driver, and on each GPU (or GPU N) a pool of the\n"
    "CUDA backend with a block written and read back through the driver and a spill to host memory.\n"
    "Exit status: 0 nothing failed, 1 a check failed, 2 usage error.\n";

int nfc_doctor(int argc, char **argv) {
  int json = 0, only = -1;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) {
      json = 1;
    } else if (strcmp(argv[i], "--device") == 0 && i + 1 == argc) {
      fprintf(stderr, "nofrag doctor: --device needs a value (a GPU ordinal)\n%s", doctor_usage);
      return 2;
    } else if (strcmp(argv[i], "--device") == 0) {
      char *end = NULL;
      long v = strtol(argv[++i], &end, 10);
      if (!*argv[i] || *end || v < 0 || v > 1023) {
        fprintf(stderr, "nofrag doctor: --device '%s': a GPU ordinal 0..1023\n", argv[i]);
        return 2;
      }
      only = (int)v;
    } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(doctor_usage, stdout);
      return 0;
    } else {
      fprintf(stderr, "nofrag doctor: unknown option '%s'\n%s", argv[i], doctor_usage);
      return 2;
    }
  }
  static dr_report r; // 64 checks of ~2.5 KiB: off the stack
  r.n = 0;
  // The doctor's own pools stay out of `nofrag top`.
  const char *mon = getenv("NOFRAG_MONITOR");
  char monitor[8] = "";
  if (mon) snprintf(monitor, sizeof monitor, "%s", mon);
  setenv("NOFRAG_MONITOR", "0", 1);
  check_library(&r);
  check_config(&r);
  check_os(&r, mon ? monitor : NULL);
  check_cuda(&r, only);
  int failed = 0;
  for (size_t i = 0; i < r.n; i++) failed += r.v[i].level == DR_FAIL;
  if (json) print_json(&r, failed);
  else {
    print_text(&r);
    printf(failed ? "%d check(s) failed.\n" : "Nothing failed.\n", failed);
  }
  return failed ? 1 : 0;
}
