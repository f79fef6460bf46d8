// The reference model of test_soak.c (included by it alone): what the test
// knows of the pool -- live blocks with their sizes, pattern tags, streams,
// tiers and private pools; recently freed ranges a graph may replay into;
// private-pool uses and routes -- and the checks of the pool against it after
// every operation (verify, check_block, alloc_failed, fresh). A failure names
// the seed and step that reproduce it (SOAK_FAIL). The operations that drive
// the pool and update the model, and the runs, are in test_soak.c.
#ifndef NF_SOAK_MODEL_H
#define NF_SOAK_MODEL_H

#include "core/core.h" // white box: nft_unready
#include "nf_test.h"

#define MiB (1024ull * 1024)
#define KiB 1024ull
#define U(x) ((unsigned long long)(x))
enum { MAXB = 160, NSTREAMS = 4, NFREED = 16, NPRIV = 3 };

typedef struct {
  void *p;
  size_t n;
  uint64_t tag, priv;
  int s, where; // stream index; tier it was offloaded to (0: resident)
  bool lost;    // a failure reported part of its data lost (naming it): not checked until rewritten
} blk_t;

// A freed block; `replay`: freed in a private pool, still mapped there: the
// pool's graph may write into it at any time.
typedef struct { void *p; size_t n; uint64_t id; bool replay; } freed_t;

typedef struct {
  nf_backend_t *host, *be; // be: host, or the fault wrapper around it
  nf_pool_t *p;
  nf_stream_t st[NSTREAMS];
  blk_t b[MAXB];
  freed_t fr[NFREED];
  int nfr;
  uint64_t seed, rng, tag, limit, granule, retain;
  double fault_p;
  bool faulting; // faults injected now (off while the test looks, and at the end)
  int step, last, last_s; // last: the slot the operation touched, last_s: a stream it named
  const char *op;
  int refs[NPRIV];          // use counts this test holds on private pools 1..NPRIV-1
  int route_s[NPRIV];       // stream index routed to pool i (-1: none, -2: this thread)
  uint64_t route_age[NPRIV];
  uint64_t age;
  bool bursts;   // fault bursts too (burst(), test_soak.c): retries that fail for good
  uint64_t brng; // their own generator: the operations drawn stay those of the seed
} soak_t;

// Where the current run is, for test_soak.c's signal handler (verify keeps the step).
static uint64_t cur_seed;
static int cur_step;

static uint64_t rnd(soak_t *s, uint64_t n) { return n ? nft_rand(&s->rng) % n : 0; }
static uint64_t rsz(size_t n) { return ((uint64_t)n + 511) & ~511ull; }
// Its pattern can be read: resident or in host memory at its address, not
// reported lost, and not left without access by a failed tier operation.
static struct { uint64_t bursts, unready, lost; } seen; // what the bursts reached, summed over runs
static bool readable(soak_t *s, const blk_t *b) {
  bool unready = nft_unready(s->p, b->p);
  seen.unready += unready;
  return (b->where == 0 || b->where == NF_TIER_HOST) && !b->lost && !unready;
}

// A failed call whose error says that data was lost: the blocks it names.
static void losses(soak_t *s) {
  const char *m = nf_last_error();
  if (!strstr(m, "LOST") && !strstr(m, "are lost")) return;
  for (int i = 0; i < MAXB; i++) {
    char a[32];
    snprintf(a, sizeof a, "%p", s->b[i].p);
    if (s->b[i].p && strstr(m, a)) s->b[i].lost = true, seen.lost++;
  }
}

#define SOAK_FAIL(s, ...)                                                                                   \
  do {                                                                                                     \
    char m_[512];                                                                                          \
    snprintf(m_, sizeof m_, __VA_ARGS__);                                                                  \
    fail_msg("seed %llu step %d (%s, faults %.2f): %s  [NF_SOAK_SEED=%llu reproduces]",                  \
             U((s)->seed), (s)->step, (s)->op, (s)->fault_p, m_,                          \
             U((s)->seed));                                                               \
  } while (0)

