// Threads and CUDA contexts (tests/gpu, one program; see test_cuda.c): pool
// calls from a thread with no context, the PyTorch plug-in's pool made on
// one, and a stream of another context. Split from test_cuda.c (files stay
// small).
#include "cuda_test.h"
#include "torch/torch.h"

#include <pthread.h>

#include <string.h>

// A thread with no CUDA context that makes the pool call the driver (growth)
// must have none afterwards: the runtime adopts a current context, so one
// left behind would change that thread's current device to the pool's.
typedef struct { nf_pool_t *pool; void *before, *after; int ok; } foreign_t;
static void *foreign_thread(void *arg) {
  foreign_t *f = arg;
  cuCtxGetCurrent(&f->before);
  void *x = nf_alloc(f->pool, 64u << 20, NULL); // new granules: driver calls
  f->ok = x != NULL && nf_free(f->pool, x) == NF_OK;
  cuCtxGetCurrent(&f->after);
  return NULL;
}
void test_pool_foreign_thread(nf_backend_t *be) {
  printf("-- pool: driver calls from a thread with no context leave it with none\n");
  nf_pool_t *pool = NULL;
  nf_config_t cfg;
  nf_config_default(&cfg);
  CHECK(nf_pool_create(&pool, be, &cfg) == NF_OK, "pool: %s", nf_last_error());
  if (!pool) return;
  foreign_t f = {.pool = pool};
  pthread_t t;
  pthread_create(&t, NULL, foreign_thread, &f);
  pthread_join(t, NULL);
  CHECK(f.ok, "alloc/free on the foreign thread: %s", nf_last_error());
  CHECK(f.before == NULL, "a new thread already had a context");
  CHECK(f.after == NULL, "the thread was left with a context (%p)", f.after);
  void *mine = NULL;
  DRV(cuCtxGetCurrent(&mine));
  void *x = nf_alloc(pool, 64u << 20, NULL); // this thread's context stays its own
  void *now = NULL;
  DRV(cuCtxGetCurrent(&now));
  CHECK(x && now == mine, "the calling thread's context changed");
  nf_free(pool, x);
  nf_pool_destroy(pool);
}

// The PyTorch plug-in making its pool on a thread with no context (e.g.
// set_per_process_memory_fraction(f, device=1) before any CUDA work) must
// leave it with none: a bound primary context would make that device the
// thread's current one (cudaGetDevice). nf_backend_cuda_create binds (plain C).
static void *plugin_thread(void *arg) {
  foreign_t *f = arg;
  cuCtxGetCurrent(&f->before);
  f->pool = nf_torch_pool_get(0, 1);
  void *x = f->pool ? nf_alloc(f->pool, 8u << 20, NULL) : NULL;
  f->ok = x != NULL && nf_free(f->pool, x) == NF_OK;
  cuCtxGetCurrent(&f->after);
  return NULL;
}
static void *bind_thread(void *arg) {
  foreign_t *f = arg;
  nf_backend_t *b = NULL;
  cuCtxGetCurrent(&f->before);
  f->ok = nf_backend_cuda_create(&b, 0) == NF_OK;
  cuCtxGetCurrent(&f->after);
  nf_backend_destroy(b);
  return NULL;
}
void test_plugin_pool_unbound(void) {
  printf("-- plug-in: its pool made on a thread with no context leaves it with none\n");
  nf_torch_shutdown();
  foreign_t f = {0}, g = {0};
  pthread_t t;
  pthread_create(&t, NULL, plugin_thread, &f);
  pthread_join(t, NULL);
  CHECK(f.pool && f.ok, "plug-in pool and alloc on a thread with no context: %s", nf_torch_last_error());
  CHECK(f.before == NULL, "a new thread already had a context");
  CHECK(f.after == NULL, "the plug-in left the thread with a context (%p): its current device changed", f.after);
  nf_torch_shutdown();
  pthread_create(&t, NULL, bind_thread, &g);
  pthread_join(t, NULL);
  CHECK(g.ok && g.before == NULL && g.after != NULL, "nf_backend_cuda_create on a bare thread binds its context "
        "(plain C): ok %d, after %p", g.ok, g.after);
}

// A stream of another context (here one this test makes on device 0; in a
// job, another device's stream) is refused by the call that brings it, with
// nothing changed: the pool's events could not be recorded on it.
void test_pool_foreign_stream(nf_backend_t *be) {
  printf("-- pool: a stream of another context is refused when first seen\n");
  nf_pool_t *pool = NULL;
  nf_config_t cfg;
  nf_config_default(&cfg);
  OKP(nf_pool_create(&pool, be, &cfg));
  if (!pool) return;
  void *mine = NULL, *other = NULL;
  CUstream s = NULL, own = NULL;
  DRV(cuCtxGetCurrent(&mine));
  DRV(cuCtxCreate(&other, 0, 0)); // current now
  DRV(cuStreamCreate(&s, 1));
  DRV(cuCtxSetCurrent(mine));
  DRV(cuStreamCreate(&own, 1));
  void *x = nf_alloc(pool, 1u << 20, own);
  CHECK(x != NULL, "alloc on a stream of the primary context: %s", nf_last_error());
  nf_stats_t s0, s1;
  nf_stats_get(pool, &s0);
  void *y = nf_alloc(pool, 1u << 20, s);
  CHECK(y == NULL && nf_last_status() == NF_ERR_INVALID && strstr(nf_last_error(), "another CUDA context"),
        "alloc on another context's stream: %p, %s", y, nf_last_error());
  CHECK(x && nf_record_stream(pool, x, s) == NF_ERR_INVALID, "record_stream with another context's stream accepted");
  nf_stats_get(pool, &s1);
  CHECK(s1.live_blocks == s0.live_blocks && s1.backend_calls == s0.backend_calls, "the refusals changed the pool");
  if (x) CHECK(nf_free(pool, x) == NF_OK, "free: %s", nf_last_error());
  CHECK(nf_pool_check(pool) == NF_OK, "check: %s", nf_last_error());
  nf_pool_destroy(pool);
  DRV(cuStreamDestroy(own));
  DRV(cuCtxSetCurrent(other));
  DRV(cuStreamDestroy(s));
  DRV(cuCtxSetCurrent(mine));
  DRV(cuCtxDestroy(other));
  DRV(cuCtxSetCurrent(mine));
}
