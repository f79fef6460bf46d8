// Soak: the whole allocator with every feature on at once (host backend),
// against a reference model. Random operations -- allocations of 512 B to
// 64 MiB (many small, some large, sizes repeating so that bins and views are
// reused; training steps), frees (with record_stream and simulated stream
// work), offload and prefetch to the three tiers, limit changes, trim,
// nf_reserve, private pools (routes, captures, graph replays over their
// freed ranges, hand-back, nf_alloc_at restores), bad frees -- under a small
// limit with spill on, so that stitching, views, eviction and spill really
// happen. After every operation: nf_pool_check, the live figures against the
// model, no two live blocks overlap, the touched blocks' patterns, a failing
// call's own message, the OOM guarantee, and the host backend's stream
// checks: no range unmapped under a stream's work, no memory (address or
// physical) handed to a stream not ordered after its last users. Every 16
// operations every readable block's pattern and tiers. A variant runs under
// a fault backend: a failing call leaves the model's view of the pool as it
// was. NF_SOAK_SEEDS / NF_SOAK_OPS / NF_SOAK_FIRST scale the runs,
// NF_SOAK_SEED=n runs seed n alone (a failure prints its seed),
// NF_SOAK_VERBOSE / NF_SOAK_DEBUG print the configurations / every operation,
// NF_SOAK_BURSTS=0 leaves out the faults pass's bursts of failures (burst()).
// The model of the pool and the checks against it: soak_model.h; here the
// operations that drive both, and the runs.
#include "soak_model.h"

#include <signal.h>

static nf_stats_t totals; // summed over every run, for the coverage assertions
static struct sigaction old_segv;

static void on_segv(int sig) {
  fprintf(stderr, "test_soak: signal %d at seed %llu step %d (NF_SOAK_SEED=%llu reproduces)\n", sig,
          U(cur_seed), cur_step, U(cur_seed));
  sigaction(SIGSEGV, &old_segv, NULL);
  raise(sig);
}

static uint64_t env_u64(const char *name, uint64_t dflt) {
  const char *v = getenv(name);
  return v && *v ? strtoull(v, NULL, 0) : dflt;
}

// Sizes: many small, some large, a quarter of them from a per-seed set so
// that exact sizes repeat (bins, views at the same places). Sizes are for 2
// MiB granules; with smaller granules those above 64 KiB shrink alike.
static size_t pick_size(soak_t *s) {
  static const size_t common[] = {512, 4096, 10000, 65536, 300000, 1 << 20, 3 << 20, 2 * MiB - 512, 8 * MiB, 24 * MiB};
  size_t n;
  uint64_t r = rnd(s, 100);
  if (rnd(s, 4) == 0) n = common[(s->seed + rnd(s, 5)) % 10];
  else n = r < 55 ? 512 + rnd(s, 64 * KiB) : r < 82 ? 64 * KiB + rnd(s, 2 * MiB) : r < 96 ? 2 * MiB + rnd(s, 14 * MiB)
                                                                                     : 16 * MiB + rnd(s, 48 * MiB);
  if (n > 64 * KiB && s->granule < 2 * MiB) n = n / (2 * MiB / s->granule) + (n & 511); // odd sizes stay odd
  return n;
}

static void op_alloc(soak_t *s) {
  int i = free_slot(s), si = (int)rnd(s, NSTREAMS);
  if (i < 0) return;
  size_t n = pick_size(s);
  uint64_t id = 0;
  void *q;
  if (rnd(s, 10) == 0 && s->refs[id = 1 + rnd(s, NPRIV - 1)] > 0) {
    s->op = "alloc_private";
    q = nf_alloc_private(s->p, id, n > 8 * MiB ? n / 8 : n, s->st[si]);
    n = n > 8 * MiB ? n / 8 : n;
  } else {
    s->op = "alloc";
    id = routed(s, si);
    q = nf_alloc(s->p, n, s->st[si]);
  }
  if (q) add_block(s, i, q, n, si, id);
  else if (!strcmp(s->op, "alloc")) alloc_failed(s, n);
  else if (fresh(s, nf_last_status()), s->fault_p == 0 && nf_last_status() != NF_ERR_OOM) SOAK_FAIL(s, "%s", nf_last_error());
}

