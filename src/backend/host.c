// Host (CPU) backend: the CUDA driver VMM API emulated with memfd + mmap.
//
// Physical memory lives in one memfd per tier (device, host), sized to the
// simulated capacity with ftruncate. tmpfs files are sparse, so a 141 GiB
// "device" costs nothing until pages are touched; punching a hole gives the
// pages back and makes them read as zero when the extent is reused (fresh
// cuMemCreate memory is not guaranteed zero on CUDA, but zero is the one
// value that makes stale data visible in tests).
//
// Reserved address space is PROT_NONE anonymous memory. map() places the
// memfd extent there with MAP_FIXED|MAP_SHARED, so data written through one
// mapping is what the next mapping of that handle shows; unmap() puts
// PROT_NONE anonymous memory back. Mappings start PROT_NONE, as on CUDA, so a
// forgotten set_access faults instead of silently working.
//
// Every op checks its arguments against the backend's own records and leaves
// state unchanged on error, which makes this backend a checker of how the
// allocator uses the VMM API. One mutex guards all state: VMM calls are rare
// compared to allocations, and two pools may share one backend.
//
// Handles are (generation << 32) | (record index + 1): never 0, and a handle
// used after its release (record reused) is detected as invalid.
#include "host.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>


static const nf_backend_ops_t host_ops;


// Grow a dynamic array so that it holds at least `need` elements.
bool nf__host_grow(void **arr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return true;
  size_t n = *cap ? *cap * 2 : 16;
  while (n < need) n *= 2;
  void *p = realloc(*arr, n * elem);
  if (!p) return false;
  *arr = p;
  *cap = n;
  return true;
}

static nf_status_t check_tier(nf_backend_t *be, nf_tier_t tier) {
  if (tier == NF_TIER_DEVICE || tier == NF_TIER_HOST) return NF_OK;
  if (tier == NF_TIER_DISK) return nf__backend_fail(be, NF_ERR_UNSUPPORTED, "host backend: disk tier not supported");
  return nf__backend_fail(be, NF_ERR_INVALID, "host backend: unknown tier %d", (int)tier);
}

// ---------------------------------------------------------------- memfd extents

static nf_status_t tier_init(host_backend *h, nf_tier_t tier) {
  tier_state *t = &h->tiers[tier];
  if (t->fd >= 0) return NF_OK;
  if (!nf__host_grow((void **)&t->free, &t->capfree, 1, sizeof(extent)))
    return nf__backend_fail(&h->base, NF_ERR_NOMEM, "host backend: out of host memory");
  int fd = memfd_create(tier == NF_TIER_DEVICE ? "nofrag-device" : "nofrag-host", MFD_CLOEXEC);
  if (fd < 0) return nf__backend_fail(&h->base, NF_ERR_BACKEND, "host backend: memfd_create: %s", strerror(errno));
  uint64_t size = h->capacity / h->granule * h->granule;
  if (ftruncate(fd, (off_t)size) != 0) {
    int e = errno;
    close(fd);
    return nf__backend_fail(&h->base, NF_ERR_BACKEND, "host backend: ftruncate(%llu): %s", (unsigned long long)size,
                            strerror(e));
  }
  t->fd = fd;
  t->free[0] = (extent){0, size};
  t->nfree = 1;
  return NF_OK;
}

// First fit. Handles are one granule in practice, so the first extent fits.
static bool ext_alloc(tier_state *t, uint64_t size, uint64_t *off) {
  for (size_t i = 0; i < t->nfree; i++) {
    if (t->free[i].len < size) continue;
    *off = t->free[i].off;
    t->free[i].off += size;
    t->free[i].len -= size;
    if (t->free[i].len == 0) {
      memmove(&t->free[i], &t->free[i + 1], (t->nfree - i - 1) * sizeof(extent));
      t->nfree--;
    }
    return true;
  }
  return false;
}

