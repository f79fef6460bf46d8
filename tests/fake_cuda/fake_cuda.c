// A stand-in libcuda.so.1 that works: the driver entry points the library's
// CUDA backend loads (src/backend/cuda_driver.c), those of `nofrag replay
// --device` (tools/device.c), `nofrag doctor` (tools/doctor.c) and tests/gpu, on host
// memory, for N devices. It runs src/backend/cuda.c, the multi-device paths,
// the device replay and the doctor's checks on machines without a GPU
// (tests/test_cuda_fake.c, tests/gpu as test_cuda_gpu_fake, tests/gpu/replay_device.sh,
// tests/test_doctor.sh, python/tests/test_doctor.py), and checks what the real driver would refuse
// and what nofrag promises about contexts and capture mode:
//   - physical memory: slots of one sparse memfd per device (and one for host
//     memory); a mapping is an mmap of the slots, with no access until
//     cuMemSetAccess grants a device (PROT_NONE until then, so that a
//     forgotten grant faults); freed (hole punched) at cuMemRelease once
//     unmapped. One file per location, not per allocation: a replay maps
//     ~12,000 granules, more descriptors than a process may hold. An
//     allocation exported for IPC moves to a memfd of its own;
//   - cuMemMap only on a reserved, unmapped range (offset 0, the whole
//     allocation: stricter than CUDA, which nofrag never needs), cuMemUnmap
//     only of whole mappings (CUDA: "cannot unmap a sub-range"), cuMemAddressFree
//     of a whole, unmapped reservation;
//   - contexts: a thread's current context; cuMemGetInfo, cuEventCreate,
//     cuStreamCreate and the legacy stream answer for the current context's
//     device; an event is recorded only on a stream of its own context
//     (CUDA_ERROR_INVALID_HANDLE otherwise), a wait may use any context's event;
//   - streams queue their work and run it in order (fake_stream.c), through
//     memory the stream's device was granted when it runs (else an illegal
//     address, counted);
//   - each call counts against the context current on its thread and, if it
//     may touch another thread's capture, whether relaxed mode was on.
// Refusals that point at a nofrag bug print "fake cuda: VIOLATION" and count
// (fakecu_stats); tests require none. Options in NF_FAKE_CUDA (fake_opt):
//   devices=N (default 1, at most 8); init=R (cuInit's result); version=V
//   (cuDriverGetVersion, 13000); mem=MiB per device (512; memK=MiB for device
//   K); hostmem=MiB (512); gran=KiB (2048); peer=0 (no device reaches
//   another); vmmK=0 (device K has no VMM: its attribute says so and its
//   allocations are refused, NOT_SUPPORTED); brokenK=1 (the attribute says VMM,
//   the allocations are refused all the same); hvmmK=0 (no host memory
//   through the VMM API on device K); fdK=0 (device K refuses POSIX fd
//   handles); lag=N (an event reads NOT_READY N times after its record);
//   strict=1 (abort at the first violation: for runs that cannot read the
//   counters).
#include "fake_int.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

// An allocation: `size` bytes at `off` of its location's file, or of a file of its own (own: exported or imported).
typedef struct { unsigned magic; int fd, dev, htype, maps; bool released, own; size_t size; off_t off; } fhandle_t;
// A location's memory: its file and which of its granule slots are taken.
typedef struct { int fd; uint64_t *taken; size_t slots, hint; } floc_t;
typedef struct { fhandle_t *h; uintptr_t start; size_t len; uint64_t access; } fgran_t; // per granule
typedef struct fres { uintptr_t base; size_t size; fgran_t *g; struct fres *next; } fres_t;

pthread_mutex_t fk_mu = PTHREAD_MUTEX_INITIALIZER;
fakecu_stats_t fk_st;
_Thread_local fctx_t *fk_cur;
_Thread_local int fk_mode; // CU_STREAM_CAPTURE_MODE_GLOBAL, the driver's default
static fctx_t primary[FAKECU_MAX_DEV];
static uint64_t noctx_calls;
static fres_t *reservations;
static floc_t locs[FAKECU_MAX_DEV + 1]; // devices, then host memory

