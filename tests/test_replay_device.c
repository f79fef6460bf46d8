// Replay on a device the caller hands in (nf__replay_dev, the CLI's
// --device): through hooks that stand for a GPU on the host backend, the
// replay makes the same decisions and finds the same figures as on the
// simulated device; --verify's words catch an interior granule replaced or
// two granules swapped (its first and last 8 bytes alone do not); every hook's
// failure stops the replay with its message; the CLI refuses bad --device use.
#include "nf_test.h"
#include "replay.h"
#include "trace.h"

#include <dlfcn.h>
#include <unistd.h>

#define G ((uint64_t)64 * 1024)

// A host "device": the host backend, the trace's handles as streams, words
// copied in place. Counts its calls; fails the call named by fail_*.
typedef struct {
  uint64_t cap;
  unsigned backends, puts, gets, drains, streams;
  unsigned fail_backend, fail_put, fail_get, fail_drain; // 1-based call to fail (0: none)
  int corrupt;     // 1: after the first put on a block of >= 4 granules, replace its second granule's bytes;
                   // 2: swap its second and third granules
  int corrupted;
} hostdev_t;

static int hd_backend(void *ctx, uint64_t g, nf_backend_t **out, uint64_t *capacity, char *err, size_t errlen) {
  hostdev_t *h = ctx;
  if (++h->backends == h->fail_backend) { snprintf(err, errlen, "no such device (injected)"); return -1; }
  *capacity = h->cap;
  return nf_backend_host_create(out, h->cap, g) == NF_OK ? 0 : -1;
}

static nf_stream_t hd_stream(void *ctx, size_t k, uint64_t raw) {
  hostdev_t *h = ctx;
  (void)k;
  h->streams++;
  return (nf_stream_t)(uintptr_t)raw;
}

static int hd_put(void *ctx, nf_stream_t s, void *ptr, size_t n, const uint64_t *off, const uint64_t *val, char *err,
                  size_t errlen) {
  hostdev_t *h = ctx;
  (void)s;
  if (++h->puts == h->fail_put) { snprintf(err, errlen, "put refused (injected)"); return -1; }
  for (size_t i = 0; i < n; i++) memcpy((char *)ptr + off[i], &val[i], 8);
  // Its size is where its last word ends; its second granule starts at b1.
  uint64_t size = n >= 2 ? off[n - 1] + 8 : 0, b1 = G - (uint64_t)(uintptr_t)ptr % G;
  if (h->corrupt && !h->corrupted && b1 + 2 * G + 16 <= size) {
    char *g2 = (char *)ptr + b1;
    if (h->corrupt == 1) memset(g2, 0x5a, G); // every byte of the granule, as a wrong mapping would
    else {
      static char tmp[G];
      memcpy(tmp, g2, G), memcpy(g2, g2 + G, G), memcpy(g2 + G, tmp, G);
    }
    h->corrupted = 1;
  }
  return 0;
}

static int hd_get(void *ctx, nf_stream_t s, void *ptr, size_t n, const uint64_t *off, uint64_t *val, char *err,
                  size_t errlen) {
  hostdev_t *h = ctx;
  (void)s;
  if (++h->gets == h->fail_get) { snprintf(err, errlen, "get refused (injected)"); return -1; }
  for (size_t i = 0; i < n; i++) memcpy(&val[i], (char *)ptr + off[i], 8);
  return 0;
}

static int hd_drain(void *ctx, char *err, size_t errlen) {
  hostdev_t *h = ctx;
  if (++h->drains == h->fail_drain) { snprintf(err, errlen, "device lost (injected)"); return -1; }
  return 0;
}

static nf__replay_dev hd_hooks(hostdev_t *h) {
  return (nf__replay_dev){.ctx = h, .backend = hd_backend, .stream = hd_stream, .put = hd_put, .get = hd_get,
                          .drain = hd_drain};
}

