// PyTorch plug-in: C entry points for torch.cuda.memory.CUDAPluggableAllocator
// (PyTorch 2.11) and small helpers the Python package (python/nofrag) calls
// through ctypes.
//
// PyTorch's side (torch/csrc/cuda/CUDAPluggableAllocator.cpp, 2.11):
//   alloc_fn   void*(size_t size, int device, cudaStream_t stream)
//   free_fn    void (void* ptr, size_t size, int device, cudaStream_t stream)
//              (size/device/stream are those of the alloc call)
//   init_fn    void(int device_count)          lazy CUDA init
//   reset_fn   void()                          torch.cuda.empty_cache()
//   memory_fraction_fn void(double, int)       set_per_process_memory_fraction
//   record_stream_fn   void(void*, cudaStream_t)  Tensor.record_stream
// The optional hooks are set from Python with
// CUDAPluggableAllocator(...).allocator().set_reset_fn(<address>) etc.
//
// PyTorch does not check alloc_fn's result: a NULL for a non-zero size becomes
// a tensor at address 0 and the next kernel faults (the CUDA context is then
// lost). So on failure we raise a C++ exception into PyTorch the way its own
// TORCH_CHECK does, by calling c10::detail::torchCheckFail (exported by
// libc10.so); Python sees a RuntimeError whose text starts with
// "CUDA out of memory". The exception unwinds through nf_torch_alloc's frame,
// which therefore must hold no lock and own nothing when it throws (x86-64
// and aarch64 GCC emit unwind tables for C by default). Set
// NOFRAG_TORCH_THROW=0 to return NULL instead.
//
// One pool per device, created on first use with the configuration from
// nf_torch_configure() or else the NOFRAG_CONF environment variable. Pools
// live until nf_torch_shutdown() (tests) or process exit.
#include "torch/torch.h"

#include "backend/backend.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NFT_MAX_DEVICES 64

typedef struct {
  _Atomic(nf_pool_t *) pool; // read lock-free on every alloc
  nf_backend_t *be;          // owned
  double fraction;           // last set_per_process_memory_fraction (0 = none)
  bool set;                  // a fraction was set (else get_fraction answers 1.0)
  atomic_int refuse;         // that fraction leaves less than one granule: every request fails (as PyTorch's)
  atomic_uint_fast64_t bytes_alloc, bytes_freed, allocs, frees, ooms;
  atomic_uint_fast64_t refused; // of ooms: refused by the memory fraction, the pool never asked
} nft_dev_t;

static nft_dev_t devs[NFT_MAX_DEVICES];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; // pool creation, config, errors
static char *g_conf;              // nf_torch_configure string (NULL: use NOFRAG_CONF)
static atomic_int g_pools;        // pools created (configure refuses once > 0)
static int g_device_count = -1;   // from init_fn
static char g_err[1024];          // last plug-in error (any thread), under g_mu
static _Thread_local char t_err[sizeof g_err]; // nf_torch_last_error's copy of g_err
static _Thread_local char t_own[sizeof g_err]; // this thread's own last plug-in error ("" : none yet)
static _Thread_local int t_status;    // nf_torch_last_status: this thread's last hook call

typedef void (*nft_throw_fn)(const char *func, const char *file, uint32_t line, const char *msg);
static _Atomic(nft_throw_fn) g_throw;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_verbose;
static atomic_int g_throw_enabled = 1;

// c10::detail::torchCheckFail(const char*, const char*, uint32_t, const char*)
#define NFT_TORCH_CHECK_FAIL "_ZN3c106detail14torchCheckFailEPKcS2_jS2_"

