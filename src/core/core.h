// The core layer's private header: the pool, blocks, chunks, granules and
// streams, and the functions the core's files share:
//   pool.c       nf_alloc / nf_free / record_stream (the hot path), deferred-coalescing bins
//   capacity.c   pool creation and teardown, limits, reserve, trim
//   freelist.c   TLSF index of free blocks, split and coalesce
//   placement.c  the placement policy (which free block, which end)
//   edge.c       edge sharing: a block's end granule shared with another's, mapped twice
//   vmm.c        granules, mapping, stitching, spill, release
//   chunk.c      address-range chunks: made, and given back once handed back empty
//   unit.c       mapping units: multi-granule allocations made by growth (cfg.units)
//   stream.c     stream table, lazy events, cross-stream ordering
//   blockmap.c   pointer -> block hash and the block slab
//   stats.c      statistics and the invariant checker
//   publish.c    counters published to an observer's buffer (publish.h)
//   config.c     config strings
//   view.c       views: a granule mapped at several places, parked and taken back
//   granule.c    free lists of physical granules (per tier), granule table slots
//   private_pool.c  private pools (CUDA graphs), routes
//   peer.c       peer access: other GPUs of the process map this pool's memory
// Sub-headers, included here after the types they need: bins.h (the bins'
// inline park), stream.h (stream state predicates), private_pool.h, unit.h (units),
// edge.h (edge sharing).
// Layers above (tier/, observe/) are told of events through the hooks in
// nf_pool_t (nf_tier_hooks_t, nf_observe_hooks_t), never called by name.
#ifndef NF_CORE_H
#define NF_CORE_H

#include "backend/backend.h"
#include "base/base.h"
#include "core/publish.h"
#include "nofrag.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#define NF_ALIGN_SHIFT 9 // blocks are 512-byte aligned, sizes multiples of 512
#define NF_ALIGN ((uint64_t)1 << NF_ALIGN_SHIFT)
// Most granules in one address range (chunk): its per-granule metadata
// (4.5 B each; 12.5 B once views park there) stays within a few GiB of host memory.
#define NF_CHUNK_MAX_GRANULES ((uint64_t)1 << 30)
#define NF_MAX_STREAMS 64 // streams are tracked in a 64-bit mask
// nf_block_t.stream of a live block whose allocation stream lost its slot to
// a 65th stream (stream.c, streams_steal): the handle is in nf_block_t.orphan.
#define NF_STREAM_ORPHAN 0xFFFFu
#define NF_RELEASE_AUTO (UINT64_MAX - 1)
#define NF_RELEASE_NEVER UINT64_MAX
// Every byte-size key is at most 1 PiB: far above any device or host (an H200
// has 141 GiB, x86-64 user space is 128 TiB), and low enough that sizes derived
// from it (granule counts, metadata arrays, limit + granule, a request up to
// limit + spill_limit rounded to 512 B) cannot overflow or ask calloc for
// exabytes. A backend's capacity above it is clamped to it.
#define NF_CONFIG_MAX_BYTES ((uint64_t)1 << 50)


// ------------------------------------------------------------------ blocks
// SHADOW (edge.c): bytes of a granule that another virtual place's live block
// uses through a second mapping of it: never free, never live, in no index.
enum { NF_BLK_FREE = 0, NF_BLK_LIVE = 1, NF_BLK_PENDING = 2, NF_BLK_SHADOW = 3 };
// nf_block_t.edge (edge.c): of a live (or pending) block, which of its end
// granules it shares (HEAD, TAIL); of a shadow, GUEST (beside the block, in the
// shared granule's second mapping) or HOST (at the granule's own place), and
// the end of the block it serves.
enum { NF_EDGE_NONE = 0, NF_EDGE_HEAD = 1, NF_EDGE_TAIL = 2, NF_EDGE_GUEST = 4, NF_EDGE_HOST = 8 };
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
  uint8_t parked;            // free, parked un-coalesced in a bin (fprev/fnext: the bin's list)
  uint8_t memo;              // its last allocation was where placement puts it (see nf_pool_t.fx)
  uint8_t shared;            // live: exported by nf_ipc_export (its granules must stay where they are)
  uint64_t fx;               // p->fx after its allocation / its park
  nf_stream_t orphan;        // live, stream NF_STREAM_ORPHAN: its allocation stream (nf__block_home)
  uint8_t edge;              // NF_EDGE_*: a live (or pending) block's shared end granules, or a shadow's role
  uint8_t unready;           // live, on the device: a failed tier operation left granules without access (not parkable)
  nf_block_t *twin;          // shadow: the other shadow of its pair (edge.c)
};

