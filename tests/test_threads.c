// Many threads on one pool: every thread keeps its own live set with
// patterns, under a limit tight enough that stitching runs concurrently with
// other threads' fast paths; a second run adds spill, offload and prefetch
// (another thread's call may finish an offload's remap); a third runs that
// with mapping units (units:4: growth, splits, whole-unit offload); a fourth
// passes hot blocks between threads on one stream; a fifth has two threads
// fail ops of one shared backend; a sixth makes a new stream every few steps
// in every thread (slots given back while others allocate); a seventh keeps
// more streams' blocks live than the pool has slots (slots taken, orphans
// freed, offloaded and prefetched concurrently). Run under TSan in CI.
#include "nf_test.h"

#include <pthread.h>
#include <unistd.h>

#define G (64 * 1024)
#define THREADS 4
#define SLOTS 24

static nf_pool_t *pool;
static _Atomic int errors;
static _Atomic int running; // stress workers not finished
static int moves; // the second run: offload/prefetch own blocks too
static int units; // the third: a block over part of a unit is refused (NF_ERR_INVALID)

static void *worker(void *arg) {
  uint64_t rng = (uint64_t)(uintptr_t)arg * 7919 + nft_env_seed(1);
  struct { void *p; size_t n; uint64_t tag; int where; } l[SLOTS] = {{0}};
  nf_stream_t s = (nf_stream_t)arg;
  for (int it = 0; it < 20000; it++) {
    int i = (int)(nft_rand(&rng) % SLOTS);
    if (l[i].p && moves && nft_rand(&rng) % 3 == 0) { // an offloaded block is not touched until prefetched
      if (!l[i].where) {
        uint64_t k = nft_rand(&rng) % 4;
        nf_tier_t t = k == 0 ? NF_TIER_DISK : k == 1 ? NF_TIER_HOST_DETACHED : NF_TIER_HOST;
        nf_status_t st = nf_offload(pool, l[i].p, s, t);
        if (st == NF_OK) l[i].where = t;
        else if (st != NF_ERR_OOM && !(units && st == NF_ERR_INVALID && strstr(nf_last_error(), "mapping unit"))) errors++;
      } else if (nf_prefetch(pool, l[i].p, s) == NF_OK) {
        l[i].where = 0;
        if (!nft_check(l[i].p, l[i].n, l[i].tag)) errors++;
      } else if (nf_last_status() != NF_ERR_OOM) {
        errors++;
      }
      continue;
    }
    if (l[i].p) {
      if (!l[i].where && !nft_check(l[i].p, l[i].n, l[i].tag)) errors++;
      if (nf_free(pool, l[i].p) != NF_OK) errors++;
      l[i].p = NULL;
      continue;
    }
    uint64_t r = nft_rand(&rng);
    size_t n = r % 2 ? 1 + r % 8192 : 1 + r % (6 * G);
    void *p = nf_alloc(pool, n, s);
    if (!p) {
      if (nf_last_status() != NF_ERR_OOM) errors++;
      continue;
    }
    nft_fill(p, n, r);
    l[i].p = p; l[i].n = n; l[i].tag = r; l[i].where = 0;
  }
  for (int i = 0; i < SLOTS; i++)
    if (l[i].p) {
      if (!l[i].where && !nft_check(l[i].p, l[i].n, l[i].tag)) errors++;
      nf_free(pool, l[i].p);
    }
  running--;
  return NULL;
}

static void run_stress(const char *conf) {
  nf_backend_t *be;
  pool = nft_pool(&be, 1ull << 30, G, conf);
  assert_non_null(pool);
  pthread_t t[THREADS];
  running = THREADS;
  for (uintptr_t i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)(i + 1));
  // A reader thread too: stats and the checker take the lock like any call.
  for (int k = 0; k < 20; k++) {
    nf_stats_t st;
    nf_stats_get(pool, &st);
    assert_true(st.mapped <= st.physical + st.host_physical && st.physical <= st.limit);
  }
  // Units: trims give free memory back while the workers run, so that the
  // pool grows again below its limit, where units are made.
  // For as long as they run (a fixed count of trims could end before the
  // workers got going on a loaded machine: a unit count of 20 or fewer).
  for (int k = 0; units && (k < 400 || running > 0); k++) {
    assert_int_equal(nf_trim(pool), NF_OK);
    usleep(500);
  }
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  assert_int_equal(errors, 0);
  assert_int_equal(nf_pool_check(pool), NF_OK);
  nf_stats_t st;
  nf_stats_get(pool, &st);
  assert_int_equal(st.live, 0);
  assert_true(st.reclaims > 0);
  if (moves) assert_true(st.offloads > 100 && st.prefetches > 100 && st.spills > 0);
  if (getenv("NF_DEBUG")) fprintf(stderr, "units made %llu, unmapped %llu, splits %llu, offloads %llu\n",
                                  (unsigned long long)st.units_made, (unsigned long long)st.units_unmapped,
                                  (unsigned long long)st.unit_splits, (unsigned long long)st.offloads);
  if (units) assert_true(st.units_made > 8 && st.units_unmapped > 8); // (27-243 seen; it varies with scheduling)

  nf_pool_destroy(pool);
  uint64_t gr, mp;
  nf_backend_host_usage(be, &gr, &mp);
  assert_int_equal(gr + mp, 0);
  nf_backend_destroy(be);
}

