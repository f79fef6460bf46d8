// Models of PyTorch's CUDA caching allocator (internal).
//
// Two allocators that nofrag is compared against, simulated on the same trace
// ops as the nofrag replay (trace.h: ALLOC at `alloc`, FREE at
// `free_completed`), with no device memory at all:
//
//  - NF_MODEL_NATIVE: PyTorch 2.11's default caching allocator
//    (c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator) with default
//    settings: max_split_size unlimited, no garbage collection threshold, no
//    roundup_power2_divisions.
//  - NF_MODEL_EXPANDABLE: the same allocator with expandable_segments:True.
//
// The rules each behaviour follows are cited next to the code (model_native.c,
// model_expandable.c). Reserved memory is what PyTorch reports as
// reserved_bytes: cudaMalloc'ed segments (native) or mapped pages
// (expandable). A limit plays the part of
// torch.cuda.set_per_process_memory_fraction: alloc_block fails when
// reserved + the allocation size would pass it, after which the model frees
// cached memory and retries exactly as PyTorch does before raising OOM.
//
// The models use plain arrays (sorted vectors of block ids), not PyTorch's
// std::set, but keep the same orderings, so they pick the same blocks.
#ifndef NF_MODEL_H
#define NF_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "nofrag.h"
#include "trace.h"

enum { NF_MODEL_NATIVE = 0, NF_MODEL_EXPANDABLE = 1, NF_MODEL_NKINDS = 2 };

// Device memory the expandable model sizes its virtual reservations from:
// the H200 the shared traces were recorded on (143771 MiB). PyTorch reserves
// 1 1/8 of totalGlobalMem per expandable segment (find_expandable_block).
#define NF_MODEL_DEVICE_BYTES ((uint64_t)143771 << 20)

typedef struct nf__model_result_s {
  int kind;                 // NF_MODEL_*
  nf_status_t status;       // NF_OK completed; NF_ERR_OOM stopped at an alloc; else error
  char error[256];          // why it stopped ("" when completed)
  size_t ops_done;          // ops completed before stopping
  size_t fail_event;        // 1-based trace event of the failing alloc (0: none)
  uint64_t limit;           // 0 = unlimited
  uint64_t peak_reserved;   // max of reserved_bytes (segments / mapped pages)
  uint64_t peak_allocated;  // max of allocated_bytes (block sizes, rounded and unsplit remainders)
  uint64_t peak_requested;  // max of requested bytes live (the program's demand)
  uint64_t reserved_end, allocated_end;
  uint64_t device_allocs;   // cudaMalloc (native) or page-range maps (expandable): num_device_alloc
  uint64_t device_frees;    // cudaFree or unmaps: num_device_free
  uint64_t alloc_retries;   // num_alloc_retries: cache flushed and alloc retried
  uint64_t ooms;            // allocations that failed after the retry (0 or 1: the run stops)
  size_t segments_peak, segments_end; // cudaMalloc segments (native) or expandable segments
  size_t peak_op;           // ops done when peak_reserved was first reached (the state to inspect)
  double seconds;           // the replay loop alone
} nf__model_result;

struct nf__model_s;

// Optional observers of a model run (all NULL/0: no cost, same result).
// Like nf__replay_opts.sample: `sample` gets live (requested) and reserved
// bytes after every `sample_every`-th op (0 = every op) and after the last op
// done, for the --html timelines and the progress bar: each the maximum over
// the ops since the previous sample (the value after each op), so that a
// peak between two samples is not lost. `inspect` sees the
// whole model state once, after op number `inspect_at` (1-based; e.g. a
// first run's peak_op), for the hotspot attribution. Neither may change it.
typedef struct nf__model_hooks_s {
  void (*sample)(void *ctx, size_t op, uint64_t live, uint64_t reserved);
  size_t sample_every;
  void (*inspect)(void *ctx, const struct nf__model_s *m);
  size_t inspect_at;
  void *ctx;
} nf__model_hooks;

// Name of a model kind ("native", "expandable"), "?" if out of range.
const char *nf__model_name(int kind);

// Replay `ops` through model `kind` under `limit` bytes (0 = unlimited).
// Returns out->status.
nf_status_t nf__model_run(int kind, const nf__trace_ops *ops, uint64_t limit, nf__model_result *out);
// The same with observers (hooks may be NULL).
nf_status_t nf__model_run_hooked(int kind, const nf__trace_ops *ops, uint64_t limit, const nf__model_hooks *h,
                                 nf__model_result *out);

typedef struct nf__model_bisect_s {
  uint64_t min_capacity;   // a limit (whole granules) that completes with one granule less failing: the
                           // bisection's; a model is not monotone, so a smaller limit may complete too
  uint64_t lower, upper;   // bounds searched (bytes)
  unsigned probes;
  double seconds;
  nf__model_result at_min; // the completed run at min_capacity
} nf__model_bisect;

