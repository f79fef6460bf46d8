// Stream order through the CUDA backend on the stand-in driver
// (tests/fake_cuda/fake_stream.c), whose streams queue their work and run it
// only once what holds them lets go: a block freed while its stream's work is
// still queued must not be written by another stream's work before that work
// ran, nor unmapped under it. The GPU shows the same only by chance of timing;
// here a hold (cuStreamWaitValue32 on a host word) makes the hazard certain.
#include "cuda_fake_test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

// Stream order, with the stand-in's queues: stream A is held (a wait on a
// host word) with a memset of block x queued behind the hold; x is freed and
// its memory, the only memory under the limit, goes to stream B, whose own
// memset must wait for A's (a GPU-side wait: a host wait would hang, A being
// held by this very thread). Released, both run: the block holds B's bytes.
static void test_stream_order(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool_on(0, 2 * G, "views:0", &be);
  void *a = NULL, *b = NULL;
  assert_int_equal(cuCtxSetCurrent(fakecu_primary(0)), 0);
  assert_int_equal(cuStreamCreate(&a, 1), 0);
  assert_int_equal(cuStreamCreate(&b, 1), 0);
  assert_int_equal(cuCtxSetCurrent(NULL), 0);
  static volatile uint32_t flag;
  flag = 0;
  int mode = 2; // the test's own calls in relaxed mode (teardown counts every call outside it)
  assert_int_equal(cuThreadExchangeStreamCaptureMode(&mode), 0);
  for (int round = 0; round < 3; round++, flag = 0) {
    assert_int_equal(cuStreamWaitValue32_v2(a, (uintptr_t)&flag, 1, 0), 0); // GEQ 1
    void *x = nf_alloc(p, 2 * G, (nf_stream_t)a);
    assert_non_null(x);
    assert_int_equal(cuMemsetD32Async((uintptr_t)x, 0xAAAAAAAAu, 2 * G / 4, a), 0); // queued behind the hold
    assert_int_equal(nf_free(p, x), NF_OK);
    void *y = nf_alloc(p, 2 * G, (nf_stream_t)b);
    if (!y) fail_msg("round %d: %s", round, nf_last_error());
    assert_ptr_equal(y, x); // the same memory: nothing else fits
    assert_int_equal(cuMemsetD32Async((uintptr_t)y, 0xBBBBBBBBu, 2 * G / 4, b), 0);
    flag = 1;
    assert_int_equal(cuStreamSynchronize(a), 0);
    assert_int_equal(cuStreamSynchronize(b), 0);
    const uint32_t *w = y;
    for (size_t i = 0; i < 2 * G / 4; i += 1021)
      if (w[i] != 0xBBBBBBBBu) fail_msg("round %d: word %zu is %#x: B's memset ran before A's", round, i, w[i]);
    assert_int_equal(nf_free(p, y), NF_OK);
  }
  pool_off(p, be);
  assert_int_equal(cuStreamDestroy_v2(a), 0);
  assert_int_equal(cuStreamDestroy_v2(b), 0);
  assert_int_equal(cuThreadExchangeStreamCaptureMode(&mode), 0);
}

// Random work on three streams, each now and then held (its queued memsets
// wait on a host word that a second thread sets a little later, so that the
// pool's host waits end too): blocks allocated on a stream get their pattern
// written by a memset queued on it, are freed while that memset may still be
// queued (some after record_stream on another stream), and their memory goes
// to other streams at a tight limit. Every so often all work is released and
// drained and every live block must hold its own pattern.
enum { NS = 3, NB = 24 };
static _Atomic uint32_t word[NS], goal[NS]; // a held stream waits for word >= goal
static atomic_int stop;

static void *releaser(void *arg) {
  uint64_t seed = (uint64_t)(uintptr_t)arg;
  while (!atomic_load(&stop)) {
    usleep(300 + (unsigned)(nft_rand(&seed) % 700));
    int k = (int)(nft_rand(&seed) % NS);
    atomic_store(&word[k], atomic_load(&goal[k]));
  }
  return NULL;
}