// A reserved virtual address range, with per-granule mapping state.
struct nf_chunk_s {
  uintptr_t base;
  uint64_t size, ngran;
  uint64_t *mapped;  // bitmap: granule i mapped
  uint32_t *phys;    // physical granule index mapped at granule i
  nf_block_t *first; // lowest-addressed block
  nf_chunk_t *next;
  struct nf_priv_s *priv; // private pool owning the range (private_pool.c), NULL: the general pool
  uint8_t arena;
  uint8_t handed;         // a private pool's range, handed back: released once empty (nf__chunks_drop_empty)
  // ---- views (view.c)
  uint64_t *stale;   // bitmap: granule i holds a parked view of phys[i] (mapped in the backend, not `mapped`)
  uint64_t *busy;    // bitmap: some non-free block overlaps granule i
  uint64_t *ptick;   // per granule holding a parked view: the work through it is that of frees up to this
                     // tick (0: none); allocated at the chunk's first park (NULL: the free run's tick bounds it)
  // ---- end views
  uint64_t *guest;   // bitmap: granule i maps phys[i], owned elsewhere, for a live block's shared first
                     // granule (edge.c; also `mapped` and ready, not counted in gran_mapped); NULL: none yet
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

// ------------------------------------------------------------------ bins
// Deferred coalescing (freelist.c, pool.c): a freed block of the general
// pool may be parked un-coalesced in the bin of its exact size (state FREE,
// `parked`, not in the TLSF index; still in the pointer map, which
// nf__map_find hides: a pop then needs no map update), so that the next allocation of that size
// on a stream that may use it pops it with no placement, split or merge.
// Read-only walks see it as the free block it is; anything that places with
// mapping, unmaps or hands out free ranges flushes the bins first
// (nf__bins_flush), so growth, stitching, spill and OOM see the same free
// structure as without bins.
#define NF_BINS 64   // direct-mapped by exact size (hash of the units)
#define NF_BIN_MAX 8 // blocks per bin
typedef struct nf_bin_s {
  uint64_t units;   // the size (x 512 B) the bin holds; may change while empty
  nf_block_t *head; // newest first
  uint32_t n;
} nf_bin_t;
static inline uint32_t nf__bin_of(uint64_t units) { return (uint32_t)((units * 0x9E3779B97F4A7C15ull) >> 58); }

// ------------------------------------------------------------------ granules
typedef struct nf_granule_s {
  nf_handle_t handle;
  int32_t next_free; // free-list link among unmapped granules, -1 ends
  uint8_t tier;
  uint8_t state;     // NF_GR_*
  uint8_t win;       // host granule also mapped at the host window (offload_detached.c; 2: without access)
  // ---- views (view.c)
  uint8_t took;       // taken by the placement in progress: its last users are forgotten only if it succeeds
  int32_t prev_free;  // free-list back link (a view's granule leaves the list from its middle)
  uint32_t nviews;    // parked views of this granule (chunk `stale` bits naming it)
  uint32_t at_g;      // where it is `mapped` (when state MAPPED): granule at_g of chunk at_c
  nf_chunk_t *at_c;   // (a hint: checked against the chunk's bits before use)
  uint64_t vmask, vtick; // streams (and the latest free tick) that may still use its data
  // ---- end views
  // ---- units (unit.c): a member of a multi-granule physical allocation
  uint32_t unit; // its head's index + 1 (0: a granule of its own)
  uint32_t un;   // head: granules in the unit
} nf_granule_t;
// LOOSE: a unit unmapped whose release failed (unit.c): retried by nf__granules_release.
enum { NF_GR_UNUSED = 0, NF_GR_FREE = 1, NF_GR_MAPPED = 2, NF_GR_LOOSE = 3 };

// ------------------------------------------------------------------ streams
// Ticks order frees and event records pool-wide: a record at tick r covers
// every free on its stream at a tick below r.
// Each stream keeps its last NF_EVENTS records (a ring of reusable events,
// created lazily), so that a host wait for older work can take the oldest
// record covering it and leave the GPU the work queued after it (stream.c).
#define NF_EVENTS 16
// How long frees keep recording after an eviction's host wait (nf__stream_wait;
// ticks: frees and records), and at most one such record per this many ticks
// and stream.
#define NF_EV_HOT 4096
#define NF_EV_GAP 16
typedef struct nf_stream_rec_s {
  nf_stream_t handle;
  uint64_t rec_tick;  // tick of the newest record (0: none)
  uint64_t done_tick; // tick of a record known complete (every free before it is done)
  uint64_t last_free; // tick of the newest free on this stream
  uint64_t used;      // p->stream_clock at the last switch to it (nf__stream_switch; steals take among the oldest)
  uint32_t ev_head;             // ring slot of the newest record
  nf_event_t ev[NF_EVENTS];     // the ring
  uint64_t ev_tick[NF_EVENTS];  // tick of each slot's record (0: never recorded)
} nf_stream_rec_t;
// The event of stream r's newest record (meaningful once rec_tick != 0).
static inline nf_event_t nf__stream_event(const nf_stream_rec_t *r) { return r->ev[r->ev_head]; }

// ------------------------------------------------------------------ hash
typedef struct nf_map_slot_s { uintptr_t key; nf_block_t *val; } nf_map_slot_t;
typedef struct nf_blockmap_s {
  nf_map_slot_t *slots;
  uint64_t mask, count;
} nf_blockmap_t;

// ------------------------------------------------------------------ hooks
// How the core tells the layers above it of events without calling them by
// name (calls go down only). Filled by src/nofrag.c when a pool is assembled;
// a NULL member means "nothing to do".
typedef struct nf_tier_hooks_s {
  nf_status_t (*poll)(nf_pool_t *p, bool blocking);    // finish completed copies (blocking: all)
  nf_status_t (*reclaim)(nf_pool_t *p);                // at the device limit: wait for copies holding device granules
  nf_status_t (*win_unmap)(nf_pool_t *p, uint32_t g);  // a host granule is about to be released
  uint64_t (*busy)(nf_pool_t *p, const nf_block_t *b); // nf_free: streams of the block's copy in flight
  void (*forget)(nf_pool_t *p, nf_block_t *b);         // nf_free: drop the block's tier state (cannot fail)
  bool (*away)(nf_pool_t *p, const nf_block_t *b);     // owned range unmapped while the block is live
  uint64_t (*staged)(const nf_pool_t *p);              // host granules held by copies in flight
  nf_status_t (*check)(nf_pool_t *p, uint8_t *seen);   // nf_pool_check: mark granules held by the tier
  void (*released)(nf_pool_t *p);                      // teardown: every granule was given back
} nf_tier_hooks_t;

typedef struct nf_observe_hooks_s {
  // After every successful nf_alloc and every nf_free, under the lock (NULL: off).
  void (*op)(nf_pool_t *p, bool alloc, uintptr_t ptr, uint64_t size, nf_stream_t s);
  // An OOM, under the lock: build the report; true when it is to be printed
  // by oom_print, called after unlocking (stderr may block).
  bool (*oom)(nf_pool_t *p, uint64_t size, nf_stream_t s, bool too_large);
  void (*oom_print)(void);
} nf_observe_hooks_t;

// ------------------------------------------------------------------ pool
struct nf_pool_s {
  nf_lock_t lock_; // taken through nf__pool_lock (which parks a deferred free first)
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
  nf_bin_t bins[NF_BINS]; // parked free blocks (deferred coalescing)
  uint64_t bin_blocks, bin_bytes;
  nf_block_t *bin_large;  // the one parked block of the large arena (released at the next free)
  // The hot pair (pool.c): a block the last operation freed, FREE and in the
  // map but not yet in its bin, which the next allocation of its size and
  // stream takes back and any other operation parks first (nf__pool_lock).
  // `last`: the block the last allocation returned, nf_free's first guess
  // before the map (maybe stale: checked).
  nf_block_t *hot, *last;
  bool hot_off; // park every free at once (tests: the reference the hot pair must equal)
  // Event count: bumped by every change to the free structure, the mapping
  // and the limits (routes are checked before any bin pop: nroutes). A block
  // whose park was the pool's last event, after an allocation placement made
  // with no mapping, is what placement would choose again for its size
  // (pool.c, bin_pop).
  uint64_t fx;