// Give an extent back, coalescing. The caller has made room for one more
// entry (ext_reserve) so that this cannot fail after state has changed.
static void ext_free(tier_state *t, uint64_t off, uint64_t len) {
  size_t lo = 0, hi = t->nfree; // first extent after `off`
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (t->free[mid].off < off) lo = mid + 1;
    else hi = mid;
  }
  bool prev = lo > 0 && t->free[lo - 1].off + t->free[lo - 1].len == off;
  bool next = lo < t->nfree && off + len == t->free[lo].off;
  if (prev && next) {
    t->free[lo - 1].len += len + t->free[lo].len;
    memmove(&t->free[lo], &t->free[lo + 1], (t->nfree - lo - 1) * sizeof(extent));
    t->nfree--;
  } else if (prev) {
    t->free[lo - 1].len += len;
  } else if (next) {
    t->free[lo].off = off;
    t->free[lo].len += len;
  } else {
    memmove(&t->free[lo + 1], &t->free[lo], (t->nfree - lo) * sizeof(extent));
    t->free[lo] = (extent){off, len};
    t->nfree++;
  }
}

static bool ext_reserve(host_backend *h, size_t more) {
  for (int i = 0; i < NTIERS; i++)
    if (!nf__host_grow((void **)&h->tiers[i].free, &h->tiers[i].capfree, h->tiers[i].nfree + more, sizeof(extent))) return false;
  return true;
}

static bool punch(host_backend *h, const mem_rec *r) {
  if (r->ext_fd >= 0) return true; // imported: the exporting process owns the memory
  if (getpid() != h->pid) return true; // a fork()ed child: the memfd's bytes are the parent's (host.h)
  return fallocate(h->tiers[r->tier].fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)r->off, (off_t)r->size) == 0;
}

// Return a record's memory (hole already punched unless `leak`) and the record.
static void rec_free(host_backend *h, uint32_t idx, bool leak) {
  mem_rec *r = &h->recs[idx];
  tier_state *t = &h->tiers[r->tier];
  if (r->ext_fd >= 0) { // imported: no extent of ours
    close(r->ext_fd);
    r->ext_fd = -1;
    leak = true;
  }
  // If the punch failed the extent would not read as zero: never reuse it
  // (and keep counting it as created, so capacity shows the loss).
  if (!leak) {
    ext_free(t, r->off, r->size);
    t->created -= r->size;
  }
  r->state = REC_FREE;
  r->gen = r->gen + 1 ? r->gen + 1 : 1;
  r->next_free = h->free_rec;
  h->free_rec = idx + 1;
}

// A live (not released) record for handle `hd`, or NULL.
mem_rec *nf__host_rec_of(host_backend *h, nf_handle_t hd, uint32_t *idx) {
  uint64_t i = (hd & 0xFFFFFFFFu);
  if (i == 0 || i > h->nrecs) return NULL;
  mem_rec *r = &h->recs[i - 1];
  if (r->state != REC_LIVE || r->gen != (uint32_t)(hd >> 32)) return NULL;
  *idx = (uint32_t)(i - 1);
  return r;
}

// ---------------------------------------------------------------- address ranges

// The reserved range that contains [va, va+size), or NULL.
static va_range *range_of(host_backend *h, uintptr_t va, size_t size) {
  size_t lo = 0, hi = h->nranges; // first range with base > va
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (h->ranges[mid].base <= va) lo = mid + 1;
    else hi = mid;
  }
  if (lo == 0) return NULL;
  va_range *r = &h->ranges[lo - 1];
  if (va - r->base > r->size || size > r->size - (va - r->base)) return NULL;
  return r;
}

// The physical memory under [va, va + *n): one run of it, as (tier + 1) << 56
// | memfd offset (0: unmapped); *n is cut to where the run ends (the end of
// the granule). For the use checks (host_event.c): views map one granule at
// several addresses, so work on one address can race work on another.
uint64_t nf__host_phys(host_backend *h, uintptr_t va, size_t *n) {
  va_range *r = range_of(h, va, 1);
  uint64_t G = h->granule, in = (va - (r ? r->base : 0)) % G;
  if (*n > G - in) *n = G - in;
  if (!r || !r->slot[(va - r->base) / G]) return 0;
  size_t i = (va - r->base) / G, i0 = i;
  uint32_t rec = SLOT_REC(r->slot[i]);
  while (!(r->slot[i0] & SLOT_START)) i0--; // the mapping's first granule: offsets count from there
  const mem_rec *m = &h->recs[rec];
  return ((uint64_t)m->tier + 1) << 56 | (m->off + (i - i0) * G + in);
}

