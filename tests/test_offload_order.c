// Offload and prefetch under a "lazy GPU": a spy backend over the host
// backend that runs no copy when it is enqueued. Copies, and the test's own
// work on blocks (fills and pattern checks), are queued per stream and run
// only when the allocator learns that their stream got past them (event
// synchronize, or a query that says done), when the test synchronizes a
// stream, or when a stream they wait on (stream_wait) is run. The host
// backend's copies are synchronous, which hides every ordering mistake of a
// tier (a copy that reads memory already reused, or lands after the block's
// next owner wrote it); here such a mistake corrupts a pattern or unmaps a
// range with work pending on it, and the test says so. Streams are run in a
// random order between operations, so many interleavings are seen. As with
// CUDA, a copy to pageable host memory is done when the call returns (after
// its stream's earlier work) and one from it reads the source at the call.
// On the host backend with manual events (its detector counts an unmap or
// reuse under a copy in flight): a copy on another stream than the block's
// (a prefetch's, a cancelled offload's) counts as a user of the block freed
// on its own stream, and recycling streams finishes the copies listed.
#include "nf_test.h"

#define G (64 * 1024ull)

enum { LZ_COPY, LZ_WAIT, LZ_FILL, LZ_CHECK };
typedef struct {
  int kind;
  bool done;
  nf_stream_t s, ws; // stream; LZ_WAIT: the stream waited for, up to wseq
  uint64_t seq, wseq, tag;
  uintptr_t dst, src; // LZ_FILL / LZ_CHECK: dst, n; LZ_COPY: snap holds a pageable source read at enqueue
  size_t n;
  void *snap;
} lz_op;

typedef struct {
  nf_backend_t be; // first: the spy helpers cast
  nf_backend_ops_t ops;
  lz_op *q;
  size_t nq, cap;
  uint64_t seq;
  struct lz_ev { nf_event_t e; nf_stream_t s; uint64_t seq; } ev[1024];
  size_t nev;
  struct { uintptr_t a; size_t n; } va[256];
  size_t nva;
  uint64_t corrupt, unmapped_busy, failed_ops;
  int fail_records; // the next this many event records fail (a transient driver error)
  char what[256];
} lz_t;

static lz_t *lz(nf_backend_t *be) { return (lz_t *)be; }

static lz_op *lz_push(lz_t *l, lz_op op) {
  if (l->nq == l->cap) {
    size_t k = 0; // drop what already ran
    for (size_t i = 0; i < l->nq; i++)
      if (!l->q[i].done) l->q[k++] = l->q[i];
    l->nq = k;
    if (l->nq == l->cap) {
      l->cap = l->cap ? 2 * l->cap : 256;
      l->q = realloc(l->q, l->cap * sizeof *l->q);
      assert_non_null(l->q);
    }
  }
  op.seq = ++l->seq;
  l->q[l->nq] = op;
  return &l->q[l->nq++];
}

static bool pageable(const lz_t *l, uintptr_t a) {
  for (size_t i = 0; i < l->nva; i++)
    if (a >= l->va[i].a && a < l->va[i].a + l->va[i].n) return false;
  return true;
}

