// `nofrag replay --html`: the replay's sampling hook (no effect on the
// result; called every N ops and after the last), and the page, rendered in
// headless Chromium when it is installed (skipped otherwise): the script
// must have drawn every chart with the peak marked. The progress bar stays
// off when stderr is not a terminal. Hotspots on the shared PyTorch snapshot:
// every unused byte at the peak attributed to a FILE:LINE site.
#include "nf_test.h"
#include "replay.h"
#include "trace.h"

#include <sys/wait.h>
#include <unistd.h>

typedef struct samples_s { size_t n, last_op; uint64_t max_physical; } samples_t;

static void on_sample(void *ctx, size_t op, const nf_stats_t *s) {
  samples_t *c = ctx;
  assert_true(op > c->last_op);
  c->n++;
  c->last_op = op;
  if (s->physical > c->max_physical) c->max_physical = s->physical;
}

// A trace with a sawtooth of live memory and PyTorch segment events.
static char *synthetic(size_t *len) {
  size_t cap = 1 << 20, n = 0;
  char *buf = malloc(cap);
  assert_non_null(buf);
  n += (size_t)snprintf(buf + n, cap - n, "segment_alloc 1 1073741824 0 0\n");
  for (int step = 0; step < 5; step++)
    for (int k = 0; k < 40; k++) {
      unsigned long long a = 4096ull * (unsigned long long)(k + 1), sz = (1ull << 20) * (unsigned long long)(k % 7 + 1);
      n += (size_t)snprintf(buf + n, cap - n, "alloc %llu %llu %d 1\n", a, sz, k % 2);
      if (k >= 3) {
        unsigned long long b = 4096ull * (unsigned long long)(k - 2), bs = (1ull << 20) * (unsigned long long)((k - 3) % 7 + 1);
        n += (size_t)snprintf(buf + n, cap - n, "free_completed %llu %llu 0 2\n", b, bs);
      }
      if (k == 39)
        for (int j = 37; j <= 39; j++)
          n += (size_t)snprintf(buf + n, cap - n, "free_completed %llu %llu 0 3\n", 4096ull * (unsigned long long)(j + 1),
                                (1ull << 20) * (unsigned long long)(j % 7 + 1));
    }
  *len = n;
  return buf;
}

static void test_sample_hook(void **state) {
  (void)state;
  size_t len;
  char *text = synthetic(&len), err[256] = "";
  nf_trace_t t;
  nf__trace_ops o;
  if (nf__trace_parse_buffer(&t, "syn", text, len, err, sizeof err) != NF_OK) fail_msg("%s", err);
  if (nf__trace_ops_build(&o, &t, err, sizeof err) != NF_OK) fail_msg("%s", err);
  nf__replay_opts ro;
  nf__replay_opts_default(&ro);
  nf__replay_result *a = malloc(sizeof *a), *b = malloc(sizeof *b);
  assert_non_null(a);
  assert_non_null(b);
  assert_int_equal(nf__replay_run(&o, &ro, a), NF_OK);
  samples_t c = {0};
  ro.sample = on_sample;
  ro.sample_ctx = &c;
  ro.sample_every = 7;
  assert_int_equal(nf__replay_run(&o, &ro, b), NF_OK);
  assert_int_equal(c.n, (o.n_ops + 6) / 7); // every 7th op, and the last
  assert_int_equal(c.last_op, o.n_ops);
  assert_true(c.max_physical <= b->stats.physical_peak);
  assert_true(a->stats.physical_peak == b->stats.physical_peak);
  assert_true(a->stats.backend_calls == b->stats.backend_calls);
  assert_int_equal(a->ops_done, b->ops_done);
  free(a);
  free(b);
  nf__trace_ops_free(&o);
  nf__trace_free(&t);
  free(text);
}

