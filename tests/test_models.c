// Models of PyTorch's caching allocator (src/model.h): on the shared real
// traces, the native model reproduces PyTorch's own segment peak and the
// expandable model the measured expandable_segments peak; on small synthetic
// traces, the segments each rule gives by hand; free-and-retry under a limit;
// min-capacity bisection.
#include "model_test.h"

#include <unistd.h>

// ------------------------------------------------------------ shared traces

static void shared_path(char *buf, size_t n, const char *file) {
  const char *dir = getenv("NF_SHARED");
  snprintf(buf, n, "%s/traces/%s", dir ? dir : "../shared", file);
}

// Expected within 1% (native: the trace's segment_alloc peak) and 3%
// (expandable: reserved_bytes.all.peak measured under expandable_segments:True,
// ../shared/traces/README.md).
// The native model's peak allocated must equal the trace's
// allocated_bytes.all.peak exactly: it counts whole blocks, so it checks which
// blocks best fit picked, not only how many segments it made.
static void check_shared(const char *file, uint64_t expandable_peak, uint64_t native_allocated_peak) {
  char path[1024], err[512] = "";
  shared_path(path, sizeof path, file);
  if (access(path, R_OK) != 0) { print_message("skipping: %s not found\n", path); skip(); }
  nf_trace_t t;
  nf__trace_ops o;
  if (nf__trace_load(&t, path, err, sizeof err) != NF_OK) fail_msg("%s", err);
  if (nf__trace_ops_build(&o, &t, err, sizeof err) != NF_OK) fail_msg("%s", err);
  nf__model_result r;
  assert_int_equal(nf__model_run(NF_MODEL_NATIVE, &o, 0, &r), NF_OK);
  assert_int_equal(r.ops_done, o.n_ops);
  assert_int_equal(r.peak_requested, o.peak_live);
  double en = (double)r.peak_reserved / (double)o.native_peak_reserved - 1.0;
  print_message("%s native: peak reserved %llu vs trace %llu (%+.3f%%), %.3f s\n", file,
                (unsigned long long)r.peak_reserved, (unsigned long long)o.native_peak_reserved, 100 * en, r.seconds);
  assert_true(en > -0.01 && en < 0.01);
  assert_true(r.seconds < 2.0);
  assert_int_equal(r.alloc_retries, 0);
  assert_true(r.peak_allocated >= o.peak_live);
  assert_int_equal(r.peak_allocated, native_allocated_peak);
  assert_true(nf__model_run(NF_MODEL_EXPANDABLE, &o, 0, &r) == NF_OK);
  double ee = (double)r.peak_reserved / (double)expandable_peak - 1.0;
  print_message("%s expandable: peak reserved %llu vs measured %llu (%+.3f%%), %.3f s\n", file,
                (unsigned long long)r.peak_reserved, (unsigned long long)expandable_peak, 100 * ee, r.seconds);
  assert_true(ee > -0.03 && ee < 0.03);
  assert_true(r.seconds < 2.0);
  assert_true(r.peak_reserved >= o.peak_live);
  nf__trace_ops_free(&o);
  nf__trace_free(&t);
}

static void test_shared_gpt2(void **state) { (void)state; check_shared("gpt2.trace.gz", 26818379776ull, 24927244800ull); }