// Two streams; rounds of 24 blocks of 1/2 to 6 granules (not whole granules),
// each round freeing the one before but for every 5th block, which stays:
// holes of changing sizes, so that under a limit the pool must stitch.
// (and `ro`: the defaults, its granule, --verify on)
static void synthetic(nf_trace_t *t, nf__trace_ops *o, nf__replay_opts *ro, uint64_t seed) {
  nf__replay_opts_default(ro);
  ro->granule = G;
  ro->verify = 1;
  char *text = malloc(1 << 20), err[256] = "";
  assert_non_null(text);
  size_t off = 0;
  uint64_t sz[2][24];
  for (unsigned round = 0; round < 16; round++) {
    unsigned cur = round % 2, id0 = round * 24 + 1;
    for (unsigned i = 0; i < 24; i++) {
      sz[cur][i] = G / 2 + nft_rand(&seed) % (6 * G);
      off += (size_t)sprintf(text + off, "alloc %u %llu %d %u\n", (id0 + i) * 4096, (unsigned long long)sz[cur][i],
                             i % 3 ? 0 : 17, id0 + i);
    }
    for (unsigned i = 0; round && i < 24; i++)
      if ((round * 24 + i) % 5)
        off += (size_t)sprintf(text + off, "free_completed %u %llu %d %u\n", (id0 - 24 + i) * 4096,
                               (unsigned long long)sz[!cur][i], i % 3 ? 0 : 17, id0 + 24);
  }
  assert_int_equal(nf__trace_parse_buffer(t, "syn", text, off, err, sizeof err), NF_OK);
  if (nf__trace_ops_build(o, t, err, sizeof err) != NF_OK) fail_msg("%s", err);
  free(text);
}

static void test_device_same_as_simulated(void **state) {
  (void)state;
  nf_trace_t t;
  nf__trace_ops o;
  nf__replay_opts ro;
  synthetic(&t, &o, &ro, nft_env_seed(11));
  nf__replay_result a, b;
  nf__replay_bisect bis;
  char err[256] = "";
  if (nf__replay_min_capacity(&o, &ro, 0, &bis, err, sizeof err) != NF_OK) fail_msg("%s", err);
  for (int capped = 0; capped < 2; capped++) {
    ro.cfg.limit = capped ? bis.min_capacity + G : 0; // capped: one granule over the minimum
    ro.dev = NULL;
    if (nf__replay_run(&o, &ro, &a) != NF_OK) fail_msg("simulated: %s", a.error);
    // A device of the simulated one's size: uncapped, the same limit (and
    // policy) on both sides, as a --limit gives on any device.
    hostdev_t h = {.cap = NF_REPLAY_CAPACITY};
    nf__replay_dev d = hd_hooks(&h);
    ro.dev = &d;
    if (nf__replay_run(&o, &ro, &b) != NF_OK) fail_msg("device: %s", b.error);
    // The same decisions: every figure the pool counts is the same.
    assert_int_equal(a.stats.backend_calls, b.stats.backend_calls);
    assert_int_equal(a.stats.physical_peak, b.stats.physical_peak);
    assert_int_equal(a.stats.mapped_peak, b.stats.mapped_peak);
    assert_int_equal(a.calls_second_half, b.calls_second_half);
    assert_int_equal(a.verified, b.verified);
    assert_int_equal(a.verified, o.n_allocs);
    assert_int_equal(b.check, NF_OK);
    print_message("%s: %llu calls, %llu reclaims, %llu views, %llu moves\n", capped ? "capped" : "uncapped",
                  (unsigned long long)b.stats.backend_calls, (unsigned long long)b.stats.reclaims,
                  (unsigned long long)b.stats.views, (unsigned long long)b.stats.view_moves);
    if (capped) assert_true(b.stats.reclaims + b.stats.view_moves > 0); // the limit made it stitch
    // One backend and drain per run; one put per block, one get per check.
    assert_int_equal(h.backends, 1);
    assert_int_equal(h.drains, 1);
    assert_int_equal(h.puts, o.n_allocs);
    assert_int_equal(h.gets, b.verified);
    assert_int_equal(h.streams, o.n_streams);
    assert_int_equal(b.capacity, h.cap); // the device's, as its hook says
  }
  nf__trace_ops_free(&o);
  nf__trace_free(&t);
}