// Re-create a recently freed block where it was (a checkpoint restore).
static void op_alloc_at(soak_t *s) {
  s->op = "alloc_at";
  int i = free_slot(s), si = (int)rnd(s, NSTREAMS);
  if (i < 0 || !s->nfr) return;
  freed_t f = s->fr[rnd(s, (uint64_t)s->nfr)];
  if (f.id && !s->refs[f.id]) return;
  void *q = nf_alloc_at(s->p, f.id, f.p, f.n, s->st[si]);
  if (q) {
    if (q != f.p) SOAK_FAIL(s, "nf_alloc_at(%p) returned %p", f.p, q);
    add_block(s, i, q, f.n, si, f.id);
    return;
  }
  nf_status_t st = nf_last_status();
  if (st == NF_OK || !nf_last_error()[0]) SOAK_FAIL(s, "failed nf_alloc_at without status or message");
  fresh(s, st);
  if (s->fault_p == 0 && st != NF_ERR_OOM && st != NF_ERR_INVALID)
    SOAK_FAIL(s, "nf_alloc_at failed with %s: %s", nf_status_str(st), nf_last_error());
}

// A graph replay: junk written over every range its private pool freed (not
// live again): it must not show in any live block (each pool's freed memory
// is handed to no one else while the pool exists).
static void op_replay(soak_t *s) {
  s->op = "replay";
  for (int i = 0; i < s->nfr; i++) {
    freed_t *f = &s->fr[i];
    bool live = false;
    for (int k = 0; k < MAXB && !live; k++) live = s->b[k].p && overlaps(s->b[k].p, rsz(s->b[k].n), f->p, f->n);
    if (f->replay && !live) nft_fill(f->p, f->n, 0xdead0000 + (uint64_t)i);
  }
  verify(s, true);
}

static void op_free(soak_t *s) {
  s->op = "free";
  int i = live_slot(s, false);
  if (i < 0) return;
  blk_t *b = &s->b[i];
  s->last = i;
  if (readable(s, b) && !nft_check(b->p, b->n, b->tag)) SOAK_FAIL(s, "block %d lost its data before its free", i);
  if (!b->where && rnd(s, 3) == 0) { // used on another stream too
    int x = (int)rnd(s, NSTREAMS);
    s->op = "record_stream+free";
    nf_status_t st = nf_record_stream(s->p, b->p, s->st[x]);
    s->last_s = x;
    fresh(s, st);
    if (st == NF_OK) use(s, i, x);
    else if (s->fault_p == 0) SOAK_FAIL(s, "nf_record_stream: %s", nf_last_error());
  }
  nf_status_t st = nf_free(s->p, b->p);
  fresh(s, st);
  if (st != NF_OK) {
    if (s->fault_p == 0 || st != NF_ERR_BACKEND) SOAK_FAIL(s, "nf_free: %s: %s", nf_status_str(st), nf_last_error());
    check_block(s, i); // still live and intact
    return;
  }
  bool away = b->where == NF_TIER_DISK || b->where == NF_TIER_HOST_DETACHED; // its range stays unmapped
  if (away) unreplay(s, 0, b->p, b->n);
  s->fr[s->nfr < NFREED ? s->nfr++ : (int)rnd(s, NFREED)] = (freed_t){b->p, b->n, b->priv, b->priv && !away};
  b->p = NULL;
}

