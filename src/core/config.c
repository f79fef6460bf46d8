// Configuration strings: defaults, parsing ("key:value,key:value") and
// formatting back to a string that parses to the same nf_config_t.
//
// Design notes:
//  * The parser works on a private copy of the config and assigns it only when
//    the whole string is valid, so a failed parse never half-applies.
//  * No locale-dependent functions (isspace, strtod): a config string must mean
//    the same thing under every locale, and ctype on a negative char is UB.
//  * Sizes are computed exactly in integers (decimal fractions included), and
//    every multiplication/addition is overflow-checked, so "16EiB"-style
//    values are rejected instead of wrapping around.
//  * release_threshold has two named values stored as sentinels (internal.h,
//    shared with the pool, which resolves "auto" from the limit):
//      NF_RELEASE_NEVER = UINT64_MAX      ("never" / "inf")
//      NF_RELEASE_AUTO  = UINT64_MAX - 1  ("auto", the default)
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "core/core.h"
#include "nofrag.h"

#define NF_CONFIG_MIN_GRANULE ((uint64_t)4096)
#define NF_CONFIG_MAX_SMALL (64 * NF_MiB)
#define NF_CONFIG_MAX_DEVICE 1023
#define NF_CONFIG_MAX_COUNT (1 << 30) // release_after, release_idle_ms
#define NF_CONFIG_MAX_VIEWS (1 << 24)

// At most this many characters of user input are quoted back in a message, so
// that a megabyte of garbage yields a short, readable error.
#define QUOTE_MAX 48
#define QUOTE_BUF (QUOTE_MAX * 4 + 4) // each byte may read \xNN, then "..."

static const char VALID_KEYS[] =
    "limit, reserve, release_threshold, retain, granule, small_max, va_chunk, "
    "device, backend, host_capacity, release_after, tight, trace, trace_max, spill, spill_limit, spill_reserve, offload_dir, views, release_idle_ms, units, edges";

nf_status_t nf_config_default(nf_config_t *cfg) {
  if (!cfg) return NF_ERR_INVALID;
  memset(cfg, 0, sizeof *cfg);
  cfg->limit = 0;                                   // backend capacity
  cfg->reserve = 0;                                 // nothing created up front
  cfg->release_threshold = NF_RELEASE_AUTO;  // pool derives it from the limit
  cfg->retain = 0;                                  // release unmapped granules
  cfg->granule = 0;                                 // backend's granularity
  cfg->small_max = 1 * NF_MiB;
  cfg->release_after = 4096;
  cfg->va_chunk = 0;                                // pool: 4 x limit, min 1 GiB
  cfg->device = 0;
  cfg->backend = NF_BACKEND_HOST;
  cfg->host_capacity = 0;                           // host backend's default
  cfg->trace_max = 256 * NF_MiB;                    // trace recording: off (trace ""), bounded
  cfg->views = 16384;                               // parked views (vm.max_map_count is 65,530)
  cfg->release_idle_ms = 10000;                     // as jemalloc's dirty_decay_ms: longer than a step
  cfg->edges = 1;                                   // edge sharing: only where a request would fail
  return NF_OK;
}

// ------------------------------------------------------------------ helpers

static int is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static char lower(char c) { return (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c; }

// A token is a [begin, end) slice of the input string (never NUL-terminated).
typedef struct {
  const char *p;
  size_t n;
} tok_t;

static tok_t trim(const char *b, const char *e) {
  while (b < e && is_ws(*b)) b++;
  while (e > b && is_ws(e[-1])) e--;
  return (tok_t){b, (size_t)(e - b)};
}

static int tok_eq(tok_t t, const char *s) { return strlen(s) == t.n && memcmp(t.p, s, t.n) == 0; }

static int tok_ieq(tok_t t, const char *s) {
  if (strlen(s) != t.n) return 0;
  for (size_t i = 0; i < t.n; i++)
    if (lower(t.p[i]) != s[i]) return 0;
  return 1;
}

// Copy a token into `out` for quoting in a message: bytes outside printable
// ASCII become \xNN, and long tokens are cut with "...".
static void quote(char out[QUOTE_BUF], tok_t t) {
  size_t n = t.n > QUOTE_MAX ? QUOTE_MAX : t.n, i, o = 0;
  // (Both a non-ASCII and a control character read '?' before; the message
  // stays ASCII.)
  for (i = 0; i < n; i++) {
    unsigned char c = (unsigned char)t.p[i];
    if (c >= 0x20 && c < 0x7f) {
      out[o++] = (char)c;
    } else {
      static const char hex[] = "0123456789abcdef";
      out[o++] = '\\', out[o++] = 'x', out[o++] = hex[c >> 4], out[o++] = hex[c & 15];
    }
  }
  if (t.n > QUOTE_MAX) out[o++] = '.', out[o++] = '.', out[o++] = '.';
  out[o] = '\0';
}

// snprintf into the caller's buffer; safe for err == NULL and errlen 0 or 1.
static nf_status_t fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static nf_status_t fail(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    err[errlen - 1] = '\0'; // vsnprintf does this too; belt and braces
  }
  return NF_ERR_CONFIG;
}

