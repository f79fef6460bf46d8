// The pool lock (src/base/lock.c): a spin lock biased towards the thread that
// takes it most. Mutual exclusion across bias grants and revocations (an
// occupancy word that a second thread inside would find set), the bias
// lifecycle (granted after a run, revoked by another thread, run doubled),
// trylock never waiting for an owner inside, slots of exited threads, fork,
// nesting, and a pool's blocks keeping their patterns while two threads take
// turns in long bursts. Where membarrier(2) is unavailable no bias is
// granted; the tests that need one say so and check the plain lock instead.
#include "nf_test.h"

#include "base/base.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static bool held_fast(nf_lock_t *l) { return nf__lk_me && atomic_load(&nf__lk_me->held) == (void *)l; }
static nf_lkslot_t *bias_of(nf_lock_t *l) { return atomic_load(&l->bias); }
// Take and release l n times in a row (300: past the run that earns the bias).
static void take(nf_lock_t *l, int n) {
  for (int i = 0; i < n; i++) {
    nf__lock(l);
    nf__unlock(l);
  }
}

static void test_bias_granted_after_run(void **state) {
  (void)state;
  nf_lock_t l = {0};
  take(&l, 255);
  assert_null(bias_of(&l)); // one short of the run
  take(&l, 1);
  if (!nf__lock_biasable()) {
    assert_null(bias_of(&l));
    skip();
  }
  assert_non_null(nf__lk_me);
  assert_ptr_equal(bias_of(&l), nf__lk_me);
  nf__lock(&l); // the owner enters without the spin lock
  assert_true(held_fast(&l));
  assert_int_equal(atomic_load(&l.v), 0);
  nf__unlock(&l);
  assert_false(held_fast(&l));
}

// Threads take the lock in bursts of random length, so that biases are
// granted, used and revoked all the time; inside, each checks that nobody
// else is.
enum { XT = 4, XROUNDS = 300 };
static nf_lock_t xl;
static _Atomic int occ, overlaps;
static _Atomic long fast_entries, slow_entries;
static long counter;

static void *exclusion_worker(void *arg) {
  uint64_t rng = (uint64_t)(uintptr_t)arg * 104729 + nft_env_seed(3);
  long fast = 0, slow = 0;
  for (int r = 0; r < XROUNDS; r++) {
    int burst = 1 + (int)(nft_rand(&rng) % 1500);
    for (int i = 0; i < burst; i++) {
      nf__lock(&xl);
      if (atomic_exchange(&occ, 1)) overlaps++;
      if (held_fast(&xl)) fast++;
      else slow++;
      // Now and then stay inside a while: a revoker must find the owner in.
      if ((i & 255) == 0)
        for (volatile int w = 0; w < 20000; w++) {}
      // Keep biases cheap to earn, so that grants and revocations go on all run.
      if (++counter % 2000 == 0) xl.need = 16;
      atomic_store(&occ, 0);
      nf__unlock(&xl);
    }
    if (nft_rand(&rng) % 4 == 0) sched_yield();
  }
  fast_entries += fast;
  slow_entries += slow;
  return NULL;
}

static void test_mutual_exclusion(void **state) {
  (void)state;
  pthread_t t[XT];
  for (int i = 0; i < XT; i++) assert_int_equal(pthread_create(&t[i], NULL, exclusion_worker, (void *)(uintptr_t)(i + 1)), 0);
  for (int i = 0; i < XT; i++) pthread_join(t[i], NULL);
  assert_int_equal(overlaps, 0);
  assert_int_equal(counter, fast_entries + slow_entries);
  print_message("entries: %ld with a bias, %ld through the spin lock; run now %u\n", (long)fast_entries,
                (long)slow_entries, xl.need);
  assert_true(slow_entries > 0);
  if (nf__lock_biasable()) assert_true(fast_entries > 0); // both paths ran
}

// Another thread's bias: revoked by the next taker, and the next run is longer.
static nf_lock_t rl;
static void *take_run(void *arg) {
  take(&rl, (int)(intptr_t)arg);
  return (void *)nf__lk_me;
}