int fake_opt(const char *key, int dflt) {
  const char *s = getenv("NF_FAKE_CUDA");
  size_t n = strlen(key);
  while (s && *s) {
    if (strncmp(s, key, n) == 0 && s[n] == '=') return atoi(s + n + 1);
    s = strchr(s, ',');
    if (s) s++;
  }
  return dflt;
}
int fake_dev_opt(const char *key, int dev, int dflt) {
  char k[32];
  snprintf(k, sizeof k, "%s%d", key, dev);
  return fake_opt(k, dflt);
}

int fk_ndev(void) { int n = fake_opt("devices", 1); return n < 1 ? 1 : n > FAKECU_MAX_DEV ? FAKECU_MAX_DEV : n; }
static size_t gran(void) { return (size_t)fake_opt("gran", 2048) << 10; }
static uint64_t capacity(int dev) {
  return (uint64_t)(dev < 0 ? fake_opt("hostmem", 512) : fake_dev_opt("mem", dev, fake_opt("mem", 512))) << 20;
}

static floc_t *loc(int dev) { return &locs[dev < 0 ? FAKECU_MAX_DEV : dev]; }
static bool slot_taken(const floc_t *l, size_t i) { return l->taken[i / 64] >> (i % 64) & 1; }
static void slots_set(floc_t *l, size_t i, size_t n, bool on) {
  for (size_t k = i; k < i + n; k++)
    l->taken[k / 64] = on ? l->taken[k / 64] | 1ull << (k % 64) : l->taken[k / 64] & ~(1ull << (k % 64));
}
// n contiguous free slots of dev's file (made at first use): the first index,
// or -1 (full: the capacity, counted separately, normally says so first).
static long slots_take(int dev, size_t n) {
  floc_t *l = loc(dev);
  if (!l->taken) {
    l->slots = ((size_t)1 << 40) / gran(); // sparse: whatever capacity a later option gives
    l->taken = calloc((l->slots + 63) / 64, 8);
    l->fd = l->taken ? memfd_create("fake-cuda", MFD_CLOEXEC) : -1;
    if (l->fd < 0 || ftruncate(l->fd, (off_t)(l->slots * gran()))) {
      if (l->fd >= 0) close(l->fd);
      free(l->taken);
      l->taken = NULL;
      return -1;
    }
  }
  for (size_t pass = 0; pass < 2; pass++) // from the hint, then from the start
    for (size_t i = pass ? 0 : l->hint, run = 0; i < l->slots; i++) {
      run = slot_taken(l, i) ? 0 : run + 1;
      if (run == n) {
        slots_set(l, i + 1 - n, n, true);
        l->hint = i + 1;
        return (long)(i + 1 - n);
      }
    }
  return -1;
}

int fk_violation(int r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "fake cuda: VIOLATION: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  fk_st.violations++;
  if (fake_opt("strict", 0)) abort(); // a test that cannot read the counters (a CLI run) fails at once
  return r;
}

void fk_enter(bool capture_unsafe) {
  pthread_mutex_lock(&fk_mu);
  if (fk_cur) fk_cur->calls++;
  else noctx_calls++;
  if (capture_unsafe && fk_mode != RELAXED) fk_st.unrelaxed++;
}

fctx_t *fk_ctx_of(void *c) { fctx_t *x = c; return x && x->magic == MAGIC_CTX ? x : NULL; }

static fres_t *res_find(uintptr_t va, size_t size) {
  for (fres_t *r = reservations; r; r = r->next)
    if (va >= r->base && va - r->base < r->size) return size <= r->size - (va - r->base) ? r : NULL;
  return NULL;
}
static fgran_t *gran_at(uintptr_t va) {
  fres_t *r = res_find(va, 1);
  return r ? &r->g[(va - r->base) / gran()] : NULL;
}