static void test_threads_stress(void **state) {
  (void)state;
  moves = 0;
  run_stress("limit:6MiB,small_max:16KiB");
}

static void test_threads_spill_offload(void **state) {
  (void)state;
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  setenv("NOFRAG_QUIET_OOM", "1", 1);
  moves = 1;
  run_stress("limit:6MiB,small_max:16KiB,spill:host,spill_limit:4MiB");
}

static void test_threads_units(void **state) {
  (void)state;
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  setenv("NOFRAG_QUIET_OOM", "1", 1);
  moves = 1;
  units = 1;
  run_stress("limit:6MiB,small_max:16KiB,spill:host,spill_limit:4MiB,units:4");
  units = 0;
}

// The hot pair across threads: all on one stream, so a block one thread
// frees is the next one another takes back (pool.c, p->hot). Sizes differ by
// thread but share one rounded size: nf_free_ex must report the size of the
// block it freed, read before another thread re-allocates it, and no two
// threads may hold one block (each checks its pattern before the free). Run
// under TSan in CI.
static void *pair_worker(void *arg) {
  size_t n = 1024 - (size_t)(uintptr_t)arg; // 1023..1020: one 1 KiB block size
  for (int it = 0; it < 50000; it++) {
    void *p = nf_alloc(pool, n, NULL);
    if (!p) { errors++; continue; }
    nft_fill(p, n, (uint64_t)it * 31 + n);
    size_t got = 0;
    if (!nft_check(p, n, (uint64_t)it * 31 + n)) errors++;
    if (nf_free_ex(pool, p, &got, 0) != NF_OK || got != n) errors++;
  }
  return NULL;
}

static void test_threads_hot_pair(void **state) {
  (void)state;
  nf_backend_t *be;
  pool = nft_pool(&be, 1ull << 30, G, "limit:64MiB");
  assert_non_null(pool);
  errors = 0;
  pthread_t t[THREADS];
  for (uintptr_t i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, pair_worker, (void *)i);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  assert_int_equal(errors, 0);
  assert_int_equal(nf_pool_check(pool), NF_OK);
  assert_int_equal(nft_stats_of(pool).live, 0);
  nf_pool_destroy(pool);
  nf_backend_destroy(be);
}

// The hot pair while another thread moves the limit (nf_set_limit): the
// allocation's "larger than the whole limit" test reads the limit under the
// pool lock, where nf_set_limit writes it (TSan once saw the read outside).
// Every request (1 KiB) fits every limit set here, so none may fail.
static _Atomic int limit_stop;
static void *limit_mover(void *arg) {
  (void)arg;
  for (uint64_t k = 0; !limit_stop; k++)
    if (nf_set_limit(pool, (k & 1 ? 48ull : 64ull) << 20) != NF_OK) errors++;
  return NULL;
}

static void test_threads_set_limit(void **state) {
  (void)state;
  nf_backend_t *be;
  pool = nft_pool(&be, 1ull << 30, G, "limit:64MiB");
  assert_non_null(pool);
  errors = 0;
  limit_stop = 0;
  pthread_t t[THREADS], m;
  pthread_create(&m, NULL, limit_mover, NULL);
  for (uintptr_t i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, pair_worker, (void *)i);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  limit_stop = 1;
  pthread_join(m, NULL);
  assert_int_equal(errors, 0);
  assert_int_equal(nf_pool_check(pool), NF_OK);
  nf_pool_destroy(pool);
  nf_backend_destroy(be);
}