// ------------------------------------------------------------------ values

typedef struct {
  const char *name;
  uint64_t mult;
} suffix_t;

// Matched case-insensitively. K/M/G/T alone are decimal (as KB...), the
// "i" forms binary. "B" is bytes.
static const suffix_t SUFFIXES[] = {
    {"b", 1},
    {"k", 1000ull},          {"kb", 1000ull},          {"kib", (uint64_t)1 << 10},
    {"m", 1000000ull},       {"mb", 1000000ull},       {"mib", (uint64_t)1 << 20},
    {"g", 1000000000ull},    {"gb", 1000000000ull},    {"gib", (uint64_t)1 << 30},
    {"t", 1000000000000ull}, {"tb", 1000000000000ull}, {"tib", (uint64_t)1 << 40},
    // The bound itself (NF_CONFIG_MAX_BYTES) is 1 PiB: it must be writable the way errors state it.
    {"p", 1000000000000000ull}, {"pb", 1000000000000000ull}, {"pib", (uint64_t)1 << 50},
};

// Parse a size such as "123", "40GiB", "1.5 GiB", "512mb". Fractions are
// exact and round down to whole bytes. On error, writes a message and returns
// NF_ERR_CONFIG; `what` names the key for the message.
static nf_status_t parse_size(tok_t v, const char *what, uint64_t *out, char *err, size_t errlen) {
  char q[QUOTE_BUF];
  quote(q, v);
  if (v.n == 0) return fail(err, errlen, "%s: empty value", what);
  const char *s = v.p, *e = v.p + v.n;
  if (*s == '-') return fail(err, errlen, "%s: negative value '%s' is not allowed", what, q);
  if (!is_digit(*s))
    return fail(err, errlen, "%s: '%s' is not a size (expected a number such as 40GiB, 512MiB or 123)",
                what, q);

  uint64_t ip = 0;
  for (; s < e && is_digit(*s); s++) {
    uint64_t d = (uint64_t)(*s - '0');
    if (ip > (UINT64_MAX - d) / 10) return fail(err, errlen, "%s: '%s' overflows 64 bits", what, q);
    ip = ip * 10 + d;
  }

  // Fraction: up to 9 significant digits (more would not fit the exact
  // arithmetic below; trailing zeros beyond that are fine).
  uint64_t frac = 0, scale = 1;
  int has_frac = 0;
  if (s < e && *s == '.') {
    s++;
    if (s >= e || !is_digit(*s))
      return fail(err, errlen, "%s: '%s': expected a digit after '.'", what, q);
    for (int nd = 0; s < e && is_digit(*s); s++, nd++) {
      if (nd < 9) {
        frac = frac * 10 + (uint64_t)(*s - '0');
        scale *= 10;
      } else if (*s != '0') {
        return fail(err, errlen, "%s: '%s' has more than 9 significant decimal places", what, q);
      }
    }
    has_frac = 1;
  }

  while (s < e && is_ws(*s)) s++;
  const char *sb = s;
  while (s < e && is_alpha(*s)) s++;
  tok_t suf = {sb, (size_t)(s - sb)};
  if (s < e) {
    // Something that is neither a suffix letter nor trailing space (which
    // trim() already removed): a percentage, a second number, punctuation.
    if (*s == '%')
      return fail(err, errlen,
                  "%s: percentages are not supported ('%s'); give a byte size such as 40GiB", what, q);
    return fail(err, errlen, "%s: unexpected characters in '%s'", what, q);
  }

  uint64_t mult = 1;
  if (suf.n > 0) {
    size_t i, ns = sizeof SUFFIXES / sizeof SUFFIXES[0];
    for (i = 0; i < ns; i++)
      if (tok_ieq(suf, SUFFIXES[i].name)) break;
    if (i == ns) {
      char qs[QUOTE_BUF];
      quote(qs, suf);
      return fail(err, errlen,
                  "%s: unknown size suffix '%s' in '%s' (use B, K/KB, KiB, M/MB, MiB, G/GB, GiB, T/TB, TiB, P/PB, PiB)",
                  what, qs, q);
    }
    mult = SUFFIXES[i].mult;
  }

  // value = ip * mult + floor(frac * mult / scale), exactly. Split
  // mult = mq * scale + mr so that nothing overflows: frac < scale <= 1e9 and
  // mr < scale give frac * mr < 1e18; frac * mq < mult.
  if (ip != 0 && ip > UINT64_MAX / mult) return fail(err, errlen, "%s: '%s' overflows 64 bits", what, q);
  uint64_t val = ip * mult;
  if (has_frac) {
    uint64_t mq = mult / scale, mr = mult % scale;
    uint64_t add = frac * mq + (frac * mr) / scale;
    if (val > UINT64_MAX - add) return fail(err, errlen, "%s: '%s' overflows 64 bits", what, q);
    val += add;
  }
  *out = val;
  return NF_OK;
}