static void lz_run(lz_t *l, lz_op *o) {
  nf_backend_t *in = l->be.inner;
  o->done = true;
  if (getenv("NF_DEBUG"))
    fprintf(stderr, "    run #%llu %s on %p: %#lx <- %#lx, %zu B, tag %llu\n", (unsigned long long)o->seq,
            o->kind == LZ_COPY ? "copy" : o->kind == LZ_FILL ? "fill" : "check", o->s, (unsigned long)o->dst,
            (unsigned long)o->src, o->n, (unsigned long long)o->tag);
  if (o->kind == LZ_COPY) {
    uintptr_t src = o->snap ? (uintptr_t)o->snap : o->src;
    if (in->ops->copy(in, o->dst, src, o->n, o->s) != NF_OK) {
      l->failed_ops++;
      snprintf(l->what, sizeof l->what, "copy %#lx <- %#lx (%zu B) ran on unmapped memory",
               (unsigned long)o->dst, (unsigned long)o->src, o->n);
    }
    free(o->snap);
    o->snap = NULL;
    return;
  }
  // Fills and checks go through a host buffer and the inner copy, which
  // refuses memory that is not mapped with access (as the GPU would fault).
  void *buf = malloc(o->n);
  assert_non_null(buf);
  nf_status_t st;
  if (o->kind == LZ_FILL) {
    nft_fill(buf, o->n, o->tag);
    st = in->ops->copy(in, o->dst, (uintptr_t)buf, o->n, o->s);
  } else {
    st = in->ops->copy(in, (uintptr_t)buf, o->dst, o->n, o->s);
    if (st == NF_OK && !nft_check(buf, o->n, o->tag)) {
      l->corrupt++;
      if (getenv("NF_DEBUG")) { // which words are wrong, and whose pattern they hold
        size_t step = o->n > (1u << 16) ? 4096 : 8;
        for (size_t off = 0; off + 16 <= o->n; off += step) {
          uint64_t v;
          memcpy(&v, (char *)buf + off, 8);
          if (v == (o->tag * 0x100000001B3ull ^ off)) continue;
          uint64_t w = v ^ off;
          fprintf(stderr, "  bad word at +%#zx (va %#lx): %#llx (tag %llu?)\n", off, (unsigned long)(o->dst + off),
                  (unsigned long long)v, w % 0x100000001B3ull ? 0ull : (unsigned long long)(w / 0x100000001B3ull));
        }
        uint64_t v;
        memcpy(&v, (char *)buf + o->n - 8, 8);
        fprintf(stderr, "  tail word (va %#lx): %#llx, tag %llu's would be %#llx\n", (unsigned long)(o->dst + o->n - 8),
                (unsigned long long)v, (unsigned long long)o->tag, (unsigned long long)(o->tag ^ 0xABCDEFull ^ (o->n - 8)));
      }
      snprintf(l->what, sizeof l->what, "block %#lx (%zu B, tag %llu) corrupted", (unsigned long)o->dst, o->n,
               (unsigned long long)o->tag);
    }
  }
  if (st != NF_OK) {
    l->failed_ops++;
    snprintf(l->what, sizeof l->what, "%s of %#lx (%zu B) on unmapped memory", o->kind == LZ_FILL ? "fill" : "check",
             (unsigned long)o->dst, o->n);
  }
  free(buf);
}

// Run stream s's queued work enqueued before `upto` (and what it waits for).
static void lz_flush(lz_t *l, nf_stream_t s, uint64_t upto) {
  for (size_t i = 0; i < l->nq; i++) {
    lz_op *o = &l->q[i];
    if (o->done || o->s != s || o->seq >= upto) continue;
    if (o->kind == LZ_WAIT) {
      o->done = true;
      lz_flush(l, o->ws, o->wseq); // (nothing is queued while flushing: o stays valid)
      continue;
    }
    lz_run(l, o);
  }
}

static void lz_flush_all(lz_t *l) {
  for (size_t i = 0; i < l->nq; i++)
    if (!l->q[i].done) lz_flush(l, l->q[i].s, UINT64_MAX);
}

static size_t lz_ev(lz_t *l, nf_event_t e) {
  for (size_t i = 0; i < l->nev; i++)
    if (l->ev[i].e == e) return i;
  assert_true(l->nev < sizeof l->ev / sizeof l->ev[0]);
  l->ev[l->nev] = (struct lz_ev){.e = e};
  return l->nev++;
}

static nf_status_t lz_copy(nf_backend_t *be, uintptr_t d, uintptr_t s, size_t n, nf_stream_t st) {
  lz_t *l = lz(be);
  lz_op op = {.kind = LZ_COPY, .s = st, .dst = d, .src = s, .n = n};
  if (pageable(l, d)) { // to pageable memory: done when the call returns (CUDA), after the stream's work
    lz_flush(l, st, UINT64_MAX);
    lz_run(l, lz_push(l, op));
    return NF_OK;
  }
  if (pageable(l, s)) { // a pageable source is read when the copy is enqueued (CUDA stages it)
    op.snap = malloc(n);
    assert_non_null(op.snap);
    memcpy(op.snap, (void *)s, n);
  }
  lz_push(l, op);
  return NF_OK;
}

static nf_status_t lz_record(nf_backend_t *be, nf_event_t e, nf_stream_t s) {
  lz_t *l = lz(be);
  if (l->fail_records > 0) {
    l->fail_records--;
    return nf__backend_fail(be, NF_ERR_BACKEND, "lazy backend: event record fails (test)");
  }
  nf_status_t st = nft_f_evr(be, e, s);
  if (st == NF_OK) {
    size_t i = lz_ev(l, e);
    l->ev[i].s = s;
    l->ev[i].seq = ++l->seq;
  }
  return st;
}

