// RMM logging_resource_adaptor CSV logs: reader and writer (see trace.h).
//
// RMM (rapidsai/rmm, include/rmm/mr/logging_resource_adaptor.hpp) logs one
// line per call under the header "Thread,Time,Action,Pointer,Size,Stream";
// its replay benchmark (cpp/benchmarks/utilities/log_parser.hpp) accepts the
// actions "allocate", "free" and "allocate failure", reads Pointer as hex
// ("(nil)" = 0), and treats Time as an opaque string. We map allocate to
// alloc and free to free_completed (RMM's free is immediate reuse), and skip
// "allocate failure" lines: they allocated nothing, so a replay of the
// program's demand must not see them.
#include "trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RMM_HEADER "Thread,Time,Action,Pointer,Size,Stream"

// Hex with optional 0x (Pointer; Stream when RMM wrote it as a pointer) or,
// with `dec_ok` and no 0x, decimal. 0 ok, 1 not a number, 2 overflow.
static int parse_num(const char *s, size_t n, int dec_ok, uint64_t *out) {
  unsigned base = 16;
  if (n >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) { s += 2; n -= 2; }
  else if (dec_ok) base = 10;
  if (n == 0) return 1;
  uint64_t v = 0;
  int over = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned c = (unsigned char)s[i], d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (base == 16 && c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (base == 16 && c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return 1;
    if (v > (UINT64_MAX - d) / base) over = 1;
    else v = v * base + d;
  }
  if (over) return 2;
  *out = v;
  return 0;
}

// Time to microseconds: RMM wrote "HH:MM:SS:uuuuuu" (log_parser.hpp's
// parse_time) and its docs show epoch seconds "1634567890.234567". Time is
// not used by a replay, so an unrecognised form is kept as 0, not an error.
static uint64_t parse_time(const char *s, size_t n) {
  uint64_t part[4] = {0}, frac_digits = 0;
  size_t np = 0;
  int seen_dot = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (c >= '0' && c <= '9') {
      if (part[np] > UINT64_MAX / 100) return 0;
      part[np] = part[np] * 10 + (uint64_t)(c - '0');
      if (seen_dot) frac_digits++;
    } else if ((c == ':' || c == '.') && np < 3) {
      if (c == '.') seen_dot = 1;
      np++;
    } else return 0;
  }
  if (np == 1 && seen_dot) { // seconds.fraction
    while (frac_digits < 6) { part[1] *= 10; frac_digits++; }
    while (frac_digits > 6) { part[1] /= 10; frac_digits--; }
    return part[0] > UINT64_MAX / 1000000 - 1 ? 0 : part[0] * 1000000 + part[1];
  }
  if (np == 3 && part[0] < 1000 && part[1] < 60 && part[2] < 61 && part[3] < 1000000)
    return ((part[0] * 60 + part[1]) * 60 + part[2]) * 1000000 + part[3];
  return 0;
}

static nf_status_t push(nf_trace_t *t, const nf_trace_event_t *ev, char *err, size_t errlen) {
  if (t->n_events == t->cap) {
    size_t ncap = t->cap ? t->cap * 2 : 4096;
    nf_trace_event_t *ne = realloc(t->events, ncap * sizeof *ne);
    if (!ne) { nf__trace_set_err(err, errlen, "%s:%u: out of memory", t->name, ev->line); return NF_ERR_NOMEM; }
    t->events = ne;
    t->cap = ncap;
  }
  t->events[t->n_events++] = *ev;
  t->counts[ev->action]++;
  return NF_OK;
}

int nf__trace_is_rmm(const char *buf, size_t len) {
  size_t hl = strlen(RMM_HEADER);
  return len >= hl && memcmp(buf, RMM_HEADER, hl) == 0 &&
         (len == hl || buf[hl] == '\n' || buf[hl] == '\r');
}

static const char *const cols[6] = {"Thread", "Time", "Action", "Pointer", "Size", "Stream"};

static nf_status_t parse_row(nf_trace_t *t, size_t line, const char *s, size_t n, char *err, size_t errlen) {
  char q[64];
  const char *name = t->name;
  if (n && s[n - 1] == '\r') n--;
  if (n == 0) return NF_OK; // blank line (a trailing newline, typically)
  if (n > NF_TRACE_MAX_LINE) {
    nf__trace_set_err(err, errlen, "%s:%zu: line too long (more than %d bytes)", name, line, NF_TRACE_MAX_LINE);
    return NF_ERR_INVALID;
  }
  const char *f[7];
  size_t fl[7], nf = 0, b = 0;
  for (size_t i = 0; i <= n && nf < 7; i++) {
    if (i == n || s[i] == ',') { f[nf] = s + b; fl[nf++] = i - b; b = i + 1; }
  }
  if (nf != 6) {
    nf__trace_set_err(err, errlen, nf < 6 ? "%s:%zu: missing field %s (expected " RMM_HEADER ")"
                                : "%s:%zu: more than 6 fields%s (expected " RMM_HEADER ")",
            name, line, nf < 6 ? cols[nf] : "");
    return NF_ERR_INVALID;
  }
  int action;
  if (fl[2] == 8 && memcmp(f[2], "allocate", 8) == 0) action = NF_TRACE_ALLOC;
  else if (fl[2] == 4 && memcmp(f[2], "free", 4) == 0) action = NF_TRACE_FREE_COMPLETED;
  else if (fl[2] == 16 && memcmp(f[2], "allocate failure", 16) == 0) return NF_OK;
  else {
    nf__trace_quote(q, sizeof q, f[2], fl[2]);
    nf__trace_set_err(err, errlen, "%s:%zu: unknown Action '%s' (expected allocate, free or allocate failure)", name, line, q);
    return NF_ERR_INVALID;
  }
  uint64_t v[6] = {0};
  static const int which[4] = {0, 3, 4, 5}; // Thread, Pointer, Size, Stream
  for (int k = 0; k < 4; k++) {
    int c = which[k], rc;
    if (c == 3 && fl[c] == 5 && memcmp(f[c], "(nil)", 5) == 0) { v[c] = 0; continue; }
    rc = parse_num(f[c], fl[c], c != 3, &v[c]);
    if (rc) {
      nf__trace_quote(q, sizeof q, f[c], fl[c]);
      nf__trace_set_err(err, errlen, rc == 1 ? "%s:%zu: %s is not a number: '%s'" : "%s:%zu: %s overflows 64 bits: '%s'",
              name, line, cols[c], q);
      return NF_ERR_INVALID;
    }
  }
  nf_trace_event_t ev = {.action = (uint8_t)action, .line = line > UINT32_MAX ? UINT32_MAX : (uint32_t)line,
                         .addr = v[3], .size = v[4], .stream = v[5], .time_us = parse_time(f[1], fl[1])};
  return push(t, &ev, err, errlen);
}