  nf_granule_t *gran;
  uint64_t gran_cap, gran_created; // created = physical granules existing
  uint64_t gran_made;               // device granules ever created (units: their granules); released = made - created
  int32_t gran_free;               // unmapped physical granules
  int32_t gran_unused;             // unused slots in gran[]
  uint64_t gran_free_count, gran_mapped;

  nf_stream_rec_t streams[NF_MAX_STREAMS];
  uint32_t nstreams;    // slots used so far (a high-water mark: see stream_free)
  uint32_t last_stream; // index of the last stream looked up (fast path; never a free slot)
  uint64_t stream_free; // slots below nstreams given back (stream.c, streams_recycle), taken first
  uint64_t streams_recycled; // slots given back so far
  uint64_t streams_stolen;   // slots taken from a stream live blocks name (streams_steal)
  uint64_t stream_clock;     // switches between streams (nf_stream_rec_t.used)
  uint64_t orphans;          // live blocks whose stream has no slot (NF_STREAM_ORPHAN)
  bool capture_lookup;       // a stream already being captured is looked up (nf_private_begin): no host wait
  uint64_t tick;                                   // pool clock (frees and records)
  uint64_t ev_hot;        // frees up to this tick record events as they go (stream.c, nf__stream_mark)
  uint64_t waited[NF_MAX_STREAMS][NF_MAX_STREAMS]; // [S][A]: tick of the A-record S waits on
  bool release_auto;      // release_threshold follows the limit
  // Release epoch (pool.c, release_note): frees since cached memory last
  // fell to release_threshold (0: none running), its low point, its start.
  uint64_t rel_frees, rel_low, rel_t0;
  uint64_t release_floor; // cached level at which the last release attempt stopped
  uint64_t (*clock)(void *ctx); // time source of the release policy, ns (nf_pool_set_clock)
  void *clock_ctx;

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
  struct nf_xfer_s *leftover; // staging ranges whose unmap or release failed 3 times: retried (offload_host.c)
  struct nf_offl_s *offl;   // offloaded blocks
  int disk_fd;              // -1 until the first disk offload
  uint64_t disk_end;        // next free offset of the disk file
  // An offload whose finish failed (offload.c): the first since nf_offload_wait
  // last reported one (NF_OK: none), its message naming the block, and how
  // many more failed after it. nf_offload_wait returns it, not the unrelated
  // call that happened to finish the copy.
  nf_status_t xfer_err;
  uint64_t xfer_err_more;
  char xfer_msg[768];