static void handle_drop(fhandle_t *h) {
  if (!h->released || h->maps) return;
  if (h->own) {
    close(h->fd);
  } else { // the slots' pages back to the system; the next user finds zeros, as the driver gives no promise
    (void)fallocate(h->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, h->off, (off_t)h->size);
    slots_set(loc(h->dev), (size_t)h->off / gran(), h->size / gran(), false);
  }
  if (h->dev < 0) fk_st.host_used -= h->size;
  else fk_st.used[h->dev] -= h->size;
  fk_st.handles--;
  h->magic = 0;
  free(h);
}

// ------------------------------------------------------------ init, devices, contexts
int cuInit(unsigned flags) { (void)flags; return fake_opt("init", OK); }
int cuDriverGetVersion(int *v) { *v = fake_opt("version", 13000); return OK; }
int cuDeviceGetCount(int *n) { *n = fk_ndev(); return OK; }
int cuDeviceGetName(char *name, int len, int d) {
  if (d < 0 || d >= fk_ndev()) return INVALID_DEVICE;
  snprintf(name, (size_t)len, "Fake GPU %d", d);
  return OK;
}
int cuDeviceGetAttribute(int *v, int attr, int d) {
  if (d < 0 || d >= fk_ndev()) return INVALID_DEVICE;
  switch (attr) {
  case 75: *v = 9; break;                              // compute capability 9.0
  case 102: *v = fake_dev_opt("vmm", d, 1); break;     // virtual memory management
  case 103: *v = fake_dev_opt("fd", d, 1); break;      // POSIX fd handles
  case 145: *v = fake_dev_opt("hvmm", d, 1); break;    // host memory through the VMM API
  default: *v = 0;
  }
  return OK;
}
int cuDeviceGet(int *d, int ordinal) {
  if (ordinal < 0 || ordinal >= fk_ndev()) return INVALID_DEVICE;
  *d = ordinal;
  return OK;
}
int cuDeviceCanAccessPeer(int *can, int a, int b) {
  if (a < 0 || a >= fk_ndev() || b < 0 || b >= fk_ndev()) return INVALID_DEVICE;
  *can = a != b && fake_opt("peer", 1);
  return OK;
}
static fctx_t *primary_of(int d) {
  pthread_mutex_lock(&fk_mu);
  fctx_t *c = &primary[d];
  c->magic = MAGIC_CTX;
  c->dev = d;
  pthread_mutex_unlock(&fk_mu);
  return c;
}
int cuDevicePrimaryCtxRetain(void **ctx, int d) {
  if (d < 0 || d >= fk_ndev()) return INVALID_DEVICE;
  *ctx = primary_of(d);
  return OK;
}
int cuDevicePrimaryCtxRelease_v2(int d) { return d < 0 || d >= fk_ndev() ? INVALID_DEVICE : OK; }
int cuCtxSetCurrent(void *ctx) {
  if (ctx && !fk_ctx_of(ctx)) return INVALID_CONTEXT;
  fk_cur = ctx;
  return OK;
}
int cuCtxGetCurrent(void **ctx) { *ctx = fk_cur; return OK; }
int cuThreadExchangeStreamCaptureMode(int *m) {
  int old = fk_mode;
  fk_mode = *m;
  *m = old;
  return OK;
}
int cuGetErrorName(int r, const char **s) {
  switch (r) {
  case OK: *s = "CUDA_SUCCESS"; break;
  case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
  case OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
  case INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
  case NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; break;
  case INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
  case ALREADY_MAPPED: *s = "CUDA_ERROR_ALREADY_MAPPED"; break;
  case NOT_MAPPED: *s = "CUDA_ERROR_NOT_MAPPED"; break;
  case INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
  case NOT_READY: *s = "CUDA_ERROR_NOT_READY"; break;
  case ILLEGAL_ADDRESS: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
  case NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; break;
  case CAPTURE_UNSUPPORTED: *s = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"; break;
  case CAPTURE_INVALIDATED: *s = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"; break;
  case WOULD_HANG: *s = "CUDA_ERROR_UNKNOWN"; break;
  default: *s = NULL; return INVALID_VALUE;
  }
  return OK;
}
int cuGetErrorString(int r, const char **s) {
  const char *n;
  if (cuGetErrorName(r, &n) != OK) return INVALID_VALUE;
  *s = "the stand-in driver of tests/fake_cuda says so";
  return OK;
}

