// Trace reader: good traces (plain, gzip, in memory), every malformed-line
// kind with its FILE:LINE message, replay-op preprocessing, and the shared
// real traces with the event counts their README gives.
#include "nf_test.h"
#include "trace.h"

#include <unistd.h>
#include <zlib.h>


static const char good[] =
    "# header comment\n"
    "segment_alloc 1000 4096 0 1\n"
    "alloc 1000 100 0 2\n"
    "\n"
    "  alloc\t2000   200 7 3\r\n"
    "   # indented comment\n"
    "free_requested 1000 100 0 4\n"
    "free_completed 1000 100 0 5\n"
    "alloc 1000 50 0 6\n"            // address reused after free_completed
    "free_completed 2000 200 7 7\n"
    "segment_free 1000 4096 0 8\n"
    "alloc 3000 18446744073709551615 0 9"; // no final newline; max u64

static void check_good(const nf_trace_t *t) {
  assert_int_equal(t->n_events, 9);
  assert_int_equal(t->counts[NF_TRACE_ALLOC], 4);
  assert_int_equal(t->counts[NF_TRACE_FREE_REQUESTED], 1);
  assert_int_equal(t->counts[NF_TRACE_FREE_COMPLETED], 2);
  assert_int_equal(t->counts[NF_TRACE_SEGMENT_ALLOC], 1);
  assert_int_equal(t->counts[NF_TRACE_SEGMENT_FREE], 1);
  assert_int_equal(t->events[0].action, NF_TRACE_SEGMENT_ALLOC);
  assert_int_equal(t->events[0].line, 2);
  assert_int_equal(t->events[2].addr, 2000);
  assert_int_equal(t->events[2].size, 200);
  assert_int_equal(t->events[2].stream, 7);
  assert_int_equal(t->events[2].time_us, 3);
  assert_int_equal(t->events[2].line, 5);
  assert_true(t->events[8].size == UINT64_MAX);
  assert_int_equal(t->events[8].line, 12);
}

static void test_good_plain_gz_buffer(void **state) {
  (void)state;
  char path[64], err[256] = "";
  for (int gz = 0; gz < 2; gz++) {
    nft_write_tmp(path, sizeof path, "trace_test", good, strlen(good), gz);
    nf_trace_t t;
    assert_int_equal(nf__trace_load(&t, path, err, sizeof err), NF_OK);
    check_good(&t);
    assert_string_equal(t.name, path);
    nf__trace_free(&t);
    nf__trace_free(&t); // idempotent
    unlink(path);
  }
  nf_trace_t t;
  assert_int_equal(nf__trace_parse_buffer(&t, "mem", good, strlen(good), err, sizeof err), NF_OK);
  check_good(&t);
  nf__trace_free(&t);
  // Empty inputs are valid, empty traces.
  assert_int_equal(nf__trace_parse_buffer(&t, "mem", "", 0, err, sizeof err), NF_OK);
  assert_int_equal(t.n_events, 0);
  nf__trace_free(&t);
  nft_write_tmp(path, sizeof path, "trace_test", "", 0, 1);
  assert_int_equal(nf__trace_load(&t, path, err, sizeof err), NF_OK);
  assert_int_equal(t.n_events, 0);
  nf__trace_free(&t);
  unlink(path);
}

