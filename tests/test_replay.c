// Trace replay through the library: the shared real traces complete with no
// data lost and the exact peak live; a limit under peak live fails with a
// clean OOM; minimum-capacity bisection on a synthetic trace; the pool runs
// on the trace's clock (release_idle_ms); the CLI.
#include "nf_test.h"
#include "replay.h"
#include "trace.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

static int load_ops(const char *path, nf_trace_t *t, nf__trace_ops *o) {
  char err[512] = "";
  if (access(path, R_OK) != 0) return 0;
  if (nf__trace_load(t, path, err, sizeof err) != NF_OK) fail_msg("%s", err);
  if (nf__trace_ops_build(o, t, err, sizeof err) != NF_OK) fail_msg("%s", err);
  return 1;
}

static void shared_path(char *buf, size_t n, const char *file) {
  const char *dir = getenv("NF_SHARED");
  snprintf(buf, n, "%s/traces/%s", dir ? dir : "../shared", file);
}

static void replay_shared(const char *file) {
  char path[1024];
  shared_path(path, sizeof path, file);
  nf_trace_t t;
  nf__trace_ops o;
  if (!load_ops(path, &t, &o)) { print_message("skipping: %s not found\n", path); skip(); }
  nf__replay_opts ro;
  nf__replay_opts_default(&ro);
  ro.verify = 1;
  nf__replay_result *r = malloc(sizeof *r);
  assert_non_null(r);
  nf_status_t st = nf__replay_run(&o, &ro, r);
  if (st != NF_OK) fail_msg("%s: %s", file, r->error);
  assert_int_equal(r->ops_done, o.n_ops);
  assert_int_equal(r->stats.ooms, 0);
  assert_int_equal(r->check, NF_OK);
  assert_true(r->stats.live_peak == o.peak_live);
  assert_true(r->verified == o.n_allocs); // every block: at its free or at the end
  assert_true(r->stats.mapped_peak >= o.peak_live);
  assert_true(r->stats.physical_peak >= r->stats.mapped_peak);
  assert_int_equal(r->stats.allocs, o.n_allocs);
  assert_int_equal(r->stats.frees, o.n_frees);
  print_message("%s: peak live %.3f GiB, mapped %.4f x, physical %.4f x, native %.4f x, %llu backend calls, "
                "%.3f s\n", file, (double)o.peak_live / (double)NF_GiB,
                (double)r->stats.mapped_peak / (double)o.peak_live,
                (double)r->stats.physical_peak / (double)o.peak_live,
                (double)o.native_peak_reserved / (double)o.peak_live,
                (unsigned long long)r->stats.backend_calls, r->seconds);

  // Under peak live the replay cannot complete: a clean OOM, counted.
  ro.verify = 0;
  ro.cfg.limit = o.peak_live / 2;
  st = nf__replay_run(&o, &ro, r);
  assert_int_equal(st, NF_ERR_OOM);
  assert_true(r->stats.ooms >= 1);
  assert_true(r->error[0] != 0);
  assert_non_null(strstr(r->error, "OOM at event"));
  assert_true(r->fail_event >= 1 && r->fail_event <= t.n_events);
  assert_int_equal(t.events[r->fail_event - 1].action, NF_TRACE_ALLOC);
  assert_true(r->ops_done < o.n_ops);
  assert_true(r->stats.physical_peak <= r->limit);
  free(r);
  nf__trace_ops_free(&o);
  nf__trace_free(&t);
}

static void test_replay_gpt2(void **s) { (void)s; replay_shared("gpt2.trace.gz"); }
static void test_replay_vit(void **s) { (void)s; replay_shared("vit.trace.gz"); }
static void test_replay_llama(void **s) { (void)s; replay_shared("llama1b_fsdp.trace.gz"); }