// Common checks of a (va, size) pair naming granules of one reserved range.
static nf_status_t check_run(host_backend *h, const char *op, uintptr_t va, size_t size, va_range **out) {
  if (size == 0 || va % h->granule || size % h->granule)
    return nf__backend_fail(&h->base, NF_ERR_INVALID, "host backend: %s(%#lx, %zu): not granule aligned (granule %llu)",
                            op, (unsigned long)va, size, (unsigned long long)h->granule);
  *out = range_of(h, va, size);
  if (!*out)
    return nf__backend_fail(&h->base, NF_ERR_INVALID, "host backend: %s(%#lx, %zu): not inside a reserved range", op,
                            (unsigned long)va, size);
  return NF_OK;
}

static nf_status_t va_reserve_locked(host_backend *h, size_t size, size_t align, uintptr_t *out) {
  if (size == 0 || size % h->granule)
    return nf__backend_fail(&h->base, NF_ERR_INVALID, "host backend: va_reserve(%zu): size not a multiple of granule %llu",
                            size, (unsigned long long)h->granule);
  if (align & (align - 1))
    return nf__backend_fail(&h->base, NF_ERR_INVALID, "host backend: va_reserve: alignment %zu not a power of two", align);
  size_t a = align > h->granule ? align : (size_t)h->granule;
  size_t total = size + a; // over-reserve, then trim to the alignment
  if (total < size) return nf__backend_fail(&h->base, NF_ERR_INVALID, "host backend: va_reserve(%zu): too large", size);
  // Allocate the metadata first so that nothing can fail after mmap.
  if (!nf__host_grow((void **)&h->ranges, &h->capranges, h->nranges + 1, sizeof(va_range)))
    return nf__backend_fail(&h->base, NF_ERR_NOMEM, "host backend: out of host memory");
  uint32_t *slot = calloc(size / h->granule, sizeof(uint32_t)); // large callocs are lazily zeroed pages
  if (!slot) return nf__backend_fail(&h->base, NF_ERR_NOMEM, "host backend: out of host memory");
  void *p = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    free(slot);
    return nf__backend_fail(&h->base, NF_ERR_BACKEND, "host backend: va_reserve(%zu): mmap: %s", size, strerror(e));
  }
  uintptr_t raw = (uintptr_t)p, base = (raw + a - 1) & ~(uintptr_t)(a - 1);
  if (base > raw) munmap(p, base - raw);
  if (raw + total > base + size) munmap((void *)(base + size), raw + total - (base + size));
  size_t i = h->nranges;
  while (i > 0 && h->ranges[i - 1].base > base) i--;
  memmove(&h->ranges[i + 1], &h->ranges[i], (h->nranges - i) * sizeof(va_range));
  h->ranges[i] = (va_range){base, size, 0, slot};
  h->nranges++;
  *out = base;
  return NF_OK;
}

static nf_status_t va_release_locked(host_backend *h, uintptr_t va, size_t size) {
  size_t i = 0;
  while (i < h->nranges && h->ranges[i].base != va) i++;
  if (i == h->nranges)
    return nf__backend_fail(&h->base, NF_ERR_INVALID, "host backend: va_release(%#lx): not a reserved range", (unsigned long)va);
  va_range *r = &h->ranges[i];
  if (r->size != size)
    return nf__backend_fail(&h->base, NF_ERR_INVALID, "host backend: va_release(%#lx, %zu): range was reserved with size %zu",
                            (unsigned long)va, size, r->size);
  if (r->mapped)
    return nf__backend_fail(&h->base, NF_ERR_INVALID, "host backend: va_release(%#lx): %zu granules still mapped",
                            (unsigned long)va, r->mapped);
  if (munmap((void *)va, size) != 0)
    return nf__backend_fail(&h->base, NF_ERR_BACKEND, "host backend: va_release: munmap: %s", strerror(errno));
  free(r->slot);
  memmove(r, r + 1, (h->nranges - i - 1) * sizeof(va_range));
  h->nranges--;
  return NF_OK;
}