// Each bad trace: the expected message after "FILE:".
static const struct { const char *text; const char *msg; size_t len; } bad[] = {
    {"alloc 1 2 3 4\nmalloc 1 2 3 4\n", "2: unknown action 'malloc'", 0},
    {"Alloc 1 2 3 4\n", "1: unknown action 'Alloc'", 0},
    {"alloc\n", "1: missing field ADDR", 0},
    {"alloc 1\n", "1: missing field SIZE", 0},
    {"# c\nalloc 1 2\n", "2: missing field STREAM", 0},
    {"alloc 1 2 3\n", "1: missing field TIME_US", 0},
    {"alloc 1 2 3 4 5\n", "1: extra field '5' after TIME_US", 0},
    {"alloc 1 2 3 4 # trailing comment\n", "1: extra field '#' after TIME_US", 0},
    {"alloc x 2 3 4\n", "1: ADDR is not an unsigned decimal number: 'x'", 0},
    {"alloc 1 -2 3 4\n", "1: SIZE is not an unsigned decimal number: '-2'", 0},
    {"alloc 1 +2 3 4\n", "1: SIZE is not an unsigned decimal number: '+2'", 0},
    {"alloc 1 2 0x3 4\n", "1: STREAM is not an unsigned decimal number: '0x3'", 0},
    {"alloc 1 2 3 4.5\n", "1: TIME_US is not an unsigned decimal number: '4.5'", 0},
    {"alloc 1 2 3 4\nalloc 1 18446744073709551616 3 4\n", "2: SIZE overflows 64 bits: '18446744073709551616'", 0},
    {"alloc 99999999999999999999999 2 3 4\n", "1: ADDR overflows 64 bits", 0},
    {"alloc 1 2 3 4\n\nfree_completed 1 2 3 4\nsegment_alloc\n", "4: missing field ADDR", 0},
    // ':' follows '9' in ASCII: a digit check off by one would read it as ten.
    {"alloc 1 2 3 4:\n", "1: TIME_US is not an unsigned decimal number: '4:'", 0},
    // An embedded NUL is just a bad byte, not the end of the line.
    {"alloc 1 2 3 4\nalloc 1 2\0003 4 5\n", "2: SIZE is not an unsigned decimal number: '2?3'", 30},
};

static void test_malformed(void **state) {
  (void)state;
  char path[64], err[256], want[512];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    size_t n = bad[i].len ? bad[i].len : strlen(bad[i].text);
    for (int mode = 0; mode < 3; mode++) { // plain file, gzip file, buffer
      nf_trace_t t;
      nf_status_t st;
      err[0] = 0;
      if (mode < 2) {
        nft_write_tmp(path, sizeof path, "trace_test", bad[i].text, n, mode);
        st = nf__trace_load(&t, path, err, sizeof err);
        unlink(path);
      } else {
        snprintf(path, sizeof path, "buf");
        st = nf__trace_parse_buffer(&t, path, bad[i].text, n, err, sizeof err);
      }
      snprintf(want, sizeof want, "%s:%s", path, bad[i].msg);
      if (st != NF_ERR_INVALID || strncmp(err, want, strlen(want)) != 0)
        fail_msg("case %zu mode %d: status %d, message '%s', want '%s'", i, mode, st, err, want);
      assert_null(t.events); // nothing kept on failure
      assert_int_equal(t.n_events, 0);
    }
  }
}

static void test_line_too_long(void **state) {
  (void)state;
  size_t n = 3 * NF_TRACE_MAX_LINE;
  char *text = malloc(n + 64);
  assert_non_null(text);
  int k = snprintf(text, 64, "alloc 1 2 3 4\n# ");
  memset(text + k, 'x', n - (size_t)k);
  strcpy(text + n, "\nalloc 5 6 7 8\n");
  char path[64], err[256], want[256];
  for (int mode = 0; mode < 3; mode++) {
    nf_trace_t t;
    nf_status_t st;
    if (mode < 2) {
      nft_write_tmp(path, sizeof path, "trace_test", text, strlen(text), mode);
      st = nf__trace_load(&t, path, err, sizeof err);
      unlink(path);
    } else {
      strcpy(path, "buf");
      st = nf__trace_parse_buffer(&t, path, text, strlen(text), err, sizeof err);
    }
    assert_int_equal(st, NF_ERR_INVALID);
    snprintf(want, sizeof want, "%s:2: line too long", path);
    assert_true(strncmp(err, want, strlen(want)) == 0);
  }
  // Exactly the limit is fine.
  memset(text, ' ', NF_TRACE_MAX_LINE);
  memcpy(text, "alloc 1 2 3 4", 13);
  text[NF_TRACE_MAX_LINE] = '\n';
  nft_write_tmp(path, sizeof path, "trace_test", text, NF_TRACE_MAX_LINE + 1, 1);
  nf_trace_t t;
  assert_int_equal(nf__trace_load(&t, path, err, sizeof err), NF_OK);
  assert_int_equal(t.n_events, 1);
  nf__trace_free(&t);
  unlink(path);
  free(text);
}