// Issue 12: a trace recorded on the H200 (bench/gpu/torch_features.py, case
// llama: Llama-style 1.1B, checkpointing, 4 micro-batches of gradient
// accumulation, seq 256..2048, native allocator), converted from its snapshot
// pickle with python3 -m nofrag.torch_trace into data/llama1b_ga4_ckpt.trace.gz.
// The native model must reproduce PyTorch's segment peak within 1%: the
// trace's own segment events, and torch.cuda.max_memory_reserved() of that run
// (22070427648 B, data/llama1b_ga4_ckpt.json).
static void test_recorded_llama_ga4(void **state) {
  (void)state;
  char path[1024], err[512] = "";
  const char *dir = getenv("NF_DATA");
  snprintf(path, sizeof path, "%s/llama1b_ga4_ckpt.trace.gz", dir ? dir : "data");
  nf_trace_t t;
  nf__trace_ops o;
  if (nf__trace_load(&t, path, err, sizeof err) != NF_OK) fail_msg("%s", err);
  if (nf__trace_ops_build(&o, &t, err, sizeof err) != NF_OK) fail_msg("%s", err);
  assert_true(o.native_peak_reserved > 0); // the trace carries PyTorch's segments
  nf__model_result r;
  assert_int_equal(nf__model_run(NF_MODEL_NATIVE, &o, 0, &r), NF_OK);
  assert_int_equal(r.ops_done, o.n_ops);
  double en = (double)r.peak_reserved / (double)o.native_peak_reserved - 1.0;
  print_message("llama ga4 native: peak reserved %llu vs recorded %llu (%+.3f%%)\n", (unsigned long long)r.peak_reserved,
                (unsigned long long)o.native_peak_reserved, 100 * en);
  assert_true(en > -0.01 && en < 0.01);
  double em = (double)r.peak_reserved / 22070427648.0 - 1.0; // max_memory_reserved() on the H200
  assert_true(em > -0.01 && em < 0.01);
  assert_int_equal(r.peak_allocated, 18960432128ull); // max_memory_allocated(), exactly
  nf__trace_ops_free(&o);
  nf__trace_free(&t);
}

// nf__model_run_hooked: observers change nothing; sampled every op, the
// samples' maximum is the peak, reached at peak_op; inspect at peak_op sees it.
typedef struct hook_s { size_t n, last, at_max; uint64_t max_res, seen_res, seen_req; } hook_t;
static void on_sample(void *ctx, size_t op, uint64_t live, uint64_t reserved) {
  hook_t *h = ctx;
  (void)live;
  assert_true(op == h->last + 1);
  h->n++;
  h->last = op;
  if (reserved > h->max_res) { h->max_res = reserved; h->at_max = op; }
}
static void on_inspect(void *ctx, const nf__model *m) {
  hook_t *h = ctx;
  h->seen_res = m->reserved;
  h->seen_req = m->requested;
}

static void test_hooks(void **state) {
  (void)state;
  char path[1024], err[512] = "";
  shared_path(path, sizeof path, "gpt2.trace.gz");
  if (access(path, R_OK) != 0) { print_message("skipping: %s not found\n", path); skip(); }
  nf_trace_t t;
  nf__trace_ops o;
  if (nf__trace_load(&t, path, err, sizeof err) != NF_OK) fail_msg("%s", err);
  if (nf__trace_ops_build(&o, &t, err, sizeof err) != NF_OK) fail_msg("%s", err);
  for (int k = 0; k < NF_MODEL_NKINDS; k++) {
    nf__model_result a, b;
    assert_int_equal(nf__model_run(k, &o, 0, &a), NF_OK);
    hook_t h = {0};
    nf__model_hooks hk = {on_sample, 1, on_inspect, a.peak_op, &h};
    assert_int_equal(nf__model_run_hooked(k, &o, 0, &hk, &b), NF_OK);
    assert_int_equal(h.n, o.n_ops);
    assert_true(a.peak_reserved == b.peak_reserved && a.device_allocs == b.device_allocs);
    assert_int_equal(a.peak_op, b.peak_op);
    assert_true(h.max_res == a.peak_reserved);
    assert_int_equal(h.at_max, a.peak_op);
    assert_true(h.seen_res == a.peak_reserved);
    assert_true(h.seen_req <= a.peak_requested);
  }
  nf__trace_ops_free(&o);
  nf__trace_free(&t);
}
static void test_shared_vit(void **state) { (void)state; check_shared("vit.trace.gz", 10456399872ull, 10214747648ull); }
static void test_shared_llama(void **state) { (void)state; check_shared("llama1b_fsdp.trace.gz", 18733858816ull, 17439584768ull); }

// ------------------------------------------------------- synthetic traces

// Requests of 1-10 MiB share one 20 MiB segment (kLargeBuffer); 10 MiB and
// more get their size rounded to 2 MiB (kRoundLarge).
static void test_native_large_segments(void **state) {
  (void)state;
  syn_t s;
  syn_init(&s);
  for (uint32_t i = 0; i < 3; i++) syn_alloc(&s, i, 3 * MiB, 0);
  nf__model_result r = syn_run(&s, NF_MODEL_NATIVE, 0);
  assert_int_equal(r.status, NF_OK);
  assert_int_equal(r.peak_reserved, 20 * MiB);
  assert_int_equal(r.segments_peak, 1);
  assert_int_equal(r.peak_allocated, 9 * MiB);
  syn_alloc(&s, 3, 30 * MiB, 0);
  syn_alloc(&s, 4, 31 * MiB - 100, 0);
  r = syn_run(&s, NF_MODEL_NATIVE, 0);
  assert_int_equal(r.peak_reserved, (20 + 30 + 32) * MiB);
  assert_int_equal(r.segments_peak, 3);
}