// A synthetic fragmenting trace: small and large blocks interleaved, every
// other one freed, then a large request that only fits by stitching.
static void test_min_capacity_synthetic(void **state) {
  (void)state;
  const uint64_t G = 64 * 1024;
  char *text = malloc(1 << 20);
  uint64_t sizes[64];
  assert_non_null(text);
  size_t off = 0;
  uint64_t seed = nft_env_seed(7);
  for (unsigned round = 0; round < 4; round++) {
    for (unsigned i = 0; i < 64; i++) {
      sizes[i] = G / 2 + nft_rand(&seed) % (2 * G);
      off += (size_t)sprintf(text + off, "alloc %u %llu %d 0\n", (round * 64 + i + 1) * 1000000,
                             (unsigned long long)sizes[i], i % 2 ? 0 : 17);
    }
    for (unsigned i = 0; i < 64; i += 2)
      off += (size_t)sprintf(text + off, "free_completed %u %llu 0 0\n", (round * 64 + i + 1) * 1000000,
                             (unsigned long long)sizes[i]);
  }
  off += (size_t)sprintf(text + off, "alloc 1 %llu 0 0\n", (unsigned long long)(20 * G));
  nf_trace_t t;
  char err[512] = "";
  nf__trace_ops o;
  assert_int_equal(nf__trace_parse_buffer(&t, "syn", text, off, err, sizeof err), NF_OK);
  if (nf__trace_ops_build(&o, &t, err, sizeof err) != NF_OK) fail_msg("%s", err);
  assert_int_equal(o.n_streams, 2);

  nf__replay_opts ro;
  nf__replay_opts_default(&ro);
  ro.granule = G;
  ro.verify = 1;
  nf__replay_bisect b;
  nf_status_t st = nf__replay_min_capacity(&o, &ro, 0, &b, err, sizeof err);
  if (st != NF_OK) fail_msg("%s", err);
  assert_int_equal(b.min_capacity % G, 0);
  assert_true(b.min_capacity >= o.peak_live);
  assert_true(b.min_capacity >= b.lower && b.min_capacity <= b.upper);
  assert_int_equal(b.lower, (o.peak_live + G - 1) / G * G); // ceil(peak live / G) granules (replay.h)
  assert_int_equal(b.at_min.status, NF_OK);
  assert_true(b.at_min.stats.physical_peak <= b.min_capacity);
  // The guarantee in nofrag.h: an alloc of s succeeds when live granules +
  // ceil(s/G) + 1 <= L/G. A live block of s bytes overlaps at most
  // ceil(s/G) + 1 granules, so this limit must always have been enough:
  uint64_t need = 0, cur = 0, *blk = calloc(o.n_slots, sizeof *blk);
  assert_non_null(blk);
  for (size_t k = 0; k < o.n_ops; k++) {
    const nf__trace_op *op = &o.ops[k];
    uint64_t gr = (op->size + G - 1) / G + 1;
    if (op->kind == NF_TRACE_OP_FREE) { cur -= blk[op->slot]; continue; }
    if (cur + gr > need) need = cur + gr;
    blk[op->slot] = gr;
    cur += gr;
  }
  free(blk);
  assert_true(b.min_capacity <= need * G);
  print_message("synthetic: peak live %llu, min capacity %llu (%.3f x), %u probes\n",
                (unsigned long long)o.peak_live, (unsigned long long)b.min_capacity,
                (double)b.min_capacity / (double)o.peak_live, b.probes);
  // One granule less fails (unless that is under the lower bound).
  if (b.min_capacity > b.lower) {
    nf__replay_result *r = malloc(sizeof *r);
    ro.cfg.limit = b.min_capacity - G;
    assert_int_equal(nf__replay_run(&o, &ro, r), NF_ERR_OOM);
    free(r);
  }
  nf__trace_ops_free(&o);
  nf__trace_free(&t);
  free(text);
}