static void nft_init_once(void) {
  g_verbose = nf__env_on("NOFRAG_VERBOSE");
  const char *t = getenv("NOFRAG_TORCH_THROW");
  if (t && strcmp(t, "0") == 0) atomic_store(&g_throw_enabled, 0);
  // torch's libraries are loaded RTLD_LOCAL, so look in libc10.so by its
  // soname (RTLD_NOLOAD: only if it is already in the process).
  void *fn = dlsym(RTLD_DEFAULT, NFT_TORCH_CHECK_FAIL);
  if (!fn) {
    void *h = dlopen("libc10.so", RTLD_LAZY | RTLD_NOLOAD);
    if (h) fn = dlsym(h, NFT_TORCH_CHECK_FAIL); // handle kept: c10 stays loaded anyway
  }
  if (fn && !atomic_load(&g_throw)) atomic_store(&g_throw, (nft_throw_fn)fn);
}

static void nft_error(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
static void nft_error(const char *fmt, ...) {
  char buf[sizeof g_err];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  memcpy(t_own, buf, sizeof t_own);
  pthread_mutex_lock(&g_mu);
  memcpy(g_err, buf, sizeof g_err);
  pthread_mutex_unlock(&g_mu);
  if (g_verbose) fprintf(stderr, "nofrag: %s\n", buf);
}

// Every device's pool is built from one configuration string, and a recorder
// truncates its file: device 0 records to trace:PATH as given, device N to
// PATH with ".devN" before the extension (job.csv -> job.dev1.csv), so that
// devices do not overwrite each other's logs. False: the path gets too long.
static bool trace_per_device(char path[NF_TRACE_PATH_MAX], int device) {
  if (!path[0] || device == 0) return true;
  char tag[16], out[NF_TRACE_PATH_MAX];
  snprintf(tag, sizeof tag, ".dev%d", device);
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  const char *dot = strrchr(base, '.');
  size_t at = dot && dot != base ? (size_t)(dot - path) : strlen(path);
  int n = snprintf(out, sizeof out, "%.*s%s%s", (int)at, path, tag, path + at);
  if (n < 0 || (size_t)n >= sizeof out) return false;
  memcpy(path, out, (size_t)n + 1);
  return true;
}

// Create the pool for `device` (slow path, under g_mu). The backend is CUDA
// unless the configuration says backend:host (used by the CPU tests).
static nf_pool_t *nft_create_locked(int device) {
  nft_dev_t *d = &devs[device];
  nf_pool_t *pool = atomic_load(&d->pool);
  if (pool) return pool;
  nf_config_t cfg;
  nf_config_default(&cfg);
  cfg.backend = NF_BACKEND_CUDA; // the plug-in's default; a string may say host
  char err[768] = ""; // the unknown-key message lists every key
  const char *conf = g_conf ? g_conf : getenv("NOFRAG_CONF");
  if (conf && nf_config_parse(&cfg, conf, err, sizeof err) != NF_OK) {
    snprintf(g_err, sizeof g_err, "bad nofrag configuration '%s': %s", conf, err);
    return NULL;
  }
  cfg.device = device;
  if (!trace_per_device(cfg.trace, device)) {
    snprintf(g_err, sizeof g_err, "device %d: trace path '%s' is too long once '.dev%d' is added (%d bytes at most)",
             device, cfg.trace, device, NF_TRACE_PATH_MAX - 1);
    return NULL;
  }
  nf_backend_t *be = NULL;
  nf_status_t st = nf__backend_from_config(&be, &cfg, false); // unbound: PyTorch owns the current device
  if (st != NF_OK) {
    snprintf(g_err, sizeof g_err, "device %d: cannot create the %s backend: %s: %s", device,
             cfg.backend == NF_BACKEND_HOST ? "host" : "CUDA", nf_status_str(st), nf_last_error());
    return NULL;
  }
  st = nf_pool_create(&pool, be, &cfg);
  if (st != NF_OK) {
    snprintf(g_err, sizeof g_err, "device %d: cannot create the pool: %s: %s", device, nf_status_str(st),
             nf_last_error());
    nf_backend_destroy(be);
    return NULL;
  }
  d->be = be;
  atomic_fetch_add(&g_pools, 1);
  atomic_store(&d->pool, pool); // publish last: readers see a complete pool
  return pool;
}

static nf_pool_t *torch_pool_get(int device, int create) {
  if (device < 0 || device >= NFT_MAX_DEVICES) {
    nft_error("device %d out of range (0..%d)", device, NFT_MAX_DEVICES - 1);
    return NULL;
  }
  nf_pool_t *pool = atomic_load_explicit(&devs[device].pool, memory_order_acquire);
  if (pool || !create) return pool;
  pthread_once(&g_once, nft_init_once);
  pthread_mutex_lock(&g_mu);
  pool = nft_create_locked(device);
  if (!pool) memcpy(t_own, g_err, sizeof t_own); // this thread's error now
  pthread_mutex_unlock(&g_mu);
  if (!pool && g_verbose) fprintf(stderr, "nofrag: %s\n", g_err);
  return pool;
}

// Raise into PyTorch (see the header comment) or return NULL. Called with no
// lock held and nothing to clean up.
// Only NF_ERR_OOM reads as PyTorch's "CUDA out of memory": code that catches
// an OOM to retry smaller (cuDNN workspaces, batch-size finders) must not
// retry a driver failure or a bad configuration.
static void *nft_fail_alloc(size_t size, int device, nf_status_t st, const char *why) {
  char msg[1200], b[32];
  t_status = st;
  nf__fmt_bytes(b, sizeof b, size);
  if (st == NF_ERR_OOM)
    snprintf(msg, sizeof msg, "CUDA out of memory (nofrag). Tried to allocate %s on device %d: %s", b, device, why);
  else
    snprintf(msg, sizeof msg, "nofrag: allocating %s on device %d failed (not out of memory): %s", b, device, why);
  nft_error("%s", msg);
  nft_throw_fn thrower = atomic_load(&g_throw);
  if (atomic_load(&g_throw_enabled) && thrower) thrower("nf_torch_alloc", __FILE__, (uint32_t)__LINE__, msg);
  return NULL;
}

//! The plug-in's pool for `device`, or NULL if that device has not allocated
//! through nofrag yet (for nofrag.snapshot() and stats of the torch pools).
NF_API nf_pool_t *nf_torch_pool(int device) { return torch_pool_get(device, 0); }

NF_API nf_pool_t *nf_torch_pool_get(int device, int create) { return torch_pool_get(device, create); }

// Host placement for this thread (nf_torch_set_host_alloc): blocks of at
// least this many bytes are moved to host memory as soon as they are made
// (0: off). Used while an optimizer creates its state.
static _Thread_local size_t tl_host_min;

//! While `min_bytes` > 0, this thread's allocations of at least `min_bytes`
//! are placed in host memory at once (allocated, offloaded, waited for): the
//! device sees at most one such block at a time. The blocks are then used in
//! place by the GPU (nf_offload's host tier). Returns the previous value.
NF_API size_t nf_torch_set_host_alloc(size_t min_bytes) {
  size_t old = tl_host_min;
  tl_host_min = min_bytes;
  return old;
}

static void count_alloc(nft_dev_t *d, size_t n) {
  atomic_fetch_add_explicit(&d->bytes_alloc, n, memory_order_relaxed);
  atomic_fetch_add_explicit(&d->allocs, 1, memory_order_relaxed);
}

// nf_torch_alloc, or (id nonzero) from private pool `id` (nf_torch_alloc_private).
static void *alloc_impl(size_t size, int device, void *stream, uint64_t id) {
  nf_pool_t *pool = torch_pool_get(device, 1);
  if (!pool) {
    if (size == 0) return NULL;
    char why[sizeof g_err];
    pthread_mutex_lock(&g_mu);
    snprintf(why, sizeof why, "%s", g_err);
    pthread_mutex_unlock(&g_mu);
    return nft_fail_alloc(size, device, device < 0 || device >= NFT_MAX_DEVICES ? NF_ERR_INVALID : NF_ERR_BACKEND, why);
  }
  if (atomic_load_explicit(&devs[device].refuse, memory_order_relaxed) && size) {
    atomic_fetch_add_explicit(&devs[device].ooms, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&devs[device].refused, 1, memory_order_relaxed);
    char why[160];
    snprintf(why, sizeof why, "the memory fraction %g leaves less than one granule (set_per_process_memory_fraction)",
             nf_torch_get_fraction(device));
    return nft_fail_alloc(size, device, NF_ERR_OOM, why);
  }
  void *p = id ? nf_alloc_private(pool, id, size, (nf_stream_t)stream) : nf_alloc(pool, size, (nf_stream_t)stream);
  if (p && tl_host_min && size >= tl_host_min &&
      nf_offload(pool, p, (nf_stream_t)stream, NF_TIER_HOST) == NF_OK)
    nf_offload_wait(pool); // best effort: on failure the block stays on the device
  if (p) {
    count_alloc(&devs[device], size);
    t_status = NF_OK;
    return p;
  }
  if (size == 0) return NULL; // PyTorch expects NULL for empty storages
  atomic_fetch_add_explicit(&devs[device].ooms, 1, memory_order_relaxed);
  char why[1100], cause[600], hint[400] = ""; // cause: nf_last_error (the streams refusal is ~300 bytes)
  nf_status_t ls = nf_last_status(); // read before anything else can touch it
  snprintf(cause, sizeof cause, "%s", nf_last_error());
  // The exception carries the OOM report's suggestion (the full report goes
  // to stderr once per burst and stays readable with nf_last_oom_report).
  const char *sug = ls == NF_ERR_OOM ? strstr(nf_last_oom_report(), "suggestion: ") : NULL;
  if (sug) snprintf(hint, sizeof hint, "; %.*s", (int)strcspn(sug, "\n"), sug);
  nf_stats_t st;
  nf_stats_get(pool, &st);
  char lv[32], lim[32], ph[32];
  nf__fmt_bytes(lv, sizeof lv, st.live);
  nf__fmt_bytes(lim, sizeof lim, st.limit);
  nf__fmt_bytes(ph, sizeof ph, st.physical);
  snprintf(why, sizeof why, "%s: %s (live %s, physical %s, limit %s)%s", nf_status_str(ls), cause, lv, ph,
           lim, hint);
  return nft_fail_alloc(size, device, ls, why);
}

NF_API void *nf_torch_alloc(size_t size, int device, void *stream) { return alloc_impl(size, device, stream, 0); }

NF_API void *nf_torch_alloc_private(size_t size, int device, void *stream, uint64_t id) {
  return alloc_impl(size, device, stream, id);
}

// nf_alloc_at in private pool `id` (a checkpoint's block re-created at its
// address), counted like any allocation: its free is counted too, so without
// this the "freed" statistics overtook "allocated".
NF_API void *nf_torch_alloc_at(int device, uint64_t id, void *addr, size_t size, void *stream) {
  nf_pool_t *pool = torch_pool_get(device, 0);
  if (!pool) return NULL;
  void *r = nf_alloc_at(pool, id, addr, size, (nf_stream_t)stream);
  if (r) count_alloc(&devs[device], size);
  return r;
}

// Device `peer` reads and writes `device`'s memory (torch's enablePeerAccess
// for a copy between the two): the pool is made if needed, so that the grant
// is checked now rather than when the copy faults.
NF_API int nf_torch_add_peer(int device, int peer) {
  nf_pool_t *pool = torch_pool_get(device, 1);
  if (!pool) return -1;
  nf_status_t st = nf_pool_add_peer(pool, peer);
  if (st != NF_OK) {
    nft_error("device %d: peer access for device %d: %s: %s", device, peer, nf_status_str(st), nf_last_error());
    return -1;
  }
  return 0;
}

static void count_free(nft_dev_t *d, size_t n) {
  atomic_fetch_add_explicit(&d->bytes_freed, n, memory_order_relaxed);
  atomic_fetch_add_explicit(&d->frees, 1, memory_order_relaxed);
}

// One lookup per free: each device's pool is asked in turn with a probing
// free, which frees the block where the pointer is that pool's and is quiet
// where the pointer lies outside it (pools' address ranges are disjoint).
NF_API int nf_torch_free_any(void *ptr) {
  if (!ptr) return -1;
  for (int i = 0; i < NFT_MAX_DEVICES; i++) {
    nf_pool_t *pool = atomic_load_explicit(&devs[i].pool, memory_order_acquire);
    if (!pool) continue;
    size_t n;
    nf_status_t st = nf_free_ex(pool, ptr, &n, NF_FREE_PROBE);
    if (st == NF_ERR_FOREIGN) continue;
    if (st != NF_OK) {
      t_status = st;
      nft_error("free of %p on device %d failed: %s: %s", ptr, i, nf_status_str(st), nf_last_error());
      return -1;
    }
    count_free(&devs[i], n);
    t_status = NF_OK;
    return i;
  }
  t_status = NF_ERR_INVALID;
  nft_error("free of %p: not a live block of any nofrag pool", ptr);
  return -1;
}

NF_API void nf_torch_free(void *ptr, size_t size, int device, void *stream) {
  (void)stream; // the pool knows the block's stream; cross-stream uses come via record_stream
  if (!ptr) return;
  nf_pool_t *pool = torch_pool_get(device, 0);
  if (!pool) {
    nft_error("free of %p on device %d, which has no nofrag pool", ptr, device);
    return;
  }
  nf_status_t st = nf_free(pool, ptr);
  if (st != NF_OK) {
    nft_error("free of %p (%zu B) on device %d failed: %s: %s", ptr, size, device, nf_status_str(st),
              nf_last_error());
    return;
  }
  count_free(&devs[device], size);
}

NF_API void nf_torch_init(int device_count) {
  pthread_once(&g_once, nft_init_once);
  pthread_mutex_lock(&g_mu);
  g_device_count = device_count;
  pthread_mutex_unlock(&g_mu);
}

NF_API int nf_torch_device_count(void) { return g_device_count; }

// empty_cache: give every cached granule back to the driver, on every device
// (PyTorch's reset hook carries no device).
NF_API void nf_torch_reset(void) {
  for (int i = 0; i < NFT_MAX_DEVICES; i++) {
    nf_pool_t *pool = torch_pool_get(i, 0);
    if (!pool) continue;
    nf_status_t st = nf_trim(pool);
    if (st != NF_OK) nft_error("empty_cache on device %d: %s: %s", i, nf_status_str(st), nf_last_error());
  }
}

// set_per_process_memory_fraction: limit = fraction x the device's total
// memory, as PyTorch's allocator computes it (cudaMemGetInfo's total).
// A fraction that leaves less than one granule (0 among them) makes every
// request fail (PyTorch's allocator fails those that need new memory);
// nf_set_limit(0) would instead mean "the whole device". The pool keeps its
// limit meanwhile.
NF_API void nf_torch_set_fraction(double fraction, int device) {
  t_status = NF_ERR_INVALID;
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    nft_error("memory fraction %g out of range 0..1", fraction);
    return;
  }
  nf_pool_t *pool = torch_pool_get(device, 1);
  if (!pool) return;
  nf_backend_t *be = devs[device].be;
  uint64_t total = 0, avail = 0;
  nf_status_t st = be->ops->capacity(be, NF_TIER_DEVICE, &total, &avail);
  if (st != NF_OK) {
    t_status = st;
    nft_error("set_per_process_memory_fraction: capacity: %s", nf__backend_err());
    return;
  }
  uint64_t limit = (uint64_t)(fraction * (double)total);
  nf_config_t cfg;
  nf_pool_config(pool, &cfg);
  bool refuse = limit < cfg.granule;
  if (!refuse && (st = nf_set_limit(pool, limit)) != NF_OK) {
    t_status = st;
    nft_error("set_per_process_memory_fraction(%g) on device %d: %s: %s", fraction, device, nf_status_str(st),
              nf_last_error());
    return;
  }
  pthread_mutex_lock(&g_mu);
  devs[device].fraction = fraction;
  devs[device].set = true;
  atomic_store(&devs[device].refuse, refuse);
  pthread_mutex_unlock(&g_mu);
  t_status = NF_OK;
}