// Before each operation the thread's last message is a bad free's, naming
// STALE: a call that fails must leave its own.
#define STALE ((void *)0x1000)
static void fresh(soak_t *s, nf_status_t st) {
  if (st != NF_OK && strstr(nf_last_error(), "0x1000"))
    SOAK_FAIL(s, "failed with %s but an older message: %s", nf_status_str(st), nf_last_error());
}

// Faults stop while the test itself looks (checks, pattern reads, stats).
static void faults(soak_t *s, bool on) {
  if (s->fault_p > 0) nf_backend_fault_set(s->be, 0, on ? s->fault_p : 0);
}

static void check_block(soak_t *s, int i) {
  blk_t *b = &s->b[i];
  if (!b->p) return;
  if (nf_block_size(s->p, b->p) != b->n)
    SOAK_FAIL(s, "block %d %p: nf_block_size %zu, model %zu", i, b->p, nf_block_size(s->p, b->p), b->n);
  uint64_t t[3];
  if (nf_block_tiers(s->p, b->p, t) != NF_OK) SOAK_FAIL(s, "block %d: nf_block_tiers: %s", i, nf_last_error());
  if (t[0] + t[1] + t[2] != rsz(b->n))
    SOAK_FAIL(s, "block %d (%zu B): tiers %llu+%llu+%llu", i, b->n, U(t[0]), U(t[1]), U(t[2]));
  if (b->where != NF_TIER_DISK && t[NF_TIER_DISK]) SOAK_FAIL(s, "block %d not on disk has disk bytes", i);
  if (nf_private_of(s->p, b->p) != b->priv)
    SOAK_FAIL(s, "block %d: private pool %llu, model %llu", i, U(nf_private_of(s->p, b->p)), U(b->priv));
  if (readable(s, b) && !nft_check(b->p, b->n, b->tag))
    SOAK_FAIL(s, "block %d %p (%zu B, stream %d, where %d, pool %llu) lost its data", i, b->p, b->n, b->s,
              b->where, U(b->priv));
}

static int by_addr(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return x < y ? -1 : x > y;
}

// Invariants after an operation; `full`: every readable block's pattern too.
static void verify(soak_t *s, bool full) {
  if (s->faulting) faults(s, false);
  cur_step = s->step;
  if (nf_pool_check(s->p) != NF_OK) SOAK_FAIL(s, "nf_pool_check: %s", nf_last_error());
  uintptr_t r[MAXB][2];
  uint64_t live = 0, rounded = 0, n = 0, disk = 0;
  for (int i = 0; i < MAXB; i++) {
    if (!s->b[i].p) continue;
    r[n][0] = (uintptr_t)s->b[i].p, r[n][1] = rsz(s->b[i].n), n++;
    live += s->b[i].n, rounded += rsz(s->b[i].n);
    if (!full) continue;
    check_block(s, i);
    uint64_t t[3];
    nf_block_tiers(s->p, s->b[i].p, t);
    disk += t[NF_TIER_DISK] ? rsz(s->b[i].n) : 0; // offloaded_disk counts whole blocks
  }
  qsort(r, n, sizeof r[0], by_addr);
  for (uint64_t k = 1; k < n; k++)
    if (r[k - 1][0] + r[k - 1][1] > r[k][0])
      SOAK_FAIL(s, "live blocks %#llx (+%llu) and %#llx overlap", U(r[k - 1][0]), U(r[k - 1][1]), U(r[k][0]));
  nf_stats_t st;
  nf_stats_get(s->p, &st);
  if (st.live != live || st.live_blocks != n || st.live_rounded != rounded)
    SOAK_FAIL(s, "stats live %llu B / %llu blocks / %llu rounded, model %llu / %llu / %llu",
              U(st.live), U(st.live_blocks), U(st.live_rounded), U(live), U(n), U(rounded));
  if (full && s->step % 64 == 0) { // a snapshot flushes the bins: a change of state too
    char *j = nf_snapshot(s->p);
    if (!j || !strstr(j, "\"chunks\"")) SOAK_FAIL(s, "nf_snapshot: %s", j ? "no chunks" : nf_last_error());
    nf_snapshot_free(j);
  }
  if (full && st.offloaded_disk != disk)
    SOAK_FAIL(s, "stats offloaded_disk %llu B, the disk blocks' %llu B", U(st.offloaded_disk), U(disk));
  if (st.physical > s->limit) // the limit only moves below the configured one
    SOAK_FAIL(s, "device memory %llu B above the limit %llu B", U(st.physical), U(s->limit));
  if (nf_backend_host_violations(s->host))
    SOAK_FAIL(s, "%llu stream-ordering violations (unmapped or handed out under another stream's work)",
              U(nf_backend_host_violations(s->host)));
  if (s->faulting) faults(s, true);
}