// Replay runs the pool on the trace's clock (release_idle_ms): one large
// step, then short ones whose swing leaves most of it cached. Steps `dt_us`
// apart: 1 ms (200 ms in all) stays under 500 ms of idleness, 10 ms reaches
// it, and a trace without times never does.
static uint64_t replay_unmaps(uint64_t dt_us) {
  const uint64_t G = 64 * 1024;
  char *text = malloc(1 << 20);
  assert_non_null(text);
  size_t off = 0;
  uint64_t t = 1;
  for (int k = 0; k < 200; k++, t += dt_us) {
    int n = k ? 4 : 16;
    for (int i = 0; i < n; i++)
      off += (size_t)sprintf(text + off, "alloc %d %llu 0 %llu\n", (i + 1) << 20, (unsigned long long)(2 * G),
                             (unsigned long long)t);
    for (int i = 0; i < n; i++)
      off += (size_t)sprintf(text + off, "free_completed %d %llu 0 %llu\n", (i + 1) << 20,
                             (unsigned long long)(2 * G), (unsigned long long)t);
  }
  nf_trace_t tr;
  nf__trace_ops o;
  char err[512] = "";
  assert_int_equal(nf__trace_parse_buffer(&tr, "clock", text, off, err, sizeof err), NF_OK);
  if (nf__trace_ops_build(&o, &tr, err, sizeof err) != NF_OK) fail_msg("%s", err);
  nf__replay_opts ro;
  nf__replay_opts_default(&ro);
  ro.granule = G;
  ro.cfg.release_threshold = 4 * G;
  ro.cfg.release_after = 8;
  ro.cfg.release_idle_ms = 500;
  nf__replay_result *r = malloc(sizeof *r);
  assert_non_null(r);
  if (nf__replay_run(&o, &ro, r) != NF_OK) fail_msg("%s", r->error);
  uint64_t unmaps = r->stats.calls.unmap;
  free(r);
  nf__trace_ops_free(&o);
  nf__trace_free(&tr);
  free(text);
  return unmaps;
}

static void test_replay_trace_clock(void **state) {
  (void)state;
  assert_int_equal(replay_unmaps(1000), 0);
  assert_true(replay_unmaps(10000) > 0);
  assert_int_equal(replay_unmaps(0), 0);
}

// `--help` after every subcommand: exit 0, that subcommand's usage on stdout.
static void test_cli_subcommand_help(void **state) {
  (void)state;
  const char *cli = getenv("NF_CLI");
  if (!cli || access(cli, X_OK) != 0) { print_message("skipping: NF_CLI not set\n"); skip(); }
  static const char *const cases[][2] = {
      {"replay --help", "--min-capacity"}, {"convert --help", "usage: nofrag convert"},
      {"top --help", "--dir DIR"},         {"version --help", "usage: nofrag version"},
      {"top -h", "--dir DIR"},             {"convert -h", "OUT.csv"},
  };
  char out[1 << 14];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char cmd[64];
    // stdout only: help is not an error. nft_run_cli appends 2>&1, which after
    // a plain 2>/dev/null put stderr back on the pipe: ';' keeps it on exit.
    snprintf(cmd, sizeof cmd, "%s 2>/dev/null; exit $?", cases[i][0]);
    int rc = nft_run_cli(cmd, out, sizeof out);
    if (rc != 0 || !strstr(out, cases[i][1])) fail_msg("nofrag %s: exit %d, output:\n%s", cases[i][0], rc, out);
  }
  // Usage errors exit 2: no command at all (it printed the help on stdout and
  // exited 0), and arguments to version (ignored: `nofrag version --bogus`
  // printed the version and exited 0).
  static const char *const bad[][2] = {
      {"", "usage: nofrag replay"},
      {"version --bogus", "nofrag: version takes no arguments, not '--bogus'"},
      {"--version extra", "nofrag: --version takes no arguments, not 'extra'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int rc = nft_run_cli(bad[i][0], out, sizeof out);
    if (rc != 2 || !strstr(out, bad[i][1])) fail_msg("nofrag %s: exit %d, output:\n%s", bad[i][0], rc, out);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "%s 2>/dev/null | wc -c", bad[i][0]); // nothing on stdout
    nft_run_cli(cmd, out, sizeof out);
    if (atoi(out) != 0) fail_msg("nofrag %s: %s bytes on stdout", bad[i][0], out);
  }
}

// Write `len` bytes to a new temporary file named by `path` (a mkstemps
// template ending in `suffix`).
static void put_file(char *path, int suffix, const void *data, size_t len) {
  int fd = mkstemps(path, suffix);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, data, len), (ssize_t)len);
  close(fd);
}

// Rewrite (O_TRUNC) or extend (O_APPEND) the existing file `path` with `text`.
static void put_text(const char *path, int how, const char *text) {
  int fd = open(path, O_WRONLY | how);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
}

// Run the CLI with `args`; expect exit `rc` and every non-NULL needle in its output.
static void cli_expect(const char *args, int rc, const char *n1, const char *n2) {
  static char out[1 << 16];
  int got = nft_run_cli(args, out, sizeof out);
  if (got != rc || (n1 && !strstr(out, n1)) || (n2 && !strstr(out, n2)))
    fail_msg("nofrag %s: exit %d (expected %d), output:\n%s\nexpected '%s' and '%s'", args, got, rc, out,
             n1 ? n1 : "", n2 ? n2 : "");
}

