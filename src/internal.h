// Internal types shared by the core's subsystems:
//   placement.c  TLSF index of free blocks and the placement policy
//   vmm.c        granules, address-range chunks, mapping, stitching, release
//   stream.c     stream table, lazy events, cross-stream ordering
//   blockmap.c   pointer -> block hash and the block slab
//   pool.c       public allocation API, errors
//   stats.c      statistics and the invariant checker
#ifndef NF_INTERNAL_H
#define NF_INTERNAL_H

#include "backend/backend.h"
#include "fmt.h"
#include "nofrag.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define NF_ALIGN_SHIFT 9 // blocks are 512-byte aligned, sizes multiples of 512
#define NF_ALIGN ((uint64_t)1 << NF_ALIGN_SHIFT)
// Most granules in one address range (chunk): its per-granule metadata
// (4.25 B each) stays within a few GiB of host memory.
#define NF_CHUNK_MAX_GRANULES ((uint64_t)1 << 30)
#define NF_MAX_STREAMS 64 // streams are tracked in a 64-bit mask
#define NF_RELEASE_AUTO (UINT64_MAX - 1)
#define NF_RELEASE_NEVER UINT64_MAX

#if defined(__GNUC__)
#define NF_LIKELY(x) __builtin_expect(!!(x), 1)
#define NF_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define NF_LIKELY(x) (x)
#define NF_UNLIKELY(x) (x)
#endif

// ------------------------------------------------------------------ lock
// Test-and-test-and-set spin lock with yield: the critical sections are tens
// of nanoseconds, where a futex mutex would double the cost of a cached pair.
typedef struct { atomic_int v; } nf_lock_t;
void nf__lock_slow(nf_lock_t *l);
static inline void nf__lock(nf_lock_t *l) {
  if (NF_LIKELY(!atomic_exchange_explicit(&l->v, 1, memory_order_acquire))) return;
  nf__lock_slow(l);
}
static inline void nf__unlock(nf_lock_t *l) { atomic_store_explicit(&l->v, 0, memory_order_release); }

// ------------------------------------------------------------------ blocks
enum { NF_BLK_FREE = 0, NF_BLK_LIVE = 1, NF_BLK_PENDING = 2 };
enum { NF_ARENA_SMALL = 0, NF_ARENA_LARGE = 1, NF_ARENA_COUNT = 2 };

typedef struct nf_chunk_s nf_chunk_t;
typedef struct nf_block_s nf_block_t;

// Block headers live outside the memory they describe (device memory).
struct nf_block_s {
  uintptr_t addr;
  uint64_t size;             // multiple of NF_ALIGN
  nf_block_t *prev, *next;   // address-ordered neighbours within the chunk
  nf_block_t *fprev, *fnext; // free-list (or pending-list) links
  nf_chunk_t *chunk;
  uint64_t req;              // live: requested size
  uint64_t extra;            // live/pending: mask of extra streams (record_stream)
  uint64_t smask;            // free/pending: streams whose work may still use it (0: none)
  uint64_t tick;             // free/pending: pool tick at the (latest) free
  uint16_t stream;           // live: allocation stream
  uint8_t state;
  uint8_t arena;
  uint8_t where;             // live: NF_TIER_* its owned granules were nf_offload'ed to (0: device)
};

// A reserved virtual address range, with per-granule mapping state.
struct nf_chunk_s {
  uintptr_t base;
  uint64_t size, ngran;
  uint64_t *mapped;  // bitmap: granule i mapped
  uint32_t *phys;    // physical granule index mapped at granule i
  nf_block_t *first; // lowest-addressed block
  nf_chunk_t *next;
  uint8_t arena;
};

// ------------------------------------------------------------------ TLSF
#define NF_SL_LOG2 5
#define NF_SL_COUNT (1 << NF_SL_LOG2)
#define NF_FL_COUNT 48

typedef struct nf_tlsf_s {
  uint64_t fl_bitmap;
  uint32_t sl_bitmap[NF_FL_COUNT];
  nf_block_t *heads[NF_FL_COUNT][NF_SL_COUNT];
} nf_tlsf_t;

// ------------------------------------------------------------------ granules
typedef struct nf_granule_s {
  nf_handle_t handle;
  int32_t next_free; // free-list link among unmapped granules, -1 ends
  uint8_t tier;
  uint8_t state;     // NF_GR_*
  uint8_t win;       // host granule also mapped at the host window (offload_detached.c)
} nf_granule_t;
enum { NF_GR_UNUSED = 0, NF_GR_FREE = 1, NF_GR_MAPPED = 2 };

