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
#else
#define NF_LIKELY(x) (x)
#define NF_UNLIKELY(x) (x)
#define NF_PRINTF(f, a)
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

// Test-and-test-and-set spin lock with yield: the critical sections are tens
// of nanoseconds, where a futex mutex would double the cost of a cached pair.
typedef struct { atomic_int v; } nf_lock_t;
void nf__lock_slow(nf_lock_t *l);
static inline void nf__lock(nf_lock_t *l) {
  if (NF_LIKELY(!atomic_exchange_explicit(&l->v, 1, memory_order_acquire))) return;
  nf__lock_slow(l);
}
static inline bool nf__trylock(nf_lock_t *l) { return !atomic_exchange_explicit(&l->v, 1, memory_order_acquire); }
static inline void nf__unlock(nf_lock_t *l) { atomic_store_explicit(&l->v, 0, memory_order_release); }

// Bitmaps of 64-bit words (granule i is bit i & 63 of word i >> 6).
static inline bool nf__bit(const uint64_t *bm, uint64_t i) { return bm[i >> 6] >> (i & 63) & 1; }
static inline void nf__bit_set(uint64_t *bm, uint64_t i) { bm[i >> 6] |= 1ull << (i & 63); }
static inline void nf__bit_clr(uint64_t *bm, uint64_t i) { bm[i >> 6] &= ~(1ull << (i & 63)); }

#endif
