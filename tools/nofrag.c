// nofrag command-line tool: trace replay and minimum-capacity search.
//
// The engine lives in the library (src/replay.c, src/trace.c); this file only
// parses options and prints. Exit codes: 0 ok, 1 the replay failed (OOM, data
// lost, invariant broken), 2 usage or input error (bad option, unreadable or
// malformed trace).
#include "cli.h"
#include "base/base.h"
#include "model.h"
#include "nofrag.h"
#include "replay.h"
#include "trace.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "usage: nofrag replay TRACE [options]   replay an allocation trace through nofrag\n"
    "       nofrag convert TRACE OUT.csv     write TRACE as an RMM logging_resource_adaptor log\n"
    "       nofrag top [--once [--json]] [--clean] [--dir DIR]  live memory of every nofrag process (q quits)\n"
    "       nofrag doctor [--json] [--device N]     check that nofrag works here (driver, GPUs, limits)\n"
    "       nofrag version                  print the version\n"
    "       nofrag --help                   this text\n"
    "\n"
    "TRACE is a text trace, gzip-compressed or not: lines 'ACTION ADDR SIZE STREAM TIME_US'\n"
    "(alloc, free_requested, free_completed, segment_alloc, segment_free), '#' comments;\n"
    "or a PyTorch memory snapshot pickle (torch.cuda.memory._dump_snapshot, converted with\n"
    "python3 -m nofrag.torch_trace, which needs python3); or an RMM logging_resource_adaptor CSV\n"
    "log (header Thread,Time,Action,Pointer,Size,Stream). The format is detected from content.\n"
    "Each alloc becomes nf_alloc on its stream, each free_completed nf_free, on a simulated\n"
    "device (host backend, 2 TiB of untouched memory), whose clock is the trace's TIME_US\n"
    "(the release policy's release_idle_ms).\n"
    "\n"
    "options:\n"
    "  --limit BYTES     physical memory limit, > 0 (default: none; leave it out for no limit).\n"
    "                    BYTES takes B, KiB, MiB, GiB, TiB, PiB or KB, MB, GB, TB, PB suffixes, e.g. 24GiB\n"
    "  --granule BYTES   granule size, a power of two >= 4 KiB (default 2MiB, as on CUDA)\n"
    "  --conf STRING     pool configuration 'key:value,...' (as NOFRAG_CONF); --limit and\n"
    "                    --granule override it\n"
    "  --min-capacity    bisect the smallest limit, in whole granules, under which the whole\n"
    "                    trace completes; prints min_capacity and min_capacity / peak live\n"
    "                    (not with spill:host, under which every limit completes)\n"
    "  --allocator NAME  nofrag (default), native (a model of PyTorch's caching allocator with\n"
    "                    default settings), expandable (the same with expandable_segments:True)\n"
    "                    or all (the three, then a side-by-side table). The models take --limit\n"
    "                    as PyTorch's memory fraction and free their cache and retry before OOM\n"
    "  --verify          write a signature into every block and check it at its free (its first 8\n"
    "                    bytes, its last 8-aligned 8 and the first 8 of every granule it runs into)\n"
    "  --device cuda[:N] replay nofrag on GPU N (default 0) instead of the simulated device: the\n"
    "                    library's CUDA backend, one CUDA stream per trace stream; with --verify\n"
    "                    the signatures go through device memory. The time then includes the\n"
    "                    driver's calls. Under the same --limit it decides as the simulated\n"
    "                    device does; without one, each side's limit is its own size. The\n"
    "                    models still run on the CPU\n"
    "  --json            print one JSON object instead of text\n"
    "  --html FILE       also write a self-contained HTML page: live vs reserved over the replay\n"
    "                    for nofrag and, when the trace has segment events, for PyTorch's\n"
    "                    recorded segments, with the peak marked; a table of every allocator run\n"
    "                    and, for the models run, their own timelines; with call sites (below),\n"
    "                    the hotspot tables\n"
    "  --hotspots        for the models run (native, expandable): the 10 call sites holding the\n"
    "                    most reserved-but-unused memory at peak reserved. Needs stacks: a PyTorch\n"
    "                    snapshot, or a trace converted from one ('#site' lines)\n"
    "\n"
    "A progress bar is drawn on stderr when it is a terminal (NOFRAG_PROGRESS=0 hides it).\n"
    "\n"
    "example: nofrag replay data/gpt2.trace.gz --min-capacity\n";