static void test_file_errors(void **state) {
  (void)state;
  char err[256] = "";
  nf_trace_t t;
  assert_int_equal(nf__trace_load(&t, "/nonexistent/x.trace.gz", err, sizeof err), NF_ERR_INVALID);
  assert_non_null(strstr(err, "/nonexistent/x.trace.gz: cannot open"));
  // A gzip stream cut in the middle: either a parse error on the cut line or
  // a read error, never success.
  char path[64];
  size_t n = 200000;
  char *text = malloc(n * 32 + 1);
  assert_non_null(text);
  size_t off = 0;
  for (size_t i = 0; i < n; i++) off += (size_t)sprintf(text + off, "alloc %zu 512 0 %zu\n", i, i);
  nft_write_tmp(path, sizeof path, "trace_test", text, off, 1);
  nft_truncate_half(path);
  assert_int_equal(nf__trace_load(&t, path, err, sizeof err), NF_ERR_INVALID);
  assert_true(strncmp(err, path, strlen(path)) == 0);
  if (!strstr(err, "read error")) fail_msg("%s", err);
  unlink(path);
  free(text);
}

// Files are streamed in 1 MiB chunks through the reader the RMM loader
// shares (nf__trace_read_lines): a trace several chunks long, lines of many
// lengths (comments, CRLF) across every boundary, a longest line (exactly
// NF_TRACE_MAX_LINE bytes) whose '\n' starts the second chunk, and a last
// line without newline loads from plain and gzip files exactly as from memory.
static void test_stream_chunks(void **state) {
  (void)state;
  const size_t chunk = (size_t)1 << 20, total = 3 * chunk + 777;
  char *text = malloc(total + 2 * NF_TRACE_MAX_LINE);
  assert_non_null(text);
  uint64_t seed = nft_env_seed(11);
  size_t off = 0, lines = 0;
  int did_exact = 0;
  while (off < total) {
    uint64_t r = nft_rand(&seed);
    size_t pad = (size_t)(r >> 8) % 300;
    if (!did_exact && off + 700 >= chunk - NF_TRACE_MAX_LINE) {
      // A comment up to chunk - NF_TRACE_MAX_LINE, then a longest line ending at chunk - 1.
      size_t k = chunk - NF_TRACE_MAX_LINE - off - 1;
      text[off] = '#';
      memset(text + off + 1, 'c', k - 1);
      off += k;
      text[off++] = '\n';
      int w = sprintf(text + off, "alloc %zu 1 0 1", lines);
      memset(text + off + w, ' ', NF_TRACE_MAX_LINE - (size_t)w);
      off += NF_TRACE_MAX_LINE;
      assert_int_equal(off, chunk);
      text[off++] = '\n';
      lines += 2, did_exact = 1;
      continue;
    }
    if (r % 5 == 0) { // a comment of `pad` bytes
      text[off++] = '#';
      memset(text + off, 'x', pad);
      off += pad;
    } else {
      off += (size_t)sprintf(text + off, "alloc %llu %llu %llu %zu%*s", (unsigned long long)(r >> 20), (unsigned long long)pad,
                             (unsigned long long)(r & 3), lines, (int)(pad % 7), "");
    }
    if (r & 8) text[off++] = '\r';
    text[off++] = '\n';
    lines++;
  }
  off += (size_t)sprintf(text + off, "free_completed 5 6 7 8"); // no final newline
  assert_true(did_exact);
  nf_trace_t m, t;
  char err[256] = "", path[64];
  if (nf__trace_parse_buffer(&m, "mem", text, off, err, sizeof err) != NF_OK) fail_msg("%s", err);
  assert_true(m.n_events > 10000);
  assert_int_equal(m.events[m.n_events - 1].line, lines + 1);
  for (int gz = 0; gz < 2; gz++) {
    nft_write_tmp(path, sizeof path, "trace_test", text, off, gz);
    if (nf__trace_load(&t, path, err, sizeof err) != NF_OK) fail_msg("gz %d: %s", gz, err);
    assert_int_equal(t.n_events, m.n_events);
    for (size_t i = 0; i < m.n_events; i++) {
      const nf_trace_event_t *a = &t.events[i], *b = &m.events[i];
      if (a->action != b->action || a->line != b->line || a->addr != b->addr || a->size != b->size ||
          a->stream != b->stream || a->time_us != b->time_us)
        fail_msg("gz %d event %zu (line %u) differs", gz, i, b->line);
    }
    nf__trace_free(&t);
    unlink(path);
  }
  nf__trace_free(&m);
  free(text);
}

