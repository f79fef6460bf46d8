// libFuzzer target: arbitrary bytes as a trace. Parsing and replay-op
// building must never crash, leak or read out of bounds; a parsed trace
// must satisfy the invariants the replay relies on.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  nf_trace_t t;
  char err[256];
  err[0] = 0;
  if (nf__trace_parse_buffer(&t, "fuzz", (const char *)data, size, err, sizeof err) != NF_OK) {
    // Failure: a message naming the input, and nothing kept.
    if (strncmp(err, "fuzz:", 5) != 0 || t.events || t.n_events) abort();
    return 0;
  }
  size_t total = 0;
  for (int a = 0; a < NF_TRACE_NACTIONS; a++) total += t.counts[a];
  if (total != t.n_events) abort();
  nf__trace_ops o;
  if (nf__trace_ops_build(&o, &t, err, sizeof err) == NF_OK) {
    if (o.n_ops != o.n_allocs + o.n_frees || o.n_allocs != t.counts[NF_TRACE_ALLOC]) abort();
    if (o.live_at_end > o.n_slots || o.n_allocs != o.n_frees + o.live_at_end) abort();
    for (size_t i = 0; i < o.n_ops; i++) {
      const nf__trace_op *op = &o.ops[i];
      if (op->slot >= o.n_slots || op->event >= t.n_events) abort();
      if (op->kind == NF_TRACE_OP_ALLOC && op->stream >= o.n_streams) abort();
    }
    nf__trace_ops_free(&o);
  } else if (strncmp(err, "fuzz", 4) != 0 || o.ops) {
    abort();
  }
  nf__trace_free(&t);
  return 0;
}
