// Synthetic traces for the allocator-model tests (test_models.c,
// test_models_rules.c): ops built by hand, run through nf__model_run.
#ifndef NF_MODEL_TEST_H
#define NF_MODEL_TEST_H

#include "nf_test.h"
#include "model.h"
#include "trace.h"

#define MiB NF_MiB

// A hand-written trace: "a SLOT SIZE STREAM" allocs and "f SLOT" frees.
typedef struct syn_s {
  nf__trace_op ops[64];
  uint64_t streams[4];
  uint64_t live[16];
  nf__trace_ops o;
} syn_t;

static inline void syn_init(syn_t *s) {
  memset(s, 0, sizeof *s);
  s->o.ops = s->ops;
  s->o.streams = s->streams;
  s->o.n_streams = 2;
  s->streams[0] = 0;
  s->streams[1] = 0x7000; // a side stream, as CUDA stream handles go
  s->o.n_slots = 16;
}

static inline void syn_alloc(syn_t *s, uint32_t slot, uint64_t size, uint32_t stream) {
  nf__trace_op *op = &s->ops[s->o.n_ops];
  op->kind = NF_TRACE_OP_ALLOC;
  op->slot = slot;
  op->size = size;
  op->stream = stream;
  op->event = (uint32_t)s->o.n_ops;
  s->o.n_ops++;
  s->o.n_allocs++;
  s->live[slot] = size;
  uint64_t live = 0;
  for (int i = 0; i < 16; i++) live += s->live[i];
  if (live > s->o.peak_live) s->o.peak_live = live;
}

static inline void syn_free(syn_t *s, uint32_t slot) {
  nf__trace_op *op = &s->ops[s->o.n_ops];
  op->kind = NF_TRACE_OP_FREE;
  op->slot = slot;
  op->size = s->live[slot];
  op->event = (uint32_t)s->o.n_ops;
  s->o.n_ops++;
  s->o.n_frees++;
  s->live[slot] = 0;
}

static inline nf__model_result syn_run(syn_t *s, int kind, uint64_t limit) {
  nf__model_result r;
  nf__model_run(kind, &s->o, limit, &r);
  return r;
}

#endif
