// Progress bar for long replays (see cli.h). Only on a terminal: a captured
// or redirected stderr (scripts, CI, tests) never gets carriage returns.
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void nfc_progress_start(nfc_progress *p, const char *what, size_t total) {
  const char *env = getenv("NOFRAG_PROGRESS");
  p->on = env && *env ? env[0] == '1' : isatty(2);
  p->drawn = 0;
  p->what = what;
  p->total = total;
  p->last = now_s();
  p->probe = p->probes = 0;
}

static void draw(nfc_progress *p, size_t done) {
  double f = p->total ? (double)done / (double)p->total : 1.0;
  char probe[48] = "";
  if (p->probe) { // the whole bisection's progress, not one probe's (that restarted at 0% each probe)
    if (p->probes) {
      f = ((double)(p->probe - 1) + f) / (double)p->probes;
      snprintf(probe, sizeof probe, " probe %u of at most %u", p->probe, p->probes);
    } else {
      f = 0.0; // the unlimited run: how many probes follow is not known yet
      snprintf(probe, sizeof probe, " probe %u (unlimited run)", p->probe);
    }
  }
  unsigned pct = (unsigned)(f * 100.0);
  if (pct > 100) pct = 100;
  int fill = (int)(pct / 4);
  fprintf(stderr, "\rnofrag: %-12s%s [%.*s%*s] %3u%%\033[K", p->what, probe, fill, "#########################",
          25 - fill, "", pct);
  fflush(stderr);
  p->drawn = 1;
}

void nfc_progress_update(nfc_progress *p, size_t done) {
  if (!p->on) return;
  double t = now_s();
  if (t - p->last < 0.1) return; // at most ~10 redraws a second; a short run draws nothing
  p->last = t;
  draw(p, done);
}

void nfc_watch_probe(void *ctx, unsigned k, unsigned n, uint64_t limit) {
  (void)limit;
  nfc_watch *w = ctx;
  if (!w->prog.on) return;
  w->prog.probe = k;
  w->prog.probes = n > k ? n : k; // never "probe 5 of at most 4"
  w->prog.last = now_s();
  draw(&w->prog, 0); // every probe's start is shown, however short
}

void nfc_progress_end(nfc_progress *p) {
  if (p->on && p->drawn) { fputs("\r\033[K", stderr); fflush(stderr); } // erase the line
  p->drawn = 0;
}

// The observers behind the CLI's runs (see cli.h).
void nfc_watch_replay(void *ctx, size_t op, const nf_stats_t *s) {
  nfc_watch *w = ctx;
  if (w->hs) nfc_html_sample(w->hs, op, s);
  nfc_progress_update(&w->prog, op);
}

void nfc_watch_model(void *ctx, size_t op, uint64_t live, uint64_t reserved) {
  nfc_watch *w = ctx;
  if (w->hs) nfc_html_model_sample(w->hs, op, live, reserved);
  nfc_progress_update(&w->prog, op);
}

// Sampling period: the timeline's ~2000 points, else ~1000 progress checks.
size_t nfc_watch_every(const nfc_watch *w, size_t n_ops) {
  return w->hs ? nfc_html_every(n_ops) : n_ops / 1000 + 1;
}