// Pools sharing one backend run its ops under their own locks: each thread's
// failed op must leave that thread's message (nf__backend_err), which one
// backend-wide buffer did not (another thread's failure overwrote it between
// the op and the read; TSan: a race on it).
static nf_backend_t *shared_be;
static void *err_worker(void *arg) {
  uintptr_t va = ((uintptr_t)arg + 1) << 40; // reserved by no one: every unmap fails
  char want[64];
  snprintf(want, sizeof want, "%#lx", (unsigned long)va);
  for (int k = 0; k < 20000; k++) {
    if (shared_be->ops->unmap(shared_be, va, G) == NF_OK || !strstr(nf__backend_err(), want)) {
      errors++;
      break;
    }
  }
  return NULL;
}

static void test_threads_backend_errors(void **state) {
  (void)state;
  assert_int_equal(nf_backend_host_create(&shared_be, 1ull << 30, G), NF_OK);
  errors = 0;
  pthread_t t[2];
  for (uintptr_t i = 0; i < 2; i++) pthread_create(&t[i], NULL, err_worker, (void *)i);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  assert_int_equal(errors, 0);
  nf_backend_destroy(shared_be);
}

// Threads each making a new stream per step (a CuPy stream per step): the
// pool gives slots back (streams_recycle walks every chunk's blocks under
// the lock) while other threads allocate, free and check their blocks on
// their own current streams. Every thread keeps blocks live on older streams
// of its own, so slots stay named across the recycles.
static void *stream_worker(void *arg) {
  uintptr_t id = (uintptr_t)arg;
  uint64_t rng = id * 104729 + nft_env_seed(3);
  struct { void *p; size_t n; uint64_t tag; } l[8] = {{0}};
  for (int it = 0; it < 1500; it++) {
    nf_stream_t s = (nf_stream_t)(uintptr_t)(0x100000 * (id + 1) + (uintptr_t)(it / 3)); // a new stream every 3 steps
    int i = (int)(nft_rand(&rng) % 8);
    if (l[i].p) {
      if (!nft_check(l[i].p, l[i].n, l[i].tag)) errors++;
      if (nf_free(pool, l[i].p) != NF_OK) errors++;
      l[i].p = NULL;
    }
    size_t n = 512 + (size_t)(nft_rand(&rng) % (3 * G));
    void *p = nf_alloc(pool, n, s);
    if (!p) { errors++; continue; }
    l[i].p = p;
    l[i].n = n;
    l[i].tag = id * 1000003 + (uint64_t)it;
    nft_fill(p, n, l[i].tag);
  }
  for (int i = 0; i < 8; i++)
    if (l[i].p) {
      if (!nft_check(l[i].p, l[i].n, l[i].tag)) errors++;
      nf_free(pool, l[i].p);
    }
  return NULL;
}

static void test_threads_many_streams(void **state) {
  (void)state;
  nf_backend_t *be;
  pool = nft_pool(&be, 1ull << 30, G, "limit:256MiB");
  assert_non_null(pool);
  errors = 0;
  pthread_t t[THREADS];
  for (uintptr_t i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, stream_worker, (void *)i);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  assert_int_equal(errors, 0);
  assert_int_equal(nf_pool_check(pool), NF_OK);
  assert_int_equal(nft_stats_of(pool).live, 0);
  assert_int_equal(nf_stream_known(pool, (nf_stream_t)(uintptr_t)0x100000), 0); // given back long ago
  nf_pool_destroy(pool);
  nf_backend_destroy(be);
}