static void build(const char *text, nf__trace_ops *o, nf_status_t want, const char *msg) {
  nf_trace_t t;
  char err[256] = "";
  assert_int_equal(nf__trace_parse_buffer(&t, "ops", text, strlen(text), err, sizeof err), NF_OK);
  nf_status_t st = nf__trace_ops_build(o, &t, err, sizeof err);
  if (st != want || (msg && strncmp(err, msg, strlen(msg)) != 0))
    fail_msg("status %d message '%s', want %d '%s'", st, err, want, msg ? msg : "");
  if (st != NF_OK) assert_null(o->ops);
  nf__trace_free(&t);
}

static void test_ops(void **state) {
  (void)state;
  nf__trace_ops o;
  build(good, &o, NF_OK, NULL);
  assert_int_equal(o.n_events, 9);
  assert_int_equal(o.n_allocs, 4);
  assert_int_equal(o.n_frees, 2);
  assert_int_equal(o.n_free_requested, 1);
  assert_int_equal(o.n_ops, 6);
  assert_int_equal(o.n_segment_alloc, 1);
  assert_int_equal(o.n_segment_free, 1);
  assert_int_equal(o.native_peak_reserved, 4096);
  assert_true(o.peak_live == UINT64_MAX); // clamped, not wrapped
  assert_int_equal(o.n_streams, 2);
  assert_int_equal(o.streams[0], 0);
  assert_int_equal(o.streams[1], 7);
  assert_int_equal(o.live_at_end, 2);
  // alloc 1000 -> slot 0, alloc 2000 -> slot 1 (stream 1), free 1000, alloc
  // 1000 reuses slot 0, free 2000 frees slot 1, alloc 3000 reuses slot 1.
  assert_int_equal(o.n_slots, 2);
  assert_int_equal(o.ops[0].kind, NF_TRACE_OP_ALLOC);
  assert_int_equal(o.ops[1].slot, 1);
  assert_int_equal(o.ops[1].stream, 1);
  assert_int_equal(o.ops[1].event, 2);
  assert_int_equal(o.ops[2].kind, NF_TRACE_OP_FREE);
  assert_int_equal(o.ops[2].slot, 0);
  assert_int_equal(o.ops[2].event, 4);
  assert_int_equal(o.ops[3].slot, 0);
  assert_int_equal(o.ops[3].size, 50);
  assert_int_equal(o.ops[5].slot, 1);
  nf__trace_ops_free(&o);

  build("alloc 1 100 0 0\nalloc 2 50 0 0\nfree_completed 1 100 0 0\nalloc 3 70 0 0\n", &o, NF_OK, NULL);
  assert_int_equal(o.peak_live, 150);
  nf__trace_ops_free(&o);

  build("alloc 1 100 0 0\nalloc 1 100 0 0\n", &o, NF_ERR_INVALID, "ops:2: alloc of live address 1");
  build("alloc 1 100 0 0\nfree_completed 2 100 0 0\n", &o, NF_ERR_INVALID,
        "ops:2: free_completed of unknown address 2");
  build("free_requested 2 100 0 0\n", &o, NF_ERR_INVALID, "ops:1: free_requested of unknown address 2");
  build("alloc 1 100 0 0\nfree_completed 1 100 0 0\nfree_completed 1 100 0 0\n", &o, NF_ERR_INVALID,
        "ops:3: free_completed of unknown address 1");
  build("alloc 1 100 0 0\nfree_completed 1 99 0 0\n", &o, NF_ERR_INVALID,
        "ops:2: free_completed size 99 differs from the alloc's 100");
  build("segment_free 5 10 0 0\n", &o, NF_ERR_INVALID, "ops:1: segment_free of unknown segment 5");
  build("segment_alloc 5 10 0 0\nsegment_alloc 5 10 0 0\n", &o, NF_ERR_INVALID,
        "ops:2: segment_alloc of live segment 5");
  // A segment_free gives back the size recorded at its segment_alloc, not the
  // size on its own line: PyTorch's running sum of segments stays exact.
  build("segment_alloc 5 4096 0 0\nsegment_free 5 1000 0 0\nsegment_alloc 6 4096 0 0\n", &o, NF_OK, NULL);
  assert_int_equal(o.native_peak_reserved, 4096);
  nf__trace_ops_free(&o);
}

