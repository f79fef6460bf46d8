// A pool's size and lifetime. nf__core_create / nf__core_destroy (which
// src/nofrag.c wraps with the layers above): the configuration resolved
// against the backend (granule, limit, address-range size, release
// threshold, host tier), what cannot work refused before anything is
// created. nf_set_limit, nf_reserve and nf_trim change later the granules a
// pool may hold or holds; nf_pool_config reads the resolved configuration.
// The allocation hot path is pool.c; vmm.c finds and releases what trim and
// limits give back.
#include "core/core.h"

#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <time.h>

// A granule's bookkeeping in host memory: the pool's granule table and the
// backend's record of it, ~100 B measured on the host backend, with room for
// the tables' doubling. A reserve needing more than half the machine's RAM
// for it alone is refused before anything is made: it would not fail (Linux
// overcommits) but get the process killed by the kernel's OOM killer part way
// (host_capacity:1PiB,reserve:1PiB: 512 Mi granules, ~64 GiB of tables).
#define NF_GRANULE_BOOKKEEPING 128
static bool bookkeeping_fits(uint64_t granules, uint64_t *ram) {
  struct sysinfo si;
  if (sysinfo(&si) != 0) return true; // unknown: let the tables' own allocation decide
  *ram = (uint64_t)si.totalram * si.mem_unit;
  return granules <= *ram / 2 / NF_GRANULE_BOOKKEEPING;
}
static nf_status_t bookkeeping_refuse(nf_status_t st, const char *key, uint64_t bytes, uint64_t granules,
                                      uint64_t granule, uint64_t ram) {
  char rb[32], gb[32], bb[32], mb[32];
  nf__fmt_bytes(rb, sizeof rb, bytes);
  nf__fmt_bytes(gb, sizeof gb, granule);
  nf__fmt_bytes(bb, sizeof bb, granules * NF_GRANULE_BOOKKEEPING);
  nf__fmt_bytes(mb, sizeof mb, ram);
  return nf__error(st, "nofrag: %s %s is %llu granules of %s, whose bookkeeping alone would take ~%s of host "
                   "memory, more than half of this machine's %s: use a larger granule or a smaller %s", key, rb,
                   (unsigned long long)granules, gb, bb, mb, key);
}

// ------------------------------------------------------------------ lifetime

void nf__core_destroy(nf_pool_t *p) {
  if (p->hot) nf__hot_settle(p);
  nf__privs_destroy(p);
  nf__streams_destroy(p);
  nf__chunks_destroy(p);
  nf__blocks_destroy(p);
  nf_backend_t *owned = p->owned_be;
  free(p);
  if (owned) nf_backend_destroy(owned);
}