// Small requests (<= 1 MiB) are rounded to 512 B and packed into one 2 MiB
// segment (kSmallBuffer), split down to 512 B remainders.
static void test_native_small_pool(void **state) {
  (void)state;
  syn_t s;
  syn_init(&s);
  for (uint32_t i = 0; i < 10; i++) syn_alloc(&s, i, 1000, 0);
  syn_alloc(&s, 10, 1 * MiB, 0);
  nf__model_result r = syn_run(&s, NF_MODEL_NATIVE, 0);
  assert_int_equal(r.peak_reserved, 2 * MiB);
  assert_int_equal(r.segments_peak, 1);
  assert_int_equal(r.peak_allocated, 10 * 1024 + MiB);
  // A 1 MiB + 1 B request is large: a 20 MiB segment of its own.
  syn_alloc(&s, 11, MiB + 1, 0);
  r = syn_run(&s, NF_MODEL_NATIVE, 0);
  assert_int_equal(r.peak_reserved, 22 * MiB);
}

// Large pool split rule: only when more than 1 MiB would remain; otherwise
// the whole block is handed out (allocated counts it whole).
static void test_native_split_rule(void **state) {
  (void)state;
  syn_t s;
  syn_init(&s);
  syn_alloc(&s, 0, 9 * MiB, 0);          // 20 MiB segment, 11 MiB remain: split
  syn_alloc(&s, 1, 10 * MiB + MiB / 2, 0); // fits the 11 MiB rest, 0.5 MiB left: no split
  nf__model_result r = syn_run(&s, NF_MODEL_NATIVE, 0);
  assert_int_equal(r.peak_reserved, 20 * MiB);
  assert_int_equal(r.peak_allocated, 20 * MiB);
  // Freed neighbours coalesce: the whole segment serves 19 MiB afterwards.
  syn_free(&s, 0);
  syn_free(&s, 1);
  syn_alloc(&s, 2, 19 * MiB, 0);
  r = syn_run(&s, NF_MODEL_NATIVE, 0);
  assert_int_equal(r.peak_reserved, 20 * MiB);
  assert_int_equal(r.device_allocs, 1);
}

// A block freed on one stream is not reused by another.
static void test_native_per_stream(void **state) {
  (void)state;
  syn_t s;
  syn_init(&s);
  syn_alloc(&s, 0, 3 * MiB, 0);
  syn_free(&s, 0);
  syn_alloc(&s, 1, 3 * MiB, 0); // same stream: reuses
  nf__model_result r = syn_run(&s, NF_MODEL_NATIVE, 0);
  assert_int_equal(r.peak_reserved, 20 * MiB);
  syn_free(&s, 1);
  syn_alloc(&s, 2, 3 * MiB, 1); // other stream: a segment of its own
  r = syn_run(&s, NF_MODEL_NATIVE, 0);
  assert_int_equal(r.peak_reserved, 40 * MiB);
  assert_int_equal(r.segments_peak, 2);
  r = syn_run(&s, NF_MODEL_EXPANDABLE, 0); // one expandable segment per stream
  assert_int_equal(r.peak_reserved, 40 * MiB);
  assert_int_equal(r.segments_peak, 2);
}

