// Shared by the CLI's source files (tools/*.c).
#ifndef NF_CLI_H
#define NF_CLI_H

#include <stddef.h>
#include <stdio.h>

#include <stdint.h>

#include "model.h"
#include "trace.h"

// Load TRACE in any input format the CLI reads, detected by content:
// - a PyTorch snapshot pickle (gzip or not; first byte 0x80, pickle's
//   PROTO opcode): converted by python3 -m nofrag.torch_trace into a temporary
//   text trace, which is then loaded (python3 must be on PATH; the package is
//   found through NOFRAG_PYTHON_DIR, else ../python next to the executable);
// - an RMM logging_resource_adaptor CSV log (its header line);
// - else our text trace.
// `*format` (if not NULL) gets "pickle", "rmm" or "text". Errors: message in
// err ("FILE:LINE: ..." or "FILE: ..."), NF_ERR_INVALID, nothing kept.
nf_status_t nfc_load_trace(const char *path, nf_trace_t *t, const char **format, char *err, size_t errlen);

// Allocation call sites carried by '#site<TAB>FILE:LINE<TAB>FUNCTION' comment
// lines right after an alloc line (written by python3 -m nofrag.torch_trace from
// the snapshot's stacks; other readers skip them as comments).
typedef struct nfc_sites_s {
  uint32_t *of_event;  // per trace event: site id, 0 = none (no stack)
  size_t n_events;
  char **site, **func; // per id; id 0 is "<no stack>:0"
  size_t n, cap;       // ids in use (n > 1: the trace has stacks)
  uint32_t *hash;      // open addressing over ids, for interning
  size_t hcap;
} nfc_sites;

// nfc_load_trace, also filling `sites` (may be NULL). A site line that
// does not follow an alloc line is ignored.
nf_status_t nfc_load_trace_sites(const char *path, nf_trace_t *t, nfc_sites *sites, const char **format,
                                    char *err, size_t errlen);
void nfc_sites_free(nfc_sites *s);

// -------------------------------------------- progress bar (tools/progress.c)
// On stderr, only when it is a terminal (NOFRAG_PROGRESS=1 forces it on, 0
// off): "what  NN%", redrawn at most 10 times a second, erased at the end.
// A bisection shows "probe k of at most n" and its overall progress, drawn at
// each probe's start (nfc_watch_probe as nf__replay_opts.probe).
typedef struct nfc_progress_s {
  int on, drawn;
  const char *what;
  size_t total;
  double last;
  unsigned probe, probes; // bisection: probe k (1-based) of at most n; 0: not a bisection / n unknown
} nfc_progress;
void nfc_progress_start(nfc_progress *p, const char *what, size_t total);
void nfc_progress_update(nfc_progress *p, size_t done);
void nfc_progress_end(nfc_progress *p);

// ---------------------------------------------------------------- --html (tools/html.c)
#include <stdint.h>

#include "nofrag.h"

// One allocator's timeline: live and reserved bytes after op x[k].
typedef struct nfc_html_series_s {
  const char *name, *reserved_label;
  size_t n, cap;
  uint64_t *x, *live, *reserved;
  uint64_t peak_reserved; // exact peak (may fall between samples)
  uint64_t peak_x;        // ops done when the peak was reached, that op included (models, recorded
                          // segments: exact; nofrag: the first sample after it, <= every ops late)
  uint64_t live_peak_seen; // nfc_html_sample: the pool's live peak at the previous sample
} nfc_html_series;

// A row of the summary table.
typedef struct nfc_html_row_s {
  const char *name;
  uint64_t peak_live, peak_reserved, min_capacity; // min_capacity 0: not measured
  double seconds;
  const char *status;
} nfc_html_row;

// nf__replay_opts.sample callback collecting into an nfc_html_series.
void nfc_html_sample(void *ctx, size_t op, const nf_stats_t *s);
// The same for a model run (nf__model_hooks.sample); the caller sets the
// exact peak_reserved / peak_x from the model's result afterwards.
void nfc_html_model_sample(void *ctx, size_t op, uint64_t live, uint64_t reserved);
// Sampling period giving about 2000 points over n_ops.
size_t nfc_html_every(size_t n_ops);
// The trace's own live bytes and (when it has segment_* events) PyTorch's
// recorded segments, sampled like the replay. Returns 0, or -1 out of memory.
int nfc_html_trace_series(const nf_trace_t *t, const nf__trace_ops *ops, size_t every, nfc_html_series *out);
void nfc_html_series_free(nfc_html_series *s);
// nfc_json_str: a JSON string, escaped so that it is also safe inside HTML.
#include "json.h"

// ------------------------------------------------ hotspots (tools/hotspots.c)
#define NF_HOT_TOP 10

// Reserved-but-unused memory at a model's peak reserved, by call site
// (definition in docs/replay.md).
typedef struct nfc_hotspots_s {
  int kind;                 // NF_MODEL_*
  int done;                 // the state at the peak was inspected
  size_t peak_op;           // ops done at the peak
  uint64_t reserved, live;  // reserved and requested-live bytes at the peak
  uint64_t unused;          // reserved - live: what is attributed
  uint64_t attributed;      // sum of by_site (== unused)
  uint64_t *by_site;        // per site id
  size_t n_sites;
  uint32_t top[NF_HOT_TOP]; // site ids, most bytes first
  size_t n_top;
} nfc_hotspots;