// Sizes go through nf_config_parse so that the syntax is the library's.
static int parse_bytes(const char *key, const char *val, uint64_t *out) {
  nf_config_t c;
  nf_config_default(&c);
  char buf[256], err[256] = "";
  if (snprintf(buf, sizeof buf, "%s:%s", key, val) >= (int)sizeof buf || strchr(val, ',') ||
      nf_config_parse(&c, buf, err, sizeof err) != NF_OK) {
    // The library's granule rule admits 0 (the backend's), which the CLI refuses (below).
    if (strcmp(key, "granule") == 0 && strstr(err, "power of two"))
      fprintf(stderr, "nofrag: --granule '%s': the granule must be a power of two >= 4 KiB\n", val);
    else
      fprintf(stderr, "nofrag: --%s '%s': %s\n", key, val, err[0] ? err : "bad size");
    return -1;
  }
  *out = strcmp(key, "limit") == 0 ? c.limit : c.granule;
  return 0;
}

static int cmd_replay(int argc, char **argv) {
  nfc_cli cli = {0};
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    const char **val = NULL;
    if (strcmp(a, "--min-capacity") == 0) cli.min_capacity = 1;
    else if (strcmp(a, "--json") == 0) cli.json = 1;
    else if (strcmp(a, "--verify") == 0) cli.verify = 1;
    else if (strcmp(a, "--hotspots") == 0) cli.hotspots = 1;
    else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) { fputs(usage, stdout); return 0; }
    else if (strncmp(a, "--limit", 7) == 0) val = &cli.limit_str;
    else if (strncmp(a, "--granule", 9) == 0) val = &cli.granule_str;
    else if (strncmp(a, "--conf", 6) == 0) val = &cli.conf;
    else if (strncmp(a, "--allocator", 11) == 0) val = &cli.allocator;
    else if (strncmp(a, "--html", 6) == 0) val = &cli.html;
    else if (strncmp(a, "--device", 8) == 0) val = &cli.device;
    else if (a[0] == '-' && a[1]) { fprintf(stderr, "nofrag: unknown option '%s' (see nofrag --help)\n", a); return 2; }
    else if (!cli.trace) cli.trace = a;
    else { fprintf(stderr, "nofrag: unexpected argument '%s' (one TRACE only)\n", a); return 2; }
    if (val) { // --opt VALUE or --opt=VALUE
      const char *eq = strchr(a, '=');
      size_t kl = eq ? (size_t)(eq - a) : strlen(a);
      if (kl != strlen(val == &cli.limit_str     ? "--limit"
                       : val == &cli.granule_str ? "--granule"
                       : val == &cli.allocator   ? "--allocator"
                       : val == &cli.html        ? "--html"
                       : val == &cli.device      ? "--device"
                                                 : "--conf")) {
        fprintf(stderr, "nofrag: unknown option '%s' (see nofrag --help)\n", a);
        return 2;
      }
      if (eq) *val = eq + 1;
      else if (i + 1 < argc) *val = argv[++i];
      else { fprintf(stderr, "nofrag: %s needs a value\n", a); return 2; }
    }
  }
  if (!cli.trace) { fprintf(stderr, "nofrag: replay needs a TRACE file (see nofrag --help)\n"); return 2; }
  const char *alloc = cli.allocator ? cli.allocator : "nofrag";
  if (strcmp(alloc, "nofrag") == 0) cli.run_nofrag = 1;
  else if (strcmp(alloc, "native") == 0) cli.run_model[NF_MODEL_NATIVE] = 1;
  else if (strcmp(alloc, "expandable") == 0) cli.run_model[NF_MODEL_EXPANDABLE] = 1;
  else if (strcmp(alloc, "all") == 0) cli.run_nofrag = cli.run_model[0] = cli.run_model[1] = 1;
  else {
    fprintf(stderr, "nofrag: --allocator '%s': expected native, expandable, nofrag or all\n", alloc);
    return 2;
  }

  nf__replay_opts ro;
  nf__replay_opts_default(&ro);
  ro.verify = cli.verify;
  char err[512] = "";
  if (cli.conf && nf_config_parse(&ro.cfg, cli.conf, err, sizeof err) != NF_OK) {
    fprintf(stderr, "nofrag: --conf '%s': %s\n", cli.conf, err);
    return 2;
  }
  // The replay builds its own simulated device (host backend): keys that
  // choose or size a backend would be silently ignored, so refuse them.
  if (ro.cfg.backend != NF_BACKEND_HOST || ro.cfg.device || ro.cfg.host_capacity) {
    fprintf(stderr, "nofrag: --conf '%s': %s has no effect here: replay always runs on a simulated device (the "
            "host backend, 2 TiB or the limit) or, with --device cuda[:N], on that GPU; drop it\n", cli.conf,
            ro.cfg.backend != NF_BACKEND_HOST ? "backend:cuda" : ro.cfg.device ? "device" : "host_capacity");
    return 2;
  }
  const char *env_conf = getenv("NOFRAG_CONF");
  if (env_conf && *env_conf)
    fprintf(stderr, "nofrag: note: NOFRAG_CONF='%s' is ignored by replay (it configures programs using the library); "
            "pass it as --conf to replay with it\n", env_conf);
  if (cli.limit_str && parse_bytes("limit", cli.limit_str, &ro.cfg.limit) != 0) return 2;
  if (cli.granule_str && parse_bytes("granule", cli.granule_str, &ro.granule) != 0) return 2;
  // 0 is the library's "unset" (limit: the backend's capacity, granule: the
  // backend's); given on the command line it is a mistake, not a request.
  if (cli.limit_str && ro.cfg.limit == 0) {
    fprintf(stderr, "nofrag: --limit '%s': the limit must be > 0 (to replay without a limit, leave --limit out)\n",
            cli.limit_str);
    return 2;
  }
  if (cli.granule_str && ro.granule == 0) {
    fprintf(stderr, "nofrag: --granule '%s': the granule must be a power of two >= 4 KiB (for the default, 2MiB, "
            "leave --granule out)\n", cli.granule_str);
    return 2;
  }
  if (ro.granule) ro.cfg.granule = ro.granule;
  uint64_t g_eff = ro.cfg.granule ? ro.cfg.granule : NF_REPLAY_GRANULE;
  if (ro.cfg.limit && ro.cfg.limit < g_eff) { // the pool would refuse it; say so before any work
    char lb[32], gb[32];
    nf__fmt_bytes(lb, sizeof lb, ro.cfg.limit);
    nf__fmt_bytes(gb, sizeof gb, g_eff);
    fprintf(stderr, "nofrag: limit %s is below one granule (%s): give a limit of at least one granule\n", lb, gb);
    return 2;
  }

  // With spill a limit never stops the replay (host granules take the
  // excess), so there is no smallest limit to bisect: the answer was the
  // bisection's lower bound, not a measured minimum.
  if (cli.min_capacity && cli.run_nofrag && ro.cfg.spill) {
    fprintf(stderr, "nofrag: --min-capacity with spill:host is meaningless: with spill the trace completes under "
            "any limit (the excess goes to host memory); drop one of them\n");
    return 2;
  }
  if (cli.device && !cli.run_nofrag) {
    fprintf(stderr, "nofrag: --device runs nofrag on a GPU; the models (--allocator %s) run on the CPU only: drop "
            "--device or add nofrag (--allocator all)\n", alloc);
    return 2;
  }
  if (cli.verify && !cli.run_nofrag) {
    fprintf(stderr, "nofrag: --verify checks the memory nofrag hands out; the models (--allocator %s) hand out none: "
            "drop --verify or add nofrag (--allocator all)\n", alloc);
    return 2;
  }
  if (cli.hotspots && !cli.run_model[0] && !cli.run_model[1]) {
    fprintf(stderr, "nofrag: --hotspots needs --allocator native, expandable or all (the models' segments)\n");
    return 2;
  }
  // --html's file is written last: find an unwritable one (no such
  // directory, no permission, a directory) before the replay and bisection,
  // not after. Nothing is left behind: a file created for the check is
  // removed, an existing one is opened without truncating it.
  if (cli.html) {
    int fd = open(cli.html, O_WRONLY | O_CREAT | O_EXCL, 0666);
    int created = fd >= 0;
    if (fd < 0 && errno == EEXIST) fd = open(cli.html, O_WRONLY);
    if (fd < 0) {
      fprintf(stderr, "nofrag: --html %s: cannot write: %s\n", cli.html, strerror(errno));
      return 2;
    }
    close(fd);
    if (created) unlink(cli.html);
  }
  nf_trace_t t;
  nfc_sites sites;
  // Timelines: nofrag, native, expandable, the trace's recorded segments.
  nfc_html_series hs[2 + NF_MODEL_NKINDS];
  nfc_hotspots hot[NF_MODEL_NKINDS];
  size_t n_hot = 0;
  memset(hs, 0, sizeof hs);
  memset(hot, 0, sizeof hot);
  if (nfc_load_trace_sites(cli.trace, &t, &sites, NULL, err, sizeof err) != NF_OK) {
    fprintf(stderr, "nofrag: %s\n", err);
    return 2;
  }
  nf__trace_ops ops;
  if (nf__trace_ops_build(&ops, &t, err, sizeof err) != NF_OK) {
    fprintf(stderr, "nofrag: %s\n", err);
    nf__trace_free(&t);
    nfc_sites_free(&sites);
    return 2;
  }
  nfc_device *device = NULL;
  if (cli.device) {
    if (nfc_device_open(cli.device, ops.n_streams, ops.streams, &device, err, sizeof err) != 0) {
      fprintf(stderr, "nofrag: %s\n", err);
      nf__trace_ops_free(&ops);
      nf__trace_free(&t);
      nfc_sites_free(&sites);
      return 2;
    }
    ro.dev = nfc_device_hooks(device);
  }
  if (cli.hotspots && sites.n <= 1)
    fprintf(stderr, "nofrag: %s: no call sites in this trace (--hotspots needs a PyTorch snapshot with stacks)\n",
            cli.trace);

  int rc = 0, all = cli.run_nofrag && cli.run_model[0];
  nf__replay_result *r = malloc(sizeof *r);
  nf__replay_bisect *b = calloc(1, sizeof *b);
  nf__model_result *mr = calloc(NF_MODEL_NKINDS, sizeof *mr);
  nf__model_bisect *mb = calloc(NF_MODEL_NKINDS, sizeof *mb);
  int mbisected[NF_MODEL_NKINDS] = {0};
  if (!r || !b || !mr || !mb) { fprintf(stderr, "nofrag: out of memory\n"); rc = 2; goto out; }
  if (cli.json && all) {
    printf("{\"trace\":");
    nfc_json_str(stdout, cli.trace);
    printf(",\"nofrag\":");
  }
  if (cli.run_nofrag) {
    nf__replay_opts ro_main = ro; // sampled for --html and the progress bar
    nfc_watch w = {.hs = NULL};
    nfc_progress_start(&w.prog, "nofrag", ops.n_ops);
    if (cli.html) {
      hs[0].name = "nofrag (replayed)";
      hs[0].reserved_label = "reserved (physical granules)";
      w.hs = &hs[0];
    }
    if (w.hs || w.prog.on) {
      ro_main.sample = nfc_watch_replay;
      ro_main.sample_ctx = &w;
      ro_main.sample_every = nfc_watch_every(&w, ops.n_ops);
    }
    nf_status_t st = nf__replay_run(&ops, &ro_main, r);
    nfc_progress_end(&w.prog);
    if (st != NF_OK) {
      uint32_t line = r->fail_event ? t.events[r->fail_event - 1].line : 0;
      if (line) fprintf(stderr, "nofrag: %s:%u: %s\n", cli.trace, line, r->error);
      else fprintf(stderr, "nofrag: %s: %s\n", cli.trace, r->error);
      rc = 1;
    }
    int bisected = 0;
    if (cli.min_capacity) {
      // The main run's physical peak is an upper bound only if it was unlimited.
      uint64_t upper = (st == NF_OK && !ro.cfg.limit) ? r->stats.physical_peak : 0;
      uint64_t from = (ops.peak_live + r->granule - 1) / r->granule;
      if (!cli.json && upper)
        fprintf(stderr, "nofrag: bisecting the limit between %" PRIu64 " and %" PRIu64 " granules...\n", from,
                (upper + r->granule - 1) / r->granule);
      else if (!cli.json) // no unlimited run yet: the bisection finds its upper bound first
        fprintf(stderr, "nofrag: bisecting the limit from %" PRIu64 " granules up (upper bound not known yet)...\n", from);
      nf__replay_opts ro_bis = ro; // each probe's progress, no timeline
      nfc_watch wb = {.hs = NULL};
      nfc_progress_start(&wb.prog, "bisecting", ops.n_ops);
      if (wb.prog.on) {
        ro_bis.sample = nfc_watch_replay;
        ro_bis.sample_ctx = &wb;
        ro_bis.sample_every = nfc_watch_every(&wb, ops.n_ops);
        ro_bis.probe = nfc_watch_probe;
      }
      nf_status_t bst = nf__replay_min_capacity(&ops, &ro_bis, upper, b, err, sizeof err);
      nfc_progress_end(&wb.prog);
      if (bst == NF_OK) bisected = 1;
      else { fprintf(stderr, "nofrag: %s: min capacity: %s\n", cli.trace, err); rc = 1; }
    }
    if (cli.json) nfc_print_json(&cli, &ops, &ro, r, b, bisected, all ? "" : "\n");
    else nfc_print_text(&cli, &ops, &ro, r, b, bisected);
  }
  for (int k = 0; k < NF_MODEL_NKINDS; k++) {
    if (!cli.run_model[k]) continue;
    // The models bisect in 2 MiB steps (CUDA's granularity) unless --granule says otherwise.
    uint64_t g = ro.granule ? ro.granule : NF_REPLAY_GRANULE;
    nfc_watch w = {.hs = NULL};
    nf__model_hooks hk = {0};
    nfc_progress_start(&w.prog, nf__model_name(k), ops.n_ops);
    if (cli.html) {
      w.hs = &hs[1 + k];
      w.hs->name = k == NF_MODEL_NATIVE ? "native (model of PyTorch's caching allocator)"
                                        : "expandable (model, expandable_segments:True)";
      w.hs->reserved_label = "reserved (model's reserved_bytes)";
    }
    if (w.hs || w.prog.on) {
      hk.sample = nfc_watch_model;
      hk.sample_every = nfc_watch_every(&w, ops.n_ops);
      hk.ctx = &w;
    }
    nf_status_t mst = nf__model_run_hooked(k, &ops, ro.cfg.limit, &hk, &mr[k]);
    nfc_progress_end(&w.prog);
    if (w.hs) { w.hs->peak_reserved = mr[k].peak_reserved; w.hs->peak_x = mr[k].peak_op; } // exact peak
    if ((cli.hotspots || cli.html) && sites.n > 1) {
      if (nfc_hotspots_run(k, &ops, ro.cfg.limit, &mr[k], &sites, &hot[n_hot]) == 0) n_hot++;
      else { nfc_hotspots_free(&hot[n_hot]); fprintf(stderr, "nofrag: out of memory for hotspots\n"); rc = 1; }
    }
    if (mst != NF_OK) {
      uint32_t line = mr[k].fail_event ? t.events[mr[k].fail_event - 1].line : 0;
      fprintf(stderr, "nofrag: %s:%u: %s: %s\n", cli.trace, line, nf__model_name(k), mr[k].error);
      rc = 1;
    }
    if (cli.min_capacity) {
      uint64_t upper = mr[k].status == NF_OK && !ro.cfg.limit ? mr[k].peak_reserved : 0;
      if (nf__model_min_capacity(k, &ops, g, upper, &mb[k], err, sizeof err) == NF_OK) mbisected[k] = 1;
      else { fprintf(stderr, "nofrag: %s: %s min capacity: %s\n", cli.trace, nf__model_name(k), err); rc = 1; }
    }
    if (cli.json) {
      if (all) printf(",\"%s\":", nf__model_name(k));
      nfc_print_model_json(&ops, &mr[k], &mb[k], mbisected[k]);
      if (cli.hotspots && n_hot && hot[n_hot - 1].kind == k) {
        printf(",\"hotspots\":");
        nfc_hotspots_json(stdout, &hot[n_hot - 1], &sites);
      }
      printf("}");
      if (!all) printf("\n");
    } else {
      printf("\n");
      nfc_print_model_text(&ops, &mr[k], &mb[k], mbisected[k]);
      if (cli.hotspots && n_hot && hot[n_hot - 1].kind == k) nfc_hotspots_print(&hot[n_hot - 1], &sites);
    }
  }
  if (all && cli.json) printf("}\n");
  else if (all) { // side by side
    printf("\n%-11s %14s %14s %9s %14s %9s %12s %9s\n", "allocator", "peak live", "peak reserved", "res/live",
           "min capacity", "cap/live", "device calls", "replay s");
    // Min capacity columns read "-" where no bisection ran.
    char capc[2][32];
#define CAPCOLS(c)                                                                      \
  do {                                                                                  \
    if (c) {                                                                            \
      snprintf(capc[0], sizeof capc[0], "%" PRIu64, (uint64_t)(c));                     \
      snprintf(capc[1], sizeof capc[1], "%.4f", nfc_ratio((c), ops.peak_live));            \
    } else {                                                                            \
      snprintf(capc[0], sizeof capc[0], "-");                                           \
      snprintf(capc[1], sizeof capc[1], "-");                                           \
    }                                                                                   \
  } while (0)
    CAPCOLS(cli.min_capacity ? b->min_capacity : 0);
    printf("%-11s %14" PRIu64 " %14" PRIu64 " %9.4f %14s %9s %12" PRIu64 " %9.3f\n", "nofrag",
           r->stats.live_peak, r->stats.physical_peak, nfc_ratio(r->stats.physical_peak, ops.peak_live), capc[0],
           capc[1], r->stats.backend_calls, r->seconds);
    for (int k = 0; k < NF_MODEL_NKINDS; k++) {
      CAPCOLS(mbisected[k] ? mb[k].min_capacity : 0);
      printf("%-11s %14" PRIu64 " %14" PRIu64 " %9.4f %14s %9s %12" PRIu64 " %9.3f\n", nf__model_name(k),
             mr[k].peak_requested, mr[k].peak_reserved, nfc_ratio(mr[k].peak_reserved, ops.peak_live), capc[0],
             capc[1], mr[k].device_allocs + mr[k].device_frees, mr[k].seconds);
    }
#undef CAPCOLS
    // Every ratio, here as in --json and --html, is over the trace's peak
    // live; a run that stopped early shows its own (smaller) peak live.
    int stopped = r->status != NF_OK || mr[0].status != NF_OK || mr[1].status != NF_OK;
    printf("(ratios: / the trace's peak live %" PRIu64 "%s; nofrag: peak physical; models: PyTorch's reserved "
           "bytes; ", ops.peak_live, stopped ? ", a run that stopped shows the peak live of its calls done" : "");
    if (ops.n_segment_alloc) printf("trace's native peak reserved %" PRIu64 ")\n", ops.native_peak_reserved);
    else printf("the trace has no segment events: no recorded native peak)\n");
  }
  if (cli.html) {
    nfc_html_row rows[2 + NF_MODEL_NKINDS];
    size_t nr = 0, ns = 0;
    nfc_html_series shown[2 + NF_MODEL_NKINDS]; // the runs made, in order (shallow copies)
    if (cli.run_nofrag) shown[ns++] = hs[0];
    for (int k = 0; k < NF_MODEL_NKINDS; k++)
      if (cli.run_model[k]) shown[ns++] = hs[1 + k];
    if (cli.run_nofrag)
      rows[nr++] = (nfc_html_row){"nofrag", r->stats.live_peak, r->stats.physical_peak,
                                 cli.min_capacity ? b->min_capacity : 0, r->seconds,
                                 r->status == NF_OK ? "ok" : r->error};
    for (int k = 0; k < NF_MODEL_NKINDS; k++)
      if (cli.run_model[k])
        rows[nr++] = (nfc_html_row){nf__model_name(k), mr[k].peak_requested, mr[k].peak_reserved,
                                   mbisected[k] ? mb[k].min_capacity : 0, mr[k].seconds,
                                   mr[k].status == NF_OK ? "ok" : mr[k].error};
    if (ops.n_segment_alloc) {
      rows[nr++] = (nfc_html_row){"PyTorch native (recorded)", ops.peak_live, ops.native_peak_reserved, 0, 0.0,
                                 "recorded"};
      if (nfc_html_trace_series(&t, &ops, nfc_html_every(ops.n_ops), &hs[1 + NF_MODEL_NKINDS]) == 0)
        shown[ns++] = hs[1 + NF_MODEL_NKINDS];
    }
    if (nfc_html_write(cli.html, cli.trace, ops.peak_live, shown, ns, rows, nr, hot, n_hot, &sites) != 0) {
      fprintf(stderr, "nofrag: --html %s: %s\n", cli.html, strerror(errno));
      rc = 2;
    } else if (!cli.json) {
      fprintf(stderr, "nofrag: wrote %s\n", cli.html);
    }
  }
