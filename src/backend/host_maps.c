// Host backend: the kernel's bound on memory mappings (vm.max_map_count).
// Every mapped granule run is a kernel mapping of its own, so small granules
// reach the bound: the map_room op lets the core refuse a request that cannot
// fit before it maps anything, failures name the bound and the remedy, and
// unmap keeps working at the bound (a spare page is given up to put a
// range's reservation back; see nf__host_reserve_again).
#include "host.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>

// The kernel's bound on a process's memory mappings (vm.max_map_count), read
// once (0: unknown).
static uint64_t kernel_max_maps;
static pthread_once_t kernel_max_once = PTHREAD_ONCE_INIT;

static void read_kernel_max_maps(void) {
  unsigned long long v = 0;
  FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
  if (f) {
    if (fscanf(f, "%llu", &v) != 1) v = 0;
    fclose(f);
  }
  kernel_max_maps = v;
}

void nf__host_map_bound_init(void) { pthread_once(&kernel_max_once, read_kernel_max_maps); }

// The bound on mappings this backend works under, and its name (0: unknown).
static uint64_t map_bound(const host_backend *h, const char **what) {
  if (h->max_maps) {
    *what = "NOFRAG_HOST_MAX_MAPS";
    return h->max_maps;
  }
  pthread_once(&kernel_max_once, read_kernel_max_maps);
  *what = "vm.max_map_count";
  return kernel_max_maps;
}

// mmap/mprotect failed with ENOMEM (or would: nf__host_map_room), which on
// Linux is mostly the per-process bound on memory mappings (vm.max_map_count):
// every mapped granule run of the host backend is a mapping of its own, so
// small granules hit it. Names the bound, how many mappings this backend
// holds, and what to do; the message goes to `to` (the backend the caller
// called: a fault wrapper's own). Nothing is rescanned: counting the lines of
// /proc/self/maps here, 65k of them at the bound, on every failure made a
// rollback of many granules quadratic.
static nf_status_t fail_maps(host_backend *h, nf_backend_t *to, const char *op) {
  const char *what;
  unsigned long long lim = map_bound(h, &what), held = h->n_maps;
  if (!lim) return nf__backend_fail(to, NF_ERR_BACKEND, "host backend: %s: Cannot allocate memory", op);
  // A backend message is NF_BACKEND_ERR_MAX (256) bytes: short words, the numbers and the remedy first.
  // The last remedy raises the bound that binds: the environment's own, or the kernel's.
  char remedy[64];
  if (h->max_maps) snprintf(remedy, sizeof remedy, "a larger NOFRAG_HOST_MAX_MAPS");
  else snprintf(remedy, sizeof remedy, "sysctl vm.max_map_count=%llu", lim * 4);
  return nf__backend_fail(to, NF_ERR_BACKEND,
                          "host backend: %s: out of memory mappings: %llu held (%llu granule runs of %llu B), %s=%llu; use a "
                          "larger granule, fewer views (views:N), or %s",
                          op, held, held, (unsigned long long)h->granule, what, lim, remedy);
}

nf_status_t nf__host_fail_enomem(host_backend *h, const char *op) { return fail_maps(h, &h->base, op); }

// The map_room op: whether `n` more mappings fit under the bound
// (NOFRAG_HOST_MAX_MAPS, else vm.max_map_count), counting each map as one
// kernel mapping. Passing promises nothing: the process's other mappings
// count against vm.max_map_count too. (The kernel merges neighbouring
// mappings of adjacent memfd extents, so a refused request might have fit by
// luck; the pool maps fresh granules in descending extent order, and at the
// bound the GPT-2 trace held 65502 maps in 65532 kernel mappings.)
nf_status_t nf__host_map_room(nf_backend_t *be, uint64_t n) {
  host_backend *h = hb(be);
  pthread_mutex_lock(&h->mu);
  const char *what;
  uint64_t lim = map_bound(h, &what);
  bool ok = !lim || (h->n_maps <= lim && n <= lim - h->n_maps);
  if (!ok) {
    char op[64];
    snprintf(op, sizeof op, "map of %llu granule%s", (unsigned long long)n, n == 1 ? "" : "s");
    fail_maps(h, be, op);
  }
  pthread_mutex_unlock(&h->mu);
  return ok ? NF_OK : NF_ERR_BACKEND;
}

// A page of anonymous shared memory (its own object: it never merges with a
// neighbour, so unmapping it always frees one kernel mapping), or NULL.
void *nf__host_spare_new(host_backend *h) {
  void *p = mmap(NULL, h->page, PROT_NONE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

// Put the PROT_NONE reservation back over [va, va + size), whole mappings of
// a range; 0 or an errno, and then nothing changed. One MAP_FIXED call
// replaces them, so the range is never without a mapping: unmapping it first
// would leave a hole that another thread's mmap (not under our lock) could
// take, and the next map here would then clobber that mapping with MAP_FIXED.
// At the kernel's bound (vm.max_map_count) that call fails with ENOMEM although
// it adds no mapping: the kernel checks the count before it looks at what the
// call replaces, and a map that failed at the bound can leave the count one
// above it (it split the reservation, then gave up). Then the spare page goes
// (it lies outside every reserved range: the hole it leaves is nobody's),
// which brings the count back under the bound, the range is replaced, and a
// new spare is made (at worst the count is where it was: the replaced
// mappings were whole ones, often merged into the reservation around them).
int nf__host_reserve_again(host_backend *h, uintptr_t va, size_t size) {
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED;
  if (mmap((void *)va, size, PROT_NONE, flags, -1, 0) != MAP_FAILED) return 0;
  if (errno != ENOMEM) return errno;
  if (!h->spare) h->spare = nf__host_spare_new(h);
  if (!h->spare || munmap(h->spare, h->page) != 0) return ENOMEM;
  h->spare = NULL;
  int e = mmap((void *)va, size, PROT_NONE, flags, -1, 0) == MAP_FAILED ? errno : 0;
  h->spare = nf__host_spare_new(h);
  return e;
}