// parse_size, then the 1 PiB bound (NF_CONFIG_MAX_BYTES), naming the key.
static nf_status_t parse_bytes(tok_t v, const char *what, uint64_t *out, char *err, size_t errlen) {
  uint64_t x = 0;
  nf_status_t st = parse_size(v, what, &x, err, errlen);
  if (st != NF_OK) return st;
  if (x > NF_CONFIG_MAX_BYTES) {
    char q[QUOTE_BUF];
    quote(q, v);
    return fail(err, errlen, "%s: '%s' (%" PRIu64 " B) exceeds the maximum of 1 PiB (%" PRIu64 " B)", what, q, x,
                NF_CONFIG_MAX_BYTES);
  }
  *out = x;
  return NF_OK;
}

// Plain non-negative decimal integer in [0, max] (no suffixes).
static nf_status_t parse_int(tok_t v, const char *what, int max, int *out, char *err, size_t errlen) {
  char q[QUOTE_BUF];
  quote(q, v);
  if (v.n == 0) return fail(err, errlen, "%s: empty value", what);
  if (v.p[0] == '-') return fail(err, errlen, "%s: negative value '%s' is not allowed", what, q);
  long long x = 0;
  for (size_t i = 0; i < v.n; i++) {
    if (!is_digit(v.p[i])) return fail(err, errlen, "%s: '%s' is not an integer", what, q);
    x = x * 10 + (v.p[i] - '0');
    if (x > max) return fail(err, errlen, "%s: '%s' is out of range 0..%d", what, q, max);
  }
  *out = (int)x;
  return NF_OK;
}

// ------------------------------------------------------------------ parsing

// Plain size keys without further constraints (apply; nf__config_check
// bounds them again in a struct filled by hand).
static const struct {
  const char *key;
  size_t off;
} SIZE_KEYS[] = {
    {"limit", offsetof(nf_config_t, limit)},
    {"reserve", offsetof(nf_config_t, reserve)},
    {"retain", offsetof(nf_config_t, retain)},
    {"va_chunk", offsetof(nf_config_t, va_chunk)},
    {"host_capacity", offsetof(nf_config_t, host_capacity)},
    {"trace_max", offsetof(nf_config_t, trace_max)},
    {"spill_limit", offsetof(nf_config_t, spill_limit)},
    {"spill_reserve", offsetof(nf_config_t, spill_reserve)},
};