NF_API double nf_torch_get_fraction(int device) {
  if (device < 0 || device >= NFT_MAX_DEVICES) return 0.0;
  pthread_mutex_lock(&g_mu);
  double f = devs[device].set ? devs[device].fraction : 1.0;
  pthread_mutex_unlock(&g_mu);
  return f;
}

// Tensor.record_stream: the block must not be reused before `stream`'s work
// queued up to its free completes. The hook carries no device: find the
// pool that owns the pointer.
NF_API void nf_torch_record_stream(void *ptr, void *stream) {
  t_status = NF_OK;
  if (!ptr) return;
  for (int i = 0; i < NFT_MAX_DEVICES; i++) {
    nf_pool_t *pool = torch_pool_get(i, 0);
    if (!pool || nf_block_size(pool, ptr) == 0) continue;
    nf_status_t st = nf_record_stream(pool, ptr, (nf_stream_t)stream);
    if (st != NF_OK) {
      t_status = st;
      nft_error("record_stream(%p): %s: %s", ptr, nf_status_str(st), nf_last_error());
      // The pluggable hook returns nothing and PyTorch goes on: the block may
      // be reused while that stream still works on it. Always said, not
      // only when verbose (the adapter raises as well).
      if (!g_verbose)
        fprintf(stderr, "nofrag: record_stream(%p) not recorded (%s): the block may be reused while that stream still "
                "uses it; synchronize that stream before freeing the tensor\n", ptr, nf_last_error());
    }
    return;
  }
  t_status = NF_ERR_INVALID;
  nft_error("record_stream(%p): not a live nofrag block", ptr);
}