// Under a limit, a failing cudaMalloc frees every cached whole segment and
// retries (release_cached_blocks); only then OOM.
static void test_native_retry(void **state) {
  (void)state;
  syn_t s;
  syn_init(&s);
  syn_alloc(&s, 0, 30 * MiB, 0);
  syn_free(&s, 0);
  syn_alloc(&s, 1, 32 * MiB, 0); // the cached 30 MiB segment is too small
  nf__model_result r = syn_run(&s, NF_MODEL_NATIVE, 0);
  assert_int_equal(r.peak_reserved, 62 * MiB);
  assert_int_equal(r.alloc_retries, 0);
  r = syn_run(&s, NF_MODEL_NATIVE, 40 * MiB);
  assert_int_equal(r.status, NF_OK);
  assert_int_equal(r.alloc_retries, 1);
  assert_int_equal(r.device_frees, 1);
  assert_int_equal(r.peak_reserved, 32 * MiB);
  r = syn_run(&s, NF_MODEL_NATIVE, 31 * MiB);
  assert_int_equal(r.status, NF_ERR_OOM);
  assert_int_equal(r.ooms, 1);
  assert_int_equal(r.fail_event, 3);
  // A split segment with a live block cannot be freed: OOM although 17 MiB are cached.
  // 3 MiB in a 20 MiB segment, then 18 MiB: the free 17 MiB rest cannot serve it.
  syn_init(&s);
  syn_alloc(&s, 0, 3 * MiB, 0);
  syn_alloc(&s, 1, 18 * MiB, 0); // the 17 MiB rest is too small: a new segment
  r = syn_run(&s, NF_MODEL_NATIVE, 30 * MiB);
  assert_int_equal(r.status, NF_ERR_OOM);
  nf__model_bisect b;
  char err[256];
  assert_int_equal(nf__model_min_capacity(NF_MODEL_NATIVE, &s.o, 0, 0, &b, err, sizeof err), NF_OK);
  assert_int_equal(b.min_capacity, 38 * MiB);
}

// Best fit breaks size ties by address, and the driver hands cudaMalloc
// ranges out top-down: of two free 12 MiB blocks, PyTorch takes the one in
// the newer segment. Here that is the free tail of a 20 MiB segment whose head
// is live, so the older 12 MiB segment stays whole and free, and the OOM retry
// can give it back. PyTorch 2.11 on the H200 (raw_alloc / raw_delete, limit
// set by set_per_process_memory_fraction): 1 retry, 1 cudaFree, 34 MiB peak.
static void test_native_address_order(void **state) {
  (void)state;
  syn_t s;
  syn_init(&s);
  syn_alloc(&s, 0, 12 * MiB, 0); // segment A, 12 MiB
  syn_alloc(&s, 1, 8 * MiB, 0);  // segment B, 20 MiB: 8 MiB live, 12 MiB free tail
  syn_free(&s, 0);               // A: a whole free 12 MiB segment
  syn_alloc(&s, 2, 12 * MiB, 0); // size tie: B's tail (newer, lower address)
  syn_alloc(&s, 3, 14 * MiB, 0); // 32 + 14 > 40: free A, retry
  nf__model_result r = syn_run(&s, NF_MODEL_NATIVE, 0);
  assert_int_equal(r.peak_reserved, 46 * MiB);
  r = syn_run(&s, NF_MODEL_NATIVE, 40 * MiB);
  assert_int_equal(r.status, NF_OK);
  assert_int_equal(r.alloc_retries, 1);
  assert_int_equal(r.device_frees, 1);
  assert_int_equal(r.peak_reserved, 34 * MiB);
  r = syn_run(&s, NF_MODEL_NATIVE, 34 * MiB);
  assert_int_equal(r.status, NF_OK);
}

// The bundled GPT-2 and Llama traces under a limit: the smallest limit (2 MiB
// steps) under which PyTorch 2.11 replaying their calls on the H200 completes
// (raw_alloc / raw_delete under set_per_process_memory_fraction, bisected):
// the model completes there, OOMs one step below, with PyTorch's counters.
static void check_torch_limit(const char *file, uint64_t min_ok, uint64_t retries, uint64_t frees, uint64_t reserved) {
  char path[1024], err[512] = "";
  const char *dir = getenv("NF_DATA");
  snprintf(path, sizeof path, "%s/%s", dir ? dir : "data", file);
  nf_trace_t t;
  nf__trace_ops o;
  if (nf__trace_load(&t, path, err, sizeof err) != NF_OK) fail_msg("%s", err);
  if (nf__trace_ops_build(&o, &t, err, sizeof err) != NF_OK) fail_msg("%s", err);
  nf__model_result r;
  assert_int_equal(nf__model_run(NF_MODEL_NATIVE, &o, min_ok, &r), NF_OK);
  assert_int_equal(r.alloc_retries, retries);
  assert_int_equal(r.device_frees, frees);
  assert_int_equal(r.peak_reserved, reserved);
  assert_int_equal(nf__model_run(NF_MODEL_NATIVE, &o, min_ok - 2 * MiB, &r), NF_ERR_OOM);
  nf__trace_ops_free(&o);
  nf__trace_free(&t);
}