static void test_device_catches_wrong_granules(void **state) {
  (void)state;
  nf_trace_t t;
  nf__trace_ops o;
  nf__replay_opts ro;
  synthetic(&t, &o, &ro, nft_env_seed(12));
  for (int how = 1; how <= 2; how++) {
    hostdev_t h = {.cap = (uint64_t)1 << 36, .corrupt = how};
    nf__replay_dev d = hd_hooks(&h);
    ro.dev = &d;
    nf__replay_result r;
    assert_int_equal(nf__replay_run(&o, &ro, &r), NF_ERR_INVALID);
    assert_true(h.corrupted);
    assert_non_null(strstr(r.error, "data lost"));
    assert_non_null(strstr(r.error, "the word at offset"));
    // Not the first or last word: the block's ends were left intact.
    assert_null(strstr(r.error, "at offset 0:"));
  }
  nf__trace_ops_free(&o);
  nf__trace_free(&t);
}

static void test_device_failures(void **state) {
  (void)state;
  nf_trace_t t;
  nf__trace_ops o;
  nf__replay_opts ro;
  synthetic(&t, &o, &ro, nft_env_seed(13));
  struct { hostdev_t h; const char *want; } cases[] = {
      {{.fail_backend = 1}, "device backend: no such device (injected)"},
      {{.fail_put = 7}, "device: writing the signature at event"},
      {{.fail_get = 5}, "device: reading the signature at event"},
      {{.fail_drain = 1}, "device: waiting for its work at the end: device lost (injected)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    hostdev_t *h = &cases[i].h;
    h->cap = (uint64_t)1 << 36;
    nf__replay_dev d = hd_hooks(h);
    ro.dev = &d;
    nf__replay_result r;
    assert_int_equal(nf__replay_run(&o, &ro, &r), NF_ERR_BACKEND);
    if (!strstr(r.error, cases[i].want)) fail_msg("case %zu: '%s' lacks '%s'", i, r.error, cases[i].want);
    if (!h->fail_backend) assert_true(r.ops_done > 0);
  }
  nf__trace_ops_free(&o);
  nf__trace_free(&t);
}

static void cli_expect(const char *args, int rc, const char *needle) {
  static char out[1 << 14];
  int got = nft_run_cli(args, out, sizeof out);
  if (got != rc || !strstr(out, needle))
    fail_msg("nofrag %s: exit %d (expected %d), output:\n%s\nexpected '%s'", args, got, rc, out, needle);
}

static void test_cli_device(void **state) {
  (void)state;
  const char *cli = getenv("NF_CLI"), *data = getenv("NF_DATA");
  if (!cli || access(cli, X_OK) != 0) { print_message("skipping: NF_CLI not set\n"); skip(); }
  static const struct { const char *opts; int rc; const char *want; } cases[] = {
      {"--device gpu0", 2, "nofrag: --device 'gpu0': expected cuda or cuda:N"},
      {"--device cuda:-1", 2, "expected cuda or cuda:N"},
      {"--device 'cuda: 1'", 2, "expected cuda or cuda:N"},
      {"--device cuda:99999999999", 2, "expected cuda or cuda:N"},
      {"--device cuda --allocator native", 2, "the models (--allocator native) run on the CPU only"},
      {"--device", 2, "--device needs a value"},
      {"--json", 0, "\"device\":\"simulated\""},
      // Last: where a driver is present, its absence cannot be tested.
      {"--device cuda:0", 2, "nofrag: --device cuda:0: libcuda.so.1 not found: no NVIDIA driver on this machine"},
  };
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib) { dlclose(lib); print_message("a CUDA driver is here: its absence is not tested\n"); }
  for (size_t i = 0; i < sizeof cases / sizeof cases[0] - (lib != NULL); i++) {
    char args[1024];
    snprintf(args, sizeof args, "replay '%s/gpt2.trace.gz' %s", data ? data : "data", cases[i].opts);
    cli_expect(args, cases[i].rc, cases[i].want);
  }
}

int main(void) {
  setenv("NOFRAG_QUIET_OOM", "1", 1); // the bisection's probes run out of memory on purpose
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_device_same_as_simulated),
      cmocka_unit_test(test_device_catches_wrong_granules),
      cmocka_unit_test(test_device_failures),
      cmocka_unit_test(test_cli_device),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