static size_t count(const char *hay, const char *needle) {
  size_t n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

static char *slurp(const char *cmd) {
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t cap = 1 << 22, n = 0, got;
  char *buf = malloc(cap + 1);
  assert_non_null(buf);
  while (n < cap && (got = fread(buf + n, 1, cap - n, p)) > 0) n += got;
  buf[n] = 0;
  pclose(p);
  return buf;
}

// The CLI under test (NF_CLI, set by ctest), or skip the test.
static const char *need_cli(void) {
  const char *cli = getenv("NF_CLI");
  if (!cli || access(cli, X_OK) != 0) { print_message("skipping: NF_CLI not set\n"); skip(); }
  return cli;
}

// Remove a test's temporary directory.
static void rm_tree(const char *dir) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

// The number after `"key":` in s, or fail.
static uint64_t num_after(const char *s, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\":", key);
  const char *p = strstr(s, k);
  if (!p) fail_msg("no %s in %.300s", key, s);
  return strtoull(p + strlen(k), NULL, 10);
}

// The largest number of the array after `"key":[` in s, or fail.
static uint64_t arr_max(const char *s, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\":[", key);
  const char *p = strstr(s, k);
  if (!p) fail_msg("no %s array in %.300s", key, s);
  p += strlen(k);
  uint64_t m = 0;
  while (*p && *p != ']') {
    char *e;
    uint64_t v = strtoull(p, &e, 10);
    if (e == p) fail_msg("bad %s array near %.40s", key, p);
    if (v > m) m = v;
    p = *e == ',' ? e + 1 : e;
  }
  return m;
}

// A timeline point is its interval's maximum. A trace of 12,000 ops (about
// 2000 points: one every 7 ops) whose one 1 GiB block lives for a single op
// between two points: every series' live line must still reach the peak
// live the table states, and each reserved line its series' peak (before,
// the points were the values at the sampled ops, and the live lines missed
// the peak).
static void test_html_timeline_peaks(void **state) {
  (void)state;
  const char *cli = need_cli();
  char dir[] = "/tmp/nf-peaks-XXXXXX", path[256], cmd[1024];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/spike.trace", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  // The recorded segments are what the native model makes: one small
  // segment, then the 1 GiB block's own, made for op 6000.
  fprintf(f, "segment_alloc 1 2097152 0 0\n");
  for (int j = 0; j < 6000; j++) { // op 2j allocates, op 2j+1 frees; sampled after ops 7, 14, ...
    unsigned long long sz = j == 3000 ? 1ull << 30 : 4096; // op 6000 (after it: 6001 ops done, not a multiple of 7)
    if (j == 3000) fprintf(f, "segment_alloc %d %llu 0 %d\n", 1 << 30, sz, 2 * j);
    fprintf(f, "alloc %d %llu 0 %d\nfree_completed %d %llu 0 %d\n", 4096 * (j % 8 + 1), sz, 2 * j, 4096 * (j % 8 + 1), sz,
            2 * j + 1);
  }
  fclose(f);
  snprintf(cmd, sizeof cmd, "env -u NOFRAG_PROGRESS '%s' replay %s --allocator all --html %s/r.html >/dev/null 2>&1", cli,
           path, dir);
  assert_int_equal(system(cmd), 0);
  snprintf(cmd, sizeof cmd, "cat %s/r.html", dir);
  char *page = slurp(cmd);
  uint64_t trace_live = num_after(page, "trace_peak_live");
  assert_true(trace_live >= 1ull << 30);
  int n = 0;
  for (const char *sr = strstr(page, "\"series\":["); sr && (sr = strstr(sr + 1, "{\"name\":\"")) != NULL; n++) {
    uint64_t peak_res = num_after(sr, "peak_reserved"), live = arr_max(sr, "live"), res = arr_max(sr, "reserved");
    if (live != trace_live) fail_msg("series %d: live line max %llu, peak live %llu", n, (unsigned long long)live,
                                     (unsigned long long)trace_live);
    if (res != peak_res) fail_msg("series %d: reserved line max %llu, its peak %llu", n, (unsigned long long)res,
                                  (unsigned long long)peak_res);
  }
  assert_int_equal(n, 4); // nofrag, the two models, the recorded segments
  // "at call N" counts the ops done, the one that reached the peak included,
  // in every chart: the recorded segments' peak is the native model's (the
  // recorded one said 6000, the segment event coming before its op).
  const char *rec = strstr(page, "{\"name\":\"PyTorch native, recorded in the trace\""),
             *nat = strstr(page, "{\"name\":\"native (model");
  assert_non_null(rec);
  assert_non_null(nat);
  assert_int_equal(num_after(nat, "peak_x"), 6001);
  assert_int_equal(num_after(rec, "peak_x"), 6001);
  free(page);
  rm_tree(dir);
}