static int free_slot(soak_t *s) {
  for (int k = 0, i = (int)rnd(s, MAXB); k < MAXB; k++, i = (i + 1) % MAXB)
    if (!s->b[i].p) return i;
  return -1;
}

// A random live block (resident only: `resident`), or -1.
static int live_slot(soak_t *s, bool resident) {
  for (int k = 0, i = (int)rnd(s, MAXB); k < MAXB; k++, i = (i + 1) % MAXB)
    if (s->b[i].p && (!resident || !s->b[i].where)) return i;
  return -1;
}

static bool capturing(const soak_t *s) {
  for (int i = 1; i < NPRIV; i++)
    if (s->route_s[i] >= 0) return true;
  return false;
}

static bool captured(const soak_t *s, int si) {
  for (int i = 1; i < NPRIV; i++)
    if (s->route_s[i] == si) return true;
  return false;
}

// The private pool an allocation on stream si goes to: the newest route that matches.
static uint64_t routed(const soak_t *s, int si) {
  uint64_t best = 0, age = 0;
  for (int i = 1; i < NPRIV; i++)
    if ((s->route_s[i] == si || s->route_s[i] == -2) && s->route_age[i] >= age) best = (uint64_t)i, age = s->route_age[i];
  return best;
}

// Stream work on the block (a kernel): declared to the host backend, so that
// unmapping the range before that work completes counts as a violation, and
// so does handing it to a new block on a stream not ordered after that work.
static void use(soak_t *s, int i, int si) {
  if (!captured(s, si)) nf_backend_host_use(s->host, s->st[si], s->b[i].p, s->b[i].n);
}

static void add_block(soak_t *s, int i, void *q, size_t n, int si, uint64_t priv) {
  s->last = i;
  if ((uintptr_t)q & 511) SOAK_FAIL(s, "%p is not 512-byte aligned", q);
  s->b[i] = (blk_t){q, n, ++s->tag, priv, si, 0, false};
  nft_fill(q, n, s->tag);
  if (!captured(s, si)) nf_backend_host_use_new(s->host, s->st[si], q, n); // the first kernel on it
}

// A failed nf_alloc of n bytes: an error with a message, and without faults
// an OOM the guarantee of nofrag.h allows. (Not checked while private pools
// exist: their free granules are theirs; nor during a capture: no host waits.)
static void alloc_failed(soak_t *s, size_t n) {
  nf_status_t st = nf_last_status();
  if (st == NF_OK || !nf_last_error()[0]) SOAK_FAIL(s, "failed allocation without status or message");
  fresh(s, st);
  if (s->fault_p > 0) return;
  if (st != NF_ERR_OOM) SOAK_FAIL(s, "allocation failed with %s: %s", nf_status_str(st), nf_last_error());
  for (int i = 1; i < NPRIV; i++)
    if (s->refs[i]) return;
  nf_stats_t t;
  nf_stats_get(s->p, &t);
  if (t.live_granules + (n + s->granule - 1) / s->granule + 1 <= t.limit / s->granule)
    SOAK_FAIL(s, "guarantee broken: %zu B failed with %llu live granules, limit %llu granules: %s", n,
              U(t.live_granules), U(t.limit / s->granule), nf_last_error());
}

static bool overlaps(const void *a, size_t n, const void *b, size_t m) {
  return (uintptr_t)a < (uintptr_t)b + m && (uintptr_t)b < (uintptr_t)a + n;
}

// Freed ranges of pool `id` (0: any) overlapping [p, p + n) that the graph can no longer write.
static void unreplay(soak_t *s, uint64_t id, const void *p, size_t n) {
  for (int i = 0; i < s->nfr; i++)
    if ((!id || s->fr[i].id == id) && (!p || overlaps(s->fr[i].p, s->fr[i].n, p, n))) s->fr[i].replay = false;
}

#endif
