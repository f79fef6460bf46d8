// Trace replay through the library on the host backend, or on a real device
// the caller hands in (internal).
//
// A replay turns a trace's ops (trace.h) into nf_alloc / nf_free calls on a
// fresh backend + pool: one call per alloc, the free at free_completed
// (when PyTorch could reuse the block), each alloc on its trace stream. It
// measures what the allocator needed (peak mapped / physical, backend calls)
// for the program's demand (peak live), and with `verify` proves that no
// block's contents were lost while granules were stitched around it.
#ifndef NF_REPLAY_H
#define NF_REPLAY_H

#include <stddef.h>
#include <stdint.h>

#include "nofrag.h"
#include "trace.h"

// Simulated device size of the host backend: far above any trace (untouched
// memory costs nothing), so that "no limit" means the allocator's own choice.
#define NF_REPLAY_CAPACITY ((uint64_t)2 << 40)
#define NF_REPLAY_GRANULE ((uint64_t)2 << 20) // CUDA's granularity

// A real device to replay on, instead of the simulated one (the CLI's
// --device: tools/device.c does it for CUDA). The replay library knows no
// driver: the device makes each run's backend and the streams, and moves the
// signature words of --verify in and out of its memory in stream order.
typedef struct nf__replay_dev_s {
  void *ctx;
  // A fresh backend for one run (each probe of a bisection gets its own),
  // and the device's memory in *capacity (0: not known). Non-zero: err says why.
  int (*backend)(void *ctx, uint64_t granule, nf_backend_t **out, uint64_t *capacity, char *err, size_t errlen);
  // The stream for the trace's stream k (raw: its handle in the trace, 0
  // the default stream); the same k always gets the same stream.
  nf_stream_t (*stream)(void *ctx, size_t k, uint64_t raw);
  // Write n 8-byte words val[i] at ptr + off[i], queued on stream s; read
  // them back after s's work (get waits). Non-zero: a driver error, in err.
  int (*put)(void *ctx, nf_stream_t s, void *ptr, size_t n, const uint64_t *off, const uint64_t *val, char *err,
             size_t errlen);
  int (*get)(void *ctx, nf_stream_t s, void *ptr, size_t n, const uint64_t *off, uint64_t *val, char *err,
             size_t errlen);
  // After the last op (before the pool goes): wait for all queued work, so
  // that the run's time includes it. Non-zero: err says why. May be NULL.
  int (*drain)(void *ctx, char *err, size_t errlen);
} nf__replay_dev;

typedef struct nf__replay_opts_s {
  nf_config_t cfg;   // pool config; cfg.limit 0 = unlimited (the capacity)
  uint64_t granule;  // 0 = cfg.granule, or NF_REPLAY_GRANULE if that is 0 too
  uint64_t capacity; // 0 = max(NF_REPLAY_CAPACITY, limit)
  int verify;        // write a signature into every block, check it at free
  const nf__replay_dev *dev; // NULL: the simulated host device
  int check;         // nf_pool_check at the end of a completed replay
  // Optional sampling hook (NULL: none, no cost): called with the pool's
  // statistics after every `sample_every`-th op (0 = every op) and once after
  // the last op done, e.g. to draw a live-vs-reserved timeline (--html).
  // `op` is the number of ops done. It must not touch the pool.
  void (*sample)(void *ctx, size_t op, const nf_stats_t *s);
  void *sample_ctx;
  size_t sample_every;
  // Optional bisection hook (nf__replay_min_capacity): called with sample_ctx
  // before probe k (1-based) of at most n (n 0: not known yet, the unlimited
  // run that finds the upper bound), at `limit` bytes (0: unlimited).
  void (*probe)(void *ctx, unsigned k, unsigned n, uint64_t limit);
} nf__replay_opts;

typedef struct nf__replay_result_s {
  nf_status_t status;   // NF_OK completed; NF_ERR_OOM stopped at an alloc; else error
  char error[512];      // why it stopped ("" when completed)
  size_t ops_done;      // ops completed before stopping
  size_t fail_event;    // 1-based trace event of the failing op (0: none); its
                        // line is trace->events[fail_event - 1].line
  nf_stats_t stats;     // pool statistics at the end (or at the failure)
  double seconds;       // the replay loop alone
  uint64_t verified;    // signatures checked
  nf_status_t check;    // nf_pool_check (NF_OK when not run)
  uint64_t limit, granule, capacity; // in force
  uint64_t calls_first_half, calls_second_half; // backend calls in each half of the ops (steady state)
} nf__replay_result;

// Defaults: nf_config_default, unlimited, 2 MiB granules, no verify, check.
void nf__replay_opts_default(nf__replay_opts *o);

// Replay `ops` once on a fresh backend + pool. Returns res->status.
nf_status_t nf__replay_run(const nf__trace_ops *ops, const nf__replay_opts *opts, nf__replay_result *res);

typedef struct nf__replay_bisect_s {
  uint64_t min_capacity; // smallest limit (whole granules) under which the replay completes
  uint64_t lower, upper; // bounds searched (bytes)
  unsigned probes;       // replays run
  double seconds;        // all probes together
  nf__replay_result at_min; // the completed replay at min_capacity
} nf__replay_bisect;

// Bisect the limit, in whole granules, between ceil(peak_live / G) and
// `upper` bytes (typically the physical peak of an unlimited replay; 0 = run
// one to find it). Probes use `opts` with cfg.limit replaced. A probe that
// fails other than by OOM aborts with its status and message in `err`.
// With cfg.spill on, NF_ERR_INVALID: every limit completes, no minimum exists.
nf_status_t nf__replay_min_capacity(const nf__trace_ops *ops, const nf__replay_opts *opts, uint64_t upper,
                                    nf__replay_bisect *out, char *err, size_t errlen);

#endif