// ------------------------------------------------------------ memory
typedef struct { int type, id; } loc_t;
typedef struct { int type, htypes; loc_t loc; void *win32; unsigned char flags[8]; } prop_t; // CUmemAllocationProp
typedef struct { loc_t loc; int flags; } access_t;                                            // CUmemAccessDesc

static int prop_dev(const prop_t *p) { // device ordinal, -1 host, -2 invalid
  if (!p || p->type != 1) return -2;
  if (p->loc.type == LOC_HOST) return -1;
  return p->loc.type == LOC_DEVICE && p->loc.id >= 0 && p->loc.id < fk_ndev() ? p->loc.id : -2;
}
// Allocations there refused (options vmmK, brokenK, hvmmK of the current device).
static bool vmm_refused(int dev) {
  if (dev < 0) return !fake_dev_opt("hvmm", fk_cur ? fk_cur->dev : 0, 1);
  return !fake_dev_opt("vmm", dev, 1) || fake_dev_opt("broken", dev, 0);
}

int cuMemGetAllocationGranularity(size_t *g, const prop_t *p, int option) {
  (void)option;
  fk_enter(false);
  if (prop_dev(p) == -2) RETURN(INVALID_VALUE);
  if (vmm_refused(prop_dev(p))) RETURN(NOT_SUPPORTED);
  *g = gran();
  RETURN(OK);
}

int cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
  fk_enter(false);
  if (!fk_cur) RETURN(fk_violation(INVALID_CONTEXT, "cuMemGetInfo with no context current"));
  size_t t = capacity(fk_cur->dev);
  *total = t;
  *free_bytes = t - fk_st.used[fk_cur->dev];
  RETURN(OK);
}

int cuMemAddressReserve(uintptr_t *out, size_t size, size_t align, uintptr_t addr, unsigned long long flags) {
  (void)addr;
  (void)flags;
  fk_enter(false);
  size_t g = gran();
  if (!size || size % g || (align && (align & (align - 1)))) RETURN(fk_violation(INVALID_VALUE, "cuMemAddressReserve(%zu, align %zu)", size, align));
  if (align < g) align = g;
  char *m = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) RETURN(OUT_OF_MEMORY);
  uintptr_t a = ((uintptr_t)m + align - 1) & ~(uintptr_t)(align - 1);
  if (a > (uintptr_t)m) munmap(m, a - (uintptr_t)m);
  munmap((char *)a + size, (uintptr_t)m + size + align - a - size);
  fres_t *r = calloc(1, sizeof *r);
  r->g = r ? calloc(size / g, sizeof *r->g) : NULL;
  if (!r || !r->g) { free(r); munmap((void *)a, size); RETURN(OUT_OF_MEMORY); }
  r->base = a;
  r->size = size;
  r->next = reservations;
  reservations = r;
  *out = a;
  RETURN(OK);
}

int cuMemAddressFree(uintptr_t va, size_t size) {
  fk_enter(false);
  fres_t **pp = &reservations;
  while (*pp && (*pp)->base != va) pp = &(*pp)->next;
  fres_t *r = *pp;
  if (!r || r->size != size) RETURN(fk_violation(INVALID_VALUE, "cuMemAddressFree(%#lx, %zu): not a whole reservation", va, size));
  for (size_t i = 0; i < size / gran(); i++)
    if (r->g[i].h) RETURN(fk_violation(INVALID_VALUE, "cuMemAddressFree(%#lx): granule %zu still mapped", va, i));
  *pp = r->next;
  munmap((void *)va, size);
  free(r->g);
  free(r);
  RETURN(OK);
}