// ------------------------------------------------------------------ streams
// Ticks order frees and event records pool-wide: a record at tick r covers
// every free on its stream at a tick below r.
typedef struct nf_stream_rec_s {
  nf_stream_t handle;
  nf_event_t event;   // one reusable event, created lazily
  uint64_t rec_tick;  // tick of the newest record (0: none)
  uint64_t done_tick; // tick of the newest record known complete
  uint64_t last_free; // tick of the newest free on this stream
} nf_stream_rec_t;

// ------------------------------------------------------------------ hash
typedef struct nf_map_slot_s { uintptr_t key; nf_block_t *val; } nf_map_slot_t;
typedef struct nf_blockmap_s {
  nf_map_slot_t *slots;
  uint64_t mask, count;
} nf_blockmap_t;

// ------------------------------------------------------------------ pool
struct nf_pool_s {
  nf_lock_t lock;
  nf_backend_t *be;
  nf_backend_t *owned_be; // destroyed with the pool (nf_pool_create_from_string)
  nf_config_t cfg;        // resolved: limit, granule, thresholds known
  uint32_t gshift;        // log2(granule)
  uint64_t granule;
  uint64_t max_granules;  // limit / granule

  nf_tlsf_t tlsf[NF_ARENA_COUNT];
  nf_chunk_t *chunks;
  nf_blockmap_t map;
  nf_block_t *slab_free; // unused block headers
  void **slabs;
  uint64_t nslabs, slabs_cap;
  nf_block_t *pending;   // freed blocks waiting on record_stream events

  nf_granule_t *gran;
  uint64_t gran_cap, gran_created; // created = physical granules existing
  int32_t gran_free;               // unmapped physical granules
  int32_t gran_unused;             // unused slots in gran[]
  uint64_t gran_free_count, gran_mapped;

  nf_stream_rec_t streams[NF_MAX_STREAMS];
  uint32_t nstreams;
  uint32_t last_stream; // index of the last stream looked up (fast path)
  uint64_t tick;                                   // pool clock (frees and records)
  uint64_t waited[NF_MAX_STREAMS][NF_MAX_STREAMS]; // [S][A]: tick of the A-record S waits on
  bool release_auto;      // release_threshold follows the limit
  uint64_t above_since;   // tick since which cached memory exceeds release_threshold (0: not)
  uint64_t release_floor; // cached level at which the last release attempt stopped

  // Host tier (spill and offload, offload.c): host granules have their own
  // free list; gran_created / gran_free* above count device granules only,
  // gran_mapped counts chunk-mapped granules of both tiers.
  int32_t host_free;
  uint64_t host_free_count, host_created, max_host_granules;
  uint64_t host_mapped;     // chunk-mapped host granules
  uint64_t offl_granules;   // ... of which under offloaded live blocks (the rest: spill)
  uint64_t away_granules;   // owned granules of disk- or detached-offloaded blocks (unmapped, still live)
  uint64_t detached_granules; // host granules holding detached blocks (offload_detached.c)
  uintptr_t *win;           // host window: ranges of 512 granule slots (offload_detached.c)
  uint64_t win_n;
  uint64_t disk_bytes;
  bool spill_warned;
  bool host_sweep;          // spilled granules may lie in free ranges: unmap them when retired
  uint64_t sweep_tick;
  struct nf_xfer_s *xfers;  // copies in flight (offload.c)
  struct nf_offl_s *offl;   // offloaded blocks
  int disk_fd;              // -1 until the first disk offload
  uint64_t disk_end;        // next free offset of the disk file

  nf_stats_t st; // counters and peaks (computed fields filled by nf_stats_get)

  // OOM report (snapshot.c): a burst is OOMs less than a second apart; only
  // its first is printed, the next print counts the ones held back.
  uint64_t oom_last_ns;        // monotonic time of the latest OOM (0: none yet)
  uint64_t oom_unprinted;      // OOMs of the current burst not printed
  uint64_t oom_reclaims_mark;  // st.reclaims / st.reclaimed_granules at the previous OOM
  uint64_t oom_reclaimed_mark;

  // Trace recording (record.c): NULL when cfg.trace is "" (the only cost
  // when off: one predictable branch per alloc and free).
  struct nf_rec_s *rec;