// Many addresses colliding and being deleted: exercises the map's
// backward-shift deletion against a brute-force reference.
static void test_ops_many(void **state) {
  (void)state;
  uint64_t seed = nft_env_seed(42);
  enum { N = 20000, ADDRS = 3000 };
  char *text = malloc((size_t)N * 64);
  uint64_t *live_size = calloc(ADDRS, sizeof *live_size);
  assert_non_null(text);
  assert_non_null(live_size);
  size_t off = 0, nlive = 0, maxlive = 0;
  uint64_t cur = 0, peak = 0;
  for (int i = 0; i < N; i++) {
    uint64_t a = nft_rand(&seed) % ADDRS;
    uint64_t addr = a << 21; // same low bits: a weak hash would cluster
    if (live_size[a]) {
      off += (size_t)sprintf(text + off, "free_completed %llu %llu 0 %d\n", (unsigned long long)addr,
                             (unsigned long long)live_size[a], i);
      cur -= live_size[a];
      live_size[a] = 0;
      nlive--;
    } else {
      uint64_t sz = 1 + nft_rand(&seed) % 100000;
      off += (size_t)sprintf(text + off, "alloc %llu %llu %d %d\n", (unsigned long long)addr,
                             (unsigned long long)sz, (int)(a % 3), i);
      live_size[a] = sz;
      cur += sz;
      if (cur > peak) peak = cur;
      if (++nlive > maxlive) maxlive = nlive;
    }
  }
  nf__trace_ops o;
  build(text, &o, NF_OK, NULL);
  assert_int_equal(o.peak_live, peak);
  assert_int_equal(o.n_slots, maxlive);
  assert_int_equal(o.live_at_end, nlive);
  assert_int_equal(o.n_streams, 3);
  nf__trace_ops_free(&o);
  free(text);
  free(live_size);
}

static void shared_trace(const char *file, size_t events, size_t allocs) {
  const char *dir = getenv("NF_SHARED");
  char path[1024];
  snprintf(path, sizeof path, "%s/traces/%s", dir ? dir : "../shared", file);
  if (access(path, R_OK) != 0) { print_message("skipping: %s not found\n", path); skip(); }
  nf_trace_t t;
  char err[512] = "";
  nf_status_t st = nf__trace_load(&t, path, err, sizeof err);
  if (st != NF_OK) fail_msg("%s", err);
  assert_int_equal(t.n_events, events);
  assert_int_equal(t.counts[NF_TRACE_ALLOC], allocs);
  nf__trace_ops o;
  st = nf__trace_ops_build(&o, &t, err, sizeof err);
  if (st != NF_OK) fail_msg("%s", err);
  assert_int_equal(o.n_allocs, allocs);
  assert_int_equal(o.n_ops, o.n_allocs + o.n_frees);
  assert_int_equal(o.n_events, events);
  assert_true(o.peak_live > 0 && o.native_peak_reserved >= o.peak_live);
  nf__trace_ops_free(&o);
  nf__trace_free(&t);
}

static void test_shared_gpt2(void **s) { (void)s; shared_trace("gpt2.trace.gz", 129673, 43469); }
static void test_shared_vit(void **s) { (void)s; shared_trace("vit.trace.gz", 108119, 36309); }
static void test_shared_llama(void **s) { (void)s; shared_trace("llama1b_fsdp.trace.gz", 154595, 51740); }

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_good_plain_gz_buffer),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_line_too_long),
      cmocka_unit_test(test_file_errors),
      cmocka_unit_test(test_stream_chunks),
      cmocka_unit_test(test_ops),
      cmocka_unit_test(test_ops_many),
      cmocka_unit_test(test_shared_gpt2),
      cmocka_unit_test(test_shared_vit),
      cmocka_unit_test(test_shared_llama),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
