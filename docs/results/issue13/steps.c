// Per-step view of a replay (issue 13 analysis; not built by CMake).
// Prints, every N ops (the shared traces have fixed ops per step: gpt2
// 86,489 ops / 30 steps -> 2883, vit 72,156 / 30 -> 2405, llama 103,033 / 8
// -> 12879), the step's highest live bytes, physical memory, and the backend
// calls and view counters of that window.
//   gcc -O2 -Iinclude -Isrc -Isrc/replay docs/results/issue13/steps.c build/libnofrag_replay.a
//       build/libnofrag.a -lz -lm -lpthread -ldl -o /tmp/steps
//   /tmp/steps ../shared/traces/gpt2.trace.gz 2883 tight:1
#include "replay.h"
#include "trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  nf_stats_t prev;
  uint64_t max_live;
  size_t every, n_ops;
} ctx_t;

#define GIB(x) ((double)(x) / 1073741824.0)
#define D(f) (unsigned long long)(s->f - c->prev.f)

static void sample(void *cv, size_t op, const nf_stats_t *s) {
  ctx_t *c = cv;
  if (s->live > c->max_live) c->max_live = s->live;
  if (op % c->every && op != c->n_ops) return;
  printf("ops %7zu  max live %6.2f GiB  physical %6.2f GiB | calls %5llu: create %4llu map %4llu unmap %3llu "
         "set_access %3llu event_record %3llu event_sync %3llu stream_wait %3llu | views %5llu take-backs %5llu "
         "moves %5llu evictions %5llu\n",
         op, GIB(c->max_live), GIB(s->physical), D(backend_calls), D(calls.create), D(calls.map), D(calls.unmap),
         D(calls.set_access), D(calls.event_record), D(calls.event_sync), D(calls.stream_wait),
         (unsigned long long)s->views, D(view_reuses), D(view_moves), D(view_evictions));
  c->prev = *s;
  c->max_live = 0;
}

int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: steps TRACE OPS_PER_STEP [CONF]\n"); return 2; }
  nf_trace_t t;
  nf__trace_ops ops;
  char err[512];
  if ((strstr(argv[1], ".csv") ? nf__trace_load_rmm(&t, argv[1], err, sizeof err) : nf__trace_load(&t, argv[1], err, sizeof err)) != NF_OK || nf__trace_ops_build(&ops, &t, err, sizeof err) != NF_OK) {
    fprintf(stderr, "steps: %s\n", err);
    return 1;
  }
  nf__replay_opts o;
  nf__replay_opts_default(&o);
  if (argc > 3 && nf_config_parse(&o.cfg, argv[3], err, sizeof err) != NF_OK) {
    fprintf(stderr, "steps: %s\n", err);
    return 1;
  }
  ctx_t c = {.every = strtoul(argv[2], NULL, 10), .n_ops = ops.n_ops};
  if (!c.every) { fprintf(stderr, "steps: OPS_PER_STEP must be > 0\n"); return 2; }
  o.sample = sample;
  o.sample_ctx = &c;
  o.sample_every = 1;
  nf__replay_result r;
  nf__replay_run(&ops, &o, &r);
  printf("status %s  physical / peak live %.4f  calls_second_half %llu\n", r.status == NF_OK ? "ok" : r.error,
         (double)r.stats.physical_peak / (double)r.stats.live_peak, (unsigned long long)r.calls_second_half);
  nf__trace_ops_free(&ops);
  nf__trace_free(&t);
  return 0;
}
