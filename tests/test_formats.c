// Input/output formats: RMM logging_resource_adaptor CSV (parse, write,
// round trip, strict errors) and, through the CLI, PyTorch snapshot pickles
// (converted by python3 -m nofrag.torch_trace) and `nofrag convert`.
#include "nf_test.h"
#include "trace.h"

#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

static const char text_trace[] =
    "# a small trace on two streams\n"
    "segment_alloc 4096 2097152 0 10\n"
    "alloc 4096 512 0 11\n"
    "alloc 8192 1048576 7 12\n"
    "free_requested 4096 512 0 13\n"
    "free_completed 4096 512 0 14\n"
    "alloc 4096 100 7 3600000015\n"
    "free_completed 8192 1048576 7 3600000016\n";


// Parse an RMM log from a buffer (mode 2, named "buf") or through a plain
// (0) or gzip (1) file (named by its path, in `name`).
static nf_status_t rmm_load_mode(nf_trace_t *t, int mode, const char *text, size_t n, char *name, size_t namelen,
                                 char *err, size_t errlen) {
  if (mode == 2) {
    snprintf(name, namelen, "buf");
    return nf__trace_parse_rmm_buffer(t, name, text, n, err, errlen);
  }
  nft_write_tmp(name, namelen, "formats", text, n, mode);
  nf_status_t st = nf__trace_load_rmm(t, name, err, errlen);
  unlink(name);
  return st;
}

static void build(nf_trace_t *t, nf__trace_ops *o) {
  char err[256] = "";
  if (nf__trace_ops_build(o, t, err, sizeof err) != NF_OK) fail_msg("%s", err);
}

static void test_rmm_round_trip(void **state) {
  (void)state;
  char err[256] = "";
  nf_trace_t t, r;
  nf__trace_ops o, ro;
  assert_int_equal(nf__trace_parse_buffer(&t, "t", text_trace, strlen(text_trace), err, sizeof err), NF_OK);
  char *csv = NULL;
  size_t len = 0, rows = 0;
  FILE *f = open_memstream(&csv, &len);
  assert_non_null(f);
  assert_int_equal(nf__trace_write_rmm(&t, f, &rows), NF_OK);
  fclose(f);
  assert_int_equal(rows, 5); // alloc and free_completed only
  assert_true(nf__trace_is_rmm(csv, len));
  assert_non_null(strstr(csv, "1,01:00:00:000015,allocate,0x1000,100,0x7\n"));
  if (nf__trace_parse_rmm_buffer(&r, "r.csv", csv, len, err, sizeof err) != NF_OK) fail_msg("%s", err);
  build(&t, &o);
  build(&r, &ro);
  // The replay sees the same calls: kind, block, stream handle, size.
  assert_int_equal(o.n_ops, ro.n_ops);
  assert_int_equal(o.peak_live, ro.peak_live);
  for (size_t i = 0; i < o.n_ops; i++) {
    assert_int_equal(o.ops[i].kind, ro.ops[i].kind);
    assert_int_equal(o.ops[i].slot, ro.ops[i].slot);
    assert_int_equal(o.ops[i].size, ro.ops[i].size);
    assert_int_equal(o.streams[o.ops[i].stream], ro.streams[ro.ops[i].stream]);
    assert_int_equal(t.events[o.ops[i].event].time_us % 86400000000ull, r.events[ro.ops[i].event].time_us);
  }
  nf__trace_ops_free(&o);
  nf__trace_ops_free(&ro);
  nf__trace_free(&t);
  nf__trace_free(&r);
  free(csv);
}

static void test_rmm_accepts(void **state) {
  (void)state;
  // RMM's docs show epoch times and decimal streams; failures and (nil) are skipped.
  static const char log[] = "Thread,Time,Action,Pointer,Size,Stream\r\n"
                            "140573312345856,1634567890.234567,allocate,0x7f8a40000000,1024,0x7f8a38001020\r\n"
                            "7,10:00:00:5,allocate failure,(nil),99999999999,0\n"
                            "\n"
                            "7,x,free,7F8A40000000,1024,140231234457632\n";
  char err[256] = "";
  nf_trace_t t;
  if (nf__trace_parse_rmm_buffer(&t, "ok.csv", log, strlen(log), err, sizeof err) != NF_OK) fail_msg("%s", err);
  assert_int_equal(t.n_events, 2);
  assert_int_equal(t.events[0].action, NF_TRACE_ALLOC);
  assert_int_equal(t.events[0].addr, 0x7f8a40000000ull);
  assert_int_equal(t.events[0].stream, 0x7f8a38001020ull);
  assert_int_equal(t.events[0].time_us, 1634567890234567ull);
  assert_int_equal(t.events[1].action, NF_TRACE_FREE_COMPLETED);
  assert_int_equal(t.events[1].line, 5);
  assert_int_equal(t.events[1].stream, 140231234457632ull);
  assert_int_equal(t.events[1].time_us, 0); // unrecognised time: kept as 0
  nf__trace_free(&t);
}

