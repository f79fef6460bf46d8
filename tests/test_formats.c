// Input/output formats: RMM logging_resource_adaptor CSV (parse, write,
// round trip, strict errors) and, through the CLI, PyTorch snapshot pickles
// (converted by python3 -m nofrag.torch_trace) and `nofrag convert`.
#include "nf_test.h"
#include "trace.h"

#include <sys/wait.h>
#include <unistd.h>

static const char text_trace[] =
    "# a small trace on two streams\n"
    "segment_alloc 4096 2097152 0 10\n"
    "alloc 4096 512 0 11\n"
    "alloc 8192 1048576 7 12\n"
    "free_requested 4096 512 0 13\n"
    "free_completed 4096 512 0 14\n"
    "alloc 4096 100 7 3600000015\n"
    "free_completed 8192 1048576 7 3600000016\n";

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
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char err[256] = "";
    nf_trace_t t;
    assert_int_equal(nf__trace_parse_rmm_buffer(&t, "bad.csv", cases[i].body, strlen(cases[i].body), err,
                                                sizeof err), NF_ERR_INVALID);
    if (strncmp(err, cases[i].msg, strlen(cases[i].msg)) != 0) fail_msg("case %zu: got '%s'", i, err);
    assert_null(t.events);
  }
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rmm_round_trip),
      cmocka_unit_test(test_rmm_accepts),
      cmocka_unit_test(test_rmm_errors),
      cmocka_unit_test(test_cli_pickle_and_convert),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