// ---------------------------------------------------------------- physical memory

// A free slot in recs[] (reused or appended), or NULL (out of host memory or
// at MAX_RECS). Under h->mu.
mem_rec *nf__host_rec_new(host_backend *h, uint32_t *idx) {
  if (!h->free_rec && (h->nrecs >= MAX_RECS || !nf__host_grow((void **)&h->recs, &h->caprecs, h->nrecs + 1, sizeof(mem_rec))))
    return NULL;
  if (h->free_rec) {
    *idx = h->free_rec - 1;
    h->free_rec = h->recs[*idx].next_free;
  } else {
    *idx = (uint32_t)h->nrecs++;
    h->recs[*idx].gen = 1;
  }
  return &h->recs[*idx];
}

static nf_status_t mem_create_locked(host_backend *h, nf_tier_t tier, size_t size, nf_handle_t *out) {
  nf_status_t st = check_tier(&h->base, tier);
  if (st != NF_OK) return st;
  // Any multiple of the granule is supported (contiguous memfd extent); the
  // allocator only ever asks for one granule.
  if (size == 0 || size % h->granule)
    return nf__backend_fail(&h->base, NF_ERR_INVALID, "host backend: mem_create(%zu): size not a multiple of granule %llu",
                            size, (unsigned long long)h->granule);
  if (getpid() != h->pid)
    return nf__backend_fail(&h->base, NF_ERR_INVALID,
                            "host backend: mem_create in a fork()ed child (pid %ld): the memory is process %ld's",
                            (long)getpid(), (long)h->pid);
  tier_state *t = &h->tiers[tier];
  if (size > h->capacity - t->created)
    return nf__backend_fail(&h->base, NF_ERR_OOM, "host backend: out of memory: %llu of %llu bytes created, %zu requested",
                            (unsigned long long)t->created, (unsigned long long)h->capacity, size);
  if ((st = tier_init(h, tier)) != NF_OK) return st;
  if (!h->free_rec && (h->nrecs >= MAX_RECS || !nf__host_grow((void **)&h->recs, &h->caprecs, h->nrecs + 1, sizeof(mem_rec))))
    return nf__backend_fail(&h->base, NF_ERR_NOMEM, "host backend: out of host memory");
  uint64_t off;
  if (!ext_alloc(t, size, &off))
    return nf__backend_fail(&h->base, NF_ERR_OOM, "host backend: out of memory: no contiguous %zu bytes free", size);
  uint32_t idx;
  mem_rec *r = nf__host_rec_new(h, &idx); // cannot fail: a slot was made above
  r->off = off;
  r->size = size;
  r->maps = 0;
  r->next_free = 0;
  r->ext_fd = -1;
  r->tier = (uint8_t)tier;
  r->state = REC_LIVE;
  t->created += size;
  h->live_granules += size / h->granule;
  *out = (uint64_t)r->gen << 32 | (idx + 1);
  return NF_OK;
}

static nf_status_t mem_release_locked(host_backend *h, nf_handle_t hd) {
  uint32_t idx;
  mem_rec *r = nf__host_rec_of(h, hd, &idx);
  if (!r) return nf__backend_fail(&h->base, NF_ERR_INVALID, "host backend: mem_release(%#llx): unknown or released handle",
                                  (unsigned long long)hd);
  if (r->maps == 0 && r->ext_fd >= 0) {
    rec_free(h, idx, true);
  } else if (r->maps == 0) {
    if (!ext_reserve(h, 1)) return nf__backend_fail(&h->base, NF_ERR_NOMEM, "host backend: out of host memory");
    if (!punch(h, r))
      return nf__backend_fail(&h->base, NF_ERR_BACKEND, "host backend: mem_release: fallocate: %s", strerror(errno));
    h->live_granules -= r->size / h->granule;
    rec_free(h, idx, false);
  } else {
    // CUDA defers the release of a mapped handle until its last unmap.
    r->state = REC_RELEASED;
    if (r->ext_fd < 0) h->live_granules -= r->size / h->granule;
  }
  return NF_OK;
}