// A trace whose file name is not UTF-8 (bytes of another encoding): --json
// writes U+FFFD for the stray bytes and keeps well-formed sequences, so that
// strict readers (Python's json) take the output. It used to pass 0xFF
// through.
static void test_json_invalid_utf8(void **state) {
  (void)state;
  const char *cli = need_cli();
  char dir[] = "/tmp/nf-utf8-XXXXXX", path[256], cmd[1024];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/bad\xff\xc3\xa9\xed\xa0\x80.trace", dir); // stray byte, e-acute, a surrogate
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("alloc 4096 1048576 0 0\nfree_completed 4096 1048576 0 1\n", f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "'%s' replay '%s' --json 2>/dev/null", cli, path);
  char *out = slurp(cmd);
  const char *t = strstr(out, "\"trace\":");
  if (!t) fail_msg("no trace field in %.300s", out);
  assert_non_null(strstr(t, "bad\\ufffd\xc3\xa9\\ufffd\\ufffd\\ufffd.trace\""));
  assert_null(strchr(out, 0xff));
  assert_null(strstr(out, "\xed\xa0"));
  free(out);
  rm_tree(dir);
}

static void test_html_page(void **state) {
  (void)state;
  const char *cli = need_cli();
  char dir[] = "/tmp/nf-report-XXXXXX", path[256], cmd[2048];
  assert_non_null(mkdtemp(dir));
  size_t len;
  char *text = synthetic(&len);
  snprintf(path, sizeof path, "%s/syn.trace", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, len, f), len);
  fclose(f);
  free(text);
  // stderr to a file: not a terminal, so no progress bar (NOFRAG_PROGRESS would force it).
  snprintf(cmd, sizeof cmd, "env -u NOFRAG_PROGRESS '%s' replay %s --allocator all --html %s/r.html >/dev/null 2>%s/err",
           cli, path, dir, dir);
  assert_int_equal(system(cmd), 0);
  snprintf(cmd, sizeof cmd, "cat %s/err", dir);
  char *errtext = slurp(cmd);
  assert_null(strchr(errtext, '\r'));
  assert_null(strchr(errtext, '\033'));
  assert_null(strchr(errtext, '%'));
  assert_null(strchr(errtext, '#'));
  free(errtext);
  snprintf(cmd, sizeof cmd, "cat %s/r.html", dir);
  char *page = slurp(cmd);
  // Self-contained: nothing is fetched (the SVG namespace is a name, not a URL fetched).
  assert_int_equal(count(page, "src="), 0);
  assert_int_equal(count(page, "href="), 0);
  assert_int_equal(count(page, "http://"), 1);
  assert_int_equal(count(page, "https:"), 0);
  assert_non_null(strstr(page, "\"name\":\"nofrag (replayed)\""));
  assert_non_null(strstr(page, "\"name\":\"PyTorch native, recorded in the trace\""));
  assert_non_null(strstr(page, "\"name\":\"native (model of PyTorch's caching allocator)\""));
  assert_non_null(strstr(page, "\"name\":\"expandable (model, expandable_segments:True)\""));
  assert_non_null(strstr(page, "\"hot\":[]")); // a text trace without '#site' lines: no hotspots
  free(page);

  if (system("command -v chromium >/dev/null 2>&1") != 0) {
    print_message("skipping the rendering check: chromium not installed (apt-get install chromium)\n");
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    skip();
  }
  snprintf(cmd, sizeof cmd, "HOME=%s timeout 120 chromium --headless --no-sandbox --disable-gpu "
           "--disable-background-networking --user-data-dir=%s/chromium --dump-dom file://%s/r.html 2>/dev/null",
           dir, dir, dir);
  char *dom = slurp(cmd);
  // nofrag, the native and expandable models, PyTorch's recorded segments.
  if (!strstr(dom, "data-drawn=\"4\"")) fail_msg("chart not drawn; DOM: %.2000s", dom);
  assert_int_equal(count(dom, "<polyline"), 8); // live + reserved, four charts
  assert_int_equal(count(dom, "class=\"peak-label\""), 4);
  assert_non_null(strstr(dom, "peak reserved 1.000 GiB")); // the recorded segment
  assert_non_null(strstr(dom, "<td>nofrag</td>"));
  assert_non_null(strstr(dom, "<td>expandable</td>"));
  // One y-scale for all four charts (each had its own before).
  const char *y0 = strstr(dom, "data-ymax=\""), *y = y0;
  if (!y0) fail_msg("no data-ymax in the DOM");
  int n_y = 0;
  for (; y; y = strstr(y + 1, "data-ymax=\"")) {
    n_y++;
    if (strncmp(y, y0, strcspn(y0 + 11, "\"") + 12) != 0) fail_msg("y-scales differ: %.40s vs %.40s", y0, y);
  }
  assert_int_equal(n_y, 4);
  free(dom);
  rm_tree(dir);
}