// Bad frees change nothing: an interior pointer, a pointer freed already
// (unless a live block starts there again), a foreign one with the probe flag.
static void op_bad_free(soak_t *s) {
  s->op = "bad_free";
  int i = live_slot(s, false);
  char local;
  if (nf_free_ex(s->p, &local, NULL, NF_FREE_PROBE) != NF_ERR_FOREIGN) SOAK_FAIL(s, "foreign pointer not foreign");
  if (i >= 0 && s->b[i].n > 512) {
    s->last = i;
    size_t got = 1;
    if (nf_free_ex(s->p, (char *)s->b[i].p + 512, &got, NF_FREE_PROBE) != NF_ERR_INVALID || got)
      SOAK_FAIL(s, "interior free accepted");
    if (nf_block_size(s->p, (char *)s->b[i].p + 512)) SOAK_FAIL(s, "interior pointer has a size");
  }
  if (!s->nfr) return;
  void *q = s->fr[rnd(s, (uint64_t)s->nfr)].p;
  for (int k = 0; k < MAXB; k++)
    if (s->b[k].p == q) return;
  if (nf_free(s->p, q) != NF_ERR_INVALID) SOAK_FAIL(s, "double free of %p accepted", q);
}

// More stream work on a live resident block, on its stream or (record_stream) another.
static void op_use(soak_t *s) {
  s->op = "use";
  int i = live_slot(s, true);
  if (i < 0) return;
  int x = (int)rnd(s, NSTREAMS);
  s->last = i, s->last_s = x;
  if (x != s->b[i].s) {
    nf_status_t st = nf_record_stream(s->p, s->b[i].p, s->st[x]);
    fresh(s, st);
    if (st != NF_OK) {
      if (s->fault_p == 0) SOAK_FAIL(s, "nf_record_stream: %s", nf_last_error());
      return;
    }
  }
  use(s, i, x);
  if (rnd(s, 2) && !nft_unready(s->p, s->b[i].p)) { // the kernel writes new contents
    s->b[i].tag = ++s->tag, s->b[i].lost = false;
    nft_fill(s->b[i].p, s->b[i].n, s->b[i].tag);
  }
}

static void op_offload(soak_t *s) {
  s->op = "offload";
  int i = live_slot(s, true);
  if (i < 0 || capturing(s)) return;
  static const nf_tier_t tiers[] = {NF_TIER_HOST, NF_TIER_HOST_DETACHED, NF_TIER_HOST, NF_TIER_HOST_DETACHED,
                                    NF_TIER_DISK};
  nf_tier_t t = tiers[rnd(s, 5)];
  int si = rnd(s, 3) ? s->b[i].s : (int)rnd(s, NSTREAMS);
  s->last = i, s->last_s = si;
  nf_status_t st = nf_offload(s->p, s->b[i].p, s->st[si], t);
  fresh(s, st);
  if (st == NF_OK) s->b[i].where = (int)t;
  else if (s->fault_p == 0 && st != NF_ERR_OOM) SOAK_FAIL(s, "nf_offload: %s: %s", nf_status_str(st), nf_last_error());
  else losses(s);
  check_block(s, i);
}

static void op_prefetch(soak_t *s) {
  s->op = "prefetch";
  int i = -1;
  for (int k = 0, j = (int)rnd(s, MAXB); k < MAXB && i < 0; k++, j = (j + 1) % MAXB)
    if (s->b[j].p && (s->b[j].where || rnd(s, 8) == 0)) i = j; // mostly offloaded ones; resident: spilled granules
  if (i < 0 || capturing(s)) return;
  int si = rnd(s, 2) ? s->b[i].s : (int)rnd(s, NSTREAMS);
  s->last = i, s->last_s = si;
  nf_status_t st = nf_prefetch(s->p, s->b[i].p, s->st[si]);
  fresh(s, st);
  if (st == NF_OK) s->b[i].where = 0;
  else if (s->fault_p == 0 && st != NF_ERR_OOM) SOAK_FAIL(s, "nf_prefetch: %s: %s", nf_status_str(st), nf_last_error());
  else losses(s);
  if (st != NF_OK && getenv("NF_SOAK_DEBUG")) fprintf(stderr, "  prefetch: %s\n", nf_last_error());
  check_block(s, i);
}