// ---------------------------------------------------------------- mapping

static nf_status_t map_locked(host_backend *h, uintptr_t va, size_t size, nf_handle_t hd) {
  uint32_t idx;
  mem_rec *rec = nf__host_rec_of(h, hd, &idx);
  if (!rec) return nf__backend_fail(&h->base, NF_ERR_INVALID, "host backend: map(%#lx): unknown or released handle %#llx",
                                    (unsigned long)va, (unsigned long long)hd);
  if (size != rec->size)
    return nf__backend_fail(&h->base, NF_ERR_INVALID, "host backend: map(%#lx, %zu): handle size is %llu", (unsigned long)va,
                            size, (unsigned long long)rec->size);
  va_range *r;
  nf_status_t st = check_run(h, "map", va, size, &r);
  if (st != NF_OK) return st;
  size_t i0 = (va - r->base) / h->granule, n = size / h->granule;
  for (size_t i = i0; i < i0 + n; i++)
    if (r->slot[i])
      return nf__backend_fail(&h->base, NF_ERR_INVALID, "host backend: map(%#lx, %zu): granule %#lx already mapped",
                              (unsigned long)va, size, (unsigned long)(r->base + i * h->granule));
  if (h->max_maps && h->n_maps >= h->max_maps) return nf__host_fail_enomem(h, "map: mmap");
  int fd = rec->ext_fd >= 0 ? rec->ext_fd : h->tiers[rec->tier].fd;
  void *p = mmap((void *)va, size, PROT_NONE, MAP_SHARED | MAP_FIXED, fd, (off_t)rec->off);
  if (p == MAP_FAILED) {
    int e = errno;
    // A failed MAP_FIXED may have dropped the reservation: put it back.
    mmap((void *)va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (e == ENOMEM) return nf__host_fail_enomem(h, "map: mmap");
    return nf__backend_fail(&h->base, NF_ERR_BACKEND, "host backend: map: mmap: %s", strerror(e));
  }
  h->n_maps++;
  uint32_t s = (idx + 1) << 2;
  r->slot[i0] = s | SLOT_START;
  for (size_t i = i0 + 1; i < i0 + n; i++) r->slot[i] = s;
  rec->maps++;
  r->mapped += n;
  h->mapped_granules += n;
  return NF_OK;
}

static nf_status_t unmap_locked(host_backend *h, uintptr_t va, size_t size) {
  va_range *r;
  nf_status_t st = check_run(h, "unmap", va, size, &r);
  if (st != NF_OK) return st;
  size_t i0 = (va - r->base) / h->granule, end = i0 + size / h->granule, nmaps = 0;
  // Validate first: the run must be whole mappings, every granule mapped
  // (CUDA cannot unmap part of a mapping).
  for (size_t i = i0; i < end;) {
    uint32_t s = r->slot[i];
    if (!s || !(s & SLOT_START))
      return nf__backend_fail(&h->base, NF_ERR_INVALID, "host backend: unmap(%#lx, %zu): granule %#lx %s", (unsigned long)va,
                              size, (unsigned long)(r->base + i * h->granule),
                              s ? "is inside a mapping that starts before the range" : "is not mapped");
    size_t n = h->recs[SLOT_REC(s)].size / h->granule;
    if (n > end - i)
      return nf__backend_fail(&h->base, NF_ERR_INVALID, "host backend: unmap(%#lx, %zu): would cut the mapping at %#lx",
                              (unsigned long)va, size, (unsigned long)(r->base + i * h->granule));
    i += n;
    nmaps++;
  }
  if (!ext_reserve(h, nmaps)) return nf__backend_fail(&h->base, NF_ERR_NOMEM, "host backend: out of host memory");
  int e = nf__host_reserve_again(h, va, size);
  if (e) return e == ENOMEM ? nf__host_fail_enomem(h, "unmap: mmap")
                            : nf__backend_fail(&h->base, NF_ERR_BACKEND, "host backend: unmap: mmap: %s", strerror(e));
  h->n_maps -= nmaps;
  if (h->nuses) nf__host_uses_check(h, va, size);
  for (size_t i = i0; i < end;) {
    uint32_t idx = SLOT_REC(r->slot[i]);
    mem_rec *rec = &h->recs[idx];
    size_t n = rec->size / h->granule;
    memset(&r->slot[i], 0, n * sizeof(uint32_t));
    i += n;
    if (--rec->maps == 0 && rec->state == REC_RELEASED) rec_free(h, idx, !punch(h, rec)); // deferred release
  }
  r->mapped -= end - i0;
  h->mapped_granules -= end - i0;
  return NF_OK;
}

static nf_status_t set_access_locked(host_backend *h, uintptr_t va, size_t size) {
  va_range *r;
  nf_status_t st = check_run(h, "set_access", va, size, &r);
  if (st != NF_OK) return st;
  size_t i0 = (va - r->base) / h->granule, end = i0 + size / h->granule;
  for (size_t i = i0; i < end; i++)
    if (!r->slot[i])
      return nf__backend_fail(&h->base, NF_ERR_INVALID, "host backend: set_access(%#lx, %zu): granule %#lx is not mapped",
                              (unsigned long)va, size, (unsigned long)(r->base + i * h->granule));
  if (mprotect((void *)va, size, PROT_READ | PROT_WRITE) != 0) {
    int e = errno;
    // mprotect goes mapping by mapping: one that failed midway (ENOMEM: a
    // split past vm.max_map_count) left those before it writable. The granules
    // that had no access get none back (they were PROT_NONE; a failed op
    // changes nothing).
    for (size_t i = i0, j; i < end; i = j) {
      for (j = i + 1; j < end && !(r->slot[j] & SLOT_ACCESS) == !(r->slot[i] & SLOT_ACCESS);) j++;
      if (!(r->slot[i] & SLOT_ACCESS)) (void)mprotect((void *)(r->base + i * h->granule), (j - i) * h->granule, PROT_NONE);
    }
    return e == ENOMEM ? nf__host_fail_enomem(h, "set_access: mprotect")
                       : nf__backend_fail(&h->base, NF_ERR_BACKEND, "host backend: set_access: mprotect: %s", strerror(e));
  }
  for (size_t i = i0; i < end; i++) r->slot[i] |= SLOT_ACCESS;
  return NF_OK;
}

// Addresses outside every reserved range are plain host memory (CUDA's
// unified addressing accepts host pointers); inside one, every granule
// touched must be mapped with access set, else the copy would fault.
static nf_status_t check_copy(host_backend *h, const char *what, uintptr_t p, size_t size) {
  if (p + size < p) return nf__backend_fail(&h->base, NF_ERR_INVALID, "host backend: copy: %s wraps around", what);
  size_t lo = 0, hi = h->nranges;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (h->ranges[mid].base <= p + size - 1) lo = mid + 1;
    else hi = mid;
  }
  for (size_t k = lo; k-- > 0;) { // ranges that start at or before the last byte
    va_range *r = &h->ranges[k];
    if (r->base + r->size <= p) break;
    uintptr_t a = p > r->base ? p : r->base, b = p + size < r->base + r->size ? p + size : r->base + r->size;
    for (size_t i = (a - r->base) / h->granule; i <= (b - 1 - r->base) / h->granule; i++)
      if (!(r->slot[i] & SLOT_ACCESS))
        return nf__backend_fail(&h->base, NF_ERR_INVALID, "host backend: copy: %s granule %#lx is not mapped with access",
                                what, (unsigned long)(r->base + i * h->granule));
  }
  return NF_OK;
}