// Apply one "key:value" item (already split at ':' and trimmed) to `c`.
static nf_status_t apply(nf_config_t *c, tok_t k, tok_t v, char *err, size_t errlen) {
  nf_status_t st;
  uint64_t x;

  for (size_t i = 0; i < sizeof SIZE_KEYS / sizeof SIZE_KEYS[0]; i++) {
    if (!tok_eq(k, SIZE_KEYS[i].key)) continue;
    if ((st = parse_bytes(v, SIZE_KEYS[i].key, &x, err, errlen)) != NF_OK) return st;
    memcpy((char *)c + SIZE_KEYS[i].off, &x, sizeof x);
    return NF_OK;
  }

  if (tok_eq(k, "release_threshold")) {
    if (tok_ieq(v, "auto")) {
      c->release_threshold = NF_RELEASE_AUTO;
    } else if (tok_ieq(v, "never") || tok_ieq(v, "inf")) {
      c->release_threshold = NF_RELEASE_NEVER;
    } else {
      if ((st = parse_bytes(v, "release_threshold", &x, err, errlen)) != NF_OK) return st;
      c->release_threshold = x;
    }
    return NF_OK;
  }
  if (tok_eq(k, "granule")) {
    if ((st = parse_bytes(v, "granule", &x, err, errlen)) != NF_OK) return st;
    if (x != 0 && (x < NF_CONFIG_MIN_GRANULE || (x & (x - 1)) != 0))
      return fail(err, errlen,
                  "granule: %" PRIu64 " must be 0 (backend's) or a power of two >= 4096", x);
    c->granule = x;
    return NF_OK;
  }
  if (tok_eq(k, "small_max")) {
    if ((st = parse_bytes(v, "small_max", &x, err, errlen)) != NF_OK) return st;
    if (x > NF_CONFIG_MAX_SMALL)
      return fail(err, errlen, "small_max: %" PRIu64 " exceeds the maximum of 64MiB", x);
    c->small_max = x;
    return NF_OK;
  }
  if (tok_eq(k, "device")) return parse_int(v, "device", NF_CONFIG_MAX_DEVICE, &c->device, err, errlen);
  if (tok_eq(k, "tight")) return parse_int(v, "tight", 1, &c->tight, err, errlen);
  if (tok_eq(k, "edges")) return parse_int(v, "edges", 1, &c->edges, err, errlen);
  if (tok_eq(k, "views")) {
    int n = 0;
    if ((st = parse_int(v, "views", NF_CONFIG_MAX_VIEWS, &n, err, errlen)) != NF_OK) return st;
    c->views = (uint64_t)n;
    return NF_OK;
  }
  if (tok_eq(k, "units")) {
    int n = 0;
    if ((st = parse_int(v, "units", NF_UNITS_MAX, &n, err, errlen)) != NF_OK) return st;
    c->units = (uint64_t)n;
    return NF_OK;
  }
  if (tok_eq(k, "release_after")) {
    int n = 0;
    if ((st = parse_int(v, "release_after", NF_CONFIG_MAX_COUNT, &n, err, errlen)) != NF_OK) return st;
    c->release_after = (uint64_t)n;
    return NF_OK;
  }
  if (tok_eq(k, "release_idle_ms")) {
    int n = 0;
    if ((st = parse_int(v, "release_idle_ms", NF_CONFIG_MAX_COUNT, &n, err, errlen)) != NF_OK) return st;
    c->release_idle_ms = (uint64_t)n;
    return NF_OK;
  }
  if (tok_eq(k, "trace") || tok_eq(k, "offload_dir")) {
    // The rest of the item, trimmed, is the path (the config is split at
    // commas, so a path cannot hold one). Stored zero-filled in the struct:
    // configs copy by value, and the parse works on a copy, so a failed parse
    // still leaves cfg unchanged.
    char *dst = tok_eq(k, "trace") ? c->trace : c->offload_dir;
    if (v.n >= NF_TRACE_PATH_MAX) {
      char q[QUOTE_BUF];
      quote(q, v);
      return fail(err, errlen, "%s: path '%s' is %zu bytes, longer than the maximum of %d",
                  tok_eq(k, "trace") ? "trace" : "offload_dir", q, v.n, NF_TRACE_PATH_MAX - 1);
    }
    memset(dst, 0, NF_TRACE_PATH_MAX);
    memcpy(dst, v.p, v.n);
    return NF_OK;
  }
  if (tok_eq(k, "spill")) {
    if (tok_ieq(v, "host") || tok_ieq(v, "1")) {
      c->spill = 1;
    } else if (tok_ieq(v, "off") || tok_ieq(v, "0") || tok_ieq(v, "none")) {
      c->spill = 0;
    } else {
      char q[QUOTE_BUF];
      quote(q, v);
      return fail(err, errlen, "spill: unknown value '%s' (use host or off)", q);
    }
    return NF_OK;
  }
  if (tok_eq(k, "backend")) {
    if (tok_ieq(v, "host")) {
      c->backend = NF_BACKEND_HOST;
    } else if (tok_ieq(v, "cuda")) {
      c->backend = NF_BACKEND_CUDA;
    } else {
      char q[QUOTE_BUF];
      quote(q, v);
      if (v.n == 0) return fail(err, errlen, "backend: empty value");
      return fail(err, errlen, "backend: unknown backend '%s' (use host or cuda)", q);
    }
    return NF_OK;
  }

  char q[QUOTE_BUF];
  quote(q, k);
  return fail(err, errlen, "unknown key '%s' (valid keys: %s)", q, VALID_KEYS);
}