static nf_status_t lz_query(nf_backend_t *be, nf_event_t e) {
  nf_status_t st = nft_f_evq(be, e);
  size_t i = lz_ev(lz(be), e);
  if (st == NF_OK && lz(be)->ev[i].seq) lz_flush(lz(be), lz(be)->ev[i].s, lz(be)->ev[i].seq);
  return st;
}

static nf_status_t lz_sync(nf_backend_t *be, nf_event_t e) {
  size_t i = lz_ev(lz(be), e);
  if (lz(be)->ev[i].seq) lz_flush(lz(be), lz(be)->ev[i].s, lz(be)->ev[i].seq);
  return nft_f_evs(be, e);
}

static nf_status_t lz_wait(nf_backend_t *be, nf_stream_t s, nf_event_t e) {
  size_t i = lz_ev(lz(be), e);
  if (lz(be)->ev[i].seq)
    lz_push(lz(be), (lz_op){.kind = LZ_WAIT, .s = s, .ws = lz(be)->ev[i].s, .wseq = lz(be)->ev[i].seq});
  return nft_f_sw(be, s, e);
}

static nf_status_t lz_unmap(nf_backend_t *be, uintptr_t va, size_t n) {
  lz_t *l = lz(be);
  for (size_t i = 0; i < l->nq; i++) {
    lz_op *o = &l->q[i];
    if (o->done || o->kind == LZ_WAIT) continue;
    bool d = o->dst < va + n && va < o->dst + o->n, s = !o->snap && o->kind == LZ_COPY && o->src < va + n && va < o->src + o->n;
    if (d || s) {
      l->unmapped_busy++;
      snprintf(l->what, sizeof l->what, "[%#lx, +%zu) unmapped with work pending on it (stream %p: %s %#lx <- %#lx, %zu B)",
               (unsigned long)va, n, o->s, o->kind == LZ_COPY ? "copy" : o->kind == LZ_FILL ? "fill" : "check",
               (unsigned long)o->dst, (unsigned long)o->src, o->n);
      o->done = true;
    }
  }
  if (getenv("NF_DEBUG")) fprintf(stderr, "    unmap %#lx +%zu\n", (unsigned long)va, n);
  return nft_f_unmap(be, va, n);
}

static nf_status_t lz_map(nf_backend_t *be, uintptr_t va, size_t n, nf_handle_t h) {
  nf_status_t st = nft_f_map(be, va, n, h);
  if (getenv("NF_DEBUG")) fprintf(stderr, "    map %#lx +%zu <- %p: %d\n", (unsigned long)va, n, (void *)h, st);
  return st;
}

static nf_status_t lz_reserve(nf_backend_t *be, size_t n, size_t al, uintptr_t *out) {
  nf_status_t st = nft_f_var(be, n, al, out);
  lz_t *l = lz(be);
  if (st == NF_OK) {
    assert_true(l->nva < sizeof l->va / sizeof l->va[0]);
    l->va[l->nva].a = *out;
    l->va[l->nva++].n = n;
  }
  return st;
}

static nf_status_t lz_release(nf_backend_t *be, uintptr_t va, size_t n) {
  lz_t *l = lz(be);
  for (size_t i = 0; i < l->nva; i++)
    if (l->va[i].a == va) { l->va[i] = l->va[--l->nva]; break; }
  return nft_f_vaf(be, va, n);
}

static void lz_destroy(nf_backend_t *be) {
  lz_t *l = lz(be);
  for (size_t i = 0; i < l->nq; i++) free(l->q[i].snap);
  free(l->q);
  nft_f_destroy(be);
}

static lz_t *lz_create(uint64_t capacity) {
  lz_t *l = calloc(1, sizeof *l);
  assert_non_null(l);
  nft_spy_init(&l->be, &l->ops, capacity, G);
  l->ops.copy = lz_copy;
  l->ops.event_record = lz_record;
  l->ops.event_query = lz_query;
  l->ops.event_sync = lz_sync;
  l->ops.stream_wait = lz_wait;
  l->ops.unmap = lz_unmap;
  l->ops.map = lz_map;
  l->ops.va_reserve = lz_reserve;
  l->ops.va_release = lz_release;
  l->ops.destroy = lz_destroy;
  nf_backend_host_set_manual_events(l->be.inner, 1);
  return l;
}