// Run model `kind` up to `first->peak_op` (first: a completed or failed run
// with the same ops and limit) and attribute. Returns 0, -1 out of memory.
int nfc_hotspots_run(int kind, const nf__trace_ops *ops, uint64_t limit, const nf__model_result *first,
                    const nfc_sites *sites, nfc_hotspots *out);
void nfc_hotspots_free(nfc_hotspots *h);
// Text lines (the top sites), and a JSON object with every site that has bytes.
void nfc_hotspots_print(const nfc_hotspots *h, const nfc_sites *sites);
void nfc_hotspots_json(FILE *f, const nfc_hotspots *h, const nfc_sites *sites);
// The "top" array's elements ({site, func, bytes}), shared by --json and --html.
void nfc_hotspots_top_json(FILE *f, const nfc_hotspots *h, const nfc_sites *sites);

// Write the self-contained page (hot: n_hot hotspot tables, may be 0). The
// table's ratios are over `trace_peak_live` (as in the text table and --json),
// whatever peak live a row that stopped early shows.
// Returns 0, or -1 with errno set.
int nfc_html_write(const char *path, const char *trace, uint64_t trace_peak_live, const nfc_html_series *series,
                   size_t n_series,
                  const nfc_html_row *rows, size_t n_rows, const nfc_hotspots *hot, size_t n_hot,
                  const nfc_sites *sites);


// ------------------------------------------- a run's observer (tools/progress.c)
// The progress bar and, with --html, the run's timeline (hs NULL: none), as
// nf__replay_opts.sample / nf__model_hooks.sample callbacks (ctx: nfc_watch).
typedef struct nfc_watch_s {
  nfc_progress prog;
  nfc_html_series *hs;
} nfc_watch;
void nfc_watch_replay(void *ctx, size_t op, const nf_stats_t *s);
void nfc_watch_model(void *ctx, size_t op, uint64_t live, uint64_t reserved);
void nfc_watch_probe(void *ctx, unsigned k, unsigned n, uint64_t limit);
// Sampling period: the timeline's ~2000 points, else ~1000 progress checks.
size_t nfc_watch_every(const nfc_watch *w, size_t n_ops);

// ------------------------------------------- replay output (tools/print.c)
#include "replay.h"

// a / b, 0 where b is 0.
static inline double nfc_ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

// nofrag replay's options, as parsed by tools/nofrag.c.
typedef struct nfc_cli_s {
  const char *trace;
  const char *conf;
  const char *limit_str, *granule_str, *allocator, *html;
  const char *device; // --device: NULL on the simulated device
  int min_capacity, json, verify, hotspots;
  int run_nofrag, run_model[NF_MODEL_NKINDS]; // from --allocator
} nfc_cli;

// The replay through nofrag: one JSON object (closed with `end`), or text.
// `bisected`: b holds a --min-capacity search.
void nfc_print_json(const nfc_cli *cli, const nf__trace_ops *ops, const nf__replay_opts *ro,
                    const nf__replay_result *r, const nf__replay_bisect *b, int bisected, const char *end);
void nfc_print_text(const nfc_cli *cli, const nf__trace_ops *ops, const nf__replay_opts *ro,
                    const nf__replay_result *r, const nf__replay_bisect *b, int bisected);
// One allocator model's run (and bisection): a JSON object (left open), or text lines.
void nfc_print_model_json(const nf__trace_ops *ops, const nf__model_result *r, const nf__model_bisect *b,
                          int bisected);
void nfc_print_model_text(const nf__trace_ops *ops, const nf__model_result *r, const nf__model_bisect *b,
                          int bisected);

// ------------------------------------------------ --device (tools/device.c)
#include "replay.h"

// Driver entry points by name (device.c, doctor.c): each `dst` gets
// dlsym(lib, name). NULL when all were found, else the first name missing
// (those before it are filled).
typedef struct {
  void *dst;
  const char *name;
} nfc_sym;
const char *nfc_dlsyms(void *lib, const nfc_sym *syms, size_t n);

// A real GPU to replay on: "cuda" or "cuda:N". Loads the driver (through
// the library's CUDA backend, which says why when there is none), makes one
// CUDA stream for each trace stream whose handle `raw[k]` is not 0 (0: the
// default stream). Non-zero: err says why, nothing kept.
typedef struct nfc_device_s nfc_device;
int nfc_device_open(const char *spec, size_t n_streams, const uint64_t *raw, nfc_device **out, char *err,
                    size_t errlen);
const nf__replay_dev *nfc_device_hooks(const nfc_device *d);
void nfc_device_close(nfc_device *d); // waits for the device's work first; NULL: nothing

// doctor.c: `nofrag doctor [--json] [--device N]` (argv after the command); the exit status.
int nfc_doctor(int argc, char **argv);

#endif