nf_status_t nf_config_parse(nf_config_t *cfg, const char *str, char *err, size_t errlen) {
  if (err && errlen > 0) err[0] = '\0';
  if (!cfg) {
    fail(err, errlen, "nf_config_parse: cfg is NULL");
    return NF_ERR_INVALID;
  }
  if (!str) return NF_OK;
  tok_t all = trim(str, str + strlen(str));
  if (all.n == 0) return NF_OK; // "" and whitespace-only change nothing

  nf_config_t c = *cfg; // parse into a copy: cfg changes only on success
  const char *p = all.p, *end = all.p + all.n;
  for (int item = 1;; item++) {
    const char *comma = memchr(p, ',', (size_t)(end - p));
    const char *ie = comma ? comma : end;
    tok_t it = trim(p, ie);
    if (it.n == 0)
      return fail(err, errlen, "empty item %d (two commas in a row, or a leading/trailing comma)", item);
    const char *colon = memchr(it.p, ':', it.n);
    char q[QUOTE_BUF];
    quote(q, it);
    if (!colon) return fail(err, errlen, "item '%s' has no ':' (expected key:value)", q);
    tok_t k = trim(it.p, colon), v = trim(colon + 1, it.p + it.n);
    if (k.n == 0) return fail(err, errlen, "item '%s' has an empty key", q);
    nf_status_t st = apply(&c, k, v, err, errlen);
    if (st != NF_OK) return st;
    if (!comma) break;
    p = comma + 1;
  }
  *cfg = c;
  return NF_OK;
}

// ------------------------------------------------------------------ format

// Sizes are written as plain byte counts (exact, so the string parses back to
// the same struct); release_threshold's sentinels by name.
int nf_config_format(const nf_config_t *cfg, char *buf, size_t len) {
  if (!buf) len = 0;
  if (!cfg) {
    if (len > 0) buf[0] = '\0';
    return 0;
  }
  char rt[24];
  if (cfg->release_threshold == NF_RELEASE_AUTO)
    snprintf(rt, sizeof rt, "auto");
  else if (cfg->release_threshold == NF_RELEASE_NEVER)
    snprintf(rt, sizeof rt, "never");
  else
    snprintf(rt, sizeof rt, "%" PRIu64, cfg->release_threshold);

  char be[16];
  if (cfg->backend == NF_BACKEND_HOST)
    snprintf(be, sizeof be, "host");
  else if (cfg->backend == NF_BACKEND_CUDA)
    snprintf(be, sizeof be, "cuda");
  else
    snprintf(be, sizeof be, "%d", cfg->backend); // invalid; will not parse back

  return snprintf(buf, len,
                  "limit:%" PRIu64 ",reserve:%" PRIu64 ",release_threshold:%s,retain:%" PRIu64
                  ",granule:%" PRIu64 ",small_max:%" PRIu64 ",va_chunk:%" PRIu64
                  ",device:%d,backend:%s,host_capacity:%" PRIu64 ",release_after:%" PRIu64 ",tight:%d"
                  ",trace_max:%" PRIu64 ",spill:%s,spill_limit:%" PRIu64 ",spill_reserve:%" PRIu64 ",views:%" PRIu64
                  ",release_idle_ms:%" PRIu64 ",units:%" PRIu64 ",edges:%d%s%.*s%s%.*s",
                  cfg->limit, cfg->reserve, rt, cfg->retain, cfg->granule, cfg->small_max,
                  cfg->va_chunk, cfg->device, be, cfg->host_capacity, cfg->release_after, cfg->tight,
                  cfg->trace_max, cfg->spill ? "host" : "off", cfg->spill_limit, cfg->spill_reserve, cfg->views,
                  cfg->release_idle_ms, cfg->units, cfg->edges,
                  cfg->trace[0] ? ",trace:" : "", (int)strnlen(cfg->trace, sizeof cfg->trace - 1), cfg->trace,
                  cfg->offload_dir[0] ? ",offload_dir:" : "",
                  (int)strnlen(cfg->offload_dir, sizeof cfg->offload_dir - 1), cfg->offload_dir);
}