// The test's own work: on stream s, after what is queued there.
static void lz_fill(lz_t *l, nf_stream_t s, void *p, size_t n, uint64_t tag) {
  lz_push(l, (lz_op){.kind = LZ_FILL, .s = s, .dst = (uintptr_t)p, .n = n, .tag = tag});
}
static void lz_check(lz_t *l, nf_stream_t s, void *p, size_t n, uint64_t tag) {
  lz_push(l, (lz_op){.kind = LZ_CHECK, .s = s, .dst = (uintptr_t)p, .n = n, .tag = tag});
}
static void lz_user_wait(lz_t *l, nf_stream_t s, nf_stream_t on) { // s waits for what is queued on `on`
  if (s != on) lz_push(l, (lz_op){.kind = LZ_WAIT, .s = s, .ws = on, .wseq = l->seq + 1});
}
// Everything runs and every event completes (a device synchronize).
static void lz_sync_all(lz_t *l) {
  lz_flush_all(l);
  nf_backend_host_complete_events(l->be.inner);
}

// A block of the test; `after`: the stream its last prefetch ran on, which
// the block's stream waits for before it next uses the block (not before a
// free: a block freed unused needs no wait).
typedef struct { void *p; size_t n; uint64_t tag; int where; nf_stream_t s, after; } ob_t;

static void use(lz_t *l, ob_t *x, nf_stream_t s) {
  if (x->after) lz_user_wait(l, x->s, x->after);
  x->after = NULL;
  lz_user_wait(l, s, x->s);
  lz_check(l, s, x->p, x->n, x->tag);
}

static void lz_random(uint64_t seed, const char *conf) {
  lz_t *l = lz_create(1024 * G);
  nf_pool_t *p = nft_pool_on(&l->be, conf);
  enum { N = 20 };
  ob_t b[N] = {{0}};
  nf_stream_t S[3] = {(nf_stream_t)0x11, (nf_stream_t)0x22, (nf_stream_t)0x33};
  uint64_t rng = seed, tag = 1, moves = 0, prefetches = 0;
  for (int step = 0; step < 2500; step++) {
    int i = (int)(nft_rand(&rng) % N), op = (int)(nft_rand(&rng) % 16);
    nf_stream_t s = S[nft_rand(&rng) % 3];
    ob_t *x = &b[i];
    if (!x->p) {
      size_t n = 512 + nft_rand(&rng) % (5 * G);
      if ((x->p = nf_alloc(p, n, s))) {
        *x = (ob_t){x->p, n, tag++, 0, s, NULL};
        lz_fill(l, s, x->p, n, x->tag);
      }
    } else if (op < 3) { // free (checked first, on its stream)
      if (!x->where && nft_rand(&rng) % 2) use(l, x, x->s);
      assert_int_equal(nf_free(p, x->p), NF_OK);
      x->p = NULL;
    } else if (op < 7 && !x->where) {
      nf_tier_t t = op == 3 ? NF_TIER_DISK : op == 4 ? NF_TIER_HOST : NF_TIER_HOST_DETACHED;
      nf_status_t r = nf_offload(p, x->p, s, t);
      if (r == NF_OK) x->where = t, moves++;
      else assert_int_equal(r, NF_ERR_OOM);
    } else if (op < 11 && (x->where || op == 10)) { // (not offloaded: its spilled granules move)
      nf_status_t r = nf_prefetch(p, x->p, s);
      if (r == NF_OK) {
        x->where = 0, prefetches++;
        if (x->after) lz_user_wait(l, x->s, x->after); // an earlier prefetch's copy, never waited for
        x->after = s;
      } else {
        assert_int_equal(r, NF_ERR_OOM);
      }
    } else if (op == 11 && !x->where) { // used on another stream too
      use(l, x, s);
      assert_int_equal(nf_record_stream(p, x->p, s), NF_OK);
    } else if (op == 12) {
      lz_sync_all(l);
      assert_int_equal(nf_offload_wait(p), NF_OK);
    } else if (op == 13) {
      lz_flush(l, s, UINT64_MAX); // one stream gets ahead of the others
    } else if (op == 14 && step % 7 == 0) {
      if (nf_trim(p) != NF_OK) fail_msg("seed %llu step %d: trim: %s", (unsigned long long)seed, step, nf_last_error());
    } else if (op == 14 && step % 7 == 1) {
      uint64_t lim = (10 + nft_rand(&rng) % 12) * G;
      if (nf_set_limit(p, lim) != NF_OK) fail_msg("seed %llu step %d: set_limit: %s", (unsigned long long)seed, step, nf_last_error());
    } else if (x->where == NF_TIER_HOST) { // used in place once the copy is done, finished before prefetch
      lz_sync_all(l);
      assert_int_equal(nf_offload_wait(p), NF_OK);
      use(l, x, x->s);
      lz_flush(l, x->s, UINT64_MAX);
    } else if (!x->where) {
      use(l, x, x->s);
    }
    if (getenv("NF_DEBUG"))
      fprintf(stderr, "step %d op %d blk %d %p (%zu B) s %p where %d st %p\n", step, op, i, x->p, x->n, s, x->where, x->s);
    if (nf_pool_check(p) != NF_OK) fail_msg("seed %llu step %d: %s", (unsigned long long)seed, step, nf_last_error());
    if (l->corrupt || l->unmapped_busy || l->failed_ops)
      fail_msg("seed %llu step %d (op %d): %s", (unsigned long long)seed, step, op, l->what);
  }
  lz_sync_all(l);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  for (int pass = 0; pass < 2; pass++) // resident blocks first, then the offloaded ones come back
    for (int k = 0; k < N; k++) {
      if (!b[k].p || (pass == 0) != !b[k].where) continue;
      if (b[k].where) assert_int_equal(nf_prefetch(p, b[k].p, b[k].s), NF_OK);
      use(l, &b[k], b[k].s);
      assert_int_equal(nf_free(p, b[k].p), NF_OK);
    }
  lz_sync_all(l);
  if (l->corrupt || l->unmapped_busy || l->failed_ops) fail_msg("seed %llu at the end: %s", (unsigned long long)seed, l->what);
  assert_int_equal(nf_pool_check(p), NF_OK);
  assert_true(moves > 50 && prefetches > 20);
  nf_pool_destroy(p);
  nf_backend_destroy(&l->be);
}