static void test_native_torch_limits(void **state) {
  (void)state;
  check_torch_limit("gpt2.trace.gz", 28829548544ull, 2, 34, 28829548544ull);
  check_torch_limit("llama1b_ga4_ckpt.trace.gz", 20709376000ull, 2, 11, 20709376000ull);
}

// Expandable: pages of 20 MiB (large pool) and 2 MiB (small pool), mapped
// as blocks need them; the free tail grows in place; OOM retry unmaps.
static void test_expandable(void **state) {
  (void)state;
  syn_t s;
  syn_init(&s);
  for (uint32_t i = 0; i < 3; i++) syn_alloc(&s, i, 3 * MiB, 0);
  nf__model_result r = syn_run(&s, NF_MODEL_EXPANDABLE, 0);
  assert_int_equal(r.peak_reserved, 20 * MiB);
  syn_alloc(&s, 3, 30 * MiB, 0); // 9 + 30 MiB: one more 20 MiB page
  syn_alloc(&s, 4, 1000, 0);     // small pool: one 2 MiB page
  r = syn_run(&s, NF_MODEL_EXPANDABLE, 0);
  assert_int_equal(r.peak_reserved, 42 * MiB);
  assert_int_equal(r.segments_peak, 2);

  syn_init(&s);
  syn_alloc(&s, 0, 30 * MiB, 0); // maps 40 MiB
  syn_free(&s, 0);
  syn_alloc(&s, 1, 50 * MiB, 0); // the free 40 MiB grows by one page
  r = syn_run(&s, NF_MODEL_EXPANDABLE, 0);
  assert_int_equal(r.peak_reserved, 60 * MiB);
  assert_int_equal(r.alloc_retries, 0);
  // limit 80 MiB: 40 mapped + 50 asked > 80, so unmap the free pages and retry.
  r = syn_run(&s, NF_MODEL_EXPANDABLE, 80 * MiB);
  assert_int_equal(r.status, NF_OK);
  assert_int_equal(r.alloc_retries, 1);
  assert_int_equal(r.device_frees, 1);
  assert_int_equal(r.peak_reserved, 60 * MiB);
  // A native model in the same spot needs 30 + 50.
  r = syn_run(&s, NF_MODEL_NATIVE, 0);
  assert_int_equal(r.peak_reserved, 80 * MiB);
}

// One request larger than an expandable segment (9/8 of the device, 157.97
// GiB of address space): PyTorch's map fails and it raises OOM. The model
// walked past the segment's last block (b[-1]) before.
static void test_expandable_oversized(void **state) {
  (void)state;
  syn_t s;
  syn_init(&s);
  syn_alloc(&s, 0, (uint64_t)157 << 30, 0); // fits a segment
  nf__model_result r = syn_run(&s, NF_MODEL_EXPANDABLE, 0);
  assert_int_equal(r.status, NF_OK);
  assert_int_equal(r.segments_peak, 1);
  syn_init(&s);
  syn_alloc(&s, 0, (uint64_t)158 << 30, 0);
  syn_free(&s, 0);
  r = syn_run(&s, NF_MODEL_EXPANDABLE, 0);
  assert_int_equal(r.status, NF_ERR_OOM);
  assert_int_equal(r.fail_event, 1);
  assert_int_equal(r.ops_done, 0);
  assert_int_equal(r.peak_reserved, 0);
  // Behind a small block of the same stream and pool: the same OOM.
  syn_init(&s);
  syn_alloc(&s, 0, 30 * MiB, 0);
  syn_alloc(&s, 1, (uint64_t)158 << 30, 0);
  r = syn_run(&s, NF_MODEL_EXPANDABLE, 0);
  assert_int_equal(r.status, NF_ERR_OOM);
  assert_int_equal(r.fail_event, 2);
}