// ---------------------------------------------------------------- ops

// Run a *_locked function under the backend's mutex and return its status.
#define LOCKED(h, expr) \
  do { pthread_mutex_lock(&(h)->mu); nf_status_t st_ = (expr); pthread_mutex_unlock(&(h)->mu); return st_; } while (0)

static nf_status_t granularity_locked(host_backend *h, nf_tier_t tier, size_t *out) {
  nf_status_t st = check_tier(&h->base, tier);
  if (st == NF_OK) *out = (size_t)h->granule;
  return st;
}

static nf_status_t capacity_locked(host_backend *h, nf_tier_t tier, uint64_t *total, uint64_t *free_bytes) {
  nf_status_t st = check_tier(&h->base, tier);
  if (st != NF_OK) return st;
  if (total) *total = h->capacity;
  if (free_bytes) *free_bytes = h->capacity - h->tiers[tier].created;
  return NF_OK;
}

static nf_status_t h_granularity(nf_backend_t *be, nf_tier_t tier, size_t *out) {
  LOCKED(hb(be), granularity_locked(hb(be), tier, out));
}
static nf_status_t h_capacity(nf_backend_t *be, nf_tier_t tier, uint64_t *total, uint64_t *free_bytes) {
  LOCKED(hb(be), capacity_locked(hb(be), tier, total, free_bytes));
}
static nf_status_t h_va_reserve(nf_backend_t *be, size_t size, size_t align, uintptr_t *out) {
  LOCKED(hb(be), va_reserve_locked(hb(be), size, align, out));
}
static nf_status_t h_va_release(nf_backend_t *be, uintptr_t va, size_t size) {
  LOCKED(hb(be), va_release_locked(hb(be), va, size));
}
static nf_status_t h_mem_create(nf_backend_t *be, nf_tier_t tier, size_t size, nf_handle_t *out) {
  LOCKED(hb(be), mem_create_locked(hb(be), tier, size, out));
}
static nf_status_t h_mem_release(nf_backend_t *be, nf_handle_t hd) { LOCKED(hb(be), mem_release_locked(hb(be), hd)); }
static nf_status_t h_map(nf_backend_t *be, uintptr_t va, size_t size, nf_handle_t hd) {
  LOCKED(hb(be), map_locked(hb(be), va, size, hd));
}
static nf_status_t h_unmap(nf_backend_t *be, uintptr_t va, size_t size) { LOCKED(hb(be), unmap_locked(hb(be), va, size)); }
static nf_status_t h_set_access(nf_backend_t *be, uintptr_t va, size_t size) {
  LOCKED(hb(be), set_access_locked(hb(be), va, size));
}