static void test_hotspots_pickle(void **state) {
  (void)state;
  const char *cli = getenv("NF_CLI"), *shared = getenv("NF_SHARED");
  char snap[1024], cmd[4096], dir[] = "/tmp/nf-hot-XXXXXX";
  snprintf(snap, sizeof snap, "%s/traces/gpt2_small_snapshot.pickle.gz", shared ? shared : "../shared");
  if (!cli || access(cli, X_OK) != 0) { print_message("skipping: NF_CLI not set\n"); skip(); }
  if (access(snap, R_OK) != 0) { print_message("skipping: %s not found\n", snap); skip(); }
  if (system("command -v python3 >/dev/null 2>&1") != 0) { print_message("skipping: no python3\n"); skip(); }
  const char *data = getenv("NF_DATA"); // the checkout's data/: python/ is next to it
  if (data && !getenv("NOFRAG_PYTHON_DIR")) { // a build directory outside the checkout
    snprintf(cmd, sizeof cmd, "%s/../python", data);
    setenv("NOFRAG_PYTHON_DIR", cmd, 1);
  }
  assert_non_null(mkdtemp(dir));
  snprintf(cmd, sizeof cmd, "'%s' replay '%s' --allocator all --hotspots --json --html %s/h.html 2>/dev/null", cli,
           snap, dir);
  char *js = slurp(cmd);
  for (int k = 0; k < 2; k++) {
    const char *name = k ? "\"expandable\":{\"allocator\"" : "\"native\":{\"allocator\"";
    const char *m = strstr(js, name);
    if (!m) fail_msg("no %s in %.500s", name, js);
    uint64_t peak = num_after(m, "peak_reserved");
    const char *h = strstr(m, "\"hotspots\":{");
    assert_non_null(h);
    uint64_t reserved = num_after(h, "reserved"), live = num_after(h, "live"), unused = num_after(h, "unused");
    assert_true(reserved == peak); // inspected at the peak
    assert_true(unused == reserved - live);
    assert_true(unused > 0);
    assert_true(num_after(h, "attributed") == unused);
    // Sum "all" ourselves: every site a FILE:LINE string, exactly `unused` in all.
    const char *p = strstr(h, "\"all\":{");
    assert_non_null(p);
    p += 7;
    uint64_t sum = 0;
    size_t sites = 0;
    while (*p == '"' || *p == ',') {
      if (*p == ',') p++;
      const char *key = ++p;
      while (*p && *p != '"') p += p[0] == '\\' ? 2 : 1;
      const char *end = p; // "FILE:LINE (FUNCTION)", or "FILE:LINE" for a site without a function
      if (end[-1] == ')')
        for (const char *q = key; q + 1 < p; q++)
          if (q[0] == ' ' && q[1] == '(') { end = q; break; }
      const char *colon = key;
      for (const char *q = key; q < end; q++) if (*q == ':') colon = q;
      assert_true(colon > key && colon + 1 < end); // FILE:LINE
      for (const char *q = colon + 1; q < end; q++) assert_true(*q >= '0' && *q <= '9');
      assert_int_equal(p[1], ':');
      sum += strtoull(p + 2, (char **)&p, 10);
      sites++;
    }
    assert_int_equal(*p, '}');
    assert_true(sites > 1);
    assert_true(sum == unused);
    print_message("%s: %llu B unused at peak over %zu sites\n", k ? "expandable" : "native",
                  (unsigned long long)unused, sites);
  }
  assert_non_null(strstr(js, "\"site\":\"transformers/")); // a site outside torch
  free(js);
  // Text: the top sites under a "hotspots" line per model.
  snprintf(cmd, sizeof cmd, "'%s' replay '%s' --allocator native --hotspots 2>/dev/null", cli, snap);
  char *txt = slurp(cmd);
  assert_non_null(strstr(txt, "hotspots              "));
  assert_non_null(strstr(txt, "loss_utils.py:40"));
  free(txt);
  if (system("command -v chromium >/dev/null 2>&1") == 0) { // the page's two hotspot tables
    snprintf(cmd, sizeof cmd, "HOME=%s timeout 120 chromium --headless --no-sandbox --disable-gpu "
             "--disable-background-networking --user-data-dir=%s/chromium --dump-dom file://%s/h.html 2>/dev/null",
             dir, dir, dir);
    char *dom = slurp(cmd);
    if (!strstr(dom, "data-drawn=\"4\"")) fail_msg("charts not drawn; DOM: %.2000s", dom);
    assert_int_equal(count(dom, "class=\"hotspots\""), 2);
    assert_non_null(strstr(dom, "<td>transformers/"));
    free(dom);
  }
  rm_tree(dir);
}

