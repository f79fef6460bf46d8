// Hotspots: which call sites hold the reserved-but-unused memory at a model's
// peak reserved (definition and rationale in docs/replay.md, "Hotspots").
//
// A second run of the model stops to look at its state after the op at which
// the first run reached its peak (nf__model_result.peak_op): the models are
// deterministic, so it is the same state, and the first run pays nothing for
// the inspection.
//
// Unit of attribution: a run of consecutive mapped blocks of one segment
// (native: a whole cudaMalloc segment; expandable: a stretch of mapped pages
// between unmapped ones). Its unused bytes = its size - the requested bytes
// of its allocated blocks; they go to the sites of its allocated blocks in
// proportion to their requested bytes (those blocks are what keeps the
// memory from being released: empty_cache frees only wholly free segments),
// and to the site whose alloc reserved the memory when no block is live.
#include "cli.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct inspect_s {
  const nfc_sites *sites;
  nfc_hotspots *out;
  uint64_t *w;      // per site: requested bytes live in the current run
  uint32_t *touched; // sites with w > 0 in the current run
  size_t ntouched;
  int nomem;
} inspect_t;

static uint32_t site_of(const inspect_t *c, uint32_t event) {
  return event < c->sites->n_events ? c->sites->of_event[event] : 0;
}

// Give `unused` bytes of one run to the touched sites, exactly: floor shares
// (128-bit products: bytes x bytes passes 64 bits), the rounding remainder to
// the heaviest site.
static void apportion(inspect_t *c, uint64_t unused, uint64_t total_w, uint32_t origin_site) {
  uint64_t *by = c->out->by_site;
  if (!c->ntouched || !total_w) { by[origin_site] += unused; goto reset; }
  __extension__ typedef unsigned __int128 u128;
  uint64_t given = 0;
  uint32_t heaviest = c->touched[0];
  for (size_t i = 0; i < c->ntouched; i++) {
    uint32_t s = c->touched[i];
    uint64_t share = (uint64_t)((u128)unused * c->w[s] / total_w);
    by[s] += share;
    given += share;
    if (c->w[s] > c->w[heaviest]) heaviest = s;
  }
  by[heaviest] += unused - given;
reset:
  for (size_t i = 0; i < c->ntouched; i++) c->w[c->touched[i]] = 0;
  c->ntouched = 0;
}

static void inspect(void *ctx, const nf__model *m) {
  inspect_t *c = ctx;
  nfc_hotspots *h = c->out;
  h->done = 1;
  h->reserved = m->reserved;
  h->live = m->requested;
  h->unused = m->reserved - m->requested;
  for (size_t id = 0; id < m->nb; id++) {
    const nf__mblock *head = &m->b[id];
    if (!head->in_use || head->prev >= 0) continue; // each segment once, from its first block
    uint64_t size = 0, live = 0, wsum = 0;
    uint32_t origin = 0;
    int open = 0;
    for (int32_t b = (int32_t)id;; b = m->b[b].next) {
      const nf__mblock *x = b >= 0 ? &m->b[b] : NULL;
      if (!x || !x->mapped) { // a run of mapped blocks ends
        if (open) apportion(c, size - live, wsum, origin);
        open = 0;
        size = live = wsum = 0;
        if (!x) break;
        continue;
      }
      if (!open) { open = 1; origin = site_of(c, x->origin); }
      size += x->size;
      if (x->allocated) {
        uint32_t s = site_of(c, x->event);
        live += x->requested;
        wsum += x->requested;
        if (!c->w[s] && x->requested) c->touched[c->ntouched++] = s;
        c->w[s] += x->requested;
      }
    }
  }
}