out:
  free(r);
  free(b);
  free(mr);
  free(mb);
  for (size_t k = 0; k < sizeof hs / sizeof *hs; k++) nfc_html_series_free(&hs[k]);
  for (size_t k = 0; k < n_hot; k++) nfc_hotspots_free(&hot[k]);
  nfc_sites_free(&sites);
  nfc_device_close(device);
  nf__trace_ops_free(&ops);
  nf__trace_free(&t);
  return rc;
}

// nofrag convert TRACE OUT.csv: any input format to RMM's CSV log, so that
// RMM's REPLAY_BENCHMARK (--log_file) can replay our traces.
static int cmd_convert(int argc, char **argv) {
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs("usage: nofrag convert TRACE OUT.csv\n"
            "Write TRACE (any format nofrag replay reads: text trace, PyTorch snapshot pickle,\n"
            "RMM CSV log) as an RMM logging_resource_adaptor CSV log, for RMM's REPLAY_BENCHMARK\n"
            "(--log_file). The trace is checked first (alloc/free pairing); OUT must end in .csv.\n",
            stdout);
      return 0;
    }
  }
  if (argc != 2 || argv[0][0] == '-' || argv[1][0] == '-') {
    fprintf(stderr, "nofrag: usage: nofrag convert TRACE OUT.csv\n");
    return 2;
  }
  size_t ol = strlen(argv[1]);
  if (ol < 4 || strcmp(argv[1] + ol - 4, ".csv") != 0) {
    fprintf(stderr, "nofrag: convert: '%s': the output must be a .csv file (RMM's log format)\n", argv[1]);
    return 2;
  }
  char err[512] = "";
  const char *fmt = NULL;
  nf_trace_t t;
  if (nfc_load_trace(argv[0], &t, &fmt, err, sizeof err) != NF_OK) {
    fprintf(stderr, "nofrag: %s\n", err);
    return 2;
  }
  // Check the trace replays (alloc/free pairing, sizes) before writing it.
  nf__trace_ops ops;
  if (nf__trace_ops_build(&ops, &t, err, sizeof err) != NF_OK) {
    fprintf(stderr, "nofrag: %s\n", err);
    nf__trace_free(&t);
    return 2;
  }
  nf__trace_ops_free(&ops);
  FILE *f = fopen(argv[1], "w");
  size_t rows = 0;
  int rc = 0;
  if (!f) { fprintf(stderr, "nofrag: convert: cannot write '%s': %s\n", argv[1], strerror(errno)); rc = 2; }
  else {
    nf_status_t st = nf__trace_write_rmm(&t, f, &rows);
    if (fclose(f) != 0 || st != NF_OK) {
      fprintf(stderr, "nofrag: convert: '%s': write error: %s\n", argv[1], strerror(errno));
      remove(argv[1]);
      rc = 2;
    }
  }
  if (!rc) fprintf(stderr, "nofrag: %s (%s, %zu events) -> %s (%zu rows)\n", argv[0], fmt, t.n_events, argv[1], rows);
  nf__trace_free(&t);
  return rc;
}