// A run stopped early (OOM under --limit) has a smaller peak live than the
// trace: every ratio, in the text summary and table, --json and --html, is
// over the trace's peak live (40 MiB here), and says so. The nofrag JSON and
// summary divided by the run's partial peak (20 MiB: 1.2 for 0.6), the HTML
// rows too.
static void test_ratio_denominator(void **state) {
  (void)state;
  const char *cli = need_cli();
  const char t[] = "alloc 1 10485760 0 0\nalloc 2 10485760 0 1\nalloc 3 20971520 0 2\n"
                   "free_completed 1 10485760 0 3\nfree_completed 2 10485760 0 4\nfree_completed 3 20971520 0 5\n";
  char path[64], cmd[2048], dir[] = "/tmp/nf-ratio-XXXXXX";
  nft_write_tmp(path, sizeof path, "ratio", t, sizeof t - 1, 0);
  assert_non_null(mkdtemp(dir));
  snprintf(cmd, sizeof cmd, "'%s' replay %s --allocator all --limit 24MiB --min-capacity --json --html %s/r.html "
           "2>/dev/null", cli, path, dir);
  char *js = slurp(cmd);
  assert_int_equal(num_after(js, "trace_peak_live"), 41943040);
  assert_int_equal(num_after(js, "peak_live"), 20971520); // the nofrag run's own, partial
  assert_non_null(strstr(js, "\"peak_physical_ratio\":0.600000")); // 24 MiB / 40 MiB
  assert_non_null(strstr(js, "\"peak_mapped_ratio\":0.500000"));
  assert_non_null(strstr(js, "\"peak_reserved_ratio\":0.500000")); // the models: 20 MiB / 40 MiB
  free(js);
  snprintf(cmd, sizeof cmd, "'%s' replay %s --allocator all --limit 24MiB --min-capacity 2>/dev/null", cli, path);
  char *txt = slurp(cmd);
  assert_non_null(strstr(txt, "peak physical         25165824 B (24.000 MiB, 0.6000 x live)"));
  assert_non_null(strstr(txt, "of the calls done; the trace's 41943040 B is the ratios' denominator"));
  assert_non_null(strstr(txt, "nofrag            20971520       25165824    0.6000       41943040    1.0000"));
  assert_non_null(strstr(txt, "(ratios: / the trace's peak live 41943040, a run that stopped shows the peak live"));
  free(txt);
  snprintf(cmd, sizeof cmd, "cat %s/r.html", dir);
  char *page = slurp(cmd);
  assert_non_null(strstr(page, "\"trace_peak_live\":41943040,\"rows\":"));
  assert_non_null(strstr(page, "(r.peak_reserved/TL)"));
  assert_null(strstr(page, "/r.peak_live"));
  free(page);
  if (system("command -v chromium >/dev/null 2>&1") == 0) {
    snprintf(cmd, sizeof cmd, "HOME=%s timeout 120 chromium --headless --no-sandbox --disable-gpu "
             "--disable-background-networking --user-data-dir=%s/chromium --dump-dom file://%s/r.html 2>/dev/null",
             dir, dir, dir);
    char *dom = slurp(cmd);
    // nofrag's row: reserved / trace peak live 0.6000, min capacity / trace peak live 1.0000.
    if (!strstr(dom, "<td>nofrag</td><td>0.020 GiB</td><td>0.023 GiB</td><td>0.6000</td><td>1.0000</td>"))
      fail_msg("nofrag row: %.3000s", dom);
    assert_non_null(strstr(dom, "reserved / trace peak live"));
    assert_non_null(strstr(dom, "Ratios are over the trace's peak live, 0.039 GiB (41943040 B)."));
    free(dom);
  }
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, path);
  assert_int_equal(system(cmd), 0);
}