// Absurd sizes are OOMs, never wrapped arithmetic: a request near 2^64
// rounded to a tiny block (peak reserved "0 B", exit 0), and one above the
// 1 PiB bound is refused as well; the bisection then fails instead of
// answering 0 B. An upper bound given below peak live is no bound.
static void test_models_absurd_sizes(void **state) {
  (void)state;
  static const uint64_t sizes[] = {18446744073709551000ull, UINT64_MAX, ((uint64_t)1 << 50) + 1};
  char err[256];
  nf__model_bisect b;
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    for (int k = 0; k < NF_MODEL_NKINDS; k++) {
      syn_t s;
      syn_init(&s);
      syn_alloc(&s, 0, sizes[i], 0);
      syn_free(&s, 0);
      nf__model_result r = syn_run(&s, k, 0);
      if (r.status != NF_ERR_OOM) fail_msg("%s, %llu B: status %d, peak reserved %llu", nf__model_name(k),
                                           (unsigned long long)sizes[i], r.status, (unsigned long long)r.peak_reserved);
      assert_int_equal(r.fail_event, 1);
      assert_int_equal(r.peak_reserved, 0);
      r = syn_run(&s, k, 40 * MiB);
      assert_int_equal(r.status, NF_ERR_OOM);
      err[0] = 0;
      assert_int_not_equal(nf__model_min_capacity(k, &s.o, 0, 0, &b, err, sizeof err), NF_OK);
      assert_int_equal(b.min_capacity, 0);
      assert_true(err[0] != 0);
    }
  }
  // 1 PiB itself is served (rounded to 2 MiB already).
  syn_t s;
  syn_init(&s);
  syn_alloc(&s, 0, (uint64_t)1 << 50, 0);
  nf__model_result r = syn_run(&s, NF_MODEL_NATIVE, 0);
  assert_int_equal(r.status, NF_OK);
  assert_int_equal(r.peak_reserved, (uint64_t)1 << 50);
  // upper (2 MiB) below peak live (30 MiB): the search starts above peak live.
  syn_init(&s);
  syn_alloc(&s, 0, 30 * MiB, 0);
  assert_int_equal(nf__model_min_capacity(NF_MODEL_NATIVE, &s.o, 0, 2 * MiB, &b, err, sizeof err), NF_OK);
  assert_int_equal(b.min_capacity, 30 * MiB);
  assert_true(b.lower < b.upper);
  assert_true(b.lower < b.min_capacity && b.min_capacity <= 30 * MiB);
}

// Size-0 allocations: PyTorch's allocate(0) returns nullptr without a
// segment, and the nofrag replay skips them; the models reserved a 2 MiB
// segment for them (a 512 B block) before.
static void test_models_zero_size(void **state) {
  (void)state;
  for (int k = 0; k < NF_MODEL_NKINDS; k++) {
    syn_t s;
    syn_init(&s);
    syn_alloc(&s, 0, 0, 0);
    syn_alloc(&s, 1, 0, 1);
    syn_free(&s, 0);
    nf__model_result r = syn_run(&s, k, 0);
    assert_int_equal(r.status, NF_OK);
    assert_int_equal(r.ops_done, 3);
    assert_int_equal(r.peak_reserved, 0);
    assert_int_equal(r.peak_allocated, 0);
    assert_int_equal(r.device_allocs, 0);
    assert_int_equal(r.segments_peak, 0);
    syn_alloc(&s, 0, 3 * MiB, 0); // the slot is reused by a real block
    syn_free(&s, 1);
    syn_free(&s, 0);
    r = syn_run(&s, k, 0);
    assert_int_equal(r.status, NF_OK);
    assert_int_equal(r.peak_reserved, 20 * MiB);
    assert_int_equal(r.peak_allocated, 3 * MiB);
    assert_int_equal(r.allocated_end, 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_native_large_segments), cmocka_unit_test(test_native_small_pool),
      cmocka_unit_test(test_native_split_rule),     cmocka_unit_test(test_native_per_stream),
      cmocka_unit_test(test_native_retry),          cmocka_unit_test(test_expandable),
      cmocka_unit_test(test_shared_gpt2),           cmocka_unit_test(test_shared_vit),
      cmocka_unit_test(test_shared_llama),          cmocka_unit_test(test_hooks),
      cmocka_unit_test(test_recorded_llama_ga4),   cmocka_unit_test(test_native_address_order),
      cmocka_unit_test(test_native_torch_limits),   cmocka_unit_test(test_expandable_oversized),
      cmocka_unit_test(test_models_absurd_sizes),   cmocka_unit_test(test_models_zero_size),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
