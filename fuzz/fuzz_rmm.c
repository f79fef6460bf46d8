// libFuzzer target: arbitrary bytes as an RMM CSV log (src/trace_rmm.c).
// Parsing must never crash, leak or read out of bounds; a failure names the
// input and keeps nothing; a parsed log writes back and re-parses to the same
// events (the writer and reader agree).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  nf_trace_t t, r;
  char err[256] = "";
  if (nf__trace_parse_rmm_buffer(&t, "fuzz", (const char *)data, size, err, sizeof err) != NF_OK) {
    if (strncmp(err, "fuzz:", 5) != 0 || t.events || t.n_events) abort();
    return 0;
  }
  char *csv = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&csv, &len);
  if (!f) abort();
  if (nf__trace_write_rmm(&t, f, NULL) != NF_OK) abort();
  fclose(f);
  if (nf__trace_parse_rmm_buffer(&r, "again", csv, len, err, sizeof err) != NF_OK) abort();
  if (r.n_events != t.n_events) abort();
  for (size_t i = 0; i < t.n_events; i++) {
    const nf_trace_event_t *a = &t.events[i], *b = &r.events[i];
    if (a->action != b->action || a->addr != b->addr || a->size != b->size || a->stream != b->stream) abort();
  }
  nf__trace_ops o;
  if (nf__trace_ops_build(&o, &t, err, sizeof err) == NF_OK) nf__trace_ops_free(&o);
  nf__trace_free(&r);
  nf__trace_free(&t);
  free(csv);
  return 0;
}