// ---------------------------------------------------------------- for Python

// Fill `out`; returns 0 (pool exists), 1 (no pool yet: zeros), -1 (bad device).
NF_API int nf_torch_stats(int device, nf_stats_t *out) {
  if (!out) return -1;
  memset(out, 0, sizeof *out);
  if (device < 0 || device >= NFT_MAX_DEVICES) return -1;
  nf_pool_t *pool = torch_pool_get(device, 0);
  if (!pool) return 1;
  nf_stats_get(pool, out);
  return 0;
}

// Counters the pool does not keep, for PyTorch's "allocated"/"freed" stats:
// out[0] bytes allocated, out[1] bytes freed (requested sizes, cumulative),
// out[2] allocations, out[3] frees, out[4] failed allocations, out[5] those
// refused by the memory fraction (OOMs the pool's own count lacks).
NF_API int nf_torch_counters(int device, uint64_t *out, int n) {
  if (device < 0 || device >= NFT_MAX_DEVICES || !out) return -1;
  nft_dev_t *d = &devs[device];
  uint64_t v[6] = {atomic_load(&d->bytes_alloc), atomic_load(&d->bytes_freed), atomic_load(&d->allocs),
                   atomic_load(&d->frees),       atomic_load(&d->ooms),        atomic_load(&d->refused)};
  for (int i = 0; i < n && i < 6; i++) out[i] = v[i];
  return 0;
}