static void op_limit(soak_t *s) {
  s->op = "set_limit";
  nf_stats_t st;
  nf_stats_get(s->p, &st);
  uint64_t lim = s->limit;
  if (rnd(s, 2)) { // down to near the live granules
    uint64_t near = (st.live_granules + 1 + rnd(s, 8)) * s->granule;
    lim = near < s->limit ? near : s->limit;
  }
  nf_status_t r = nf_set_limit(s->p, lim);
  fresh(s, r);
  nf_config_t c;
  nf_pool_config(s->p, &c);
  if (r != NF_OK && c.limit != st.limit) SOAK_FAIL(s, "failed nf_set_limit moved the limit to %llu", U(c.limit));
  if (r != NF_OK && s->fault_p == 0) SOAK_FAIL(s, "nf_set_limit(%llu): %s", U(lim), nf_last_error());
}

static void op_trim(soak_t *s) {
  nf_status_t r;
  uint64_t id = 1 + rnd(s, NPRIV - 1);
  if (rnd(s, 3) == 0 && s->refs[id]) {
    s->op = "private_trim";
    if ((r = nf_private_trim(s->p, id)) == NF_OK || s->fault_p > 0) unreplay(s, id, NULL, 0); // may unmap some
  }
  else if (rnd(s, 4) == 0) s->op = "reserve", r = nf_reserve(s->p, rnd(s, s->limit));
  else s->op = "trim", r = nf_trim(s->p);
  fresh(s, r);
  if (r == NF_OK || s->fault_p > 0) return;
  if (capturing(s) && r == NF_ERR_INVALID && strcmp(s->op, "reserve")) return; // documented
  if (!strcmp(s->op, "reserve") && r == NF_ERR_OOM) return;
  SOAK_FAIL(s, "%s: %s", nf_last_error(), nf_status_str(r));
}

// Private pools: a user more or less, a route (capture or thread) begun or ended.
static void op_private(soak_t *s) {
  uint64_t id = 1 + rnd(s, NPRIV - 1);
  nf_status_t r = NF_OK;
  switch (rnd(s, 4)) {
  case 0:
    s->op = "private_incref";
    if (s->refs[id] < 2 && (r = nf_private_incref(s->p, id)) == NF_OK) s->refs[id]++;
    break;
  case 1:
    s->op = "private_release";
    if (!s->refs[id]) return;
    if ((r = nf_private_release(s->p, id)) != NF_OK) break;
    if (--s->refs[id]) break;
    s->route_s[id] = -1; // handed back: its blocks and ranges are the general pool's now
    for (int i = 0; i < MAXB; i++)
      if (s->b[i].p && s->b[i].priv == id) s->b[i].priv = 0;
    for (int i = 0; i < s->nfr; i++)
      if (s->fr[i].id == id) s->fr[i].id = 0, s->fr[i].replay = false;
    break;
  case 2:
    s->op = "private_begin";
    if (!s->refs[id] || s->route_s[id] != -1) return;
    {
      int si = (int)rnd(s, NSTREAMS + 1);
      if (si == NSTREAMS) r = nf_private_begin_thread(s->p, id), si = -2;
      else if (captured(s, si)) return;
      else r = nf_private_begin(s->p, id, s->st[si]);
      if (r == NF_OK) s->route_s[id] = si, s->route_age[id] = ++s->age;
    }
    break;
  default:
    s->op = "private_end";
    if (s->route_s[id] == -1) return;
    if ((r = nf_private_end(s->p, id)) == NF_OK) s->route_s[id] = -1;
  }
  fresh(s, r);
  if (r != NF_OK && s->fault_p == 0) SOAK_FAIL(s, "%s", nf_last_error());
}

