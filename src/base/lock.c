// The pool lock's slow paths (base.h): the spin lock, and the bias a thread
// earns by taking the lock many times in a row, which lets it enter with no
// atomic read-modify-write. A thread that wants the lock while another holds
// the bias revokes it: it clears the bias, runs membarrier(2) so that the
// owner's "I am inside" store (which skips the CPU fence) is visible or the
// owner sees the revocation, and waits for the owner to leave.
#include "base.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

_Thread_local nf_lkslot_t *nf__lk_me;

enum { RUN_FIRST = 256, RUN_MAX = 1u << 20, PAID = 4096 };

static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool bias_ok;   // membarrier works here: biases may be granted
static bool slots_ok;  // the thread-exit hook that recycles slots exists
static pthread_key_t slot_key;
static pthread_mutex_t slot_mu = PTHREAD_MUTEX_INITIALIZER;
static nf_lkslot_t *slot_free;

static long membarrier(int cmd) { return syscall(__NR_membarrier, cmd, 0, 0); }

// A thread exits outside every lock: its slot can serve the next thread,
// biases included (the protocol needs one thread per slot at a time, not
// the same thread).
static void slot_put(void *v) {
  nf_lkslot_t *s = v;
  // The exiting thread may still call in from a later destructor: it must
  // take a new slot then, not use this one alongside the next owner.
  if (nf__lk_me == s) nf__lk_me = NULL;
  pthread_mutex_lock(&slot_mu);
  s->next = slot_free;
  slot_free = s;
  pthread_mutex_unlock(&slot_mu);
}

// The registration belongs to the address space: a child made by fork (or
// by a raw clone(2), which runs no handler) inherits it with the copied
// memory, and only exec clears it (checked on Linux 6.18). Registering again
// costs nothing; where it fails no new bias is granted, and revocations fall
// back on MEMBARRIER_CMD_GLOBAL.
static void after_fork_child(void) {
  if (bias_ok) bias_ok = membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
}

static void lock_init(void) {
  slots_ok = pthread_key_create(&slot_key, slot_put) == 0;
  long q = membarrier(MEMBARRIER_CMD_QUERY);
  bias_ok = slots_ok && !nf__env_on("NOFRAG_NO_LOCK_BIAS") && q > 0 && (q & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
            membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 &&
            pthread_atfork(NULL, NULL, after_fork_child) == 0;
}

bool nf__lock_biasable(void) {
  pthread_once(&once, lock_init);
  return bias_ok;
}

// This thread's slot: its identity for the run count, and where it says
// which biased lock it is inside.
static void slot_get(void) {
  pthread_once(&once, lock_init);
  if (!slots_ok) return;
  pthread_mutex_lock(&slot_mu);
  nf_lkslot_t *s = slot_free;
  if (s) slot_free = s->next;
  pthread_mutex_unlock(&slot_mu);
  if (!s && !(s = calloc(1, sizeof *s))) return;
  if (pthread_setspecific(slot_key, s) != 0) {
    slot_put(s);
    return;
  }
  nf__lk_me = s;
}

static void relax(unsigned spins) {
  if (spins > 64) sched_yield();
#if defined(__x86_64__) || defined(__i386__)
  else __builtin_ia32_pause();
#endif
}

static void barrier_all(void) {
  if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 && membarrier(MEMBARRIER_CMD_GLOBAL) != 0) {
    // Unreachable where a bias could be granted; going on could let two threads in.
    fprintf(stderr, "nofrag: membarrier failed while revoking a lock bias; aborting\n");
    abort();
  }
}

// Under v: clear the bias. Once this returns, its owner either is inside
// already (its slot names l) or will see no bias and take v.
static void bias_clear(nf_lock_t *l) {
  atomic_store_explicit(&l->bias, NULL, memory_order_relaxed);
  barrier_all();
}

// Under v: take the bias away from slot b and wait until its thread is out.
static void bias_revoke(nf_lock_t *l, nf_lkslot_t *b) {
  bias_clear(l);
  for (unsigned spins = 0; atomic_load_explicit(&b->held, memory_order_acquire) == (void *)l; spins++) relax(spins);
  // A bias saves ~5 ns an entry and a revocation costs a membarrier (1 us
  // alone, more with threads running): one used fewer than PAID times since
  // its grant did not pay, so the next costs a longer run (two threads taking
  // turns soon stop paying for revocations); one that paid resets the run.
  // (`biased` counts the owner's entries through all its biased locks.)
  uint64_t used = atomic_load_explicit(&b->biased, memory_order_relaxed) - l->granted_at;
  if (used >= PAID) l->need = RUN_FIRST;
  else if (l->need < RUN_MAX) l->need *= 2;
}

// Under v, when the inline path's bookkeeping does not suffice: revoke
// another thread's bias, start a run for a new thread, or grant the bias at
// the end of a run.
void nf__lock_took(nf_lock_t *l) {
  nf_lkslot_t *me = nf__lk_me, *b = atomic_load_explicit(&l->bias, memory_order_relaxed);
  // First, so that everything below happens after the owner has left (a
  // holder through the bias may write what v guards, as a v holder may).
  if (b && b != me) bias_revoke(l, b);
  // This thread is inside through its bias and took v too: it re-entered the
  // lock (a signal handler calling into nofrag). A plain spin lock would hang
  // here; going on would run two critical sections at once.
  if (NF_UNLIKELY(b && b == me && atomic_load_explicit(&me->held, memory_order_relaxed) == (void *)l)) {
    fprintf(stderr, "nofrag: a pool lock was re-entered by the thread holding it (a signal handler calling "
                    "into nofrag?); aborting\n");
    abort();
  }
  if (!l->need) l->need = bias_ok ? RUN_FIRST : UINT32_MAX;
  if (l->last != me) {
    l->last = me;
    l->run = 1;
  } else if (!b && me && l->run >= l->need) {
    l->granted_at = atomic_load_explicit(&me->biased, memory_order_relaxed);
    atomic_store_explicit(&l->bias, me, memory_order_release); // granted from the next lock on
    l->run = 0;
  }
}

void nf__lock_slow(nf_lock_t *l) {
  if (!nf__lk_me) slot_get();
  for (unsigned spins = 0;; spins++) {
    if (!atomic_load_explicit(&l->v, memory_order_relaxed) &&
        !atomic_exchange_explicit(&l->v, 1, memory_order_acquire))
      break;
    relax(spins);
  }
  nf__lock_took(l);
}

// Never waits for a holder (rec_atexit: a thread may hold the lock forever
// at exit). A bias owner found inside keeps the lock: revoked, then false.
bool nf__trylock(nf_lock_t *l) {
  nf_lkslot_t *me = nf__lk_me;
  if (me && atomic_load_explicit(&l->bias, memory_order_relaxed) == me && !atomic_load_explicit(&me->held, memory_order_relaxed)) {
    nf__lock(l);
    return true;
  }
  if (atomic_exchange_explicit(&l->v, 1, memory_order_acquire)) return false;
  nf_lkslot_t *b = atomic_load_explicit(&l->bias, memory_order_relaxed);
  if (b && b != me) { // as bias_revoke, without waiting for the owner to leave
    bias_clear(l);
    if (atomic_load_explicit(&b->held, memory_order_acquire) == (void *)l) {
      atomic_store_explicit(&l->v, 0, memory_order_release);
      return false;
    }
  }
  return true;
}