// Two functions on one source line (a comprehension inside forward) are two
// sites: "all" had the key "model.py:10" twice, so a JSON parser kept one
// and the sum of "all" fell short of "unused".
static void test_hotspots_same_line(void **state) {
  (void)state;
  const char *cli = need_cli();
  const char t[] = "alloc 4 100 0 0\n" // no stack: "<no stack>:0", no function
                   "alloc 1 1000 0 0\n#site\tmodel.py:10\tforward\n"
                   "alloc 2 3000 0 1\n#site\tmodel.py:10\t<listcomp>\n"
                   "alloc 3 5000000 0 2\n#site\tmodel.py:20\tforward\n";
  char path[64], cmd[1024];
  nft_write_tmp(path, sizeof path, "sites", t, sizeof t - 1, 0);
  snprintf(cmd, sizeof cmd, "'%s' replay %s --allocator native --hotspots --json 2>/dev/null", cli, path);
  char *js = slurp(cmd);
  const char *all = strstr(js, "\"all\":{");
  if (!all) fail_msg("no \"all\" in %s", js);
  assert_non_null(strstr(all, "\"model.py:10 (forward)\":"));
  assert_non_null(strstr(all, "\"model.py:10 (\\u003clistcomp\\u003e)\":"));
  assert_non_null(strstr(all, "\"model.py:20 (forward)\":"));
  assert_null(strstr(all, "\"model.py:10\":"));
  assert_non_null(strstr(all, "\"\\u003cno stack\\u003e:0\":"));
  // Unique keys summing to "unused".
  uint64_t sum = 0;
  size_t n = 0;
  const char *keys[8];
  size_t lens[8];
  for (const char *p = all + 7; *p == '"';) {
    const char *k = ++p;
    while (*p != '"') p++;
    for (size_t i = 0; i < n; i++)
      if (lens[i] == (size_t)(p - k) && memcmp(keys[i], k, lens[i]) == 0) fail_msg("duplicate key %.*s", (int)lens[i], k);
    assert_true(n < 8);
    keys[n] = k;
    lens[n++] = (size_t)(p - k);
    sum += strtoull(p + 2, (char **)&p, 10);
    if (*p == ',') p++;
  }
  assert_int_equal(n, 4);
  assert_int_equal(sum, num_after(js, "unused"));
  free(js);
  unlink(path);
}

// '#site' names come from the trace: in the text output a terminal escape
// sequence in them (a title change, colours, a clear screen) reached the
// terminal raw; control bytes now print as '?' (UTF-8 stays).
static void test_hotspots_text_sanitised(void **state) {
  (void)state;
  const char *cli = need_cli();
  const char t[] = "alloc 1 1000 0 0\n#site\t\033]0;pwned\007m\303\251del.py:10\t\033[2J\033[31mfwd\177\n";
  char path[64], cmd[1024];
  nft_write_tmp(path, sizeof path, "esc", t, sizeof t - 1, 0);
  snprintf(cmd, sizeof cmd, "'%s' replay %s --allocator native --hotspots 2>/dev/null", cli, path);
  char *txt = slurp(cmd);
  if (strchr(txt, '\033') || strchr(txt, '\007') || strchr(txt, '\177') ||
      !strstr(txt, "100.0%  ?]0;pwned?m\303\251del.py:10  ?[2J?[31mfwd?\n"))
    fail_msg("text hotspots:\n%s", txt);
  free(txt);
  unlink(path);
}