// Threads whose live blocks name more streams than a pool has slots (4 x 24
// streams): slots are taken from streams that only live blocks name, their
// blocks become orphans, and other threads free, offload and prefetch their
// own orphans (each takes a slot again) while the steals go on. The first
// round fills every thread's 24 slots on 24 streams of its own: with 96 live
// streams and no record_stream yet, no allocation may be refused. Then
// random frees, allocations on the slot's stream or a new one,
// record_stream on another of the thread's streams, offload and prefetch;
// refusals are NF_ERR_UNSUPPORTED (every slot named otherwise) or OOM only.
static _Atomic int refused;
static pthread_barrier_t filled; // every thread's first round done: 96 streams live at once
// Slot i's stream in generation gen of the thread whose streams start at base.
static nf_stream_t steal_stream(uintptr_t base, int i, uintptr_t gen) {
  return (nf_stream_t)(base + (uintptr_t)(i % SLOTS) + SLOTS * gen);
}
static void *steal_worker(void *arg) {
  uintptr_t id = (uintptr_t)arg;
  uint64_t rng = id * 7927 + nft_env_seed(5);
  struct { void *p; size_t n; uint64_t tag; int away; } l[SLOTS] = {{0}};
  uintptr_t base = 0x300000 * (id + 1), gen = 0;
  for (int i = 0; i < SLOTS; i++) { // the first round: 24 streams of this thread, all live
    size_t n = 512 + (size_t)(nft_rand(&rng) % (2 * G));
    l[i].p = nf_alloc(pool, n, steal_stream(base, i, 0));
    if (!l[i].p) { errors++; continue; }
    l[i].n = n; l[i].tag = rng; nft_fill(l[i].p, n, l[i].tag);
  }
  pthread_barrier_wait(&filled);
  for (int it = 0; it < 3000; it++) {
    int i = (int)(nft_rand(&rng) % SLOTS);
    nf_stream_t s = steal_stream(base, i, gen);
    uint64_t k = nft_rand(&rng) % 8;
    if (!l[i].p) {
      if (k == 0) gen++; // now and then a new stream for the slot: the slots churn
      size_t n = 512 + (size_t)(nft_rand(&rng) % (2 * G));
      void *p = nf_alloc(pool, n, steal_stream(base, i, gen));
      if (!p) { nf_status_t st = nf_last_status(); if (st == NF_ERR_UNSUPPORTED || st == NF_ERR_OOM) refused++; else errors++; continue; }
      l[i].p = p; l[i].n = n; l[i].tag = rng; l[i].away = 0; nft_fill(p, n, l[i].tag);
    } else if (k == 1 && !l[i].away) { // another of this thread's streams uses it too
      nf_status_t st = nf_record_stream(pool, l[i].p, steal_stream(base, i + 1, gen));
      if (st == NF_ERR_UNSUPPORTED) refused++; else if (st != NF_OK) errors++;
    } else if (k == 2 && !l[i].away) {
      nf_status_t st = nf_offload(pool, l[i].p, s, nft_rand(&rng) % 2 ? NF_TIER_HOST : NF_TIER_HOST_DETACHED);
      if (st == NF_OK) l[i].away = 1; else if (st == NF_ERR_UNSUPPORTED || st == NF_ERR_OOM) refused++; else errors++;
    } else if (k == 3 && l[i].away) {
      nf_status_t st = nf_prefetch(pool, l[i].p, s);
      if (st == NF_OK) { l[i].away = 0; if (!nft_check(l[i].p, l[i].n, l[i].tag)) errors++; }
      else if (st == NF_ERR_UNSUPPORTED || st == NF_ERR_OOM) refused++; else errors++;
    } else if (k >= 4) {
      if (!l[i].away && !nft_check(l[i].p, l[i].n, l[i].tag)) errors++;
      if (nf_free(pool, l[i].p) != NF_OK) errors++;
      l[i].p = NULL;
    }
  }
  for (int i = 0; i < SLOTS; i++)
    if (l[i].p) {
      if (!l[i].away && !nft_check(l[i].p, l[i].n, l[i].tag)) errors++;
      if (nf_free(pool, l[i].p) != NF_OK) errors++;
    }
  return NULL;
}

static void test_threads_steal_slots(void **state) {
  (void)state;
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  setenv("NOFRAG_QUIET_OOM", "1", 1);
  nf_backend_t *be;
  pool = nft_pool(&be, 1ull << 30, G, "limit:64MiB,spill:host,spill_limit:16MiB");
  assert_non_null(pool);
  errors = 0;
  refused = 0;
  pthread_barrier_init(&filled, NULL, THREADS);
  pthread_t t[THREADS];
  for (uintptr_t i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, steal_worker, (void *)i);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&filled);
  print_message("   %d refused (every slot named otherwise, or no room)\n", (int)refused);
  assert_int_equal(errors, 0);
  assert_int_equal(nf_offload_wait(pool), NF_OK);
  assert_int_equal(nf_pool_check(pool), NF_OK);
  assert_int_equal(nft_stats_of(pool).live, 0);
  nf_pool_destroy(pool);
  nft_usage_is(be, 0, 0); // nothing left behind
  nf_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_threads_backend_errors),
                                     cmocka_unit_test(test_threads_many_streams),
                                     cmocka_unit_test(test_threads_steal_slots),
                                     cmocka_unit_test(test_threads_set_limit),
                                     cmocka_unit_test(test_threads_stress),
                                     cmocka_unit_test(test_threads_spill_offload),
                                     cmocka_unit_test(test_threads_units),
                                     cmocka_unit_test(test_threads_hot_pair)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