// Host copies are synchronous: the data has moved when copy returns, so any
// event recorded afterwards on the stream is (in automatic mode) complete.
// In manual mode the copy's ranges stay the stream's work in flight until
// such an event completes, as on a GPU (nf__host_copy_use).
static nf_status_t h_copy(nf_backend_t *be, uintptr_t dst, uintptr_t src, size_t size, nf_stream_t s) {
  if (size == 0) return NF_OK;
  host_backend *h = hb(be);
  pthread_mutex_lock(&h->mu);
  nf_status_t st = check_copy(h, "destination", dst, size);
  if (st == NF_OK) st = check_copy(h, "source", src, size);
  if (st == NF_OK) nf__host_copy_use(h, s, dst, src, size);
  pthread_mutex_unlock(&h->mu);
  if (st == NF_OK) memmove((void *)dst, (const void *)src, size);
  return st;
}

// ---------------------------------------------------------------- lifetime

// Frees everything, including what the user leaked: mappings, ranges, memfds, events.
static void h_destroy(nf_backend_t *be) {
  host_backend *h = hb(be);
  for (size_t i = 0; i < h->nranges; i++) {
    munmap((void *)h->ranges[i].base, h->ranges[i].size);
    free(h->ranges[i].slot);
  }
  if (h->spare) munmap(h->spare, h->page);
  for (int t = 0; t < NTIERS; t++) {
    if (h->tiers[t].fd >= 0) close(h->tiers[t].fd);
    free(h->tiers[t].free);
  }
  while (h->events) nf__host_event_free(h, h->events);
  nf__host_uses_free(h);
  for (size_t i = 0; i < h->nrecs; i++)
    if (h->recs[i].state != REC_FREE && h->recs[i].ext_fd >= 0) close(h->recs[i].ext_fd);
  free(h->ranges);
  free(h->recs);
  pthread_mutex_destroy(&h->mu);
  free(h);
}