  nf_stats_t st; // counters and peaks (computed fields filled by nf_stats_get)
  uint64_t be_t0; // NF_BE: the clock at the call in progress

  // OOM report (snapshot.c): a burst is OOMs less than a second apart; only
  // its first is printed, the next print counts the ones held back.
  uint64_t oom_last_ns;        // monotonic time of the latest OOM (0: none yet)
  uint64_t oom_unprinted;      // OOMs of the current burst not printed
  uint64_t oom_reclaims_mark;  // st.reclaims / st.reclaimed_granules at the previous OOM
  uint64_t oom_reclaimed_mark;

  // Trace recording (observe/record.c): owned by the observe layer, NULL when
  // cfg.trace is "". The core only hands it back through obs.op.
  struct nf_rec_s *rec;

  // Published counters (publish.h): a buffer the observe layer hands in (the
  // monitor's shared-memory file), NULL when off.
  nf_pub_t *pub;
  uint64_t pub_mapped, pub_created; // gran_mapped / gran_created last published in full (UINT64_MAX: nf__pub_dirty)
  uint64_t pub_lf_ns;               // monotonic time largest_free was last walked
  bool pub_lf_stale;                // a walk was skipped (rate limit): the published value may be old
  uint32_t pub_lf_burst;            // walks in the current 100 ms window