int nfc_hotspots_run(int kind, const nf__trace_ops *ops, uint64_t limit, const nf__model_result *first,
                    const nfc_sites *sites, nfc_hotspots *out) {
  memset(out, 0, sizeof *out);
  out->kind = kind;
  out->peak_op = first->peak_op;
  out->n_sites = sites->n;
  inspect_t c = {sites, out, NULL, NULL, 0, 0};
  out->by_site = calloc(sites->n ? sites->n : 1, sizeof *out->by_site);
  c.w = calloc(sites->n ? sites->n : 1, sizeof *c.w);
  c.touched = calloc(sites->n ? sites->n : 1, sizeof *c.touched);
  nf__model_result *r = malloc(sizeof *r);
  int rc = -1;
  if (!out->by_site || !c.w || !c.touched || !r) goto done;
  if (first->peak_op) {
    nf__model_hooks hk = {0};
    hk.inspect = inspect;
    hk.inspect_at = first->peak_op;
    hk.ctx = &c;
    (void)nf__model_run_hooked(kind, ops, limit, &hk, r); // may stop later (OOM): the state was seen before
  }
  for (size_t s = 0; s < out->n_sites; s++) out->attributed += out->by_site[s];
  // Top sites by bytes (a selection: NF_HOT_TOP passes over the sites).
  for (out->n_top = 0; out->n_top < NF_HOT_TOP; out->n_top++) {
    uint32_t best = UINT32_MAX;
    for (size_t s = 0; s < out->n_sites; s++) {
      int taken = 0;
      for (size_t k = 0; k < out->n_top; k++) taken |= out->top[k] == s;
      if (!taken && out->by_site[s] && (best == UINT32_MAX || out->by_site[s] > out->by_site[best])) best = (uint32_t)s;
    }
    if (best == UINT32_MAX) break;
    out->top[out->n_top] = best;
  }
  rc = 0;
done:
  free(c.w);
  free(c.touched);
  free(r);
  return rc;
}

void nfc_hotspots_free(nfc_hotspots *h) {
  free(h->by_site);
  h->by_site = NULL;
}

// A site or function name from the trace, on a terminal: control bytes
// (< 0x20, 0x7f) become '?', so that a trace's escape sequences cannot
// drive the terminal (JSON and HTML escape them instead). UTF-8 is kept.
static void put_sanitised(const char *s) {
  for (; *s; s++) putchar((unsigned char)*s < 0x20 || (unsigned char)*s == 0x7f ? '?' : *s);
}

void nfc_hotspots_print(const nfc_hotspots *h, const nfc_sites *sites) {
  printf("hotspots              %" PRIu64 " B reserved but unused at peak reserved (%.3f GiB of %.3f GiB, "
         "after call %zu): top call sites\n", h->unused, (double)h->unused / (double)NF_GiB,
         (double)h->reserved / (double)NF_GiB, h->peak_op);
  for (size_t k = 0; k < h->n_top; k++) {
    uint64_t b = h->by_site[h->top[k]];
    printf("  %12" PRIu64 " B %5.1f%%  ", b, h->unused ? 100.0 * (double)b / (double)h->unused : 0.0);
    put_sanitised(sites->site[h->top[k]]);
    fputs("  ", stdout);
    put_sanitised(sites->func[h->top[k]]);
    putchar('\n');
  }
}

void nfc_hotspots_top_json(FILE *f, const nfc_hotspots *h, const nfc_sites *sites) {
  for (size_t k = 0; k < h->n_top; k++) {
    fputs(k ? ",{\"site\":" : "{\"site\":", f);
    nfc_json_str(f, sites->site[h->top[k]]);
    fputs(",\"func\":", f);
    nfc_json_str(f, sites->func[h->top[k]]);
    fprintf(f, ",\"bytes\":%" PRIu64 "}", h->by_site[h->top[k]]);
  }
}

void nfc_hotspots_json(FILE *f, const nfc_hotspots *h, const nfc_sites *sites) {
  fprintf(f, "{\"peak_op\":%zu,\"reserved\":%" PRIu64 ",\"live\":%" PRIu64 ",\"unused\":%" PRIu64
          ",\"attributed\":%" PRIu64 ",\"top\":[", h->peak_op, h->reserved, h->live, h->unused, h->attributed);
  nfc_hotspots_top_json(f, h, sites);
  // Every site with bytes, so that a reader can check the sum. Sites are
  // (FILE:LINE, function) pairs: one line can hold two functions (a lambda,
  // a comprehension), so the key names both, "FILE:LINE (FUNCTION)", else
  // duplicate keys made a JSON parser keep one and lose the others' bytes.
  fputs("],\"all\":{", f);
  const char *sep = "";
  for (size_t s = 0; s < h->n_sites; s++) {
    if (!h->by_site[s]) continue;
    fputs(sep, f);
    char key[NF_TRACE_MAX_LINE + 8]; // site and function come from one '#site' line of at most that
    if (sites->func[s][0]) snprintf(key, sizeof key, "%s (%s)", sites->site[s], sites->func[s]);
    else snprintf(key, sizeof key, "%s", sites->site[s]);
    nfc_json_str(f, key);
    fprintf(f, ":%" PRIu64, h->by_site[s]);
    sep = ",";
  }
  fputs("}}", f);
}
