// Trace reader and replay preprocessing. See trace.h for the format.
//
// Files are read with gzread in large chunks (zlib reads plain text
// transparently) and split into lines here, so that the file and in-memory
// paths share one line parser and embedded NUL bytes cannot hide part of a
// line from it.
#include "trace.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static const char *const action_names[NF_TRACE_NACTIONS] = {
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free"};
static const char *const field_names[5] = {"ACTION", "ADDR", "SIZE", "STREAM", "TIME_US"};

void nf__trace_set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || !errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

// Copy at most 40 bytes of a token for a message, replacing bytes that
// would garble a terminal (fuzzed input can hold anything).
void nf__trace_quote(char *out, size_t outlen, const char *s, size_t n) {
  size_t k = 0, lim = n > 40 ? 40 : n;
  for (size_t i = 0; i < lim && k + 1 < outlen; i++) {
    unsigned char c = (unsigned char)s[i];
    out[k++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
  }
  if (n > lim && k + 4 < outlen) { memcpy(out + k, "...", 3); k += 3; }
  out[k] = 0;
}

// ---------------------------------------------------------------- parsing

typedef struct parser_s {
  nf_trace_t *t;
  const char *name;
  size_t line;  // number of the line being parsed (1-based)
  char *err;
  size_t errlen;
} parser_t;

static nf_status_t push_event(parser_t *ps, const nf_trace_event_t *ev) {
  nf_trace_t *t = ps->t;
  if (t->n_events == t->cap) {
    size_t ncap = t->cap ? t->cap * 2 : 4096;
    nf_trace_event_t *ne = realloc(t->events, ncap * sizeof *ne);
    if (!ne) {
      nf__trace_set_err(ps->err, ps->errlen, "%s:%zu: out of memory (%zu events)", ps->name, ps->line, t->n_events);
      return NF_ERR_NOMEM;
    }
    t->events = ne;
    t->cap = ncap;
  }
  t->events[t->n_events++] = *ev;
  t->counts[ev->action]++;
  return NF_OK;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }

// Unsigned decimal, digits only (strtoull would accept "-1", "+1", " 1",
// "0x1" in base 0 and clamp on overflow). Returns 0 ok, 1 not a number,
// 2 overflow.
static int parse_u64(const char *s, size_t n, uint64_t *out) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned d = (unsigned)(unsigned char)s[i] - '0';
    if (d > 9) return 1;
    if (v > (UINT64_MAX - d) / 10) {
      for (i++; i < n; i++) // still report a non-number as such
        if ((unsigned)(unsigned char)s[i] - '0' > 9) return 1;
      return 2;
    }
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}

// Parse one line (without its '\n').
static nf_status_t parse_line(parser_t *ps, const char *s, size_t n) {
  char q[64];
  if (n > NF_TRACE_MAX_LINE) {
    nf__trace_set_err(ps->err, ps->errlen, "%s:%zu: line too long (more than %d bytes)", ps->name, ps->line,
            NF_TRACE_MAX_LINE);
    return NF_ERR_INVALID;
  }
  // Split into at most 6 whitespace-separated tokens (a 6th is an error).
  const char *tok[6];
  size_t len[6], nt = 0, i = 0;
  while (i < n && is_space(s[i])) i++;
  if (i == n) return NF_OK;         // blank line
  if (s[i] == '#') return NF_OK;    // comment
  while (i < n && nt < 6) {
    size_t b = i;
    while (i < n && !is_space(s[i])) i++;
    tok[nt] = s + b;
    len[nt++] = i - b;
    while (i < n && is_space(s[i])) i++;
  }
  int action = -1;
  for (int a = 0; a < NF_TRACE_NACTIONS; a++)
    if (strlen(action_names[a]) == len[0] && memcmp(tok[0], action_names[a], len[0]) == 0) action = a;
  if (action < 0) {
    nf__trace_quote(q, sizeof q, tok[0], len[0]);
    nf__trace_set_err(ps->err, ps->errlen, "%s:%zu: unknown action '%s'", ps->name, ps->line, q);
    return NF_ERR_INVALID;
  }
  if (nt < 5) {
    nf__trace_set_err(ps->err, ps->errlen, "%s:%zu: missing field %s (expected ACTION ADDR SIZE STREAM TIME_US)",
            ps->name, ps->line, field_names[nt]);
    return NF_ERR_INVALID;
  }
  if (nt > 5) {
    nf__trace_quote(q, sizeof q, tok[5], len[5]);
    nf__trace_set_err(ps->err, ps->errlen, "%s:%zu: extra field '%s' after TIME_US", ps->name, ps->line, q);
    return NF_ERR_INVALID;
  }
  uint64_t v[4];
  for (int f = 0; f < 4; f++) {
    int rc = parse_u64(tok[f + 1], len[f + 1], &v[f]);
    if (rc) {
      nf__trace_quote(q, sizeof q, tok[f + 1], len[f + 1]);
      nf__trace_set_err(ps->err, ps->errlen, rc == 1 ? "%s:%zu: %s is not an unsigned decimal number: '%s'"
                                           : "%s:%zu: %s overflows 64 bits: '%s'",
              ps->name, ps->line, field_names[f + 1], q);
      return NF_ERR_INVALID;
    }
  }
  nf_trace_event_t ev = {.action = (uint8_t)action,
                         .line = ps->line > UINT32_MAX ? UINT32_MAX : (uint32_t)ps->line,
                         .addr = v[0], .size = v[1], .stream = v[2], .time_us = v[3]};
  return push_event(ps, &ev);
}