// Bisect the limit in whole `granule`s (0 = 2 MiB) between peak live and
// `upper` (0 = the peak reserved of an unlimited run).
nf_status_t nf__model_min_capacity(int kind, const nf__trace_ops *ops, uint64_t granule, uint64_t upper,
                                   nf__model_bisect *out, char *err, size_t errlen);

// ------------------------------------------------ shared by the model files

// Constants of CUDACachingAllocator.cpp (top of the file).
#define NF_M_MIN_BLOCK ((uint64_t)512)         // kMinBlockSize: all sizes rounded to 512 B
#define NF_M_SMALL_SIZE ((uint64_t)1 << 20)    // kSmallSize: largest "small" request
#define NF_M_SMALL_BUFFER ((uint64_t)2 << 20)  // kSmallBuffer: small segments / small pages
#define NF_M_MIN_LARGE ((uint64_t)10 << 20)    // kMinLargeAlloc: below it, 20 MiB segments
#define NF_M_LARGE_BUFFER ((uint64_t)20 << 20) // kLargeBuffer: 20 MiB segments / large pages
#define NF_M_ROUND_LARGE ((uint64_t)2 << 20)   // kRoundLarge: larger segments rounded to 2 MiB
// Not PyTorch's: the largest request a model serves, the project's bound for
// sizes (1 PiB, as NF_CONFIG_MAX_BYTES). No device holds more, and below it
// the rounding cannot wrap: a larger request is an OOM.
#define NF_M_MAX_REQUEST ((uint64_t)1 << 50)

typedef struct nf__mblock_s {
  uint64_t addr, size;
  uint64_t stream;    // raw stream handle: the first key of PyTorch's block orderings
  int32_t prev, next; // neighbours in the segment, -1 none (Block::prev/next)
  int32_t seg;        // expandable segment id, -1 for a cudaMalloc segment
  uint64_t requested; // bytes the program asked for (allocated blocks)
  uint32_t event;     // trace event of the alloc holding it (allocated blocks): its call site
  uint32_t origin;    // trace event of the alloc that made its memory reserved (segment / mapping)
  uint8_t small, allocated, mapped, in_use; // in_use: id not on the recycle list
} nf__mblock;

typedef struct nf__mvec_s { // block ids kept sorted by one of the orderings
  int32_t *v;
  size_t n, cap;
} nf__mvec;

typedef struct nf__mseg_s { // an expandable segment (ExpandableSegment)
  uint64_t base, size, page;
  int live;
} nf__mseg;

typedef struct nf__model_s {
  int expandable;
  uint64_t limit;
  nf__mblock *b;
  size_t nb, capb;
  int32_t *recycle;
  size_t nrecycle;
  nf__mvec blocks[2];   // free mapped blocks per pool, (stream, size, addr): BlockPool::blocks
  nf__mvec unmapped[2]; // unmapped blocks per pool, (stream, addr): BlockPool::unmapped
  nf__mseg *segs;
  size_t nsegs, capsegs;
  uint64_t next_addr;   // bump pointer for expandable segments' address ranges (upwards)
  uint64_t malloc_top;  // cudaMalloc segments' ranges, handed out downwards (alloc_block)
  uint64_t reserved, allocated, requested;
  size_t segments;
  uint32_t cur_event;   // trace event of the op being replayed (origin of new memory)
  size_t cur_op;        // ops done before the current one
  int nomem;            // the host ran out of memory (the run fails with NF_ERR_NOMEM-like error)
  nf__model_result *res;
} nf__model;

// Shared helpers (model_common.c). Pools are indexed 0 = large, 1 = small
// (get_pool: size <= kSmallSize).
int32_t nf__m_new_block(nf__model *m);
void nf__m_drop_block(nf__model *m, int32_t id);
int nf__m_set_insert(nf__model *m, nf__mvec *s, int32_t id, int by_size);
void nf__m_set_erase(nf__model *m, nf__mvec *s, int32_t id, int by_size);
// First index in `s` whose block is not below (stream, size, addr) (std::set::lower_bound).
size_t nf__m_lower_bound(const nf__model *m, const nf__mvec *s, uint64_t stream, uint64_t size, uint64_t addr,
                         int by_size);
uint64_t nf__m_try_merge(nf__model *m, int32_t dst, int32_t src);
void nf__m_add_reserved(nf__model *m, uint64_t bytes);

// Expandable segments (model_expandable.c).
int32_t nf__mx_try_allocate(nf__model *m, int small, uint64_t stream, uint64_t size);
void nf__mx_release_pool(nf__model *m, int pool);

#endif