// Bad input a new user would try (issue 15): each a clear error, not a
// summary of zeros or a bare errno.
static void test_cli_bad_input(void **state) {
  (void)state;
  const char *cli = getenv("NF_CLI");
  if (!cli || access(cli, X_OK) != 0) { print_message("skipping: NF_CLI not set\n"); skip(); }
  char args[1024];
  // Empty traces: plain, gzip, comments only, an RMM CSV with no rows.
  char empty[] = "/tmp/nf_empty_XXXXXX.trace", gz[] = "/tmp/nf_emptygz_XXXXXX.trace.gz",
       csv[] = "/tmp/nf_emptycsv_XXXXXX.csv", com[] = "/tmp/nf_comment_XXXXXX.trace";
  static const unsigned char gz_empty[] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  put_file(empty, 6, "", 0);
  put_file(gz, 9, gz_empty, sizeof gz_empty);
  put_file(csv, 4, "Thread,Time,Action,Pointer,Size,Stream\n", 39);
  put_file(com, 6, "# nothing here\n", 15);
  const char *files[] = {empty, gz, com};
  for (size_t i = 0; i < 3; i++) {
    snprintf(args, sizeof args, "replay %s", files[i]);
    char want[128];
    snprintf(want, sizeof want, "nofrag: %s: empty trace: no events", files[i]);
    cli_expect(args, 2, want, NULL);
  }
  snprintf(args, sizeof args, "replay %s --min-capacity", csv);
  cli_expect(args, 2, "empty trace: no events", "RMM CSV log with its header but no rows");

  // A limit below one granule: refused up front, named in granules.
  char tiny[] = "/tmp/nf_tiny_XXXXXX.trace";
  const char t3[] = "alloc 4096 1048576 0 1\nalloc 8192 1048576 0 2\nalloc 12288 1048576 0 3\n";
  put_file(tiny, 6, t3, sizeof t3 - 1);
  snprintf(args, sizeof args, "replay %s --limit 1B", tiny);
  cli_expect(args, 2, "nofrag: limit 1 B is below one granule (2.000 MiB)", NULL);
  snprintf(args, sizeof args, "replay %s --conf limit:1KiB --granule 4KiB", tiny);
  cli_expect(args, 2, "nofrag: limit 1024 B is below one granule (4096 B)", NULL);
  // A limit that is not whole granules: the summary says it was rounded.
  snprintf(args, sizeof args, "replay %s --limit 7MiB", tiny);
  cli_expect(args, 0, "limit                 6.000 MiB (6291456 B: rounded down to whole granules from 7340032 B)", NULL);

  // Out of kernel memory mappings (vm.max_map_count; NOFRAG_HOST_MAX_MAPS
  // stands in for it): the cause, the count and the remedy.
  snprintf(args, sizeof args, "replay %s --granule 1MiB 2>&1; NOFRAG_HOST_MAX_MAPS=2 '%s' replay %s --granule 1MiB",
           tiny, cli, tiny);
  cli_expect(args, 1, "out of memory mappings: 2 held (2 granule runs of 1048576 B), NOFRAG_HOST_MAX_MAPS=2",
             "use a larger granule, fewer views (views:N), or a larger NOFRAG_HOST_MAX_MAPS");

  // Keys the replay cannot honour (it builds its own simulated device) are
  // refused by name; NOFRAG_CONF is ignored, and the replay says so.
  snprintf(args, sizeof args, "replay %s --conf backend:cuda", tiny);
  cli_expect(args, 2, "nofrag: --conf 'backend:cuda': backend:cuda has no effect here", "simulated device");
  snprintf(args, sizeof args, "replay %s --conf limit:8MiB,host_capacity:1GiB", tiny);
  cli_expect(args, 2, "host_capacity has no effect here", NULL);
  snprintf(args, sizeof args, "replay %s 2>&1 >/dev/null; NOFRAG_CONF=limit:1MiB '%s' replay %s", tiny, cli, tiny);
  cli_expect(args, 0, "nofrag: note: NOFRAG_CONF='limit:1MiB' is ignored by replay", "--conf");

  // convert: an unwritable output is a "nofrag:" error naming it; a trace
  // without segment events (as an RMM CSV) has no native peak to print.
  snprintf(args, sizeof args, "convert %s /nonexistent-dir/out.csv", tiny);
  cli_expect(args, 2, "nofrag: convert: cannot write '/nonexistent-dir/out.csv': No such file", NULL);
  char conv[] = "/tmp/nf_conv_XXXXXX.csv";
  put_file(conv, 4, "", 0);
  snprintf(args, sizeof args, "convert %s %s && '%s' replay %s", tiny, conv, cli, conv);
  cli_expect(args, 0, "native peak reserved  n/a (the trace has no segment_alloc events", NULL);
  snprintf(args, sizeof args, "replay %s --json", conv);
  cli_expect(args, 0, "\"native_peak_reserved\":null,\"native_peak_ratio\":null", NULL);
  unlink(empty), unlink(gz), unlink(csv), unlink(com), unlink(tiny), unlink(conv);
}