// torch.cuda.reset_accumulated_memory_stats.
NF_API void nf_torch_reset_counters(int device) {
  if (device < 0 || device >= NFT_MAX_DEVICES) return;
  nft_dev_t *d = &devs[device];
  atomic_store(&d->bytes_alloc, 0);
  atomic_store(&d->bytes_freed, 0);
  atomic_store(&d->allocs, 0);
  atomic_store(&d->frees, 0);
  atomic_store(&d->ooms, 0);
  atomic_store(&d->refused, 0);
}

NF_API void nf_torch_reset_peaks(int device) {
  nf_pool_t *pool = torch_pool_get(device, 0);
  if (pool) nf_stats_reset_peaks(pool);
}

// Set the configuration for pools created afterwards. Returns 0, or -1 when a
// pool already exists or the string does not parse (see nf_torch_last_error).
NF_API int nf_torch_configure(const char *conf) {
  pthread_once(&g_once, nft_init_once);
  nf_config_t cfg;
  nf_config_default(&cfg);
  char err[768] = ""; // the unknown-key message lists every key
  if (conf && nf_config_parse(&cfg, conf, err, sizeof err) != NF_OK) {
    nft_error("bad nofrag configuration '%s': %s", conf, err);
    return -1;
  }
  pthread_mutex_lock(&g_mu);
  if (atomic_load(&g_pools) > 0) {
    pthread_mutex_unlock(&g_mu);
    nft_error("nf_torch_configure: pools already exist (configure before the first CUDA allocation)");
    return -1;
  }
  char *copy = conf ? strdup(conf) : NULL;
  if (conf && !copy) {
    pthread_mutex_unlock(&g_mu);
    nft_error("nf_torch_configure: out of host memory");
    return -1;
  }
  free(g_conf);
  g_conf = copy;
  pthread_mutex_unlock(&g_mu);
  return 0;
}