int cuMemCreate(void **out, size_t size, const prop_t *p, unsigned long long flags) {
  fk_enter(false);
  int dev = prop_dev(p);
  if (dev == -2 || flags || !size || size % gran()) RETURN(fk_violation(INVALID_VALUE, "cuMemCreate(%zu): bad arguments", size));
  if (p->htypes & ~HT_FD) RETURN(fk_violation(INVALID_VALUE, "cuMemCreate: handle types %#x", p->htypes));
  if (vmm_refused(dev)) RETURN(NOT_SUPPORTED);
  if ((p->htypes & HT_FD) && dev >= 0 && !fake_dev_opt("fd", dev, 1)) { fk_st.create_refused++; RETURN(NOT_SUPPORTED); }
  uint64_t cap = capacity(dev), *used = dev < 0 ? &fk_st.host_used : &fk_st.used[dev];
  if (*used + size > cap) RETURN(OUT_OF_MEMORY);
  fhandle_t *h = calloc(1, sizeof *h);
  long slot = h ? slots_take(dev, size / gran()) : -1;
  if (slot < 0) { free(h); RETURN(OUT_OF_MEMORY); }
  *h = (fhandle_t){.magic = MAGIC_HANDLE, .fd = loc(dev)->fd, .dev = dev, .htype = p->htypes, .size = size,
                   .off = (off_t)((size_t)slot * gran())};
  *used += size;
  fk_st.handles++;
  fk_st.creates++;
  fk_st.creates_fd += (p->htypes & HT_FD) != 0;
  *out = h;
  RETURN(OK);
}

static fhandle_t *handle_of(void *x) { fhandle_t *h = x; return h && h->magic == MAGIC_HANDLE && !h->released ? h : NULL; }

int cuMemRelease(void *x) {
  fk_enter(false);
  fhandle_t *h = handle_of(x);
  if (!h) RETURN(fk_violation(INVALID_HANDLE, "cuMemRelease(%p): not a live handle", x));
  h->released = true;
  handle_drop(h);
  RETURN(OK);
}

int cuMemMap(uintptr_t va, size_t size, size_t offset, void *x, unsigned long long flags) {
  fk_enter(false);
  fhandle_t *h = handle_of(x);
  size_t g = gran();
  if (!h) RETURN(fk_violation(INVALID_HANDLE, "cuMemMap(%#lx): not a live handle", va));
  if (offset || flags || size != h->size || va % g) RETURN(fk_violation(INVALID_VALUE, "cuMemMap(%#lx, %zu, offset %zu): not the whole allocation", va, size, offset));
  fres_t *r = res_find(va, size);
  if (!r) RETURN(fk_violation(INVALID_VALUE, "cuMemMap(%#lx, %zu): outside every reservation", va, size));
  fgran_t *e = &r->g[(va - r->base) / g];
  for (size_t i = 0; i < size / g; i++)
    if (e[i].h) RETURN(ALREADY_MAPPED); // an error, not a violation: tests/gpu provokes it (nofrag sees the failure)
  if (mmap((void *)va, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, h->off) == MAP_FAILED) RETURN(OUT_OF_MEMORY);
  for (size_t i = 0; i < size / g; i++) e[i] = (fgran_t){.h = h, .start = va, .len = size};
  h->maps++;
  fk_st.mapped += size;
  RETURN(OK);
}