// ---------------------------------------------------------------- lines

// Hand every complete line of buf[0..len) to fn, numbering on from *line;
// returns in *used how many bytes were consumed. With `final`, a last line
// without '\n' is handed over too.
static nf_status_t split_lines(nf__trace_line_fn fn, void *ctx, size_t *line, const char *buf, size_t len,
                               int final, size_t *used) {
  size_t off = 0;
  while (off < len) {
    const char *nl = memchr(buf + off, '\n', len - off);
    if (!nl && !final) break;
    size_t n = nl ? (size_t)(nl - (buf + off)) : len - off;
    nf_status_t st = fn(ctx, ++*line, buf + off, n);
    if (st != NF_OK) return st;
    off += n + (nl ? 1 : 0);
  }
  *used = off;
  return NF_OK;
}

nf_status_t nf__trace_split_lines(const char *buf, size_t len, nf__trace_line_fn fn, void *ctx) {
  size_t line = 0, used = 0;
  return split_lines(fn, ctx, &line, buf ? buf : "", buf ? len : 0, 1, &used);
}

#define CHUNK ((size_t)1 << 20)

nf_status_t nf__trace_read_lines(const char *path, size_t max_line, nf__trace_line_fn fn, void *ctx, char *err,
                                 size_t errlen) {
  if (!path) { nf__trace_set_err(err, errlen, "<trace>: no path"); return NF_ERR_INVALID; }
  errno = 0;
  gzFile gz = gzopen(path, "rb");
  if (!gz) {
    nf__trace_set_err(err, errlen, "%s: cannot open: %s", path, errno ? strerror(errno) : "out of memory");
    return NF_ERR_INVALID;
  }
  // A carried-over partial line is at most max_line bytes (else it is
  // already an error), so CHUNK + that always has room for a read.
  size_t bufsz = CHUNK + max_line + 1, line = 0, have = 0;
  char *buf = malloc(bufsz);
  nf_status_t st = NF_OK;
  if (!buf) { nf__trace_set_err(err, errlen, "%s: out of memory", path); st = NF_ERR_NOMEM; }
  gzbuffer(gz, 256 * 1024);
  while (st == NF_OK) {
    int got = gzread(gz, buf + have, (unsigned)CHUNK);
    if (got <= 0) {
      // Truncated or corrupt gzip data shows up here (Z_BUF_ERROR "unexpected
      // end of file", Z_DATA_ERROR) and must not be blamed on the cut line.
      int zerr = Z_OK;
      const char *msg = gzerror(gz, &zerr);
      if (got < 0 || (zerr != Z_OK && zerr != Z_STREAM_END)) {
        size_t pl = strlen(path); // zlib prefixes its message with the path
        if (zerr != Z_ERRNO && strncmp(msg, path, pl) == 0 && strncmp(msg + pl, ": ", 2) == 0) msg += pl + 2;
        nf__trace_set_err(err, errlen, "%s:%zu: read error: %s", path, line + 1,
                zerr == Z_ERRNO ? strerror(errno) : msg);
        st = NF_ERR_INVALID;
        break;
      }
      got = 0;
    }
    have += (size_t)got;
    size_t used = 0;
    st = split_lines(fn, ctx, &line, buf, have, got == 0, &used);
    if (st != NF_OK || got == 0) break;
    memmove(buf, buf + used, have - used);
    have -= used;
    if (have > max_line) {
      // The line's start is enough to refuse it (fn says why: too long, or
      // not the header it expected); what follows is never read.
      st = fn(ctx, ++line, buf, have);
      if (st == NF_OK) {
        nf__trace_set_err(err, errlen, "%s:%zu: line too long (more than %zu bytes)", path, line, max_line);
        st = NF_ERR_INVALID;
      }
    }
  }
  gzclose(gz);
  free(buf);
  return st;
}