  // ---- views (view.c)
  nf_block_t *vw_blk;     // the block nf__map_block is mapping (NULL: a tier maps a live block)
  uint32_t vw_s;          // its stream
  bool vw_on;             // granules have moved: frees record their streams in the granules
  // nf__release_viewed (edge.c), set at creation: stream.c releases blocks through it once views are on.
  void (*vw_release)(nf_pool_t *p, nf_block_t *b, bool used);
  uint64_t vw_count;      // parked views (at most about cfg.views)
  nf_chunk_t *vw_cur_c;   // where the search for a cached granule resumes
  uint64_t vw_cur_g;
  uint64_t vw_reuses, vw_transfers, vw_evicted; // counters (tests, replay)
  // ---- end views
  // ---- units (unit.c)
  nf_block_t *un_blk;     // the block nf__map_block is mapping (NULL: units are not made)
  int32_t un_loose;       // heads of LOOSE units, linked through next_free (-1: none)
  uint64_t un_made, un_gone, un_split; // counters (tests, replay): units created, unmapped, dissolved
  uint64_t un_live;       // units mapped now
  // ---- end units
  // ---- edge sharing (edge.c)
  uint64_t edge_live, edge_made;                      // shared granules now, made (tests, replay)
  // ---- end edge sharing

  nf_tier_hooks_t tier;   // set by the assembler (src/nofrag.c); NULL members: no such tier
  nf_observe_hooks_t obs; // likewise for observers

  // ---- private pools (private_pool.c): fields
  struct nf_priv_s *privs;       // private pools, newest first
  struct nf_route_s *routes;     // allocation routes, innermost (newest) last
  uint32_t nroutes, routes_cap;
  uint64_t capture_mask;         // stream indexes being captured: no event calls, no host waits
  // ---- end private pools: fields
};

#include "core/stream.h" // stream state predicates (pure: no backend call)

#include "core/private_pool.h" // private pools (private_pool.c): types and declarations

// Backend calls of every kind (nf_stats_t.backend_calls, the monitor's).
static inline uint64_t nf__calls_total(const nf_calls_t *c) {
  return c->va_reserve + c->va_release + c->create + c->release + c->map + c->unmap + c->set_access +
         c->event_create + c->event_record + c->event_query + c->event_sync + c->stream_wait + c->copy;
}
static inline uint64_t nf__calls_ns_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}
// Adds the time since t0 to *acc; returns the call's status.
static inline nf_status_t nf__calls_timed(uint64_t *acc, uint64_t t0, nf_status_t st) {
  *acc += nf__calls_ns_now() - t0;
  return st;
}
// Counting wrappers around backend ops: every call is counted in the stats,
// and timed (a real clock, not the pool's: replay runs that on trace time).
// be_t0 is set before the call (a sequence point); nf__calls_timed reads the
// clock after it returns. Backend ops never call NF_BE themselves.
#define NF_BE(pool, op, counter, ...)                                                            \
  ((pool)->st.calls.counter++, (pool)->be_t0 = nf__calls_ns_now(),                             \
   nf__calls_timed(&(pool)->st.call_ns.counter, (pool)->be_t0, (pool)->be->ops->op((pool)->be, __VA_ARGS__)))

// capacity.c: the core of a pool, without tiers or observers (src/nofrag.c
// attaches those). Errors set nf_last_error(); *out is NULL on failure.
nf_status_t nf__core_create(nf_pool_t **out, nf_backend_t *be, const nf_config_t *cfg);
// config.c: the parser's bounds, for a struct filled by hand (nf__core_create).
nf_status_t nf__config_check(const nf_config_t *cfg);
void nf__core_destroy(nf_pool_t *p); // also destroys an owned backend

