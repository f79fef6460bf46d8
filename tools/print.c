// nofrag replay's output: one JSON object, or text lines, for the replay through
// nofrag and for each allocator model run beside it (moved out of nofrag.c,
// which parses the options and runs the replays).
#include "cli.h"
#include "base/base.h"
#include "model.h"
#include "nofrag.h"
#include "replay.h"
#include "trace.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define CALLS(X) X(va_reserve) X(va_release) X(create) X(release) X(map) X(unmap) X(set_access) \
  X(event_create) X(event_record) X(event_query) X(event_sync) X(stream_wait) X(copy)
typedef struct { const char *n; uint64_t ns; } call_time;

void nfc_print_json(const nfc_cli *cli, const nf__trace_ops *ops, const nf__replay_opts *ro,
                    const nf__replay_result *r, const nf__replay_bisect *b, int bisected, const char *end) {
  const nf_stats_t *s = &r->stats;
  printf("{\"trace\":");
  nfc_json_str(stdout, cli->trace);
  printf(",\"device\":");
  nfc_json_str(stdout, cli->device ? cli->device : "simulated");
  printf(",\"granule\":%" PRIu64 ",\"limit\":", r->granule);
  if (ro->cfg.limit) printf("%" PRIu64, r->limit); else printf("null");
  printf(",\"capacity\":%" PRIu64 ",\"events\":%zu,\"allocs\":%zu,\"frees\":%zu,\"free_requested\":%zu"
         ",\"segment_allocs\":%zu,\"segment_frees\":%zu,\"streams\":%zu,\"ops\":%zu,\"ops_done\":%zu",
         r->capacity, ops->n_events, ops->n_allocs, ops->n_frees, ops->n_free_requested, ops->n_segment_alloc,
         ops->n_segment_free, ops->n_streams, ops->n_ops, r->ops_done);
  printf(",\"status\":\"%s\",\"error\":", r->status == NF_OK ? "ok" : r->status == NF_ERR_OOM ? "oom" : "error");
  if (r->error[0]) nfc_json_str(stdout, r->error); else printf("null");
  printf(",\"trace_peak_live\":%" PRIu64 ",\"peak_live\":%" PRIu64 ",\"peak_live_rounded\":%" PRIu64
         ",\"peak_mapped\":%" PRIu64 ",\"peak_physical\":%" PRIu64 ",\"peak_mapped_ratio\":%.6f"
         ",\"peak_physical_ratio\":%.6f", ops->peak_live, s->live_peak, s->live_rounded_peak, s->mapped_peak,
         s->physical_peak, nfc_ratio(s->mapped_peak, ops->peak_live), nfc_ratio(s->physical_peak, ops->peak_live));
  if (ops->n_segment_alloc) // null: the trace recorded no segments (not "0 bytes")
    printf(",\"native_peak_reserved\":%" PRIu64 ",\"native_peak_ratio\":%.6f", ops->native_peak_reserved,
           nfc_ratio(ops->native_peak_reserved, ops->peak_live));
  else printf(",\"native_peak_reserved\":null,\"native_peak_ratio\":null");
  printf(",\"backend_calls\":%" PRIu64 ",\"calls_second_half\":%" PRIu64 ",\"calls\":{", s->backend_calls,
         r->calls_second_half);
  const char *sep = "";
#define X(f) printf("%s\"" #f "\":%" PRIu64, sep, s->calls.f); sep = ",";
  CALLS(X)
#undef X
  printf("},\"backend_seconds\":%.6f,\"call_seconds\":{", (double)s->backend_ns * 1e-9);
  sep = "";
#define X(f) printf("%s\"" #f "\":%.6f", sep, (double)s->call_ns.f * 1e-9); sep = ",";
  CALLS(X)
#undef X
  printf("},\"reclaims\":%" PRIu64 ",\"reclaimed_granules\":%" PRIu64 ",\"cross_stream_reuses\":%" PRIu64
         ",\"spilled_peak\":%" PRIu64 ",\"spills\":%" PRIu64 ",\"views\":%" PRIu64 ",\"view_reuses\":%" PRIu64
         ",\"view_moves\":%" PRIu64 ",\"view_evictions\":%" PRIu64 ",\"units_made\":%" PRIu64
         ",\"units_unmapped\":%" PRIu64 ",\"unit_splits\":%" PRIu64 ",\"edges_made\":%" PRIu64,
         s->reclaims, s->reclaimed_granules, s->cross_stream_reuses, s->spilled_peak, s->spills, s->views,
         s->view_reuses, s->view_moves, s->view_evictions, s->units_made, s->units_unmapped, s->unit_splits,
         s->edges_made);
  // events_per_second counts trace events walked (free_requested and
  // segment_* included, as no-ops); ops_per_second counts allocator calls.
  size_t events_done = r->ops_done < ops->n_ops ? (size_t)ops->ops[r->ops_done].event : ops->n_events;
  printf(",\"replay_seconds\":%.6f,\"events_per_second\":%.1f,\"ops_per_second\":%.1f,\"ooms\":%" PRIu64,
         r->seconds, r->seconds > 0 ? (double)events_done / r->seconds : 0.0,
         r->seconds > 0 ? (double)r->ops_done / r->seconds : 0.0, s->ooms);
  printf(",\"verify\":%s,\"verified\":%" PRIu64 ",\"pool_check\":%s", cli->verify ? "true" : "false", r->verified,
         r->check == NF_OK ? "\"ok\"" : "\"failed\"");
  if (bisected) {
    const nf_stats_t *m = &b->at_min.stats;
    printf(",\"min_capacity\":%" PRIu64 ",\"min_capacity_ratio\":%.6f,\"min_capacity_granules\":%" PRIu64
           ",\"min_capacity_lower\":%" PRIu64 ",\"min_capacity_probes\":%u,\"min_capacity_seconds\":%.3f"
           ",\"at_min_capacity\":{\"backend_calls\":%" PRIu64 ",\"reclaims\":%" PRIu64
           ",\"reclaimed_granules\":%" PRIu64 ",\"peak_physical\":%" PRIu64 ",\"replay_seconds\":%.6f}",
           b->min_capacity, nfc_ratio(b->min_capacity, ops->peak_live), b->min_capacity / r->granule, b->lower,
           b->probes, b->seconds, m->backend_calls, m->reclaims, m->reclaimed_granules, m->physical_peak,
           b->at_min.seconds);
  } else {
    printf(",\"min_capacity\":null,\"min_capacity_ratio\":null");
  }
  printf("}%s", end);
}