static const nf_backend_ops_t host_ops = {
    .name = "host",           .granularity = h_granularity,   .capacity = h_capacity,
    .va_reserve = h_va_reserve, .va_release = h_va_release,   .mem_create = h_mem_create,
    .mem_release = h_mem_release, .map = h_map,               .unmap = h_unmap,
    .set_access = h_set_access, .copy = h_copy,               .event_create = nf__host_event_create,
    .event_destroy = nf__host_event_destroy, .event_record = nf__host_event_record, .event_query = nf__host_event_query,
    .event_sync = nf__host_event_sync, .stream_wait = nf__host_stream_wait, .sync = nf__host_sync, .destroy = h_destroy,
    .mem_export = nf__host_mem_export, .mem_import = nf__host_mem_import, .map_room = nf__host_map_room,
};

NF_API nf_status_t nf_backend_host_create(nf_backend_t **out, uint64_t capacity, uint64_t granule) {
  if (!out) return nf__error(NF_ERR_INVALID, "host backend: NULL output pointer");
  *out = NULL;
  long page = sysconf(_SC_PAGESIZE);
  if (granule == 0 || (granule & (granule - 1)) || granule < (uint64_t)page || granule > SIZE_MAX / 2)
    return nf__error(NF_ERR_INVALID, "host backend: granule %llu B is not a power of two of at least the page size (%ld B)",
                     (unsigned long long)granule, page);
  if (capacity < granule || capacity > (uint64_t)INT64_MAX)
    return nf__error(NF_ERR_INVALID, "host backend: capacity %llu B is below one granule (%llu B) or too large",
                     (unsigned long long)capacity, (unsigned long long)granule);
  host_backend *h = calloc(1, sizeof *h);
  if (!h) return nf__error(NF_ERR_NOMEM, "host backend: out of host memory");
  if (pthread_mutex_init(&h->mu, NULL) != 0) {
    free(h);
    return nf__error(NF_ERR_NOMEM, "host backend: pthread_mutex_init failed");
  }
  h->base.ops = &host_ops;
  h->capacity = capacity;
  h->granule = granule;
  const char *mm = getenv("NOFRAG_HOST_MAX_MAPS"); // tests: a small stand-in for vm.max_map_count
  if (mm && *mm) h->max_maps = strtoull(mm, NULL, 10);
  nf__host_map_bound_init(); // now, not at the bound (fopen allocates)
  h->page = (size_t)page;
  h->pid = getpid();
  h->spare = nf__host_spare_new(h); // unmap's way out at the mapping bound (nf__host_reserve_again)
  for (int t = 0; t < NTIERS; t++) h->tiers[t].fd = -1; // memfds are made on first use
  *out = &h->base;
  return NF_OK;
}

host_backend *nf__host_of(nf_backend_t *be) {
  while (be && be->ops != &host_ops) be = be->inner; // through fault wrappers
  return be ? hb(be) : NULL;
}

NF_API void nf_backend_host_usage(nf_backend_t *be, uint64_t *granules, uint64_t *mappings) {
  host_backend *h = nf__host_of(be);
  uint64_t g = 0, m = 0;
  if (h) {
    pthread_mutex_lock(&h->mu);
    g = h->live_granules;
    m = h->mapped_granules;
    pthread_mutex_unlock(&h->mu);
  }
  if (granules) *granules = g;
  if (mappings) *mappings = m;
}
