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
  nf_stream_t st; // the stream it was allocated on (a device reads its words there)
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

// Signature words of a block: its first 8 bytes, the first 8 of every
// granule it runs into (an interior granule mapped wrong, or at the wrong
// place, changes one), and its last whole 8-aligned 8. One page per granule is what the host
// machine can afford with ~23 GB live; a block under 16 bytes gets its first
// min(size, 8) bytes only (len: those bytes of word 0). Returns the count.
static size_t sig_words(const slot_t *s, uint64_t g, uint64_t *off, uint64_t *val) {
  size_t n = 0;
  off[n] = 0, val[n++] = s->sig;
  if (s->size < 16) return n;
  uint64_t b = g - (uint64_t)(uintptr_t)s->ptr % g;
  for (; b + 16 <= s->size; b += g) off[n] = b, val[n++] = mix64(s->sig + b);
  off[n] = (s->size - 8) & ~(uint64_t)7, val[n++] = ~s->sig; // aligned: a device writes words
  return n;
}

// Words a block of `size` bytes can have (sig_words), for the buffers.
static size_t sig_max(uint64_t size, uint64_t g) { return (size_t)(size / g) + 3; }

// Write / check a block's words: in place on the host, else through the
// device's hooks (in its memory, in stream order). 0 ok, 1 a word differs,
// -1 a device error (in err).
typedef struct sigbuf_s {
  uint64_t *off, *val, *got;
  uint64_t g;
  const nf__replay_dev *dev;
} sigbuf_t;

static int sig_write(sigbuf_t *sb, const slot_t *s, nf_stream_t st, char *err, size_t errlen) {
  size_t n = sig_words(s, sb->g, sb->off, sb->val);
  if (sb->dev) return sb->dev->put(sb->dev->ctx, st, s->ptr, n, sb->off, sb->val, err, errlen) ? -1 : 0;
  unsigned char *p = s->ptr;
  for (size_t i = 0; i < n; i++) memcpy(p + sb->off[i], &sb->val[i], s->size < 8 ? s->size : 8);
  return 0;
}