// The bisection's progress bar (forced on) says "probe k of at most n", k
// rising from 1, never past n; it restarted at 0% on every probe before.
static void test_cli_bisect_progress(void **state) {
  (void)state;
  const char *data = getenv("NF_DATA");
  if (!getenv("NF_CLI") || access(getenv("NF_CLI"), X_OK) != 0) { print_message("skipping: no NF_CLI\n"); skip(); }
  static char out[1 << 20];
  char args[1024];
  snprintf(args, sizeof args, "replay '%s/gpt2.trace.gz' --min-capacity", data ? data : "data");
  setenv("NOFRAG_PROGRESS", "1", 1); // stderr is a pipe here: force the bar on
  int rc = nft_run_cli(args, out, sizeof out);
  unsetenv("NOFRAG_PROGRESS");
  assert_int_equal(rc, 0);
  unsigned last_k = 0, seen = 0;
  for (const char *q = out; (q = strstr(q, "bisecting    probe ")); q++) {
    unsigned k = 0, m = 0;
    if (sscanf(q, "bisecting    probe %u of at most %u", &k, &m) != 2) fail_msg("bad line at '%.80s'", q);
    if (k < last_k || k > m || (!seen && k != 1)) fail_msg("probe %u of %u after probe %u", k, m, last_k);
    last_k = k;
    seen++;
  }
  if (seen < 3 || last_k < 5) fail_msg("%u probe lines, last probe %u:\n%.2000s", seen, last_k, out);
}