// A training step: the same sizes at every call (per seed), every other one
// freed, then two larger ones that fit in no hole, then all freed. Repeated
// at the limit, its granules come back through views.
static void op_step(soak_t *s) {
  s->op = "step";
  enum { NA = 6, NB = 2 };
  int slot[NA + NB];
  size_t na = (1 + s->seed % 3) * s->granule * 2 - 1536, nb = na * 2 + 4096;
  int got = 0;
  for (; got < NA + NB && (slot[got] = free_slot(s)) >= 0; got++) s->b[slot[got]].p = (void *)1; // taken
  for (int k = 0; k < got; k++) s->b[slot[k]].p = NULL;
  if (got < NA + NB) return;
  for (int k = 0; k < NA + NB; k++) {
    size_t n = k < NA ? na : nb;
    void *q = nf_alloc(s->p, n, s->st[0]);
    if (!q) { alloc_failed(s, n); slot[k] = -1; continue; }
    add_block(s, slot[k], q, n, 0, routed(s, 0));
    if (k == NA - 1) { // every other A freed before the Bs
      verify(s, false);
      for (int j = 0; j < NA; j += 2)
        if (slot[j] >= 0) {
          check_block(s, slot[j]);
          if (nf_free(s->p, s->b[slot[j]].p) == NF_OK) s->b[slot[j]].p = NULL;
          slot[j] = -1;
        }
    }
  }
  verify(s, false);
  for (int k = 0; k < NA + NB; k++)
    if (slot[k] >= 0 && s->b[slot[k]].p) {
      check_block(s, slot[k]);
      if (nf_free(s->p, s->b[slot[k]].p) == NF_OK) s->b[slot[k]].p = NULL;
    }
}

static void op_wait(soak_t *s) {
  s->op = "offload_wait";
  if (capturing(s)) return;
  nf_status_t r = nf_offload_wait(s->p);
  fresh(s, r);
  if (r != NF_OK && s->fault_p == 0) SOAK_FAIL(s, "nf_offload_wait: %s", nf_last_error());
  if (r != NF_OK) losses(s);
}

// Bursts (on odd seeds of the faults pass; NF_SOAK_BURSTS=0: none): before
// one operation in four, a burst of failures in the next 8 backend calls: a run of 3-9, a call
// retried 3 times failing for good and then its cleanup's (a remap, then set
// access), or about 1 call in 4. The rate alone (2 %) almost never fails a
// retried call 3 times in a row; bursts do (what they found:
// test_tier_degraded.c). A block left without access or data reported lost
// stay rare even so (NF_SOAK_VERBOSE counts them); the fault sweeps of
// test_fault_tier.c reach those.
static void burst(soak_t *s) {
  uint64_t calls, failed, r = nft_rand(&s->brng), a = (r >> 8) % 3, m;
  switch (r % 3) {
  case 0: m = (1ull << (3 + (r >> 8) % 7)) - 1; break;
  case 1: m = 0x49ull << a | 7ull << (a + 8); break;
  default: m = (nft_rand(&s->brng) & nft_rand(&s->brng) & 0xFFFF) | 1;
  }
  seen.bursts++;
  nf_backend_fault_counts(s->be, &calls, &failed);
  nf__backend_fault_mask(s->be, calls + 1 + (r >> 16) % 8, m); // cleared by the next nf_backend_fault_set (verify)
}