// One allocator model's run (and bisection): JSON object (left open), or text lines.
void nfc_print_model_json(const nf__trace_ops *ops, const nf__model_result *r, const nf__model_bisect *b,
                          int bisected) {
  printf("{\"allocator\":\"%s\",\"limit\":", nf__model_name(r->kind));
  if (r->limit) printf("%" PRIu64, r->limit); else printf("null");
  printf(",\"status\":\"%s\",\"error\":", r->status == NF_OK ? "ok" : r->status == NF_ERR_OOM ? "oom" : "error");
  if (r->error[0]) nfc_json_str(stdout, r->error); else printf("null");
  printf(",\"ops_done\":%zu,\"peak_live\":%" PRIu64 ",\"peak_allocated\":%" PRIu64 ",\"peak_reserved\":%" PRIu64
         ",\"peak_reserved_ratio\":%.6f", r->ops_done, r->peak_requested, r->peak_allocated, r->peak_reserved,
         nfc_ratio(r->peak_reserved, ops->peak_live));
  // null, as in the nofrag object: no segment events recorded, not "0 bytes".
  if (ops->n_segment_alloc) printf(",\"native_peak_reserved\":%" PRIu64, ops->native_peak_reserved);
  else printf(",\"native_peak_reserved\":null");
  printf(",\"device_allocs\":%" PRIu64 ",\"device_frees\":%" PRIu64 ",\"alloc_retries\":%" PRIu64 ",\"ooms\":%" PRIu64
         ",\"segments_peak\":%zu,\"replay_seconds\":%.6f", r->device_allocs, r->device_frees, r->alloc_retries,
         r->ooms, r->segments_peak, r->seconds);
  if (bisected)
    printf(",\"min_capacity\":%" PRIu64 ",\"min_capacity_ratio\":%.6f,\"min_capacity_probes\":%u"
           ",\"min_capacity_seconds\":%.3f", b->min_capacity, nfc_ratio(b->min_capacity, ops->peak_live), b->probes,
           b->seconds);
  else printf(",\"min_capacity\":null,\"min_capacity_ratio\":null");
  // The caller closes the object (after an optional "hotspots" member).
}