static void test_cli(void **state) {
  (void)state;
  const char *cli = getenv("NF_CLI"), *data = getenv("NF_DATA");
  if (!cli || access(cli, X_OK) != 0) { print_message("skipping: NF_CLI not set\n"); skip(); }
  size_t n = 1 << 16;
  char *out = malloc(n), args[1024];
  assert_non_null(out);
  assert_int_equal(nft_run_cli("version", out, n), 0);
  assert_non_null(strstr(out, NF_VERSION));
  assert_int_equal(nft_run_cli("--help", out, n), 0);
  assert_non_null(strstr(out, "--min-capacity"));
  assert_int_equal(nft_run_cli("frobnicate", out, n), 2);
  assert_int_equal(nft_run_cli("replay", out, n), 2);
  assert_int_equal(nft_run_cli("replay /nonexistent.trace.gz", out, n), 2);
  assert_non_null(strstr(out, "/nonexistent.trace.gz"));

  char path[64] = "/tmp/nfc_bad_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char bad[] = "# bad\nalloc 4096 512 0 1\nalloc 8192 lots 0 2\n";
  assert_int_equal(write(fd, bad, sizeof bad - 1), (ssize_t)(sizeof bad - 1));
  close(fd);
  snprintf(args, sizeof args, "replay %s --json", path);
  assert_int_equal(nft_run_cli(args, out, n), 2);
  char want[128];
  snprintf(want, sizeof want, "%s:3: SIZE is not", path);
  if (!strstr(out, want)) fail_msg("output '%s' lacks '%s'", out, want);
  snprintf(args, sizeof args, "replay %s --limit 12parsecs", path);
  assert_int_equal(nft_run_cli(args, out, n), 2);
  assert_non_null(strstr(out, "--limit"));
  snprintf(args, sizeof args, "replay %s --bogus", path);
  assert_int_equal(nft_run_cli(args, out, n), 2);
  // A tiny trace that cannot fit its limit: exit 1 with the OOM's line.
  put_text(path, O_TRUNC, "alloc 4096 1048576 0 1\nalloc 8192 4194304 0 2\n");
  snprintf(args, sizeof args, "replay %s --limit 4MiB --granule 1MiB", path);
  assert_int_equal(nft_run_cli(args, out, n), 1);
  snprintf(want, sizeof want, "%s:2: OOM at event 2", path);
  if (!strstr(out, want)) fail_msg("output '%s' lacks '%s'", out, want);
  // Stopped in the first half of the ops (event 2 of 4): no call was made in
  // the second half. It printed every call as "in 2nd half ... (steady state)".
  put_text(path, O_APPEND, "free_completed 4096 1048576 0 3\nalloc 4096 4096 0 4\n");
  snprintf(args, sizeof args, "replay %s --limit 4MiB --granule 1MiB", path);
  assert_int_equal(nft_run_cli(args, out, n), 1);
  if (!strstr(out, "in 2nd half         0 (the replay stopped before the trace's second half)"))
    fail_msg("output '%s'", out);
  snprintf(args, sizeof args, "replay %s --limit 4MiB --granule 1MiB --json", path);
  assert_int_equal(nft_run_cli(args, out, n), 1);
  if (!strstr(out, "\"calls_second_half\":0,")) fail_msg("output '%s'", out);
  snprintf(args, sizeof args, "replay %s --granule 1MiB --min-capacity --json", path);
  assert_int_equal(nft_run_cli(args, out, n), 0);
  // 1 MiB + 4 MiB live: 5 granules at best, 6 by the guarantee.
  const char *mc = strstr(out, "\"min_capacity\":");
  if (!mc) fail_msg("output '%s'", out);
  unsigned long long minc = strtoull(mc + 15, NULL, 10);
  assert_true(minc >= 5 * NF_MiB && minc <= 6 * NF_MiB);
  unlink(path);

  snprintf(args, sizeof args, "replay '%s/gpt2.trace.gz' --json --verify", data ? data : "data");
  int rc = nft_run_cli(args, out, n);
  if (rc != 0) fail_msg("exit %d: %s", rc, out);
  const char *keys[] = {"\"peak_live\":", "\"peak_mapped\":", "\"peak_physical\":", "\"min_capacity\":null",
                        "\"min_capacity_ratio\":null", "\"events\":129673", "\"backend_calls\":", "\"calls\":{",
                        "\"replay_seconds\":", "\"events_per_second\":", "\"native_peak_reserved\":",
                        "\"ooms\":0", "\"trace\":", "\"granule\":2097152", "\"limit\":null", "\"status\":\"ok\""};
  for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
    if (!strstr(out, keys[k])) fail_msg("key %s missing in %s", keys[k], out);
  // Exactly one JSON object on one line.
  assert_true(out[0] == '{');
  char *nl = strchr(out, '\n');
  assert_non_null(nl);
  assert_true(nl[-1] == '}' && nl[1] == 0);
  // What-if spill: the GPT-2 trace under a cap of 0.77 x its live peak
  // completes with spill:host, every block's signature intact.
  snprintf(args, sizeof args, "replay '%s/gpt2.trace.gz' --limit 17.85GiB --conf spill:host --verify",
           data ? data : "data");
  rc = nft_run_cli(args, out, n);
  if (rc != 0 || !strstr(out, "OOMs                  0") || !strstr(out, "none lost") ||
      !strstr(out, "allocations spilled") || strstr(out, "warning"))
    fail_msg("exit %d: %s", rc, out);
  snprintf(args, sizeof args, "replay '%s/gpt2.trace.gz' --limit 17.85GiB", data ? data : "data");
  assert_int_not_equal(nft_run_cli(args, out, n), 0); // the same cap without spill stops at an OOM
  free(out);
}