// A struct filled by hand skips the parser: the same bounds again, so that no
// size derived from it wraps (a request's rounding against limit +
// spill_limit, va_chunk's granule count, release_idle_ms in ns) and every
// path ends inside the struct.
nf_status_t nf__config_check(const nf_config_t *c) {
  for (size_t i = 0; i < sizeof SIZE_KEYS / sizeof SIZE_KEYS[0]; i++) {
    uint64_t x;
    memcpy(&x, (const char *)c + SIZE_KEYS[i].off, sizeof x);
    if (x > NF_CONFIG_MAX_BYTES)
      return nf__error(NF_ERR_CONFIG, "nofrag: %s %" PRIu64 " B exceeds the maximum of 1 PiB (%" PRIu64 " B)",
                       SIZE_KEYS[i].key, x, NF_CONFIG_MAX_BYTES);
  }
  if (c->granule > NF_CONFIG_MAX_BYTES)
    return nf__error(NF_ERR_CONFIG, "nofrag: granule %" PRIu64 " B exceeds the maximum of 1 PiB", c->granule);
  uint64_t thr = c->release_threshold;
  if (thr != NF_RELEASE_AUTO && thr != NF_RELEASE_NEVER && thr > NF_CONFIG_MAX_BYTES)
    return nf__error(NF_ERR_CONFIG, "nofrag: release_threshold %" PRIu64 " B exceeds the maximum of 1 PiB "
                     "(UINT64_MAX: never, UINT64_MAX-1: auto)", thr);
  if (c->small_max > NF_CONFIG_MAX_SMALL)
    return nf__error(NF_ERR_CONFIG, "nofrag: small_max %" PRIu64 " B exceeds the maximum of 64 MiB", c->small_max);
  const struct { const char *key; uint64_t v, max; } N[] = {
      {"units", c->units, NF_UNITS_MAX},
      {"views", c->views, NF_CONFIG_MAX_VIEWS},
      {"release_after", c->release_after, NF_CONFIG_MAX_COUNT},
      {"release_idle_ms", c->release_idle_ms, NF_CONFIG_MAX_COUNT},
  };
  for (size_t i = 0; i < sizeof N / sizeof N[0]; i++)
    if (N[i].v > N[i].max)
      return nf__error(NF_ERR_CONFIG, "nofrag: %s %" PRIu64 " exceeds the maximum of %" PRIu64, N[i].key, N[i].v,
                       N[i].max);
  if (c->tight != 0 && c->tight != 1) return nf__error(NF_ERR_CONFIG, "nofrag: tight %d: 0 or 1", c->tight);
  if (c->edges != 0 && c->edges != 1) return nf__error(NF_ERR_CONFIG, "nofrag: edges %d: 0 or 1", c->edges);
  if (c->spill != 0 && c->spill != 1) return nf__error(NF_ERR_CONFIG, "nofrag: spill %d: 0 or 1", c->spill);
  if (!memchr(c->trace, 0, sizeof c->trace) || !memchr(c->offload_dir, 0, sizeof c->offload_dir))
    return nf__error(NF_ERR_CONFIG, "nofrag: %s does not end within its %d bytes",
                     memchr(c->trace, 0, sizeof c->trace) ? "offload_dir" : "trace", NF_TRACE_PATH_MAX);
  return NF_OK;
}
