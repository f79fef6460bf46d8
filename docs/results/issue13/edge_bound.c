// Edge-sharing bound (issue 13; docs/results/issue13/edge_bound.sh builds and runs it): replays
// TRACE under CONF and writes the pool's nf_snapshot at the op of peak live (or at op N) to OUT.
//   edge_bound TRACE CONF OUT [N]
#include "replay.h"
#include "trace.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
extern nf_pool_t *nfx_pool;
static size_t want; static const char *outp;
static void sample(void *c, size_t op, const nf_stats_t *s) {
  (void)c; (void)s;
  if (op == want) { char *j = nf_snapshot(nfx_pool); FILE *f = fopen(outp, "w"); fputs(j, f); fclose(f); nf_snapshot_free(j); fprintf(stderr, "snapshot at op %zu live %llu\n", op, (unsigned long long)s->live); }
}
int main(int argc, char **argv) {
  nf_trace_t t; nf__trace_ops ops; char err[512];
  if (nf__trace_load(&t, argv[1], err, sizeof err) != NF_OK || nf__trace_ops_build(&ops, &t, err, sizeof err) != NF_OK) { fprintf(stderr, "%s\n", err); return 1; }
  // op index of peak live (requested sizes)
  uint64_t live = 0, best = 0; size_t at = 0;
  for (size_t i = 0; i < ops.n_ops; i++) {
    nf__trace_op *o = &ops.ops[i];
    if (o->kind == 0) live += o->size; else live -= o->size;
    if (live > best) { best = live; at = i + 1; }
  }
  want = argc > 4 ? strtoul(argv[4], NULL, 10) : at; outp = argv[3];
  fprintf(stderr, "peak live %llu at op %zu\n", (unsigned long long)best, at);
  nf__replay_opts o; nf__replay_opts_default(&o);
  if (nf_config_parse(&o.cfg, argv[2], err, sizeof err) != NF_OK) { fprintf(stderr, "%s\n", err); return 1; }
  o.sample = sample; o.sample_every = 1;
  nf__replay_result r; nf__replay_run(&ops, &o, &r);
  fprintf(stderr, "status %s\n", r.status == NF_OK ? "ok" : r.error);
  return 0;
}