// The allocator models and the CLI on inputs at the edges (audit): one
// request larger than an expandable segment crashed the expandable model
// (b[-1]); a request near 2^64 wrapped the native model's rounding (peak
// reserved 0 B, exit 0, min capacity 0 B); a model's JSON printed
// "native_peak_reserved":0 for a trace without segment events; and
// --min-capacity with spill:host answered the bisection's lower bound.
static void test_cli_model_edges(void **state) {
  (void)state;
  const char *cli = getenv("NF_CLI");
  if (!cli || access(cli, X_OK) != 0) { print_message("skipping: NF_CLI not set\n"); skip(); }
  char path[64], args[512];
  const char big[] = "alloc 4096 169651208192 0 0\n"; // 158 GiB
  nft_write_tmp(path, sizeof path, "edge", big, sizeof big - 1, 0);
  snprintf(args, sizeof args, "replay %s --allocator expandable", path);
  cli_expect(args, 1, "expandable: out of memory: 169651208192 B requested", NULL);
  unlink(path);

  const char huge[] = "alloc 1 18446744073709551000 0 0\nfree_completed 1 18446744073709551000 0 0\n";
  nft_write_tmp(path, sizeof path, "edge", huge, sizeof huge - 1, 0);
  static char out[1 << 16];
  for (int k = 0; k < 2; k++) {
    snprintf(args, sizeof args, "replay %s --allocator %s --min-capacity", path, k ? "expandable" : "native");
    int rc = nft_run_cli(args, out, sizeof out);
    if (rc != 1 || !strstr(out, "out of memory: 18446744073709551000 B requested") || strstr(out, "min capacity   "))
      fail_msg("%s: exit %d:\n%s", args, rc, out);
  }
  unlink(path);

  const char small[] = "alloc 1 10485760 0 0\nalloc 2 10485760 0 1\nfree_completed 1 10485760 0 2\n";
  nft_write_tmp(path, sizeof path, "edge", small, sizeof small - 1, 0);
  snprintf(args, sizeof args, "replay %s --allocator native --json", path);
  cli_expect(args, 0, "\"native_peak_reserved\":null,\"device_allocs\":", NULL);
  snprintf(args, sizeof args, "replay %s --allocator all --json", path);
  cli_expect(args, 0, "\"allocator\":\"expandable\",", "\"native_peak_reserved\":null,\"device_allocs\":");
  snprintf(args, sizeof args, "replay %s --allocator all --json | grep -c '\"native_peak_reserved\":0'", path);
  cli_expect(args, 1, "0", NULL); // grep: no match

  // spill:host completes under any limit: no minimum capacity to bisect.
  static const char *const spill[] = {"--min-capacity --conf spill:host", "--conf limit:64MiB,spill:host --min-capacity",
                                      "--allocator all --min-capacity --conf spill:host --json"};
  for (size_t i = 0; i < sizeof spill / sizeof *spill; i++) {
    snprintf(args, sizeof args, "replay %s %s", path, spill[i]);
    int rc = nft_run_cli(args, out, sizeof out);
    if (rc != 2 || !strstr(out, "nofrag: --min-capacity with spill:host is meaningless") || strstr(out, "peak"))
      fail_msg("%s: exit %d:\n%s", spill[i], rc, out);
  }
  snprintf(args, sizeof args, "replay %s --conf spill:host --limit 12MiB", path); // spill alone still runs
  cli_expect(args, 0, "allocations spilled", NULL);
  // The library refuses it too.
  nf_trace_t t;
  nf__trace_ops o;
  assert_true(load_ops(path, &t, &o));
  nf__replay_opts ro;
  nf__replay_opts_default(&ro);
  ro.cfg.spill = 1;
  nf__replay_bisect b;
  char err[256] = "";
  assert_int_equal(nf__replay_min_capacity(&o, &ro, 0, &b, err, sizeof err), NF_ERR_INVALID);
  assert_non_null(strstr(err, "spill"));
  assert_int_equal(b.min_capacity, 0);
  nf__trace_ops_free(&o);
  nf__trace_free(&t);
  unlink(path);
}

// The number after "KEY": in a JSON text, or -1 when absent.
static long long json_num(const char *js, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\":", key);
  const char *p = strstr(js, k);
  return p ? strtoll(p + strlen(k), NULL, 10) : -1;
}