static void test_revocation(void **state) {
  (void)state;
  if (!nf__lock_biasable()) skip();
  pthread_t t;
  void *slot;
  assert_int_equal(pthread_create(&t, NULL, take_run, (void *)(intptr_t)300), 0);
  pthread_join(t, &slot);
  assert_non_null(slot);
  // The owner exited: its slot is free, the lock still names it.
  assert_ptr_equal(bias_of(&rl), slot);
  nf__lock(&rl);
  assert_false(held_fast(&rl));
  assert_null(bias_of(&rl));
  nf__unlock(&rl);
  assert_int_equal(rl.need, 512);
  // 300 in a row no longer earn it; 512 do.
  assert_int_equal(pthread_create(&t, NULL, take_run, (void *)(intptr_t)300), 0);
  pthread_join(t, NULL);
  assert_null(bias_of(&rl));
  assert_int_equal(pthread_create(&t, NULL, take_run, (void *)(intptr_t)600), 0);
  pthread_join(t, &slot);
  assert_non_null(bias_of(&rl));
}

// The owner inside its biased lock for a while: another thread's lock must
// wait for it to leave.
static nf_lock_t wl;
static _Atomic int wl_inside, wl_left;
static void *owner_stays(void *arg) {
  (void)arg;
  take(&wl, 300);
  nf__lock(&wl);
  wl_inside = held_fast(&wl) ? 1 : 2;
  struct timespec ts = {0, 50 * 1000 * 1000};
  nanosleep(&ts, NULL);
  wl_left = 1;
  nf__unlock(&wl);
  return NULL;
}

static void test_revoker_waits_for_owner(void **state) {
  (void)state;
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, owner_stays, NULL), 0);
  while (!wl_inside) sched_yield();
  if (nf__lock_biasable()) assert_int_equal(wl_inside, 1); // inside through its bias
  nf__lock(&wl);
  assert_int_equal(wl_left, 1);
  nf__unlock(&wl);
  pthread_join(t, NULL);
}

// A bias that was used enough to pay for its revocation: the next run is
// the first one again, however many revocations came before.
static void test_paid_bias_resets_run(void **state) {
  (void)state;
  if (!nf__lock_biasable()) skip();
  pthread_t t;
  rl.need = 1 << 12; // as after four revocations that did not pay
  assert_int_equal(pthread_create(&t, NULL, take_run, (void *)(intptr_t)((1 << 12) + 5000)), 0);
  pthread_join(t, NULL);
  assert_non_null(bias_of(&rl)); // earned at 4096, then used ~5000 times
  nf__lock(&rl);
  assert_null(bias_of(&rl));
  nf__unlock(&rl);
  assert_int_equal(rl.need, 256);
}

// trylock (the recorder's flush at exit) must not wait for an owner inside.
static nf_lock_t tl;
static _Atomic int tl_inside, tl_release;
static void *hold_biased(void *arg) {
  (void)arg;
  take(&tl, 300);
  nf__lock(&tl);
  tl_inside = held_fast(&tl) ? 1 : 2;
  while (!tl_release) sched_yield();
  nf__unlock(&tl);
  return NULL;
}

static void test_trylock_does_not_wait(void **state) {
  (void)state;
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, hold_biased, NULL), 0);
  while (!tl_inside) sched_yield();
  assert_false(nf__trylock(&tl)); // the holder is inside, biased or not
  if (tl_inside == 1) assert_null(bias_of(&tl)); // revoked on the way
  tl_release = 1;
  pthread_join(t, NULL);
  assert_true(nf__trylock(&tl));
  nf__unlock(&tl);
  assert_int_equal(atomic_load(&tl.v), 0);
}