// blockmap.c
nf_block_t *nf__block_new(nf_pool_t *p);
void nf__block_delete(nf_pool_t *p, nf_block_t *b);
// Room for one more entry, made before a placement, so that the insert after
// it cannot fail (a failure there would undo a placement that mapped and
// moved views); nf__map_insert needs it.
nf_status_t nf__map_reserve(nf_pool_t *p);
void nf__map_insert(nf_pool_t *p, nf_block_t *b);
nf_block_t *nf__map_find(nf_pool_t *p, uintptr_t key);
void nf__map_remove(nf_pool_t *p, uintptr_t key);
void nf__blocks_destroy(nf_pool_t *p);

// freelist.c: the free-block index (TLSF) and block surgery. A size of
// `units` x 512 B falls in first-level class *fl, second-level *sl.
static inline int nf__fls64(uint64_t x) { return 63 - __builtin_clzll(x); }

static inline void nf__tlsf_mapping(uint64_t units, int *fl, int *sl) {
  if (units < NF_SL_COUNT) {
    *fl = 0;
    *sl = (int)units;
  } else {
    int f = nf__fls64(units);
    *fl = f - NF_SL_LOG2 + 1;
    *sl = (int)((units >> (f - NF_SL_LOG2)) - NF_SL_COUNT);
  }
}

void nf__tlsf_insert(nf_tlsf_t *t, nf_block_t *b);
void nf__tlsf_remove(nf_tlsf_t *t, nf_block_t *b);
nf_block_t *nf__split(nf_pool_t *p, nf_block_t *b, uint64_t off, uint64_t size);
void nf__release_block(nf_pool_t *p, nf_block_t *b);
void nf__bin_unlink(nf_pool_t *p, nf_block_t *b); // out of its bin and the pointer map (still FREE, not indexed)
void nf__bins_flush(nf_pool_t *p);                // every parked block into the free index, coalesced
void nf__bin_take_order(nf_pool_t *p, const nf_block_t *b, nf_block_t *r);
#include "core/bins.h" // the bins' inline park / unpark

// The pool lock. Every operation takes it here, except alloc_entry (nf_alloc
// and friends, pool.c), which takes or parks the hot block itself: this parks
// a deferred free first, so that nothing else ever sees a free block that is
// neither indexed nor parked, and each sees the state an eager park would
// have left (nothing happened in between).
void nf__hot_settle(nf_pool_t *p);
static inline void nf__pool_lock(nf_pool_t *p) {
  nf__lock(&p->lock_);
  if (NF_UNLIKELY(p->hot != NULL)) nf__hot_settle(p);
}
static inline void nf__pool_unlock(nf_pool_t *p) { nf__unlock(&p->lock_); }
// The next run of free blocks of c whose work is known complete, from *bp on
// (*bp advances past it): the granules wholly inside it, [*g0, *g1) (maybe
// empty). False at the end of the chunk. For unmapping and view eviction.
bool nf__next_retired_run(const nf_pool_t *p, const nf_chunk_t *c, nf_block_t **bp, uint64_t *g0, uint64_t *g1);

// placement.c: the placement policy
// tl: the free index to place in (the general pool's p->tlsf or a private pool's), one per arena.
nf_block_t *nf__place(nf_pool_t *p, nf_tlsf_t *tl, int arena, uint64_t size, uint32_t s, uint64_t *off, bool *mapped);
nf_block_t *nf__place_min(nf_pool_t *p, nf_tlsf_t *tl, uint64_t size, uint32_t s, uint64_t *off, bool *mapped);

// chunk.c
nf_status_t nf__chunk_new(nf_pool_t *p, int arena, uint64_t min_size);
nf_status_t nf__chunk_free(nf_pool_t *p, nf_chunk_t *c);
void nf__chunks_drop_empty(nf_pool_t *p);