void nfc_print_model_text(const nf__trace_ops *ops, const nf__model_result *r, const nf__model_bisect *b,
                          int bisected) {
  char h[32];
  printf("allocator             %s (model of PyTorch's caching allocator%s)\n", nf__model_name(r->kind),
         r->kind == NF_MODEL_EXPANDABLE ? ", expandable_segments:True" : ", default settings");
  nf__fmt_bytes(h, sizeof h, r->limit);
  printf("limit                 %s\n", r->limit ? h : "none");
  nf__fmt_bytes(h, sizeof h, r->peak_allocated);
  printf("peak allocated        %" PRIu64 " B (%s, block sizes)\n", r->peak_allocated, h);
  nf__fmt_bytes(h, sizeof h, r->peak_reserved);
  printf("peak reserved         %" PRIu64 " B (%s, %.4f x live)\n", r->peak_reserved, h,
         nfc_ratio(r->peak_reserved, ops->peak_live));
  printf("device calls          %" PRIu64 " %s, %" PRIu64 " %s; %" PRIu64 " cache flushes and retries\n",
         r->device_allocs, r->kind == NF_MODEL_EXPANDABLE ? "maps" : "cudaMalloc", r->device_frees,
         r->kind == NF_MODEL_EXPANDABLE ? "unmaps" : "cudaFree", r->alloc_retries);
  printf("segments at peak      %zu\n", r->segments_peak);
  printf("replay                %.3f s (%zu of %zu ops)\n", r->seconds, r->ops_done, ops->n_ops);
  if (r->status != NF_OK) printf("stopped               %s\n", r->error);
  if (bisected) {
    nf__fmt_bytes(h, sizeof h, b->min_capacity);
    printf("min capacity          %" PRIu64 " B (%s) = %.4f x peak live (%u probes, %.2f s)\n", b->min_capacity, h,
           nfc_ratio(b->min_capacity, ops->peak_live), b->probes, b->seconds);
  }
}