int main(int argc, char **argv) {
  // A replay's OOMs are expected (min-capacity probes, what-if limits) and
  // reported by the tool itself: the library's stderr OOM report stays off
  // unless the user asks for it (NOFRAG_QUIET_OOM=0).
  setenv("NOFRAG_QUIET_OOM", "1", 0);
  setenv("NOFRAG_QUIET_SPILL", "1", 0); // the report has a "spilled" line
  if (argc < 2) { // no command: a usage error (help asked for is not one)
    fputs(usage, stderr);
    return 2;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
    fputs(usage, stdout);
    return 0;
  }
  if (strcmp(argv[1], "version") == 0 || strcmp(argv[1], "--version") == 0) {
    if (argc > 2 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
      fputs("usage: nofrag version\nPrint the version of nofrag (NF_VERSION of nofrag.h).\n", stdout);
      return 0;
    }
    if (argc > 2) {
      fprintf(stderr, "nofrag: %s takes no arguments, not '%s' (see nofrag --help)\n", argv[1], argv[2]);
      return 2;
    }
    printf("nofrag %s\n", NF_VERSION);
    return 0;
  }
  if (strcmp(argv[1], "top") == 0) { extern int nfc_top(int, char **); return nfc_top(argc - 2, argv + 2); }
  if (strcmp(argv[1], "doctor") == 0) return nfc_doctor(argc - 2, argv + 2);
  // A replay's pools are simulations (one per bisection probe): they do not
  // belong in `nofrag top` unless the user asks (NOFRAG_MONITOR=1).
  setenv("NOFRAG_MONITOR", "0", 0);
  if (strcmp(argv[1], "replay") == 0) return cmd_replay(argc - 2, argv + 2);
  if (strcmp(argv[1], "convert") == 0) return cmd_convert(argc - 2, argv + 2);
  fprintf(stderr, "nofrag: unknown command '%s' (see nofrag --help)\n", argv[1]);
  return 2;
}
