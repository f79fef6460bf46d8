// Trace replay engine: see replay.h.
#include "replay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct slot_s {
  void *ptr;
  uint64_t size;
  uint64_t sig;
} slot_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t mix64(uint64_t x) { // splitmix64 finalizer
  x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27; x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Signature: 8 bytes at the start and (complemented) 8 at the end of a block.
// Only these are written: the real traces keep ~23 GB live, and touching a
// page or two per block is what the host machine can afford. Blocks under 16
// bytes get the first min(size, 8) bytes only.
static void sig_write(const slot_t *s) {
  unsigned char *p = s->ptr;
  uint64_t a = s->sig, b = ~s->sig;
  memcpy(p, &a, s->size < 8 ? s->size : 8);
  if (s->size >= 16) memcpy(p + s->size - 8, &b, 8);
}

static int sig_ok(const slot_t *s) {
  const unsigned char *p = s->ptr;
  uint64_t a = s->sig, b = ~s->sig, v = 0, w = 0;
  size_t n = s->size < 8 ? s->size : 8;
  memcpy(&v, p, n);
  if (memcmp(&v, &a, n) != 0) return 0;
  if (s->size >= 16) { memcpy(&w, p + s->size - 8, 8); if (w != b) return 0; }
  return 1;
}

void nf__replay_opts_default(nf__replay_opts *o) {
  memset(o, 0, sizeof *o);
  nf_config_default(&o->cfg);
  o->check = 1;
}

static void fail_at(nf__replay_result *res, const nf__trace_ops *ops, size_t i, nf_status_t st) {
  res->status = st;
  res->fail_event = i < ops->n_ops ? (size_t)ops->ops[i].event + 1 : 0;
}

// The library's messages start with "nofrag: ", which the CLI prints once itself.
// The pool's clock in a replay: the trace's time, never going back (threads'
// rows of an RMM log may interleave out of order). A trace without times
// keeps it at 0: release_idle_ms is then never reached.
static uint64_t trace_clock(void *ctx) { return *(const uint64_t *)ctx * 1000; }

static const char *unprefixed(const char *m) { return strncmp(m, "nofrag: ", 8) == 0 ? m + 8 : m; }

nf_status_t nf__replay_run(const nf__trace_ops *ops, const nf__replay_opts *opts, nf__replay_result *res) {
  memset(res, 0, sizeof *res);
  nf_config_t cfg = opts->cfg;
  uint64_t g = opts->granule ? opts->granule : cfg.granule ? cfg.granule : NF_REPLAY_GRANULE;
  uint64_t cap = opts->capacity ? opts->capacity : NF_REPLAY_CAPACITY;
  if (cfg.limit > cap) cap = (cfg.limit + g - 1) / g * g; // capacity must cover the limit
  cfg.granule = g;
  res->granule = g;
  res->capacity = cap;
  res->limit = cfg.limit ? cfg.limit / g * g : cap;

  nf_backend_t *be = NULL;
  nf_pool_t *pool = NULL;
  slot_t *slots = calloc(ops->n_slots ? ops->n_slots : 1, sizeof *slots);
  nf_stream_t *streams = calloc(ops->n_streams ? ops->n_streams : 1, sizeof *streams);
  if (!slots || !streams) {
    res->status = NF_ERR_NOMEM;
    snprintf(res->error, sizeof res->error, "out of memory for %zu replay slots", ops->n_slots);
    goto out;
  }
  // The trace's raw handle is the stream: 0 stays the default stream (NULL).
  for (size_t k = 0; k < ops->n_streams; k++) streams[k] = (nf_stream_t)(uintptr_t)ops->streams[k];

  nf_status_t st = nf_backend_host_create(&be, cap, g);
  if (st != NF_OK) {
    res->status = st;
    snprintf(res->error, sizeof res->error, "simulated host backend (capacity %llu B, granule %llu B): %s",
             (unsigned long long)cap, (unsigned long long)g, unprefixed(nf_last_error()));
    be = NULL;
    goto out;
  }
  st = nf_pool_create(&pool, be, &cfg);
  if (st != NF_OK) {
    res->status = st;
    snprintf(res->error, sizeof res->error, "pool: %s", unprefixed(nf_last_error()));
    pool = NULL;
    goto out;
  }
  uint64_t clock_us = 0;
  nf_pool_set_clock(pool, trace_clock, &clock_us);
  nf_config_t in_force;
  nf_pool_config(pool, &in_force);
  if (in_force.limit) res->limit = in_force.limit;

  const int verify = opts->verify;
  double t0 = now_s();
  size_t i = 0;
  int at_half = 0; // the loop reached the trace's second half
  for (; i < ops->n_ops; i++) {
    const nf__trace_op *op = &ops->ops[i];
    slot_t *s = &slots[op->slot];
    if (op->time_us > clock_us) clock_us = op->time_us;
    if (i == ops->n_ops / 2) { // steady-state proxy: calls made in the second half
      nf_stats_t mid;
      nf_stats_get(pool, &mid);
      res->calls_first_half = mid.backend_calls;
      at_half = 1;
    }
    if (op->kind == NF_TRACE_OP_ALLOC) {
      s->size = op->size;
      s->ptr = NULL;
      if (op->size == 0) continue; // nf_alloc(0) is NULL by contract; nothing to replay
      s->ptr = nf_alloc(pool, (size_t)op->size, streams[op->stream]);
      if (!s->ptr) {
        nf_status_t ast = nf_last_status();
        fail_at(res, ops, i, ast == NF_OK ? NF_ERR_INVALID : ast);
        snprintf(res->error, sizeof res->error, "%s at event %zu: %s",
                 ast == NF_ERR_OOM ? "OOM" : nf_status_str(ast), res->fail_event, nf_last_error());
        break;
      }
      if (verify) {
        s->sig = mix64(((uint64_t)i << 24) ^ op->slot ^ 0x6e6f66726167ull);
        sig_write(s);
      }
    } else {
      if (verify && s->ptr) {
        res->verified++;
        if (!sig_ok(s)) {
          fail_at(res, ops, i, NF_ERR_INVALID);
          snprintf(res->error, sizeof res->error,
                   "data lost: block of %llu bytes at %p (slot %u) changed before its free at event %zu",
                   (unsigned long long)s->size, s->ptr, op->slot, res->fail_event);
          break;
        }
      }
      nf_status_t fst = nf_free(pool, s->ptr);
      if (fst != NF_OK) {
        fail_at(res, ops, i, fst);
        snprintf(res->error, sizeof res->error, "nf_free failed at event %zu: %s", res->fail_event,
                 nf_last_error());
        break;
      }
      s->ptr = NULL;
    }
    if (opts->sample && (opts->sample_every <= 1 || (i + 1) % opts->sample_every == 0)) {
      nf_stats_t cur;
      nf_stats_get(pool, &cur);
      opts->sample(opts->sample_ctx, i + 1, &cur);
    }
  }
  res->seconds = now_s() - t0;
  if (opts->sample && i > 0 && opts->sample_every > 1 && i % opts->sample_every != 0) {
    nf_stats_t cur; // the last op done (or the failing one's predecessor)
    nf_stats_get(pool, &cur);
    opts->sample(opts->sample_ctx, i, &cur);
  }
  res->ops_done = i;
  nf_stats_get(pool, &res->stats);
  // A replay stopped (an OOM under --limit) before the second half made no
  // call there: every call it made belongs to the first half.
  if (!at_half) res->calls_first_half = res->stats.backend_calls;
  res->calls_second_half = res->stats.backend_calls - res->calls_first_half;
  if (res->status == NF_OK && verify) { // blocks still live at the end
    for (size_t k = 0; k < ops->n_slots; k++) {
      if (!slots[k].ptr) continue;
      res->verified++;
      if (!sig_ok(&slots[k])) {
        res->status = NF_ERR_INVALID;
        snprintf(res->error, sizeof res->error, "data lost: block of %llu bytes at %p (slot %zu) live at the end",
                 (unsigned long long)slots[k].size, slots[k].ptr, k);
        break;
      }
    }
  }
  if (res->status == NF_OK && opts->check) {
    res->check = nf_pool_check(pool);
    if (res->check != NF_OK) {
      res->status = res->check;
      snprintf(res->error, sizeof res->error, "nf_pool_check after the replay: %s", nf_last_error());
    }
  }
out:
  if (pool) nf_pool_destroy(pool);
  if (be) nf_backend_destroy(be);
  free(slots);
  free(streams);
  return res->status;
}

// Probes a bisection over [lo, hi] (hi known to complete) takes at most.
static unsigned ceil_log2(uint64_t m) {
  unsigned k = 0;
  while (((uint64_t)1 << k) < m && k < 63) k++;
  return k;
}

static void announce(const nf__replay_opts *o, unsigned k, unsigned n, uint64_t limit) {
  if (o->probe) o->probe(o->sample_ctx, k, n, limit);
}

nf_status_t nf__replay_min_capacity(const nf__trace_ops *ops, const nf__replay_opts *opts, uint64_t upper,
                                    nf__replay_bisect *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (opts->cfg.spill) { // every limit completes with spill: no minimum to find (the CLI refuses it first)
    snprintf(err, errlen, "min capacity is meaningless with spill:host: the trace completes under any limit");
    return NF_ERR_INVALID;
  }
  nf__replay_opts o = *opts;
  uint64_t g = o.granule ? o.granule : o.cfg.granule ? o.cfg.granule : NF_REPLAY_GRANULE;
  o.granule = g;
  double t0 = now_s();
  nf__replay_result *r = malloc(sizeof *r);
  if (!r) { snprintf(err, errlen, "out of memory"); return NF_ERR_NOMEM; }
  nf_status_t st = NF_OK;
  if (!upper) { // an unlimited run gives the upper bound
    o.cfg.limit = 0;
    announce(&o, out->probes + 1, 0, 0);
    st = nf__replay_run(ops, &o, r);
    out->probes++;
    if (st != NF_OK) { snprintf(err, errlen, "unlimited replay: %s", r->error); goto done; }
    upper = r->stats.physical_peak;
  }
  uint64_t lo = (ops->peak_live + g - 1) / g, hi = (upper + g - 1) / g;
  if (lo == 0) lo = 1;
  if (hi < lo) hi = lo;
  out->lower = lo * g;
  // The upper bound must be proven: the limit changes the pool's policy
  // (release threshold, stitching), so "peak physical unlimited" is not by
  // itself a limit that works. Double until a probe completes.
  uint64_t lo0 = lo;
  for (;;) {
    o.cfg.limit = hi * g;
    announce(&o, out->probes + 1, out->probes + 1 + ceil_log2(hi - lo0 + 1), hi * g); // if this one completes
    st = nf__replay_run(ops, &o, r);
    out->probes++;
    if (st == NF_OK) { out->at_min = *r; break; }
    if (st != NF_ERR_OOM) { snprintf(err, errlen, "probe at limit %llu: %s", (unsigned long long)(hi * g), r->error); goto done; }
    if (hi * g >= NF_REPLAY_CAPACITY) {
      snprintf(err, errlen, "no limit up to %llu bytes completes: %s", (unsigned long long)(hi * g), r->error);
      st = NF_ERR_OOM;
      goto done;
    }
    lo = hi + 1;
    hi *= 2;
  }
  out->upper = hi * g;
  // Smallest completing limit in [lo, hi]; hi is known to complete.
  unsigned n = out->probes + (lo < hi ? ceil_log2(hi - lo + 1) : 0);
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    o.cfg.limit = mid * g;
    announce(&o, out->probes + 1, n, mid * g);
    st = nf__replay_run(ops, &o, r);
    out->probes++;
    if (st == NF_OK) { hi = mid; out->at_min = *r; }
    else if (st == NF_ERR_OOM) lo = mid + 1;
    else { snprintf(err, errlen, "probe at limit %llu: %s", (unsigned long long)(mid * g), r->error); goto done; }
  }
  st = NF_OK;
  out->min_capacity = hi * g;
done:
  out->seconds = now_s() - t0;
  free(r);
  return st;
}