void nfc_print_text(const nfc_cli *cli, const nf__trace_ops *ops, const nf__replay_opts *ro,
                    const nf__replay_result *r, const nf__replay_bisect *b, int bisected) {
  const nf_stats_t *s = &r->stats;
  char h1[32], h2[32];
  printf("trace                 %s\n", cli->trace);
  printf("events                %zu (%zu alloc, %zu free_completed, %zu free_requested, %zu segment_alloc, "
         "%zu segment_free), %zu stream%s\n", ops->n_events, ops->n_allocs, ops->n_frees, ops->n_free_requested,
         ops->n_segment_alloc, ops->n_segment_free, ops->n_streams, ops->n_streams == 1 ? "" : "s");
  nf__fmt_bytes(h1, sizeof h1, r->granule);
  nf__fmt_bytes(h2, sizeof h2, r->limit);
  char h4[64] = "none (simulated capacity 2 TiB)";
  if (cli->device) snprintf(h4, sizeof h4, "none (the device's memory, %s)", h2);
  printf("device                %s\n", cli->device ? cli->device : "simulated (host backend)");
  printf("granule               %s\nlimit                 %s", h1, ro->cfg.limit ? h2 : h4);
  if (ro->cfg.limit && r->limit != ro->cfg.limit) { // the pool keeps whole granules
    // In bytes: the formatted sizes of the two often read the same.
    printf(" (%" PRIu64 " B: rounded down to whole granules from %" PRIu64 " B)", r->limit, ro->cfg.limit);
  }
  printf("\n");
  nf__fmt_bytes(h1, sizeof h1, s->live_peak);
  printf("peak live             %" PRIu64 " B (%s)", s->live_peak, h1);
  if (s->live_peak != ops->peak_live) // stopped early: "x live" below is still over the trace's
    printf(" of the calls done; the trace's %" PRIu64 " B is the ratios' denominator", ops->peak_live);
  printf("\n");
  nf__fmt_bytes(h1, sizeof h1, s->mapped_peak);
  printf("peak mapped           %" PRIu64 " B (%s, %.4f x live)\n", s->mapped_peak, h1,
         nfc_ratio(s->mapped_peak, ops->peak_live));
  nf__fmt_bytes(h1, sizeof h1, s->physical_peak);
  printf("peak physical         %" PRIu64 " B (%s, %.4f x live)\n", s->physical_peak, h1,
         nfc_ratio(s->physical_peak, ops->peak_live));
  nf__fmt_bytes(h1, sizeof h1, ops->native_peak_reserved);
  if (ops->n_segment_alloc)
    printf("native peak reserved  %" PRIu64 " B (%s, %.4f x live; PyTorch's segments in the trace)\n",
           ops->native_peak_reserved, h1, nfc_ratio(ops->native_peak_reserved, ops->peak_live));
  else // an RMM log or a hand-written trace: nothing to compare with but the model
    printf("native peak reserved  n/a (the trace has no segment_alloc events, so PyTorch's reserved memory was not "
           "recorded; --allocator native models it)\n");
  printf("backend calls         %" PRIu64 " (", s->backend_calls);
  const char *sep = "";
#define X(f) if (s->calls.f) { printf("%s" #f " %" PRIu64, sep, s->calls.f); sep = ", "; }
  CALLS(X)
#undef X
  printf(")\n");
  // What the (simulated or real) device charged for them, the largest kinds first.
  printf("  time in them        %.3f s", (double)s->backend_ns * 1e-9);
  {
    call_time k[16];
    int nk = 0;
#define X(f) if (s->call_ns.f) { k[nk].n = #f; k[nk++].ns = s->call_ns.f; }
    CALLS(X)
#undef X
    for (int i = 1; i < nk; i++) // insertion sort, descending (13 kinds at most)
      for (int j = i; j > 0 && k[j].ns > k[j - 1].ns; j--) { call_time t = k[j]; k[j] = k[j - 1]; k[j - 1] = t; }
    for (int i = 0; i < nk && i < 4; i++) printf("%s%s %.3f", i ? ", " : " (", k[i].n, (double)k[i].ns * 1e-9);
    printf("%s\n", nk ? ")" : "");
  }
  printf("  in 2nd half         %" PRIu64 " (%s)\n", r->calls_second_half,
         r->ops_done < ops->n_ops / 2 ? "the replay stopped before the trace's second half" // no call made there
                                      : "steady state: the trace's later steps");
  printf("reclaims              %" PRIu64 " (%" PRIu64 " granules stitched)\n", s->reclaims, s->reclaimed_granules);
  printf("views                 %" PRIu64 " granules taken back by a view, %" PRIu64 " moved to a new view, %" PRIu64
         " views evicted, %" PRIu64 " parked at the end\n", s->view_reuses, s->view_moves, s->view_evictions, s->views);
  if (s->units_made)
    printf("units                 %" PRIu64 " made, %" PRIu64 " unmapped (%" PRIu64 " split by a block over part of "
           "one), %" PRIu64 " mapped at the end\n", s->units_made, s->units_unmapped, s->unit_splits, s->units);
  if (s->edges_made)
    printf("edge sharing          %" PRIu64 " granules shared by two blocks' ends (a second mapping each), %" PRIu64
           " at the end\n", s->edges_made, s->edges);
  if (s->spills) {
    nf__fmt_bytes(h1, sizeof h1, s->spilled_peak);
    printf("spilled               peak %" PRIu64 " B (%s) on host granules, %" PRIu64 " allocations spilled\n",
           s->spilled_peak, h1, s->spills);
  }
  printf("replay                %.3f s, %.0f allocator calls/s (%zu of %zu)\n", r->seconds,
         r->seconds > 0 ? (double)r->ops_done / r->seconds : 0.0, r->ops_done, ops->n_ops);
  printf("OOMs                  %" PRIu64 "\n", s->ooms);
  if (cli->verify) printf("verify                %" PRIu64 " signatures checked%s\n", r->verified,
                          r->status == NF_OK ? ", none lost" : "");
  if (r->status == NF_OK) printf("pool check            OK\n");
  else printf("stopped               %s\n", r->error);
  if (bisected) {
    nf__fmt_bytes(h1, sizeof h1, b->min_capacity);
    printf("min capacity          %" PRIu64 " B (%s, %" PRIu64 " granules) = %.4f x peak live\n", b->min_capacity,
           h1, b->min_capacity / r->granule, nfc_ratio(b->min_capacity, ops->peak_live));
    printf("                      %u probes in %.2f s; at min capacity: %" PRIu64 " backend calls, %" PRIu64
           " reclaims\n", b->probes, b->seconds, b->at_min.stats.backend_calls, b->at_min.stats.reclaims);
  }
}

