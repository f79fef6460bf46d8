// Trace replay (src/replay/replay.c) at its edges, beyond test_replay.c:
// the pool's clock never goes back when the trace's times do (RMM logs of
// several threads interleave out of order), and the per-half backend call
// counts of a replay stopped early. Each was found untested by a mutation
// study of src/replay.
#include "nf_test.h"
#include "replay.h"
#include "trace.h"

#define G ((uint64_t)64 * 1024)

static void ops_from_text(const char *text, size_t len, nf_trace_t *t, nf__trace_ops *o) {
  char err[512] = "";
  if (nf__trace_parse_buffer(t, "edges", text, len, err, sizeof err) != NF_OK) fail_msg("%s", err);
  if (nf__trace_ops_build(o, t, err, sizeof err) != NF_OK) fail_msg("%s", err);
}

// One call at 100 s, then steps whose times restart near 0 and advance by
// 10 ms (200 steps: 2 s) with a swing of cached granules above the release
// threshold. The replay's clock stays at 100 s, so release_idle_ms (500 ms)
// is never reached and nothing is unmapped; a clock that followed the trace
// back would see 2 s pass and release.
static void test_replay_clock_never_back(void **state) {
  (void)state;
  char *text = malloc(1 << 20);
  assert_non_null(text);
  size_t off = (size_t)sprintf(text, "alloc 1 %llu 0 100000000\nfree_completed 1 %llu 0 100000000\n",
                               (unsigned long long)(2 * G), (unsigned long long)(2 * G));
  for (int k = 0; k < 200; k++) {
    unsigned long long t = 1 + 10000ull * (unsigned long long)k;
    int n = k ? 4 : 16;
    for (int i = 0; i < n; i++)
      off += (size_t)sprintf(text + off, "alloc %d %llu 0 %llu\n", (i + 1) << 20, (unsigned long long)(2 * G), t);
    for (int i = 0; i < n; i++)
      off += (size_t)sprintf(text + off, "free_completed %d %llu 0 %llu\n", (i + 1) << 20,
                             (unsigned long long)(2 * G), t);
  }
  nf_trace_t tr;
  nf__trace_ops o;
  ops_from_text(text, off, &tr, &o);
  nf__replay_opts ro;
  nf__replay_opts_default(&ro);
  ro.granule = G;
  ro.cfg.release_threshold = 4 * G;
  ro.cfg.release_after = 8;
  ro.cfg.release_idle_ms = 500;
  nf__replay_result *r = malloc(sizeof *r);
  assert_non_null(r);
  if (nf__replay_run(&o, &ro, r) != NF_OK) fail_msg("%s", r->error);
  assert_int_equal(r->stats.calls.unmap, 0);
  free(r);
  nf__trace_ops_free(&o);
  nf__trace_free(&tr);
  free(text);
}

// A replay that stops (OOM) before the second half of its ops made every
// backend call in the first half.
static void test_replay_halves_stopped_early(void **state) {
  (void)state;
  static const char text[] = "alloc 1 1000 0 0\n"
                             "alloc 2 1000000000 0 0\n" // over the limit: stops here, op 2 of 6
                             "free_completed 1 1000 0 0\n"
                             "free_completed 2 1000000000 0 0\n"
                             "alloc 3 1000 0 0\n"
                             "free_completed 3 1000 0 0\n";
  nf_trace_t tr;
  nf__trace_ops o;
  ops_from_text(text, sizeof text - 1, &tr, &o);
  nf__replay_opts ro;
  nf__replay_opts_default(&ro);
  ro.granule = G;
  ro.cfg.limit = 64 * G;
  nf__replay_result *r = malloc(sizeof *r);
  assert_non_null(r);
  assert_int_equal(nf__replay_run(&o, &ro, r), NF_ERR_OOM);
  assert_int_equal(r->ops_done, 1);
  assert_true(r->stats.backend_calls > 0);
  assert_int_equal(r->calls_first_half, r->stats.backend_calls);
  assert_int_equal(r->calls_second_half, 0);
  free(r);
  nf__trace_ops_free(&o);
  nf__trace_free(&tr);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_replay_clock_never_back),
      cmocka_unit_test(test_replay_halves_stopped_early),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