// A thread inside one biased lock takes another through the spin lock.
static void test_nested(void **state) {
  (void)state;
  nf_lock_t a = {0}, b = {0};
  for (int i = 0; i < 300; i++) {
    nf__lock(&a);
    nf__unlock(&a);
    nf__lock(&b);
    nf__unlock(&b);
  }
  nf__lock(&a);
  nf__lock(&b);
  assert_int_equal(atomic_load(&b.v), 1); // the slot was busy with a
  if (nf__lock_biasable()) assert_true(held_fast(&a));
  nf__unlock(&b);
  assert_int_equal(atomic_load(&b.v), 0);
  nf__unlock(&a);
  assert_int_equal(atomic_load(&a.v), 0);
  assert_false(held_fast(&a));
}

// The child of a fork keeps working with a lock biased in the parent, and a
// pool made there.
static void test_fork(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 64 << 20, 1 << 20, NULL);
  assert_non_null(p);
  for (int i = 0; i < 1000; i++) assert_int_equal(nf_free(p, nf_alloc(p, 512, NULL)), NF_OK);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    int bad = 0;
    pthread_t t;
    for (int i = 0; i < 1000; i++) bad += nf_free(p, nf_alloc(p, 512, NULL)) != NF_OK;
    // another thread of the child revokes the bias and takes over
    bad += pthread_create(&t, NULL, take_run, (void *)(intptr_t)1000) != 0;
    pthread_join(t, NULL);
    for (int i = 0; i < 1000; i++) bad += nf_free(p, nf_alloc(p, 512, NULL)) != NF_OK;
    _exit(bad ? 1 : 0);
  }
  int ws = 0;
  assert_int_equal(waitpid(pid, &ws, 0), pid);
  assert_true(WIFEXITED(ws));
  assert_int_equal(WEXITSTATUS(ws), 0);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// A destructor that runs after the lock's own at thread exit (a later
// pthread key) and calls in again: the thread's old slot, already handed on,
// must not be used (two threads on one slot would both be owners).
static nf_lock_t dl;
static pthread_key_t late_key;
static _Atomic int late_saw_slot = -1, late_ok;
static void late_dtor(void *v) {
  (void)v;
  late_saw_slot = nf__lk_me != NULL;
  nf__lock(&dl);
  nf__unlock(&dl);
  late_ok = 1;
}
static void *exits_with_late_dtor(void *arg) {
  (void)arg;
  take(&dl, 300); // the lock's key now exists (created on first use), and the bias
  pthread_setspecific(late_key, (void *)1);
  return NULL;
}

static void test_slot_after_thread_exit(void **state) {
  (void)state;
  nf__lock_biasable(); // the lock's key first: destructors run in key order
  assert_int_equal(pthread_key_create(&late_key, late_dtor), 0);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, exits_with_late_dtor, NULL), 0);
  pthread_join(t, NULL);
  assert_int_equal(late_ok, 1);
  assert_int_equal(late_saw_slot, 0);
  nf__lock(&dl); // revokes whatever bias is left, and works
  nf__unlock(&dl);
  assert_int_equal(atomic_load(&dl.v), 0);
  pthread_key_delete(late_key);
}

// Re-entering a lock held through the bias (a signal handler calling into
// nofrag) aborts with a message instead of running two critical sections.
static void test_reentry_aborts(void **state) {
  (void)state;
  if (!nf__lock_biasable()) skip();
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    nf_lock_t l = {0};
    take(&l, 300);
    nf__lock(&l);
    freopen("/dev/null", "w", stderr);
    nf__lock(&l);
    _exit(0); // not reached
  }
  int ws = 0;
  assert_int_equal(waitpid(pid, &ws, 0), pid);
  assert_true(WIFSIGNALED(ws));
  assert_int_equal(WTERMSIG(ws), SIGABRT);
}