static void release_all(void *s[NS]) {
  for (int k = 0; k < NS; k++) atomic_store(&word[k], atomic_load(&goal[k]));
  for (int k = 0; k < NS; k++) assert_int_equal(cuStreamSynchronize(s[k]), 0);
}

static void test_stream_stress(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool_on(0, 8 * G, NULL, &be);
  int mode = 2;
  assert_int_equal(cuThreadExchangeStreamCaptureMode(&mode), 0);
  void *s[NS];
  assert_int_equal(cuCtxSetCurrent(fakecu_primary(0)), 0);
  for (int k = 0; k < NS; k++) {
    assert_int_equal(cuStreamCreate(&s[k], 1), 0);
    atomic_store(&word[k], 0);
    atomic_store(&goal[k], 0);
  }
  atomic_store(&stop, 0);
  pthread_t t;
  uint64_t seed = nft_env_seed(0x57AE55);
  assert_int_equal(pthread_create(&t, NULL, releaser, (void *)(uintptr_t)(seed | 1)), 0);
  struct { uint32_t *p; size_t words; uint32_t tag; } l[NB] = {{0}};
  uint32_t tag = 1;
  int checks = 0;
  for (int r = 0; r < 4000; r++) {
    int k = (int)(nft_rand(&seed) % NS), i = (int)(nft_rand(&seed) % NB);
    if (nft_rand(&seed) % 8 == 0) { // hold stream k: its later work waits for the releaser
      uint32_t g = atomic_fetch_add(&goal[k], 1) + 1;
      assert_int_equal(cuStreamWaitValue32_v2(s[k], (uintptr_t)&word[k], g, 0), 0);
    }
    if (l[i].p) {
      if (nft_rand(&seed) % 4 == 0) assert_int_equal(nf_record_stream(p, l[i].p, (nf_stream_t)s[(k + 1) % NS]), NF_OK);
      assert_int_equal(nf_free(p, l[i].p), NF_OK);
      l[i].p = NULL;
    } else {
      size_t words = (64 + nft_rand(&seed) % (3 * G / 4)) & ~(size_t)15;
      uint32_t *q = nf_alloc(p, words * 4, (nf_stream_t)s[k]);
      if (!q) {
        assert_int_equal(nf_last_status(), NF_ERR_OOM);
        continue;
      }
      l[i].p = q;
      l[i].words = words;
      l[i].tag = tag++;
      assert_int_equal(cuMemsetD32Async((uintptr_t)q, l[i].tag, words, s[k]), 0);
    }
    if (r % 500 == 499) { // everything released and run: each live block holds its own tag
      release_all(s);
      for (int j = 0; j < NB; j++)
        for (size_t w = 0; l[j].p && w < l[j].words; w += 97, checks++)
          if (l[j].p[w] != l[j].tag)
            fail_msg("round %d: block %p word %zu holds %#x, not its tag %#x: another stream's work ran over it",
                     r, (void *)l[j].p, w, l[j].p[w], l[j].tag);
    }
  }
  release_all(s);
  atomic_store(&stop, 1);
  assert_int_equal(pthread_join(t, NULL), 0);
  for (int j = 0; j < NB; j++)
    if (l[j].p) assert_int_equal(nf_free(p, l[j].p), NF_OK);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_stats_t st = nft_stats_of(p);
  printf("   %d words checked; %llu cross-stream reuses, %llu stream waits, %llu host waits\n", checks,
         (unsigned long long)st.cross_stream_reuses, (unsigned long long)st.calls.stream_wait,
         (unsigned long long)st.calls.event_sync);
  assert_true(st.cross_stream_reuses > 0);
  pool_off(p, be);
  for (int k = 0; k < NS; k++) assert_int_equal(cuStreamDestroy_v2(s[k]), 0);
  assert_int_equal(cuCtxSetCurrent(NULL), 0);
  assert_int_equal(cuThreadExchangeStreamCaptureMode(&mode), 0);
}

int main(void) {
  setenv("NOFRAG_QUIET_OOM", "1", 1); // the stress hits the limit on purpose
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_stream_order, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stream_stress, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
