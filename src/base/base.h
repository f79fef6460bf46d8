// The bottom layer: what every other layer of libnofrag uses and nothing of
// theirs. Thread-local error state (nf__error), the byte formatter, the spin
// lock and branch hints. Depends on the public header only.
#ifndef NF_BASE_H
#define NF_BASE_H

#include "nofrag.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define NF_LIKELY(x) __builtin_expect(!!(x), 1)
#define NF_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define NF_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define NF_NOINLINE __attribute__((noinline))
#define NF_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define NF_LIKELY(x) (x)
#define NF_UNLIKELY(x) (x)
#define NF_PRINTF(f, a)
#define NF_NOINLINE
#define NF_ALWAYS_INLINE inline
#endif

// Sets this thread's status and message (nf_last_status / nf_last_error) and
// returns `st`. Messages start with "nofrag: " and say what to do where they can.
nf_status_t nf__error(nf_status_t st, const char *fmt, ...) NF_PRINTF(2, 3);
// Clears this thread's status (a call that succeeded).
void nf__error_clear(void);
// A message quoted inside another, without its own "nofrag: " prefix.
static inline const char *nf__unprefixed(const char *m) { return strncmp(m, "nofrag: ", 8) == 0 ? m + 8 : m; }

// "2.000 TiB", "1.500 GiB", "3.000 MiB", "512 B": the one byte formatter of the library,
// the plug-in and the tools.
void nf__fmt_bytes(char *buf, size_t n, uint64_t bytes);

// An on/off environment variable (NOFRAG_QUIET_OOM, ...): on when set,
// non-empty and not "0", so that VAR=0 means off for every one of them.
bool nf__env_on(const char *name);

// The pool lock (lock.c): a test-and-test-and-set spin lock with yield (the
// critical sections are tens of nanoseconds, where a futex mutex would
// double the cost of a cached pair), biased towards the thread that uses it.
// A thread that took it 256 times in a row is granted the bias (a revocation
// that came before the bias paid for it doubles that run, so two threads
// taking turns soon stop paying for it):
// it then enters with plain stores and loads, no atomic read-modify-write
// (its two exchanges were 11 ns of a 27 ns cached alloc+free pair). Any other thread
// takes the spin lock, revokes the bias and waits for the owner to leave;
// a membarrier(2) on that rare path stands in for the fence the owner's
// path leaves out (an asymmetric Dekker lock, as in userspace RCU). Where
// membarrier is missing (old kernels, some seccomp profiles) no bias is ever
// granted and every thread takes the spin lock.
typedef struct nf_lkslot nf_lkslot_t; // one per thread that has taken a lock (lock.c)
struct nf_lkslot {
  _Atomic(void *) held;     // the biased lock this thread is inside (a nested one takes v)
  _Atomic(uint64_t) biased; // entries through a bias (written by its thread only: no RMW)
  nf_lkslot_t *next;        // free list (lock.c)
};
typedef struct {
  atomic_int v;                // the spin lock
  _Atomic(nf_lkslot_t *) bias; // the thread that may enter without v; NULL: none
  nf_lkslot_t *last;           // under v: the thread that held v last, and
  uint32_t run, need;          // how many times in a row; the run that earns the bias (0: not set yet)
  uint64_t granted_at;         // under v: the owner's `biased` count when granted
} nf_lock_t;
extern _Thread_local nf_lkslot_t *nf__lk_me;
void nf__lock_slow(nf_lock_t *l);
void nf__lock_took(nf_lock_t *l);
bool nf__trylock(nf_lock_t *l);
bool nf__lock_biasable(void); // membarrier works here (tests: whether a bias is ever granted)

static inline void nf__lock(nf_lock_t *l) {
  nf_lkslot_t *me = nf__lk_me;
  if (NF_LIKELY(me != NULL)) {
    if (atomic_load_explicit(&l->bias, memory_order_relaxed) == me && !atomic_load_explicit(&me->held, memory_order_relaxed)) {
      atomic_store_explicit(&me->held, l, memory_order_relaxed);
      // No CPU fence: a revoker's membarrier orders this store before the
      // load below, or makes the load see its revocation. The compiler must
      // keep the order.
      atomic_signal_fence(memory_order_seq_cst);
      if (NF_LIKELY(atomic_load_explicit(&l->bias, memory_order_acquire) == me)) {
        atomic_store_explicit(&me->biased, atomic_load_explicit(&me->biased, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        return;
      }
      atomic_store_explicit(&me->held, NULL, memory_order_release); // revoked meanwhile
    }
    if (NF_LIKELY(!atomic_exchange_explicit(&l->v, 1, memory_order_acquire))) {
      // The same thread again, nobody's bias to revoke, the run not over.
      if (NF_LIKELY(!atomic_load_explicit(&l->bias, memory_order_relaxed) && l->last == me && ++l->run < l->need)) return;
      nf__lock_took(l);
      return;
    }
  }
  nf__lock_slow(l); // this thread's first lock, or contention
}
static inline void nf__unlock(nf_lock_t *l) {
  nf_lkslot_t *me = nf__lk_me;
  if (me && atomic_load_explicit(&me->held, memory_order_relaxed) == (void *)l) {
    atomic_store_explicit(&me->held, NULL, memory_order_release);
    return;
  }
  atomic_store_explicit(&l->v, 0, memory_order_release);
}

// Bitmaps of 64-bit words (granule i is bit i & 63 of word i >> 6).
static inline bool nf__bit(const uint64_t *bm, uint64_t i) { return bm[i >> 6] >> (i & 63) & 1; }
static inline void nf__bit_set(uint64_t *bm, uint64_t i) { bm[i >> 6] |= 1ull << (i & 63); }
static inline void nf__bit_clr(uint64_t *bm, uint64_t i) { bm[i >> 6] &= ~(1ull << (i & 63)); }

#endif