// A pool shared by two threads that take turns in long bursts: each burst
// earns the bias, the other thread's first call revokes it. Every live block
// keeps its pattern and nf_pool_check holds after every turn.
enum { PT = 2, TURNS = 40, PSLOTS = 32 };
static nf_pool_t *pp;
static _Atomic int turn, pool_errors;
static void *pool_turns(void *arg) {
  int me = (int)(intptr_t)arg;
  uint64_t rng = (uint64_t)me * 7777 + nft_env_seed(5);
  struct { void *p; size_t n; uint64_t tag; } l[PSLOTS] = {{0}};
  for (int k = 0; k < TURNS; k++) {
    while (atomic_load(&turn) % PT != me) sched_yield();
    int ops = 300 + (int)(nft_rand(&rng) % 2000);
    for (int o = 0; o < ops; o++) {
      int i = (int)(nft_rand(&rng) % PSLOTS);
      if (l[i].p) {
        if (!nft_check(l[i].p, l[i].n, l[i].tag)) pool_errors++;
        if (nf_free(pp, l[i].p) != NF_OK) pool_errors++;
        l[i].p = NULL;
      } else {
        l[i].n = 512u << (nft_rand(&rng) % 8);
        l[i].tag = nft_rand(&rng);
        if (!(l[i].p = nf_alloc(pp, l[i].n, NULL))) { pool_errors++; continue; }
        nft_fill(l[i].p, l[i].n, l[i].tag);
      }
    }
    if (nf_pool_check(pp) != NF_OK) pool_errors++;
    atomic_fetch_add(&turn, 1);
  }
  for (int i = 0; i < PSLOTS; i++)
    if (l[i].p) {
      if (!nft_check(l[i].p, l[i].n, l[i].tag)) pool_errors++;
      nf_free(pp, l[i].p);
    }
  return NULL;
}

static void test_pool_threads_take_turns(void **state) {
  (void)state;
  nf_backend_t *be;
  pp = nft_pool(&be, 256 << 20, 1 << 20, NULL);
  assert_non_null(pp);
  pthread_t t[PT];
  for (int i = 0; i < PT; i++) assert_int_equal(pthread_create(&t[i], NULL, pool_turns, (void *)(intptr_t)i), 0);
  for (int i = 0; i < PT; i++) pthread_join(t[i], NULL);
  assert_int_equal(pool_errors, 0);
  nf_stats_t s;
  nf_stats_get(pp, &s);
  assert_int_equal(s.live, 0);
  assert_int_equal(s.allocs, s.frees);
  nf_pool_destroy(pp);
  nf_backend_destroy(be);
}

// NOFRAG_NO_LOCK_BIAS=1: no bias is ever granted (checked in a child that
// starts with it set, as the choice is made once per process).
static void test_env_disables_bias(void **state) {
  (void)state;
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  assert_true(n > 0);
  exe[n] = 0;
  pid_t pid = fork();
  if (pid == 0) {
    setenv("NOFRAG_NO_LOCK_BIAS", "1", 1);
    setenv("NFT_LOCK_CHILD", "1", 1);
    execl(exe, exe, (char *)NULL);
    _exit(3);
  }
  int ws = 0;
  assert_int_equal(waitpid(pid, &ws, 0), pid);
  assert_true(WIFEXITED(ws));
  assert_int_equal(WEXITSTATUS(ws), 0);
}

static int env_child(void) {
  nf_lock_t l = {0};
  take(&l, 2000);
  return !nf__lock_biasable() && bias_of(&l) == NULL && atomic_load(&l.v) == 0 ? 0 : 1;
}

int main(void) {
  if (getenv("NFT_LOCK_CHILD")) return env_child();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bias_granted_after_run), cmocka_unit_test(test_mutual_exclusion),
      cmocka_unit_test(test_revocation),             cmocka_unit_test(test_revoker_waits_for_owner),
      cmocka_unit_test(test_paid_bias_resets_run),
      cmocka_unit_test(test_trylock_does_not_wait),
      cmocka_unit_test(test_nested),                 cmocka_unit_test(test_fork),
      cmocka_unit_test(test_reentry_aborts),         cmocka_unit_test(test_slot_after_thread_exit),
      cmocka_unit_test(test_pool_threads_take_turns), cmocka_unit_test(test_env_disables_bias),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