// One run: a pool configured from the seed, `ops` operations, then everything
// comes back (prefetched, verified, freed) and the backend holds nothing.
static void run(uint64_t seed, int ops, double fault_p, bool bursts) {
  soak_t *s = calloc(1, sizeof *s);
  assert_non_null(s);
  s->seed = cur_seed = seed;
  s->rng = seed * 0x9E3779B97F4A7C15ull + 1;
  s->fault_p = fault_p;
  s->bursts = bursts && fault_p > 0;
  s->brng = seed ^ 0xB0B5;
  s->op = "create";
  for (int i = 0; i < NPRIV; i++) s->route_s[i] = -1;
  for (int i = 0; i < NSTREAMS; i++) s->st[i] = (nf_stream_t)(uintptr_t)(i ? 0x100 * i : 0);
  // 2 MiB granules and a 64..256 MiB limit; or smaller granules, sizes and
  // limits alike (the same pressure, cheaper: more seeds in the time).
  static const uint64_t grans[] = {2 * MiB, 2 * MiB, 512 * KiB, 64 * KiB};
  s->granule = grans[rnd(s, 4)];
  s->limit = (32 + rnd(s, 96)) * s->granule;
  // The rest of the configuration (drawn one by one: argument order is unspecified).
  static const uint64_t views[] = {4, 64, 16384};
  bool spill = rnd(s, 4) != 0, spill_res = rnd(s, 4) == 0, tight = rnd(s, 2), small = rnd(s, 3) == 0;
  uint64_t nviews = views[rnd(s, 3)];
  char conf[512];
  int k = snprintf(conf, sizeof conf, "limit:%llu,spill:%s,spill_limit:%llu,spill_reserve:%llu,views:%llu,tight:%d,"
                   "small_max:%s", U(s->limit), spill ? "host" : "off", U(s->limit / 2),
                   U(spill_res ? 4 * s->granule : 0), U(nviews), tight, small ? "64KiB" : "1MiB");
  if (rnd(s, 2)) // the release policy at work: cached memory above limit/8 goes back
    k += snprintf(conf + k, sizeof conf - (size_t)k, ",release_threshold:%llu,release_after:%d,release_idle_ms:%d",
                  U(s->limit / 8), (int)rnd(s, 16), (int)rnd(s, 2));
  if (rnd(s, 4) == 0) k += snprintf(conf + k, sizeof conf - (size_t)k, ",reserve:%llu", U(s->limit / 4));
  if (rnd(s, 3) == 0) // address ranges of the limit's size: many chunks, blocks at their ends
    k += snprintf(conf + k, sizeof conf - (size_t)k, ",va_chunk:%llu", U(s->limit));
  if (rnd(s, 3) == 0) s->retain = s->limit / 8, k += snprintf(conf + k, sizeof conf - (size_t)k, ",retain:%llu", U(s->retain));
  snprintf(conf + k, sizeof conf - (size_t)k, ",edges:%d", (int)rnd(s, 2)); // edge sharing at the limit (edge.c)
  nf_config_t cfg;
  nf_config_default(&cfg);
  char err[256] = "";
  if (nf_config_parse(&cfg, conf, err, sizeof err) != NF_OK) fail_msg("config %s: %s", conf, err);
  assert_int_equal(nf_backend_host_create(&s->host, 64ull << 30, s->granule), NF_OK);
  s->be = s->host;
  if (fault_p > 0) assert_int_equal(nf_backend_fault_create(&s->be, s->host, 0, 0, seed), NF_OK);
  if (nf_pool_create(&s->p, s->be, &cfg) != NF_OK) fail_msg("seed %llu: pool %s: %s", U(seed), conf, nf_last_error());
  if (getenv("NF_SOAK_VERBOSE")) fprintf(stderr, "seed %llu: %s\n", U(seed), conf);
  nf_backend_host_set_manual_events(s->host, 1);
  s->faulting = fault_p > 0;
  faults(s, true);
  for (s->step = 0; s->step < ops; s->step++) {
    uint64_t r = rnd(s, 100);
    s->last = s->last_s = -1;
    nf_free(s->p, STALE);
    if (s->bursts && nft_rand(&s->brng) % 4 == 0) burst(s);
    if (r < 30) op_alloc(s);
    else if (r < 50) op_free(s);
    else if (r < 56) op_use(s);
    else if (r < 61) s->op = "complete", nf_backend_host_complete_events(s->host);
    else if (r < 69) op_offload(s);
    else if (r < 77) op_prefetch(s);
    else if (r < 79) op_wait(s);
    else if (r < 83) op_limit(s);
    else if (r < 86) op_trim(s);
    else if (r < 91) op_private(s);
    else if (r < 95) op_step(s);
    else if (r < 96) op_alloc_at(s);
    else if (r < 97) op_replay(s);
    else op_bad_free(s);
    if (getenv("NF_SOAK_DEBUG")) {
      const blk_t *b = s->last >= 0 ? &s->b[s->last] : NULL;
      fprintf(stderr, "%d %s slot %d %p %zu s%d where %d pool %llu; stream %d\n", s->step, s->op, s->last,
              b ? b->p : NULL, b ? b->n : 0, b ? b->s : -1, b ? b->where : -1,
              U(b ? b->priv : 0), s->last_s);
    }
    verify(s, s->step % 16 == 0 || s->fault_p > 0);
  }
  // Everything comes back and goes.
  faults(s, false);
  s->faulting = false;
  s->op = "drain";
  for (int i = 1; i < NPRIV; i++)
    if (s->route_s[i] != -1) assert_int_equal(nf_private_end(s->p, (uint64_t)i), NF_OK), s->route_s[i] = -1;
  nf_backend_host_complete_events(s->host);
  assert_int_equal(nf_set_limit(s->p, s->limit), NF_OK); // room for every offloaded block to come back
  for (uint64_t id = 1; id < NPRIV; id++)
    if (s->refs[id]) assert_int_equal(nf_private_trim(s->p, id), NF_OK);
  nf_stats_t st;
  for (int pass = 0; pass < 2; pass++) { // resident blocks go first: then every offloaded one fits back
    // ... once the private pools' free memory, theirs while they exist, is trimmed again: the
    // resident blocks just freed there would otherwise keep granules an offloaded block needs.
    for (uint64_t id = 1; pass == 1 && id < NPRIV; id++)
      if (s->refs[id]) assert_int_equal(nf_private_trim(s->p, id), NF_OK);
    for (int i = 0; i < MAXB; i++) {
      blk_t *b = &s->b[i];
      if (!b->p || (pass == 0) != (b->where == 0)) continue;
      if ((b->where || nft_unready(s->p, b->p)) && nf_prefetch(s->p, b->p, NULL) != NF_OK)
        SOAK_FAIL(s, "final prefetch: %s", nf_last_error());
      b->where = 0;
      check_block(s, i);
      if (nf_free(s->p, b->p) != NF_OK) SOAK_FAIL(s, "final free: %s", nf_last_error());
      b->p = NULL;
    }
  }
  verify(s, true);
  for (uint64_t id = 1; id < NPRIV; id++)
    while (s->refs[id]--) assert_int_equal(nf_private_release(s->p, id), NF_OK);
  nf_backend_host_complete_events(s->host);
  assert_int_equal(nf_trim(s->p), NF_OK);
  nf_stats_get(s->p, &st);
  if (st.live || st.mapped || st.physical > s->retain || st.views) // trim keeps `retain` unmapped granules
    SOAK_FAIL(s, "after trim: mapped %llu physical %llu views %llu", U(st.mapped), U(st.physical), U(st.views));
  totals.view_reuses += st.view_reuses, totals.view_moves += st.view_moves, totals.view_evictions += st.view_evictions;
  totals.reclaims += st.reclaims, totals.spills += st.spills, totals.offloads += st.offloads;
  totals.prefetches += st.prefetches, totals.cross_stream_reuses += st.cross_stream_reuses, totals.ooms += st.ooms;
  totals.calls.event_sync += st.calls.event_sync, totals.calls.stream_wait += st.calls.stream_wait;
  totals.edges_made += st.edges_made;
  nf_pool_destroy(s->p);
  uint64_t gr = 1, maps = 1;
  nf_backend_host_usage(s->host, &gr, &maps);
  if (gr || maps) SOAK_FAIL(s, "after destroy: %llu granules, %llu mappings left", U(gr), U(maps));
  nf_backend_destroy(s->be);
  free(s);
}