static void test_lazy_random(void **state) {
  (void)state;
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  const char *confs[] = {"limit:1MiB,views:0", "limit:1MiB,views:8", "limit:1MiB,spill:host,spill_limit:1MiB,views:8"};
  for (int c = 0; c < 3; c++)
    for (uint64_t seed = 1; seed <= 4; seed++) lz_random(seed + 100 * (uint64_t)c, confs[c]);
  uint64_t s = nft_env_seed(0);
  if (s) lz_random(s, confs[s % 3]);
}

// A lazy GPU, a pool on it and a 4-granule block on stream LZ_A, filled with
// `tag` and offloaded to `tier` on LZ_A: the fill and the copy are queued, not run.
#define LZ_A ((nf_stream_t)0x11)
static nf_pool_t *lz_offloaded(lz_t **l, void **b, nf_tier_t tier, uint64_t tag) {
  *l = lz_create(1024 * G);
  nf_pool_t *p = nft_pool_on(&(*l)->be, "limit:1MiB");
  assert_non_null(p);
  *b = nf_alloc(p, 4 * G, LZ_A);
  assert_non_null(*b);
  lz_fill(*l, LZ_A, *b, 4 * G, tag);
  assert_int_equal(nf_offload(p, *b, LZ_A, tier), NF_OK);
  return p;
}

// A prefetch that fails after its copy was queued (the event record after it
// fails) must wait for that copy before it unmaps or remaps the block's
// range, even when the next record fails once more (before the fix the
// cleanup then waited on an older record, which the copy is not behind).
static void test_failed_prefetch_waits_for_its_copy(void **state) {
  (void)state;
  nf_tier_t tiers[] = {NF_TIER_HOST_DETACHED, NF_TIER_HOST};
  for (int t = 0; t < 2; t++) {
    lz_t *l;
    void *b;
    nf_pool_t *p = lz_offloaded(&l, &b, tiers[t], 5);
    nf_stream_t A = LZ_A, S = (nf_stream_t)0x22;
    lz_sync_all(l);
    assert_int_equal(nf_offload_wait(p), NF_OK);
    l->fail_records = 2;
    assert_int_equal(nf_prefetch(p, b, S), NF_ERR_BACKEND);
    l->fail_records = 0;
    if (l->unmapped_busy || l->failed_ops) fail_msg("tier %d: %s", (int)tiers[t], l->what);
    assert_int_equal(nf_pool_check(p), NF_OK);
    assert_int_equal(nf_prefetch(p, b, S), NF_OK); // still offloaded, intact
    lz_user_wait(l, A, S);
    lz_check(l, A, b, 4 * G, 5);
    assert_int_equal(nf_free(p, b), NF_OK);
    lz_sync_all(l);
    if (l->corrupt || l->unmapped_busy || l->failed_ops) fail_msg("tier %d: %s", (int)tiers[t], l->what);
    nf_pool_destroy(p);
    nf_backend_destroy(&l->be);
  }
}