static void test_rmm_errors(void **state) {
  (void)state;
  static const struct { const char *body, *msg; } cases[] = {
      {"Thread,Time,Action\n", "bad.csv:1: not an RMM log"},
      {"Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0x10,5\n", "bad.csv:2: missing field Stream"},
      {"Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0x10,5,0,9\n", "bad.csv:2: more than 6 fields"},
      {"Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0x10,5,0\n1,t,realloc,0x10,5,0\n",
       "bad.csv:3: unknown Action 'realloc'"},
      {"Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0xZZ,5,0\n", "bad.csv:2: Pointer is not a number"},
      {"Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0x10,-5,0\n", "bad.csv:2: Size is not a number"},
      {"Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0x10,5,0x\n", "bad.csv:2: Stream is not a number"},
      {"Thread,Time,Action,Pointer,Size,Stream\n1,t,free,0x10,99999999999999999999,0\n",
       "bad.csv:2: Size overflows 64 bits"},
      // 2^64: the last digit (6) is what overflows, not the value before it.
      {"Thread,Time,Action,Pointer,Size,Stream\n1,t,free,0x10,18446744073709551616,0\n",
       "bad.csv:2: Size overflows 64 bits"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    for (int mode = 0; mode < 3; mode++) { // plain file, gzip file, buffer: the same message
      char err[256] = "", name[64], want[320];
      nf_trace_t t;
      nf_status_t st = rmm_load_mode(&t, mode, cases[i].body, strlen(cases[i].body), name, sizeof name, err,
                                     sizeof err);
      snprintf(want, sizeof want, "%s%s", name, cases[i].msg + strlen("bad.csv"));
      if (st != NF_ERR_INVALID || strncmp(err, want, strlen(want)) != 0)
        fail_msg("case %zu mode %d: status %d, got '%s', want '%s'", i, mode, st, err, want);
      assert_null(t.events);
      assert_null(t.name);
    }
  }
}

// Longer lines than the reader's 1 MiB chunks and NF_TRACE_MAX_LINE, in every
// mode. Each case: the input, and the message after the name ("" = accepted).
static void test_rmm_long_lines(void **state) {
  (void)state;
  const size_t big = (3u << 20) + 12345, hl = strlen("Thread,Time,Action,Pointer,Size,Stream");
  char *text = malloc(big + 256);
  assert_non_null(text);
  for (int c = 0; c < 6; c++) {
    size_t n = 0;
    const char *msg = NULL;
    switch (c) {
    case 0: // not a log at all, its first line longer than any buffer: still "not an RMM log"
      memset(text, 'x', big);
      n = big;
      msg = ":1: not an RMM log";
      break;
    case 1: // the header, a '\r', then junk: refused as too long (it was accepted before streaming)
      memcpy(text, "Thread,Time,Action,Pointer,Size,Stream\r", hl + 1);
      memset(text + hl + 1, 'j', big);
      n = hl + 1 + big;
      strcpy(text + n, "\n1,t,free,0x1,1,0\n");
      n += strlen(text + n);
      msg = ":1: line too long (more than 4096 bytes)";
      break;
    case 2: // a row of NF_TRACE_MAX_LINE + 1 bytes (CRLF): too long; of exactly the limit: fine
    case 3: {
      size_t row = NF_TRACE_MAX_LINE + (c == 2);
      n = (size_t)sprintf(text, "Thread,Time,Action,Pointer,Size,Stream\r\n");
      memset(text + n, '0', row); // Thread padded with zeros up to the row's length
      const char tail[] = "1,t,allocate,0x10,5,0";
      memcpy(text + n + row - (sizeof tail - 1), tail, sizeof tail - 1);
      n += row;
      n += (size_t)sprintf(text + n, "\r\n");
      msg = c == 2 ? ":2: line too long (more than 4096 bytes)" : "";
      break;
    }
    case 4: // a row far longer than a chunk, after the header: too long, named by its line
      n = (size_t)sprintf(text, "Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0x10,5,0\n");
      memset(text + n, '1', big);
      n += big;
      msg = ":3: line too long (more than 4096 bytes)";
      break;
    case 5: // nothing at all
      n = 0;
      msg = ":1: not an RMM log";
      break;
    }
    for (int mode = 0; mode < 3; mode++) {
      char err[256] = "", name[64], want[320];
      nf_trace_t t;
      nf_status_t st = rmm_load_mode(&t, mode, text, n, name, sizeof name, err, sizeof err);
      if (!*msg) {
        if (st != NF_OK) fail_msg("case %d mode %d: %s", c, mode, err);
        assert_int_equal(t.n_events, 1);
        assert_int_equal(t.events[0].size, 5);
        nf__trace_free(&t);
        continue;
      }
      snprintf(want, sizeof want, "%s%s", name, msg);
      if (st != NF_ERR_INVALID || strncmp(err, want, strlen(want)) != 0)
        fail_msg("case %d mode %d: status %d, got '%s', want '%s'", c, mode, st, err, want);
      assert_null(t.events);
    }
  }
  free(text);
}

// A log several times the reader's 1 MiB chunk (the file is streamed, not
// read whole): rows of many lengths cross every chunk boundary, including a
// row of exactly NF_TRACE_MAX_LINE bytes whose '\r' ends one chunk and '\n'
// starts the next, and a longest row straddling another; LF and CRLF rows,
// blank lines, skipped failures, and a last row with no newline. Plain and
// gzip files give exactly the events the in-memory parse gives, which are
// the rows written.
static void test_rmm_stream(void **state) {
  (void)state;
  const size_t chunk = (size_t)1 << 20, total = 3 * chunk + 5000;
  char *text = malloc(total + 2 * NF_TRACE_MAX_LINE);
  size_t cap = total / 16, n_exp = 0, off = 0, line = 1;
  nf_trace_event_t *exp = calloc(cap, sizeof *exp);
  assert_non_null(text);
  assert_non_null(exp);
  off = (size_t)sprintf(text, "Thread,Time,Action,Pointer,Size,Stream\n");
  uint64_t seed = nft_env_seed(7);
  int live = 0, did_exact = 0, did_straddle = 0;
  // A row of `len` bytes before its terminator: body_fmt, its Thread padded
  // with leading zeros to that length.
  #define ROW(len, crlf, body_fmt, ...)                                                        \
    do {                                                                                      \
      char body_[160];                                                                        \
      int bl_ = snprintf(body_, sizeof body_, body_fmt, __VA_ARGS__);                         \
      assert_true((size_t)bl_ + 1 <= (size_t)(len));                                          \
      memset(text + off, '0', (size_t)(len) - (size_t)bl_);                                   \
      memcpy(text + off + (len) - (size_t)bl_, body_, (size_t)bl_);                           \
      off += (len);                                                                           \
      if (crlf) text[off++] = '\r';                                                           \
      text[off++] = '\n';                                                                     \
      line++;                                                                                 \
    } while (0)
  while (off < total) {
    uint64_t r = nft_rand(&seed);
    int crlf = (int)(r & 1);
    size_t len = 80 + (size_t)(r >> 8) % 200; // row length before its terminator
    size_t exact_at = chunk - NF_TRACE_MAX_LINE - 1; // '\r' at chunk - 1, '\n' at chunk
    if (!did_exact && off + 600 >= exact_at) {
      // A filler row landing exactly on exact_at, then the longest CRLF row.
      ROW(exact_at - off - 1, 0, "3,t,allocate failure,(nil),%d,0", 1);
      assert_int_equal(off, exact_at);
      len = NF_TRACE_MAX_LINE, crlf = 1, did_exact = 1;
    } else if (!did_straddle && off + NF_TRACE_MAX_LINE / 2 >= 2 * chunk) {
      len = NF_TRACE_MAX_LINE, crlf = 0, did_straddle = 1; // LF, crossing the second boundary
    } else if ((r >> 40) % 23 == 0) { // blank line, LF or CRLF
      text[off] = '\r';
      off += (size_t)crlf;
      text[off++] = '\n';
      line++;
      continue;
    } else if ((r >> 40) % 23 == 1) {
      ROW(len, crlf, "5,12:00:00:000001,allocate failure,(nil),%llu,0", (unsigned long long)(r >> 20));
      continue;
    }
    nf_trace_event_t e = {.action = live ? NF_TRACE_FREE_COMPLETED : NF_TRACE_ALLOC,
                          .addr = 0x7f0000000000ull + (n_exp / 2) * 4096, .size = 1 + (r >> 44),
                          .stream = (r >> 30) & 3, .time_us = (n_exp % 86400ull) * 1000000ull + n_exp % 1000000};
    uint64_t us = e.time_us, s = us / 1000000;
    ROW(len, crlf, "%llu,%02llu:%02llu:%02llu:%06llu,%s,0x%llx,%llu,%s%llx", (unsigned long long)(r >> 50),
        (unsigned long long)(s / 3600), (unsigned long long)(s / 60 % 60), (unsigned long long)(s % 60),
        (unsigned long long)(us % 1000000), live ? "free" : "allocate", (unsigned long long)e.addr,
        (unsigned long long)e.size, e.stream ? "0x" : "", (unsigned long long)e.stream);
    e.line = (uint32_t)line; // ROW counted the row's line

    assert_true(n_exp < cap);
    exp[n_exp++] = e;
    live = !live;
  }
  #undef ROW
  // The last row has no terminator at all.
  off += (size_t)sprintf(text + off, "9,t,allocate,0x%llx,77,0", 0x7e0000000000ull);
  exp[n_exp++] = (nf_trace_event_t){.action = NF_TRACE_ALLOC, .addr = 0x7e0000000000ull, .size = 77,
                                    .line = (uint32_t)++line};
  assert_true(did_exact && did_straddle && off > 3 * chunk);
  assert_memory_equal(text + chunk - 1, "\r\n", 2); // the exact row's terminator spans the first boundary

  for (int mode = 0; mode < 3; mode++) {
    char err[256] = "", name[64];
    nf_trace_t t;
    if (rmm_load_mode(&t, mode, text, off, name, sizeof name, err, sizeof err) != NF_OK)
      fail_msg("mode %d: %s", mode, err);
    assert_int_equal(t.n_events, n_exp);
    for (size_t i = 0; i < n_exp; i++) {
      const nf_trace_event_t *a = &t.events[i], *b = &exp[i];
      if (a->action != b->action || a->line != b->line || a->addr != b->addr || a->size != b->size ||
          a->stream != b->stream || a->time_us != b->time_us)
        fail_msg("mode %d event %zu: line %u addr %llx size %llu stream %llu time %llu, want line %u addr %llx size "
                 "%llu stream %llu time %llu", mode, i, a->line, (unsigned long long)a->addr,
                 (unsigned long long)a->size, (unsigned long long)a->stream, (unsigned long long)a->time_us, b->line,
                 (unsigned long long)b->addr, (unsigned long long)b->size, (unsigned long long)b->stream,
                 (unsigned long long)b->time_us);
    }
    nf__trace_free(&t);
  }

  // A bad row past the first chunks is named by its line, from a file as from memory.
  off += (size_t)sprintf(text + off, "\n1,t,allocate,0x10,5\n");
  for (int mode = 0; mode < 3; mode++) {
    char err[256] = "", name[64], want[128];
    nf_trace_t t;
    assert_int_equal(rmm_load_mode(&t, mode, text, off, name, sizeof name, err, sizeof err), NF_ERR_INVALID);
    snprintf(want, sizeof want, "%s:%zu: missing field Stream", name, line + 1);
    if (strncmp(err, want, strlen(want)) != 0) fail_msg("mode %d: got '%s', want '%s'", mode, err, want);
  }
  free(text);
  free(exp);
}

// File-level errors: unreadable, and a gzip stream cut short (read whole
// before streaming, a cut stream was silently taken as a shorter log).
static void test_rmm_file_errors(void **state) {
  (void)state;
  char err[256] = "", path[64];
  nf_trace_t t;
  assert_int_equal(nf__trace_load_rmm(&t, "/nonexistent/x.csv", err, sizeof err), NF_ERR_INVALID);
  assert_non_null(strstr(err, "/nonexistent/x.csv: cannot open"));
  assert_null(t.name);
  size_t n = 200000, off = 0;
  char *text = malloc(n * 48 + 64);
  assert_non_null(text);
  off = (size_t)sprintf(text, "Thread,Time,Action,Pointer,Size,Stream\n");
  for (size_t i = 0; i < n; i++)
    off += (size_t)sprintf(text + off, "1,t,%s,0x%zx,512,0\n", i & 1 ? "free" : "allocate", i / 2 * 4096);
  nft_write_tmp(path, sizeof path, "formats", text, off, 1);
  nft_truncate_half(path);
  assert_int_equal(nf__trace_load_rmm(&t, path, err, sizeof err), NF_ERR_INVALID);
  assert_true(strncmp(err, path, strlen(path)) == 0);
  if (!strstr(err, "read error")) fail_msg("%s", err);
  assert_null(t.events);
  unlink(path);
  free(text);
}


static void test_cli_pickle_and_convert(void **state) {
  (void)state;
  const char *cli = getenv("NF_CLI"), *shared = getenv("NF_SHARED");
  char pk[1024], args[3072], out[16384], dir[] = "/tmp/nf-formats-XXXXXX";
  if (!cli || access(cli, X_OK) != 0) { print_message("skipping: NF_CLI not set\n"); skip(); }
  snprintf(pk, sizeof pk, "%s/traces/gpt2_small_snapshot.pickle.gz", shared ? shared : "../shared");
  if (access(pk, R_OK) != 0) { print_message("skipping: %s not found\n", pk); skip(); }
  if (system("command -v python3 >/dev/null 2>&1") != 0) { print_message("skipping: no python3\n"); skip(); }
  assert_non_null(mkdtemp(dir));

  // The snapshot replays directly; its peak live is what the trace says.
  snprintf(args, sizeof args, "replay '%s' --json --allocator all", pk);
  if (nft_run_cli(args, out, sizeof out) != 0) fail_msg("%s", out);
  assert_non_null(strstr(out, "\"trace_peak_live\":5282995920"));
  assert_non_null(strstr(out, "\"events\":9139"));
  // Without python3 on PATH: a clear error, exit 2.
  snprintf(args, sizeof args, "version >/dev/null; PATH=/nonexistent '%s' replay '%s'", cli, pk);
  assert_int_equal(nft_run_cli(args, out, sizeof out), 2);
  assert_non_null(strstr(out, "needs python3"));

  // pickle -> RMM CSV -> replay: same demand.
  snprintf(args, sizeof args, "convert '%s' %s/s.csv 2>&1 && '%s' replay %s/s.csv --json", pk, dir, cli, dir);
  if (nft_run_cli(args, out, sizeof out) != 0) fail_msg("%s", out);
  assert_non_null(strstr(out, "(6117 rows)"));
  assert_non_null(strstr(out, "\"trace_peak_live\":5282995920"));
  assert_non_null(strstr(out, "\"events\":6117"));
  // A malformed CSV names file and line; convert refuses non-.csv outputs.
  snprintf(args, sizeof args, "version >/dev/null; printf 'Thread,Time,Action,Pointer,Size,Stream\\n1,t,grab,0x1,1,0\\n' > %s/b.csv;"
           " '%s' replay %s/b.csv", dir, cli, dir);
  assert_int_equal(nft_run_cli(args, out, sizeof out), 2);
  assert_non_null(strstr(out, "b.csv:2: unknown Action 'grab'"));
  snprintf(args, sizeof args, "convert '%s' %s/s.txt", pk, dir);
  assert_int_equal(nft_run_cli(args, out, sizeof out), 2);
  snprintf(args, sizeof args, "rm -rf '%s'", dir);
  assert_int_equal(system(args), 0);
}

// Zero sizes on the replay command line (here rather than in test_replay.c's
// bad-input test only to keep this change to its own files): --limit 0 meant
// "no limit" and --granule 0 "the default", silently; both are now refused,
// exit 2, in every spelling, before the trace is read. --conf limit:0 stays
// the library's "unset".
static void test_cli_zero_sizes(void **state) {
  (void)state;
  const char *cli = getenv("NF_CLI");
  if (!cli || access(cli, X_OK) != 0) { print_message("skipping: NF_CLI not set\n"); skip(); }
  char path[64], args[512], out[4096];
  const char t[] = "alloc 4096 1048576 0 1\nfree_completed 4096 1048576 0 2\n";
  nft_write_tmp(path, sizeof path, "formats", t, sizeof t - 1, 0);
  static const char *const limits[] = {"--limit 0", "--limit=0", "--limit 0GiB", "--limit 0B --min-capacity",
                                       "--conf limit:8MiB --limit 0"};
  for (size_t i = 0; i < sizeof limits / sizeof *limits; i++) {
    snprintf(args, sizeof args, "replay %s %s", path, limits[i]);
    int rc = nft_run_cli(args, out, sizeof out);
    if (rc != 2 || !strstr(out, "the limit must be > 0 (to replay without a limit, leave --limit out)"))
      fail_msg("%s: exit %d, output:\n%s", limits[i], rc, out);
    assert_null(strstr(out, "peak")); // refused up front: no summary
  }
  snprintf(args, sizeof args, "replay %s --granule 0", path);
  assert_int_equal(nft_run_cli(args, out, sizeof out), 2);
  if (!strstr(out, "nofrag: --granule '0': the granule must be a power of two >= 4 KiB")) fail_msg("%s", out);
  // What still works: no --limit (none), a real limit, and --conf limit:0 (the library's "unset").
  snprintf(args, sizeof args, "replay %s", path);
  assert_int_equal(nft_run_cli(args, out, sizeof out), 0);
  assert_non_null(strstr(out, "limit                 none"));
  snprintf(args, sizeof args, "replay %s --limit 4MiB --json", path);
  assert_int_equal(nft_run_cli(args, out, sizeof out), 0);
  assert_non_null(strstr(out, "\"limit\":4194304"));
  snprintf(args, sizeof args, "replay %s --conf limit:0", path);
  assert_int_equal(nft_run_cli(args, out, sizeof out), 0);
  unlink(path);
}

// What the CLI says when options do not fit together or a model runs out:
// the granule rule as the CLI has it (no "0, the backend's"), --verify with
// only models (which hand out no memory) refused like --device, a model's
// OOM without a limit saying so (not "limit 0 B"), and a limit rounded down
// to whole granules shown in bytes (formatted, both read "1.500 MiB").
static void test_cli_option_messages(void **state) {
  (void)state;
  const char *cli = getenv("NF_CLI");
  if (!cli || access(cli, X_OK) != 0) { print_message("skipping: NF_CLI not set\n"); skip(); }
  char path[64], big[64], args[512], out[4096];
  const char t[] = "alloc 4096 1048576 0 1\nfree_completed 4096 1048576 0 2\n";
  nft_write_tmp(path, sizeof path, "formats", t, sizeof t - 1, 0);
  snprintf(args, sizeof args, "replay %s --granule 3MiB", path);
  assert_int_equal(nft_run_cli(args, out, sizeof out), 2);
  if (!strstr(out, "nofrag: --granule '3MiB': the granule must be a power of two >= 4 KiB\n")) fail_msg("%s", out);
  for (int k = 0; k < 2; k++) {
    snprintf(args, sizeof args, "replay %s --verify --allocator %s", path, k ? "expandable" : "native");
    assert_int_equal(nft_run_cli(args, out, sizeof out), 2);
    if (!strstr(out, "--verify checks the memory nofrag hands out")) fail_msg("%s", out);
  }
  snprintf(args, sizeof args, "replay %s --verify --allocator all", path);
  assert_int_equal(nft_run_cli(args, out, sizeof out), 0);
  const char b[] = "alloc 16 2251799813685248 0 1\n"; // 2 PiB: past what the model maps
  nft_write_tmp(big, sizeof big, "formats", b, sizeof b - 1, 0);
  snprintf(args, sizeof args, "replay %s --allocator native", big);
  nft_run_cli(args, out, sizeof out);
  if (!strstr(out, "0 B allocated, no limit") || strstr(out, "limit 0 B")) fail_msg("%s", out);
  snprintf(args, sizeof args, "replay %s --limit 1.5MiB --granule 1MiB", path);
  assert_int_equal(nft_run_cli(args, out, sizeof out), 0);
  if (!strstr(out, "(1048576 B: rounded down to whole granules from 1572864 B)")) fail_msg("%s", out);
  unlink(path);
  unlink(big);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rmm_round_trip),
      cmocka_unit_test(test_rmm_accepts),
      cmocka_unit_test(test_rmm_errors),
      cmocka_unit_test(test_rmm_long_lines),
      cmocka_unit_test(test_rmm_stream),
      cmocka_unit_test(test_rmm_file_errors),
      cmocka_unit_test(test_cli_pickle_and_convert),
      cmocka_unit_test(test_cli_zero_sizes),
      cmocka_unit_test(test_cli_option_messages),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