// Line 1 must be the header; every later line is a row.
typedef struct rmm_reader_s {
  nf_trace_t *t;
  char *err;
  size_t errlen;
  int header; // line 1 was the header
} rmm_reader_t;

static nf_status_t not_rmm(const rmm_reader_t *r) {
  nf__trace_set_err(r->err, r->errlen, "%s:1: not an RMM log: the first line must be '" RMM_HEADER "'", r->t->name);
  return NF_ERR_INVALID;
}

static nf_status_t rmm_line(void *ctx, size_t line, const char *s, size_t n) {
  rmm_reader_t *r = ctx;
  if (line > 1) return parse_row(r->t, line, s, n, r->err, r->errlen);
  if (!nf__trace_is_rmm(s, n)) return not_rmm(r);
  if (n && s[n - 1] == '\r') n--;
  if (n > NF_TRACE_MAX_LINE) { // the header, then junk after a '\r'
    nf__trace_set_err(r->err, r->errlen, "%s:1: line too long (more than %d bytes)", r->t->name, NF_TRACE_MAX_LINE);
    return NF_ERR_INVALID;
  }
  r->header = 1;
  return NF_OK;
}

static nf_status_t rmm_begin(nf_trace_t *t, rmm_reader_t *r, const char *name, char *err, size_t errlen) {
  memset(t, 0, sizeof *t);
  *r = (rmm_reader_t){.t = t, .err = err, .errlen = errlen};
  t->name = strdup(name ? name : "<trace>");
  if (!t->name) { nf__trace_set_err(err, errlen, "%s: out of memory", name ? name : "<trace>"); return NF_ERR_NOMEM; }
  return NF_OK;
}

// After the last line: an input with no line at all has no header either.
static nf_status_t rmm_end(nf_status_t st, rmm_reader_t *r) {
  if (st == NF_OK && !r->header) st = not_rmm(r);
  if (st != NF_OK) nf__trace_free(r->t);
  return st;
}

nf_status_t nf__trace_parse_rmm_buffer(nf_trace_t *t, const char *name, const char *buf, size_t len, char *err,
                                       size_t errlen) {
  rmm_reader_t r;
  nf_status_t st = rmm_begin(t, &r, name, err, errlen);
  if (st == NF_OK) st = nf__trace_split_lines(buf, len, rmm_line, &r);
  return rmm_end(st, &r);
}

// Streamed line by line (nf__trace_read_lines): memory grows with the events
// kept, never with the text, so a gzip bomb of rows that keep nothing
// ("allocate failure") or a bad row after gigabytes of text costs ~1 MiB.
nf_status_t nf__trace_load_rmm(nf_trace_t *t, const char *path, char *err, size_t errlen) {
  rmm_reader_t r;
  nf_status_t st = rmm_begin(t, &r, path, err, errlen);
  // A row may end in a '\r' past the NF_TRACE_MAX_LINE bytes parse_row takes.
  if (st == NF_OK) st = nf__trace_read_lines(path, NF_TRACE_MAX_LINE + 1, rmm_line, &r, err, errlen);
  return rmm_end(st, &r);
}

nf_status_t nf__trace_write_rmm(const nf_trace_t *t, FILE *out, size_t *written) {
  // One thread: RMM's replay benchmark replays each Thread's events on its
  // own thread, and our traces are one ordered sequence.
  size_t n = 0;
  if (fprintf(out, "%s\n", RMM_HEADER) < 0) return NF_ERR_INVALID;
  for (size_t i = 0; i < t->n_events; i++) {
    const nf_trace_event_t *e = &t->events[i];
    const char *act = e->action == NF_TRACE_ALLOC ? "allocate"
                      : e->action == NF_TRACE_FREE_COMPLETED ? "free" : NULL;
    if (!act) continue; // free_requested and segment_* are not allocator calls RMM would see
    uint64_t us = e->time_us % (86400ull * 1000000ull), s = us / 1000000ull;
    if (fprintf(out, "1,%02llu:%02llu:%02llu:%06llu,%s,0x%llx,%llu,0x%llx\n", (unsigned long long)(s / 3600),
                (unsigned long long)(s / 60 % 60), (unsigned long long)(s % 60),
                (unsigned long long)(us % 1000000ull), act, (unsigned long long)e->addr,
                (unsigned long long)e->size, (unsigned long long)e->stream) < 0)
      return NF_ERR_INVALID;
    n++;
  }
  if (written) *written = n;
  return ferror(out) ? NF_ERR_INVALID : NF_OK;
}