static void soak(uint64_t first, uint64_t seeds, int ops, double fault_p, bool bursts) {
  struct sigaction sa = {0};
  sa.sa_handler = on_segv;
  sigaction(SIGSEGV, &sa, &old_segv);
  memset(&totals, 0, sizeof totals);
  uint64_t one = env_u64("NF_SOAK_SEED", 0);
  if (one) run(one, ops, fault_p, bursts && (one & 1));
  else
    for (uint64_t k = 0; k < seeds; k++) run(first + k, ops, fault_p, bursts && ((first + k) & 1)); // odd seeds
  sigaction(SIGSEGV, &old_segv, NULL);
}

static void test_soak(void **state) {
  (void)state;
  soak(env_u64("NF_SOAK_FIRST", 1), env_u64("NF_SOAK_SEEDS", 12), (int)env_u64("NF_SOAK_OPS", 1500), 0, false);
  if (getenv("NF_SOAK_VERBOSE"))
    fprintf(stderr, "view reuses %llu moves %llu evictions %llu reclaims %llu spills %llu ooms %llu offloads %llu "
            "prefetches %llu cross-stream %llu syncs %llu waits %llu shared granules %llu\n", U(totals.view_reuses),
            U(totals.view_moves), U(totals.view_evictions), U(totals.reclaims), U(totals.spills), U(totals.ooms),
            U(totals.offloads), U(totals.prefetches), U(totals.cross_stream_reuses), U(totals.calls.event_sync),
            U(totals.calls.stream_wait), U(totals.edges_made));
  if (env_u64("NF_SOAK_SEED", 0)) return;
  // The run exercised what it is about (it cannot pass by doing nothing).
  assert_true(totals.view_reuses > 0 && totals.view_moves > 0 && totals.view_evictions > 0);
  assert_true(totals.reclaims > 0 && totals.spills > 0 && totals.ooms > 0);
  assert_true(totals.offloads > 0 && totals.prefetches > 0 && totals.cross_stream_reuses > 0);
  assert_true(totals.calls.event_sync > 0 && totals.calls.stream_wait > 0);
  assert_true(totals.edges_made > 0);
}