  // Live monitor (monitor.c): the mmap'd shared-memory file, NULL when off.
  struct nf_mon_shm_s *mon;
  uint64_t mon_mapped, mon_created; // gran_mapped / gran_created last published in full
  uint64_t mon_lf_ns;               // monotonic time largest_free was last walked
  bool mon_lf_stale;                // a walk was skipped (rate limit): the published value may be old
  uint32_t mon_lf_burst;            // walks in the current 100 ms window
};

// Counting wrappers around backend ops: every call is counted in the stats.
#define NF_BE(pool, op, counter, ...) \
  ((pool)->st.calls.counter++, (pool)->be->ops->op((pool)->be, __VA_ARGS__))

// error.c / pool.c
nf_status_t nf__error(nf_status_t st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

// blockmap.c
nf_block_t *nf__block_new(nf_pool_t *p);
void nf__block_delete(nf_pool_t *p, nf_block_t *b);
nf_status_t nf__map_insert(nf_pool_t *p, nf_block_t *b);
nf_block_t *nf__map_find(nf_pool_t *p, uintptr_t key);
void nf__map_remove(nf_pool_t *p, uintptr_t key);
void nf__blocks_destroy(nf_pool_t *p);

// placement.c
void nf__tlsf_insert(nf_tlsf_t *t, nf_block_t *b);
void nf__tlsf_remove(nf_tlsf_t *t, nf_block_t *b);
nf_block_t *nf__place(nf_pool_t *p, int arena, uint64_t size, uint32_t s, uint64_t *off, bool *mapped);
nf_block_t *nf__place_min(nf_pool_t *p, uint64_t size, uint64_t *off, bool *mapped);
nf_block_t *nf__split(nf_pool_t *p, nf_block_t *b, uint64_t off, uint64_t size);
void nf__release_block(nf_pool_t *p, nf_block_t *b);

// vmm.c
nf_status_t nf__chunk_new(nf_pool_t *p, int arena, uint64_t min_size);
void nf__chunks_destroy(nf_pool_t *p);
nf_status_t nf__map_block(nf_pool_t *p, nf_block_t *b);
nf_status_t nf__map_range(nf_pool_t *p, nf_chunk_t *c, uint64_t g0, uint64_t g1, uint64_t size, bool spill);
nf_status_t nf__gran_acquire(nf_pool_t *p, uint64_t k, const nf_chunk_t *c, uint64_t g0, uint64_t g1);
void nf__gran_push_free(nf_pool_t *p, uint32_t i);
uint32_t nf__gran_pop(nf_pool_t *p, nf_tier_t tier);
nf_status_t nf__host_granules_create(nf_pool_t *p, uint64_t n);
void nf__host_granules_release(nf_pool_t *p, uint64_t keep);
nf_status_t nf__unmap_run(nf_pool_t *p, nf_chunk_t *c, uint64_t g0, uint64_t g1);
nf_status_t nf__set_ready(nf_pool_t *p, nf_chunk_t *c, uint64_t g0, uint64_t g1);
void nf__host_sweep(nf_pool_t *p);
static inline bool nf__bit(const uint64_t *bm, uint64_t i) { return bm[i >> 6] >> (i & 63) & 1; }
#define NF_READY(c) ((c)->mapped + (((c)->ngran + 63) >> 6))
bool nf__range_mapped(const nf_pool_t *p, const nf_chunk_t *c, uintptr_t a, uint64_t n);
uint64_t nf__range_unmapped(const nf_pool_t *p, const nf_chunk_t *c, uintptr_t a, uint64_t n);
uint64_t nf__unmap_cached(nf_pool_t *p, uint64_t want, bool blocking, const nf_chunk_t *keep_c,
                          uint64_t keep_g0, uint64_t keep_g1, int tier, nf_status_t *st);
nf_status_t nf__granules_create(nf_pool_t *p, uint64_t n);
nf_status_t nf__granules_release(nf_pool_t *p, uint64_t keep);
void nf__maybe_release(nf_pool_t *p);
static inline uint64_t nf__cached(const nf_pool_t *p) {
  uint64_t m = (p->gran_mapped + p->away_granules) << p->gshift;
  return m > p->st.live_rounded ? m - p->st.live_rounded : 0;
}

// stream.c
nf_status_t nf__stream_index(nf_pool_t *p, nf_stream_t s, uint32_t *out);
bool nf__block_usable(const nf_pool_t *p, const nf_block_t *b, uint32_t s);
nf_status_t nf__order_after(nf_pool_t *p, nf_block_t *b, uint32_t s);
bool nf__block_retired(const nf_pool_t *p, const nf_block_t *b);
nf_status_t nf__streams_sync(nf_pool_t *p);
nf_status_t nf__streams_poll(nf_pool_t *p);
nf_status_t nf__stream_record(nf_pool_t *p, uint32_t x);
nf_status_t nf__stream_done(nf_pool_t *p, uint32_t x, uint64_t tick, bool blocking, bool *done);
nf_status_t nf__pending_add(nf_pool_t *p, nf_block_t *b);
nf_status_t nf__pending_poll(nf_pool_t *p, bool blocking);
void nf__streams_destroy(nf_pool_t *p);

// stats.c
static inline void nf__peak(uint64_t *peak, uint64_t v) { if (v > *peak) *peak = v; }
uint64_t nf__largest_free_mapped(const nf_pool_t *p, uint64_t *live_granules);

// snapshot.c: build the multi-line OOM report into this thread's buffer
// (nf_last_oom_report), under the pool lock. `too_large`: the request exceeds
// the whole limit (nothing was tried). Returns true when the caller should
// print it to stderr with nf__oom_print once the lock is released (first OOM
// of a burst, NOFRAG_QUIET_OOM unset).
bool nf__oom_report(nf_pool_t *p, uint64_t size, nf_stream_t s, bool too_large);
void nf__oom_print(void);

// ------------------------------------------------------------------ offload
// offload.c: same-address moves of live blocks between tiers, and the copies
// in flight. nf__xfer_poll finishes the copies that completed (blocking: all).
nf_status_t nf__xfer_poll(nf_pool_t *p, bool blocking);
// At the device limit: wait for the offload copies in flight that hold
// device granules (none: no wait), so that those granules come back.
nf_status_t nf__xfer_reclaim(nf_pool_t *p);
// True when the block's owned range is unmapped while it is live (disk, or
// a detached offload whose copy completed).
bool nf__block_away(nf_pool_t *p, const nf_block_t *b);
// offload_detached.c: the host window (host granules mapped once at a second
// address). nf__win_unmap before releasing a host granule; nf__win_destroy
// once every host granule is released.
nf_status_t nf__win_unmap(nf_pool_t *p, uint32_t i);
void nf__win_destroy(nf_pool_t *p);
// nf_pool_check: the host granules holding detached blocks are marked in
// seen[] (index = granule), none twice, none free.
nf_status_t nf__detached_check(nf_pool_t *p, uint8_t *seen);
// Called by nf_free for a block with `where` set or an offload in flight:
// settles the offload so that the block can be freed like any other (a copy
// still in flight becomes a record_stream stream of the block).
uint64_t nf__offload_busy(nf_pool_t *p, const nf_block_t *b); // stream mask of its copy in flight
void nf__offload_forget(nf_pool_t *p, nf_block_t *b);
void nf__offload_destroy(nf_pool_t *p);
uint64_t nf__xfer_staged(const nf_pool_t *p); // host granules held by copies in flight
// Owned granules of a block: those wholly inside it, [*g0, *g1) of its chunk.
static inline bool nf__owned(const nf_pool_t *p, const nf_block_t *b, uint64_t *g0, uint64_t *g1) {
  uint64_t a = b->addr - b->chunk->base;
  *g0 = (a + p->granule - 1) >> p->gshift;
  *g1 = (a + b->size) >> p->gshift;
  return *g1 > *g0;
}

// ------------------------------------------------------------------ record
// record.c: `trace:PATH` writes every successful nf_alloc and every nf_free to
// PATH as an RMM logging_resource_adaptor CSV log, buffered (64 KiB) and
// written with write(2) under the pool lock, at most cfg.trace_max bytes.
nf_status_t nf__rec_open(nf_pool_t *p);  // at pool creation when cfg.trace[0]; error names the path
void nf__rec_close(nf_pool_t *p);        // at destroy: flush, close, free
void nf__rec_row(nf_pool_t *p, bool alloc, uintptr_t ptr, uint64_t size, nf_stream_t stream);

// ------------------------------------------------------------------ monitor
// monitor.c: each pool publishes its counters to a shared-memory file
// ($NOFRAG_SHM_DIR, else /dev/shm)/nofrag.<uid>.<pid>.<pool-id>, mode 0600,
// that `nofrag top` reads from outside the process. Writers are serialised by
// the pool lock; readers (other processes) by a seqlock: `seq` is odd while a
// write is in progress. Fields are relaxed/release atomics so that the
// protocol is data-race free in the C11 sense (and TSan-clean) without fences;
// on x86 every one of these stores is a plain mov.
#define NF_MON_MAGIC 0x314e4f4d4746524eull // "NRFGMON1" little-endian
#define NF_MON_VERSION 1
#define NF_MON_V1_FIELDS 13 // fields of the first layout: the smallest file a reader accepts
enum {
  NF_MON_LIVE, NF_MON_LIVE_PEAK, NF_MON_ALLOCS, NF_MON_FREES, // fast path: every alloc/free
  NF_MON_MAPPED, NF_MON_PHYSICAL, NF_MON_LIMIT, NF_MON_GRANULE,
  NF_MON_LARGEST_FREE, // may be stale: walked on slow paths at most every 100 ms
  NF_MON_SPILLED,      // host granules mapped by spill x G
  NF_MON_OOMS, NF_MON_RECLAIMS, NF_MON_BACKEND_CALLS,
  // Appended later: a reader takes from a file the fields its `size` holds
  // (an older writer's file reads 0 for these).
  NF_MON_OFFLOADED,    // host granules holding nf_offload'ed blocks x G (attached and detached)
  NF_MON_AWAY,         // live bytes not mapped (disk and detached offloads): fragmentation leaves them out
  NF_MON_NFIELDS
};
typedef struct nf_mon_shm_s {
  uint64_t magic;    // written last at creation (release): readers skip files without it
  uint32_t version, size;
  int32_t pid;
  uint32_t uid, pool_id, reserved;
  uint64_t start_ns; // CLOCK_REALTIME at pool creation
  char device[32];   // "host", "cuda:0", ...
  _Atomic uint64_t seq;
  _Atomic uint64_t v[NF_MON_NFIELDS];
} nf_mon_shm_t;

void nf__mon_open(nf_pool_t *p);  // at pool creation; failures leave p->mon NULL
void nf__mon_close(nf_pool_t *p); // at destroy: unmap and unlink
void nf__mon_full(nf_pool_t *p);  // publish every field (slow paths), under the lock

// Fast path, under the pool lock, after an alloc (`alloc` true) or a free:
// the two or three counters that changed, or everything when the mapping
// changed (the caller made backend calls anyway) and every 4096th operation
// (backend calls of event polling, stale largest-free). Plain stores, no
// read-modify-write: the pool lock orders writers.
static inline void nf__mon_fast(nf_pool_t *p, bool alloc) {
  nf_mon_shm_t *m = p->mon;
  if (!m) return;
  if (NF_UNLIKELY(p->gran_mapped != p->mon_mapped || p->gran_created != p->mon_created ||
                  !((p->st.allocs + p->st.frees) & 4095))) {
    nf__mon_full(p);
    return;
  }
  uint64_t s = atomic_load_explicit(&m->seq, memory_order_relaxed);
  atomic_store_explicit(&m->seq, s + 1, memory_order_relaxed);
  // Release stores: a reader that sees any new value also sees seq odd.
  atomic_store_explicit(&m->v[NF_MON_LIVE], p->st.live, memory_order_release);
  if (alloc) {
    atomic_store_explicit(&m->v[NF_MON_ALLOCS], p->st.allocs, memory_order_release);
    atomic_store_explicit(&m->v[NF_MON_LIVE_PEAK], p->st.live_peak, memory_order_release);
  } else {
    atomic_store_explicit(&m->v[NF_MON_FREES], p->st.frees, memory_order_release);
  }
  atomic_store_explicit(&m->seq, s + 2, memory_order_release);
}

// Reader side (tools/top.c, tests). One pool's file, read consistently.
typedef struct nf_mon_entry_s {
  char path[512];
  int pid;
  uint32_t uid, pool_id;
  uint64_t start_ns;
  char device[32];
  uint64_t v[NF_MON_NFIELDS];
  double fragmentation; // 1 - live/mapped, from the same snapshot
} nf_mon_entry_t;

// The directory monitor files go to: $NOFRAG_SHM_DIR, else /dev/shm.
const char *nf__mon_dir(void);
// Read one file: 0 ok, 1 its process is dead, -1 not a monitor file, unreadable
// or torn for too long (a writer killed mid-update).
int nf__mon_read(const char *path, nf_mon_entry_t *e);
// Every readable monitor file of live processes in `dir` (NULL: nf__mon_dir()),
// sorted by pid then pool id, as a malloc'd array in *out (free() it). Files of
// dead processes are skipped, and removed when `clean`; *dead (if non-NULL)
// counts them. Returns the number of entries, or -1 if dir cannot be opened.
long nf__mon_list(const char *dir, bool clean, nf_mon_entry_t **out, long *dead);

#endif