static uint64_t clock_monotonic(void *ctx) {
  (void)ctx;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t resolve_threshold(uint64_t thr, uint64_t limit, bool explicit_limit) {
  // Auto: under a limit the user set, never -- the limit is the pool's
  // budget, and giving granules back only to re-create them at the next
  // peak costs driver calls every step (measured on H200: a GPT-2 run at a
  // cap released 25 GiB after a short step and re-created them in the next,
  // 0.7-1.1 s per step instead of 0.1-0.25). Without a limit (the device's
  // capacity): a quarter of it, so that a training step's swing between its
  // peak and its trough stays cached while other processes can get the rest.
  if (thr != NF_RELEASE_AUTO) return thr;
  return explicit_limit ? NF_RELEASE_NEVER : limit / 4;
}

// The limit "0" stands for: the backend's capacity, at most the bound on sizes.
static uint64_t capacity_limit(uint64_t total) { return total < NF_CONFIG_MAX_BYTES ? total : NF_CONFIG_MAX_BYTES; }

nf_status_t nf__core_create(nf_pool_t **out, nf_backend_t *be, const nf_config_t *cfg) {
  *out = NULL;
  size_t bg = 0;
  nf_status_t st = be->ops->granularity(be, NF_TIER_DEVICE, &bg);
  if (st != NF_OK) return nf__error(st, "nofrag: backend granularity: %s", nf__backend_err());
  uint64_t g = cfg->granule ? cfg->granule : bg;
  if ((st = nf__config_check(cfg)) != NF_OK) return st;
  if (!bg || (g & (g - 1)) || g % bg)
    return nf__error(NF_ERR_CONFIG, "nofrag: granule %llu B is not a power-of-two multiple of the backend's %zu B",
                     (unsigned long long)g, bg);
  uint64_t total = 0, avail = 0;
  st = be->ops->capacity(be, NF_TIER_DEVICE, &total, &avail);
  if (st != NF_OK) return nf__error(st, "nofrag: backend capacity: %s", nf__backend_err());
  nf_pool_t *p = calloc(1, sizeof *p);
  if (!p) return nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
  p->be = be;
  p->cfg = *cfg;
  p->granule = g;
  p->gshift = (uint32_t)__builtin_ctzll(g);
  uint64_t limit = cfg->limit ? cfg->limit : capacity_limit(total);
  p->cfg.limit = limit & ~(g - 1);
  p->cfg.granule = g;
  p->max_granules = p->cfg.limit >> p->gshift;
  p->cfg.release_threshold = resolve_threshold(cfg->release_threshold, p->cfg.limit, cfg->limit != 0);
  p->release_auto = cfg->release_threshold == NF_RELEASE_AUTO;
  p->clock = clock_monotonic;
  p->vw_release = nf__release_viewed; // (a hook: stream.c lies below views and edge sharing)
  if (!p->cfg.va_chunk) {
    uint64_t v = p->cfg.limit > (NF_GiB << 8) ? NF_GiB << 10 : p->cfg.limit * 4;
    p->cfg.va_chunk = v < NF_GiB ? NF_GiB : v;
  }
  p->cfg.va_chunk = (p->cfg.va_chunk + g - 1) & ~(g - 1);
  if ((p->cfg.va_chunk >> p->gshift) > NF_CHUNK_MAX_GRANULES) {
    char vb[32], gb[32];
    nf__fmt_bytes(vb, sizeof vb, p->cfg.va_chunk);
    nf__fmt_bytes(gb, sizeof gb, g);
    free(p);
    return nf__error(NF_ERR_CONFIG, "nofrag: va_chunk %s is %llu granules of %s, above the %llu one address range "
                     "may hold: use a smaller va_chunk or a larger granule", vb,
                     (unsigned long long)(cfg->va_chunk >> __builtin_ctzll(g)), gb,
                     (unsigned long long)NF_CHUNK_MAX_GRANULES);
  }
  p->cfg.small_max = (p->cfg.small_max + NF_ALIGN - 1) & ~(NF_ALIGN - 1);
  p->gran_free = p->gran_unused = p->host_free = p->un_loose = -1;
  p->disk_fd = -1;
  // Host tier for spill and offload: spill_limit, else what the backend says
  // the host has. A backend without a host tier can still serve the device.
  uint64_t htotal = 0;
  if (be->ops->capacity(be, NF_TIER_HOST, &htotal, NULL) != NF_OK) htotal = 0;
  p->max_host_granules = (cfg->spill_limit ? cfg->spill_limit : htotal) >> p->gshift;
  if (cfg->spill && !p->max_host_granules) {
    free(p);
    return nf__error(NF_ERR_CONFIG, "nofrag: spill:host needs host memory, but %s",
                     htotal ? "spill_limit is below one granule" : "the backend has no host tier");
  }
  if (!p->max_granules) {
    free(p);
    return nf__error(NF_ERR_CONFIG, "nofrag: limit %llu B is below one granule (%llu B)",
                     (unsigned long long)limit, (unsigned long long)g);
  }
  if (cfg->reserve > p->cfg.limit) { // name the key and both sizes before creating anything
    char rb[32], lb[32];
    nf__fmt_bytes(rb, sizeof rb, cfg->reserve);
    nf__fmt_bytes(lb, sizeof lb, p->cfg.limit);
    free(p);
    return nf__error(NF_ERR_CONFIG, "nofrag: reserve %s (%llu B) exceeds the pool's limit %s (%llu B, %s)", rb,
                     (unsigned long long)cfg->reserve, lb, (unsigned long long)limit & ~(g - 1),
                     cfg->limit ? "the limit key rounded to whole granules" : "no limit given: the backend's capacity");
  }
  if (((cfg->spill_reserve + g - 1) >> p->gshift) > p->max_host_granules) { // likewise, as reserve's
    char rb[32], lb[32];
    nf__fmt_bytes(rb, sizeof rb, cfg->spill_reserve);
    nf__fmt_bytes(lb, sizeof lb, p->max_host_granules << p->gshift);
    free(p);
    return nf__error(NF_ERR_CONFIG, "nofrag: spill_reserve %s (%llu B) exceeds the host tier's limit %s (%s)", rb,
                     (unsigned long long)cfg->spill_reserve, lb,
                     cfg->spill_limit ? "spill_limit, in whole granules" : "no spill_limit: the host tier's capacity");
  }
  uint64_t ram = 0;
  for (int k = 0; k < 2; k++) { // reserve, spill_reserve: their tables must fit in host memory
    uint64_t bytes = k ? cfg->spill_reserve : cfg->reserve, n = (bytes + g - 1) >> p->gshift;
    if (n && !bookkeeping_fits(n, &ram)) {
      free(p);
      return bookkeeping_refuse(NF_ERR_CONFIG, k ? "spill_reserve" : "reserve", bytes, n, g, ram);
    }
  }
  if (cfg->reserve && (st = nf__granules_create(p, (cfg->reserve + g - 1) >> p->gshift)) != NF_OK) {
    if (st == NF_ERR_OOM) nf__error(st, "nofrag: reserve %llu B exceeds the limit %llu B",
                                    (unsigned long long)cfg->reserve, (unsigned long long)p->cfg.limit);
    nf__core_destroy(p);
    return st;
  }
  if (cfg->spill_reserve && (st = nf__host_granules_create(p, (cfg->spill_reserve + g - 1) >> p->gshift)) != NF_OK) {
    if (st == NF_ERR_OOM) nf__error(st, "nofrag: spill_reserve %llu B exceeds the host tier's limit %llu B (spill_limit)",
                                    (unsigned long long)cfg->spill_reserve,
                                    (unsigned long long)(p->max_host_granules << p->gshift));
    nf__core_destroy(p);
    return st;
  }
  *out = p;
  return NF_OK;
}

// ------------------------------------------------------------------ capacity

nf_status_t nf_trim(nf_pool_t *p) {
  if (!p) return nf__error(NF_ERR_INVALID, "nofrag: nf_trim: NULL pool");
  nf__pool_lock(p);
  if (p->capture_mask) { // trim waits for the streams: not while one is captured
    nf__pool_unlock(p);
    return nf__error(NF_ERR_INVALID, "nofrag: nf_trim: a stream is being captured (nf_private_begin); trim after nf_private_end");
  }
  nf_status_t st = p->tier.poll ? p->tier.poll(p, true) : NF_OK;
  if (st == NF_OK) st = nf__pending_poll(p, true);
  if (st == NF_OK) nf__unmap_cached(p, UINT64_MAX, true, NULL, 0, 0, -1, &st);
  // Parked views are extra mappings, not memory to retain: they go even
  // where `retain` keeps every granule (granules_release evicts only when
  // it has granules to give back).
  if (st == NF_OK && p->vw_count) nf__view_evict(p, UINT64_MAX, true, &st);
  if (st == NF_OK) st = nf__granules_release(p, p->cfg.retain >> p->gshift);
  if (st == NF_OK) nf__host_granules_release(p, p->cfg.spill_reserve >> p->gshift);
  if (st == NF_OK) nf__chunks_drop_empty(p);
  p->host_sweep = false;
  nf__pub_full(p);
  nf__pool_unlock(p);
  return st;
}

nf_status_t nf_reserve(nf_pool_t *p, uint64_t bytes) {
  if (!p) return nf__error(NF_ERR_INVALID, "nofrag: nf_reserve: NULL pool");
  nf__pool_lock(p);
  nf_status_t st = NF_OK;
  if (bytes > p->cfg.limit) {
    st = nf__error(NF_ERR_OOM, "nofrag: reserve %llu B exceeds the limit %llu B", (unsigned long long)bytes,
                   (unsigned long long)p->cfg.limit);
  } else {
    uint64_t want = (bytes + p->granule - 1) >> p->gshift, dev0 = p->gran_created, ram = 0;
    if (!bookkeeping_fits(want, &ram)) {
      st = bookkeeping_refuse(NF_ERR_NOMEM, "reserve", bytes, want, p->granule, ram);
      nf__pool_unlock(p);
      return st;
    }
    p->fx++; // more granules: placement's `tight` test may change (bin_pop)
    if (want > p->gran_created) st = nf__granules_create(p, want - p->gran_created);
    if (st != NF_OK) nf__granules_unmake(p, dev0, p->host_created); // all or nothing
  }
  nf__pub_full(p);
  nf__pool_unlock(p);
  return st;
}

nf_status_t nf_set_limit(nf_pool_t *p, uint64_t limit) {
  if (!p) return nf__error(NF_ERR_INVALID, "nofrag: nf_set_limit: NULL pool");
  bool explicit_limit = limit != 0;
  uint64_t total = 0, avail = 0;
  if (!limit) {
    nf_status_t st = p->be->ops->capacity(p->be, NF_TIER_DEVICE, &total, &avail);
    if (st != NF_OK) return nf__error(st, "nofrag: backend capacity: %s", nf__backend_err());
    limit = capacity_limit(total);
  }
  if (limit > NF_CONFIG_MAX_BYTES)
    return nf__error(NF_ERR_CONFIG, "nofrag: limit %llu B exceeds the maximum of 1 PiB (%llu B)",
                     (unsigned long long)limit, (unsigned long long)NF_CONFIG_MAX_BYTES);
  if (limit < p->granule)
    return nf__error(NF_ERR_CONFIG, "nofrag: limit %llu B is below one granule", (unsigned long long)limit);
  nf__pool_lock(p);
  uint64_t old_limit = p->cfg.limit, old_threshold = p->cfg.release_threshold;
  p->cfg.limit = limit & ~(p->granule - 1);
  p->max_granules = p->cfg.limit >> p->gshift;
  p->fx++; // placement's `tight` test may change (bin_pop)
  if (p->release_auto) p->cfg.release_threshold = resolve_threshold(NF_RELEASE_AUTO, p->cfg.limit, explicit_limit);
  nf_status_t st = NF_OK;
  if (p->gran_created > p->max_granules) {
    // Existing granules above the new limit: give back what is not live.
    st = nf__granules_release(p, p->max_granules);
    if (st == NF_OK && p->gran_created > p->max_granules) {
      nf__unmap_cached(p, p->gran_created - p->max_granules, true, NULL, 0, 0, NF_TIER_DEVICE, &st);
      if (st == NF_OK) st = nf__granules_release(p, p->max_granules);
    }
  }
  if (st != NF_OK) { // a failing call changes nothing the caller sees (what went back stays back: cache)
    p->cfg.limit = old_limit;
    p->max_granules = old_limit >> p->gshift;
    p->cfg.release_threshold = old_threshold;
  }
  nf__pub_full(p);
  nf__pool_unlock(p);
  return st;
}

void nf_pool_config(nf_pool_t *p, nf_config_t *cfg) {
  if (!p || !cfg) {
    if (cfg) memset(cfg, 0, sizeof *cfg);
    nf__error(NF_ERR_INVALID, "nofrag: nf_pool_config: NULL argument");
    return;
  }
  nf__pool_lock(p);
  *cfg = p->cfg;
  nf__pool_unlock(p);
}

void nf_pool_set_clock(nf_pool_t *p, uint64_t (*now_ns)(void *ctx), void *ctx) {
  if (!p) return;
  nf__pool_lock(p);
  p->clock = now_ns ? now_ns : clock_monotonic;
  p->clock_ctx = now_ns ? ctx : NULL;
  p->rel_frees = 0; // an epoch's start was read on the old clock
  nf__pool_unlock(p);
}