// vmm.c
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
#define NF_READY(c) ((c)->mapped + (((c)->ngran + 63) >> 6))
bool nf__range_mapped(const nf_pool_t *p, const nf_chunk_t *c, uintptr_t a, uint64_t n);
uint64_t nf__range_unmapped(const nf_pool_t *p, const nf_chunk_t *c, uintptr_t a, uint64_t n);
uint64_t nf__unmap_cached(nf_pool_t *p, uint64_t want, bool blocking, const nf_chunk_t *keep_c,
                          uint64_t keep_g0, uint64_t keep_g1, int tier, nf_status_t *st);
// The same over the chunks of private pool pv only (nf_private_trim).
uint64_t nf__unmap_cached_in(nf_pool_t *p, const nf_priv_t *pv, uint64_t want, bool blocking, nf_status_t *st);
nf_status_t nf__granules_create(nf_pool_t *p, uint64_t n);
nf_status_t nf__granules_release(nf_pool_t *p, uint64_t keep);
// A call that failed gives back the device and host granules it created (the
// counts it began with: dev0, host0), so that its failure leaves physical
// memory as it was (nofrag.h: a failed allocation creates nothing).
void nf__granules_unmake(nf_pool_t *p, uint64_t dev0, uint64_t host0);
void nf__maybe_release(nf_pool_t *p, uint64_t idle);
static inline uint64_t nf__cached(const nf_pool_t *p) {
  uint64_t m = (p->gran_mapped + p->away_granules) << p->gshift;
  return m > p->st.live_rounded ? m - p->st.live_rounded : 0;
}

// stream.c
nf_status_t nf__stream_index(nf_pool_t *p, nf_stream_t s, uint32_t *out);
// The pool's operations move to stream i (a lookup, or the hot pair reusing
// i's block): i becomes the most recently used (streams_steal's order).
static inline void nf__stream_switch(nf_pool_t *p, uint32_t i) {
  p->streams[i].used = ++p->stream_clock;
  p->last_stream = i;
}
// A live block whose stream lost its slot (NF_STREAM_ORPHAN) gets one again,
// maybe taking another stream's (never one of `keep`, the slots the caller
// holds); any other block: nothing to do. Before anything uses b->stream.
nf_status_t nf__block_home(nf_pool_t *p, nf_block_t *b, uint64_t keep);
// nf__stream_index for a call on live block b: never takes b's own slot.
nf_status_t nf__stream_index_for(nf_pool_t *p, nf_stream_t s, const nf_block_t *b, uint32_t *out);
// nf__block_home for nf_free: where no slot can be had, a host wait for the
// block's stream instead (stream.c).
nf_status_t nf__block_home_any(nf_pool_t *p, nf_block_t *b);
// The stream a live block was allocated on.
static inline nf_stream_t nf__block_stream(const nf_pool_t *p, const nf_block_t *b) {
  return b->stream == NF_STREAM_ORPHAN ? b->orphan : p->streams[b->stream].handle;
}
nf_status_t nf__order_after(nf_pool_t *p, nf_block_t *b, uint32_t s);
nf_status_t nf__streams_sync(nf_pool_t *p);
nf_status_t nf__streams_poll(nf_pool_t *p);
nf_status_t nf__stream_record(nf_pool_t *p, uint32_t x);
nf_status_t nf__stream_done(nf_pool_t *p, uint32_t x, uint64_t tick, bool blocking, bool *done);
nf_status_t nf__stream_wait(nf_pool_t *p, uint32_t x, uint64_t need); // host wait for x's frees up to need
nf_status_t nf__streams_retire(nf_pool_t *p, uint64_t m, uint64_t tick); // ... for streams m up to tick
void nf__stream_mark(nf_pool_t *p, uint32_t x); // nf_free, after an eviction wait: maybe record (never fails)
nf_status_t nf__pending_add(nf_pool_t *p, nf_block_t *b);
nf_status_t nf__pending_poll(nf_pool_t *p, bool blocking);
void nf__streams_destroy(nf_pool_t *p);

// Owned granules of a block: those wholly inside it, [*g0, *g1) of its chunk.
static inline bool nf__owned(const nf_pool_t *p, const nf_block_t *b, uint64_t *g0, uint64_t *g1) {
  uint64_t a = b->addr - b->chunk->base;
  *g0 = (a + p->granule - 1) >> p->gshift;
  *g1 = (a + b->size) >> p->gshift;
  return *g1 > *g0;
}