// A prefetch that finds the offload's copy still in flight cancels it (the
// block never left the device); work queued on the prefetch's stream must
// still see the data, i.e. run after the work that wrote it (the copy is in
// flight because that work may still be running). Running only S's queue
// shows it: without the ordering, S's check runs before A's fill.
static void test_cancelled_offload_orders_the_prefetch_stream(void **state) {
  (void)state;
  nf_tier_t tiers[] = {NF_TIER_HOST, NF_TIER_HOST_DETACHED};
  for (int t = 0; t < 2; t++) {
    lz_t *l;
    void *b;
    nf_pool_t *p = lz_offloaded(&l, &b, tiers[t], 9); // the fill and the copy behind it queued, not run
    nf_stream_t S = (nf_stream_t)0x22;
    assert_int_equal(nf_prefetch(p, b, S), NF_OK);   // cancels the offload
    lz_check(l, S, b, 4 * G, 9);
    lz_flush(l, S, UINT64_MAX);                      // S first (and what it waits for)
    if (l->corrupt || l->failed_ops) fail_msg("tier %d: %s", (int)tiers[t], l->what);
    assert_int_equal(nf_free(p, b), NF_OK);
    lz_sync_all(l);
    if (l->corrupt || l->unmapped_busy || l->failed_ops) fail_msg("tier %d: %s", (int)tiers[t], l->what);
    assert_int_equal(nf_pool_check(p), NF_OK);
    nf_pool_destroy(p);
    nf_backend_destroy(&l->be);
  }
}

// A prefetch copy runs on the stream nf_prefetch was given. When that is not
// the block's stream, the block freed on its own stream must still not be
// unmapped (or reused) before the copy lands: the copy's stream counts as a
// user of the block, as with record_stream. Each tier; the detector of the
// host backend counts unmaps of ranges still in use.
static void test_prefetch_other_stream(void **state) {
  nf_tier_t tiers[] = {NF_TIER_HOST_DETACHED, NF_TIER_HOST, NF_TIER_DISK};
  for (int t = 0; t < 3; t++) {
    nf_backend_t *be;
    nf_pool_t *p = nft_pool(&be, 1024 * G, G, "limit:512KiB,views:0");
    nf_stream_t A = (nf_stream_t)(uintptr_t)1, S = (nf_stream_t)(uintptr_t)2;
    nf_backend_host_set_manual_events(be, 1);
    void *b = nf_alloc(p, 4 * G, A), *e = nf_alloc(p, G, A), *c = nf_alloc(p, 2 * G, A);
    assert_true(b && e && c);
    nft_fill(b, 4 * G, 7);
    assert_int_equal(nf_offload(p, b, A, tiers[t]), NF_OK);
    nf_backend_host_complete_events(be);
    assert_int_equal(nf_offload_wait(p), NF_OK);
    assert_int_equal(nf_prefetch(p, b, S), NF_OK);
    nf_backend_host_use(be, S, b, 4 * G); // the copy back, on S, in flight
    assert_true(nft_check(b, 4 * G, 7));
    assert_int_equal(nf_free(p, b), NF_OK); // on A; S's copy still in flight
    assert_int_equal(nf_offload(p, c, A, NF_TIER_DISK), NF_OK); // something waits for A only
    void *d = nf_alloc(p, 6 * G, A); // stitching unmaps what lies free: not b's range before S is done
    assert_non_null(d);
    if (nf_backend_host_violations(be)) fail_msg("tier %d: b's range unmapped under the prefetch copy", (int)tiers[t]);
    assert_int_equal(nf_pool_check(p), NF_OK);
    nf_backend_host_set_manual_events(be, 0);
    nf_pool_destroy(p);
    nf_backend_destroy(be);
  }
}