int cuMemUnmap(uintptr_t va, size_t size) {
  fk_enter(false);
  size_t g = gran();
  fres_t *r = res_find(va, size);
  if (!r || !size || va % g || size % g) RETURN(fk_violation(INVALID_VALUE, "cuMemUnmap(%#lx, %zu): outside every reservation", va, size));
  fgran_t *e = &r->g[(va - r->base) / g];
  for (size_t i = 0; i < size / g; i++) {
    if (!e[i].h) RETURN(fk_violation(NOT_MAPPED, "cuMemUnmap(%#lx, %zu): granule %zu not mapped", va, size, i));
    if (e[i].start < va || e[i].start + e[i].len > va + size)
      RETURN(fk_violation(INVALID_VALUE, "cuMemUnmap(%#lx, %zu): part of the mapping at %#lx", va, size, e[i].start));
  }
  if (mmap((void *)va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
    RETURN(OUT_OF_MEMORY);
  for (size_t i = 0, n; i < size / g; i += n) {
    fhandle_t *h = e[i].h;
    n = e[i].len / g;
    for (size_t k = 0; k < n; k++) e[i + k] = (fgran_t){0};
    h->maps--;
    fk_st.mapped -= n * g;
    handle_drop(h);
  }
  RETURN(OK);
}

int cuMemSetAccess(uintptr_t va, size_t size, const access_t *d, size_t count) {
  fk_enter(false);
  size_t g = gran();
  fres_t *r = res_find(va, size);
  if (!r || !size || va % g || size % g || !count) RETURN(fk_violation(INVALID_VALUE, "cuMemSetAccess(%#lx, %zu)", va, size));
  fgran_t *e = &r->g[(va - r->base) / g];
  for (size_t i = 0; i < size / g; i++) {
    if (!e[i].h) RETURN(fk_violation(INVALID_VALUE, "cuMemSetAccess(%#lx, %zu): granule %zu not mapped", va, size, i));
    for (size_t k = 0; k < count; k++) {
      int to = d[k].loc.id, owner = e[i].h->dev;
      if (d[k].loc.type != LOC_DEVICE || to < 0 || to >= fk_ndev() || (d[k].flags & ~3))
        RETURN(fk_violation(INVALID_VALUE, "cuMemSetAccess: descriptor %zu", k));
      if (owner >= 0 && to != owner && !fake_opt("peer", 1))
        RETURN(fk_violation(INVALID_DEVICE, "cuMemSetAccess: device %d cannot reach device %d", to, owner));
    }
  }
  bool any = false;
  for (size_t i = 0; i < size / g; i++) {
    for (size_t k = 0; k < count; k++) {
      uint64_t bit = 1ull << d[k].loc.id;
      e[i].access = d[k].flags == 3 ? e[i].access | bit : e[i].access & ~bit; // read-only counts as none here
    }
    any |= e[i].access != 0;
  }
  // One protection for the run: the host stands for whichever device may touch it.
  if (mprotect((void *)va, size, any ? PROT_READ | PROT_WRITE : PROT_NONE)) RETURN(OUT_OF_MEMORY);
  RETURN(OK);
}

bool fk_reachable(uintptr_t a, size_t n, int dev) {
  if (!res_find(a, 1)) return true;
  size_t g = gran();
  for (uintptr_t p = a - a % g; p < a + n; p += g) {
    fgran_t *e = gran_at(p);
    if (!e || !e->h || !(e->access >> dev & 1)) return false;
  }
  return true;
}

// An exported allocation gets a file of its own (an fd names one allocation):
// its bytes are copied there and every mapping of it moves there, same
// addresses, same protection; its slots are freed.
static bool handle_own(fhandle_t *h) {
  int fd = memfd_create("fake-cuda-ipc", MFD_CLOEXEC);
  char *buf = malloc(1 << 16);
  bool ok = fd >= 0 && buf && ftruncate(fd, (off_t)h->size) == 0;
  for (size_t o = 0; ok && o < h->size; o += 1 << 16)
    ok = pread(h->fd, buf, 1 << 16, h->off + (off_t)o) == 1 << 16 && pwrite(fd, buf, 1 << 16, (off_t)o) == 1 << 16;
  free(buf);
  if (!ok) { if (fd >= 0) close(fd); return false; }
  size_t g = gran();
  for (fres_t *r = reservations; r; r = r->next)
    for (size_t i = 0; i < r->size / g; i += r->g[i].h ? r->g[i].len / g : 1) {
      if (r->g[i].h != h) continue;
      int prot = r->g[i].access ? PROT_READ | PROT_WRITE : PROT_NONE;
      if (mmap((void *)r->g[i].start, h->size, prot, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) abort(); // (addresses held: cannot fail)
    }
  (void)fallocate(h->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, h->off, (off_t)h->size);
  slots_set(loc(h->dev), (size_t)h->off / gran(), h->size / gran(), false);
  h->fd = fd;
  h->off = 0;
  h->own = true;
  return true;
}

int cuMemExportToShareableHandle(int *fd, void *x, int type, unsigned long long flags) {
  fk_enter(false);
  fhandle_t *h = handle_of(x);
  if (!h || flags) RETURN(fk_violation(INVALID_HANDLE, "cuMemExportToShareableHandle(%p)", x));
  if (type != HT_FD || !(h->htype & HT_FD)) RETURN(INVALID_VALUE); // not made exportable: the caller's fallback
  if (!h->own && !handle_own(h)) RETURN(OUT_OF_MEMORY);
  *fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0);
  RETURN(*fd < 0 ? OUT_OF_MEMORY : OK);
}

int cuMemImportFromShareableHandle(void **out, void *osh, int type) {
  fk_enter(false);
  struct stat sb;
  int fd = (int)(intptr_t)osh;
  if (type != HT_FD || fstat(fd, &sb) || !sb.st_size) RETURN(INVALID_VALUE);
  fhandle_t *h = calloc(1, sizeof *h);
  if (!h || (h->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) { free(h); RETURN(OUT_OF_MEMORY); }
  h->magic = MAGIC_HANDLE;
  h->own = true;
  h->dev = 0; // the exporter's device is not in the fd; device 0 is what tests share
  h->htype = HT_FD;
  h->size = (size_t)sb.st_size;
  fk_st.used[0] += h->size; // charged like an allocation of its own: freed the same way
  fk_st.handles++;
  *out = h;
  RETURN(OK);
}

int cuDeviceTotalMem_v2(size_t *bytes, int d) {
  if (d < 0 || d >= fk_ndev()) return INVALID_DEVICE;
  *bytes = capacity(d);
  return OK;
}

// ------------------------------------------------------------ the tests' side
void fakecu_stats(fakecu_stats_t *out) {
  pthread_mutex_lock(&fk_mu);
  *out = fk_st;
  pthread_mutex_unlock(&fk_mu);
}
void *fakecu_primary(int dev) { return dev >= 0 && dev < fk_ndev() ? primary_of(dev) : NULL; }
void *fakecu_ctx_create(int dev) {
  fctx_t *c = calloc(1, sizeof *c);
  if (c) *c = (fctx_t){.magic = MAGIC_CTX, .dev = dev};
  return c;
}
// A context of the test's own (cuCtxCreate): made current.
int cuCtxCreate_v2(void **out, unsigned flags, int dev) {
  (void)flags;
  if (dev < 0 || dev >= fk_ndev()) return INVALID_DEVICE;
  if (!(*out = fakecu_ctx_create(dev))) return OUT_OF_MEMORY;
  fk_cur = *out;
  return OK;
}
int cuCtxDestroy_v2(void *ctx) {
  fctx_t *c = fk_ctx_of(ctx);
  if (!c || (c >= primary && c < primary + FAKECU_MAX_DEV)) return INVALID_CONTEXT;
  pthread_mutex_lock(&fk_mu);
  fk_ctx_streams_drop(c);
  c->magic = 0;
  pthread_mutex_unlock(&fk_mu);
  if (fk_cur == c) fk_cur = NULL;
  free(c);
  return OK;
}
uint64_t fakecu_ctx_calls(void *ctx) {
  pthread_mutex_lock(&fk_mu);
  uint64_t n = ctx ? ((fctx_t *)ctx)->calls : noctx_calls;
  pthread_mutex_unlock(&fk_mu);
  return n;
}
int fakecu_where(uintptr_t va, int *dev, uint64_t *access) {
  pthread_mutex_lock(&fk_mu);
  fgran_t *e = gran_at(va);
  int mapped = e && e->h;
  if (mapped) { *dev = e->h->dev; *access = e->access; }
  pthread_mutex_unlock(&fk_mu);
  return mapped;
}
int fakecu_capture_mode(void) { return fk_mode; }