// The pool's configuration string as in force (limit resolved) or "" when the
// device has no pool. Written into buf; returns the length or -1.
NF_API int nf_torch_config_string(int device, char *buf, size_t len) {
  nf_pool_t *pool = torch_pool_get(device, 0);
  if (!buf || len == 0) return -1;
  buf[0] = 0;
  if (!pool) return 0;
  nf_config_t cfg;
  nf_pool_config(pool, &cfg);
  return nf_config_format(&cfg, buf, len);
}

// Tests only: destroy every pool (live blocks are dropped) so that another
// configuration can be tried. Not safe while tensors are alive.
NF_API void nf_torch_shutdown(void) {
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < NFT_MAX_DEVICES; i++) {
    nft_dev_t *d = &devs[i];
    nf_pool_t *pool = atomic_exchange(&d->pool, NULL);
    if (pool) nf_pool_destroy(pool);
    if (d->be) nf_backend_destroy(d->be);
    d->be = NULL;
    d->fraction = 0.0;
    d->set = false;
    atomic_store(&d->refuse, 0);
  }
  atomic_store(&g_pools, 0);
  pthread_mutex_unlock(&g_mu);
  for (int i = 0; i < NFT_MAX_DEVICES; i++) nf_torch_reset_counters(i);
}

NF_API int nf_torch_last_status(void) { return t_status; }

// The calling thread's own last error first: an OOM message must not be
// another thread's failure that landed in between (g_err is process-wide).
NF_API const char *nf_torch_last_error(void) {
  if (t_own[0]) return t_own;
  pthread_mutex_lock(&g_mu);
  memcpy(t_err, g_err, sizeof t_err);
  pthread_mutex_unlock(&g_mu);
  return t_err;
}

// Let Python hand over the thrower when the dlopen look-up did not find it
// (fn NULL: keep the current one). Returns 1 when a thrower is installed.
NF_API int nf_torch_set_thrower(void *fn) {
  pthread_once(&g_once, nft_init_once);
  if (fn) atomic_store(&g_throw, (nft_throw_fn)fn);
  return atomic_load(&g_throw) != NULL && atomic_load(&g_throw_enabled);
}

// Turn raising on allocation failure on (1) or off (0: return NULL); returns
// the previous setting. Callers through ctypes (tests) must turn it off: a
// C++ exception cannot cross into Python through ctypes (it aborts).
NF_API int nf_torch_set_throw(int enabled) {
  pthread_once(&g_once, nft_init_once);
  return atomic_exchange(&g_throw_enabled, enabled ? 1 : 0);
}