// A 65th stream gives back the slots of streams nothing names after one
// device wait. An offload copy listed but not yet polled refused it
// ("offload copies are in flight") though the wait completes every copy: now
// the copies are finished there, the block is offloaded and its bytes intact.
static void test_streams_recycled_with_copies_listed(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool64k(&be, "limit:1MiB");
  nf_backend_host_set_manual_events(be, 1);
  nf_stream_t A = (nf_stream_t)(uintptr_t)0x500;
  void *a = nf_alloc(p, 4 * G, A);
  assert_non_null(a);
  nft_fill(a, 4 * G, 9);
  assert_int_equal(nf_offload(p, a, A, NF_TIER_HOST), NF_OK); // in flight: listed
  for (int i = 0; i < 64; i++) { // 63 more slots, then the 65th stream
    nf_stream_t s = (nf_stream_t)(uintptr_t)(0x1000 + i);
    void *x = nf_alloc(p, 1024, s);
    if (!x) fail_msg("stream %d: %s", i, nf_last_error());
    nft_fill(x, 1024, (uint64_t)i);
    assert_true(nft_check(x, 1024, (uint64_t)i));
    assert_int_equal(nf_free(p, x), NF_OK);
  }
  nf_stats_t st;
  nft_stats(p, &st);
  assert_true(st.offloaded == 4 * G && st.offloads == 1); // finished by the recycling
  assert_int_equal(nf_stream_known(p, A), 1);             // a's stream: a names it
  assert_true(nft_check(a, 4 * G, 9));
  assert_int_equal(nf_pool_check(p), NF_OK);
  assert_int_equal(nf_free(p, a), NF_OK);
  assert_int_equal(nf_backend_host_violations(be), 0);
  nf_backend_host_set_manual_events(be, 0);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// An offload still in flight on stream S, cancelled by nf_prefetch: the copy
// may still read the block, so S counts as a user of the block (as with
// record_stream). Freed on its own stream A, the block's range must not be
// unmapped or reused before S's copy is done. Each host tier; the host
// backend counts unmaps and reuses under copies in flight.
static void test_cancelled_offload_copy_guards_free(void **state) {
  (void)state;
  nf_tier_t tiers[] = {NF_TIER_HOST, NF_TIER_HOST_DETACHED};
  for (int t = 0; t < 2; t++) {
    nf_backend_t *be;
    nf_pool_t *p = nft_pool(&be, 1024 * G, G, "limit:512KiB,views:0");
    nf_stream_t A = (nf_stream_t)(uintptr_t)1, S = (nf_stream_t)(uintptr_t)2;
    nf_backend_host_set_manual_events(be, 1);
    void *b = nf_alloc(p, 4 * G, A), *e = nf_alloc(p, G, A), *c = nf_alloc(p, 2 * G, A);
    assert_true(b && e && c);
    nft_fill(b, 4 * G, 7);
    assert_int_equal(nf_offload(p, b, S, tiers[t]), NF_OK); // the copy out, on S, in flight
    assert_int_equal(nf_prefetch(p, b, S), NF_OK);           // cancels it: b never left
    assert_true(nft_check(b, 4 * G, 7));
    assert_int_equal(nf_free(p, b), NF_OK);                     // on A; S's copy still in flight
    assert_int_equal(nf_offload(p, c, A, NF_TIER_DISK), NF_OK); // something waits for A only
    void *d = nf_alloc(p, 6 * G, A); // stitching unmaps what lies free: not b's range before S is done
    assert_non_null(d);
    if (nf_backend_host_violations(be))
      fail_msg("tier %d: b's range unmapped or reused under the cancelled offload's copy", (int)tiers[t]);
    assert_int_equal(nf_pool_check(p), NF_OK);
    nf_backend_host_set_manual_events(be, 0);
    nf_pool_destroy(p);
    nf_backend_destroy(be);
  }
}

int main(void) {
  setenv("NOFRAG_QUIET_OOM", "1", 1);
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_lazy_random),
                                     cmocka_unit_test(test_cancelled_offload_orders_the_prefetch_stream),
                                     cmocka_unit_test(test_failed_prefetch_waits_for_its_copy),
                                     cmocka_unit_test(test_prefetch_other_stream),
                                     cmocka_unit_test(test_streams_recycled_with_copies_listed),
                                     cmocka_unit_test(test_cancelled_offload_copy_guards_free)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