static int sig_check(sigbuf_t *sb, const slot_t *s, nf_stream_t st, char *err, size_t errlen) {
  size_t n = sig_words(s, sb->g, sb->off, sb->val);
  size_t len = s->size < 8 ? s->size : 8;
  if (sb->dev) {
    if (sb->dev->get(sb->dev->ctx, st, s->ptr, n, sb->off, sb->got, err, errlen)) return -1;
  } else {
    const unsigned char *p = s->ptr;
    for (size_t i = 0; i < n; i++) { sb->got[i] = 0; memcpy(&sb->got[i], p + sb->off[i], len); }
  }
  for (size_t i = 0; i < n; i++) {
    uint64_t want = 0, have = 0; // (a block under 8 bytes: its bytes of the word only)
    memcpy(&want, &sb->val[i], len);
    memcpy(&have, &sb->got[i], len);
    if (have != want) {
      snprintf(err, errlen, "the word at offset %llu: wrote %#llx, read %#llx", (unsigned long long)sb->off[i],
               (unsigned long long)want, (unsigned long long)have);
      return 1;
    }
  }
  return 0;
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
  const nf__replay_dev *dev = opts->dev;
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
  sigbuf_t sb = {.g = g, .dev = dev};
  uint64_t biggest = 0; // the signature buffers' size: the largest block's words
  for (size_t k = 0; opts->verify && k < ops->n_ops; k++)
    if (ops->ops[k].kind == NF_TRACE_OP_ALLOC && ops->ops[k].size > biggest) biggest = ops->ops[k].size;
  size_t nw = opts->verify ? sig_max(biggest, g) : 1;
  slot_t *slots = calloc(ops->n_slots ? ops->n_slots : 1, sizeof *slots);
  nf_stream_t *streams = calloc(ops->n_streams ? ops->n_streams : 1, sizeof *streams);
  sb.off = malloc(nw * sizeof *sb.off);
  sb.val = malloc(nw * sizeof *sb.val);
  sb.got = malloc(nw * sizeof *sb.got);
  if (!slots || !streams || !sb.off || !sb.val || !sb.got) {
    res->status = NF_ERR_NOMEM;
    if (!slots || !streams) snprintf(res->error, sizeof res->error, "out of memory for %zu replay slots", ops->n_slots);
    else snprintf(res->error, sizeof res->error, "out of memory for %zu signature words (--verify)", nw);
    goto out;
  }
  // The trace's raw handle is the stream on the simulated device (0 stays
  // the default stream, NULL); a real device names its own.
  for (size_t k = 0; k < ops->n_streams; k++)
    streams[k] = dev ? dev->stream(dev->ctx, k, ops->streams[k]) : (nf_stream_t)(uintptr_t)ops->streams[k];

  nf_status_t st = NF_OK;
  if (dev) {
    char e[256] = "";
    uint64_t dcap = 0;
    if (dev->backend(dev->ctx, g, &be, &dcap, e, sizeof e)) {
      res->status = NF_ERR_BACKEND;
      snprintf(res->error, sizeof res->error, "device backend: %s", e);
      be = NULL;
      goto out;
    }
    res->capacity = dcap;
  } else if ((st = nf_backend_host_create(&be, cap, g)) != NF_OK) {
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
  if (dev && !res->capacity) res->capacity = cfg.limit ? 0 : res->limit; // not known: the pool's default limit

  const int verify = opts->verify;
  char why[256] = "";
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
      s->st = streams[op->stream];
      if (op->size == 0) continue; // nf_alloc(0) is NULL by contract; nothing to replay
      s->ptr = nf_alloc(pool, (size_t)op->size, s->st);
      if (!s->ptr) {
        nf_status_t ast = nf_last_status();
        fail_at(res, ops, i, ast == NF_OK ? NF_ERR_INVALID : ast);
        snprintf(res->error, sizeof res->error, "%s at event %zu: %s",
                 ast == NF_ERR_OOM ? "OOM" : nf_status_str(ast), res->fail_event, nf_last_error());
        break;
      }
      if (verify) {
        s->sig = mix64(((uint64_t)i << 24) ^ op->slot ^ 0x6e6f66726167ull);
        if (sig_write(&sb, s, s->st, why, sizeof why)) {
          fail_at(res, ops, i, NF_ERR_BACKEND);
          snprintf(res->error, sizeof res->error, "device: writing the signature at event %zu: %s",
                   res->fail_event, why);
          break;
        }
      }
    } else {
      if (verify && s->ptr) {
        res->verified++;
        int bad = sig_check(&sb, s, s->st, why, sizeof why);
        if (bad) {
          fail_at(res, ops, i, bad < 0 ? NF_ERR_BACKEND : NF_ERR_INVALID);
          if (bad < 0)
            snprintf(res->error, sizeof res->error, "device: reading the signature at event %zu: %s",
                     res->fail_event, why);
          else
            snprintf(res->error, sizeof res->error,
                     "data lost: block of %llu bytes at %p (slot %u) changed before its free at event %zu (%s)",
                     (unsigned long long)s->size, s->ptr, op->slot, res->fail_event, why);
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
  if (dev && dev->drain && dev->drain(dev->ctx, why, sizeof why) && res->status == NF_OK) {
    res->status = NF_ERR_BACKEND;
    snprintf(res->error, sizeof res->error, "device: waiting for its work at the end: %s", why);
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
      int bad = sig_check(&sb, &slots[k], slots[k].st, why, sizeof why);
      if (bad) {
        res->status = bad < 0 ? NF_ERR_BACKEND : NF_ERR_INVALID;
        if (bad < 0) snprintf(res->error, sizeof res->error, "device: reading the signature at the end: %s", why);
        else
          snprintf(res->error, sizeof res->error, "data lost: block of %llu bytes at %p (slot %zu) live at the end (%s)",
                   (unsigned long long)slots[k].size, slots[k].ptr, k, why);
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
  free(sb.off);
  free(sb.val);
  free(sb.got);
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