// ---- views (view.c): a physical granule may stay mapped at several virtual
// places; only one of them (`mapped`) owns it, the others are parked views
// (`stale`) that a later block there takes back with no backend call.
nf_status_t nf__view_chunk_init(nf_chunk_t *c);
void nf__view_chunk_free(nf_chunk_t *c);
void nf__view_chunk_unmap(nf_pool_t *p, nf_chunk_t *c);
void nf__view_live(nf_pool_t *p, const nf_block_t *b);
void nf__view_dead(nf_pool_t *p, const nf_block_t *b, bool merge);
void nf__view_park_at(nf_pool_t *p, nf_chunk_t *c, uint64_t g, uint32_t i, uint64_t tick);
nf_status_t nf__view_fill(nf_pool_t *p, nf_chunk_t *c, uint64_t g0, uint64_t g1, uint64_t room);
void nf__view_settle(nf_pool_t *p, nf_block_t *b, uint64_t g0, uint64_t g1, bool placed);
uint64_t nf__view_adoptable(const nf_pool_t *p, const nf_chunk_t *c, uintptr_t a, uint64_t n);
uint64_t nf__view_evict(nf_pool_t *p, uint64_t want, bool blocking, nf_status_t *st);
void nf__gran_unlink(nf_pool_t *p, uint32_t i);          // vmm.c
int32_t nf__gran_slot(nf_pool_t *p);                       // granule.c: an unused gran[] slot (-1: out of memory)
void nf__gran_slot_put(nf_pool_t *p, uint32_t i);          // granule.c: slot i unused again
uint64_t nf__gran_room(const nf_pool_t *p, uint64_t size); // vmm.c
nf_status_t nf__view_check(nf_pool_t *p);
bool nf__view_evict_all(nf_pool_t *p);
// ---- end views

#include "core/unit.h" // units (unit.c): declarations

#include "core/edge.h" // edge sharing (edge.c): declarations

// stats.c
static inline void nf__peak(uint64_t *peak, uint64_t v) { if (v > *peak) *peak = v; }
uint64_t nf__largest_free_mapped(const nf_pool_t *p, uint64_t *live_granules);

// publish.c: counters for observers (publish.h). Fast path, under the pool
// lock, after an alloc (`alloc` true) or a free: the two or three counters
// that changed, or everything when the mapping changed (the caller made
// backend calls anyway) or a tier moved granules (nf__pub_dirty), and every 4096th operation (backend calls of event
// polling, stale largest-free). Plain stores, no read-modify-write: the pool
// lock orders writers.
// A tier changed spilled / offloaded / away granules without a mapping change
// (a freed offloaded block, a copy completing): the next nf__pub_fast
// publishes everything, as after a mapping change. Costs the fast path nothing.
static inline void nf__pub_dirty(nf_pool_t *p) { p->pub_mapped = UINT64_MAX; }
static inline void nf__pub_fast(nf_pool_t *p, bool alloc) {
  nf_pub_t *m = p->pub;
  if (!m) return;
  if (NF_UNLIKELY(p->gran_mapped != p->pub_mapped || p->gran_created != p->pub_created ||
                  !((p->st.allocs + p->st.frees) & 4095))) {
    nf__pub_full(p);
    return;
  }
  uint64_t s = atomic_load_explicit(&m->seq, memory_order_relaxed);
  atomic_store_explicit(&m->seq, s + 1, memory_order_relaxed);
  // Release stores: a reader that sees any new value also sees seq odd.
  atomic_store_explicit(&m->v[NF_PUB_LIVE], p->st.live, memory_order_release);
  if (alloc) {
    atomic_store_explicit(&m->v[NF_PUB_ALLOCS], p->st.allocs, memory_order_release);
    atomic_store_explicit(&m->v[NF_PUB_LIVE_PEAK], p->st.live_peak, memory_order_release);
  } else {
    atomic_store_explicit(&m->v[NF_PUB_FREES], p->st.frees, memory_order_release);
  }
  atomic_store_explicit(&m->seq, s + 2, memory_order_release);
}

#endif
