// Shared by the CLI's source files (tools/*.c).
#ifndef NF_CLI_H
#define NF_CLI_H

#include <stddef.h>

#include "trace.h"

// Load TRACE in any input format the CLI reads, detected by content:
// - a PyTorch snapshot pickle (gzip or not; first byte 0x80, pickle's
//   PROTO opcode): converted by python3 -m nofrag.snapshot into a temporary
//   text trace, which is then loaded (python3 must be on PATH; the package is
//   found through NOFRAG_PYTHON_DIR, else ../python next to the executable);
// - an RMM logging_resource_adaptor CSV log (its header line);
// - else our text trace.
// `*format` (if not NULL) gets "pickle", "rmm" or "text". Errors: message in
// err ("FILE:LINE: ..." or "FILE: ..."), NF_ERR_INVALID, nothing kept.
nf_status_t nf_cli_load_trace(const char *path, nf_trace_t *t, const char **format, char *err, size_t errlen);

// ---------------------------------------------------------------- --html (tools/html.c)
#include <stdint.h>

#include "nofrag.h"

// One allocator's timeline: live and reserved bytes after op x[k].
typedef struct nf_html_series_s {
  const char *name, *reserved_label;
  size_t n, cap;
  uint64_t *x, *live, *reserved;
  uint64_t peak_reserved; // exact peak (may fall between samples)
  uint64_t peak_x;        // op count of the first sample at which the peak had been reached
} nf_html_series;

// A row of the summary table.
typedef struct nf_html_row_s {
  const char *name;
  uint64_t peak_live, peak_reserved, min_capacity; // min_capacity 0: not measured
  double seconds;
  const char *status;
} nf_html_row;

// nf__replay_opts.sample callback collecting into an nf_html_series.
void nf_html_sample(void *ctx, size_t op, const nf_stats_t *s);
// Sampling period giving about 2000 points over n_ops.
size_t nf_html_every(size_t n_ops);
// The trace's own live bytes and (when it has segment_* events) PyTorch's
// recorded segments, sampled like the replay. Returns 0, or -1 out of memory.
int nf_html_trace_series(const nf_trace_t *t, const nf__trace_ops *ops, size_t every, nf_html_series *out);
void nf_html_series_free(nf_html_series *s);
// Write the self-contained page. Returns 0, or -1 with errno set.
int nf_html_write(const char *path, const char *trace, const nf_html_series *series, size_t n_series,
                  const nf_html_row *rows, size_t n_rows);

#endif