// ---------------------------------------------------------------- text traces

static nf_status_t text_line(void *ctx, size_t line, const char *s, size_t n) {
  parser_t *ps = ctx;
  ps->line = line;
  return parse_line(ps, s, n);
}

static void trace_reset(nf_trace_t *t) { memset(t, 0, sizeof *t); }

void nf__trace_free(nf_trace_t *t) {
  if (!t) return;
  free(t->name);
  free(t->events);
  trace_reset(t);
}

static nf_status_t trace_begin(nf_trace_t *t, parser_t *ps, const char *name, char *err, size_t errlen) {
  trace_reset(t);
  t->name = strdup(name ? name : "<trace>");
  if (!t->name) { nf__trace_set_err(err, errlen, "%s: out of memory", name ? name : "<trace>"); return NF_ERR_NOMEM; }
  *ps = (parser_t){.t = t, .name = t->name, .line = 0, .err = err, .errlen = errlen};
  return NF_OK;
}

nf_status_t nf__trace_parse_buffer(nf_trace_t *t, const char *name, const char *buf, size_t len,
                                   char *err, size_t errlen) {
  parser_t ps;
  nf_status_t st = trace_begin(t, &ps, name, err, errlen);
  if (st == NF_OK) st = nf__trace_split_lines(buf, len, text_line, &ps);
  if (st != NF_OK) nf__trace_free(t);
  return st;
}

nf_status_t nf__trace_load(nf_trace_t *t, const char *path, char *err, size_t errlen) {
  parser_t ps; // a NULL path: trace_begin names it "<trace>", nf__trace_read_lines refuses it
  nf_status_t st = trace_begin(t, &ps, path, err, errlen);
  if (st == NF_OK) st = nf__trace_read_lines(path, NF_TRACE_MAX_LINE, text_line, &ps, err, errlen);
  if (st != NF_OK) nf__trace_free(t);
  return st;
}

// ---------------------------------------------------------------- address map

// Open addressing with linear probing and backward-shift deletion: a few
// hundred thousand inserts and deletes per trace, no tombstones to clean up.
typedef struct map_entry_s { uint64_t key; uint64_t val; uint8_t used; } map_entry_t;
typedef struct map_s { map_entry_t *e; size_t cap, n; } map_t; // cap: power of two

static size_t map_hash(const map_t *m, uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return (size_t)k & (m->cap - 1);
}

static map_entry_t *map_find(const map_t *m, uint64_t key) {
  if (!m->cap) return NULL;
  for (size_t i = map_hash(m, key);; i = (i + 1) & (m->cap - 1)) {
    if (!m->e[i].used) return NULL;
    if (m->e[i].key == key) return &m->e[i];
  }
}

static int map_grow(map_t *m) {
  size_t ncap = m->cap ? m->cap * 2 : 1024;
  map_entry_t *old = m->e;
  size_t ocap = m->cap;
  m->e = calloc(ncap, sizeof *m->e);
  if (!m->e) { m->e = old; return -1; }
  m->cap = ncap;
  for (size_t j = 0; j < ocap; j++) {
    if (!old[j].used) continue;
    size_t i = map_hash(m, old[j].key);
    while (m->e[i].used) i = (i + 1) & (m->cap - 1);
    m->e[i] = old[j];
  }
  free(old);
  return 0;
}

// Insert a key known to be absent. Returns 0, or -1 when out of memory.
static int map_put(map_t *m, uint64_t key, uint64_t val) {
  if ((m->n + 1) * 2 > m->cap && map_grow(m) != 0) return -1;
  size_t i = map_hash(m, key);
  while (m->e[i].used) i = (i + 1) & (m->cap - 1);
  m->e[i] = (map_entry_t){.key = key, .val = val, .used = 1};
  m->n++;
  return 0;
}