// Run `cat FILE | nofrag replay /dev/stdin ARGS` (a pipe: readable once).
static int cli_piped(const char *file, const char *args, char *out, size_t n) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "cat '%s' | '%s' replay /dev/stdin %s 2>&1", file, getenv("NF_CLI"), args);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t got = fread(out, 1, n - 1, p);
  out[got] = 0;
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A trace read from a pipe (/dev/stdin, <(zcat t.gz)): the format probe and
// the call-site pass read the input again, so the bytes the probe took were
// lost and the parser began mid-stream ("unknown action '496048640'", "not
// an RMM log"), or replayed a shorter trace. Text, gzip and RMM CSV inputs
// through a pipe replay as the same file does; errors name the user's path.
static void test_cli_stream_input(void **state) {
  (void)state;
  const char *cli = getenv("NF_CLI");
  if (!cli || access(cli, X_OK) != 0) { print_message("skipping: NF_CLI not set\n"); skip(); }
  size_t cap = 1 << 20, len = 0;
  char *text = malloc(cap);
  assert_non_null(text);
  for (int i = 0; i < 3000; i++) { // a sawtooth, with a call site after some allocs
    len += (size_t)snprintf(text + len, cap - len, "alloc %d %d 0 %d\n", 4096 * (i + 1), 1000 + 37 * (i % 101), i);
    if (i % 10 == 0) len += (size_t)snprintf(text + len, cap - len, "#site\tmodel.py:%d\tforward\n", 10 + i % 3);
    if (i >= 5)
      len += (size_t)snprintf(text + len, cap - len, "free_completed %d %d 0 %d\n", 4096 * (i - 4),
                              1000 + 37 * ((i - 5) % 101), i);
  }
  // The model's peak reserved: a site at the stream's end (found only if the site pass reads it all).
  len += (size_t)snprintf(text + len, cap - len, "alloc 999997440 5000000 0 3000\n#site\tmodel.py:99\tlate\n");
  char plain[64], gz[64], csv[] = "/tmp/nf_stream_XXXXXX.csv", args[1024];
  nft_write_tmp(plain, sizeof plain, "stream", text, len, 0);
  nft_write_tmp(gz, sizeof gz, "streamgz", text, len, 1);
  int fd = mkstemps(csv, 4);
  assert_true(fd >= 0);
  close(fd);
  snprintf(args, sizeof args, "convert %s %s", plain, csv);
  static char want[1 << 16], got[1 << 16];
  assert_int_equal(nft_run_cli(args, want, sizeof want), 0);
  const char *files[] = {plain, gz, csv};
  for (size_t i = 0; i < 3; i++) {
    snprintf(args, sizeof args, "replay %s --json", files[i]);
    assert_int_equal(nft_run_cli(args, want, sizeof want), 0);
    int rc = cli_piped(files[i], "--json", got, sizeof got);
    if (rc != 0 || json_num(got, "events") != json_num(want, "events") ||
        json_num(got, "peak_live") != json_num(want, "peak_live") || json_num(want, "events") != 5996)
      fail_msg("%s through a pipe: exit %d:\n%s\nthe file:\n%s", files[i], rc, got, want);
    if (!strstr(got, "\"trace\":\"/dev/stdin\"")) fail_msg("trace not named /dev/stdin: %s", got);
  }
  // The second pass (call sites) sees the whole input too.
  int rc = cli_piped(gz, "--allocator native --hotspots --json", got, sizeof got);
  if (rc != 0 || !strstr(got, "\"model.py:99 (late)\":")) fail_msg("--hotspots through a pipe: exit %d:\n%s", rc, got);
  // Errors name the user's input and the right line, not a temporary file.
  char bad[64];
  const char badt[] = "alloc 4096 512 0 1\nalloc 8192 lots 0 2\n";
  nft_write_tmp(bad, sizeof bad, "streambad", badt, sizeof badt - 1, 0);
  rc = cli_piped(bad, "", got, sizeof got);
  if (rc != 2 || !strstr(got, "nofrag: /dev/stdin:2: SIZE is not") || strstr(got, "nofrag-input"))
    fail_msg("bad trace through a pipe: exit %d:\n%s", rc, got);
  unlink(plain), unlink(gz), unlink(csv), unlink(bad);
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_min_capacity_synthetic),
      cmocka_unit_test(test_replay_gpt2),
      cmocka_unit_test(test_replay_vit),
      cmocka_unit_test(test_replay_llama),
      cmocka_unit_test(test_replay_trace_clock),
      cmocka_unit_test(test_cli_subcommand_help),
      cmocka_unit_test(test_cli), cmocka_unit_test(test_cli_bad_input),
      cmocka_unit_test(test_cli_bisect_progress),
      cmocka_unit_test(test_cli_model_edges),
      cmocka_unit_test(test_cli_stream_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