static void test_soak_faults(void **state) {
  (void)state;
  soak(env_u64("NF_SOAK_FIRST", 1) + 1000, env_u64("NF_SOAK_SEEDS", 12) / 2, (int)env_u64("NF_SOAK_OPS", 1500) * 2 / 3,
       0.02, env_u64("NF_SOAK_BURSTS", 1) != 0);
  if (getenv("NF_SOAK_VERBOSE"))
    fprintf(stderr, "bursts %llu: block reads skipped (without access) %llu, blocks reported lost %llu\n",
            U(seen.bursts), U(seen.unready), U(seen.lost));
}

// Seeds the daily wide soak failed once, kept (with the configuration that
// failed): 90516, faults pass: a granule's owner hint naming a chunk handed
// back and freed, read after free by the views' search (ASan shows it).
static void test_soak_regressions(void **state) {
  (void)state;
  if (env_u64("NF_SOAK_SEED", 0)) return; // one seed asked for: the tests above ran it
  static const uint64_t faults[] = {90516};
  for (size_t k = 0; k < sizeof faults / sizeof faults[0]; k++) soak(faults[k], 1, 1000, 0.02, false);
  // With bursts: 5115, an edge's second mapping whose set access and then
  // unmap failed, forgotten mapped ("after destroy: 1 mappings left").
  static const uint64_t bursts[] = {5115};
  for (size_t k = 0; k < sizeof bursts / sizeof bursts[0]; k++) soak(bursts[k], 1, 1000, 0.02, true);
}

int main(void) {
  setenv("NOFRAG_QUIET_OOM", "1", 1);
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_soak),
      cmocka_unit_test(test_soak_faults),
      cmocka_unit_test(test_soak_regressions),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