static void map_del(map_t *m, map_entry_t *e) {
  size_t i = (size_t)(e - m->e), mask = m->cap - 1;
  for (size_t j = (i + 1) & mask; m->e[j].used; j = (j + 1) & mask) {
    size_t h = map_hash(m, m->e[j].key);
    // Move entry j into the hole at i unless its home lies cyclically in (i, j].
    if (((j - h) & mask) >= ((j - i) & mask)) { m->e[i] = m->e[j]; i = j; }
  }
  m->e[i].used = 0;
  m->n--;
}

static void map_free(map_t *m) { free(m->e); m->e = NULL; m->cap = m->n = 0; }

// ---------------------------------------------------------------- replay ops

void nf__trace_ops_free(nf__trace_ops *o) {
  if (!o) return;
  free(o->ops);
  free(o->streams);
  memset(o, 0, sizeof *o);
}

// Live block bookkeeping while building: the size each slot was allocated with.
typedef struct slot_info_s { uint64_t size; } slot_info_t;

nf_status_t nf__trace_ops_build(nf__trace_ops *o, const nf_trace_t *t, char *err, size_t errlen) {
  memset(o, 0, sizeof *o);
  const char *name = t->name ? t->name : "<trace>";
  if (t->n_events > UINT32_MAX) {
    nf__trace_set_err(err, errlen, "%s: too many events (%zu) to replay", name, t->n_events);
    return NF_ERR_INVALID;
  }
  size_t n_allocs = t->counts[NF_TRACE_ALLOC], n_frees = t->counts[NF_TRACE_FREE_COMPLETED];
  map_t live = {0}, segs = {0}, streams = {0};
  slot_info_t *slots = NULL;
  uint32_t *free_slots = NULL; // stack of slot ids to reuse
  size_t n_free_slots = 0, cap_streams = 0;
  nf_status_t st = NF_OK;
  uint64_t cur_live = 0, cur_seg = 0;

  o->ops = malloc((n_allocs + n_frees + 1) * sizeof *o->ops);
  slots = malloc((n_allocs + 1) * sizeof *slots);
  free_slots = malloc((n_allocs + 1) * sizeof *free_slots);
  if (!o->ops || !slots || !free_slots) goto nomem;

  for (size_t k = 0; k < t->n_events; k++) {
    const nf_trace_event_t *ev = &t->events[k];
    map_entry_t *e;
    switch (ev->action) {
    case NF_TRACE_ALLOC: {
      if (map_find(&live, ev->addr)) {
        nf__trace_set_err(err, errlen, "%s:%u: alloc of live address %llu", name, ev->line, (unsigned long long)ev->addr);
        goto invalid;
      }
      uint32_t slot = n_free_slots ? free_slots[--n_free_slots] : (uint32_t)o->n_slots++;
      if (map_put(&live, ev->addr, slot) != 0) goto nomem;
      slots[slot].size = ev->size;
      e = map_find(&streams, ev->stream);
      if (!e) {
        if (o->n_streams == cap_streams) {
          size_t nc = cap_streams ? cap_streams * 2 : 8;
          uint64_t *ns = realloc(o->streams, nc * sizeof *ns);
          if (!ns) goto nomem;
          o->streams = ns;
          cap_streams = nc;
        }
        o->streams[o->n_streams] = ev->stream;
        if (map_put(&streams, ev->stream, o->n_streams) != 0) goto nomem;
        e = map_find(&streams, ev->stream);
        o->n_streams++;
      }
      o->ops[o->n_ops++] = (nf__trace_op){.kind = NF_TRACE_OP_ALLOC, .slot = slot,
                                          .stream = (uint32_t)e->val, .event = (uint32_t)k, .size = ev->size,
                                          .time_us = ev->time_us};
      // Sizes are 64-bit; a fuzzed trace can overflow the sum, which would
      // make peak_live meaningless, so clamp instead of wrapping.
      cur_live = ev->size > UINT64_MAX - cur_live ? UINT64_MAX : cur_live + ev->size;
      if (cur_live > o->peak_live) o->peak_live = cur_live;
      o->n_allocs++;
      break;
    }
    case NF_TRACE_FREE_REQUESTED:
    case NF_TRACE_FREE_COMPLETED: {
      e = map_find(&live, ev->addr);
      if (!e) {
        nf__trace_set_err(err, errlen, "%s:%u: %s of unknown address %llu", name, ev->line,
                action_names[ev->action], (unsigned long long)ev->addr);
        goto invalid;
      }
      uint32_t slot = (uint32_t)e->val;
      if (slots[slot].size != ev->size) {
        nf__trace_set_err(err, errlen, "%s:%u: %s size %llu differs from the alloc's %llu", name, ev->line,
                action_names[ev->action], (unsigned long long)ev->size, (unsigned long long)slots[slot].size);
        goto invalid;
      }
      if (ev->action == NF_TRACE_FREE_REQUESTED) { o->n_free_requested++; break; }
      map_del(&live, e);
      free_slots[n_free_slots++] = slot;
      o->ops[o->n_ops++] = (nf__trace_op){.kind = NF_TRACE_OP_FREE, .slot = slot, .stream = 0,
                                          .event = (uint32_t)k, .size = ev->size, .time_us = ev->time_us};
      cur_live = cur_live >= ev->size ? cur_live - ev->size : 0;
      o->n_frees++;
      break;
    }
    case NF_TRACE_SEGMENT_ALLOC:
      if (map_find(&segs, ev->addr)) {
        nf__trace_set_err(err, errlen, "%s:%u: segment_alloc of live segment %llu", name, ev->line,
                (unsigned long long)ev->addr);
        goto invalid;
      }
      if (map_put(&segs, ev->addr, ev->size) != 0) goto nomem;
      cur_seg = ev->size > UINT64_MAX - cur_seg ? UINT64_MAX : cur_seg + ev->size;
      if (cur_seg > o->native_peak_reserved) o->native_peak_reserved = cur_seg;
      o->n_segment_alloc++;
      break;
    case NF_TRACE_SEGMENT_FREE:
      e = map_find(&segs, ev->addr);
      if (!e) {
        nf__trace_set_err(err, errlen, "%s:%u: segment_free of unknown segment %llu", name, ev->line,
                (unsigned long long)ev->addr);
        goto invalid;
      }
      // PyTorch reports the segment's size; trust the recorded one so that
      // the running sum stays exact.
      cur_seg = cur_seg >= e->val ? cur_seg - e->val : 0;
      map_del(&segs, e);
      o->n_segment_free++;
      break;
    default:
      nf__trace_set_err(err, errlen, "%s:%u: bad action %u", name, ev->line, ev->action);
      goto invalid;
    }
  }
  o->n_events = t->n_events;
  o->live_at_end = live.n;
  goto out;
nomem:
  nf__trace_set_err(err, errlen, "%s: out of memory building replay ops", name);
  st = NF_ERR_NOMEM;
  goto fail;
invalid:
  st = NF_ERR_INVALID;
fail:
  nf__trace_ops_free(o);
out:
  map_free(&live);
  map_free(&segs);
  map_free(&streams);
  free(slots);
  free(free_slots);
  return st;
}

// The chart of recorded segments (--html) must sum what nf__trace_ops_build
// sums: a segment_free counts the size recorded at its segment_alloc (a
// malformed trace may give another), through the same address map.
uint64_t *nf__trace_segment_sizes(const nf_trace_t *t) {
  uint64_t *sz = malloc((t->n_events ? t->n_events : 1) * sizeof *sz);
  map_t segs = {0};
  if (!sz) return NULL;
  for (size_t k = 0; k < t->n_events; k++) {
    const nf_trace_event_t *ev = &t->events[k];
    sz[k] = ev->size;
    if (ev->action == NF_TRACE_SEGMENT_ALLOC) {
      if (!map_find(&segs, ev->addr) && map_put(&segs, ev->addr, ev->size) != 0) {
        map_free(&segs);
        free(sz);
        return NULL;
      }
    } else if (ev->action == NF_TRACE_SEGMENT_FREE) {
      map_entry_t *e = map_find(&segs, ev->addr);
      sz[k] = e ? e->val : 0; // unknown: nf__trace_ops_build refuses the trace
      if (e) map_del(&segs, e);
    }
  }
  map_free(&segs);
  return sz;
}