// An unwritable --html path was found only when the page was written, after
// the whole replay and bisection (and after printing the summary): it is
// now refused up front, exit 2, nothing printed on stdout and no file left.
static void test_html_unwritable(void **state) {
  (void)state;
  const char *cli = need_cli();
  const char t[] = "alloc 4096 1048576 0 1\nalloc 8192 1048576 0 2\n";
  char path[64], cmd[1024], dir[] = "/tmp/nf-html-XXXXXX";
  nft_write_tmp(path, sizeof path, "html", t, sizeof t - 1, 0);
  assert_non_null(mkdtemp(dir));
  const char *bad[] = {"/nonexistent-dir/r.html", dir}; // no such directory; a directory
  for (size_t i = 0; i < 2; i++) {
    snprintf(cmd, sizeof cmd, "'%s' replay %s --min-capacity --html %s 2>&1; echo rc=$?", cli, path, bad[i]);
    char *out = slurp(cmd);
    char want[256];
    snprintf(want, sizeof want, "nofrag: --html %s: cannot write: ", bad[i]);
    if (!strstr(out, want) || !strstr(out, "rc=2") || strstr(out, "peak") || strstr(out, "bisecting"))
      fail_msg("--html %s:\n%s", bad[i], out);
    free(out);
  }
  // A writable path: the check leaves no file behind when the replay fails
  // before writing (an unreadable trace), and the page is written otherwise.
  snprintf(cmd, sizeof cmd, "'%s' replay /nonexistent.trace --html %s/r.html 2>/dev/null; test ! -e %s/r.html", cli,
           dir, dir);
  assert_int_equal(system(cmd), 0);
  snprintf(cmd, sizeof cmd, "'%s' replay %s --html %s/r.html >/dev/null 2>&1 && test -s %s/r.html", cli, path, dir,
           dir);
  assert_int_equal(system(cmd), 0);
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, path);
  assert_int_equal(system(cmd), 0);
}

// A malformed trace whose segment_free names another size than its
// segment_alloc: the table and --json trust the recorded size (20 MiB
// peak), and so must the chart of recorded segments (it subtracted 2 MiB
// and peaked at 38 MiB).
static void test_html_segment_sizes(void **state) {
  (void)state;
  const char *cli = need_cli();
  const char t[] = "segment_alloc 1000 20971520 0 0\nalloc 1000 10485760 0 0\nfree_completed 1000 10485760 0 0\n"
                   "segment_free 1000 2097152 0 0\nsegment_alloc 5000 20971520 0 0\nalloc 5000 10485760 0 0\n"
                   "free_completed 5000 10485760 0 0\nsegment_alloc 9000 4194304 0 0\n"; // the last after every op
  char path[64], cmd[1024], dir[] = "/tmp/nf-seg-XXXXXX";
  nft_write_tmp(path, sizeof path, "seg", t, sizeof t - 1, 0);
  assert_non_null(mkdtemp(dir));
  snprintf(cmd, sizeof cmd, "'%s' replay %s --json --html %s/s.html 2>/dev/null", cli, path, dir);
  char *js = slurp(cmd);
  assert_int_equal(num_after(js, "native_peak_reserved"), 25165824);
  free(js);
  snprintf(cmd, sizeof cmd, "cat %s/s.html", dir);
  char *page = slurp(cmd);
  const char *rec = strstr(page, "{\"name\":\"PyTorch native, recorded in the trace\"");
  if (!rec) fail_msg("no recorded series: %.2000s", page);
  assert_int_equal(num_after(rec, "peak_reserved"), 25165824);
  assert_int_equal(arr_max(rec, "reserved"), 25165824); // the polyline reaches the marked peak
  // The summary row of the recorded segments agrees.
  const char *row = strstr(page, "{\"name\":\"PyTorch native (recorded)\"");
  assert_non_null(row);
  assert_int_equal(num_after(row, "peak_reserved"), 25165824);
  free(page);
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, path);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sample_hook),
      cmocka_unit_test(test_html_page), cmocka_unit_test(test_html_timeline_peaks), cmocka_unit_test(test_json_invalid_utf8),
      cmocka_unit_test(test_hotspots_pickle),
      cmocka_unit_test(test_ratio_denominator),
      cmocka_unit_test(test_hotspots_same_line),
      cmocka_unit_test(test_hotspots_text_sanitised),
      cmocka_unit_test(test_html_unwritable),
      cmocka_unit_test(test_html_segment_sizes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
